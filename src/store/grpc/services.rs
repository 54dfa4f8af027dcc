//! The etcd v3 services over any `Store`: each RPC hands the request to the
//! store as it is and maps errors to the gRPC statuses etcd sends.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::store::proto::*;
use crate::store::Store;

type RpcResult<T> = Result<Response<T>, Status>;
type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The etcd face of one store; cheap to clone, one clone per service.
#[derive(Clone)]
pub struct EtcdFacade {
    store: Arc<dyn Store>,
}

impl EtcdFacade {
    pub fn new(store: Arc<dyn Store>) -> Self {
        EtcdFacade { store }
    }
}

/// The requests of a client stream, up to its end or first error.
fn requests<T: Send + 'static>(stream: Streaming<T>) -> Pin<Box<dyn Stream<Item = T> + Send>> {
    Box::pin(stream.take_while(|r| std::future::ready(r.is_ok())).filter_map(|r| std::future::ready(r.ok())))
}

#[tonic::async_trait]
impl kv_server::Kv for EtcdFacade {
    async fn range(&self, req: Request<RangeRequest>) -> RpcResult<RangeResponse> {
        Ok(Response::new(self.store.range(req.into_inner()).await?))
    }

    async fn put(&self, req: Request<PutRequest>) -> RpcResult<PutResponse> {
        Ok(Response::new(self.store.put(req.into_inner()).await?))
    }

    async fn delete_range(&self, req: Request<DeleteRangeRequest>) -> RpcResult<DeleteRangeResponse> {
        Ok(Response::new(self.store.delete_range(req.into_inner()).await?))
    }

    async fn txn(&self, req: Request<TxnRequest>) -> RpcResult<TxnResponse> {
        Ok(Response::new(self.store.txn(req.into_inner()).await?))
    }

    async fn compact(&self, req: Request<CompactionRequest>) -> RpcResult<CompactionResponse> {
        Ok(Response::new(self.store.compact(req.into_inner()).await?))
    }
}

#[tonic::async_trait]
impl watch_server::Watch for EtcdFacade {
    type WatchStream = RpcStream<WatchResponse>;

    async fn watch(&self, req: Request<Streaming<WatchRequest>>) -> RpcResult<Self::WatchStream> {
        let responses = self.store.watch(requests(req.into_inner())).await?;
        Ok(Response::new(Box::pin(responses.map(|r| r.map_err(Status::from)))))
    }
}

#[tonic::async_trait]
impl lease_server::Lease for EtcdFacade {
    type LeaseKeepAliveStream = RpcStream<LeaseKeepAliveResponse>;

    async fn lease_grant(&self, req: Request<LeaseGrantRequest>) -> RpcResult<LeaseGrantResponse> {
        Ok(Response::new(self.store.lease_grant(req.into_inner()).await?))
    }

    async fn lease_revoke(&self, req: Request<LeaseRevokeRequest>) -> RpcResult<LeaseRevokeResponse> {
        Ok(Response::new(self.store.lease_revoke(req.into_inner()).await?))
    }

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> RpcResult<Self::LeaseKeepAliveStream> {
        let mut incoming = requests(req.into_inner());
        let (tx, rx) = mpsc::channel(16);
        let store = self.store.clone();
        tokio::spawn(async move {
            while let Some(req) = incoming.next().await {
                let resp = store.lease_keep_alive(req).await.map_err(Status::from);
                let failed = resp.is_err();
                if tx.send(resp).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(&self, req: Request<LeaseTimeToLiveRequest>) -> RpcResult<LeaseTimeToLiveResponse> {
        Ok(Response::new(self.store.lease_time_to_live(req.into_inner()).await?))
    }

    async fn lease_leases(&self, req: Request<LeaseLeasesRequest>) -> RpcResult<LeaseLeasesResponse> {
        Ok(Response::new(self.store.lease_leases(req.into_inner()).await?))
    }
}

#[tonic::async_trait]
impl maintenance_server::Maintenance for EtcdFacade {
    type SnapshotStream = RpcStream<SnapshotResponse>;

    async fn alarm(&self, req: Request<AlarmRequest>) -> RpcResult<AlarmResponse> {
        Ok(Response::new(self.store.alarm(req.into_inner()).await?))
    }

    async fn status(&self, _req: Request<StatusRequest>) -> RpcResult<StatusResponse> {
        Ok(Response::new(self.store.status().await?))
    }

    async fn defragment(&self, _req: Request<DefragmentRequest>) -> RpcResult<DefragmentResponse> {
        Ok(Response::new(self.store.defragment().await?))
    }

    async fn hash(&self, _req: Request<HashRequest>) -> RpcResult<HashResponse> {
        Err(Status::unimplemented("ferrok does not serve Hash"))
    }

    async fn hash_kv(&self, _req: Request<HashKvRequest>) -> RpcResult<HashKvResponse> {
        Err(Status::unimplemented("ferrok does not serve HashKV"))
    }

    async fn snapshot(&self, _req: Request<SnapshotRequest>) -> RpcResult<Self::SnapshotStream> {
        let chunks = self.store.snapshot().await?;
        Ok(Response::new(Box::pin(chunks.map(|r| r.map_err(Status::from)))))
    }
}

#[tonic::async_trait]
impl cluster_server::Cluster for EtcdFacade {
    async fn member_list(&self, req: Request<MemberListRequest>) -> RpcResult<MemberListResponse> {
        Ok(Response::new(self.store.member_list(req.into_inner()).await?))
    }
}
