//! CSRApprovingController (csrapproving): approves kubelets' client
//! certificates, as upstream's SubjectAccessReview approver does. A request
//! for `kubernetes.io/kube-apiserver-client-kubelet` that passes that
//! signer's checks is approved (reason AutoApproved) when its requester may
//! `create` `certificatesigningrequests/selfnodeclient` (a node renewing its
//! own certificate: the requester is the request's common name) or
//! `certificatesigningrequests/nodeclient` (a new node, as a bootstrap
//! token's user). A request it recognises but may not approve is asked
//! about again later: the requester may be granted the right meanwhile.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};

use super::{approval, is_issued, request};
use crate::controllers::informers::{self, Informer};
use crate::controllers::ControllerError;
use crate::pki::csr::CertificateRequest;

/// How long before a recognised request its requester may not (yet) have
/// approved is asked about again.
const ASK_AGAIN: Duration = Duration::from_secs(60);

/// A kind of request this approver knows, the permission its requester
/// needs, and what the approval says.
struct Recognizer {
    recognize: fn(&CertificateSigningRequest, &CertificateRequest) -> bool,
    subresource: &'static str,
    message: &'static str,
}

const RECOGNIZERS: &[Recognizer] = &[
    Recognizer {
        recognize: is_self_node_client_cert,
        subresource: "selfnodeclient",
        message: "Auto approving self kubelet client certificate after SubjectAccessReview.",
    },
    Recognizer {
        recognize: is_node_client_cert,
        subresource: "nodeclient",
        message: "Auto approving kubelet client certificate after SubjectAccessReview.",
    },
];

fn is_node_client_cert(csr: &CertificateSigningRequest, req: &CertificateRequest) -> bool {
    csr.spec.signer_name == super::KUBE_APISERVER_CLIENT_KUBELET
        && super::validate_kubelet_client(req, csr.spec.usages.as_deref().unwrap_or_default()).is_ok()
}

fn is_self_node_client_cert(csr: &CertificateSigningRequest, req: &CertificateRequest) -> bool {
    csr.spec.username.as_deref() == Some(req.common_name.as_str()) && is_node_client_cert(csr, req)
}

pub async fn run(client: kube::Client, csrs: Informer<CertificateSigningRequest>) {
    let (store, events) = csrs.trigger_self();
    informers::run("csrapproving", store, vec![events], reconcile, Arc::new(client)).await;
}

/// Whether the request's requester may `create` the subresource.
async fn authorized(
    client: &kube::Client,
    csr: &CertificateSigningRequest,
    subresource: &str,
) -> Result<bool, ControllerError> {
    let spec = &csr.spec;
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: spec.username.clone(),
            uid: spec.uid.clone(),
            groups: spec.groups.clone(),
            extra: spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                verb: Some("create".into()),
                subresource: Some(subresource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = reviews.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, client: Arc<kube::Client>) -> Result<Action, ControllerError> {
    if is_issued(&csr) || approval(&csr) != (false, false) {
        return Ok(Action::await_change());
    }
    // Both recognizers want the kubelet client signer; no other request
    // needs reading.
    if csr.spec.signer_name != super::KUBE_APISERVER_CLIENT_KUBELET {
        return Ok(Action::await_change());
    }
    let name = csr.metadata.name.clone().unwrap_or_default();
    let req = request(&csr).map_err(|e| ControllerError::Invalid(format!("unable to parse csr {name:?}: {e}")))?;
    let mut tried = Vec::new();
    for r in RECOGNIZERS.iter().filter(|r| (r.recognize)(&csr, &req)) {
        tried.push(r.subresource);
        if !authorized(&client, &csr, r.subresource).await? {
            continue;
        }
        let mut approved = (*csr).clone();
        approved.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new).push(
            CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some("AutoApproved".into()),
                message: Some(r.message.into()),
                last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                ..Default::default()
            },
        );
        let csrs: Api<CertificateSigningRequest> = Api::all((*client).clone());
        csrs.replace_subresource("approval", &name, &PostParams::default(), &approved).await?;
        tracing::debug!(csr = %name, as_ = r.subresource, "approved a kubelet client certificate");
        return Ok(Action::await_change());
    }
    if !tried.is_empty() {
        tracing::debug!(csr = %name, ?tried, "recognized the request but its subject access review was not approved");
        return Ok(Action::requeue(ASK_AGAIN));
    }
    Ok(Action::await_change())
}
