//! Types, servers and clients generated from `proto/` (etcd's v3 API).

#![allow(clippy::all, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

pub use etcdserverpb::*;
pub use mvccpb::{event::EventType, Event, KeyValue};
