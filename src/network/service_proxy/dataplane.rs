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

#[async_trait::async_trait]
pub trait Dataplane: Send {
    /// Programs exactly these Services, replacing whatever was there.
    async fn full(&mut self, services: &BTreeMap<String, Vec<ServicePort>>) -> Result<(), DataplaneError>;

    /// Reprograms these Services only; an empty list of ports removes one.
    async fn update(&mut self, changes: Vec<(String, Vec<ServicePort>)>) -> Result<(), DataplaneError>;

    /// Changes when the dataplane wants a full programming again.
    fn resync_requests(&self) -> tokio::sync::watch::Receiver<u64>;
}
