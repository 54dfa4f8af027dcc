//! How the API server passes a request on to another server (upstream's
//! `apimachinery/pkg/util/proxy`): the relay of a request and its answer,
//! upgrades included (`relay`, the UpgradeAwareHandler), and where a
//! Service's request goes (`service_endpoint`, ResolveEndpoint). The
//! resources' proxy and connect subresources (`handlers`), the
//! aggregator, admission webhooks and the metrics API stand on it.

pub mod relay;
pub mod service_endpoint;
