//! Work requests and their completions (net/smc's `smc_wr.c`): the ids our sends and receives
//! carry, and what a completion from the CQ is, told from those ids and the device's opcode.
//!
//! A connection posts through [`Post`] and takes its completions through [`Completions`]: the
//! device's queue pair and CQ, or in tests the simulated fabric (`sim.rs`), which lets the
//! halves and the connection's life run in-process against a peer.
//!
//! A send's id is a tag in its top bits and a sequence in the rest: a data write carries the
//! stream position after it, a control message its sequence number, a probe nothing. A receive's
//! id is its control slot (tag 0). An error completion's opcode is undefined (verbs), so a failed
//! request is named from its id alone; a successful receive is a control message (`IBV_WC_RECV`)
//! or the peer's data write (`IBV_WC_RECV_RDMA_WITH_IMM`), by its opcode.

use std::io;

use crate::rdma::{Cq, Local, Qp, WC_RECV, WC_SUCCESS, Wc};

/// What a connection posts its work requests on (see the module docs).
pub(super) trait Post: Send + Sync {
    /// RDMA WRITE WITH IMMEDIATE of `local` to `remote_addr` (`rkey`); a completion only when
    /// `signaled` (or on an error).
    fn write_imm(
        &self,
        wr_id: u64,
        local: Local,
        remote: (u64, u32),
        imm: u32,
        signaled: bool,
    ) -> io::Result<()>;
    /// A zero-length RDMA WRITE to `remote_addr` (`rkey`), signaled: a liveness probe.
    fn write_probe(&self, wr_id: u64, remote: (u64, u32)) -> io::Result<()>;
    /// SEND of `local`; a completion only when `signaled` (or on an error).
    fn send(&self, wr_id: u64, local: Local, signaled: bool) -> io::Result<()>;
    /// A receive into `local`.
    fn recv(&self, wr_id: u64, local: Local) -> io::Result<()>;
}

impl Post for Qp {
    fn write_imm(
        &self,
        wr_id: u64,
        local: Local,
        (addr, rkey): (u64, u32),
        imm: u32,
        signaled: bool,
    ) -> io::Result<()> {
        Qp::write_imm(self, wr_id, local, addr, rkey, imm, signaled)
    }

    fn write_probe(&self, wr_id: u64, (addr, rkey): (u64, u32)) -> io::Result<()> {
        Qp::write_probe(self, wr_id, addr, rkey)
    }

    fn send(&self, wr_id: u64, local: Local, signaled: bool) -> io::Result<()> {
        Qp::send(self, wr_id, local, signaled)
    }

    fn recv(&self, wr_id: u64, local: Local) -> io::Result<()> {
        Qp::recv(self, wr_id, local)
    }
}

/// Where a connection's completions come from (see the module docs).
pub(super) trait Completions {
    /// Up to `out.len()` completions; how many were written.
    fn poll(&mut self, out: &mut [Wc]) -> io::Result<usize>;
    /// Signal the channel at the next completion.
    fn arm(&mut self) -> io::Result<()>;
    /// [`Completions::arm`] has something to do: an event was taken since the last arm.
    fn arm_needed(&self) -> bool;
    /// One completion event was taken for this queue.
    fn note_event(&mut self);
}

impl Completions for Cq {
    fn poll(&mut self, out: &mut [Wc]) -> io::Result<usize> {
        Cq::poll(self, out)
    }

    fn arm(&mut self) -> io::Result<()> {
        Cq::arm(self)
    }

    fn arm_needed(&self) -> bool {
        Cq::arm_needed(self)
    }

    fn note_event(&mut self) {
        Cq::note_event(self);
    }
}

const TAG_SHIFT: u32 = 60;
const TAG_MASK: u64 = (1 << TAG_SHIFT) - 1;
/// The id tag of data writes (the rest: the stream position after the write).
pub(super) const TAG_DATA: u64 = 1 << TAG_SHIFT;
/// The id tag of control messages (the rest: the message's sequence number).
pub(super) const TAG_CONTROL: u64 = 2 << TAG_SHIFT;
/// The id tag of probes.
pub(super) const TAG_PROBE: u64 = 3 << TAG_SHIFT;

/// What one completion is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Completion {
    /// A control message from the peer arrived in receive `slot`, `len` bytes.
    Control { slot: u64, len: usize },
    /// The peer's data write consumed receive `slot`: `len` bytes with immediate `imm` (None:
    /// the write carried none).
    Data {
        slot: u64,
        len: u32,
        imm: Option<u32>,
    },
    /// A signaled send completed (`probe`: our probe), and with it every send before it.
    Sent { probe: bool },
    /// A work request failed.
    Failed { status: u32, wr_id: u64 },
}

impl Completion {
    pub(super) fn of(wc: &Wc) -> Completion {
        if wc.status != WC_SUCCESS {
            return Completion::Failed {
                status: wc.status,
                wr_id: wc.wr_id,
            };
        }
        if wc.opcode & WC_RECV != 0 {
            let slot = wc.wr_id;
            return if wc.opcode == WC_RECV {
                Completion::Control {
                    slot,
                    len: wc.byte_len as usize,
                }
            } else {
                Completion::Data {
                    slot,
                    len: wc.byte_len,
                    imm: wc.has_imm.then_some(wc.imm),
                }
            };
        }
        Completion::Sent {
            probe: wc.wr_id & !TAG_MASK == TAG_PROBE,
        }
    }
}

/// A failed request in a few words (for error reports).
pub(super) fn failure(status: u32, wr_id: u64) -> String {
    format!(
        "work completion failed: {} (status {status}) on {}",
        status_name(status),
        request_name(wr_id)
    )
}

/// Which work request an id is for, in a few words.
fn request_name(wr_id: u64) -> String {
    let n = wr_id & TAG_MASK;
    match wr_id & !TAG_MASK {
        0 => format!("receive {n}"),
        TAG_DATA => format!("the data write ending at byte {n}"),
        TAG_CONTROL => format!("control message {n}"),
        TAG_PROBE => String::from("a probe"),
        _ => format!("work request {wr_id:#x}"),
    }
}

/// A readable name for a work completion status.
fn status_name(status: u32) -> &'static str {
    match status {
        1 => "local length error",
        2 => "local QP operation error",
        4 => "local protection error",
        5 => "work request flushed",
        7 => "bad response",
        8 => "local access error",
        9 => "remote invalid request",
        10 => "remote access error",
        11 => "remote operation error",
        12 => "transport retry counter exceeded (peer unreachable)",
        13 => "RNR retry counter exceeded",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::WC_RECV_RDMA_WITH_IMM;

    fn wc(wr_id: u64, status: u32, opcode: u32) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            byte_len: 48,
            imm: 7,
            has_imm: true,
        }
    }

    #[test]
    fn completions_are_told_apart_by_opcode_then_id() {
        assert_eq!(
            Completion::of(&wc(3, WC_SUCCESS, WC_RECV)),
            Completion::Control { slot: 3, len: 48 }
        );
        assert_eq!(
            Completion::of(&wc(4, WC_SUCCESS, WC_RECV_RDMA_WITH_IMM)),
            Completion::Data {
                slot: 4,
                len: 48,
                imm: Some(7)
            }
        );
        let mut no_imm = wc(4, WC_SUCCESS, WC_RECV_RDMA_WITH_IMM);
        no_imm.has_imm = false;
        assert!(matches!(
            Completion::of(&no_imm),
            Completion::Data { imm: None, .. }
        ));
        // Sends: the opcode of a send completion is not a receive's.
        assert_eq!(
            Completion::of(&wc(TAG_PROBE, WC_SUCCESS, 3)),
            Completion::Sent { probe: true }
        );
        assert_eq!(
            Completion::of(&wc(TAG_DATA | 4096, WC_SUCCESS, 3)),
            Completion::Sent { probe: false }
        );
    }

    #[test]
    fn a_failure_is_named_from_its_id_whatever_its_opcode() {
        // An error completion's opcode is undefined: a receive's opcode on a data write's id.
        let c = Completion::of(&wc(TAG_DATA | 4096, 12, WC_RECV));
        let Completion::Failed { status, wr_id } = c else {
            panic!("{c:?}")
        };
        let text = failure(status, wr_id);
        assert!(text.contains("transport retry counter exceeded"), "{text}");
        assert!(
            text.contains("the data write ending at byte 4096"),
            "{text}"
        );
        assert!(failure(5, 9).contains("flushed (status 5) on receive 9"));
        assert!(failure(10, TAG_CONTROL | 2).contains("control message 2"));
        assert!(failure(99, 7 << TAG_SHIFT).contains("work request 0x7"));
    }
}
