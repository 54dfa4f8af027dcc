//! ferrok: Kubernetes in one Rust executable.
//!
//! The modules follow the path of a request (see `DESIGN.md`); `main.rs`
//! only calls [`cli::main`].

pub mod agent;
pub mod apiserver;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod controllers;
pub mod decode;
pub mod duration;
pub mod host;
pub mod metrics;
pub mod net;
pub mod network;
pub mod pki;
pub mod quantity;
pub mod quota;
pub mod scheduler;
pub mod store;
pub mod sync;
pub mod websocket;
pub mod well_known;
