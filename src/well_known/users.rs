//! User and group names with a meaning of their own, as upstream's
//! `k8s.io/apiserver/pkg/authentication/user` names them, and the
//! identities of ferrok's own components.

/// Every authenticated request's group.
pub const ALL_AUTHENTICATED: &str = "system:authenticated";
/// The group that RBAC lets do anything.
pub const SYSTEM_PRIVILEGED_GROUP: &str = "system:masters";
/// The kubelets' group; each kubelet is `system:node:<node name>` in it.
pub const NODES_GROUP: &str = "system:nodes";
pub const NODE_USER_PREFIX: &str = "system:node:";
/// A service account's user is `system:serviceaccount:<namespace>:<name>`,
/// in `system:serviceaccounts` and `system:serviceaccounts:<namespace>`.
pub const SERVICE_ACCOUNT_USER_PREFIX: &str = "system:serviceaccount:";
pub const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// The controller manager's own user (its shared informers and leader
/// election; each controller acts as its own service account).
pub const KUBE_CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
/// The scheduler's user.
pub const KUBE_SCHEDULER: &str = "system:kube-scheduler";
/// The server itself where it does what no component's role allows, as
/// k3s' supervisor does with its admin credentials.
pub const FERROK_SUPERVISOR: &str = "system:ferrok:supervisor";
