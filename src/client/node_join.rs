//! The join protocol's wire contract, which the node's bootstrap speaks and
//! the API server's join endpoints answer (k3s' `/cacerts` and
//! `/v1-k3s/…`, with ferrok's names): the paths, the headers a joining
//! node names itself with, and the cluster settings it is given.

/// The server CA bundle, for anyone: the node checks its SHA-256 against
/// the join token before it sends a secret.
pub const SERVER_CA_PATH: &str = "/cacerts";
/// The cluster settings a node needs ([`NodeJoinConfig`]).
pub const CONFIG_PATH: &str = "/v1-ferrok/config";
/// A PKCS#10 request in, the node's client certificate out.
pub const KUBELET_CLIENT_CERT_PATH: &str = "/v1-ferrok/kubelet-client.crt";
/// A PKCS#10 request in, the node's serving certificate out.
pub const KUBELET_SERVING_CERT_PATH: &str = "/v1-ferrok/kubelet-serving.crt";

/// The headers a joining node names itself with.
pub const NODE_NAME_HEADER: &str = "Ferrok-Node-Name";
pub const NODE_PASSWORD_HEADER: &str = "Ferrok-Node-Password";
/// The node's addresses for its serving certificate, comma-separated.
pub const NODE_IP_HEADER: &str = "Ferrok-Node-IP";

/// What `/v1-ferrok/config` tells a joining node.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeJoinConfig {
    pub cluster_cidr: String,
    pub service_cidr: String,
    pub cluster_dns: String,
    pub cluster_domain: String,
    /// The CA of client certificates (the API server's towards kubelets among them).
    pub client_ca: String,
    /// The server's `--flannel-backend`, which its agents follow unless told otherwise.
    #[serde(default)]
    pub flannel_backend: String,
    /// The server's `--disable coredns`: its agents serve no cluster DNS
    /// either. (Absent from older servers: false, the DNS runs.)
    #[serde(default)]
    pub disable_cluster_dns: bool,
    /// The local-path provisioner's folder (`--default-local-storage-path`),
    /// where agents remove their released volumes' directories; empty when
    /// the provisioner is off (`--disable local-storage`) or the server is
    /// older.
    #[serde(default)]
    pub local_storage_path: String,
}
