//! Names to addresses, and which addresses are off limits without a rule naming them.
//!
//! The resolver is a trait so tests can answer with any address (a private range, cloud
//! metadata) without a packet going there: the proxy refuses such answers before connecting.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use async_trait::async_trait;

#[async_trait]
pub trait Resolve: Send + Sync {
    /// The addresses to connect to for `host` on `port` (getaddrinfo's answer keeps the port).
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The host's resolver (getaddrinfo, through tokio).
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

/// A fixed table, for tests and for pinning a name.
#[derive(Default, Clone)]
pub struct StaticResolver(pub Vec<(String, Vec<IpAddr>)>);

#[async_trait]
impl Resolve for StaticResolver {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(host))
            .map(|(_, ips)| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}")))
    }
}

/// A name pinned to one address and port whatever port is asked: for tests, whose servers
/// listen on loopback ports of their own while the client names 443.
#[derive(Default, Clone)]
pub struct PinnedResolver(pub Vec<(String, SocketAddr)>);

#[async_trait]
impl Resolve for PinnedResolver {
    async fn resolve(&self, host: &str, _port: u16) -> io::Result<Vec<SocketAddr>> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(host))
            .map(|(_, addr)| vec![*addr])
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}")))
    }
}

/// Why an address needs a rule naming it, or `None` for an ordinary public address.
pub fn special(ip: IpAddr, own: &HashSet<IpAddr>) -> Option<&'static str> {
    let ip = super::matcher::canonical(ip);
    if own.contains(&ip) {
        return Some("one of this host's own addresses");
    }
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_private() {
        Some("a private address")
    } else if ip.is_link_local() {
        Some("a link-local address (cloud metadata lives there)")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("an unspecified address")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some("a shared (carrier-grade NAT) address")
    } else if ip.is_multicast() || ip.is_broadcast() || o[0] >= 240 {
        Some("a multicast or reserved address")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("an IETF protocol address")
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        Some("a benchmarking address")
    } else {
        None
    }
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_unspecified() {
        Some("an unspecified address")
    } else if (s[0] & 0xfe00) == 0xfc00 {
        Some("a private (unique local) address")
    } else if (s[0] & 0xffc0) == 0xfe80 {
        Some("a link-local address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if s[..6] == [0; 6] || (s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4]) {
        // IPv4-compatible or NAT64 embeddings of a v4 address: judged as that address.
        let bits = u128::from(ip) as u32;
        special_v4(Ipv4Addr::from(bits))
    } else {
        None
    }
}

/// This host's interface addresses (a name resolving to one of them reaches the host's own
/// services, e.g. the Docker daemon's port or a database listening on every interface).
pub fn own_addresses() -> HashSet<IpAddr> {
    let mut set = HashSet::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we only read and then free once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return set;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its real type.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if family == libc::AF_INET {
                // SAFETY: AF_INET: a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                set.insert(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
            } else if family == libc::AF_INET6 {
                // SAFETY: AF_INET6: a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                set.insert(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_special(ip: &str) -> bool {
        special(ip.parse().unwrap(), &HashSet::new()).is_some()
    }

    #[test]
    fn special_ranges_are_known() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
        ] {
            assert!(is_special(ip), "{ip} should need a rule");
        }
        for ip in ["93.184.216.34", "172.32.0.1", "2606:4700::1111", "8.8.8.8"] {
            assert!(!is_special(ip), "{ip} is public");
        }
    }

    #[test]
    fn the_hosts_own_addresses_count() {
        let own = own_addresses();
        assert!(own.contains(&"127.0.0.1".parse::<IpAddr>().unwrap()), "{own:?}");
        let mut mine = HashSet::new();
        mine.insert("93.184.216.34".parse().unwrap());
        assert!(special("93.184.216.34".parse().unwrap(), &mine).is_some());
    }

    #[tokio::test]
    async fn a_static_table_answers_without_case() {
        let r = StaticResolver(vec![("Pkg.Example".into(), vec!["10.0.0.1".parse().unwrap()])]);
        assert_eq!(r.resolve("pkg.example", 443).await.unwrap().len(), 1);
        assert!(r.resolve("other.example", 443).await.is_err());
    }
}
