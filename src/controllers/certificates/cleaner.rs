//! CSRCleanerController (csrcleaner): deletes requests that are done with,
//! by upstream's rules: an approved request an hour after its approval
//! once issued, a denied or failed one an hour after it was denied or
//! failed (the condition's `lastUpdateTime`), a pending one (no condition
//! at all) a day after it was created, and an issued one whose certificate
//! has expired. Upstream looks every hour; here each request is looked at
//! when it changes and again when its first deadline comes.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams};

use super::is_issued;
use crate::controllers::informers::{self, Informer};
use crate::controllers::ControllerError;

const APPROVED_RETENTION: i64 = 3600;
const DENIED_RETENTION: i64 = 3600;
const PENDING_RETENTION: i64 = 24 * 3600;

pub async fn run(client: kube::Client, csrs: Informer<CertificateSigningRequest>) {
    let (store, events) = csrs.trigger_self();
    informers::run("csrcleaner", store, vec![events], reconcile, Arc::new(client)).await;
}

fn seconds(t: &Option<Time>) -> Option<i64> {
    t.as_ref().map(|t| t.0.as_second())
}

/// When the certificate the request was issued expires, if it was and it reads.
fn certificate_expiry(csr: &CertificateSigningRequest) -> Option<i64> {
    let pem = csr.status.as_ref()?.certificate.as_ref()?;
    let left = crate::pki::seconds_left(std::str::from_utf8(&pem.0).ok()?).ok()?;
    Some(k8s_openapi::jiff::Timestamp::now().as_second() + left)
}

/// When the request is to be deleted: the earliest of its rules'
/// deadlines, None when no rule applies. A rule's time must be past
/// strictly (upstream's `isOlderThan`).
pub fn deadline(csr: &CertificateSigningRequest) -> Option<i64> {
    let conditions = csr.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let issued = is_issued(csr);
    let mut deadlines = Vec::new();
    for c in conditions {
        let updated = seconds(&c.last_update_time);
        match c.type_.as_str() {
            "Approved" if issued => deadlines.extend(updated.map(|t| t + APPROVED_RETENTION + 1)),
            "Denied" | "Failed" => deadlines.extend(updated.map(|t| t + DENIED_RETENTION + 1)),
            _ => {}
        }
    }
    if conditions.is_empty() {
        deadlines.extend(seconds(&csr.metadata.creation_timestamp).map(|t| t + PENDING_RETENTION + 1));
    }
    if issued && conditions.iter().any(|c| c.type_ == "Approved") {
        deadlines.extend(certificate_expiry(csr).map(|t| t + 1));
    }
    deadlines.into_iter().min()
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, client: Arc<kube::Client>) -> Result<Action, ControllerError> {
    let Some(at) = deadline(&csr) else { return Ok(Action::await_change()) };
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    if at > now {
        return Ok(Action::requeue(Duration::from_secs(u64::try_from(at - now).unwrap_or(1))));
    }
    let name = csr.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, "cleaning up a certificate signing request that is done with");
    let csrs: Api<CertificateSigningRequest> = Api::all((*client).clone());
    match csrs.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};
    use k8s_openapi::jiff::Timestamp;
    use k8s_openapi::ByteString;

    fn at(unix: i64) -> Option<Time> {
        Some(Time(Timestamp::from_second(unix).unwrap()))
    }

    fn csr(created: i64, conditions: &[(&str, i64)], certificate: Option<&str>) -> CertificateSigningRequest {
        let mut c = CertificateSigningRequest::default();
        c.metadata.creation_timestamp = at(created);
        c.status = Some(CertificateSigningRequestStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, when)| CertificateSigningRequestCondition {
                        type_: t.to_string(),
                        status: "True".into(),
                        last_update_time: at(*when),
                        ..Default::default()
                    })
                    .collect(),
            ),
            certificate: certificate.map(|c| ByteString(c.as_bytes().to_vec())),
        });
        c
    }

    #[test]
    fn deadlines_follow_upstreams_rules() {
        assert_eq!(deadline(&csr(1000, &[], None)), Some(1000 + 24 * 3600 + 1));
        assert_eq!(deadline(&csr(1000, &[("Denied", 5000)], None)), Some(5000 + 3601));
        assert_eq!(deadline(&csr(1000, &[("Approved", 5000), ("Failed", 6000)], None)), Some(6000 + 3601));
        // Approved but not issued: kept until it is.
        assert_eq!(deadline(&csr(1000, &[("Approved", 5000)], None)), None);
        // A condition without a time never ages.
        let mut undated = csr(1000, &[("Denied", 0)], None);
        undated.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_update_time = None;
        assert_eq!(deadline(&undated), None);
    }
}
