//! `READ` and `WRITE`: a pool miss timed by the backend, a calibration
//! read stamped for the calibrator, and a write-back charged as NAND
//! programs.

use super::{finish, Outcome, Server};
use crate::fuse_plane::{CALIB_NODEID, POOL_NODEID};
use crate::pace::Compensation;
use crate::{Miss, MissData, PAGE_SIZE};
use fuse_abi::{self as abi, encode_write_out, Cursor, InHeader, ReadIn, WriteIn};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

/// Least hold of a calibration reply through a split plane's ring: more
/// than the daemon's answer takes to reach the helper (10–20 µs on a busy
/// 2-vCPU host).
const RING_CALIB_HOLD_NS: u64 = 50_000;

/// Reads `buf.len()` bytes of `file` at `offset` (zeros past its end).
pub(crate) fn read_full(file: &std::fs::File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

impl Server {
    /// `READ`: of the pool, a miss timed by the backend, released at its
    /// modeled completion less the floor; of the calibration file, see
    /// [`Server::calibration_read`].
    pub(super) fn read(
        &self,
        h: &InHeader,
        args: &mut Cursor<'_>,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        let r: ReadIn = args.read().map_err(|_| libc::EINVAL)?;
        match h.nodeid {
            POOL_NODEID => {}
            CALIB_NODEID => return self.calibration_read(h, &r, arrival_ns, out),
            abi::ROOT_ID => return Err(libc::EISDIR),
            _ => return Err(libc::ENOENT),
        }
        let len = u64::from(r.size).min(self.size.saturating_sub(r.offset)) as usize;
        out.resize(abi::OUT_HEADER_LEN + len, 0);
        if len == 0 {
            finish(out, h.unique)?;
            return Ok(Outcome::Reply);
        }
        if self.refuse_here
            && self
                .readahead
                .as_ref()
                .is_some_and(|g| g.refuse(r.offset, len as u64))
        {
            return Err(libc::EIO);
        }
        let vm = self.vms.resolve(h.pid);
        let miss = Miss {
            pool_offset: r.offset,
            len: len as u32,
            pid: h.pid,
            vm,
            arrival_ns,
        };
        let dst = &mut out[abi::OUT_HEADER_LEN..];
        let reply = match self.backend.on_miss(&miss, dst) {
            Ok(reply) => reply,
            Err(crate::ServeMissError::NotHeld) => return Err(libc::EIO),
            Err(e) => {
                tracing::warn!(offset = r.offset, len, error = %e, "pool miss failed");
                self.metrics.trap_error();
                return Err(libc::EIO);
            }
        };
        match reply.data {
            MissData::InPlace { len: n } => dst[n.min(len)..].fill(0),
            MissData::Bytes(b) => {
                let n = b.len().min(len);
                dst[..n].copy_from_slice(&b[..n]);
                dst[n..].fill(0);
            }
            MissData::Zeros => dst.fill(0),
            MissData::File { file, offset } => {
                if let Err(e) = read_full(&file, dst, offset) {
                    tracing::warn!(offset = r.offset, error = %e, "reading pool data failed");
                    self.metrics.trap_error();
                    return Err(e.raw_os_error().unwrap_or(libc::EIO));
                }
            }
        }
        // The device made room for this page; the room must be there
        // before the page is (see `backlog.rs`).
        self.backlog
            .wait_under_bound(crate::fuse_plane::backlog::MAX_WAIT);
        self.metrics.trap(vm, r.offset, len as u64);
        finish(out, h.unique)?;
        // Ahead of the modeled completion by the trap path's own cost
        // (the deadline itself with compensation off).
        let release = self
            .metrics
            .floor
            .release_at(arrival_ns, reply.completes_at_ns);
        if self.metrics.floor.mode() == Compensation::Auto {
            // A VMM's thread waits for this reply: the gap to its next
            // miss bounds the floor (`pace::Floor::observe_gap`).
            if vm.is_some() && h.pid != 0 {
                if let Some(gap) = self.miss_gaps.miss(h.pid, arrival_ns, release) {
                    self.metrics.floor.observe_gap(gap);
                }
            }
            let hold = release.saturating_sub(arrival_ns);
            let old = self.calib.hold_ns.load(Ordering::Relaxed);
            let new = (old / 8).saturating_mul(7).saturating_add(hold / 8);
            self.calib.hold_ns.store(new, Ordering::Relaxed);
        }
        Ok(Outcome::ReplyAt(release))
    }

    /// A `READ` of the calibration file: zeros, never charged, never
    /// counted as a trap, stamped for the calibrator, and held as long as
    /// recent misses were (at once when they were not held).
    fn calibration_read(
        &self,
        h: &InHeader,
        r: &ReadIn,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        let len = u64::from(r.size).min(PAGE_SIZE.saturating_sub(r.offset)) as usize;
        out.resize(abi::OUT_HEADER_LEN + len, 0);
        out[abi::OUT_HEADER_LEN..].fill(0);
        finish(out, h.unique)?;
        let mut hold = self.calib.hold_ns.load(Ordering::Relaxed);
        if self.helper_ring_queues.load(Ordering::Acquire) > 0 {
            // A split plane's helper on a ring commits the reply when due,
            // after the daemon's answer has come back to it: held long
            // enough for that, the probe measures what a held miss feels
            // (the commit → mapped leg), not the trip back to the helper.
            hold = hold.max(RING_CALIB_HOLD_NS);
        }
        let due = arrival_ns.saturating_add(hold);
        let now = self.backend.now_ns();
        // A held reply is written when due (the pacing spins for it).
        let held = hold > 0 && due > now;
        self.calib.request_ns.store(arrival_ns, Ordering::Relaxed);
        self.calib
            .reply_ns
            .store(if held { due } else { now }, Ordering::Relaxed);
        self.calib.reads.fetch_add(1, Ordering::Release);
        Ok(if held {
            Outcome::ReplyAt(due)
        } else {
            Outcome::Reply
        })
    }

    /// `WRITE` of the pool: a write-back, answered when the backend says
    /// it is done.
    pub(super) fn write(
        &self,
        h: &InHeader,
        args: &mut Cursor<'_>,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        let (w, data) = WriteIn::parse_with_data(args).map_err(|_| libc::EINVAL)?;
        if h.nodeid != POOL_NODEID {
            return Err(libc::EBADF);
        }
        if !matches!(w.offset.checked_add(data.len() as u64), Some(e) if e <= self.size) {
            return Err(libc::EFBIG);
        }
        let done = match self.backend.on_writeback(w.offset, data, h.pid, arrival_ns) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(offset = w.offset, len = data.len(), error = %e, "pool write-back failed");
                return Err(e.errno());
            }
        };
        self.metrics.writeback(data.len() as u64);
        encode_write_out(w.size, out);
        finish(out, h.unique)?;
        Ok(Outcome::ReplyAt(done))
    }
}
