//! Per-migration nftables tables in virt-handler's network namespace.
//!
//! Each source migration gets one table, `ip rdma_gw_<uid>` (or `ip6`), with one NAT chain
//! on the `output` hook (virt-handler's own connections are locally generated):
//!
//! ```text
//! table ip rdma_gw_<uid> {
//!   chain out {
//!     type nat hook output priority -100; policy accept;
//!     meta mark 0x52474d57 return
//!     ip daddr <target> tcp dport { <ports> } redirect to :<capture port>
//!   }
//! }
//! ```
//!
//! Only new connections to the target address on the published ports are redirected (NAT
//! applies to the first packet of a connection; established ones are untouched), and none
//! from a socket carrying the gateway's mark. Tables are replaced atomically (`nft -f -`
//! runs a batch as one transaction), removed on the migration's end, on shutdown, and, by
//! their name prefix, at startup (stale ones of a crashed gateway).

use std::{
    io::Write,
    net::IpAddr,
    path::Path,
    process::{Command, Stdio},
};

use super::netns::{self, NetnsError};

/// Prefix of every table the gateway owns.
pub const TABLE_PREFIX: &str = "rdma_gw_";

/// Why an nft call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NftError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// `nft` could not be started (not installed?).
    #[error("running nft")]
    Spawn(#[source] std::io::Error),
    /// `nft` rejected the batch.
    #[error("nft failed: {stderr}")]
    Failed { stderr: String },
}

/// One migration's capture rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRule {
    pub table: String,
    pub target: IpAddr,
    pub ports: Vec<u16>,
    pub redirect_port: u16,
    pub mark: u32,
}

/// The table name for a migration uid (nft names: letters, digits, `_`).
pub fn table_name(uid: &str) -> String {
    let clean: String = uid
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(64)
        .collect();
    format!("{TABLE_PREFIX}{clean}")
}

fn family(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "ip",
        IpAddr::V6(_) => "ip6",
    }
}

impl CaptureRule {
    /// The batch that (re)creates the table: idempotent, atomic.
    pub fn install_script(&self) -> String {
        let fam = family(self.target);
        let ports = self
            .ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "add table {fam} {t}\n\
             delete table {fam} {t}\n\
             table {fam} {t} {{\n\
             \tchain out {{\n\
             \t\ttype nat hook output priority -100; policy accept;\n\
             \t\tmeta mark {mark:#x} return\n\
             \t\t{fam} daddr {target} tcp dport {{ {ports} }} redirect to :{port}\n\
             \t}}\n\
             }}\n",
            t = self.table,
            mark = self.mark,
            target = self.target,
            port = self.redirect_port,
        )
    }
}

/// The batch that removes a table whether or not it exists.
pub fn remove_script(table: &str, target: IpAddr) -> String {
    let fam = family(target);
    format!("add table {fam} {table}\ndelete table {fam} {table}\n")
}

/// Runs `nft -f -` with `script` inside the namespace at `ns`.
pub fn apply(ns: &Path, script: String) -> Result<(), NftError> {
    netns::run_in(ns, move || nft(&["-f", "-"], Some(&script)))?.map(|_| ())
}

/// Installs (or replaces) a capture rule.
pub fn install(ns: &Path, rule: &CaptureRule) -> Result<(), NftError> {
    apply(ns, rule.install_script())
}

/// Removes a migration's table (no error if it is gone).
pub fn remove(ns: &Path, table: &str, target: IpAddr) -> Result<(), NftError> {
    apply(ns, remove_script(table, target))
}

/// The gateway's tables in the namespace, as `(family, name)`.
pub fn list_owned(ns: &Path) -> Result<Vec<(String, String)>, NftError> {
    let out = netns::run_in(ns, || nft(&["list", "tables"], None))??;
    Ok(parse_tables(&out))
}

/// Removes every table of the gateway (startup and shutdown cleanup); returns how many.
pub fn remove_all(ns: &Path) -> Result<usize, NftError> {
    let tables = list_owned(ns)?;
    if tables.is_empty() {
        return Ok(0);
    }
    let script: String = tables
        .iter()
        .map(|(fam, name)| format!("delete table {fam} {name}\n"))
        .collect();
    apply(ns, script)?;
    Ok(tables.len())
}

/// Parses `nft list tables` output (`table ip rdma_gw_x` lines), keeping the gateway's.
pub fn parse_tables(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("table"), Some(fam), Some(name)) if name.starts_with(TABLE_PREFIX) => {
                    Some((fam.to_owned(), name.to_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

fn nft(args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(NftError::Spawn)?;
    }
    let out = child.wait_with_output().map_err(NftError::Spawn)?;
    if !out.status.success() {
        return Err(NftError::Failed {
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_nft_identifiers() {
        assert_eq!(
            table_name("8f1c-22aa.b"),
            format!("{TABLE_PREFIX}8f1c_22aa_b")
        );
    }

    #[test]
    fn install_script_redirects_only_the_ports() {
        let rule = CaptureRule {
            table: table_name("u1"),
            target: "10.2.0.2".parse().unwrap(),
            ports: vec![40001, 40002],
            redirect_port: 35000,
            mark: 0x52474d57,
        };
        let s = rule.install_script();
        assert!(s.starts_with("add table ip rdma_gw_u1\ndelete table ip rdma_gw_u1\n"));
        assert!(s.contains("meta mark 0x52474d57 return"));
        assert!(s.contains("ip daddr 10.2.0.2 tcp dport { 40001, 40002 } redirect to :35000"));
        let v6 = CaptureRule {
            target: "fd00::2".parse().unwrap(),
            ..rule
        };
        assert!(v6.install_script().contains("ip6 daddr fd00::2"));
    }

    #[test]
    fn parses_owned_tables() {
        let text = "table ip filter\ntable ip rdma_gw_a\ntable ip6 rdma_gw_b\n";
        assert_eq!(
            parse_tables(text),
            vec![
                ("ip".to_string(), "rdma_gw_a".to_string()),
                ("ip6".to_string(), "rdma_gw_b".to_string())
            ]
        );
    }
}
