//! Which connections may upgrade: the `STREAMSHIM_POLICY` file.
//!
//! The pod opted in, so with no policy file every TCP connection may upgrade (loopback excepted,
//! see below); a policy only narrows that. The file is small YAML, parsed once per process:
//!
//! ```yaml
//! version: 1                          # optional; only 1 is accepted
//! programs: [iperf3, "qemu-system-*"] # basename of /proc/self/exe or argv[0]; `*` and `?`
//!                                     # globs; absent or empty = every program
//! exclude_programs: [sshd, "kube*"]   # never upgrade these (beats `programs`)
//! loopback: false                     # upgrade loopback/unspecified peers (default false)
//! client:                             # connections this process makes (connect)
//!   enabled: true                     # default true; false = never upgrade as client
//!   allow:                            # peer address rules; absent or empty = every peer
//!     - {cidr: 10.0.0.0/8, ports: [5201, "8000-8100"]}
//!     - {cidr: "fd00::/8"}
//!   deny:                             # deny beats allow
//!     - {cidr: 10.0.5.0/24}
//!     - {ports: [22]}
//! server:                             # connections this process accepts
//!   allow:
//!     - {ports: [5201]}               # ports = local (listen) ports; cidr = the client's address
//!   deny:
//!     - {cidr: 10.9.0.0/16, ports: [5201]}
//! ```
//!
//! A rule is a mapping with optional `cidr` (an address or `address/prefix`, IPv4 or IPv6; host
//! bits are ignored) and optional `ports` (a list of numbers and `"lo-hi"` ranges). An absent
//! field matches everything, so `{}` matches every connection. A rule matches when both fields
//! match. IPv4 and IPv4-mapped IPv6 (`::ffff:a.b.c.d`) are the same address for matching, both
//! for peers and for CIDRs, so `10.0.0.0/8` matches the peer `::ffff:10.1.2.3` (and `::/0`
//! matches every address).
//!
//! Loopback (127.0.0.0/8, ::1) and unspecified (0.0.0.0, ::) peers stay on TCP unless
//! `loopback: true` (docs/shim-protocol.md: rdma_cm has no loopback device on most HCAs).
//!
//! Unknown fields, bad CIDRs, bad ports and YAML errors are errors with line and column. The shim
//! turns any error into pass-through plus one stderr line ([`PolicyError`]'s `Display` is one
//! line). Checks ([`Policy::client_allows`], [`Policy::server_allows`],
//! [`Policy::program_allowed`]) never allocate and never panic.

use std::ffi::OsStr;
use std::fmt;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// Environment variable naming the policy file.
pub const POLICY_ENV: &str = "STREAMSHIM_POLICY";

/// Largest policy file read (bytes); anything bigger is an error.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// CIDR

/// An IP network. IPv4 networks are kept as IPv4-mapped IPv6 (`::ffff:0:0/96` + prefix), so one
/// comparison serves both families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    net: u128,
    prefix: u8,
}

/// A CIDR string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {input:?}: {why}")]
pub struct CidrError {
    input: String,
    why: &'static str,
}

const V4_MAPPED_PREFIX: u128 = 0xffff_u128 << 32;

/// The 128-bit form of an address, IPv4 as IPv4-mapped IPv6.
fn ip_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => V4_MAPPED_PREFIX | u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn mask(prefix: u8) -> u128 {
    match prefix {
        0 => 0,
        p if p >= 128 => u128::MAX,
        p => u128::MAX << (128 - u32::from(p)),
    }
}

/// IPv4-mapped IPv6 addresses become IPv4; everything else is returned as is.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// Loopback or unspecified (connecting to 0.0.0.0 or :: reaches the local host), IPv4-mapped
/// forms included.
pub fn is_local_peer(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified(),
    }
}

impl Cidr {
    /// The network `ip/prefix` (host bits cleared). `prefix` is at most 32 for IPv4 and 128 for
    /// IPv6 (IPv6 terms also for IPv4-mapped addresses: `::ffff:10.0.0.0/104` is `10.0.0.0/8`).
    pub fn new(ip: IpAddr, prefix: u8) -> Result<Cidr, CidrError> {
        // IPv4 is stored as IPv4-mapped IPv6, so an IPv6 network inside ::ffff:0:0/96 with a
        // prefix of 96 or more is the same value as the IPv4 network.
        let (bits, prefix) = match ip {
            IpAddr::V4(v4) => {
                if prefix > 32 {
                    return Err(CidrError {
                        input: format!("{ip}/{prefix}"),
                        why: "IPv4 prefix length above 32",
                    });
                }
                (ip_bits(IpAddr::V4(v4)), prefix.saturating_add(96))
            }
            IpAddr::V6(v6) => {
                if prefix > 128 {
                    return Err(CidrError {
                        input: format!("{ip}/{prefix}"),
                        why: "IPv6 prefix length above 128",
                    });
                }
                (u128::from(v6), prefix)
            }
        };
        Ok(Cidr {
            net: bits & mask(prefix),
            prefix,
        })
    }

    /// Whether `ip` lies in this network (IPv4 and IPv4-mapped IPv6 are the same address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip_bits(ip) & mask(self.prefix) == self.net
    }

    /// Prefix length in the network's own family (IPv4 networks: 0..=32).
    pub fn prefix_len(&self) -> u8 {
        if self.is_v4() {
            self.prefix.saturating_sub(96)
        } else {
            self.prefix
        }
    }

    /// The network address in its own family.
    pub fn network(&self) -> IpAddr {
        if self.is_v4() {
            // The low 32 bits; truncation is the point.
            IpAddr::V4(Ipv4Addr::from((self.net & u128::from(u32::MAX)) as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(self.net))
        }
    }

    fn is_v4(&self) -> bool {
        self.prefix >= 96 && self.net & mask(96) == V4_MAPPED_PREFIX
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix_len())
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `a.b.c.d/n`, `a.b.c.d` (/32), `v6/n`, `v6` (/128). No spaces, no leading `+`.
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = |why| CidrError {
            input: s.to_owned(),
            why,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let max: u8 = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => parse_prefix(p).ok_or_else(|| err("prefix length is not a number"))?,
        };
        if prefix > max {
            return Err(err(if ip.is_ipv4() {
                "IPv4 prefix length above 32"
            } else {
                "IPv6 prefix length above 128"
            }));
        }
        Cidr::new(ip, prefix)
    }
}

/// Decimal digits only (1-3 of them), value up to 255.
fn parse_prefix(p: &str) -> Option<u8> {
    if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Cidr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP address or CIDR such as 10.0.0.0/8 or fd00::/8")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Cidr, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

// ---------------------------------------------------------------------------------------------
// Ports

/// An inclusive port range (`lo == hi` for one port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port (inclusive).
    pub hi: u16,
}

impl PortRange {
    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }
}

impl FromStr for PortRange {
    type Err = String;

    /// `"5201"` or `"8000-8100"` (inclusive, lo <= hi).
    fn from_str(s: &str) -> Result<PortRange, String> {
        let port = |p: &str| -> Result<u16, String> {
            let p = p.trim();
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("invalid port {p:?} in {s:?}"));
            }
            p.parse::<u16>()
                .map_err(|_| format!("port {p} in {s:?} is above 65535"))
        };
        match s.split_once('-') {
            None => {
                let p = port(s)?;
                Ok(PortRange { lo: p, hi: p })
            }
            Some((a, b)) => {
                let (lo, hi) = (port(a)?, port(b)?);
                if lo > hi {
                    return Err(format!("port range {s:?} is empty (start above end)"));
                }
                Ok(PortRange { lo, hi })
            }
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PortRange;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number or a \"lo-hi\" range")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortRange, E> {
                u16::try_from(v)
                    .map(|p| PortRange { lo: p, hi: p })
                    .map_err(|_| E::custom(format!("port {v} is above 65535")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortRange, E> {
                u16::try_from(v)
                    .map(|p| PortRange { lo: p, hi: p })
                    .map_err(|_| E::custom(format!("port {v} is out of range 0-65535")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PortRange, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------------------------
// Program patterns

/// A glob over a program's basename: `*` matches any run of bytes, `?` exactly one byte, every
/// other byte itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProgramPattern(String);

impl ProgramPattern {
    /// The pattern; errors for an empty pattern or one with `/` (patterns match basenames).
    pub fn new(p: &str) -> Result<ProgramPattern, String> {
        if p.is_empty() {
            return Err("empty program pattern".to_owned());
        }
        if p.contains('/') {
            return Err(format!(
                "program pattern {p:?} contains '/': patterns match the program's basename"
            ));
        }
        Ok(ProgramPattern(p.to_owned()))
    }

    /// Whether `name` (a basename) matches.
    pub fn matches(&self, name: &str) -> bool {
        glob_match(self.0.as_bytes(), name.as_bytes())
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for ProgramPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor (not `String::deserialize` then a check) so errors carry the value's
        // line and column.
        struct V;
        impl Visitor<'_> for V {
            type Value = ProgramPattern;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a program name or glob")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ProgramPattern, E> {
                ProgramPattern::new(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// Iterative glob match with single-star backtracking: O(len(p) * len(s)) worst case, no
/// allocation, no recursion.
fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    // Position of the last `*` seen and the text position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    loop {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
                continue;
            }
            Some(&c) => {
                if let Some(&b) = s.get(t)
                    && (c == b'?' || c == b)
                {
                    p += 1;
                    t += 1;
                    continue;
                }
            }
            None => {
                if t == s.len() {
                    return true;
                }
            }
        }
        match star {
            Some((sp, st)) if st < s.len() => {
                star = Some((sp, st + 1));
                p = sp + 1;
                t = st + 1;
            }
            _ => return false,
        }
    }
}

/// The part after the last `/` (the whole string when there is none).
pub fn basename(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some((_, b)) => b,
        None => path,
    }
}

/// The names [`Policy::program_allowed_any`] should see for this process: the basename of
/// `/proc/self/exe` and of `argv[0]` (deduplicated; either may be missing). Allocates and makes a
/// syscall: call once per process.
pub fn current_program_names() -> Vec<String> {
    let mut names = Vec::with_capacity(2);
    if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
        let s = exe.to_string_lossy();
        // A deleted binary reads as "/path/prog (deleted)".
        let s = s.strip_suffix(" (deleted)").unwrap_or(&s);
        let b = basename(s);
        if !b.is_empty() {
            names.push(b.to_owned());
        }
    }
    if let Some(arg0) = std::env::args_os().next() {
        let s = arg0.to_string_lossy();
        let b = basename(&s);
        if !b.is_empty() && !names.iter().any(|n| n == b) {
            names.push(b.to_owned());
        }
    }
    names
}

// ---------------------------------------------------------------------------------------------
// Policy

/// One allow or deny rule. Absent fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Peer network (client role: the server's address; server role: the client's address).
    #[serde(default)]
    pub cidr: Option<Cidr>,
    /// Client role: the peer's port. Server role: the local (listen) port. Empty = any.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ports: Vec<PortRange>,
}

impl Rule {
    fn matches(&self, ip: IpAddr, port: u16) -> bool {
        self.cidr.as_ref().is_none_or(|c| c.contains(ip))
            && (self.ports.is_empty() || self.ports.iter().any(|r| r.contains(port)))
    }
}

/// The rules of one role.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolePolicy {
    /// `false`: this role never upgrades.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Empty = allow every connection not denied.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub allow: Vec<Rule>,
    /// Any match refuses the upgrade, whatever `allow` says.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub deny: Vec<Rule>,
}

impl Default for RolePolicy {
    fn default() -> Self {
        RolePolicy {
            enabled: true,
            allow: Vec::new(),
            deny: Vec::new(),
        }
    }
}

impl RolePolicy {
    fn allows(&self, ip: IpAddr, port: u16) -> bool {
        self.enabled
            && !self.deny.iter().any(|r| r.matches(ip, port))
            && (self.allow.is_empty() || self.allow.iter().any(|r| r.matches(ip, port)))
    }
}

fn default_true() -> bool {
    true
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The `version` field: absent, null or 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FormatVersion;

impl<'de> Deserialize<'de> for FormatVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FormatVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("policy version 1")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FormatVersion, E> {
                if v == 1 {
                    Ok(FormatVersion)
                } else {
                    Err(E::custom(format!(
                        "unsupported policy version {v} (this shim reads version 1)"
                    )))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FormatVersion, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("unsupported policy version {v}"))),
                }
            }
            fn visit_unit<E: de::Error>(self) -> Result<FormatVersion, E> {
                Ok(FormatVersion)
            }
        }
        d.deserialize_any(V)
    }
}

/// The parsed policy. [`Policy::default`] is [`Policy::allow_all`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Checked on parse (only 1, or absent); nothing to keep.
    #[serde(default)]
    version: FormatVersion,
    /// Programs that may upgrade (globs over the basename); empty = all.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub programs: Vec<ProgramPattern>,
    /// Programs that never upgrade; beats `programs`.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub exclude_programs: Vec<ProgramPattern>,
    /// Whether loopback and unspecified peers may upgrade.
    #[serde(default)]
    pub loopback: bool,
    /// Rules for connections this process makes.
    #[serde(default, deserialize_with = "null_as_default")]
    pub client: RolePolicy,
    /// Rules for connections this process accepts.
    #[serde(default, deserialize_with = "null_as_default")]
    pub server: RolePolicy,
}

impl Policy {
    /// The policy without a file: every program, peer and port may upgrade, loopback excepted.
    pub fn allow_all() -> Policy {
        Policy::default()
    }

    /// Parses policy YAML. An empty document (or only comments) is [`Policy::allow_all`].
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        Self::from_yaml(text, None)
    }

    /// Parses `text` (from `path`, if given). Flow collections nested deeper than YAML parsers
    /// read in linear time are refused first (see `rdma_streams_yaml_guard`).
    fn from_yaml(text: &str, path: Option<&Path>) -> Result<Policy, PolicyError> {
        if let Err(e) = rdma_streams_yaml_guard::check(text) {
            return Err(PolicyError::Parse {
                path: path.map(Path::to_owned),
                line: Some(e.line),
                column: Some(e.column),
                message: e.to_string(),
            });
        }
        match serde_yaml::from_str::<Option<Policy>>(text) {
            Ok(p) => Ok(p.unwrap_or_default()),
            Err(e) => Err(PolicyError::from_yaml(path, &e)),
        }
    }

    /// Reads and parses the file at `path` (at most [`MAX_POLICY_BYTES`]).
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let read_err = |source| PolicyError::Read {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let mut text = String::new();
        file.take(MAX_POLICY_BYTES.saturating_add(1))
            .read_to_string(&mut text)
            .map_err(read_err)?;
        if text.len() as u64 > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge {
                path: path.to_owned(),
            });
        }
        Self::from_yaml(&text, Some(path))
    }

    /// [`PolicySource::from_env`] then [`PolicySource::load`]: `STREAMSHIM_POLICY` unset or empty
    /// gives [`Policy::allow_all`]; an unreadable or bad file gives an error to print once.
    pub fn from_env() -> Result<Policy, PolicyError> {
        PolicySource::from_env().load()
    }

    /// Whether the program with this basename may upgrade at all (a path is reduced to its
    /// basename first). Exclusions beat `programs`; empty `programs` allows every program.
    pub fn program_allowed(&self, exe_basename: &str) -> bool {
        let name = basename(exe_basename);
        !self.exclude_programs.iter().any(|p| p.matches(name))
            && (self.programs.is_empty() || self.programs.iter().any(|p| p.matches(name)))
    }

    /// For a process known by several names (exe and `argv[0]` basenames, see
    /// [`current_program_names`]): no name excluded, and some name allowed (or `programs`
    /// empty). No names at all: allowed only when `programs` is empty.
    pub fn program_allowed_any<S: AsRef<str>>(&self, names: &[S]) -> bool {
        let excluded = names.iter().any(|n| {
            let n = basename(n.as_ref());
            self.exclude_programs.iter().any(|p| p.matches(n))
        });
        !excluded
            && (self.programs.is_empty()
                || names.iter().any(|n| {
                    let n = basename(n.as_ref());
                    self.programs.iter().any(|p| p.matches(n))
                }))
    }

    /// Whether a `connect()` to `peer` may try to upgrade.
    pub fn client_allows(&self, peer: SocketAddr) -> bool {
        let ip = canonical_ip(peer.ip());
        (self.loopback || !is_local_peer(ip)) && self.client.allows(ip, peer.port())
    }

    /// Whether a connection accepted on `local_port` from `peer` may upgrade (the server side of
    /// the HELLO: `peer` is the client's TCP address).
    pub fn server_allows(&self, local_port: u16, peer: IpAddr) -> bool {
        let ip = canonical_ip(peer);
        (self.loopback || !is_local_peer(ip)) && self.server.allows(ip, local_port)
    }
}

// ---------------------------------------------------------------------------------------------
// Source and errors

/// Where the policy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// `STREAMSHIM_POLICY` unset or empty: [`Policy::allow_all`].
    Default,
    /// A policy file.
    File(PathBuf),
}

impl PolicySource {
    /// Reads `STREAMSHIM_POLICY`.
    pub fn from_env() -> PolicySource {
        Self::from_value(std::env::var_os(POLICY_ENV).as_deref())
    }

    /// Like [`PolicySource::from_env`] with the variable's value given.
    pub fn from_value(value: Option<&OsStr>) -> PolicySource {
        match value {
            Some(v) if !v.is_empty() => PolicySource::File(PathBuf::from(v)),
            _ => PolicySource::Default,
        }
    }

    /// The policy this source names.
    pub fn load(&self) -> Result<Policy, PolicyError> {
        match self {
            PolicySource::Default => Ok(Policy::allow_all()),
            PolicySource::File(p) => Policy::load(p),
        }
    }
}

/// Why a policy could not be used. `Display` is a single line, meant to be printed once as
/// `streamshim: <error>; upgrades disabled`.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be opened or read (or is not UTF-8).
    #[error("policy {}: cannot read: {source}", escape_controls(&path.display().to_string()))]
    Read {
        /// The policy file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is larger than [`MAX_POLICY_BYTES`].
    #[error(
        "policy {}: larger than {MAX_POLICY_BYTES} bytes",
        escape_controls(&path.display().to_string())
    )]
    TooLarge {
        /// The policy file.
        path: PathBuf,
    },
    /// YAML syntax, unknown field, bad CIDR/port/pattern/version.
    #[error("{}", fmt_parse(path.as_deref(), *line, *column, message))]
    Parse {
        /// The policy file, when parsed from one.
        path: Option<PathBuf>,
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// What is wrong (one line, with the field path such as `client.allow[0]`).
        message: String,
    },
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`): a line break in the
/// `STREAMSHIM_POLICY` path, or an escape sequence spelled in the policy and quoted back by the
/// YAML error, must neither split the one-line message nor reach a terminal.
fn escape_controls(text: &str) -> String {
    if !text.contains(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn fmt_parse(path: Option<&Path>, line: Option<usize>, column: Option<usize>, msg: &str) -> String {
    let mut s = String::from("policy");
    if let Some(p) = path {
        s.push(' ');
        s.push_str(&escape_controls(&p.display().to_string()));
    }
    match (line, column) {
        (Some(l), Some(c)) => s.push_str(&format!(": line {l} column {c}")),
        (Some(l), None) => s.push_str(&format!(": line {l}")),
        _ => {}
    }
    s.push_str(": ");
    s.push_str(msg);
    s
}

impl PolicyError {
    fn from_yaml(path: Option<&Path>, e: &serde_yaml::Error) -> PolicyError {
        let loc = e.location();
        let (line, column) = (
            loc.as_ref().map(|l| l.line()),
            loc.as_ref().map(|l| l.column()),
        );
        let mut message = escape_controls(&e.to_string().replace(['\n', '\r'], " "));
        if let (Some(l), Some(c)) = (line, column) {
            let suffix = format!(" at line {l} column {c}");
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_owned();
            }
        }
        PolicyError::Parse {
            path: path.map(Path::to_owned),
            line,
            column,
            message,
        }
    }

    /// 1-based (line, column) of a parse error, when known.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            PolicyError::Parse {
                line: Some(l),
                column: Some(c),
                ..
            } => Some((*l, *c)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{SocketAddrV4, SocketAddrV6};

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    /// The documented example, whole (also a seed of the fuzz tests).
    pub(super) const FULL: &str = r#"
# full example
version: 1
programs: [iperf3, "qemu-system-*"]
exclude_programs: [sshd, "kube*"]
loopback: false
client:
  enabled: true
  allow:
    - {cidr: 10.0.0.0/8, ports: [5201, "8000-8100"]}
    - {cidr: "fd00::/8"}
  deny:
    - {cidr: 10.0.5.0/24}
    - {ports: [22]}
server:
  allow:
    - {ports: [5201]}
  deny:
    - {cidr: 10.9.0.0/16, ports: [5201]}
"#;

    #[test]
    fn cidr_parse_and_contains() {
        let c = cidr("10.0.0.0/8");
        assert!(c.contains(ip("10.255.1.2")));
        assert!(c.contains(ip("::ffff:10.1.2.3")));
        assert!(!c.contains(ip("11.0.0.0")));
        assert!(!c.contains(ip("::a00:1"))); // IPv4-compatible, not mapped
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert_eq!(c.prefix_len(), 8);

        // Host bits ignored.
        assert_eq!(cidr("10.1.2.3/8"), c);
        assert_eq!(cidr("10.1.2.3/8").to_string(), "10.0.0.0/8");

        // Single addresses.
        assert_eq!(cidr("192.168.1.1").to_string(), "192.168.1.1/32");
        assert!(cidr("192.168.1.1").contains(ip("192.168.1.1")));
        assert!(!cidr("192.168.1.1").contains(ip("192.168.1.2")));
        assert_eq!(cidr("fe80::1").to_string(), "fe80::1/128");

        // Zero prefixes.
        let all4 = cidr("0.0.0.0/0");
        assert!(all4.contains(ip("1.2.3.4")));
        assert!(all4.contains(ip("::ffff:1.2.3.4")));
        assert!(!all4.contains(ip("2001:db8::1")));
        let all6 = cidr("::/0");
        assert!(all6.contains(ip("2001:db8::1")));
        assert!(all6.contains(ip("1.2.3.4")));

        // IPv6.
        let c6 = cidr("fd00::/8");
        assert!(c6.contains(ip("fd12:3456::1")));
        assert!(!c6.contains(ip("fe00::1")));
        assert_eq!(c6.to_string(), "fd00::/8");
        let c6 = cidr("2001:db8:1::/48");
        assert!(c6.contains(ip("2001:db8:1:ffff::1")));
        assert!(!c6.contains(ip("2001:db8:2::1")));

        // Mapped CIDR behaves as IPv4.
        let m = cidr("::ffff:10.0.0.0/104");
        assert_eq!(m, cidr("10.0.0.0/8"));
        assert_eq!(m.to_string(), "10.0.0.0/8");
        assert!(m.contains(ip("10.9.9.9")));
        // A mapped address with a short prefix stays IPv6.
        assert_eq!(cidr("::ffff:10.0.0.0/80").to_string(), "::/80");

        // Odd prefixes.
        let c = cidr("172.16.0.0/12");
        assert!(c.contains(ip("172.31.255.255")));
        assert!(!c.contains(ip("172.32.0.0")));
        assert!(cidr("1.2.3.4/31").contains(ip("1.2.3.5")));
        assert!(!cidr("1.2.3.4/31").contains(ip("1.2.3.6")));
    }

    #[test]
    fn cidr_rejects() {
        for bad in [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/ 8",
            " 10.0.0.0/8",
            "10.0.0/8",
            "10.0.0.0/8/8",
            "010.0.0.0/8",
            "::/129",
            "::/1000",
            "fd00::/0x8",
            "host.example/8",
            "10.0.0.256",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} parsed");
        }
        let e = "10.0.0.0/33".parse::<Cidr>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid CIDR \"10.0.0.0/33\": IPv4 prefix length above 32"
        );
        assert!(Cidr::new(ip("10.0.0.0"), 33).is_err());
        assert!(Cidr::new(ip("::"), 129).is_err());
        assert_eq!(
            Cidr::new(ip("::ffff:1.2.3.4"), 112).unwrap().to_string(),
            "1.2.0.0/16"
        );
        assert_eq!(
            Cidr::new(ip("::ffff:1.2.3.4"), 16).unwrap().to_string(),
            "::/16"
        );
    }

    #[test]
    fn ports() {
        assert_eq!(
            "5201".parse::<PortRange>(),
            Ok(PortRange { lo: 5201, hi: 5201 })
        );
        assert_eq!(
            "8000-8100".parse::<PortRange>(),
            Ok(PortRange { lo: 8000, hi: 8100 })
        );
        assert_eq!("1 - 2".parse::<PortRange>(), Ok(PortRange { lo: 1, hi: 2 }));
        for bad in ["", "-", "a", "1-", "-1", "70000", "2-1", "1-2-3", "+5"] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad:?}");
        }
        let r = PortRange { lo: 10, hi: 20 };
        assert!(r.contains(10) && r.contains(20) && !r.contains(9) && !r.contains(21));
        assert_eq!(r.to_string(), "10-20");
        assert_eq!(PortRange { lo: 7, hi: 7 }.to_string(), "7");
    }

    #[test]
    fn globs() {
        let m = |p: &str, s: &str| glob_match(p.as_bytes(), s.as_bytes());
        assert!(m("iperf3", "iperf3"));
        assert!(!m("iperf3", "iperf"));
        assert!(!m("iperf", "iperf3"));
        assert!(m("qemu-system-*", "qemu-system-x86_64"));
        assert!(m("qemu-system-*", "qemu-system-"));
        assert!(!m("qemu-system-*", "qemu-img"));
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("python3.?", "python3.9"));
        assert!(!m("python3.?", "python3.11"));
        assert!(m("python3*", "python3.11"));
        assert!(m("*a*b*c", "xxaxxbxxc"));
        assert!(!m("*a*b*c", "xxaxxbxxcx"));
        assert!(m("a**b", "ab"));
        assert!(m("*?", "x"));
        assert!(!m("*?", ""));
        assert!(!m("", "x"));
        assert!(m("", ""));
    }

    #[test]
    fn full_example_parses_and_behaves() {
        let p = Policy::parse(FULL).unwrap();
        // programs
        assert!(p.program_allowed("iperf3"));
        assert!(p.program_allowed("/usr/bin/iperf3"));
        assert!(p.program_allowed("qemu-system-x86_64"));
        assert!(!p.program_allowed("curl"));
        assert!(!p.program_allowed("sshd"));
        assert!(p.program_allowed_any(&["qemu-system-x86_64", "qemu"]));
        assert!(!p.program_allowed_any(&["python3.11", "python3"]));
        assert!(!p.program_allowed_any::<&str>(&[]));
        // client
        assert!(p.client_allows(sa("10.1.2.3:5201")));
        assert!(p.client_allows(sa("10.1.2.3:8050")));
        assert!(p.client_allows(sa("10.1.2.3:8100")));
        assert!(!p.client_allows(sa("10.1.2.3:8101")));
        assert!(!p.client_allows(sa("10.0.5.7:5201")), "deny beats allow");
        assert!(
            !p.client_allows(sa("[::ffff:10.0.5.7]:5201")),
            "mapped deny"
        );
        assert!(
            p.client_allows(sa("[::ffff:10.0.6.7]:5201")),
            "mapped allow"
        );
        assert!(!p.client_allows(sa("192.168.1.1:5201")));
        assert!(p.client_allows(sa("[fd00::1]:443")));
        assert!(!p.client_allows(sa("[fd00::1]:22")), "port deny");
        assert!(!p.client_allows(sa("127.0.0.1:5201")));
        // server
        assert!(p.server_allows(5201, ip("10.1.1.1")));
        assert!(p.server_allows(5201, ip("2001:db8::1")));
        assert!(!p.server_allows(5202, ip("10.1.1.1")));
        assert!(!p.server_allows(5201, ip("10.9.1.1")));
        assert!(!p.server_allows(5201, ip("::ffff:10.9.1.1")));
        assert!(!p.server_allows(5201, ip("::1")));
        assert!(!p.server_allows(5201, ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn allow_all_and_empty() {
        for text in ["", "# only a comment\n", "~", "---\n", "{}", "version: 1"] {
            let p = Policy::parse(text).unwrap();
            assert_eq!(p, Policy::allow_all(), "{text:?}");
        }
        let p = Policy::allow_all();
        assert!(p.program_allowed("anything"));
        assert!(p.program_allowed_any::<&str>(&[]));
        assert!(p.client_allows(sa("8.8.8.8:1")));
        assert!(p.client_allows(sa("[2001:db8::1]:1")));
        assert!(p.server_allows(1, ip("10.0.0.1")));
        // Loopback and unspecified stay TCP by default.
        for l in [
            "127.0.0.1:1",
            "127.9.9.9:1",
            "[::1]:1",
            "0.0.0.0:1",
            "[::]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(!p.client_allows(sa(l)), "{l}");
        }
        assert!(!p.server_allows(1, ip("127.0.0.1")));
    }

    #[test]
    fn loopback_switch() {
        let p = Policy::parse("loopback: true").unwrap();
        assert!(p.client_allows(sa("127.0.0.1:5201")));
        assert!(p.client_allows(sa("[::1]:5201")));
        assert!(p.server_allows(5201, ip("127.0.0.1")));
        // Still subject to the rules.
        let p = Policy::parse("loopback: true\nclient: {deny: [{cidr: 127.0.0.0/8}]}").unwrap();
        assert!(!p.client_allows(sa("127.0.0.1:5201")));
        assert!(p.client_allows(sa("[::1]:5201")));
    }

    #[test]
    fn role_enabled_and_nulls() {
        let p = Policy::parse("client:\n  enabled: false\nserver:\n").unwrap();
        assert!(!p.client_allows(sa("10.0.0.1:80")));
        assert!(p.server_allows(80, ip("10.0.0.1")));
        let p = Policy::parse("programs:\nclient:\n  allow:\n  deny:\n").unwrap();
        assert_eq!(p, Policy::allow_all());
        // `{}` matches everything.
        let p = Policy::parse("server: {deny: [{}]}").unwrap();
        assert!(!p.server_allows(80, ip("10.0.0.1")));
        assert!(p.client_allows(sa("10.0.0.1:80")));
    }

    #[test]
    fn rule_with_only_ports_or_only_cidr() {
        let p = Policy::parse("client: {allow: [{ports: [\"1000-2000\"]}, {cidr: 192.0.2.0/24}]}")
            .unwrap();
        assert!(p.client_allows(sa("8.8.8.8:1500")));
        assert!(!p.client_allows(sa("8.8.8.8:2500")));
        assert!(p.client_allows(sa("192.0.2.9:2500")));
        let p = Policy::parse("server: {allow: [{cidr: 192.0.2.0/24, ports: [80, 443]}]}").unwrap();
        assert!(p.server_allows(443, ip("192.0.2.1")));
        assert!(!p.server_allows(8443, ip("192.0.2.1")));
        assert!(!p.server_allows(443, ip("192.0.3.1")));
    }

    #[test]
    fn errors_have_locations_and_one_line() {
        let cases: &[(&str, (usize, usize), &str)] = &[
            (
                "client:\n  allow:\n    - {cidr: 10.0.0.0/8, portz: [1]}\n",
                (3, 26),
                "unknown field `portz`",
            ),
            ("programz: [a]\n", (1, 1), "unknown field `programz`"),
            (
                "client:\n  allow: [{cidr: 10.0.0.0/33}]\n",
                (2, 18),
                "IPv4 prefix length above 32",
            ),
            (
                "server:\n  allow: [{ports: [70000]}]\n",
                (2, 20),
                "port 70000 is above 65535",
            ),
            ("server:\n  allow: [{ports: [\"9-1\"]}]\n", (2, 20), "empty"),
            (
                "server:\n  allow: [{ports: [-3]}]\n",
                (2, 20),
                "out of range",
            ),
            ("loopback: maybe\n", (1, 11), "expected a boolean"),
            ("version: 2\n", (1, 10), "unsupported policy version 2"),
            ("programs: [\"/usr/bin/iperf3\"]\n", (1, 12), "basename"),
            ("programs: [\"\"]\n", (1, 12), "empty program pattern"),
            ("client: [1, 2]\n", (1, 9), "invalid type"),
            (
                "client:\n  allow: {cidr: 10.0.0.0/8}\n",
                (2, 10),
                "invalid type",
            ),
        ];
        for (text, loc, needle) in cases {
            let e = Policy::parse(text).unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.location(), Some(*loc), "{text:?}: {msg}");
            assert!(msg.contains(needle), "{text:?}: {msg}");
            assert!(!msg.contains('\n'), "{msg}");
            assert!(
                msg.starts_with(&format!("policy: line {} column {}: ", loc.0, loc.1)),
                "{msg}"
            );
            assert!(
                !msg.ends_with(&format!("at line {} column {}", loc.0, loc.1)),
                "{msg}"
            );
        }
        // Syntax error.
        let e = Policy::parse("client: {allow: [\n").unwrap_err();
        assert!(e.location().is_some(), "{e}");
        assert!(!e.to_string().contains('\n'));
        // Multiple documents.
        let e = Policy::parse("---\na: 1\n---\nb: 2\n").unwrap_err();
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn load_and_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, FULL).unwrap();
        let p = Policy::load(&path).unwrap();
        assert_eq!(p, Policy::parse(FULL).unwrap());

        let src = PolicySource::from_value(Some(path.as_os_str()));
        assert_eq!(src, PolicySource::File(path.clone()));
        assert_eq!(src.load().unwrap(), p);
        assert_eq!(PolicySource::from_value(None), PolicySource::Default);
        assert_eq!(
            PolicySource::from_value(Some(OsStr::new(""))),
            PolicySource::Default
        );
        assert_eq!(PolicySource::Default.load().unwrap(), Policy::allow_all());

        // Missing file.
        let missing = dir.path().join("nope.yaml");
        let e = PolicySource::File(missing.clone()).load().unwrap_err();
        assert!(matches!(e, PolicyError::Read { .. }));
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("policy {}: cannot read: ", missing.display())),
            "{msg}"
        );
        assert!(!msg.contains('\n'));

        // A directory.
        assert!(matches!(
            Policy::load(dir.path()),
            Err(PolicyError::Read { .. })
        ));

        // Bad content names the file and the line.
        std::fs::write(&path, "client:\n  bogus: 1\n").unwrap();
        let msg = Policy::load(&path).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("policy {}: line 2 column 3: ", path.display())),
            "{msg}"
        );

        // Not UTF-8.
        std::fs::write(&path, b"programs: [\xff]\n").unwrap();
        assert!(Policy::load(&path).is_err());

        // Too large.
        let big = format!("# {}\n", "x".repeat(MAX_POLICY_BYTES as usize));
        std::fs::write(&path, big).unwrap();
        assert!(matches!(
            Policy::load(&path),
            Err(PolicyError::TooLarge { .. })
        ));

        // Empty file.
        std::fs::write(&path, "").unwrap();
        assert_eq!(Policy::load(&path).unwrap(), Policy::allow_all());
    }

    #[test]
    fn helpers() {
        assert_eq!(basename("/usr/bin/iperf3"), "iperf3");
        assert_eq!(basename("iperf3"), "iperf3");
        assert_eq!(basename("/usr/bin/"), "");
        assert!(is_local_peer(ip("127.0.0.2")));
        assert!(is_local_peer(ip("::ffff:127.0.0.2")));
        assert!(is_local_peer(ip("::")));
        assert!(!is_local_peer(ip("10.0.0.1")));
        assert_eq!(canonical_ip(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        assert_eq!(canonical_ip(ip("::1")), ip("::1"));
        let names = current_program_names();
        assert!(!names.is_empty());
        assert!(names.iter().all(|n| !n.contains('/') && !n.is_empty()));
        let p = Policy::allow_all();
        assert!(p.program_allowed_any(&names));
    }

    fn arb_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<u32>().prop_map(|v| IpAddr::V4(Ipv4Addr::from(v))),
            any::<u128>().prop_map(|v| IpAddr::V6(Ipv6Addr::from(v))),
        ]
    }

    proptest! {
        #[test]
        fn cidr_contains_matches_mask_definition(a in arb_ip(), b in arb_ip(), len in 0u8..=128) {
            let max = if a.is_ipv4() { 32 } else { 128 };
            let len = len % (max + 1);
            let c = Cidr::new(a, len).unwrap();
            prop_assert!(c.contains(a));
            let text = format!("{a}/{len}");
            prop_assert_eq!(text.parse::<Cidr>().unwrap(), c);
            prop_assert_eq!(c.to_string().parse::<Cidr>().unwrap(), c);
            // Reference: compare the top `len` bits in the address's own family.
            let expect = match (canonical_ip(a), canonical_ip(b)) {
                (IpAddr::V4(x), IpAddr::V4(y)) => {
                    len == 0 || (u32::from(x) ^ u32::from(y)) >> (32 - u32::from(len)) == 0
                }
                (IpAddr::V6(x), IpAddr::V6(y)) => {
                    len == 0 || (u128::from(x) ^ u128::from(y)) >> (128 - u32::from(len)) == 0
                }
                (IpAddr::V6(x), IpAddr::V4(y)) => {
                    let y = u128::from(y.to_ipv6_mapped());
                    len == 0 || (u128::from(x) ^ y) >> (128 - u32::from(len)) == 0
                }
                (IpAddr::V4(_), IpAddr::V6(_)) => false,
            };
            prop_assert_eq!(c.contains(b), expect);
        }

        #[test]
        fn mapped_and_plain_v4_agree(v in any::<u32>(), port in any::<u16>()) {
            let p = Policy::parse(FULL).unwrap();
            let v4 = Ipv4Addr::from(v);
            let plain = SocketAddr::V4(SocketAddrV4::new(v4, port));
            let mapped = SocketAddr::V6(SocketAddrV6::new(v4.to_ipv6_mapped(), port, 0, 0));
            prop_assert_eq!(p.client_allows(plain), p.client_allows(mapped));
            prop_assert_eq!(
                p.server_allows(port, plain.ip()),
                p.server_allows(port, mapped.ip())
            );
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,200}") {
            let _ = Policy::parse(&s);
        }

        #[test]
        fn cidr_parse_never_panics(s in "[0-9a-f:./+-]{0,50}") {
            let _ = s.parse::<Cidr>();
        }

        #[test]
        fn glob_star_matches_everything(s in "\\PC{0,40}") {
            prop_assert!(glob_match(b"*", s.as_bytes()));
            prop_assert!(glob_match(s.as_bytes(), s.as_bytes()));
        }
    }
}
