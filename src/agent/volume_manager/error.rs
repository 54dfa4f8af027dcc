//! What can go wrong while preparing a pod's volumes, worded as upstream's
//! kubelet words it, so the pod worker's `FailedMount` events read the
//! same as on any other cluster.

use std::path::PathBuf;

/// Why one volume could not be set up (upstream's `SetUp` error text).
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    /// A ConfigMap or Secret the volume needs does not exist.
    #[error("{kind} \"{name}\" not found")]
    SourceNotFound { kind: &'static str, name: String },
    /// The object exists, but an item names a key it does not have.
    #[error("{kind} references non-existent {what} key: {key}")]
    KeyNotFound { kind: &'static str, what: &'static str, key: String },
    #[error("failed to sync {kind} cache: timed out waiting for the condition{}", last_error(.last))]
    SourceSync { kind: &'static str, last: Option<String> },
    #[error("persistentvolumeclaim \"{0}\" not found")]
    ClaimNotFound(String),
    #[error("persistentvolumeclaim \"{0}\" is not bound")]
    ClaimNotBound(String),
    #[error("persistentvolumeclaim \"{0}\" is being deleted")]
    ClaimDeleting(String),
    #[error("PVC {namespace}/{claim} was not created for pod {namespace}/{pod} (pod is not owner)")]
    ClaimNotOwned { namespace: String, claim: String, pod: String },
    #[error("persistentvolume \"{0}\" not found")]
    VolumeNotFound(String),
    #[error("persistentvolume \"{volume}\" is bound to another claim than \"{claim}\"")]
    VolumeBoundElsewhere { volume: String, claim: String },
    #[error("hostPath type check failed: {path} is not a {what}")]
    HostPathType { path: String, what: &'static str },
    #[error("{0} is an invalid volume type")]
    InvalidHostPathType(String),
    #[error("invalid HostPath `{0}`: must not contain '..'")]
    HostPathBacksteps(String),
    #[error("{0}")]
    InvalidPath(String),
    #[error("unsupported fieldPath: {0}")]
    UnsupportedFieldPath(String),
    #[error("unsupported container resource : {0}")]
    UnsupportedResource(String),
    #[error("fieldPath {0:?} does not support subscript")]
    NoSubscript(String),
    #[error("container {0} not found")]
    NoSuchContainer(String),
    #[error("invalid divisor {0:?}")]
    InvalidDivisor(String),
    #[error("unsupported volume type")]
    UnsupportedVolume,
    #[error("unsupported persistent volume type of \"{0}\"")]
    UnsupportedPersistentVolume(String),
    #[error("unsupported emptyDir medium {0:?}")]
    UnsupportedMedium(String),
    #[error("local volume path {0:?} does not exist")]
    LocalPathMissing(String),
    #[error("failed to fetch token: {0}")]
    Token(String),
    #[error("{0}")]
    Api(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("mount of {target} failed: {source}")]
    Mount { target: PathBuf, source: std::io::Error },
    /// Several sources of one projected or downwardAPI volume failed
    /// (upstream's aggregate: `[a, b]`).
    #[error("{}", aggregate(.0))]
    Aggregate(Vec<SetUpError>),
}

fn last_error(last: &Option<String>) -> String {
    last.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default()
}

fn aggregate(errors: &[SetUpError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => format!("[{}]", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}

impl SetUpError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> SetUpError {
        let path = path.into();
        move |source| SetUpError::Io { path, source }
    }

    /// One error from many, as upstream's `NewAggregate` (none is no error).
    pub(crate) fn aggregate(mut errors: Vec<SetUpError>) -> Result<(), SetUpError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(SetUpError::Aggregate(errors)),
        }
    }

    /// The referenced object or key is missing (optional sources tolerate it).
    pub fn is_not_found(&self) -> bool {
        matches!(self, SetUpError::SourceNotFound { .. })
    }
}

/// One volume that failed, with the message of upstream's operation executor.
#[derive(Debug, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {error}")]
pub struct SetUpFailure {
    pub volume: String,
    pub error: SetUpError,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("the pod has no uid")]
    NoUid,
    #[error("invalid pod uid {0:?}")]
    InvalidUid(String),
    /// Some volumes could not be set up; the others are ready and stay so.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    SetUp(Vec<SetUpFailure>),
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    NoSuchVolume { volume: String, container: String },
    #[error("Bidirectional mount propagation is available only to privileged containers")]
    BidirectionalNotPrivileged,
    #[error("invalid mount propagation {0:?}")]
    InvalidPropagation(String),
    #[error("unable to expand the subPathExpr {expr:?}: missing value for {missing}")]
    SubPathExpr { expr: String, missing: String },
    #[error("error SubPath `{0}` must not be an absolute path")]
    SubPathAbsolute(String),
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    SubPathBacksteps(String),
    #[error("subpath {path:?} not within volume path {volume:?}")]
    SubPathOutside { path: PathBuf, volume: PathBuf },
    #[error("failed to prepare subPath for volumeMount {mount:?} of container {container:?}: {reason}")]
    SubPath { mount: String, container: String, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("unmount of {path} failed: {source}")]
    Unmount { path: PathBuf, source: std::io::Error },
    #[error("{0} is still mounted; not removing it")]
    StillMounted(PathBuf),
    #[error("a volume task failed: {0}")]
    Task(String),
}

impl VolumeError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> VolumeError {
        let path = path.into();
        move |source| VolumeError::Io { path, source }
    }

    /// The messages of upstream's `FailedMount` events, one per failed volume.
    pub fn event_messages(&self) -> Vec<String> {
        match self {
            VolumeError::SetUp(failures) => failures.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        }
    }

    /// The event reason the pod worker records for this error.
    pub fn event_reason(&self) -> &'static str {
        match self {
            VolumeError::SetUp(_) | VolumeError::NoUid | VolumeError::InvalidUid(_) => "FailedMount",
            _ => "Failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_upstream() {
        let e = SetUpFailure {
            volume: "x".into(),
            error: SetUpError::SourceNotFound { kind: "configmap", name: "y".into() },
        };
        assert_eq!(e.to_string(), "MountVolume.SetUp failed for volume \"x\" : configmap \"y\" not found");
        let e = SetUpError::HostPathType { path: "/x".into(), what: "directory" };
        assert_eq!(e.to_string(), "hostPath type check failed: /x is not a directory");
        let agg = SetUpError::aggregate(vec![
            SetUpError::SourceNotFound { kind: "secret", name: "a".into() },
            SetUpError::SourceNotFound { kind: "configmap", name: "b".into() },
        ]);
        assert_eq!(agg.unwrap_err().to_string(), "[secret \"a\" not found, configmap \"b\" not found]");
        assert!(SetUpError::aggregate(vec![]).is_ok());
    }
}
