//! Network addresses every layer shares, as upstream keeps them in
//! `k8s.io/utils/net`. The CIDR type is `ipnet`'s, of both families
//! (`IpNet`, and `Ipv4Net`/`Ipv6Net` where only one family is meant);
//! here is only what ipnet lacks: parsing the way ferrok's flags and
//! objects are read (std's address syntax, a decimal prefix, the host bits
//! cleared), the limits callers check, and the n-th address of a network.
//!
//! Parse CIDRs with these functions, not with ipnet's `FromStr`, which
//! keeps the host bits (`10.42.3.7/24` stays unequal to `10.42.3.0/24`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;

pub use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why a CIDR does not parse; each message names the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("invalid CIDR {0:?}")]
    Invalid(String),
    #[error("{0:?} is not a CIDR like 10.43.0.0/16")]
    NoPrefix(String),
    #[error("{0:?} is not an IPv4 CIDR")]
    NotIpv4(String),
    #[error("{cidr:?}: the prefix must be between /{min} and /{max}")]
    PrefixLength { cidr: String, min: u8, max: u8 },
}

/// The prefixes of a node's podCIDR: a network with room for a gateway
/// and an address (up to /30).
pub const POD_CIDR_PREFIXES: RangeInclusive<u8> = 0..=30;

/// The prefixes of a cluster-wide IPv4 range: `--cluster-cidr`,
/// `--service-cidr` and the ServiceCIDRs Services are allocated from.
pub const CLUSTER_RANGE_PREFIXES: RangeInclusive<u8> = 8..=30;

/// `address/prefix` of either family with the address as written (an
/// interface's address, or a network whose host bits the caller checks).
pub fn parse_as_written(s: &str) -> Result<IpNet, CidrError> {
    let (addr, prefix) = s.split_once('/').ok_or_else(|| CidrError::NoPrefix(s.to_string()))?;
    let addr: IpAddr = addr.parse().map_err(|_| CidrError::Invalid(s.to_string()))?;
    let max = match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    let bad_prefix = || CidrError::PrefixLength { cidr: s.to_string(), min: 0, max };
    let prefix: u8 = prefix.parse().map_err(|_| bad_prefix())?;
    IpNet::new(addr, prefix).map_err(|_| bad_prefix())
}

/// `address/prefix` of either family, any prefix the family allows, as
/// its network: `10.42.3.7/24` is `10.42.3.0/24`, `fd00::1/64` is `fd00::/64`.
pub fn parse(s: &str) -> Result<IpNet, CidrError> {
    parse_as_written(s).map(|n| n.trunc())
}

/// An IPv4 network whose prefix lies in `prefixes`, as its network
/// address. The errors say which part is wrong, in that order: no
/// prefix, an address that is not IPv4 (IPv6 or junk), the prefix.
pub fn parse_v4(s: &str, prefixes: RangeInclusive<u8>) -> Result<Ipv4Net, CidrError> {
    let (addr, prefix) = s.split_once('/').ok_or_else(|| CidrError::NoPrefix(s.to_string()))?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| CidrError::NotIpv4(s.to_string()))?;
    let bad_prefix = || CidrError::PrefixLength { cidr: s.to_string(), min: *prefixes.start(), max: *prefixes.end() };
    let prefix: u8 = prefix.parse().ok().filter(|p| prefixes.contains(p)).ok_or_else(bad_prefix)?;
    Ipv4Net::new(addr, prefix).map(|n| n.trunc()).map_err(|_| bad_prefix())
}

/// A node's IPv4 podCIDR (up to /30, see [`POD_CIDR_PREFIXES`]); any
/// fault is `invalid CIDR "…"`.
pub fn parse_pod_cidr(s: &str) -> Result<Ipv4Net, CidrError> {
    parse_v4(s, POD_CIDR_PREFIXES).map_err(|_| CidrError::Invalid(s.to_string()))
}

/// A cluster-wide IPv4 range (see [`CLUSTER_RANGE_PREFIXES`]), with
/// [`parse_v4`]'s messages.
pub fn parse_cluster_range(s: &str) -> Result<Ipv4Net, CidrError> {
    parse_v4(s, CLUSTER_RANGE_PREFIXES)
}

/// The n-th address of a network: 0 is the network address, 1 the
/// gateway (or the first Service address). An `n` past the network's end
/// gives an address outside it (callers keep `n` within the size), and
/// stops at the end of the address space.
pub trait NthAddr {
    type Addr;
    type Offset;
    fn nth(&self, n: Self::Offset) -> Self::Addr;
}

impl NthAddr for Ipv4Net {
    type Addr = Ipv4Addr;
    type Offset = u32;
    fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from_bits(self.network().to_bits().saturating_add(n))
    }
}

impl NthAddr for Ipv6Net {
    type Addr = Ipv6Addr;
    type Offset = u128;
    fn nth(&self, n: u128) -> Ipv6Addr {
        Ipv6Addr::from_bits(self.network().to_bits().saturating_add(n))
    }
}

impl NthAddr for IpNet {
    type Addr = IpAddr;
    type Offset = u128;
    fn nth(&self, n: u128) -> IpAddr {
        match self {
            IpNet::V4(v4) => IpAddr::V4(v4.nth(u32::try_from(n).unwrap_or(u32::MAX))),
            IpNet::V6(v6) => IpAddr::V6(v6.nth(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
        Ipv4Addr::new(a, b, c, d)
    }

    #[test]
    fn cidr_math() {
        let n = parse_pod_cidr("10.42.3.7/24").unwrap();
        assert_eq!(n.to_string(), "10.42.3.0/24");
        assert_eq!(n.nth(1), Ipv4Addr::new(10, 42, 3, 1));
        assert!(n.contains(&Ipv4Addr::new(10, 42, 3, 200)));
        assert!(!n.contains(&Ipv4Addr::new(10, 42, 4, 1)));
        assert!(parse_pod_cidr("10.42.0.0").is_err());
        assert!(parse_pod_cidr("10.42.0.0/33").is_err());
    }

    #[test]
    fn both_families_parse_to_their_network() {
        let n = parse("10.42.3.7/24").unwrap();
        assert_eq!(n, IpNet::V4(Ipv4Net::new(v4(10, 42, 3, 0), 24).unwrap()));
        assert_eq!(n.to_string(), "10.42.3.0/24");
        let n = parse("fd00::1:2/64").unwrap();
        assert_eq!(n.to_string(), "fd00::/64");
        assert!(matches!(n, IpNet::V6(_)));
        assert_eq!(parse("0.0.0.0/0").unwrap().to_string(), "0.0.0.0/0");
        assert_eq!(parse("10.1.2.3/32").unwrap().to_string(), "10.1.2.3/32");
        assert_eq!(parse("::/0").unwrap().to_string(), "::/0");
        assert_eq!(parse("fd00::1/128").unwrap().to_string(), "fd00::1/128");
        // As written, the host bits stay.
        assert_eq!(parse_as_written("10.42.3.7/24").unwrap().addr(), IpAddr::V4(v4(10, 42, 3, 7)));
    }

    #[test]
    fn contains_is_per_family() {
        let a = parse("10.42.0.0/16").unwrap();
        assert!(a.contains(&IpAddr::V4(v4(10, 42, 9, 9))));
        assert!(!a.contains(&IpAddr::V4(v4(10, 43, 0, 1))));
        assert!(a.contains(&parse("10.42.5.0/24").unwrap()));
        assert!(!a.contains(&parse("10.0.0.0/8").unwrap()));
        let b = parse("fd00:10::/48").unwrap();
        assert!(b.contains(&"fd00:10:0:ff::7".parse::<IpAddr>().unwrap()));
        assert!(!b.contains(&"fd00:11::1".parse::<IpAddr>().unwrap()));
        assert!(!b.contains(&IpAddr::V4(v4(10, 42, 0, 1))));
        assert!(!a.contains(&"fd00:10::1".parse::<IpAddr>().unwrap()));
    }

    #[test]
    fn nth_counts_from_the_network_address() {
        let n = parse_cluster_range("10.43.0.9/16").unwrap();
        assert_eq!(n.nth(0), v4(10, 43, 0, 0));
        assert_eq!(n.nth(10), v4(10, 43, 0, 10));
        assert_eq!(n.nth(256), v4(10, 43, 1, 0));
        assert_eq!(Ipv4Net::new(v4(255, 255, 255, 0), 24).unwrap().nth(u32::MAX), v4(255, 255, 255, 255));
        let n = parse("fd00:43::/112").unwrap();
        assert_eq!(n.nth(10), "fd00:43::a".parse::<IpAddr>().unwrap());
        assert_eq!(n.nth(0x1_0001), "fd00:43::1:1".parse::<IpAddr>().unwrap());
        assert_eq!(parse("10.42.1.0/24").unwrap().nth(1), IpAddr::V4(v4(10, 42, 1, 1)));
    }

    #[test]
    fn bad_input_names_its_fault() {
        assert_eq!(parse("10.42.0.0"), Err(CidrError::NoPrefix("10.42.0.0".into())));
        assert_eq!(parse("10.42.0/16"), Err(CidrError::Invalid("10.42.0/16".into())));
        assert_eq!(parse("nonsense/8"), Err(CidrError::Invalid("nonsense/8".into())));
        assert!(matches!(parse("10.42.0.0/33"), Err(CidrError::PrefixLength { max: 32, .. })));
        assert!(matches!(parse("fd00::/129"), Err(CidrError::PrefixLength { max: 128, .. })));
        assert!(matches!(parse("10.42.0.0/x"), Err(CidrError::PrefixLength { .. })));
        assert!(parse("").is_err() && parse("/").is_err() && parse("10.42.0.0/").is_err());
        // The cluster ranges' limits, with the flags' messages.
        let range = |s: &str| parse_cluster_range(s).map_err(|e| e.to_string());
        assert_eq!(range("10.43.0.0/16").unwrap().to_string(), "10.43.0.0/16");
        assert_eq!(range("10.43.0.0"), Err("\"10.43.0.0\" is not a CIDR like 10.43.0.0/16".into()));
        assert_eq!(range("fd00::/108"), Err("\"fd00::/108\" is not an IPv4 CIDR".into()));
        assert_eq!(range("fd00::/x"), Err("\"fd00::/x\" is not an IPv4 CIDR".into()));
        assert_eq!(range("10.0.0.0/7"), Err("\"10.0.0.0/7\": the prefix must be between /8 and /30".into()));
        assert_eq!(range("10.0.0.0/31"), Err("\"10.0.0.0/31\": the prefix must be between /8 and /30".into()));
        // A podCIDR needs a gateway and an address; IPv6 is refused, as junk is.
        assert!(parse_pod_cidr("10.42.0.0/30").is_ok());
        for bad in ["10.42.0.0/31", "10.42.0.4/32", "fd00::/64", "10.42.0.0", "x/24"] {
            assert_eq!(parse_pod_cidr(bad), Err(CidrError::Invalid(bad.into())), "{bad}");
            assert_eq!(parse_pod_cidr(bad).unwrap_err().to_string(), format!("invalid CIDR {bad:?}"));
        }
        // Any prefix IPv4 allows.
        assert_eq!(parse_v4("10.1.2.3/32", 0..=32).unwrap().to_string(), "10.1.2.3/32");
        assert!(matches!(parse_v4("10.1.2.3/33", 0..=40), Err(CidrError::PrefixLength { .. })));
    }
}
