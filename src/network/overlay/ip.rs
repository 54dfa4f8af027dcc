//! The kernel's routing state through iproute2 (`ip` and `bridge`, JSON
//! output): running a change, reading routes, neighbours and forwarding
//! entries, and finding the interface that carries the overlay.

use std::net::Ipv4Addr;

use serde_json::Value;

use super::plan::{Fdb, KernelRoute, KernelState, Neighbour};
use super::OverlayError;

/// Runs `ip` or `bridge` with `args`; its stdout.
pub async fn run(cmd: &str, args: &[&str]) -> Result<String, OverlayError> {
    let bin = crate::host::find_binary(cmd).ok_or(OverlayError::Missing(cmd.to_string()))?;
    let failed = |message: String| OverlayError::Command { command: format!("{cmd} {}", args.join(" ")), message };
    let out = tokio::process::Command::new(bin).args(args).output().await.map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip …`.
pub async fn ip(args: &[&str]) -> Result<String, OverlayError> {
    run("ip", args).await
}

/// Like `run`, but an entry that is already gone is not an error.
async fn delete(cmd: &str, args: &[&str]) -> Result<(), OverlayError> {
    match run(cmd, args).await {
        Err(OverlayError::Command { message, .. })
            if message.contains("No such process")
                || message.contains("No such file or directory")
                || message.contains("Cannot find device") =>
        {
            Ok(())
        }
        other => other.map(|_| ()),
    }
}

/// `ip … del …`, tolerating what is already gone.
pub async fn ip_delete(args: &[&str]) -> Result<(), OverlayError> {
    delete("ip", args).await
}

/// `bridge … del …`, tolerating what is already gone.
pub async fn bridge_delete(args: &[&str]) -> Result<(), OverlayError> {
    delete("bridge", args).await
}

/// The IPv4 addresses (`a.b.c.d/n`) on `dev` other than `keep`.
pub async fn other_ipv4_addrs(dev: &str, keep: &str) -> Result<Vec<String>, OverlayError> {
    let links = json("ip", &["-j", "-4", "addr", "show", "dev", dev]).await?;
    Ok(links
        .iter()
        .filter_map(|l| l.get("addr_info")?.as_array())
        .flatten()
        .filter_map(|a| Some(format!("{}/{}", str_of(a, "local")?, a.get("prefixlen")?)))
        .filter(|have| have != keep)
        .collect())
}

async fn json(cmd: &str, args: &[&str]) -> Result<Vec<Value>, OverlayError> {
    let out = run(cmd, args).await?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    let bad = |e: serde_json::Error| OverlayError::Command {
        command: format!("{cmd} {}", args.join(" ")),
        message: e.to_string(),
    };
    serde_json::from_str(&out).map_err(bad)
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// `ip -j route` output (`default` is 0.0.0.0/0).
pub fn parse_routes(entries: &[Value]) -> Vec<KernelRoute> {
    entries
        .iter()
        .filter_map(|r| {
            let dst = match str_of(r, "dst")? {
                "default" => "0.0.0.0/0".to_string(),
                d if d.contains('/') => d.to_string(),
                d => format!("{d}/32"),
            };
            Some(KernelRoute {
                // The overlay's routes are podCIDRs: host routes (/31, /32) never are.
                dst: crate::net::parse_pod_cidr(&dst).ok()?,
                via: str_of(r, "gateway").and_then(|g| g.parse().ok()),
                dev: str_of(r, "dev").unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// What the kernel holds that the overlay may own: the main table's IPv4
/// routes, and the neighbours and forwarding entries on `device` (none
/// when it does not exist).
pub async fn kernel_state(device: Option<&str>) -> Result<KernelState, OverlayError> {
    let routes = parse_routes(&json("ip", &["-j", "-4", "route", "show", "table", "main"]).await?);
    let mut state = KernelState { routes, ..Default::default() };
    let Some(dev) = device else { return Ok(state) };
    if !link_exists(dev).await {
        return Ok(state);
    }
    for n in json("ip", &["-j", "-4", "neigh", "show", "dev", dev]).await? {
        let (Some(ip), Some(mac)) = (str_of(&n, "dst").and_then(|d| d.parse().ok()), str_of(&n, "lladdr")) else {
            continue;
        };
        state.neighbours.push(Neighbour { ip, mac: mac.to_string() });
    }
    for f in json("bridge", &["-j", "fdb", "show", "dev", dev]).await? {
        let (Some(mac), Some(dst)) = (str_of(&f, "mac"), str_of(&f, "dst").and_then(|d| d.parse::<Ipv4Addr>().ok()))
        else {
            continue;
        };
        state.fdb.push(Fdb { mac: mac.to_string(), dst });
    }
    Ok(state)
}

pub async fn link_exists(dev: &str) -> bool {
    ip(&["link", "show", "dev", dev]).await.is_ok()
}

/// `ip -j -d link show dev` of one link.
pub async fn link_details(dev: &str) -> Result<Option<Value>, OverlayError> {
    if !link_exists(dev).await {
        return Ok(None);
    }
    Ok(json("ip", &["-j", "-d", "link", "show", "dev", dev]).await?.into_iter().next())
}

/// The interface that carries the overlay and the address peers reach it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay {
    pub interface: String,
    pub address: Ipv4Addr,
    pub mtu: u32,
}

/// Picks the underlay in `ip -j -4 addr` output: the interface named
/// `iface` (its first IPv4 address), else the one holding `node_ip`.
pub fn pick_underlay(links: &[Value], iface: Option<&str>, node_ip: Option<Ipv4Addr>) -> Option<Underlay> {
    links.iter().find_map(|l| {
        let name = str_of(l, "ifname")?;
        let mtu = l.get("mtu").and_then(Value::as_u64)? as u32;
        let addrs: Vec<Ipv4Addr> = l
            .get("addr_info")?
            .as_array()?
            .iter()
            .filter(|a| str_of(a, "family") == Some("inet"))
            .filter_map(|a| str_of(a, "local")?.parse().ok())
            .collect();
        let address = match iface {
            Some(want) if want == name => *addrs.first()?,
            Some(_) => return None,
            None => *addrs.iter().find(|a| Some(**a) == node_ip)?,
        };
        Some(Underlay { interface: name.to_string(), address, mtu })
    })
}

pub async fn underlay(iface: Option<&str>, node_ip: Option<Ipv4Addr>) -> Result<Underlay, OverlayError> {
    let links = json("ip", &["-j", "-4", "addr", "show"]).await?;
    pick_underlay(&links, iface, node_ip).ok_or_else(|| match iface {
        Some(i) => OverlayError::NoUnderlay(format!("--flannel-iface {i}: no such interface with an IPv4 address")),
        None => OverlayError::NoUnderlay(format!(
            "no interface holds the node's InternalIP {}; pick one with --flannel-iface",
            node_ip.map(|i| i.to_string()).unwrap_or_else(|| "(none is IPv4)".into())
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_with_default_and_host_routes() {
        let v: Vec<Value> = serde_json::from_str(
            r#"[{"dst":"default","gateway":"10.9.0.1","dev":"d0","flags":[]},
                {"dst":"10.9.0.0/24","dev":"d0","protocol":"kernel","scope":"link","prefsrc":"10.9.0.2","flags":[]},
                {"dst":"10.42.5.0/24","gateway":"10.42.5.0","dev":"ferrok.1","flags":["onlink"]},
                {"dst":"10.42.6.7","gateway":"10.9.0.9","dev":"d0","flags":[]}]"#,
        )
        .unwrap();
        let r = parse_routes(&v);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].dst.prefix_len(), 0);
        assert_eq!(r[2].via, Some("10.42.5.0".parse().unwrap()));
        assert_eq!(r[2].dev, "ferrok.1");
    }

    #[test]
    fn underlay_by_name_or_by_node_ip() {
        let v: Vec<Value> = serde_json::from_str(
            r#"[{"ifname":"lo","mtu":65536,"addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
                {"ifname":"eth0","mtu":9000,"addr_info":[{"family":"inet","local":"192.168.1.5","prefixlen":24},
                                                        {"family":"inet","local":"192.168.2.5","prefixlen":24}]},
                {"ifname":"wg0","mtu":1420,"addr_info":[{"family":"inet","local":"10.8.0.5","prefixlen":24}]}]"#,
        )
        .unwrap();
        let u = pick_underlay(&v, None, Some("192.168.2.5".parse().unwrap())).unwrap();
        assert_eq!(u, Underlay { interface: "eth0".into(), address: "192.168.2.5".parse().unwrap(), mtu: 9000 });
        let u = pick_underlay(&v, Some("wg0"), Some("192.168.2.5".parse().unwrap())).unwrap();
        assert_eq!((u.interface.as_str(), u.mtu), ("wg0", 1420));
        assert_eq!(pick_underlay(&v, Some("eth9"), None), None);
        assert_eq!(pick_underlay(&v, None, Some("10.1.1.1".parse().unwrap())), None);
    }
}
