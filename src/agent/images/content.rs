//! containerd's content store, leases and image records, as an import uses
//! them: everything written under one lease (so the garbage collector
//! leaves half-imported content alone until the image record points at
//! it), blobs written with their expected digest, labels set afterwards.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::{
    self as ctrd, AbortRequest, InfoRequest, ReadContentRequest, UpdateRequest, WriteAction, WriteContentRequest,
    WriteContentResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;

use super::ImageError;
use crate::agent::cri::{namespaced, Cri};

/// Largest document (index, manifest, config) read back into memory.
pub const MAX_DOCUMENT: usize = 16 << 20;
/// How long containerd keeps a lease an interrupted import left behind.
const LEASE_EXPIRY: Duration = Duration::from_secs(3600);

/// One import's connection to containerd, holding its lease.
pub struct Session {
    channel: Channel,
    lease: String,
    next_ref: std::sync::atomic::AtomicU64,
}

impl Session {
    /// Takes a lease that expires by itself should ferrok die mid-import.
    pub async fn begin(cri: &Cri) -> Result<Session, ImageError> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let lease = format!("ferrok-import-{}-{}", std::process::id(), now.as_nanos());
        let expire = rfc3339(now.as_secs() + LEASE_EXPIRY.as_secs());
        let labels = BTreeMap::from([("containerd.io/gc.expire".to_string(), expire)]).into_iter().collect();
        let channel = cri.channel();
        LeasesClient::new(channel.clone())
            .create(namespaced(ctrd::CreateRequest { id: lease.clone(), labels }))
            .await
            .map_err(ImageError::containerd("Leases.Create"))?;
        Ok(Session { channel, lease, next_ref: 0.into() })
    }

    /// Drops the lease: from now on only the image records keep the content.
    pub async fn end(self) {
        let req = namespaced(ctrd::DeleteRequest { id: self.lease.clone(), sync: false });
        if let Err(e) = LeasesClient::new(self.channel.clone()).delete(req).await {
            tracing::warn!(lease = %self.lease, error = %e.message(), "cannot delete the import lease; it expires by itself");
        }
    }

    /// Puts something containerd already had under this session's lease
    /// (`content`, or `snapshots/<snapshotter>`), so the garbage collector
    /// cannot take it before the image record refers to it.
    pub async fn lease(&self, kind: &str, id: &str) -> Result<(), ImageError> {
        add_to_lease(&self.channel, &self.lease, kind, id).await
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A request in the `k8s.io` namespace, under this session's lease.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = namespaced(message);
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(self.lease.as_str()) {
            req.metadata_mut().insert("containerd-lease", v);
        }
        req
    }

    fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.channel.clone()).max_decoding_message_size(64 << 20)
    }

    pub fn images(&self) -> ImagesClient<Channel> {
        ImagesClient::new(self.channel.clone())
    }

    /// Starts writing one blob. With `expected`, containerd checks the
    /// digest at commit and answers at once when it already has the blob.
    pub async fn writer(&self, expected: Option<&str>, total: u64) -> Result<Writer, ImageError> {
        if let Some(digest) = expected {
            // Leased first: should containerd have it already, the garbage
            // collector cannot take it between its answer and ours.
            self.lease("content", digest).await?;
        }
        let n = self.next_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reference = format!("{}-{n}", self.lease);
        let (tx, rx) = mpsc::channel(2);
        let open = WriteContentRequest {
            action: WriteAction::Write as i32,
            r#ref: reference.clone(),
            total: total as i64,
            expected: expected.unwrap_or_default().to_string(),
            ..Default::default()
        };
        // The first message goes before the call: containerd answers (and
        // sends its headers) only once it has seen it.
        let _ = tx.send(open).await;
        let call = self.content().write(self.request(ReceiverStream::new(rx))).await;
        let mut w = Writer {
            tx: Some(tx),
            responses: None,
            reference,
            offset: 0,
            exists: false,
            channel: self.channel.clone(),
            lease: self.lease.clone(),
        };
        match call {
            Ok(resp) => {
                let mut responses = resp.into_inner();
                match responses.message().await {
                    Ok(Some(_)) => w.responses = Some(responses),
                    Ok(None) => return Err(stream_closed("Content.Write")),
                    Err(s) if s.code() == tonic::Code::AlreadyExists => w.exists = true,
                    Err(s) => return Err(ImageError::Containerd { call: "Content.Write", status: s }),
                }
            }
            Err(s) if s.code() == tonic::Code::AlreadyExists => w.exists = true,
            Err(s) => return Err(ImageError::Containerd { call: "Content.Write", status: s }),
        }
        if w.exists {
            w.tx = None;
        }
        Ok(w)
    }

    /// Writes a whole blob held in memory (a document ferrok made).
    pub async fn write_blob(&self, data: &[u8]) -> Result<String, ImageError> {
        let digest = super::oci::sha256_digest(data);
        let mut w = self.writer(Some(&digest), data.len() as u64).await?;
        for chunk in data.chunks(1 << 20) {
            w.write(chunk).await?;
        }
        w.commit(data.len() as u64, &digest).await?;
        Ok(digest)
    }

    /// Whether containerd has the blob (in the `k8s.io` namespace).
    pub async fn exists(&self, digest: &str) -> Result<bool, ImageError> {
        match self.content().info(self.request(InfoRequest { digest: digest.to_string() })).await {
            Ok(_) => Ok(true),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(false),
            Err(s) => Err(ImageError::Containerd { call: "Content.Info", status: s }),
        }
    }

    /// Reads a small blob (a document) back from containerd.
    pub async fn read(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let req = self.request(ReadContentRequest { digest: digest.to_string(), offset: 0, size: 0 });
        let mut stream = self.content().read(req).await.map_err(ImageError::containerd("Content.Read"))?.into_inner();
        let mut out = Vec::new();
        while let Some(chunk) = stream.message().await.map_err(ImageError::containerd("Content.Read"))? {
            out.extend_from_slice(&chunk.data);
            if out.len() > MAX_DOCUMENT {
                return Err(ImageError::Containerd {
                    call: "Content.Read",
                    status: tonic::Status::resource_exhausted(format!("{digest} is larger than {MAX_DOCUMENT} bytes")),
                });
            }
        }
        Ok(out)
    }

    /// Sets (adds or replaces) labels on a blob, leaving its others alone.
    pub async fn set_labels(&self, digest: &str, labels: &BTreeMap<String, String>) -> Result<(), ImageError> {
        if labels.is_empty() {
            return Ok(());
        }
        let info = ctrd::Info {
            digest: digest.to_string(),
            labels: labels.clone().into_iter().collect(),
            ..Default::default()
        };
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let req = self.request(UpdateRequest { info: Some(info), update_mask: Some(prost_types::FieldMask { paths }) });
        self.content().update(req).await.map_err(ImageError::containerd("Content.Update"))?;
        Ok(())
    }

    /// Creates the image record, or points an existing one at `target`.
    pub async fn put_image(&self, image: ctrd::Image) -> Result<(), ImageError> {
        let name = image.name.clone();
        let create = ctrd::CreateImageRequest { image: Some(image.clone()), source_date_epoch: None };
        match self.images().create(self.request(create)).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::AlreadyExists => {
                // No mask: name, target and labels are all replaced, as `ctr import` does.
                let update =
                    ctrd::UpdateImageRequest { image: Some(image), update_mask: None, source_date_epoch: None };
                self.images().update(self.request(update)).await.map_err(ImageError::containerd("Images.Update"))?;
                tracing::debug!(image = %name, "image record updated");
                Ok(())
            }
            Err(s) => Err(ImageError::Containerd { call: "Images.Create", status: s }),
        }
    }
}

async fn add_to_lease(channel: &Channel, lease: &str, kind: &str, id: &str) -> Result<(), ImageError> {
    let resource = ctrd::Resource { id: id.to_string(), r#type: kind.to_string() };
    let req = namespaced(ctrd::AddResourceRequest { id: lease.to_string(), resource: Some(resource) });
    LeasesClient::new(channel.clone()).add_resource(req).await.map_err(ImageError::containerd("Leases.AddResource"))?;
    Ok(())
}

fn stream_closed(call: &'static str) -> ImageError {
    ImageError::Containerd { call, status: tonic::Status::unavailable("containerd closed the stream") }
}

/// One blob being written.
pub struct Writer {
    tx: Option<mpsc::Sender<WriteContentRequest>>,
    responses: Option<Streaming<WriteContentResponse>>,
    reference: String,
    offset: i64,
    /// containerd had the blob already: writes are skipped.
    pub exists: bool,
    channel: Channel,
    lease: String,
}

impl Writer {
    async fn exchange(&mut self, req: WriteContentRequest) -> Result<WriteContentResponse, ImageError> {
        let (Some(tx), Some(responses)) = (self.tx.as_ref(), self.responses.as_mut()) else {
            return Err(stream_closed("Content.Write"));
        };
        if tx.send(req).await.is_err() {
            // The call ended: its status says why.
            return Err(match responses.message().await {
                Err(s) => ImageError::Containerd { call: "Content.Write", status: s },
                Ok(_) => stream_closed("Content.Write"),
            });
        }
        match responses.message().await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(stream_closed("Content.Write")),
            Err(s) => Err(ImageError::Containerd { call: "Content.Write", status: s }),
        }
    }

    pub async fn write(&mut self, data: &[u8]) -> Result<(), ImageError> {
        if self.exists || data.is_empty() {
            return Ok(());
        }
        let req = WriteContentRequest {
            action: WriteAction::Write as i32,
            r#ref: self.reference.clone(),
            offset: self.offset,
            data: data.to_vec(),
            ..Default::default()
        };
        let resp = self.exchange(req).await?;
        self.offset += data.len() as i64;
        if resp.offset != self.offset {
            return Err(ImageError::Containerd {
                call: "Content.Write",
                status: tonic::Status::data_loss(format!(
                    "containerd is at offset {}, expected {}",
                    resp.offset, self.offset
                )),
            });
        }
        Ok(())
    }

    /// Commits the blob; containerd checks its size and digest.
    pub async fn commit(mut self, size: u64, digest: &str) -> Result<(), ImageError> {
        if self.exists {
            return Ok(());
        }
        // Leased before the commit: containerd answers AlreadyExists without
        // leasing it when it has the digest already.
        add_to_lease(&self.channel, &self.lease, "content", digest).await?;
        let req = WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: self.reference.clone(),
            total: size as i64,
            expected: digest.to_string(),
            offset: self.offset,
            ..Default::default()
        };
        match self.exchange(req).await {
            Ok(_) => {}
            Err(ImageError::Containerd { status, .. }) if status.code() == tonic::Code::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.tx = None;
        if let Some(mut r) = self.responses.take() {
            // Drain to the end of the call so containerd has closed the writer.
            while let Ok(Some(_)) = r.message().await {}
        }
        Ok(())
    }

    /// Gives up the write and drops what containerd had of it.
    pub async fn abort(mut self) {
        self.tx = None;
        self.responses = None;
        if !self.exists {
            let req = namespaced(AbortRequest { r#ref: self.reference.clone() });
            let _ = ContentClient::new(self.channel.clone()).abort(req).await;
        }
    }
}

/// `2024-01-02T03:04:05Z` for a Unix time (the format containerd's
/// `gc.expire` label takes).
pub fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
