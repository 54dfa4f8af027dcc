//! Unpacking an image's layers into containerd's overlayfs snapshotter, as
//! containerd's own unpacker does: one committed snapshot per layer, named
//! by its chain ID, each prepared on its parent and filled by the Diff
//! service's Apply. The config blob then carries the GC label naming the
//! top snapshot, and each layer blob its uncompressed digest, so the
//! snapshots live as long as the image and CRI finds the image unpacked.

use std::collections::BTreeMap;

use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::ApplyRequest;
use containerd_client::types::Descriptor as CtrdDescriptor;

use super::content::Session;
use super::oci::{chain_ids, Descriptor, GC_REF_SNAPSHOT, LABEL_UNCOMPRESSED};
use super::ImageError;

/// The snapshotter ferrok's containerd config names for CRI.
pub const SNAPSHOTTER: &str = "overlayfs";

/// Unpacks `layers` (with their `diff_ids` from the config) and labels the
/// blobs; `config` is the config blob's digest.
pub async fn unpack(
    session: &Session,
    source_name: &str,
    config: &str,
    layers: &[Descriptor],
    diff_ids: &[String],
) -> Result<(), ImageError> {
    if layers.len() != diff_ids.len() {
        return Err(ImageError::archive(
            source_name,
            format!("the manifest has {} layers but its config lists {} diff IDs", layers.len(), diff_ids.len()),
        ));
    }
    let chains = chain_ids(diff_ids);
    let mut snapshots = SnapshotsClient::new(session.channel());
    let mut parent = String::new();
    for (i, (layer, chain)) in layers.iter().zip(&chains).enumerate() {
        // Held for this image first: should another image's unpack have made
        // it, the garbage collector cannot take it before our record exists.
        session.lease(&format!("snapshots/{SNAPSHOTTER}"), chain).await?;
        let stat = StatSnapshotRequest { snapshotter: SNAPSHOTTER.into(), key: chain.clone() };
        match snapshots.stat(session.request(stat)).await {
            Ok(_) => {
                parent = chain.clone();
                continue;
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(ImageError::Containerd { call: "Snapshots.Stat", status: s }),
        }
        apply_layer(session, source_name, i, layer, &diff_ids[i], chain, &parent).await?;
        parent = chain.clone();
    }
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        let labels = BTreeMap::from([(LABEL_UNCOMPRESSED.to_string(), diff_id.clone())]);
        session.set_labels(&layer.digest, &labels).await?;
    }
    if let Some(top) = chains.last() {
        let labels = BTreeMap::from([(format!("{GC_REF_SNAPSHOT}.{SNAPSHOTTER}"), top.clone())]);
        session.set_labels(config, &labels).await?;
    }
    Ok(())
}

async fn apply_layer(
    session: &Session,
    source_name: &str,
    index: usize,
    layer: &Descriptor,
    diff_id: &str,
    chain: &str,
    parent: &str,
) -> Result<(), ImageError> {
    let mut snapshots = SnapshotsClient::new(session.channel());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    // containerd's unpacker names its work snapshots "extract-<unique> <chain ID>".
    let key = format!("extract-ferrok-{nanos}-{index} {chain}");
    let prepare = PrepareSnapshotRequest {
        snapshotter: SNAPSHOTTER.into(),
        key: key.clone(),
        parent: parent.to_string(),
        labels: Default::default(),
    };
    let mounts = snapshots
        .prepare(session.request(prepare))
        .await
        .map_err(ImageError::containerd("Snapshots.Prepare"))?
        .into_inner()
        .mounts;
    let result = async {
        let diff = CtrdDescriptor {
            media_type: layer.media_type.clone(),
            digest: layer.digest.clone(),
            size: layer.size,
            annotations: Default::default(),
        };
        let apply = ApplyRequest { diff: Some(diff), mounts, payloads: Default::default(), sync_fs: false };
        let applied = DiffClient::new(session.channel())
            .apply(session.request(apply))
            .await
            .map_err(ImageError::containerd("Diff.Apply"))?
            .into_inner()
            .applied
            .unwrap_or_default();
        if applied.digest != diff_id {
            return Err(ImageError::DigestMismatch {
                source_name: source_name.to_string(),
                path: format!("layer {} ({}) uncompressed", index + 1, layer.digest),
                expected: diff_id.to_string(),
                actual: applied.digest,
            });
        }
        let commit = CommitSnapshotRequest {
            snapshotter: SNAPSHOTTER.into(),
            name: chain.to_string(),
            key: key.clone(),
            labels: Default::default(),
        };
        snapshots.commit(session.request(commit)).await.map_err(ImageError::containerd("Snapshots.Commit"))?;
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            tracing::debug!(layer = %layer.digest, chain, "layer unpacked");
            Ok(())
        }
        Err(e) => {
            let remove = RemoveSnapshotRequest { snapshotter: SNAPSHOTTER.into(), key };
            let _ = snapshots.remove(session.request(remove)).await;
            match e {
                // Another unpack of the same layer won the race: theirs is as good.
                ImageError::Containerd { call: "Snapshots.Commit", status }
                    if status.code() == tonic::Code::AlreadyExists =>
                {
                    Ok(())
                }
                e => Err(e),
            }
        }
    }
}
