//! The helper's way to the daemon: one datagram socket per CPU queue, and
//! a send that never blocks the thread that makes it.
//!
//! A record goes straight into its socket when there is room (no thread
//! hop on a miss; the daemon's receiver of that socket is pinned to that
//! CPU, so its wake-up stays there). When the socket is full, the record
//! goes to the forwarder thread (`plane-forward`), which may block — on
//! *the same socket*: the daemon answers a ring worker's miss (its
//! verdict) on the socket the miss came in on, and only the worker of that
//! queue waits for it. A miss moved to another queue's socket had its
//! verdict read, and dropped, by a worker that never asked for it, and the
//! faulting vCPU waited forever. While records of a socket wait in the
//! forwarder, later ones of that socket queue behind them, so each socket
//! keeps its order.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread;

thread_local! {
    /// The ring queue a pinned ring worker serves: its forwards go on that
    /// queue's socket, where its verdicts come back.
    pub(super) static QUEUE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The daemon's sockets and the forwarder behind them.
#[derive(Clone)]
pub(super) struct ToDaemon {
    /// One per CPU queue (the daemon pins socket `i`'s receiver to CPU `i`).
    socks: Arc<Vec<File>>,
    /// Records per socket handed to the forwarder and not yet written.
    queued: Arc<Vec<AtomicUsize>>,
    forwarder: Sender<(usize, Vec<u8>)>,
}

impl ToDaemon {
    /// The way to the daemon over `socks`; starts the forwarder thread.
    pub(super) fn start(socks: Arc<Vec<File>>) -> io::Result<ToDaemon> {
        let (tx, rx) = mpsc::channel();
        let queued: Arc<Vec<AtomicUsize>> =
            Arc::new(socks.iter().map(|_| AtomicUsize::new(0)).collect());
        let (s, q) = (socks.clone(), queued.clone());
        // A forwarder that blocks on a full socket holds up no reader.
        thread::Builder::new()
            .name("plane-forward".into())
            .spawn(move || forward(&s, &q, rx))?;
        Ok(ToDaemon {
            socks,
            queued,
            forwarder: tx,
        })
    }

    /// Sockets, one per CPU queue.
    pub(super) fn sockets(&self) -> usize {
        self.socks.len()
    }

    /// Socket `queue` (a ring worker's, for its verdicts).
    pub(super) fn socket(&self, queue: usize) -> Option<&File> {
        self.socks.get(queue)
    }

    /// The socket of the caller's ring queue, else of the CPU it runs on.
    fn index(&self) -> usize {
        let i = QUEUE.with(std::cell::Cell::get).unwrap_or_else(|| {
            // SAFETY: sched_getcpu takes no arguments; -1 means unknown.
            let cpu = unsafe { libc::sched_getcpu() };
            usize::try_from(cpu).unwrap_or(0)
        });
        i % self.socks.len().max(1)
    }

    /// Sends one record on the caller's socket; false once the daemon is
    /// gone.
    pub(super) fn send(&self, msg: Vec<u8>) -> bool {
        let i = self.index();
        let (Some(sock), Some(queued)) = (self.socks.get(i), self.queued.get(i)) else {
            return false;
        };
        if queued.load(Ordering::Acquire) == 0 {
            match send_now(sock, &msg) {
                Ok(()) => return true,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) => {}
                Err(_) => return false,
            }
        }
        queued.fetch_add(1, Ordering::AcqRel);
        if self.forwarder.send((i, msg)).is_ok() {
            return true;
        }
        queued.fetch_sub(1, Ordering::AcqRel);
        false
    }
}

/// Sends one record on `sock` without waiting (`EAGAIN`: no room).
pub(super) fn send_now(sock: &File, msg: &[u8]) -> io::Result<()> {
    // SAFETY: a non-blocking send of a valid buffer on an open socket.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one record from `sock` into `buf` without waiting: its length
/// (0: the peer is gone; `EAGAIN`: nothing there).
pub(super) fn recv_now(sock: &File, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a non-blocking receive into `buf`, valid for its length.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// The forwarder: writes each record on its own socket, in the order
/// handed over, blocking while that socket is full.
fn forward(socks: &[File], queued: &[AtomicUsize], rx: Receiver<(usize, Vec<u8>)>) {
    for (i, msg) in rx {
        let (Some(mut sock), Some(count)) = (socks.get(i), queued.get(i)) else {
            continue;
        };
        let written = sock.write(&msg);
        count.fetch_sub(1, Ordering::AcqRel);
        if written.is_err() {
            // The daemon is gone: the main thread ends the process.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::helper_link::seqpacket_pair;
    use std::time::{Duration, Instant};

    /// Two socket pairs of the helper's kind: its ends and the daemon's.
    fn pairs() -> (Arc<Vec<File>>, Vec<File>) {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let (a, b) = seqpacket_pair().unwrap();
            ours.push(a);
            theirs.push(b);
        }
        (Arc::new(ours), theirs)
    }

    /// Fills `sock` until a send would block; returns the records sent.
    fn fill(sock: &File) -> usize {
        let filler = [0u8; 512];
        for n in 0..1_000_000 {
            if send_now(sock, &filler).is_err() {
                return n;
            }
        }
        panic!("the socket never filled");
    }

    /// Receives from `sock` without waiting: a record, or none.
    fn recv_one(sock: &File) -> Option<Vec<u8>> {
        let mut buf = [0u8; 1024];
        recv_now(sock, &mut buf).ok().map(|n| buf[..n].to_vec())
    }

    /// Reads `sock`'s records until `want` have come or 5 s passed.
    fn drain(sock: &File, want: usize) -> Vec<Vec<u8>> {
        let t = Instant::now();
        let mut got = Vec::new();
        while got.len() < want && t.elapsed() < Duration::from_secs(5) {
            match recv_one(sock) {
                Some(m) => got.push(m),
                None => thread::sleep(Duration::from_millis(1)),
            }
        }
        got
    }

    #[test]
    fn a_full_sockets_records_reach_that_socket_in_order() {
        let (socks, theirs) = pairs();
        let to = ToDaemon::start(socks.clone()).unwrap();
        let filled = fill(&socks[1]);
        QUEUE.with(|c| c.set(Some(1)));
        let sent: Vec<Vec<u8>> = (0..4u8).map(|k| vec![b'r', k]).collect();
        for m in &sent {
            assert!(to.send(m.clone()));
        }
        // The daemon reads socket 1: the filler, then the four records in
        // the order sent (a verdict comes back where its miss went).
        let got = drain(&theirs[1], filled + 4);
        let records: Vec<Vec<u8>> = got.into_iter().filter(|m| m.len() == 2).collect();
        assert_eq!(records, sent);
        assert_eq!(
            recv_one(&theirs[0]),
            None,
            "a record of queue 1 on socket 0"
        );
        // Drained: a send goes straight to the socket again.
        assert!(to.send(vec![b'd']));
        assert_eq!(drain(&theirs[1], 1), vec![vec![b'd']]);
        QUEUE.with(|c| c.set(None));
    }
}
