//! What the API server runs on its own, beside serving requests (upstream's
//! `pkg/controlplane/controller` and post-start hooks): the objects a
//! cluster has from its start (`system_objects`: the system namespaces,
//! the `kubernetes` and `kube-dns` Services, the default ServiceCIDR, the
//! local APIServices), the `kubernetes` Service's endpoints
//! (`endpoint_reconciler`), the IPAddresses of Services' cluster IPs
//! (`service_ip_repair`), the ConfigMaps it publishes
//! (`cluster_authentication_trust`, `legacy_token_tracking`), and the
//! store's compaction (`compactor`). The default RBAC policy is
//! `auth::default_policy`'s.

pub mod cluster_authentication_trust;
pub mod compactor;
pub mod endpoint_reconciler;
pub mod legacy_token_tracking;
pub mod service_ip_repair;
pub mod system_objects;
