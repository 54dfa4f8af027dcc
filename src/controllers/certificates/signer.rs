//! CSRSigningController (csrsigning): an approved request that has not
//! failed and has no certificate yet is issued one for the
//! `kubernetes.io/*` signers, once it passes its signer's checks; one that
//! does not gets the Failed condition (SignerValidationFailure) instead.
//! Which CA signs, as k3s configures upstream's controller manager: the
//! client CA, which the API server trusts for client certificates, for
//! `kube-apiserver-client` and `kube-apiserver-client-kubelet`; the server
//! CA, which the API server trusts for kubelets' serving certificates, for
//! `kubelet-serving` and `legacy-unknown`. The CA files are read at each
//! signing, so a rotated CA signs from then on. A certificate lives for the
//! signing duration (a year), or `spec.expirationSeconds` when shorter
//! (ten minutes at least), backdated five minutes, and never beyond its CA.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};

use super::{has_true_condition, is_approved, is_issued, request};
use crate::controllers::informers::{self, Informer};
use crate::controllers::ControllerError;
use crate::pki::csr::{CertificateRequest, Grant};
use crate::pki::Ca;

/// A CA's certificate and key files.
#[derive(Debug, Clone)]
pub struct CaFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What the signers sign with (upstream's `--cluster-signing-*-file`) and
/// the longest a certificate lives (`--cluster-signing-duration`).
#[derive(Debug, Clone)]
pub struct SigningConfig {
    pub client_ca: CaFiles,
    pub server_ca: CaFiles,
    pub duration: Duration,
}

/// Upstream's default `--cluster-signing-duration`.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back a certificate starts, for clocks slightly behind ours.
const BACKDATE: i64 = 5 * 60;
/// Shorter lives are not shortened by the backdating.
const SHORT: i64 = 8 * 3600;
/// The shortest life a request may ask for.
const MINIMUM: i64 = 10 * 60;

struct Context {
    client: kube::Client,
    config: Arc<SigningConfig>,
}

pub async fn run(client: kube::Client, csrs: Informer<CertificateSigningRequest>, config: Arc<SigningConfig>) {
    let (store, events) = csrs.trigger_self();
    informers::run("csrsigning", store, vec![events], reconcile, Arc::new(Context { client, config })).await;
}

/// The CA of a signer, and the checks its requests must pass; None for
/// signers this controller does not sign for.
type Check = fn(&CertificateRequest, &[String]) -> Result<(), super::Refused>;

fn signer(config: &SigningConfig, name: &str) -> Option<(CaFiles, Check)> {
    Some(match name {
        super::KUBE_APISERVER_CLIENT => {
            (config.client_ca.clone(), |_, usages| super::validate_kube_apiserver_client(usages))
        }
        super::KUBE_APISERVER_CLIENT_KUBELET => (config.client_ca.clone(), super::validate_kubelet_client),
        super::KUBELET_SERVING => (config.server_ca.clone(), super::validate_kubelet_serving),
        // No restrictions, to stay compatible with what v1beta1 signed.
        super::LEGACY_UNKNOWN => (config.server_ca.clone(), |_, _| Ok(())),
        _ => return None,
    })
}

/// How long the certificate lives: the signing duration, or what the
/// request asks when shorter, but no less than the minimum.
fn lifetime(max: Duration, expiration_seconds: Option<i32>) -> i64 {
    let max = i64::try_from(max.as_secs()).unwrap_or(i64::MAX);
    match expiration_seconds {
        None => max,
        Some(asked) if i64::from(asked) > max => max,
        Some(asked) => i64::from(asked).max(MINIMUM),
    }
}

/// Upstream's permissive policy: backdated, not shortened for short
/// lives, and ending with the CA at the latest.
fn grant(usages: &[String], ttl: i64, now: i64, ca_not_after: i64) -> Result<Grant, ControllerError> {
    let not_before = now - BACKDATE;
    let mut not_after = if ttl < SHORT { now + ttl } else { now + ttl - BACKDATE };
    if not_after >= ca_not_after {
        not_after = ca_not_after;
    }
    if not_before >= ca_not_after || now >= ca_not_after {
        return Err(ControllerError::Invalid(format!(
            "refusing to sign a certificate that expired in the past: the signer expired at {ca_not_after}"
        )));
    }
    Ok(Grant { usages: usages.to_vec(), not_before, not_after })
}

fn load(files: &CaFiles) -> Result<Ca, ControllerError> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|e| ControllerError::Invalid(format!("cannot read {}: {e}", p.display())))
    };
    Ca::load(read(&files.cert)?, read(&files.key)?)
        .map_err(|e| ControllerError::Invalid(format!("the CA {}: {e}", files.cert.display())))
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if is_issued(&csr) || !is_approved(&csr) || has_true_condition(&csr, "Failed") {
        return Ok(Action::await_change());
    }
    let Some((ca_files, check)) = signer(&ctx.config, &csr.spec.signer_name) else {
        return Ok(Action::await_change());
    };
    let name = csr.metadata.name.clone().unwrap_or_default();
    let req = request(&csr).map_err(|e| ControllerError::Invalid(format!("unable to parse csr {name:?}: {e}")))?;
    let usages = csr.spec.usages.clone().unwrap_or_default();
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let mut updated = (*csr).clone();
    let status = updated.status.get_or_insert_with(Default::default);
    if let Err(why) = check(&req, &usages) {
        tracing::debug!(csr = %name, reason = %why, "the request fails its signer's checks");
        status.conditions.get_or_insert_with(Vec::new).push(CertificateSigningRequestCondition {
            type_: "Failed".into(),
            status: "True".into(),
            reason: Some("SignerValidationFailure".into()),
            message: Some(why.to_string()),
            last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        });
        csrs.replace_status(&name, &PostParams::default(), &updated).await?;
        return Ok(Action::await_change());
    }
    let ca = load(&ca_files)?;
    let ca_not_after = ca.not_after().map_err(|e| ControllerError::Invalid(e.to_string()))?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let ttl = lifetime(ctx.config.duration, csr.spec.expiration_seconds);
    let grant = grant(&usages, ttl, now, ca_not_after)?;
    let pem = ca
        .sign_certificate_request(&req, &grant)
        .map_err(|e| ControllerError::Invalid(format!("error auto signing csr {name:?}: {e}")))?;
    status.certificate = Some(ByteString(pem.into_bytes()));
    csrs.replace_status(&name, &PostParams::default(), &updated).await?;
    tracing::debug!(csr = %name, signer = %csr.spec.signer_name, "issued a certificate");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_follow_the_request_within_bounds() {
        assert_eq!(lifetime(DEFAULT_DURATION, None), 365 * 24 * 3600);
        assert_eq!(lifetime(DEFAULT_DURATION, Some(3600)), 3600);
        assert_eq!(lifetime(DEFAULT_DURATION, Some(60)), 600);
        assert_eq!(lifetime(Duration::from_secs(7200), Some(86400)), 7200);
    }

    #[test]
    fn grants_are_backdated_and_end_with_the_ca() {
        let none = Vec::new();
        let short = grant(&none, 3600, 10_000, 1_000_000).unwrap();
        assert_eq!((short.not_before, short.not_after), (10_000 - 300, 10_000 + 3600));
        let long = grant(&none, 86_400, 10_000, 1_000_000).unwrap();
        assert_eq!(long.not_after, 10_000 + 86_400 - 300);
        let capped = grant(&none, 86_400 * 365, 10_000, 20_000).unwrap();
        assert_eq!(capped.not_after, 20_000);
        assert!(grant(&none, 3600, 30_000, 20_000).is_err());
    }
}
