//! FUSE over io_uring (protocol 7.42, Linux ≥ 6.14): the per-entry header
//! buffer a server registers and the command it puts in an SQE128's 80-byte
//! command area (`include/uapi/linux/fuse.h`, "fuse_uring").
//!
//! A server offers [`crate::init_flags::OVER_IO_URING`] in its INIT reply,
//! then registers entries (`IORING_OP_URING_CMD` on `/dev/fuse`,
//! `cmd_op` [`uring_cmd::REGISTER`], `addr`/`len` an iovec pair: the
//! [`UringReqHeader`] and a payload buffer). The kernel fills an entry with a
//! request (in-header in `in_out`, the opcode's fixed argument in `op_in`,
//! the rest in the payload) and completes its command; the server writes its
//! reply (out-header in `in_out`, the reply's arguments in the payload) and
//! commits it with [`uring_cmd::COMMIT_AND_FETCH`], which also fetches the
//! entry's next request.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Size of `fuse_uring_req_header.in_out` (`FUSE_URING_IN_OUT_HEADER_SZ`).
pub const URING_IN_OUT_HEADER_LEN: usize = 128;
/// Size of `fuse_uring_req_header.op_in` (`FUSE_URING_OP_IN_OUT_SZ`).
pub const URING_OP_IN_OUT_LEN: usize = 128;
/// iovecs a REGISTER carries: the header and the payload.
pub const URING_IOV_SEGS: u32 = 2;

/// `enum fuse_uring_cmd`: the `cmd_op` of an `IORING_OP_URING_CMD`.
pub mod uring_cmd {
    /// Registers an entry's buffers and waits for its first request.
    pub const REGISTER: u32 = 1;
    /// Commits the reply in an entry and waits for its next request.
    pub const COMMIT_AND_FETCH: u32 = 2;
}

/// `struct fuse_uring_ent_in_out`: the trailer of an entry's header,
/// written by the kernel with a request and by the server with its reply.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct UringEntInOut {
    /// Unused (0).
    pub flags: u64,
    /// The request's id, to be echoed in [`UringCmdReq::commit_id`].
    pub commit_id: u64,
    /// Bytes valid in the payload buffer (either direction).
    pub payload_sz: u32,
    /// Padding (0).
    pub padding: u32,
    /// Reserved (0).
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: `iov[0]` of a REGISTER.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringReqHeader {
    /// `fuse_in_header` with a request, `fuse_out_header` with a reply.
    pub in_out: [u8; URING_IN_OUT_HEADER_LEN],
    /// The request's fixed per-opcode argument (`in_args[0]`).
    pub op_in: [u8; URING_OP_IN_OUT_LEN],
    /// Payload size and commit id.
    pub ring_ent_in_out: UringEntInOut,
}

impl Default for UringReqHeader {
    fn default() -> Self {
        UringReqHeader {
            in_out: [0; URING_IN_OUT_HEADER_LEN],
            op_in: [0; URING_OP_IN_OUT_LEN],
            ring_ent_in_out: UringEntInOut::default(),
        }
    }
}

/// `struct fuse_uring_cmd_req`: the start of an SQE128's 80-byte command
/// area.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct UringCmdReq {
    /// Unused (0).
    pub flags: u64,
    /// COMMIT_AND_FETCH: the committed request's [`UringEntInOut::commit_id`].
    pub commit_id: u64,
    /// The queue (CPU) the entry belongs to.
    pub qid: u16,
    /// Padding (0).
    pub padding: [u8; 6],
}

impl UringCmdReq {
    /// The 80-byte command area of an SQE128 holding this command.
    pub fn command_area(&self) -> [u8; 80] {
        let mut area = [0u8; 80];
        area[..Self::SIZE].copy_from_slice(self.as_bytes());
        area
    }
}

wire! {
    UringEntInOut = 32, "fuse_uring_ent_in_out";
    UringReqHeader = 288, "fuse_uring_req_header";
    UringCmdReq = 24, "fuse_uring_cmd_req";
}
