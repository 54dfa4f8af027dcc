//! LegacySATokenCleaner (legacy-serviceaccount-token-cleaner): once a day,
//! as upstream's, it marks and then deletes the legacy token Secrets of
//! service accounts that nobody uses any more. A token Secret listed in its
//! account's `secrets` (an auto-generated token), older than the clean-up
//! period (a year, upstream's default), not used for that period (its
//! `kubernetes.io/legacy-token-last-used` date, none meaning not since the
//! API server began recording, `kube-apiserver-legacy-service-account-
//! token-tracking`) and mounted by no pod is labelled
//! `kubernetes.io/legacy-token-invalid-since` with today's date (the API
//! server then refuses it); one labelled so a period ago is deleted. Nothing
//! is done before the API server has recorded uses for a whole period.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::json;

use super::informers::wait_synced;
use super::serviceaccount_token::{NAME_ANNOTATION, SECRET_TYPE, UID_ANNOTATION};
use crate::client::informer_factory::SharedInformerFactory;
use crate::pki::service_account_key::{date_of, INVALID_SINCE_LABEL, LAST_USED_LABEL};

/// Where the API server says since when it records uses.
const TRACKING: &str = "kube-apiserver-legacy-service-account-token-tracking";

/// Upstream's default `--legacy-service-account-token-clean-up-period`.
pub const CLEAN_UP_PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);
const SYNC_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// What to do with a token Secret.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Label it invalid since this date.
    Invalidate(String),
    Delete,
}

/// Unix time of midnight UTC starting a `YYYY-MM-DD` date.
fn parse_date(date: &str) -> Option<i64> {
    let mut parts = date.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let month = time::Month::try_from(m.parse::<u8>().ok()?).ok()?;
    let day = time::Date::from_calendar_date(y.parse().ok()?, month, d.parse().ok()?).ok()?;
    Some(day.midnight().assume_utc().unix_timestamp())
}

fn label<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Upstream's rules for one Secret at `now`, given its account (when it
/// exists with the uid the Secret names) and whether a pod mounts it.
pub fn decide(
    secret: &Secret,
    account: Option<&ServiceAccount>,
    mounted: bool,
    now: i64,
    period: i64,
) -> Option<Decision> {
    if secret.type_.as_deref() != Some(SECRET_TYPE) || secret.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let created = secret.metadata.creation_timestamp.as_ref()?.0.as_second();
    if created >= now - period {
        return None;
    }
    let preserve_used_on_or_after = date_of(now - period);
    if let Some(last_used) = label(secret, LAST_USED_LABEL) {
        if parse_date(last_used).is_none() || *last_used >= *preserve_used_on_or_after {
            return None;
        }
    }
    let name = secret.metadata.name.as_deref()?;
    let listed = account?.secrets.iter().flatten().any(|r| r.name.as_deref() == Some(name));
    if !listed || mounted {
        return None;
    }
    match label(secret, INVALID_SINCE_LABEL).filter(|d| parse_date(d).is_some()) {
        None => Some(Decision::Invalidate(date_of(now))),
        Some(since) if *since < *preserve_used_on_or_after => Some(Decision::Delete),
        Some(_) => None,
    }
}

/// The Secrets a pod mounts or otherwise names (upstream's
/// `VisitPodSecretNames`).
fn pod_secret_names(pod: &Pod, names: &mut HashSet<String>) {
    let Some(spec) = pod.spec.as_ref() else { return };
    let mut add = |n: Option<&String>| {
        if let Some(n) = n.filter(|n| !n.is_empty()) {
            names.insert(n.clone());
        }
    };
    for s in spec.image_pull_secrets.iter().flatten() {
        add(Some(&s.name));
    }
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let envs = containers
        .map(|c| (c.env.as_deref(), c.env_from.as_deref()))
        .chain(spec.ephemeral_containers.iter().flatten().map(|c| (c.env.as_deref(), c.env_from.as_deref())));
    for (env, env_from) in envs {
        for e in env.unwrap_or_default() {
            add(e.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).map(|r| &r.name));
        }
        for e in env_from.unwrap_or_default() {
            add(e.secret_ref.as_ref().map(|r| &r.name));
        }
    }
    for v in spec.volumes.iter().flatten() {
        add(v.secret.as_ref().and_then(|s| s.secret_name.as_ref()));
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            add(source.secret.as_ref().map(|s| &s.name));
        }
        add(v.azure_file.as_ref().map(|a| &a.secret_name));
        add(v.cephfs.as_ref().and_then(|c| c.secret_ref.as_ref()).map(|r| &r.name));
        add(v.cinder.as_ref().and_then(|c| c.secret_ref.as_ref()).map(|r| &r.name));
        add(v.flex_volume.as_ref().and_then(|f| f.secret_ref.as_ref()).map(|r| &r.name));
        add(v.iscsi.as_ref().and_then(|i| i.secret_ref.as_ref()).map(|r| &r.name));
        add(v.rbd.as_ref().and_then(|r| r.secret_ref.as_ref()).map(|r| &r.name));
        add(v.scale_io.as_ref().map(|s| &s.secret_ref.name));
        add(v.storageos.as_ref().and_then(|s| s.secret_ref.as_ref()).map(|r| &r.name));
        add(v.csi.as_ref().and_then(|c| c.node_publish_secret_ref.as_ref()).map(|r| &r.name));
    }
}

/// The account a Secret names, when it exists with the uid it names.
fn account_of(accounts: &Store<ServiceAccount>, secret: &Secret) -> Option<std::sync::Arc<ServiceAccount>> {
    let annotations = secret.metadata.annotations.as_ref()?;
    let name = annotations.get(NAME_ANNOTATION).filter(|n| !n.is_empty())?;
    let ns = secret.metadata.namespace.as_deref().unwrap_or_default();
    let sa = accounts.get(&ObjectRef::new(name).within(ns))?;
    match annotations.get(UID_ANNOTATION).filter(|u| !u.is_empty()) {
        Some(uid) if sa.metadata.uid.as_ref() != Some(uid) => None,
        _ => Some(sa),
    }
}

/// `client` is the controller's own; `pods` the shared pod cache.
pub async fn run(client: kube::Client, informers: SharedInformerFactory, pods: Store<Pod>) {
    let tokens = watcher::Config::default().fields(&format!("type={SECRET_TYPE}"));
    let secrets = informers.informer_with::<Secret>(tokens).store();
    let accounts = informers.informer::<ServiceAccount>().store();
    if wait_synced(&secrets).await.is_err()
        || wait_synced(&accounts).await.is_err()
        || wait_synced(&pods).await.is_err()
    {
        return;
    }
    loop {
        evaluate(&client, &secrets, &accounts, &pods).await;
        tokio::time::sleep(SYNC_INTERVAL).await;
    }
}

async fn evaluate(client: &kube::Client, secrets: &Store<Secret>, accounts: &Store<ServiceAccount>, pods: &Store<Pod>) {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let period = i64::try_from(CLEAN_UP_PERIOD.as_secs()).unwrap_or(i64::MAX);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let since = match maps.get_opt(TRACKING).await {
        Ok(cm) => cm.and_then(|cm| cm.data?.get("since").and_then(|d| parse_date(d))),
        Err(e) => {
            tracing::warn!(error = %e, "legacy token cleaner: cannot read since when uses are recorded");
            return;
        }
    };
    // The day after the date, as upstream counts it.
    let Some(tracked_since) = since.map(|s| s + 86_400) else { return };
    if now < tracked_since + period {
        return;
    }
    let mut mounted: HashMap<String, HashSet<String>> = HashMap::new();
    for secret in secrets.state() {
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let names = mounted.entry(ns.clone()).or_insert_with(|| {
            let mut names = HashSet::new();
            for pod in pods.state().iter().filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str())) {
                pod_secret_names(pod, &mut names);
            }
            names
        });
        let name = secret.metadata.name.clone().unwrap_or_default();
        let account = account_of(accounts, &secret);
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        match decide(&secret, account.as_deref(), names.contains(&name), now, period) {
            None => {}
            Some(Decision::Invalidate(date)) => {
                tracing::info!(namespace = %ns, secret = %name, invalid_since = %date, "marking an unused legacy service account token invalid");
                let patch = json!({"metadata": {"uid": secret.metadata.uid, "labels": {INVALID_SINCE_LABEL: date}}});
                if let Err(e) = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    tracing::warn!(namespace = %ns, secret = %name, error = %e, "cannot label a legacy token invalid");
                }
            }
            Some(Decision::Delete) => {
                tracing::info!(namespace = %ns, secret = %name, "deleting an unused legacy service account token");
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: None,
                        resource_version: secret.metadata.resource_version.clone(),
                    }),
                    ..Default::default()
                };
                match api.delete(&name, &params).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => {
                        tracing::warn!(namespace = %ns, secret = %name, error = %e, "cannot delete a legacy token")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    const DAY: i64 = 86_400;
    const YEAR: i64 = 365 * DAY;

    fn secret(created: i64, labels: &[(&str, &str)]) -> Secret {
        let mut s = Secret { type_: Some(SECRET_TYPE.into()), ..Default::default() };
        s.metadata.name = Some("sa-token".into());
        s.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        s.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        s
    }

    fn account(listing: &[&str]) -> ServiceAccount {
        ServiceAccount {
            secrets: Some(
                listing.iter().map(|n| ObjectReference { name: Some(n.to_string()), ..Default::default() }).collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn unused_listed_tokens_are_marked_then_deleted() {
        let now = 10 * YEAR;
        let old = now - 2 * YEAR;
        let sa = account(&["sa-token"]);
        assert_eq!(decide(&secret(old, &[]), Some(&sa), false, now, YEAR), Some(Decision::Invalidate(date_of(now))));
        // Marked a day ago: kept for the period.
        let marked = secret(old, &[(INVALID_SINCE_LABEL, &date_of(now - DAY))]);
        assert_eq!(decide(&marked, Some(&sa), false, now, YEAR), None);
        let long_ago = secret(old, &[(INVALID_SINCE_LABEL, &date_of(now - YEAR - 2 * DAY))]);
        assert_eq!(decide(&long_ago, Some(&sa), false, now, YEAR), Some(Decision::Delete));
    }

    #[test]
    fn used_young_mounted_or_unlisted_tokens_stay() {
        let now = 10 * YEAR;
        let old = now - 2 * YEAR;
        let sa = account(&["sa-token"]);
        let used = secret(old, &[(LAST_USED_LABEL, &date_of(now - 10 * DAY))]);
        assert_eq!(decide(&used, Some(&sa), false, now, YEAR), None);
        assert_eq!(decide(&secret(now - DAY, &[]), Some(&sa), false, now, YEAR), None);
        assert_eq!(decide(&secret(old, &[]), Some(&sa), true, now, YEAR), None);
        assert_eq!(decide(&secret(old, &[]), Some(&account(&[])), false, now, YEAR), None);
        assert_eq!(decide(&secret(old, &[]), None, false, now, YEAR), None);
        let garbled = secret(old, &[(LAST_USED_LABEL, "soon")]);
        assert_eq!(decide(&garbled, Some(&sa), false, now, YEAR), None);
    }

    #[test]
    fn dates() {
        assert_eq!(parse_date("1970-01-02"), Some(DAY));
        assert_eq!(date_of(DAY), "1970-01-02");
        assert_eq!(parse_date("1970-1-02"), None);
    }
}
