//! What the service proxy asks of a dataplane, so that another driver
//! (eBPF, say) can stand beside nftables later: load every Service from
//! scratch, or change only some, keyed by `namespace/name`.

use std::collections::BTreeMap;

use super::model::ServicePort;
use crate::network::nftables::NftError;

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error(transparent)]
    Nftables(#[from] NftError),
}

/// One Service's ports as programmed, and as they should be (none: gone).
/// The dataplane keeps no copy of its own: the proxy holds what it gave it.
#[derive(Debug, Clone)]
pub struct Change {
    pub key: String,
    pub old: Vec<ServicePort>,
    pub new: Vec<ServicePort>,
}

#[async_trait::async_trait]
pub trait Dataplane: Send {
    /// Programs exactly these Services, replacing whatever was there.
    async fn full(&mut self, services: &BTreeMap<String, Vec<ServicePort>>) -> Result<(), DataplaneError>;

    /// Reprograms these Services only.
    async fn update(&mut self, changes: &[Change]) -> Result<(), DataplaneError>;

    /// Changes when the dataplane wants a full programming again.
    fn resync_requests(&self) -> tokio::sync::watch::Receiver<u64>;
}
