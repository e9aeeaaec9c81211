/*
 * cxlfs-fsx: a file-system exerciser. Random operations on FILE (and on a
 * second file FILE.src, the source of cross-file copies), each mirrored in
 * a shadow copy held in memory; every read is checked against the shadow,
 * and so is the whole file every 1000 operations and at the end.
 *
 *   cxlfs-fsx [-N ops] [-S seed] [-l maxlen] [-o maxop] [-p every]
 *             [--no-mmap] [--no-fallocate] [--no-punch] [--no-zero]
 *             [--no-copy] [--self-test-corrupt] FILE
 *   cxlfs-fsx util punch FILE OFF LEN | zero FILE OFF LEN | copy SRC DST
 *             | setxattr FILE NAME VALUE | getxattr FILE NAME | holes FILE
 *             | straddle FILE N
 *
 * Operations: read (pread), write (pwrite, may extend), mapread (mmap
 * MAP_SHARED + memcpy), mapwrite (ftruncate to extend if needed, mmap store
 * + msync), truncate (grow or shrink), fallocate (mode 0 and KEEP_SIZE),
 * punch hole (PUNCH_HOLE|KEEP_SIZE), zero range (with and without
 * KEEP_SIZE), copy_file_range (within FILE, ranges never overlapping, and
 * from FILE.src, which is itself written now and then). Also fsync now and
 * then, and close + reopen of both files.
 *
 * A syscall that answers EOPNOTSUPP or ENOSYS (ENODEV for mmap, EXDEV for
 * copy_file_range) turns that operation off, with a message; such types are
 * listed in the summary's disabled=[...] (those turned off by --no-* are not).
 * Progress: a line "cxlfs-fsx: N ops, T s" on stderr every `-p` operations
 * (10000 by default), so that a watchdog can tell a slow run from a stalled
 * one.
 *
 * On a mismatch: the offset, the expected and actual bytes around it, the
 * last 32 operations; exit 1. Any other syscall failure: exit 1 as well.
 * Usage errors: exit 2. The last line of a run is the summary:
 *
 *   cxlfs-fsx: ops=N seed=S reads=.. writes=.. mapreads=.. mapwrites=..
 *   truncates=.. fallocs=.. punches=.. zeroes=.. copies=.. disabled=[]
 *
 * --self-test-corrupt flips one byte of FILE through another descriptor
 * (the shadow does not know) just before the first whole-file check: the run
 * must then fail (exit 1), which shows that the checks catch corruption.
 *
 * `util` runs one operation for test scripts (the guest image has no
 * util-linux fallocate, no setfattr, no xfs_io): punch / zero a range, copy
 * a whole file with copy_file_range(2) (DST created or truncated), set or
 * print an extended attribute, print the data segments (SEEK_DATA/SEEK_HOLE).
 * `util straddle FILE N` maps FILE and FILE.src (4 MiB each, shared) and
 * makes N 8-byte stores across FILE's 2 MiB boundary, touching one of
 * FILE.src's two 2 MiB ranges before every third: one instruction that
 * needs two DAX window ranges at once, with a third range in use
 * (docs/dax-window.md). A progress line every 50 stores; exit 1 if the last
 * value does not read back.
 *
 * Built static into the guest image (qemu-configs/build-guest-image.sh).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cxlfs-probe.h"

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif
#ifndef FALLOC_FL_ZERO_RANGE
#define FALLOC_FL_ZERO_RANGE 0x10
#endif

#define CHECK_EVERY 1000
#define LOG_LEN 32

enum op {
    OP_READ, OP_WRITE, OP_MAPREAD, OP_MAPWRITE, OP_TRUNCATE,
    OP_FALLOC, OP_PUNCH, OP_ZERO, OP_COPY, OP_COUNT,
    /* logged, not chosen at random */
    OP_SRCWRITE = OP_COUNT, OP_FSYNC, OP_REOPEN, OP_CHECK, OP_CORRUPT,
};

static const char *const op_name[] = {
    "read", "write", "mapread", "mapwrite", "truncate", "falloc", "punch", "zero", "copy",
    "srcwrite", "fsync", "reopen", "check", "corrupt",
};
/* Summary counter names (the first OP_COUNT ops). */
static const char *const count_name[OP_COUNT] = {
    "reads", "writes", "mapreads", "mapwrites", "truncates", "fallocs", "punches", "zeroes",
    "copies",
};
/* Relative weights of the random choice. */
static const unsigned weight[OP_COUNT] = {4, 4, 2, 2, 1, 1, 1, 1, 2};

/* One shadowed file: its descriptor, its size and its contents. Bytes of
 * `data` at or beyond `size` are always zero (a later extension shows zeros). */
struct file {
    char *path;
    int fd;
    uint64_t size;
    uint8_t *data;
};

struct logent {
    uint64_t n;
    int op;
    uint64_t off, len, arg; /* arg: destination offset, new size, mode */
    uint64_t size_after;
    const char *note;
};

static struct file F, S;          /* FILE and FILE.src */
static uint64_t maxlen = 256 * 1024, maxop, nops = 10000, seed = 1, progress_every = 10000;
static int enabled[OP_COUNT], disabled[OP_COUNT];
static uint64_t counts[OP_COUNT];
static struct logent oplog[LOG_LEN];
static uint64_t opno, logged;
static uint64_t rng_state;
static uint8_t *scratch;          /* read / write buffer, maxlen bytes */
static long page_size;

static void usage(void)
{
    fprintf(stderr,
        "usage: cxlfs-fsx [-N ops] [-S seed] [-l maxlen] [-o maxop] [-p every]\n"
        "                 [--no-mmap] [--no-fallocate] [--no-punch] [--no-zero]\n"
        "                 [--no-copy] [--self-test-corrupt] FILE\n"
        "       cxlfs-fsx util punch FILE OFF LEN | zero FILE OFF LEN | copy SRC DST\n"
        "                 | setxattr FILE NAME VALUE | getxattr FILE NAME | holes FILE\n"
        "                 | straddle FILE N\n"
        "\n"
        "Random reads, writes, mmap reads/writes, truncates, fallocates, hole punches,\n"
        "zero ranges and copy_file_range on FILE (and FILE.src), checked against a copy\n"
        "in memory. -N: operations (10000); -S: seed (1); -l: largest file size\n"
        "(256k; k/m/g suffixes); -o: largest operation (64k, at most maxlen);\n"
        "-p: a progress line on stderr every that many operations (10000).\n"
        "Exit 0: all checks passed; 1: a mismatch or a failed syscall; 2: usage.\n");
}

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, n) (n > 0). */
static uint64_t below(uint64_t n)
{
    return rnd() % n;
}

static void fill_random(uint8_t *buf, uint64_t len)
{
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = rnd();
        memcpy(buf + i, &v, 8);
    }
    if (i < len) {
        uint64_t v = rnd();
        memcpy(buf + i, &v, len - i);
    }
}

static void log_op(int op, uint64_t off, uint64_t len, uint64_t arg, const char *note)
{
    struct logent *e = &oplog[logged++ % LOG_LEN];
    e->n = opno;
    e->op = op;
    e->off = off;
    e->len = len;
    e->arg = arg;
    e->size_after = F.size;
    e->note = note;
}

static void dump_log(void)
{
    uint64_t first = logged > LOG_LEN ? logged - LOG_LEN : 0;
    fprintf(stderr, "cxlfs-fsx: the last %" PRIu64 " operations (oldest first):\n",
            logged - first);
    for (uint64_t i = first; i < logged; i++) {
        const struct logent *e = &oplog[i % LOG_LEN];
        fprintf(stderr, "  #%-7" PRIu64 " %-8s off=0x%" PRIx64 " len=0x%" PRIx64, e->n,
                op_name[e->op], e->off, e->len);
        if (e->op == OP_COPY || e->op == OP_TRUNCATE || e->op == OP_FALLOC || e->op == OP_ZERO)
            fprintf(stderr, " arg=0x%" PRIx64, e->arg);
        fprintf(stderr, " size=0x%" PRIx64 "%s%s\n", e->size_after, e->note ? " " : "",
                e->note ? e->note : "");
    }
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cxlfs-fsx: FAILED at op %" PRIu64 " (seed %" PRIu64 "): ", opno, seed);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    dump_log();
    exit(1);
}

/* Below this much free space, a SIGBUS on a mapped store is the share
 * being full: the daemon reserves host space (up to a 2 MiB DAX range)
 * before it maps a range writable, and a mapped store it cannot back is a
 * SIGBUS, as on a local file system. */
#define FULL_SHARE_BYTES (8u << 20)

/* SIGBUS: says whether the share was (nearly) full then, and ends. Only
 * async-signal-safe calls (the statfs system call, write, _exit). */
static void on_sigbus(int sig)
{
    (void)sig;
    struct statfs st;
    int full = syscall(SYS_fstatfs, F.fd, &st) == 0 &&
               (uint64_t)st.f_bavail * (uint64_t)st.f_bsize < FULL_SHARE_BYTES;
    static const char nospc[] =
        "cxlfs-fsx: SIGBUS on a mapped access with the share full: No space left on device\n";
    static const char other[] = "cxlfs-fsx: FAILED: SIGBUS on a mapped access\n";
    if (full)
        (void)!write(2, nospc, sizeof nospc - 1);
    else
        (void)!write(2, other, sizeof other - 1);
    _exit(1);
}

/* The shadow and the file differ at got[bad - off]: show both around it. */
static void mismatch(const struct file *f, uint64_t off, const uint8_t *got, uint64_t len,
                     uint64_t bad, const char *how)
{
    uint64_t lo = bad >= off + 8 ? bad - 8 : off;
    uint64_t hi = bad + 24 < off + len ? bad + 24 : off + len;
    uint64_t nbad = 0;
    for (uint64_t i = bad; i < off + len; i++)
        nbad += got[i - off] != f->data[i];
    fprintf(stderr,
            "cxlfs-fsx: MISMATCH in %s (%s of 0x%" PRIx64 "+0x%" PRIx64 "): first bad byte at "
            "offset 0x%" PRIx64 " (%" PRIu64 "), %" PRIu64 " bad bytes from there to 0x%" PRIx64
            "\n",
            f->path, how, off, len, bad, bad, nbad, off + len);
    fprintf(stderr, "  offset    ");
    for (uint64_t i = lo; i < hi; i++)
        fprintf(stderr, "%s%02" PRIx64, i == bad ? "[" : " ", i & 0xff);
    fprintf(stderr, "\n  expected  ");
    for (uint64_t i = lo; i < hi; i++)
        fprintf(stderr, "%s%02x", i == bad ? "[" : " ", f->data[i]);
    fprintf(stderr, "\n  actual    ");
    for (uint64_t i = lo; i < hi; i++)
        fprintf(stderr, "%s%02x", i == bad ? "[" : " ", got[i - off]);
    fprintf(stderr, "\n  (the low byte of each offset; '[' marks the first bad one)\n");
    fail("%s: data mismatch at offset 0x%" PRIx64, f->path, bad);
}

/* got[0..len) must equal the shadow at off. */
static void compare(const struct file *f, uint64_t off, const uint8_t *got, uint64_t len,
                    const char *how)
{
    if (memcmp(f->data + off, got, len) == 0)
        return;
    uint64_t i = 0;
    while (got[i] == f->data[off + i])
        i++;
    mismatch(f, off, got, len, off + i, how);
}

static int unsupported(int e)
{
    return e == EOPNOTSUPP || e == ENOSYS || e == ENOTSUP;
}

/* The syscall behind `op` answered errno e: turn the op off, with a message. */
static void disable(int op, const char *call, int e)
{
    if (!disabled[op])
        fprintf(stderr, "cxlfs-fsx: op %" PRIu64 ": %s answered %s: %s disabled\n", opno, call,
                strerrorname_np(e) ? strerrorname_np(e) : strerror(e), op_name[op]);
    disabled[op] = 1;
}

/* pread until len bytes or end of file; returns the bytes read. */
static uint64_t read_full(struct file *f, uint8_t *buf, uint64_t off, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        ssize_t r = pread(f->fd, buf + done, len - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            fail("pread(%s, 0x%" PRIx64 "+0x%" PRIx64 "): %s", f->path, off + done, len - done,
                 strerror(errno));
        }
        if (r == 0)
            break;
        done += (uint64_t)r;
    }
    return done;
}

static void write_full(struct file *f, const uint8_t *buf, uint64_t off, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        ssize_t r = pwrite(f->fd, buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            fail("pwrite(%s, 0x%" PRIx64 "+0x%" PRIx64 "): %s", f->path, off + done, len - done,
                 r < 0 ? strerror(errno) : "wrote nothing");
        done += (uint64_t)r;
    }
}

static void open_file(struct file *f, int flags)
{
    f->fd = open(f->path, O_RDWR | O_CLOEXEC | flags, 0644);
    if (f->fd < 0)
        fail("open(%s): %s", f->path, strerror(errno));
}

/* Shadow bookkeeping: the size grows to at least `end`. */
static void extend(struct file *f, uint64_t end)
{
    if (end > f->size)
        f->size = end;
}

/* The whole file against its shadow: size, contents, nothing after the end. */
static void check_file(struct file *f)
{
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        fail("fstat(%s): %s", f->path, strerror(errno));
    if ((uint64_t)st.st_size != f->size)
        fail("%s: size 0x%" PRIx64 ", expected 0x%" PRIx64, f->path, (uint64_t)st.st_size,
             f->size);
    for (uint64_t off = 0; off < f->size; off += maxlen) {
        uint64_t len = f->size - off < maxlen ? f->size - off : maxlen;
        uint64_t got = read_full(f, scratch, off, len);
        if (got != len)
            fail("%s: whole-file read: 0x%" PRIx64 " bytes at 0x%" PRIx64 ", expected 0x%" PRIx64
                 " (file size 0x%" PRIx64 ")",
                 f->path, got, off, len, f->size);
        compare(f, off, scratch, len, "whole-file check");
    }
    uint8_t b;
    ssize_t r = pread(f->fd, &b, 1, (off_t)f->size);
    if (r != 0)
        fail("%s: a read at the end (0x%" PRIx64 ") returned %zd", f->path, f->size, r);
}

/* An offset and length for an operation that may extend the file:
 * off < maxlen, 1 <= len <= maxop, off + len <= maxlen. */
static void pick_range(uint64_t *off, uint64_t *len)
{
    *off = below(maxlen);
    *len = 1 + below(maxop);
    if (*len > maxlen - *off)
        *len = maxlen - *off;
}

/* Within the file's data (size > 0): off < size, off + len <= size. */
static void pick_inside(const struct file *f, uint64_t *off, uint64_t *len)
{
    *off = below(f->size);
    *len = 1 + below(maxop);
    if (*len > f->size - *off)
        *len = f->size - *off;
}

static void op_read(void)
{
    uint64_t off, len;
    if (F.size == 0 || below(16) == 0) {
        /* sometimes past the end: a short read */
        off = below(maxlen);
        len = 1 + below(maxop);
    } else {
        pick_inside(&F, &off, &len);
        if (below(8) == 0)
            len += below(maxop); /* may run past the end */
    }
    if (len > maxlen)
        len = maxlen;
    log_op(OP_READ, off, len, 0, NULL);
    uint64_t want = off >= F.size ? 0 : (F.size - off < len ? F.size - off : len);
    uint64_t got = read_full(&F, scratch, off, len);
    if (got != want)
        fail("read 0x%" PRIx64 "+0x%" PRIx64 ": 0x%" PRIx64 " bytes, expected 0x%" PRIx64
             " (size 0x%" PRIx64 ")",
             off, len, got, want, F.size);
    compare(&F, off, scratch, got, "read");
    counts[OP_READ]++;
}

static void do_write(struct file *f, int op)
{
    uint64_t off, len;
    pick_range(&off, &len);
    fill_random(scratch, len);
    log_op(op, off, len, 0, f == &S ? "(FILE.src)" : NULL);
    write_full(f, scratch, off, len);
    memcpy(f->data + off, scratch, len);
    extend(f, off + len);
    oplog[(logged - 1) % LOG_LEN].size_after = F.size;
    if (op == OP_WRITE)
        counts[OP_WRITE]++;
}

/* A MAP_SHARED mapping of [off, off + len) of f; returns the address of
 * off (the mapping starts at the page boundary below it) or NULL when mmap
 * is not supported (the op is then disabled). */
static uint8_t *map_range(struct file *f, uint64_t off, uint64_t len, int prot, int op,
                          void **base, size_t *maplen)
{
    uint64_t pg = off & ~(uint64_t)(page_size - 1);
    *maplen = (size_t)(off + len - pg);
    *base = mmap(NULL, *maplen, prot, MAP_SHARED, f->fd, (off_t)pg);
    if (*base == MAP_FAILED) {
        int e = errno;
        if (unsupported(e) || e == ENODEV) {
            disable(op, "mmap(MAP_SHARED)", e);
            return NULL;
        }
        fail("mmap(%s, 0x%" PRIx64 "+0x%zx): %s", f->path, pg, *maplen, strerror(e));
    }
    return (uint8_t *)*base + (off - pg);
}

static void op_mapread(void)
{
    if (F.size == 0)
        return;
    uint64_t off, len;
    pick_inside(&F, &off, &len);
    log_op(OP_MAPREAD, off, len, 0, NULL);
    void *base;
    size_t maplen;
    uint8_t *p = map_range(&F, off, len, PROT_READ, OP_MAPREAD, &base, &maplen);
    if (!p)
        return;
    memcpy(scratch, p, len);
    if (munmap(base, maplen) != 0)
        fail("munmap: %s", strerror(errno));
    compare(&F, off, scratch, len, "mapread");
    counts[OP_MAPREAD]++;
}

static void op_mapwrite(void)
{
    uint64_t off, len;
    pick_range(&off, &len);
    log_op(OP_MAPWRITE, off, len, 0, off + len > F.size ? "(extends first)" : NULL);
    if (off + len > F.size) {
        if (ftruncate(F.fd, (off_t)(off + len)) != 0)
            fail("ftruncate(%s, 0x%" PRIx64 ") before mapwrite: %s", F.path, off + len,
                 strerror(errno));
        F.size = off + len;
        oplog[(logged - 1) % LOG_LEN].size_after = F.size;
    }
    void *base;
    size_t maplen;
    uint8_t *p = map_range(&F, off, len, PROT_READ | PROT_WRITE, OP_MAPWRITE, &base, &maplen);
    if (!p)
        return;
    fill_random(scratch, len);
    memcpy(p, scratch, len);
    if (msync(base, maplen, MS_SYNC) != 0)
        fail("msync(%s, 0x%" PRIx64 "+0x%" PRIx64 "): %s", F.path, off, len, strerror(errno));
    if (munmap(base, maplen) != 0)
        fail("munmap: %s", strerror(errno));
    memcpy(F.data + off, scratch, len);
    counts[OP_MAPWRITE]++;
}

static void op_truncate(void)
{
    uint64_t size = below(maxlen + 1);
    log_op(OP_TRUNCATE, 0, 0, size, size > F.size ? "(grow)" : "(shrink)");
    if (ftruncate(F.fd, (off_t)size) != 0)
        fail("ftruncate(%s, 0x%" PRIx64 "): %s", F.path, size, strerror(errno));
    if (size < F.size)
        memset(F.data + size, 0, F.size - size);
    F.size = size;
    oplog[(logged - 1) % LOG_LEN].size_after = F.size;
    counts[OP_TRUNCATE]++;
}

/* fallocate(2) for `op`: 0 done, 1 unsupported (op disabled), else fail. */
static int falloc(int op, int mode, uint64_t off, uint64_t len, const char *what)
{
    if (fallocate(F.fd, mode, (off_t)off, (off_t)len) == 0)
        return 0;
    int e = errno;
    char call[64];
    snprintf(call, sizeof call, "fallocate(%s)", what);
    if (unsupported(e)) {
        disable(op, call, e);
        return 1;
    }
    fail("%s on %s, 0x%" PRIx64 "+0x%" PRIx64 ": %s", call, F.path, off, len, strerror(e));
}

static void op_falloc(void)
{
    uint64_t off, len;
    pick_range(&off, &len);
    int keep = (int)below(2);
    int mode = keep ? FALLOC_FL_KEEP_SIZE : 0;
    log_op(OP_FALLOC, off, len, (uint64_t)mode, keep ? "(KEEP_SIZE)" : "(mode 0)");
    if (falloc(OP_FALLOC, mode, off, len, keep ? "KEEP_SIZE" : "0"))
        return;
    if (!keep)
        extend(&F, off + len); /* the new bytes read as zeros: the shadow has them */
    oplog[(logged - 1) % LOG_LEN].size_after = F.size;
    counts[OP_FALLOC]++;
}

static void op_punch(void)
{
    if (F.size == 0)
        return;
    uint64_t off, len;
    pick_inside(&F, &off, &len);
    if (below(8) == 0)
        len += below(maxop); /* may reach past the end: the size stays */
    log_op(OP_PUNCH, off, len, 0, NULL);
    if (falloc(OP_PUNCH, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len,
               "PUNCH_HOLE|KEEP_SIZE"))
        return;
    uint64_t end = off + len < F.size ? off + len : F.size;
    memset(F.data + off, 0, end - off);
    counts[OP_PUNCH]++;
}

static void op_zero(void)
{
    uint64_t off, len;
    int keep = (int)below(2);
    if (keep && F.size > 0)
        pick_inside(&F, &off, &len);
    else
        pick_range(&off, &len);
    int mode = FALLOC_FL_ZERO_RANGE | (keep ? FALLOC_FL_KEEP_SIZE : 0);
    log_op(OP_ZERO, off, len, (uint64_t)mode, keep ? "(KEEP_SIZE)" : NULL);
    if (falloc(OP_ZERO, mode, off, len, keep ? "ZERO_RANGE|KEEP_SIZE" : "ZERO_RANGE"))
        return;
    uint64_t end = off + len;
    if (!keep)
        extend(&F, end);
    if (end > F.size)
        end = F.size;
    if (off < end)
        memset(F.data + off, 0, end - off);
    oplog[(logged - 1) % LOG_LEN].size_after = F.size;
    counts[OP_ZERO]++;
}

/* copy_file_range from `src` (FILE or FILE.src) into FILE. */
static void op_copy(void)
{
    struct file *src = &F;
    if (below(3) == 0) {
        src = &S;
        if (S.size == 0 || below(2) == 0)
            do_write(&S, OP_SRCWRITE); /* the source changes too */
    }
    if (src->size == 0)
        return;
    uint64_t soff, len, doff = 0;
    pick_inside(src, &soff, &len);
    if (len > maxlen / 2)
        len = maxlen / 2;
    int found = 0;
    for (int tries = 0; tries < 16 && !found; tries++) {
        doff = below(maxlen - len + 1);
        /* within one file the ranges must not overlap (EINVAL) */
        found = src != &F || doff + len <= soff || soff + len <= doff;
    }
    if (!found)
        return;
    log_op(OP_COPY, soff, len, doff, src == &S ? "(from FILE.src)" : "(within FILE)");
    loff_t in = (loff_t)soff, out = (loff_t)doff;
    uint64_t done = 0;
    while (done < len) {
        ssize_t r = copy_file_range(src->fd, &in, F.fd, &out, len - done, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && done == 0 && (unsupported(errno) || errno == EXDEV)) {
            disable(OP_COPY, "copy_file_range", errno);
            return;
        }
        if (r < 0)
            fail("copy_file_range(%s 0x%" PRIx64 " -> %s 0x%" PRIx64 ", 0x%" PRIx64
                 "): %s after 0x%" PRIx64 " bytes",
                 src->path, soff, F.path, doff, len, strerror(errno), done);
        if (r == 0)
            fail("copy_file_range(%s 0x%" PRIx64 " -> %s 0x%" PRIx64 ", 0x%" PRIx64
                 "): returned 0 after 0x%" PRIx64 " bytes (source size 0x%" PRIx64 ")",
                 src->path, soff, F.path, doff, len, done, src->size);
        done += (uint64_t)r;
    }
    if ((uint64_t)in != soff + len || (uint64_t)out != doff + len)
        fail("copy_file_range left the offsets at 0x%llx / 0x%llx, expected 0x%" PRIx64
             " / 0x%" PRIx64,
             (unsigned long long)in, (unsigned long long)out, soff + len, doff + len);
    memmove(F.data + doff, src->data + soff, len);
    extend(&F, doff + len);
    oplog[(logged - 1) % LOG_LEN].size_after = F.size;
    counts[OP_COPY]++;
}

static void reopen(void)
{
    log_op(OP_REOPEN, 0, 0, 0, NULL);
    if (close(F.fd) != 0 || close(S.fd) != 0)
        fail("close: %s", strerror(errno));
    open_file(&F, 0);
    open_file(&S, 0);
}

static void do_fsync(void)
{
    log_op(OP_FSYNC, 0, 0, 0, NULL);
    if (fsync(F.fd) != 0)
        fail("fsync(%s): %s", F.path, strerror(errno));
}

/* --self-test-corrupt: one byte of FILE changes behind the shadow's back. */
static void corrupt(void)
{
    if (F.size == 0)
        do_write(&F, OP_WRITE);
    uint64_t off = below(F.size);
    log_op(OP_CORRUPT, off, 1, 0, "(--self-test-corrupt: a byte flipped behind the shadow)");
    int fd = open(F.path, O_RDWR | O_CLOEXEC);
    uint8_t b = (uint8_t)(F.data[off] ^ 0x5a);
    if (fd < 0 || pwrite(fd, &b, 1, (off_t)off) != 1 || close(fd) != 0)
        fail("--self-test-corrupt: cannot write %s: %s", F.path, strerror(errno));
    fprintf(stderr, "cxlfs-fsx: --self-test-corrupt: flipped the byte at 0x%" PRIx64 "\n", off);
}

static void check_all(void)
{
    log_op(OP_CHECK, 0, F.size, 0, NULL);
    check_file(&F);
    check_file(&S);
}

/* ------------------------------------------------------------------ util */

static int util_fail(const char *what, const char *path)
{
    fprintf(stderr, "cxlfs-fsx util: %s %s: %s\n", what, path, strerror(errno));
    return 1;
}

/* An 8-byte store at p, whatever its alignment: one instruction. */
struct __attribute__((packed)) unaligned_u64 {
    uint64_t v;
};

static int util_straddle(const char *path, uint64_t n)
{
    const size_t chunk = 2u << 20, len = 2 * chunk;
    char src[4096];
    snprintf(src, sizeof src, "%s.src", path);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int fd2 = open(src, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || fd2 < 0)
        return util_fail("open", fd < 0 ? path : src);
    if (ftruncate(fd, (off_t)len) != 0 || ftruncate(fd2, (off_t)len) != 0)
        return util_fail("ftruncate", path);
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    char *q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
    if (p == MAP_FAILED || q == MAP_FAILED)
        return util_fail("mmap", path);
    volatile struct unaligned_u64 *at = (volatile struct unaligned_u64 *)(p + chunk - 4);
    uint64_t t0 = now_ns();
    for (uint64_t i = 1; i <= n; i++) {
        if (i % 3 == 0)
            ((volatile char *)q)[(i / 3 % 2) * chunk + 64] = (char)i;
        at->v = i;
        if (i % 50 == 0)
            fprintf(stderr, "cxlfs-fsx: %" PRIu64 " straddling stores, %.1f s\n", i,
                    (double)(now_ns() - t0) / 1e9);
    }
    uint64_t got = at->v;
    if (n > 0 && got != n) {
        fprintf(stderr, "cxlfs-fsx util straddle: read back %" PRIu64 ", expected %" PRIu64 "\n",
                got, n);
        return 1;
    }
    printf("straddle: %" PRIu64 " stores across %s's 2 MiB boundary in %.1f s\n", n, path,
           (double)(now_ns() - t0) / 1e9);
    return munmap(p, len) || munmap(q, len) || close(fd) || close(fd2) ? util_fail("close", path)
                                                                    : 0;
}

static int util(int argc, char **argv)
{
    const char *cmd = argc > 0 ? argv[0] : "";
    uint64_t off, len;
    if ((!strcmp(cmd, "punch") || !strcmp(cmd, "zero")) && argc == 4) {
        if (parse_size(argv[2], &off) || parse_size(argv[3], &len) || len == 0) {
            fprintf(stderr, "cxlfs-fsx util %s: bad offset or length\n", cmd);
            return 2;
        }
        int fd = open(argv[1], O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return util_fail("open", argv[1]);
        int mode = !strcmp(cmd, "punch") ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                                         : FALLOC_FL_ZERO_RANGE;
        if (fallocate(fd, mode, (off_t)off, (off_t)len) != 0)
            return util_fail(!strcmp(cmd, "punch") ? "fallocate(PUNCH_HOLE|KEEP_SIZE)"
                                                   : "fallocate(ZERO_RANGE)",
                             argv[1]);
        return close(fd) ? util_fail("close", argv[1]) : 0;
    }
    if (!strcmp(cmd, "copy") && argc == 3) {
        int in = open(argv[1], O_RDONLY | O_CLOEXEC);
        if (in < 0)
            return util_fail("open", argv[1]);
        int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (out < 0)
            return util_fail("open", argv[2]);
        uint64_t total = 0;
        for (;;) {
            ssize_t r = copy_file_range(in, NULL, out, NULL, 1 << 30, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                return util_fail("copy_file_range to", argv[2]);
            if (r == 0)
                break;
            total += (uint64_t)r;
        }
        if (close(out) != 0)
            return util_fail("close", argv[2]);
        close(in);
        printf("copied %" PRIu64 " bytes with copy_file_range\n", total);
        return 0;
    }
    if (!strcmp(cmd, "setxattr") && argc == 4) {
        if (setxattr(argv[1], argv[2], argv[3], strlen(argv[3]), 0) != 0)
            return util_fail("setxattr", argv[1]);
        return 0;
    }
    if (!strcmp(cmd, "getxattr") && argc == 3) {
        char val[65536];
        ssize_t n = getxattr(argv[1], argv[2], val, sizeof val - 1);
        if (n < 0)
            return util_fail("getxattr", argv[1]);
        val[n] = '\0';
        printf("%s\n", val);
        return 0;
    }
    if (!strcmp(cmd, "straddle") && argc == 3) {
        uint64_t n;
        if (parse_size(argv[2], &n)) {
            fprintf(stderr, "cxlfs-fsx util straddle: bad count\n");
            return 2;
        }
        return util_straddle(argv[1], n);
    }
    if (!strcmp(cmd, "holes") && argc == 2) {
        int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return util_fail("open", argv[1]);
        off_t pos = 0;
        for (;;) {
            off_t d = lseek(fd, pos, SEEK_DATA);
            if (d < 0 && errno == ENXIO)
                break;
            if (d < 0)
                return util_fail("lseek(SEEK_DATA)", argv[1]);
            off_t h = lseek(fd, d, SEEK_HOLE);
            if (h < 0)
                return util_fail("lseek(SEEK_HOLE)", argv[1]);
            printf("data %lld %lld\n", (long long)d, (long long)h);
            pos = h;
        }
        close(fd);
        return 0;
    }
    usage();
    return 2;
}

/* ------------------------------------------------------------------ main */

static int pick_op(void)
{
    unsigned total = 0;
    for (int o = 0; o < OP_COUNT; o++)
        total += enabled[o] && !disabled[o] ? weight[o] : 0;
    unsigned r = (unsigned)below(total);
    for (int o = 0; o < OP_COUNT; o++) {
        unsigned w = enabled[o] && !disabled[o] ? weight[o] : 0;
        if (r < w)
            return o;
        r -= w;
    }
    return OP_READ;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int self_corrupt = 0;
    uint64_t v;
    if (argc >= 2 && !strcmp(argv[1], "util"))
        return util(argc - 2, argv + 2);
    for (int o = 0; o < OP_COUNT; o++)
        enabled[o] = 1;
    maxop = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-N") && has_val && !parse_size(argv[i + 1], &v)) {
            nops = v;
            i++;
        } else if (!strcmp(a, "-S") && has_val && !parse_u64(argv[i + 1], &v)) {
            seed = v;
            i++;
        } else if (!strcmp(a, "-l") && has_val && !parse_size(argv[i + 1], &v) && v > 0) {
            maxlen = v;
            i++;
        } else if (!strcmp(a, "-o") && has_val && !parse_size(argv[i + 1], &v) && v > 0) {
            maxop = v;
            i++;
        } else if (!strcmp(a, "-p") && has_val && !parse_size(argv[i + 1], &v) && v > 0) {
            progress_every = v;
            i++;
        } else if (!strcmp(a, "--no-mmap")) {
            enabled[OP_MAPREAD] = enabled[OP_MAPWRITE] = 0;
        } else if (!strcmp(a, "--no-fallocate")) {
            enabled[OP_FALLOC] = 0;
        } else if (!strcmp(a, "--no-punch")) {
            enabled[OP_PUNCH] = 0;
        } else if (!strcmp(a, "--no-zero")) {
            enabled[OP_ZERO] = 0;
        } else if (!strcmp(a, "--no-copy")) {
            enabled[OP_COPY] = 0;
        } else if (!strcmp(a, "--self-test-corrupt")) {
            self_corrupt = 1;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "cxlfs-fsx: bad argument: %s\n", a);
            usage();
            return 2;
        }
    }
    if (!path) {
        usage();
        return 2;
    }
    if (maxlen > ((uint64_t)1 << 34)) {
        fprintf(stderr, "cxlfs-fsx: -l: at most 16g\n");
        return 2;
    }
    if (maxop == 0)
        maxop = 64 * 1024;
    if (maxop > maxlen)
        maxop = maxlen;
    page_size = sysconf(_SC_PAGESIZE);
    struct sigaction sa = { .sa_handler = on_sigbus };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    if (!rng_state)
        rng_state = 1;

    size_t plen = strlen(path);
    F.path = strdup(path);
    S.path = malloc(plen + 5);
    F.data = calloc(1, maxlen);
    S.data = calloc(1, maxlen);
    scratch = malloc(maxlen);
    if (!F.path || !S.path || !F.data || !S.data || !scratch) {
        fprintf(stderr, "cxlfs-fsx: out of memory (-l %" PRIu64 ")\n", maxlen);
        return 1;
    }
    memcpy(S.path, path, plen);
    memcpy(S.path + plen, ".src", 5);
    open_file(&F, O_CREAT | O_TRUNC);
    open_file(&S, O_CREAT | O_TRUNC);

    uint64_t t0 = now_ns();
    uint64_t corrupt_at = nops < CHECK_EVERY ? nops : CHECK_EVERY;
    for (opno = 1; opno <= nops; opno++) {
        switch (pick_op()) {
        case OP_READ: op_read(); break;
        case OP_WRITE: do_write(&F, OP_WRITE); break;
        case OP_MAPREAD: op_mapread(); break;
        case OP_MAPWRITE: op_mapwrite(); break;
        case OP_TRUNCATE: op_truncate(); break;
        case OP_FALLOC: op_falloc(); break;
        case OP_PUNCH: op_punch(); break;
        case OP_ZERO: op_zero(); break;
        case OP_COPY: op_copy(); break;
        default: break;
        }
        if (below(100) == 0)
            do_fsync();
        if (below(500) == 0)
            reopen();
        if (self_corrupt && opno == corrupt_at)
            corrupt();
        if (opno % CHECK_EVERY == 0)
            check_all();
        if (opno % progress_every == 0)
            fprintf(stderr, "cxlfs-fsx: %" PRIu64 " ops, %.1f s\n", opno,
                    (double)(now_ns() - t0) / 1e9);
    }
    opno = nops;
    check_all();
    if (close(F.fd) != 0 || close(S.fd) != 0)
        fail("close: %s", strerror(errno));

    fprintf(stderr, "cxlfs-fsx: %" PRIu64 " ops checked in %.1f s\n", nops,
            (double)(now_ns() - t0) / 1e9);
    printf("cxlfs-fsx: ops=%" PRIu64 " seed=%" PRIu64, nops, seed);
    for (int o = 0; o < OP_COUNT; o++)
        printf(" %s=%" PRIu64, count_name[o], counts[o]);
    printf(" disabled=[");
    int first = 1;
    for (int o = 0; o < OP_COUNT; o++) {
        if (disabled[o]) {
            printf("%s%s", first ? "" : ",", op_name[o]);
            first = 0;
        }
    }
    printf("]\n");
    return 0;
}
