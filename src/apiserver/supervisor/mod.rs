//! ferrok's own endpoints beside the Kubernetes API, as k3s' supervisor
//! serves its `/cacerts` and `/v1-k3s/…` (here `/v1-ferrok/…`): what a
//! joining node asks for before it has credentials (`node_join`), the
//! server's join token and its rotation (`server_token`), the rotation of
//! the cluster's CAs (`ca_rotation`), and the drive of encryption at rest
//! (`secrets_encrypt`, for `ferrok secrets-encrypt`).

pub mod ca_rotation;
pub mod node_join;
pub mod secrets_encrypt;
pub mod server_token;
