//! Names more than one floor speaks: the labels, annotations and user
//! names that are a contract between the API server, the controllers and
//! the node, kept on the ground where every side can stand on them, as
//! upstream keeps them in `k8s.io/api` (well-known labels and annotation
//! keys), the kubelet's well-known labels and `k8s.io/apiserver`'s user
//! package. Constants and the predicates that read them; nothing else.

pub mod annotations;
pub mod labels;
pub mod users;
