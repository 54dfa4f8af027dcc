//! Several servers on one external datastore share one PKI, as k3s'
//! servers do: the first stores the cluster's bootstrap data (CAs, keys,
//! join token) sealed with the token; each next server with the same token
//! opens it and installs the files in its TLS folder before its PKI is
//! ensured, so its own serving certificate comes from the shared CA.

use std::path::Path;

use anyhow::Context;

use crate::pki::shared_pki::{storage_key, BootstrapData, BootstrapError, BOOTSTRAP_PREFIX};
use crate::store::{kv, Store};

/// Makes `tls_dir` hold the cluster's shared files, from the datastore or
/// (first server) stored there; returns the cluster's join token. With
/// `token` None, the token file's is used, else a new one is made.
pub async fn shared_pki(
    store: &dyn Store,
    tls_dir: &Path,
    token_file: &Path,
    token: Option<String>,
) -> anyhow::Result<String> {
    let token = match token {
        Some(t) => Some(t),
        None => match std::fs::read_to_string(token_file) {
            Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", token_file.display())),
        },
    };
    // Two rounds: a server that loses the race to store the data joins the winner's.
    for _ in 0..2 {
        let existing = kv::keys_under(store, BOOTSTRAP_PREFIX.as_bytes())
            .await
            .context("cannot read the bootstrap data from the datastore")?;
        if let Some(token) = &token {
            let key = storage_key(token);
            if let Some(sealed) = kv::get(store, key.as_bytes()).await.context("cannot read the bootstrap data")? {
                let data = BootstrapData::open(token, &sealed)?;
                data.check_token(token)?;
                data.install(tls_dir)?;
                tracing::info!("joined the cluster: installed its certificate authorities from the datastore");
                return Ok(data.token);
            }
        }
        if !existing.is_empty() {
            return Err(match token {
                Some(_) => BootstrapError::WrongToken.into(),
                None => anyhow::anyhow!(
                    "bootstrap data already exists in the datastore: give the cluster's --token to join it"
                ),
            });
        }
        let mut data = BootstrapData::from_dir_or_generate(tls_dir)?;
        data.token = token.clone().unwrap_or_else(|| data.new_token());
        let sealed = data.seal(&data.token)?;
        let key = storage_key(&data.token);
        if kv::create_first_under(store, BOOTSTRAP_PREFIX.as_bytes(), key.as_bytes(), sealed)
            .await
            .context("cannot store the bootstrap data")?
        {
            data.install(tls_dir)?;
            tracing::info!("stored the cluster's bootstrap data in the datastore");
            return Ok(data.token);
        }
        tracing::info!("another server stored the cluster's bootstrap data first: joining it");
    }
    anyhow::bail!("the bootstrap data in the datastore changed while this server started: start it again")
}
