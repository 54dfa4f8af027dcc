//! The host's resolver configuration (resolv.conf), as the kubelet reads it
//! for pods that use the host's DNS and the cluster DNS reads it for its
//! upstream servers.

use std::path::Path;

/// A parsed resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    pub fn parse(text: &str) -> ResolvConf {
        let mut r = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("").trim();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => r.nameservers.extend(words.next().map(str::to_string)),
                Some("search") | Some("domain") => r.searches = words.map(str::to_string).collect(),
                Some("options") => r.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        r
    }

    /// The host's resolv.conf (`--resolv-conf`, else /etc/resolv.conf, or
    /// systemd-resolved's real one when /etc/resolv.conf is its 127.0.0.53 stub,
    /// which pods cannot reach).
    pub fn host(path: Option<&Path>) -> ResolvConf {
        if let Some(p) = path {
            return ResolvConf::parse(&std::fs::read_to_string(p).unwrap_or_default());
        }
        let main = ResolvConf::parse(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
        let stub = !main.nameservers.is_empty() && main.nameservers.iter().all(|n| n.starts_with("127."));
        if stub {
            if let Ok(text) = std::fs::read_to_string("/run/systemd/resolve/resolv.conf") {
                return ResolvConf::parse(&text);
            }
        }
        main
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_servers_searches_and_options() {
        let r = ResolvConf::parse(
            "# c\nnameserver 1.1.1.1\nnameserver 8.8.8.8 ; x\ndomain lan\nsearch a b\noptions ndots:2 edns0\n",
        );
        assert_eq!(r.nameservers, ["1.1.1.1", "8.8.8.8"]);
        assert_eq!(r.searches, ["a", "b"]);
        assert_eq!(r.options, ["ndots:2", "edns0"]);
    }
}
