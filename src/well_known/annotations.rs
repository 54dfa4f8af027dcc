//! Annotation keys (and their values) that one component writes and
//! another reads.

/// The annotation that makes a pod the mirror of a static pod: the kubelet
/// sets it, the API server's NodeRestriction and validation check it.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// Upstream's annotation naming who provisioned a PersistentVolume.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// The built-in local-path provisioner's name (k3s'): a StorageClass's
/// `provisioner`, and `PROVISIONED_BY` on the volumes it made, which the
/// node removes when they are released.
pub const LOCAL_PATH_PROVISIONER: &str = "rancher.io/local-path";
