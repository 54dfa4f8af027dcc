//! `kube-public/cluster-info`, as kubeadm publishes it: a kubeconfig that
//! names the cluster's server and the CA to trust it by, with no user, so
//! that a node holding a bootstrap token can check both against the
//! bootstrap signer's signature of it (`jws-kubeconfig-<token id>`) before
//! it trusts the server. Written at each start of each server, with the
//! server's own address and current CA bundle; the signatures already
//! there are left to the bootstrap signer, which signs the new content.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::controllers::bootstrap_signer::{CONFIG_MAP, KUBECONFIG_KEY, NAMESPACE};

/// The kubeconfig kubeadm writes there (clientcmd's serialization of a
/// config with one unnamed cluster).
pub fn kubeconfig(server: &str, ca_pem: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: \"\"\n\
         contexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {{}}\nusers: null\n"
    )
}

/// Creates the ConfigMap, or brings its kubeconfig up to date.
pub async fn publish(client: kube::Client, server: &str, ca_pem: &str) -> Result<(), kube::Error> {
    let maps: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let content = kubeconfig(server, ca_pem);
    for _ in 0..5 {
        let result = match maps.get_opt(CONFIG_MAP).await? {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta { name: Some(CONFIG_MAP.into()), ..Default::default() },
                    data: Some(BTreeMap::from([(KUBECONFIG_KEY.to_string(), content.clone())])),
                    ..Default::default()
                };
                maps.create(&PostParams::default(), &cm).await.map(drop)
            }
            Some(cm) if cm.data.as_ref().and_then(|d| d.get(KUBECONFIG_KEY)) == Some(&content) => return Ok(()),
            Some(mut cm) => {
                cm.data.get_or_insert_with(BTreeMap::new).insert(KUBECONFIG_KEY.into(), content.clone());
                maps.replace(CONFIG_MAP, &PostParams::default(), &cm).await.map(drop)
            }
        };
        match result {
            // Another server wrote it meanwhile: look again.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            other => return other,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kubeconfig_without_users() {
        let k = super::kubeconfig("https://10.0.0.1:6443", "PEM");
        assert!(k.contains("    server: https://10.0.0.1:6443\n"));
        assert!(k.contains("certificate-authority-data: UEVN\n"));
        assert!(k.ends_with("users: null\n"));
    }
}
