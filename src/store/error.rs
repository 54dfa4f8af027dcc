//! Errors of the store, spelled as etcd spells them so that clients of the
//! etcd v3 face (etcdctl, the Kubernetes apiserver) react as they do to etcd.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted { compact_revision: i64 },
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: {0}")]
    InvalidArgument(String),
    /// The space quota is reached (etcd's NOSPACE alarm): writes that would
    /// add data are refused until the alarm is disarmed.
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    #[error("datastore: sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("datastore: {0}")]
    Io(#[from] std::io::Error),
    #[error("datastore: {0}")]
    Internal(String),
    #[error("datastore is shutting down")]
    Closed,
    /// An error from an external etcd that has no typed variant here.
    #[error("{}", .0.message())]
    Remote(Status),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// The gRPC code etcd uses for this error.
    pub fn code(&self) -> Code {
        match self {
            Self::Compacted { .. } | Self::FutureRevision | Self::LeaseTtlTooLarge => Code::OutOfRange,
            Self::RequestTooLarge
            | Self::EmptyKey
            | Self::DuplicateKey
            | Self::TooManyOps
            | Self::KeyNotFound
            | Self::ValueProvided
            | Self::LeaseProvided
            | Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::LeaseNotFound => Code::NotFound,
            Self::LeaseExists => Code::FailedPrecondition,
            Self::NoSpace => Code::ResourceExhausted,
            Self::Closed => Code::Unavailable,
            Self::Sqlite(_) | Self::Io(_) | Self::Internal(_) => Code::Internal,
            Self::Remote(status) => status.code(),
        }
    }

    /// Recognises etcd's own error strings coming back from an external etcd,
    /// so that every backend reports the same typed errors.
    pub fn from_status(status: Status) -> Self {
        match status.message() {
            "etcdserver: mvcc: required revision has been compacted" => Self::Compacted { compact_revision: 0 },
            "etcdserver: mvcc: required revision is a future revision" => Self::FutureRevision,
            "etcdserver: request is too large" => Self::RequestTooLarge,
            "etcdserver: key is not provided" => Self::EmptyKey,
            "etcdserver: requested lease not found" => Self::LeaseNotFound,
            "etcdserver: lease already exists" => Self::LeaseExists,
            "etcdserver: too large lease TTL" => Self::LeaseTtlTooLarge,
            "etcdserver: duplicate key given in txn request" => Self::DuplicateKey,
            "etcdserver: too many operations in txn request" => Self::TooManyOps,
            "etcdserver: key not found" => Self::KeyNotFound,
            "etcdserver: value is provided" => Self::ValueProvided,
            "etcdserver: lease is provided" => Self::LeaseProvided,
            "etcdserver: mvcc: database space exceeded" => Self::NoSpace,
            _ => Self::Remote(status),
        }
    }
}

impl From<StoreError> for Status {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Remote(status) => status,
            other => Status::new(other.code(), other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip_keeps_etcd_strings() {
        for err in [StoreError::FutureRevision, StoreError::EmptyKey, StoreError::LeaseNotFound, StoreError::NoSpace] {
            let text = err.to_string();
            let status: Status = err.into();
            assert_eq!(status.message(), text);
            let back = StoreError::from_status(status);
            assert_eq!(back.to_string(), text);
        }
        let status: Status = StoreError::Compacted { compact_revision: 4 }.into();
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(status.message(), "etcdserver: mvcc: required revision has been compacted");
    }
}
