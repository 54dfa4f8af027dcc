//! What every request passes before a handler sees it, as upstream's
//! handler chain (`k8s.io/apiserver/pkg/endpoints/filters` and
//! `server/filters`), outermost first: the audit log (`audit`), panic
//! recovery (`recover`), authentication (`authentication`: a bearer
//! token, else the client certificate the listener verified),
//! impersonation (`impersonation`), and authorization (`authorization`,
//! asked by each handler once it knows the verb, over the authorizers of
//! `auth::union`). `router` puts them in that order.

pub mod authentication;
pub mod authorization;
pub mod impersonation;
pub mod recover;
