//! Authentication and authorization: users from client certificates and
//! service-account tokens, the authorizers (the Node authorizer over its
//! graph, RBAC over the stored roles and bindings, and their union), the
//! default cluster roles, and the review APIs (`kubectl auth can-i`,
//! `kubectl auth whoami`, `kubectl create token`).

pub mod bootstrap_token;
pub mod cluster_roles;
pub mod component_roles;
pub mod controller_roles;
pub mod decision;
pub mod default_policy;
pub mod graph_populator;
pub mod legacy_token;
pub mod namespace_roles;
pub mod node_authorizer;
pub mod node_graph;
pub mod rbac;
pub mod reconcile;
pub mod token;
pub mod union;
pub mod user;

pub use decision::{Decision, DecisionRecord};
pub use user::User;
