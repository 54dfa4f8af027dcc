//! Who is asking: the user a client certificate names (CN, and O as
//! groups), as upstream's x509 authenticator reads it; and the users
//! ferrok's own components act as in process (`in_process`).

use crate::well_known::users::{
    ALL_AUTHENTICATED, FERROK_SUPERVISOR, KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, NODES_GROUP, NODE_USER_PREFIX,
    SERVICE_ACCOUNTS_GROUP, SERVICE_ACCOUNT_USER_PREFIX, SYSTEM_PRIVILEGED_GROUP,
};

/// An authenticated (or anonymous) user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> Self {
        User { name: "system:anonymous".into(), groups: vec!["system:unauthenticated".into()] }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }

    /// From a verified client certificate's DER.
    pub fn from_certificate(der: &[u8]) -> Option<Self> {
        let (name, mut groups) = crate::pki::subject_of(der)?;
        groups.push(ALL_AUTHENTICATED.into());
        Some(User { name, groups })
    }

    /// The identity ferrok's controller manager uses in process: the
    /// shared informers and its leader election, bound by the
    /// `system:kube-controller-manager` role (list and watch of
    /// everything, its own Lease). Each controller acts under its own
    /// service account (`controller_service_account`), so RBAC constrains
    /// what it writes.
    pub fn controller_manager() -> User {
        User { name: KUBE_CONTROLLER_MANAGER.into(), groups: vec![ALL_AUTHENTICATED.into()] }
    }

    /// The identity a controller acts as when it runs under its own
    /// service account in kube-system (upstream's
    /// `--use-service-account-credentials`).
    pub fn controller_service_account(name: &str) -> User {
        User {
            name: format!("{SERVICE_ACCOUNT_USER_PREFIX}kube-system:{name}"),
            groups: vec![
                SERVICE_ACCOUNTS_GROUP.into(),
                format!("{SERVICE_ACCOUNTS_GROUP}:kube-system"),
                ALL_AUTHENTICATED.into(),
            ],
        }
    }

    /// The identity ferrok's scheduler uses in process, bound by the
    /// `system:kube-scheduler` and `system:volume-scheduler` roles.
    pub fn scheduler() -> User {
        User { name: KUBE_SCHEDULER.into(), groups: vec![ALL_AUTHENTICATED.into()] }
    }

    /// The identity the server's own node role uses in process: the
    /// node's kubelet user (`system:node:<name>` in `system:nodes`),
    /// exactly what an agent's client certificate names. The Node
    /// authorizer and the NodeRestriction admission plugin confine it to
    /// its own Node, Lease and pods and to the objects those pods
    /// reference; the `system:ferrok:node` ClusterRole adds the
    /// cluster-wide reads of its service proxy, DNS and network policy
    /// parts.
    pub fn node(name: &str) -> User {
        User { name: format!("{NODE_USER_PREFIX}{name}"), groups: vec![NODES_GROUP.into(), ALL_AUTHENTICATED.into()] }
    }

    /// The identity of the server itself where it does what no
    /// component's role allows, as k3s' supervisor does with its admin
    /// credentials: the labels of its own Node that a kubelet may not set
    /// (`node-role.kubernetes.io/control-plane`, restricted
    /// `--node-label`s).
    pub fn supervisor() -> User {
        User { name: FERROK_SUPERVISOR.into(), groups: vec![SYSTEM_PRIVILEGED_GROUP.into(), ALL_AUTHENTICATED.into()] }
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}
