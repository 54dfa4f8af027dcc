//! RootCACertPublisher: every active namespace has the ConfigMap
//! `kube-root-ca.crt` holding the cluster's serving CA, kept current.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::ControllerError;

const NAME: &str = "kube-root-ca.crt";

struct Context {
    client: kube::Client,
    ca: Arc<String>,
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if ns.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = ns.metadata.name.clone().unwrap_or_default();
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &name);
    let want: BTreeMap<String, String> = [("ca.crt".to_string(), ctx.ca.to_string())].into_iter().collect();
    if let Some(current) = maps.get_opt(NAME).await? {
        if current.data.as_ref() == Some(&want) {
            return Ok(Action::await_change());
        }
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            annotations: Some([("kubernetes.io/description".to_string(), "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.".to_string())].into_iter().collect()),
            ..Default::default()
        },
        data: Some(want),
        ..Default::default()
    };
    match maps.patch(NAME, &PatchParams::apply("root-ca-cert-publisher").force(), &Patch::Apply(&cm)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

fn error_policy(_ns: Arc<Namespace>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "root CA publisher reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

pub async fn run(client: kube::Client, ca: Arc<String>) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let maps: Api<ConfigMap> = Api::all(client.clone());
    Controller::new(namespaces, watcher::Config::default())
        .watches(maps, watcher::Config::default().fields(&format!("metadata.name={NAME}")), |cm: ConfigMap| {
            cm.metadata.namespace.map(|ns| ObjectRef::<Namespace>::new(&ns))
        })
        .run(reconcile, error_policy, Arc::new(Context { client, ca }))
        .for_each(|_| std::future::ready(()))
        .await;
}
