//! Per-migration nftables tables in virt-handler's network namespace.
//!
//! Each source migration gets one table, `ip rdma_gw_<uid>` (or `ip6`), with one NAT chain
//! on the `output` hook (virt-handler's own connections are locally generated):
//!
//! ```text
//! table ip rdma_gw_<uid> {
//!   flags owner
//!   chain out {
//!     type nat hook output priority -100; policy accept;
//!     meta mark 0x52474d57 return
//!     ip daddr <target> tcp dport <port> redirect to :<capture port>   (one rule per port)
//!   }
//! }
//! ```
//!
//! Only new connections to the target address on the published ports are redirected (NAT
//! applies to the first packet of a connection; established ones are untouched), and none
//! from a socket carrying the gateway's mark.
//!
//! The table is made over netlink ([`super::nfnetlink`]) with the `owner` flag (Linux >=
//! 5.12), on a netlink socket of its own that the gateway holds in an [`OwnedTable`]: only
//! that socket can change the table, and the kernel removes the table when the socket closes.
//! So a capture never outlives the gateway: dropping the [`OwnedTable`] (the migration ended)
//! removes it, and so does the gateway's death, however it dies (SIGKILL, OOM kill, a panic),
//! at once, without waiting for a restart. virt-handler's next connection then goes straight
//! to its destination.
//!
//! Tables of older gateways (made with `nft`, without the flag) are removed by their name
//! prefix at startup ([`remove_all`], with the `nft` program).

use std::{
    io::Write,
    net::IpAddr,
    path::Path,
    process::{Command, Stdio},
};

use super::netns::{self, NetnsError};
use super::nfnetlink::{
    BaseChain, Batch, Expr, HOOK_OUTPUT, MetaKey, NetlinkError, NfSocket, POLICY_ACCEPT,
    PayloadBase, TABLE_F_OWNER,
};

/// Prefix of every table the gateway owns.
pub const TABLE_PREFIX: &str = "rdma_gw_";

/// Why an nft call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NftError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
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

/// The netfilter family number (`NFPROTO_IPV4`, `NFPROTO_IPV6`).
fn nfproto(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 2,
        IpAddr::V6(_) => 10,
    }
}

/// The chain of a capture table.
pub const CHAIN: &str = "out";
/// The chain's priority (before the `dstnat` of other tables, -100: the same).
pub const PRIORITY: i32 = -100;

impl CaptureRule {
    /// The batch that creates the table, owned by the socket that sends it: a table of that
    /// name left by an older gateway (no owner) is replaced in the same transaction.
    pub fn install_batch(&self) -> Batch {
        let fam = nfproto(self.target);
        let mut b = Batch::new();
        b.new_table(fam, &self.table, 0);
        b.delete_table(fam, &self.table);
        b.new_table(fam, &self.table, TABLE_F_OWNER);
        b.new_base_chain(
            fam,
            &BaseChain {
                table: &self.table,
                name: CHAIN,
                kind: "nat",
                hook: HOOK_OUTPUT,
                priority: PRIORITY,
                policy: POLICY_ACCEPT,
            },
        );
        for rule in self.rules() {
            b.new_rule(fam, &self.table, CHAIN, &rule);
        }
        b
    }

    /// The chain's rules, as expressions.
    pub fn rules(&self) -> Vec<Vec<Expr>> {
        let mark = vec![
            Expr::Meta(MetaKey::Mark),
            Expr::CmpEq(self.mark.to_ne_bytes().to_vec()),
            Expr::Return,
        ];
        let (offset, addr) = match self.target {
            IpAddr::V4(v4) => (16, v4.octets().to_vec()),
            IpAddr::V6(v6) => (24, v6.octets().to_vec()),
        };
        let len = u32::try_from(addr.len()).unwrap_or(4);
        let mut rules = vec![mark];
        for port in &self.ports {
            rules.push(vec![
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    len,
                },
                Expr::CmpEq(addr.clone()),
                Expr::Meta(MetaKey::L4Proto),
                Expr::CmpEq(vec![libc::IPPROTO_TCP as u8]),
                Expr::Payload {
                    base: PayloadBase::Transport,
                    offset: 2,
                    len: 2,
                },
                Expr::CmpEq(port.to_be_bytes().to_vec()),
                Expr::Load(self.redirect_port.to_be_bytes().to_vec()),
                Expr::RedirectToReg1,
            ]);
        }
        rules
    }
}

/// A capture table owned by this process: removed when dropped (or with [`OwnedTable::remove`])
/// and by the kernel when the process dies.
#[derive(Debug)]
pub struct OwnedTable {
    socket: NfSocket,
    family: u8,
    name: String,
}

impl OwnedTable {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes the table now (it would go when dropped anyway; this reports an error).
    pub fn remove(self) -> Result<(), NftError> {
        let mut b = Batch::new();
        b.delete_table(self.family, &self.name);
        self.socket.apply(b)?;
        Ok(())
    }
}

/// Installs a capture rule in the namespace at `ns`, in a table owned by a new netlink socket.
pub fn install(ns: &Path, rule: &CaptureRule) -> Result<OwnedTable, NftError> {
    let socket = NfSocket::open_in(ns)?;
    socket.apply(rule.install_batch())?;
    Ok(OwnedTable {
        socket,
        family: nfproto(rule.target),
        name: rule.table.clone(),
    })
}

/// Runs `nft -f -` with `script` inside the namespace at `ns`.
fn apply(ns: &Path, script: String) -> Result<(), NftError> {
    netns::run_in(ns, move || nft(&["-f", "-"], Some(&script)))?.map(|_| ())
}

/// The gateway's tables in the namespace, as `(family, name)`.
pub fn list_owned(ns: &Path) -> Result<Vec<(String, String)>, NftError> {
    let out = netns::run_in(ns, || nft(&["list", "tables"], None))??;
    Ok(parse_tables(&out))
}

/// Removes every table of the gateway that no live gateway owns (an older gateway's, made
/// without the owner flag), each on its own (one owned by a live process cannot be removed and
/// is left); returns how many were removed.
pub fn remove_all(ns: &Path) -> Result<usize, NftError> {
    let mut removed = 0;
    for (fam, name) in list_owned(ns)? {
        match apply(ns, format!("delete table {fam} {name}\n")) {
            Ok(()) => removed += 1,
            Err(error) => tracing::info!(
                table = %name,
                error = %rdma_streams_common::report::Report(&error),
                "a capture table another process owns stays"
            ),
        }
    }
    Ok(removed)
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

    /// Migration u1's rule: two ports of 10.2.0.2 to port 35000.
    fn u1_rule() -> CaptureRule {
        CaptureRule {
            table: table_name("u1"),
            target: "10.2.0.2".parse().unwrap(),
            ports: vec![40001, 40002],
            redirect_port: 35000,
            mark: 0x52474d57,
        }
    }

    #[test]
    fn table_names_are_nft_identifiers() {
        assert_eq!(
            table_name("8f1c-22aa.b"),
            format!("{TABLE_PREFIX}8f1c_22aa_b")
        );
    }

    #[test]
    fn the_rules_redirect_only_the_ports_and_skip_the_mark() {
        let rule = u1_rule();
        let rules = rule.rules();
        assert_eq!(rules.len(), 3, "the mark, then one per port");
        assert_eq!(rules[0][2], Expr::Return);
        assert_eq!(rules[1][1], Expr::CmpEq(vec![10, 2, 0, 2]));
        assert_eq!(rules[2][5], Expr::CmpEq(40002u16.to_be_bytes().to_vec()));
        assert_eq!(rules[2][6], Expr::Load(35000u16.to_be_bytes().to_vec()));
        let v6 = CaptureRule {
            target: "fd00::2".parse().unwrap(),
            ..rule
        };
        assert_eq!(
            v6.rules()[1][0],
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 24,
                len: 16
            }
        );
    }

    #[test]
    fn an_owned_table_is_what_nft_would_write_and_goes_with_its_socket() {
        rdma_streams_testkit::within(std::time::Duration::from_secs(30), || {
            let ns = crate::testing::TestNetns::start();
            // A table of that name left by an older gateway (no owner) is replaced.
            ns.nft("add table ip rdma_gw_u1");
            let rule = u1_rule();
            let table = install(&ns.path(), &rule).unwrap();
            let text = ns.nft("list table ip rdma_gw_u1");
            for want in [
                "flags owner",
                "type nat hook output priority -100; policy accept;",
                "meta mark 0x52474d57 return",
                "ip daddr 10.2.0.2 tcp dport 40001 redirect to :35000",
                "ip daddr 10.2.0.2 tcp dport 40002 redirect to :35000",
            ] {
                assert!(text.contains(want), "{want:?} not in\n{text}");
            }
            // Nobody else may change it, nor remove it.
            let other = std::process::Command::new("nsenter")
                .arg(format!("--net={}", ns.path().display()))
                .args(["nft", "delete", "table", "ip", "rdma_gw_u1"])
                .output()
                .unwrap();
            assert!(
                !other.status.success(),
                "another process removed an owned table"
            );
            table.remove().unwrap();
            assert!(!ns.nft("list tables").contains("rdma_gw_u1"));
            // Dropped (the socket closes, as when the process dies): gone as well.
            let v6 = CaptureRule {
                table: table_name("u6"),
                target: "fd00::2".parse().unwrap(),
                ..rule
            };
            let table = install(&ns.path(), &v6).unwrap();
            let text = ns.nft("list table ip6 rdma_gw_u6");
            assert!(
                text.contains("ip6 daddr fd00::2 tcp dport 40001 redirect to :35000"),
                "{text}"
            );
            drop(table);
            assert!(!ns.nft("list tables").contains("rdma_gw_u6"));
        });
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
