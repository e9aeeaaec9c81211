#!/usr/bin/env python3
"""Check the DAX window of the patched QEMU (build-qemu.sh) without cxlfsd.

    qemu-configs/check-qemu-dax.py [--qemu PATH] [--image DIR] [--keep]

A minimal vhost-user back-end (just enough of the protocol for QEMU to start
the device; it never answers FUSE requests) is served on a socket, and

1. without a guest (QEMU -S): protocol feature SHMEM (22) is negotiated only
   for a device with cache-size, and SHMEM_MAP is refused without one; QEMU
   asks for the back-end's window (GET_SHMEM_CONFIG) only with a window, and
   refuses to start when the back-end's window is not cache-size, with a
   message that names both sizes;
2. with a guest (run-vm.sh, TCG): the guest's virtio_fs driver finds the
   window (shared memory capability, BAR 2); after `rmmod virtiofs` (the
   driver's reset drops all mappings) the back-end sends SHMEM_MAP/UNMAP
   requests (valid ones and ones that must fail: overlap, misaligned, outside
   the window, bad shmid, no fd, bad flags, unmap of something not mapped) and
   checks every reply; the guest then reads both mapped ranges through
   /dev/mem (data from the back-end's memfd) and writes one word, which the
   back-end sees in its memfd.

Prints PASS/FAIL lines; exit status 0 when everything passed.
"""
import argparse
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# vhost-user
HDR = struct.Struct("<III")
F_VERSION = 0x1
F_REPLY = 0x4
F_NEED_REPLY = 0x8
GET_FEATURES, GET_VRING_BASE, GET_PROTOCOL_FEATURES = 1, 11, 15
SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, SET_BACKEND_REQ_FD = 16, 17, 21
GET_SHMEM_CONFIG = 44
BACKEND_SHMEM_MAP, BACKEND_SHMEM_UNMAP = 9, 10
PF_REPLY_ACK, PF_BACKEND_REQ, PF_BACKEND_SEND_FD, PF_SHMEM = 3, 5, 10, 22
VIRTIO_F_VERSION_1, VHOST_USER_F_PROTOCOL_FEATURES = 32, 30
MMAP = struct.Struct("<B7xQQQQ")  # shmid, fd_offset, shm_offset, len, flags
MAP_RW = 1

MiB = 1 << 20
WINDOW = 64 * MiB
PATTERN_RW = b"CXLFSDAX"
PATTERN_RO = b"ROMAP-OK"
GUEST_WORD = 0x1122334455667788

results = []


def check(ok, what):
    results.append(bool(ok))
    print(("PASS " if ok else "FAIL ") + what, flush=True)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def recv_msg(sock):
    data, fds, _, _ = socket.recv_fds(sock, HDR.size, 8)
    if not data:
        raise EOFError
    data += recv_exact(sock, HDR.size - len(data)) if len(data) < HDR.size else b""
    req, flags, size = HDR.unpack(data)
    return req, flags, recv_exact(sock, size) if size else b"", fds


class Backend:
    """Serves one vhost-user connection: accepts everything, answers gets."""

    def __init__(self, path, window=WINDOW):
        self.path = path
        self.window = window
        self.shmem_config_asked = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.acked_protocol = None
        self.backend_sock = None
        self.have_backend = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        conn, _ = self.listener.accept()
        try:
            while True:
                req, flags, payload, fds = recv_msg(conn)
                reply = None
                if req == GET_FEATURES:
                    reply = struct.pack("<Q", (1 << VIRTIO_F_VERSION_1) | (1 << VHOST_USER_F_PROTOCOL_FEATURES))
                elif req == GET_PROTOCOL_FEATURES:
                    reply = struct.pack("<Q", (1 << PF_REPLY_ACK) | (1 << PF_BACKEND_REQ)
                                        | (1 << PF_BACKEND_SEND_FD) | (1 << PF_SHMEM))
                elif req == SET_PROTOCOL_FEATURES:
                    self.acked_protocol = struct.unpack("<Q", payload[:8])[0]
                elif req == GET_QUEUE_NUM:
                    reply = struct.pack("<Q", 1)
                elif req == GET_VRING_BASE:
                    reply = struct.pack("<II", struct.unpack("<I", payload[:4])[0], 0)
                elif req == SET_BACKEND_REQ_FD:
                    self.backend_sock = socket.socket(fileno=fds.pop(0))
                elif req == GET_SHMEM_CONFIG:
                    # { u32 nregions; u32 padding; u64 memory_sizes[256] }
                    self.shmem_config_asked += 1
                    reply = struct.pack("<II256Q", 1, 0, self.window, *([0] * 255))
                if reply is None and flags & F_NEED_REPLY:
                    reply = struct.pack("<Q", 0)
                if reply is not None:
                    conn.sendall(HDR.pack(req, F_VERSION | F_REPLY, len(reply)) + reply)
                if req == SET_BACKEND_REQ_FD:
                    self.have_backend.set()
                for fd in fds:
                    os.close(fd)
        except (EOFError, OSError):
            pass

    def request(self, req, shmid, fd_offset, shm_offset, length, flags, fd=None):
        """One back-end request with need_reply; returns the reply's u64."""
        msg = HDR.pack(req, F_VERSION | F_NEED_REPLY, MMAP.size) + MMAP.pack(
            shmid, fd_offset, shm_offset, length, flags)
        if fd is None:
            self.backend_sock.sendall(msg)
        else:
            socket.send_fds(self.backend_sock, [msg], [fd])
        rreq, rflags, payload, fds = recv_msg(self.backend_sock)
        for f in fds:
            os.close(f)
        assert rreq == req and rflags & F_REPLY, (rreq, rflags)
        return struct.unpack("<Q", payload[:8])[0]

    def close(self):
        self.listener.close()


def find_qemu(args):
    if args.qemu:
        return args.qemu
    out = subprocess.run([os.path.join(HERE, "build-qemu.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def part1(qemu, tmp):
    """No guest: feature negotiation with and without a window."""
    for cache in (WINDOW, 0):
        sock = os.path.join(tmp, "nog-%d.sock" % cache)
        be = Backend(sock)
        dev = "vhost-user-fs-pci,chardev=c0,tag=t"
        if cache:
            dev += ",cache-size=%d" % cache
        q = subprocess.Popen([qemu, "-S", "-machine", "q35", "-accel", "tcg", "-nodefaults",
                              "-display", "none", "-monitor", "none", "-m", "256M",
                              "-object", "memory-backend-memfd,id=mem,size=256M,share=on",
                              "-numa", "node,memdev=mem",
                              "-chardev", "socket,id=c0,path=" + sock, "-device", dev],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            ok = be.have_backend.wait(30)
            check(ok, "cache-size=%d: back-end channel set up" % cache)
            if not ok:
                continue
            acked = be.acked_protocol or 0
            has = bool(acked & (1 << PF_SHMEM))
            check(has == bool(cache), "cache-size=%d: SHMEM protocol feature %s"
                  % (cache, "negotiated" if has else "not negotiated"))
            memfd = os.memfd_create("nog")
            os.ftruncate(memfd, 4 * MiB)
            r = be.request(BACKEND_SHMEM_MAP, 0, 0, 0, 2 * MiB, MAP_RW, memfd)
            check((r == 0) == bool(cache), "cache-size=%d: SHMEM_MAP reply %d" % (cache, r))
            check(be.shmem_config_asked == bool(cache), "cache-size=%d: GET_SHMEM_CONFIG sent %d times"
                  % (cache, be.shmem_config_asked))
            if cache:
                r = be.request(BACKEND_SHMEM_UNMAP, 0, 0, 0, 2 * MiB, 0)
                check(r == 0, "cache-size=%d: SHMEM_UNMAP reply %d" % (cache, r))
            os.close(memfd)
        finally:
            q.kill()
            out = q.communicate()[0]
            be.close()
        if out.strip():
            print("  qemu said: " + out.strip().replace("\n", "\n  qemu said: "))


def part1_mismatch(qemu, tmp):
    """No guest: a back-end whose window is not cache-size is refused."""
    sock = os.path.join(tmp, "mismatch.sock")
    be = Backend(sock, window=WINDOW // 2)
    q = subprocess.Popen([qemu, "-S", "-machine", "q35", "-accel", "tcg", "-nodefaults",
                          "-display", "none", "-monitor", "none", "-m", "256M", "-name", "mm",
                          "-object", "memory-backend-memfd,id=mem,size=256M,share=on",
                          "-numa", "node,memdev=mem", "-chardev", "socket,id=c0,path=" + sock,
                          "-device", "vhost-user-fs-pci,chardev=c0,tag=t,cache-size=%d" % WINDOW],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = q.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        q.kill()
        out = q.communicate()[0]
    finally:
        be.close()
    check(q.returncode not in (0, None) and be.shmem_config_asked == 1,
          "a 32 MiB back-end window with cache-size=64M: QEMU exits (status %s)" % q.returncode)
    check("cache-size is 64 MiB" in out and "DAX window of 32 MiB" in out
          and "VM 'mm'" in out and sock in out,
          "the error names both sizes, the socket and the VM: %s" % out.strip())


GUEST_CMD = r"""
d=$(grep -l 0x105a /sys/bus/pci/devices/*/device); d=${d%/device}
dmesg | grep -i -e 'cache len' -e virtio_fs -e virtiofs | sed 's/^/DMESG: /'
echo "BAR2: $(sed -n 3p $d/resource)"
a=$(sed -n 3p $d/resource | cut -d' ' -f1)
rmmod virtiofs
echo CXLFS-DAX-READY
sleep 10
echo "RW: $(devmem $((a)) 64)"
echo "RO: $(devmem $((a + 0x400000)) 64)"
devmem $((a + 0x10)) 64 @WORD@
echo "WR: $(devmem $((a + 0x10)) 64)"
""".replace("@WORD@", hex(GUEST_WORD))


def part2(qemu, image, tmp, keep):
    """A TCG guest: the driver finds the window; maps are visible to it."""
    sock = os.path.join(tmp, "guest.sock")
    serial = os.path.join(tmp, "guest.serial.log")
    be = Backend(sock)
    memfd = os.memfd_create("pool")
    os.ftruncate(memfd, 8 * MiB)
    os.pwrite(memfd, PATTERN_RW, 0)
    os.pwrite(memfd, PATTERN_RO, 2 * MiB)
    cmd = [os.path.join(HERE, "run-vm.sh"), "--accel", "tcg", "--name", "daxcheck",
           "--serial", serial, "--timeout", "180", "--cmd", GUEST_CMD]
    if image:
        cmd += ["--image", image]
    cmd += ["--", "-chardev", "socket,id=dax0,path=" + sock,
            "-device", "vhost-user-fs-pci,chardev=dax0,tag=daxtest,cache-size=%d" % WINDOW]
    env = dict(os.environ, QEMU=qemu)
    vm = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.time() + 120
        text = ""
        while time.time() < deadline and "CXLFS-DAX-READY" not in text and vm.poll() is None:
            time.sleep(0.2)
            if os.path.exists(serial):
                text = open(serial, errors="replace").read()
        check("CXLFS-DAX-READY" in text, "guest booted and released the device")
        if "CXLFS-DAX-READY" not in text:
            return
        m = re.search(r"Cache len: (0x[0-9a-f]+) @ (0x[0-9a-f]+)", text)
        check(m and int(m.group(1), 16) == WINDOW,
              "guest virtio_fs found the DAX window: %s" % (m.group(0) if m else "no 'Cache len' line"))
        b = re.search(r"BAR2: (0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+)", text)
        check(b and int(b.group(2), 16) - int(b.group(1), 16) + 1 == WINDOW
              and int(b.group(3), 16) & 0x2000 and int(b.group(3), 16) & 0x100000,
              "BAR 2 is %s (64-bit prefetchable, 64 MiB)" % (b.group(0) if b else "missing"))
        S = BACKEND_SHMEM_MAP
        U = BACKEND_SHMEM_UNMAP
        cases = [  # (what, req, shmid, fd_offset, shm_offset, len, flags, fd?, expected reply)
            ("map 2 MiB rw at 0", S, 0, 0, 0, 2 * MiB, MAP_RW, True, 0),
            ("map overlapping", S, 0, 0, 1 * MiB, 2 * MiB, MAP_RW, True, 1),
            ("map misaligned", S, 0, 0, 2 * MiB + 512, 4096, MAP_RW, True, 1),
            ("map outside the window", S, 0, 0, WINDOW - 2 * MiB, 4 * MiB, MAP_RW, True, 1),
            ("map shmid 1", S, 1, 0, 8 * MiB, 2 * MiB, MAP_RW, True, 1),
            ("map without fd", S, 0, 0, 8 * MiB, 2 * MiB, MAP_RW, False, 1),
            ("map with unknown flags", S, 0, 0, 8 * MiB, 2 * MiB, 2, True, 1),
            ("unmap not matching a map", U, 0, 0, 0, 4096, 0, False, 1),
            ("map 2 MiB ro at 4 MiB", S, 0, 2 * MiB, 4 * MiB, 2 * MiB, 0, True, 0),
            ("unmap it", U, 0, 0, 4 * MiB, 2 * MiB, 0, False, 0),
            ("unmap it again", U, 0, 0, 4 * MiB, 2 * MiB, 0, False, 1),
            ("map it again", S, 0, 2 * MiB, 4 * MiB, 2 * MiB, 0, True, 0),
            ("map the last 2 MiB", S, 0, 0, WINDOW - 2 * MiB, 2 * MiB, MAP_RW, True, 0),
            ("unmap the last 2 MiB", U, 0, 0, WINDOW - 2 * MiB, 2 * MiB, 0, False, 0),
        ]
        for what, req, shmid, fdo, off, ln, fl, withfd, want in cases:
            r = be.request(req, shmid, fdo, off, ln, fl, memfd if withfd else None)
            check(r == want, "%s: reply %d (want %d)" % (what, r, want))
        vm.wait(timeout=150)
        text = open(serial, errors="replace").read()
        def word(tag):
            m = re.search(tag + r": (0x[0-9A-Fa-f]+)", text)
            return int(m.group(1), 16) if m else None
        check(word("RW") == struct.unpack("<Q", PATTERN_RW)[0], "guest reads the rw map: %r" % word("RW"))
        check(word("RO") == struct.unpack("<Q", PATTERN_RO)[0], "guest reads the ro map: %r" % word("RO"))
        check(word("WR") == GUEST_WORD and os.pread(memfd, 8, 0x10) == struct.pack("<Q", GUEST_WORD),
              "guest write lands in the back-end's file")
        check(vm.returncode == 0, "guest exit status %s" % vm.returncode)
    finally:
        if vm.poll() is None:
            vm.kill()
            vm.wait()
        be.close()
        os.close(memfd)
        if keep:
            print("serial log: " + serial)
        else:
            for line in open(serial, errors="replace") if os.path.exists(serial) else []:
                if re.match(r"(DMESG|BAR2|RW|RO|WR):", line):
                    print("  guest: " + line.rstrip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qemu", help="patched qemu-system-x86_64 (default: build-qemu.sh)")
    ap.add_argument("--image", help="guest image dir (default: run-vm.sh's default)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    qemu = find_qemu(args)
    tmp = tempfile.mkdtemp(prefix="cxlfs-daxcheck-")
    part1(qemu, tmp)
    part1_mismatch(qemu, tmp)
    part2(qemu, args.image, tmp, args.keep)
    if not args.keep:
        subprocess.run(["rm", "-rf", tmp])
    ok = all(results)
    print("%s: %d checks, %d failed" % ("PASS" if ok else "FAIL", len(results), results.count(False)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
