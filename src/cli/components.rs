//! `--disable NAME`: the parts ferrok packages that can be turned off,
//! with k3s' names (repeatable and comma-separated). Each is really
//! stopped, and comes back when the flag is dropped at the next start.

use clap::ValueEnum;

/// A packaged part, by k3s' name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Component {
    /// The cluster DNS (ferrok's in-process server behind the `kube-dns` Service).
    Coredns,
    /// ServiceLB, which gives LoadBalancer Services the nodes' addresses.
    Servicelb,
    /// Accepted for k3s configs; ferrok ships no ingress controller.
    Traefik,
    /// The `local-path` StorageClass and its provisioner.
    LocalStorage,
    /// The `metrics.k8s.io` API (ferrok serves it without metrics-server).
    MetricsServer,
}

/// Which parts run.
#[derive(Debug, Clone, Copy)]
pub struct Enabled {
    pub dns: bool,
    pub servicelb: bool,
    pub local_storage: bool,
    pub metrics: bool,
}

impl Enabled {
    pub fn from_disabled(disabled: &[Component]) -> Enabled {
        if disabled.contains(&Component::Traefik) {
            tracing::info!("--disable traefik: ferrok ships no ingress controller; nothing to turn off");
        }
        let on = |c| !disabled.contains(&c);
        Enabled {
            dns: on(Component::Coredns),
            servicelb: on(Component::Servicelb),
            local_storage: on(Component::LocalStorage),
            metrics: on(Component::MetricsServer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3s_names() {
        let parse = |s| Component::from_str(s, false);
        assert_eq!(parse("local-storage"), Ok(Component::LocalStorage));
        assert_eq!(parse("metrics-server"), Ok(Component::MetricsServer));
        assert_eq!(parse("coredns"), Ok(Component::Coredns));
        assert!(parse("dns").is_err());
        let e = Enabled::from_disabled(&[Component::Servicelb, Component::Traefik]);
        assert!(e.dns && !e.servicelb && e.local_storage && e.metrics);
    }
}
