//! The allowlist: which destinations the egress proxy may connect to.
//!
//! A rule is a host pattern and an optional port. Host patterns are an exact name
//! (`registry.example`), a suffix (`*.registry.example`: any name below it, not the name
//! itself), an IP address, or an IP range in CIDR notation. Names compare without case and
//! without a trailing dot. A rule without a port allows 80 and 443, the ports package managers
//! use; any other port must be named.
//!
//! Names and addresses are matched apart on purpose: a name rule lets the proxy connect to what
//! the name resolves to, but only if that address is an ordinary public one. Loopback, private,
//! link-local (cloud metadata) and the host's own addresses need a rule naming the address or
//! its range, because a name's DNS answer is the attacker's to choose.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The ports a rule without one allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// A lower-case name without a trailing dot.
    Exact(String),
    /// `*.SUFFIX`: names ending in `.SUFFIX` (lower case, no trailing dot).
    Suffix(String),
    Ip(IpAddr),
    Cidr {
        net: IpAddr,
        prefix: u8,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub host: HostPattern,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid allow rule {rule:?}: {why} (write HOST, HOST:PORT, *.SUFFIX, an IP address or a CIDR range)"
)]
pub struct RuleError {
    pub rule: String,
    pub why: &'static str,
}

/// Lower case, one trailing dot removed; `None` if not a plausible DNS name (or an IP address).
pub fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    // An address with a trailing dot is no name: shown without the dot it would read as the
    // address, and a resolver might take it for one.
    (ok && name.parse::<IpAddr>().is_err()).then_some(name)
}

/// An IP literal as a URL or CONNECT target writes it: `10.0.0.1`, `::1`, `[::1]`.
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    inner.parse().ok()
}

/// `HOST:PORT` / `[V6]:PORT` / `HOST` / `V6` → (host, port). A bare IPv6 address has colons and
/// no brackets; it has no port.
pub fn split_host_port(text: &str) -> Result<(&str, Option<u16>), &'static str> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed [")?;
        return match after {
            "" => Ok((host, None)),
            p => {
                let p = p.strip_prefix(':').ok_or("junk after ]")?;
                Ok((host, Some(parse_port(p)?)))
            }
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (host, port) = text.split_once(':').ok_or("bad port")?;
            Ok((host, Some(parse_port(port)?)))
        }
        // A bare IPv6 address (or range).
        _ => Ok((text, None)),
    }
}

fn parse_port(p: &str) -> Result<u16, &'static str> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err("the port must be 1-65535"),
        Ok(n) => Ok(n),
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |why| RuleError {
            rule: text.to_string(),
            why,
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(err("empty"));
        }
        let (host, port) = split_host_port(trimmed).map_err(err)?;
        if let Some((net, prefix)) = host.split_once('/') {
            let net: IpAddr = net.parse().map_err(|_| err("not an IP range"))?;
            let prefix: u8 = prefix.parse().map_err(|_| err("bad prefix length"))?;
            let max = if net.is_ipv4() { 32 } else { 128 };
            if prefix > max {
                return Err(err("prefix length too long"));
            }
            return Ok(Rule {
                host: HostPattern::Cidr {
                    net: mask(net, prefix),
                    prefix,
                },
                port,
            });
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Rule {
                host: HostPattern::Ip(ip),
                port,
            });
        }
        if let Some(suffix) = host.strip_prefix("*.") {
            let suffix = normalize_name(suffix).ok_or_else(|| err("not a host name"))?;
            return Ok(Rule {
                host: HostPattern::Suffix(suffix),
                port,
            });
        }
        let name = normalize_name(host).ok_or_else(|| err("not a host name"))?;
        Ok(Rule {
            host: HostPattern::Exact(name),
            port,
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Exact(n) => n.clone(),
            HostPattern::Suffix(s) => format!("*.{s}"),
            HostPattern::Ip(IpAddr::V6(ip)) if self.port.is_some() => format!("[{ip}]"),
            HostPattern::Ip(ip) => ip.to_string(),
            // A v6 range with a port is bracketed, as it is written, or it would not parse back.
            HostPattern::Cidr {
                net: IpAddr::V6(net),
                prefix,
            } if self.port.is_some() => {
                format!("[{net}/{prefix}]")
            }
            HostPattern::Cidr { net, prefix } => format!("{net}/{prefix}"),
        };
        match self.port {
            Some(p) => write!(f, "{host}:{p}"),
            None => f.write_str(&host),
        }
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix)
            };
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is the IPv4 address it maps.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

impl Rule {
    fn port_ok(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    /// Whether this rule names the address itself (an IP or a range).
    pub fn names_ip(&self, ip: IpAddr, port: u16) -> bool {
        let ip = canonical(ip);
        self.port_ok(port)
            && match &self.host {
                HostPattern::Ip(own) => canonical(*own) == ip,
                HostPattern::Cidr { net, prefix } => {
                    net.is_ipv4() == ip.is_ipv4() && mask(ip, *prefix) == *net
                }
                _ => false,
            }
    }

    /// Whether this rule allows the (normalized) name.
    pub fn names_host(&self, name: &str, port: u16) -> bool {
        self.port_ok(port)
            && match &self.host {
                HostPattern::Exact(n) => n == name,
                HostPattern::Suffix(s) => {
                    name.len() > s.len() + 1 && name.ends_with(s.as_str()) && {
                        name.as_bytes()[name.len() - s.len() - 1] == b'.'
                    }
                }
                _ => false,
            }
    }
}

/// What a target is, once parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Name(String),
    Ip(IpAddr),
}

impl Target {
    pub fn parse(host: &str) -> Option<Target> {
        if let Some(ip) = parse_ip(host) {
            return Some(Target::Ip(canonical(ip)));
        }
        normalize_name(host).map(Target::Name)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

impl Allowlist {
    pub fn new(rules: Vec<Rule>) -> Self {
        Allowlist { rules }
    }

    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Self, RuleError> {
        rules
            .iter()
            .map(|r| r.as_ref().parse())
            .collect::<Result<Vec<_>, _>>()
            .map(Allowlist::new)
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn extend(&mut self, more: impl IntoIterator<Item = Rule>) {
        for r in more {
            if !self.rules.contains(&r) {
                self.rules.push(r);
            }
        }
    }

    /// Whether a name may be asked for at all (its addresses are checked after resolving).
    pub fn allows_name(&self, name: &str, port: u16) -> bool {
        self.rules.iter().any(|r| r.names_host(name, port))
    }

    /// Whether an IP rule names this address (and port).
    pub fn names_ip(&self, ip: IpAddr, port: u16) -> bool {
        self.rules.iter().any(|r| r.names_ip(ip, port))
    }

    /// Whether a CONNECT to the (allowed) `name` on `port` must be TLS asking for that name:
    /// yes when a rule without a port (80 and 443) or one naming 443 allows it. A rule naming
    /// another port is the user's word that the port speaks something else, so its bytes are
    /// not read.
    pub fn wants_tls(&self, name: &str, port: u16) -> bool {
        self.rules
            .iter()
            .any(|r| r.names_host(name, port) && matches!(r.port, None | Some(443)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `allowlist` fuzz target (fuzz/regressions/allowlist): `10.0.10.0.` was taken
    /// as a host *name* and shown as `10.0.10.0`, which reads as an address rule.
    #[test]
    fn an_address_with_a_trailing_dot_is_no_host_name() {
        assert_eq!(normalize_name("10.0.10.0."), None);
        assert_eq!(normalize_name("::1."), None);
        assert!("10.0.10.0.".parse::<Rule>().is_err());
        assert!("10.0.10.0.:8080".parse::<Rule>().is_err());
        assert_eq!(Target::parse("10.0.10.0."), None);
        // A name that only looks numeric in part is still a name.
        assert_eq!(
            normalize_name("10.0.10.0.example."),
            Some("10.0.10.0.example".into())
        );
    }

    fn list(rules: &[&str]) -> Allowlist {
        Allowlist::parse(rules).unwrap()
    }

    #[test]
    fn exact_names_ignore_case_and_a_trailing_dot() {
        let a = list(&["Registry.Example."]);
        assert!(a.allows_name("registry.example", 443));
        assert!(a.allows_name(&normalize_name("REGISTRY.example.").unwrap(), 80));
        assert!(!a.allows_name("sub.registry.example", 443));
        assert!(!a.allows_name("registry.example.evil", 443));
        assert!(!a.allows_name("xregistry.example", 443));
    }

    #[test]
    fn suffixes_match_names_below_not_the_name_itself() {
        let a = list(&["*.registry.example"]);
        assert!(a.allows_name("a.registry.example", 443));
        assert!(a.allows_name("a.b.registry.example", 443));
        assert!(!a.allows_name("registry.example", 443));
        assert!(!a.allows_name("evilregistry.example", 443), "a label boundary");
        assert!(!a.allows_name("a.registry.example.evil", 443));
    }

    #[test]
    fn ports_default_to_web_ports_and_are_exact_when_given() {
        let a = list(&["registry.example"]);
        assert!(a.allows_name("registry.example", 80));
        assert!(a.allows_name("registry.example", 443));
        assert!(!a.allows_name("registry.example", 22));
        let b = list(&["registry.example:8443"]);
        assert!(b.allows_name("registry.example", 8443));
        assert!(!b.allows_name("registry.example", 443));
    }

    #[test]
    fn ip_literals_and_ranges_v4_and_v6() {
        let a = list(&[
            "127.0.0.1:8080",
            "10.0.0.0/8",
            "[::1]:9000",
            "fd00::/8",
            "2001:db8::5",
        ]);
        assert!(a.names_ip("127.0.0.1".parse().unwrap(), 8080));
        assert!(!a.names_ip("127.0.0.1".parse().unwrap(), 8081));
        assert!(!a.names_ip("127.0.0.2".parse().unwrap(), 8080));
        assert!(a.names_ip("10.200.3.4".parse().unwrap(), 443));
        assert!(!a.names_ip("11.0.0.1".parse().unwrap(), 443));
        assert!(a.names_ip("::1".parse().unwrap(), 9000));
        assert!(a.names_ip("fd12:3456::1".parse().unwrap(), 80));
        assert!(!a.names_ip("fe80::1".parse().unwrap(), 80));
        assert!(a.names_ip("2001:db8::5".parse().unwrap(), 443));
        // The mapped form of an allowed v4 address is that address.
        assert!(a.names_ip("::ffff:127.0.0.1".parse().unwrap(), 8080));
        // A name rule never names an address.
        assert!(!list(&["localhost"]).names_ip("127.0.0.1".parse().unwrap(), 80));
        // An address rule never allows a name.
        assert!(!a.allows_name("localhost", 8080));
    }

    #[test]
    fn targets_parse_like_urls_write_them() {
        assert_eq!(Target::parse("[::1]"), Some(Target::Ip("::1".parse().unwrap())));
        assert_eq!(
            Target::parse("::ffff:10.0.0.1"),
            Some(Target::Ip("10.0.0.1".parse().unwrap()))
        );
        assert_eq!(
            Target::parse("Host.Example."),
            Some(Target::Name("host.example".into()))
        );
        assert_eq!(Target::parse("bad host"), None);
        assert_eq!(Target::parse(""), None);
        assert_eq!(Target::parse("a..b"), None);
    }

    #[test]
    fn rules_parse_and_print_and_bad_ones_are_refused() {
        for (text, shown) in [
            ("registry.example", "registry.example"),
            ("registry.example:8080", "registry.example:8080"),
            ("*.Registry.Example", "*.registry.example"),
            ("[::1]:3000", "[::1]:3000"),
            ("::1", "::1"),
            ("10.1.2.3/8", "10.0.0.0/8"),
            ("[fd00::/8]:443", "[fd00::/8]:443"),
        ] {
            assert_eq!(text.parse::<Rule>().unwrap().to_string(), shown, "{text}");
            // What is shown parses back to the same rule.
            assert_eq!(shown.parse::<Rule>().unwrap().to_string(), shown, "{shown}");
        }
        for bad in [
            "",
            "host:0",
            "host:99999",
            "a b",
            "10.0.0.0/33",
            "*.",
            "[::1",
            "host:port",
        ] {
            assert!(bad.parse::<Rule>().is_err(), "{bad:?} parsed");
        }
    }
}
