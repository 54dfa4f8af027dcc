//! Network address types every layer shares, as upstream keeps them in
//! `k8s.io/utils/net`: today an IPv4 CIDR (a node's podCIDR, the cluster
//! and service CIDRs); IPv6 joins it here for dual-stack.

use std::net::Ipv4Addr;

#[derive(Debug, thiserror::Error)]
pub enum CidrError {
    #[error("invalid CIDR {0:?}")]
    Invalid(String),
}

/// An IPv4 network like `10.42.0.0/24` (prefixes up to /30: a network
/// with room for a gateway and an address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Ipv4Net {
    pub fn parse(s: &str) -> Result<Ipv4Net, CidrError> {
        let bad = || CidrError::Invalid(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 30).ok_or_else(bad)?;
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        Ok(Ipv4Net { addr: Ipv4Addr::from(u32::from(addr) & mask), prefix })
    }

    /// The n-th address of the network (1 is the gateway).
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) + n)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - self.prefix) };
        u32::from(ip) & mask == u32::from(self.addr)
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_math() {
        let n = Ipv4Net::parse("10.42.3.7/24").unwrap();
        assert_eq!(n.to_string(), "10.42.3.0/24");
        assert_eq!(n.nth(1), Ipv4Addr::new(10, 42, 3, 1));
        assert!(n.contains(Ipv4Addr::new(10, 42, 3, 200)));
        assert!(!n.contains(Ipv4Addr::new(10, 42, 4, 1)));
        assert!(Ipv4Net::parse("10.42.0.0").is_err());
        assert!(Ipv4Net::parse("10.42.0.0/33").is_err());
    }
}
