//! nf_tables over netlink, just what a capture table needs: a `NETLINK_NETFILTER` socket
//! opened in a network namespace, and batches of `NEWTABLE`/`NEWCHAIN`/`NEWRULE`/`DELTABLE`
//! messages sent on it, each acknowledged by the kernel.
//!
//! Why not the `nft` program: a table created with the `owner` flag (Linux >= 5.12) belongs to
//! the netlink socket that created it, only that socket may change it, and the kernel removes
//! it when the socket closes, so when the process holding it dies however it dies. The socket
//! must therefore live as long as the table, in this process ([`NfSocket`]), which a short
//! `nft -f -` run cannot give (see docs/decisions.md).
//!
//! The layouts are the kernel's (`include/uapi/linux/netfilter/nf_tables.h`, `nfnetlink.h`,
//! `netlink.h`): a message is an `nlmsghdr` (16 bytes), an `nfgenmsg` (4 bytes: family,
//! version 0, resource id big-endian), then attributes (`nlattr`: length u16, type u16, value,
//! padded to 4 bytes); nested attributes carry `NLA_F_NESTED`. Numbers inside nf_tables
//! attributes are big-endian.

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd},
    path::Path,
    time::Duration,
};

use nix::sys::{
    socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto,
        setsockopt, socket, sockopt,
    },
    time::TimeVal,
};

use super::netns::{self, NetnsError};

// netlink.h
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 0x2;
const NLMSG_DONE: u16 = 0x3;
const NLA_F_NESTED: u16 = 0x8000;
// nfnetlink.h
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
// nf_tables.h: messages
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
// tables
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
/// `NFT_TABLE_F_OWNER`.
pub const TABLE_F_OWNER: u32 = 0x2;
// chains
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
/// `NF_INET_LOCAL_OUT`.
pub const HOOK_OUTPUT: u32 = 3;
/// `NF_ACCEPT`.
pub const POLICY_ACCEPT: u32 = 1;
// rules and expressions
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
/// `NFT_REG_VERDICT`, `NFT_REG_1`.
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
/// `NFT_RETURN`.
const VERDICT_RETURN: i32 = -5;

/// `enum nft_meta_keys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKey {
    Mark = 3,
    L4Proto = 16,
}

/// `enum nft_payload_bases`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadBase {
    Network = 1,
    Transport = 2,
}

/// One expression of a rule (what a capture rule needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `meta load <key> => reg 1`
    Meta(MetaKey),
    /// `payload load <len>b @ <base> + <offset> => reg 1`
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
    },
    /// `cmp eq reg 1 <bytes>`
    CmpEq(Vec<u8>),
    /// `immediate reg 1 <bytes>`
    Load(Vec<u8>),
    /// `immediate reg 0 return`
    Return,
    /// `redir proto_min reg 1`
    RedirectToReg1,
}

/// Why a netlink exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetlinkError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("netlink socket")]
    Socket(#[source] io::Error),
    #[error("netlink send")]
    Send(#[source] io::Error),
    #[error("netlink receive (no answer from the kernel?)")]
    Receive(#[source] io::Error),
    /// The kernel refused a message of the batch (the whole batch was not applied).
    #[error("the kernel refused {what}")]
    Refused {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("malformed netlink answer")]
    Malformed,
}

/// Attribute writer over a message buffer.
struct Attrs<'a>(&'a mut Vec<u8>);

impl Attrs<'_> {
    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    fn put(&mut self, kind: u16, value: &[u8]) {
        let len = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(value);
        self.pad();
    }

    fn str(&mut self, kind: u16, value: &str) {
        let mut v = value.as_bytes().to_vec();
        v.push(0);
        self.put(kind, &v);
    }

    fn u32(&mut self, kind: u16, value: u32) {
        self.put(kind, &value.to_be_bytes());
    }

    /// A nested attribute whose contents `f` writes.
    fn nest(&mut self, kind: u16, f: impl FnOnce(&mut Attrs<'_>)) {
        let start = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        f(&mut Attrs(self.0));
        let len = u16::try_from(self.0.len() - start).unwrap_or(u16::MAX);
        self.0[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn data_value(&mut self, kind: u16, bytes: &[u8]) {
        self.nest(kind, |a| a.put(NFTA_DATA_VALUE, bytes));
    }

    fn expr(&mut self, expr: &Expr) {
        self.nest(NFTA_LIST_ELEM, |a| {
            a.str(NFTA_EXPR_NAME, expr.name());
            a.nest(NFTA_EXPR_DATA, |a| a.expr_data(expr));
        });
    }

    fn expr_data(&mut self, expr: &Expr) {
        match expr {
            Expr::Meta(key) => {
                self.u32(NFTA_META_KEY, *key as u32);
                self.u32(NFTA_META_DREG, REG_1);
            }
            Expr::Payload { base, offset, len } => {
                self.u32(NFTA_PAYLOAD_DREG, REG_1);
                self.u32(NFTA_PAYLOAD_BASE, *base as u32);
                self.u32(NFTA_PAYLOAD_OFFSET, *offset);
                self.u32(NFTA_PAYLOAD_LEN, *len);
            }
            Expr::CmpEq(bytes) => {
                self.u32(NFTA_CMP_SREG, REG_1);
                self.u32(NFTA_CMP_OP, NFT_CMP_EQ);
                self.data_value(NFTA_CMP_DATA, bytes);
            }
            Expr::Load(bytes) => {
                self.u32(NFTA_IMMEDIATE_DREG, REG_1);
                self.data_value(NFTA_IMMEDIATE_DATA, bytes);
            }
            Expr::Return => {
                self.u32(NFTA_IMMEDIATE_DREG, REG_VERDICT);
                self.nest(NFTA_IMMEDIATE_DATA, |a| {
                    a.nest(NFTA_DATA_VERDICT, |a| {
                        a.put(NFTA_VERDICT_CODE, &VERDICT_RETURN.to_be_bytes());
                    });
                });
            }
            Expr::RedirectToReg1 => self.u32(NFTA_REDIR_REG_PROTO_MIN, REG_1),
        }
    }
}

impl Expr {
    /// The kernel's name of the expression.
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta(_) => "meta",
            Expr::Payload { .. } => "payload",
            Expr::CmpEq(_) => "cmp",
            Expr::Load(_) | Expr::Return => "immediate",
            Expr::RedirectToReg1 => "redir",
        }
    }
}

/// A base chain: `type <kind> hook <hook> priority <priority>; policy <policy>;`.
#[derive(Debug, Clone, Copy)]
pub struct BaseChain<'a> {
    pub table: &'a str,
    pub name: &'a str,
    pub kind: &'a str,
    pub hook: u32,
    pub priority: i32,
    pub policy: u32,
}

/// One nf_tables batch: messages between `BATCH_BEGIN` and `BATCH_END`, applied by the kernel
/// as one transaction, each message acknowledged.
pub struct Batch {
    buf: Vec<u8>,
    seq: u32,
    /// Sequence number and description of each acknowledged message.
    acked: Vec<(u32, &'static str)>,
}

impl Batch {
    pub fn new() -> Batch {
        let mut b = Batch {
            buf: Vec::with_capacity(1024),
            seq: 1,
            acked: Vec::new(),
        };
        b.message(NFNL_MSG_BATCH_BEGIN, 0, 0, NFNL_SUBSYS_NFTABLES, |_| {});
        b
    }

    /// Appends a message; returns its sequence number.
    fn message(
        &mut self,
        kind: u16,
        flags: u16,
        family: u8,
        res_id: u16,
        attrs: impl FnOnce(&mut Attrs<'_>),
    ) -> u32 {
        let start = self.buf.len();
        let seq = self.seq;
        self.seq += 1;
        self.buf.extend_from_slice(&[0; 4]); // length, below
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf
            .extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        self.buf.extend_from_slice(&[family, 0]);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        attrs(&mut Attrs(&mut self.buf));
        let len = u32::try_from(self.buf.len() - start).unwrap_or(u32::MAX);
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        seq
    }

    fn nft(
        &mut self,
        msg: u16,
        flags: u16,
        family: u8,
        what: &'static str,
        attrs: impl FnOnce(&mut Attrs<'_>),
    ) {
        let seq = self.message(
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            NLM_F_ACK | flags,
            family,
            0,
            attrs,
        );
        self.acked.push((seq, what));
    }

    /// `add table <family> <name>` (with `flags`).
    pub fn new_table(&mut self, family: u8, name: &str, flags: u32) {
        self.nft(NFT_MSG_NEWTABLE, NLM_F_CREATE, family, "the table", |a| {
            a.str(NFTA_TABLE_NAME, name);
            a.u32(NFTA_TABLE_FLAGS, flags);
        });
    }

    /// `delete table <family> <name>`.
    pub fn delete_table(&mut self, family: u8, name: &str) {
        self.nft(NFT_MSG_DELTABLE, 0, family, "the table's removal", |a| {
            a.str(NFTA_TABLE_NAME, name);
        });
    }

    /// `add chain` of a base chain.
    pub fn new_base_chain(&mut self, family: u8, chain: &BaseChain<'_>) {
        self.nft(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, "the chain", |a| {
            a.str(NFTA_CHAIN_TABLE, chain.table);
            a.str(NFTA_CHAIN_NAME, chain.name);
            a.nest(NFTA_CHAIN_HOOK, |a| {
                a.u32(NFTA_HOOK_HOOKNUM, chain.hook);
                a.put(NFTA_HOOK_PRIORITY, &chain.priority.to_be_bytes());
            });
            a.u32(NFTA_CHAIN_POLICY, chain.policy);
            a.str(NFTA_CHAIN_TYPE, chain.kind);
        });
    }

    /// A rule appended to `chain`.
    pub fn new_rule(&mut self, family: u8, table: &str, chain: &str, exprs: &[Expr]) {
        self.nft(
            NFT_MSG_NEWRULE,
            NLM_F_CREATE | 0x800, // NLM_F_APPEND
            family,
            "a rule",
            |a| {
                a.str(NFTA_RULE_TABLE, table);
                a.str(NFTA_RULE_CHAIN, chain);
                a.nest(NFTA_RULE_EXPRESSIONS, |a| {
                    for e in exprs {
                        a.expr(e);
                    }
                });
            },
        );
    }

    /// The batch's bytes, closed with `BATCH_END`.
    fn finish(mut self) -> (Vec<u8>, Vec<(u32, &'static str)>) {
        self.message(NFNL_MSG_BATCH_END, 0, 0, NFNL_SUBSYS_NFTABLES, |_| {});
        (self.buf, self.acked)
    }
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::new()
    }
}

/// A `NETLINK_NETFILTER` socket in one network namespace. Tables it creates with
/// [`TABLE_F_OWNER`] are the kernel's to remove when it closes.
#[derive(Debug)]
pub struct NfSocket(OwnedFd);

/// How long the kernel may take to answer a batch.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

impl NfSocket {
    /// Opens a socket in the network namespace at `ns` (sockets stay in the namespace they
    /// were made in).
    pub fn open_in(ns: &Path) -> Result<NfSocket, NetlinkError> {
        netns::run_in(ns, NfSocket::open)?
    }

    /// Opens a socket in this thread's network namespace.
    pub fn open() -> Result<NfSocket, NetlinkError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(|e| NetlinkError::Socket(e.into()))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
            .map_err(|e| NetlinkError::Socket(e.into()))?;
        setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &TimeVal::new(ANSWER_TIMEOUT.as_secs().try_into().unwrap_or(5), 0),
        )
        .map_err(|e| NetlinkError::Socket(e.into()))?;
        Ok(NfSocket(fd))
    }

    /// Sends `batch` and waits for every message's acknowledgement; the first refusal is the
    /// error (the kernel then applied none of the batch).
    pub fn apply(&self, batch: Batch) -> Result<(), NetlinkError> {
        let (bytes, acked) = batch.finish();
        sendto(
            self.0.as_raw_fd(),
            &bytes,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map_err(|e| NetlinkError::Send(e.into()))?;
        let mut waiting: Vec<(u32, &'static str)> = acked;
        let mut refused: Option<NetlinkError> = None;
        let mut buf = vec![0u8; 16 * 1024];
        while !waiting.is_empty() {
            let n = recv(self.0.as_raw_fd(), &mut buf, MsgFlags::empty())
                .map_err(|e| NetlinkError::Receive(e.into()))?;
            for (seq, error) in parse_acks(&buf[..n])? {
                let Some(i) = waiting.iter().position(|(s, _)| *s == seq) else {
                    continue;
                };
                let (_, what) = waiting.swap_remove(i);
                if error != 0 && refused.is_none() {
                    refused = Some(NetlinkError::Refused {
                        what,
                        source: io::Error::from_raw_os_error(error.saturating_abs()),
                    });
                }
            }
        }
        refused.map_or(Ok(()), Err)
    }
}

/// The `(sequence, error)` of each `NLMSG_ERROR` (an acknowledgement when the error is 0) in a
/// datagram of netlink messages.
fn parse_acks(mut data: &[u8]) -> Result<Vec<(u32, i32)>, NetlinkError> {
    let mut out = Vec::new();
    while data.len() >= 16 {
        let word = |at: usize| -> Result<[u8; 4], NetlinkError> {
            data.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .ok_or(NetlinkError::Malformed)
        };
        let len = u32::from_ne_bytes(word(0)?) as usize;
        if len < 16 || len > data.len() {
            return Err(NetlinkError::Malformed);
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        match kind {
            NLMSG_ERROR => {
                // The error, then the header of the message it answers (its sequence number
                // at offset 8 of that header).
                let error = i32::from_ne_bytes(word(16)?);
                let seq = u32::from_ne_bytes(word(20 + 8)?);
                out.push((seq, error));
            }
            NLMSG_DONE => {}
            _ => {}
        }
        let step = (len + 3) & !3;
        data = data.get(step..).unwrap_or_default();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_has_the_kernels_layout() {
        let mut b = Batch::new();
        b.delete_table(2, "t");
        let (bytes, acked) = b.finish();
        // BATCH_BEGIN: 20 bytes, res id NFTABLES big-endian.
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 0x10);
        assert_eq!(&bytes[18..20], &[0, 10]);
        // DELTABLE: header, nfgenmsg (family 2), NFTA_TABLE_NAME "t\0" padded to 8.
        let m = &bytes[20..];
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 28);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), (10 << 8) | 2);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(m[16], 2);
        assert_eq!(&m[20..28], &[6, 0, 1, 0, b't', 0, 0, 0]);
        assert_eq!(acked, [(2, "the table's removal")]);
        // BATCH_END closes it.
        assert_eq!(u16::from_ne_bytes([bytes[52], bytes[53]]), 0x11);
        assert_eq!(bytes.len(), 68);
    }

    #[test]
    fn acks_and_errors_are_read_with_bounds_checks() {
        let mut msg = Vec::new();
        for (seq, error) in [(2u32, 0i32), (3, -1)] {
            msg.extend_from_slice(&36u32.to_ne_bytes());
            msg.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            msg.extend_from_slice(&[0; 10]);
            msg.extend_from_slice(&error.to_ne_bytes());
            msg.extend_from_slice(&[0; 8]);
            msg.extend_from_slice(&seq.to_ne_bytes());
            msg.extend_from_slice(&[0; 4]);
        }
        assert_eq!(parse_acks(&msg).unwrap(), [(2, 0), (3, -1)]);
        assert!(parse_acks(&msg[..30]).is_err());
        let mut bad = msg.clone();
        bad[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(parse_acks(&bad).is_err());
        assert!(parse_acks(&[]).unwrap().is_empty());
    }
}
