//! The external backend: an etcd cluster reached over gRPC, with the same
//! wire types as the rest of the store, so requests and answers pass
//! through untouched and etcd's own semantics hold exactly.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::StreamExt;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::proto::*;
use super::{Result, SnapshotStream, Store, StoreError, WatchRequestStream, WatchResponseStream};

#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// `http(s)://host:port` URLs of the members, as k3s'
    /// `--datastore-endpoint` takes them (comma-separated there).
    pub endpoints: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl EtcdOptions {
    /// The options of k3s' `--datastore-endpoint` (comma-separated URLs)
    /// and its `--datastore-cafile/-certfile/-keyfile` flags.
    pub fn from_flags(
        endpoints: &str,
        ca_file: Option<PathBuf>,
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
    ) -> EtcdOptions {
        let endpoints = endpoints.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        EtcdOptions { endpoints, ca_file, cert_file, key_file }
    }
}

pub struct EtcdStore {
    kv: kv_client::KvClient<Channel>,
    watch: watch_client::WatchClient<Channel>,
    lease: lease_client::LeaseClient<Channel>,
    maintenance: maintenance_client::MaintenanceClient<Channel>,
    cluster: cluster_client::ClusterClient<Channel>,
}

fn read(path: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| StoreError::Internal(format!("cannot read {}: {e}", path.display())))
}

impl EtcdStore {
    /// Prepares connections to the endpoints; nothing is dialled until the
    /// first request, so a briefly unreachable etcd does not fail the start.
    pub fn connect(opts: &EtcdOptions) -> Result<Arc<Self>> {
        if opts.endpoints.is_empty() {
            return Err(StoreError::InvalidArgument("no datastore endpoint given".into()));
        }
        let tls = if opts.ca_file.is_some() || opts.cert_file.is_some() {
            let mut tls = ClientTlsConfig::new();
            if let Some(ca) = &opts.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&opts.cert_file, &opts.key_file) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            Some(tls)
        } else {
            None
        };
        let mut endpoints = Vec::new();
        for url in &opts.endpoints {
            let mut ep = Endpoint::from_shared(url.clone())
                .map_err(|e| StoreError::InvalidArgument(format!("bad datastore endpoint {url:?}: {e}")))?
                .connect_timeout(std::time::Duration::from_secs(5))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(std::time::Duration::from_secs(30));
            if url.starts_with("https://") {
                let tls = tls.clone().unwrap_or_else(|| ClientTlsConfig::new().with_enabled_roots());
                ep = ep.tls_config(tls).map_err(|e| StoreError::InvalidArgument(format!("TLS for {url}: {e}")))?;
            }
            endpoints.push(ep);
        }
        let channel = if endpoints.len() == 1 {
            endpoints.remove(0).connect_lazy()
        } else {
            Channel::balance_list(endpoints.into_iter())
        };
        Ok(Arc::new(EtcdStore {
            kv: kv_client::KvClient::new(channel.clone()).max_decoding_message_size(usize::MAX),
            watch: watch_client::WatchClient::new(channel.clone()).max_decoding_message_size(usize::MAX),
            lease: lease_client::LeaseClient::new(channel.clone()),
            maintenance: maintenance_client::MaintenanceClient::new(channel.clone())
                .max_decoding_message_size(usize::MAX),
            cluster: cluster_client::ClusterClient::new(channel),
        }))
    }
}

fn remote<T>(res: std::result::Result<tonic::Response<T>, tonic::Status>) -> Result<T> {
    res.map(tonic::Response::into_inner).map_err(StoreError::from_status)
}

#[async_trait]
impl Store for EtcdStore {
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        remote(self.kv.clone().range(req).await)
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        remote(self.kv.clone().put(req).await)
    }

    async fn delete_range(&self, req: DeleteRangeRequest) -> Result<DeleteRangeResponse> {
        remote(self.kv.clone().delete_range(req).await)
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        remote(self.kv.clone().txn(req).await)
    }

    async fn compact(&self, req: CompactionRequest) -> Result<CompactionResponse> {
        remote(self.kv.clone().compact(req).await)
    }

    async fn watch(&self, requests: WatchRequestStream) -> Result<WatchResponseStream> {
        // Requests are forwarded through a channel: tonic's client wants a
        // stream it can own outright, independent of the caller's type.
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut requests = requests;
            while let Some(req) = requests.next().await {
                if tx.send(req).await.is_err() {
                    break;
                }
            }
        });
        let responses = remote(self.watch.clone().watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await)?;
        Ok(Box::pin(responses.map(|r| r.map_err(StoreError::from_status))))
    }

    async fn lease_grant(&self, req: LeaseGrantRequest) -> Result<LeaseGrantResponse> {
        remote(self.lease.clone().lease_grant(req).await)
    }

    async fn lease_revoke(&self, req: LeaseRevokeRequest) -> Result<LeaseRevokeResponse> {
        remote(self.lease.clone().lease_revoke(req).await)
    }

    async fn lease_keep_alive(&self, req: LeaseKeepAliveRequest) -> Result<LeaseKeepAliveResponse> {
        let mut responses = remote(self.lease.clone().lease_keep_alive(tokio_stream::once(req)).await)?;
        match responses.next().await {
            Some(res) => res.map_err(StoreError::from_status),
            None => Err(StoreError::Internal("etcd closed the keep-alive stream".into())),
        }
    }

    async fn lease_time_to_live(&self, req: LeaseTimeToLiveRequest) -> Result<LeaseTimeToLiveResponse> {
        remote(self.lease.clone().lease_time_to_live(req).await)
    }

    async fn lease_leases(&self, req: LeaseLeasesRequest) -> Result<LeaseLeasesResponse> {
        remote(self.lease.clone().lease_leases(req).await)
    }

    async fn status(&self) -> Result<StatusResponse> {
        remote(self.maintenance.clone().status(StatusRequest {}).await)
    }

    async fn alarm(&self, req: AlarmRequest) -> Result<AlarmResponse> {
        remote(self.maintenance.clone().alarm(req).await)
    }

    async fn member_list(&self, req: MemberListRequest) -> Result<MemberListResponse> {
        remote(self.cluster.clone().member_list(req).await)
    }

    async fn defragment(&self) -> Result<DefragmentResponse> {
        remote(self.maintenance.clone().defragment(DefragmentRequest {}).await)
    }

    async fn snapshot(&self) -> Result<SnapshotStream> {
        let chunks = remote(self.maintenance.clone().snapshot(SnapshotRequest {}).await)?;
        Ok(Box::pin(chunks.map(|r| r.map_err(StoreError::from_status))))
    }
}
