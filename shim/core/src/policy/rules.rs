//! The rules of a policy: a [`Rule`] matches a peer network and ports, a [`RolePolicy`] is one
//! role's switch with its allow and deny rules (deny beats allow).

use std::net::IpAddr;

use serde::{Deserialize, Deserializer};

use super::{Cidr, PortRange};

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
    pub(super) fn allows(&self, ip: IpAddr, port: u16) -> bool {
        self.enabled
            && !self.deny.iter().any(|r| r.matches(ip, port))
            && (self.allow.is_empty() || self.allow.iter().any(|r| r.matches(ip, port)))
    }
}

fn default_true() -> bool {
    true
}

pub(super) fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

pub(super) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
