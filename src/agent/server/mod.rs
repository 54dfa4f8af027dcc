//! The kubelet API of the node (placeholder until the lead's server lands;
//! at merge only the `streams` line below is kept).

pub mod streams;
