/*
 * cxlfs-posix: a POSIX conformance runner for a (guest) file-system mount, in
 * the spirit of pjdfstest (the cases are our own):
 *
 *   cxlfs-posix run DIR [--json OUT] [--only AREA[ NAME]] [--keep]
 *   cxlfs-posix list
 *   cxlfs-posix lock-hold FILE SECONDS MARKER
 *   cxlfs-posix lock-probe FILE
 *   cxlfs-posix lock-wait FILE
 *
 * run: every case runs in its own fresh subdirectory (mode 0777) of
 * DIR/cxlfs-posix.PID, in its own forked process (umask 0, a 30 s alarm, its
 * own process group, killed afterwards), so that no case can depend on or
 * spoil another. Meant to run as root; the cases that need an unprivileged
 * user fork a child that drops to uid/gid 65534 (setgroups(0), setgid,
 * setuid). One line per case, "ok AREA NAME" or "FAIL AREA NAME: detail";
 * then "cxlfs-posix: passed=N failed=M total=T"; --json OUT writes
 * {"passed":N,"failed":M,"total":T,"failures":["AREA NAME: detail",...]}.
 * Exit 0 iff no case failed. The expectations are those of ext4 on Linux
 * (the reference: every case passes there, as root); where Linux and POSIX
 * part, Linux wins (mkdir ignores S_ISGID in its mode; chown of a regular
 * file clears S_ISUID even as root; unlink of a directory may say EISDIR or
 * EPERM). Areas: chmod chown link mkdir mkfifo mknod open rename rmdir
 * symlink truncate unlink utimensat names xattr fallocate lseek
 * copy_file_range locks flock tmpfile access mmap statfs ("cxlfs-posix list"
 * names every case). A file system without O_TMPFILE fails those cases with
 * the reason rather than skipping them.
 *
 * lock-hold/lock-probe/lock-wait: POSIX (fcntl) locks across processes or
 * VMs sharing one cxlfs export; see usage().
 *
 * Built static into the guest image (qemu-configs/build-guest-image.sh).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cxlfs-probe.h"

#define NOBODY 65534
#define CASE_TIMEOUT_S 30
#define SYNC_TIMEOUT_MS 10000

static void usage(void)
{
    fprintf(stderr,
        "usage: cxlfs-posix run DIR [--json OUT] [--only AREA[ NAME]] [--keep]\n"
        "       cxlfs-posix list\n"
        "       cxlfs-posix lock-hold FILE SECONDS MARKER\n"
        "       cxlfs-posix lock-probe FILE\n"
        "       cxlfs-posix lock-wait FILE\n"
        "\n"
        "run: POSIX conformance cases, each in a fresh subdirectory of DIR, as root\n"
        "and (where it matters) as uid/gid 65534. Prints \"ok AREA NAME\" or\n"
        "\"FAIL AREA NAME: detail\" per case and a passed/failed/total line; --json\n"
        "writes the counts and failures; --only runs the cases whose \"AREA NAME\"\n"
        "starts with the given text; --keep leaves the case directories. Exit 0 iff\n"
        "every case passed.\n"
        "lock-hold: F_SETLK write lock on all of FILE (created), creates MARKER once\n"
        "held, sleeps SECONDS, unlocks; exit 0.\n"
        "lock-probe: F_GETLK for a whole-file write lock; prints \"conflict type=wr|rd\"\n"
        "then \"setlk=EAGAIN\" or \"setlk=ok\" (an F_SETLK try), or \"free\"; exit 0 iff a\n"
        "conflict was seen.\n"
        "lock-wait: F_SETLKW on all of FILE; prints \"waited_ms=N\"; exit 0.\n");
}

/* ------------------------------------------------------------------------ */
/* Failure reporting. A case is a void function; the first failure is kept. */

static char g_detail[1024];
static int g_failed;

static const char *en(int e)
{
    const char *n = strerrorname_np(e);
    return n ? n : strerror(e);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0. */
static int utf8_len(const unsigned char *s)
{
    int n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

/* The detail stays one line of valid UTF-8 (names with newlines or odd
 * bytes show as \xNN), for the per-case line and for the JSON. */
__attribute__((format(printf, 1, 2))) static void fail_at(const char *fmt, ...)
{
    if (g_failed)
        return;
    g_failed = 1;
    char raw[sizeof g_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t o = 0;
    for (const unsigned char *q = (const unsigned char *)raw; *q && o + 5 < sizeof g_detail;) {
        int n = *q >= 0x80 ? utf8_len(q) : (*q < 0x20 || *q == 0x7f) ? 0 : 1;
        if (n == 0) {
            o += (size_t)snprintf(g_detail + o, 5, "\\x%02x", *q++);
            continue;
        }
        if (o + (size_t)n >= sizeof g_detail)
            break;
        memcpy(g_detail + o, q, (size_t)n);
        o += (size_t)n;
        q += n;
    }
    g_detail[o] = '\0';
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fail_at(__VA_ARGS__);                                                                      \
        return;                                                                                    \
    } while (0)
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            FAIL(__VA_ARGS__);                                                                     \
    } while (0)
/* A helper that already reported its failure returns < 0. */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((x) < 0)                                                                               \
            return;                                                                                \
    } while (0)
/* A call that must succeed (-1 and errno on failure). */
#define OK(call)                                                                                   \
    do {                                                                                           \
        errno = 0;                                                                                 \
        if ((long)(call) == -1)                                                                    \
            FAIL("%s: %s", #call, en(errno));                                                      \
    } while (0)
/* A call that must fail with E1 (or E2). */
#define ERR_AT(text, call, e1, e2)                                                                 \
    do {                                                                                           \
        errno = 0;                                                                                 \
        long r_ = (long)(call);                                                                    \
        int e_ = errno;                                                                            \
        if (r_ != -1)                                                                              \
            FAIL("%s succeeded (%ld), expected %s", text, r_, en(e1));                             \
        if (e_ != (e1) && e_ != (e2))                                                              \
            FAIL("%s: %s, expected %s", text, en(e_), en(e1));                                     \
    } while (0)
/* (stringified here, before SEEK_DATA and the like are expanded) */
#define ERR2(call, e1, e2) ERR_AT(#call, call, e1, e2)
#define ERR(call, e) ERR_AT(#call, call, e, e)

/* ------------------------------------------------------------------------ */
/* Helpers on paths relative to the case directory (each returns -1 after   */
/* reporting a failure).                                                    */

static int st_of(const char *p, struct stat *st)
{
    if (lstat(p, st) == 0)
        return 0;
    fail_at("lstat(%s): %s", p, en(errno));
    return -1;
}

/* st_mode, type included. */
static int want_mode(const char *p, mode_t want)
{
    struct stat st;
    if (st_of(p, &st))
        return -1;
    if (st.st_mode == want)
        return 0;
    fail_at("mode of %s is 0%o, expected 0%o", p, (unsigned)st.st_mode, (unsigned)want);
    return -1;
}

static int want_owner(const char *p, uid_t u, gid_t g)
{
    struct stat st;
    if (st_of(p, &st))
        return -1;
    if (st.st_uid == u && st.st_gid == g)
        return 0;
    fail_at("owner of %s is %u:%u, expected %u:%u", p, (unsigned)st.st_uid, (unsigned)st.st_gid,
            (unsigned)u, (unsigned)g);
    return -1;
}

static int want_nlink(const char *p, nlink_t n)
{
    struct stat st;
    if (st_of(p, &st))
        return -1;
    if (st.st_nlink == n)
        return 0;
    fail_at("st_nlink of %s is %lu, expected %lu", p, (unsigned long)st.st_nlink, (unsigned long)n);
    return -1;
}

static int want_size(const char *p, off_t n)
{
    struct stat st;
    if (st_of(p, &st))
        return -1;
    if (st.st_size == n)
        return 0;
    fail_at("st_size of %s is %lld, expected %lld", p, (long long)st.st_size, (long long)n);
    return -1;
}

static int want_absent(const char *p)
{
    struct stat st;
    if (lstat(p, &st) == 0) {
        fail_at("%s still exists", p);
        return -1;
    }
    if (errno != ENOENT) {
        fail_at("lstat(%s): %s, expected ENOENT", p, en(errno));
        return -1;
    }
    return 0;
}

/* Write all of buf at off through fd. */
static int put_fd(int fd, const char *what, const void *buf, size_t n, off_t off)
{
    ssize_t w = pwrite(fd, buf, n, off);
    if (w == (ssize_t)n)
        return 0;
    if (w < 0)
        fail_at("pwrite(%s, %zu bytes at %lld): %s", what, n, (long long)off, en(errno));
    else
        fail_at("pwrite(%s, %zu bytes at %lld) wrote %zd", what, n, (long long)off, w);
    return -1;
}

static int put(const char *p, const void *buf, size_t n, off_t off)
{
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        fail_at("open(%s, O_WRONLY): %s", p, en(errno));
        return -1;
    }
    int r = put_fd(fd, p, buf, n, off);
    close(fd);
    return r;
}

/* A new file (O_EXCL) of exactly this mode (fchmod after creation, so that
 * the set-up does not depend on what open(O_CREAT) does with the mode) and
 * contents (data may be NULL). */
static int mkfile(const char *p, mode_t mode, const char *data)
{
    int fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) {
        fail_at("set-up: open(%s, O_CREAT|O_EXCL): %s", p, en(errno));
        return -1;
    }
    int r = 0;
    if (data)
        r = put_fd(fd, p, data, strlen(data), 0);
    if (r == 0 && fchmod(fd, mode) != 0) {
        fail_at("set-up: fchmod(%s, 0%o): %s", p, (unsigned)mode, en(errno));
        r = -1;
    }
    close(fd);
    return r;
}

static int mkdir_exact(const char *p, mode_t mode)
{
    if (mkdir(p, 0700) != 0 || chmod(p, mode) != 0) {
        fail_at("set-up: mkdir/chmod(%s, 0%o): %s", p, (unsigned)mode, en(errno));
        return -1;
    }
    return 0;
}

static int chown_or_fail(const char *p, uid_t u, gid_t g)
{
    if (lchown(p, u, g) == 0)
        return 0;
    fail_at("set-up: lchown(%s, %d, %d): %s", p, (int)u, (int)g, en(errno));
    return -1;
}

/* The n bytes at off of fd must equal want (n <= 1 MiB). */
static int want_data_fd(int fd, const char *what, off_t off, const void *want, size_t n)
{
    static char buf[1 << 20];
    if (n > sizeof buf) {
        fail_at("internal: want_data of %zu bytes", n);
        return -1;
    }
    ssize_t r = pread(fd, buf, n, off);
    if (r < 0) {
        fail_at("pread(%s, %zu at %lld): %s", what, n, (long long)off, en(errno));
        return -1;
    }
    if ((size_t)r != n) {
        fail_at("pread(%s, %zu at %lld) returned %zd", what, n, (long long)off, r);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (buf[i] != ((const char *)want)[i]) {
            fail_at("%s: byte %lld is 0x%02x, expected 0x%02x", what, (long long)off + (long long)i,
                    (unsigned char)buf[i], ((const unsigned char *)want)[i]);
            return -1;
        }
    }
    return 0;
}

static int want_data(const char *p, off_t off, const void *want, size_t n)
{
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fail_at("open(%s, O_RDONLY): %s", p, en(errno));
        return -1;
    }
    int r = want_data_fd(fd, p, off, want, n);
    close(fd);
    return r;
}

/* The whole file must be exactly the string s. */
static int want_text(const char *p, const char *s)
{
    if (want_size(p, (off_t)strlen(s)))
        return -1;
    return want_data(p, 0, s, strlen(s));
}

static int want_zeros(const char *p, off_t off, size_t n)
{
    static char z[1 << 20];
    return want_data(p, off, z, n);
}

/* A buffer of n pattern bytes (seeded), static, n <= 1 MiB. */
static const char *pattern(size_t n, unsigned seed)
{
    static char buf[2][1 << 20];
    static int which;
    char *b = buf[which ^= 1];
    uint32_t x = 2463534242u ^ seed * 2654435761u;
    for (size_t i = 0; i < n && i < sizeof buf[0]; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (char)(x | 1); /* never zero, so that holes show */
    }
    return b;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int ts_cmp(struct timespec a, struct timespec b)
{
    if (a.tv_sec != b.tv_sec)
        return a.tv_sec < b.tv_sec ? -1 : 1;
    if (a.tv_nsec != b.tv_nsec)
        return a.tv_nsec < b.tv_nsec ? -1 : 1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Child processes of a case: as root or as nobody, with two one-byte       */
/* signalling pipes and the child's failure detail passed back.             */

struct kid {
    pid_t pid;
    int res;  /* the child's detail (read end) */
    int up;   /* child -> parent signals (read end) */
    int down; /* parent -> child signals (write end) */
};

static int g_kid_up = -1, g_kid_down = -1; /* in a child: to / from its parent */

static int drop_to_nobody(void)
{
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0) {
        fail_at("dropping to uid/gid %d: %s", NOBODY, en(errno));
        return -1;
    }
    if (geteuid() != NOBODY || getegid() != NOBODY) {
        fail_at("still euid %u egid %u after dropping", (unsigned)geteuid(), (unsigned)getegid());
        return -1;
    }
    return 0;
}

static int kid_start(struct kid *k, int nobody, void (*fn)(void *), void *arg)
{
    int res[2], up[2], down[2];
    if (pipe2(res, O_CLOEXEC) || pipe2(up, O_CLOEXEC) || pipe2(down, O_CLOEXEC)) {
        fail_at("pipe2: %s", en(errno));
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fail_at("fork: %s", en(errno));
        return -1;
    }
    if (pid == 0) {
        close(res[0]);
        close(up[0]);
        close(down[1]);
        g_kid_up = up[1];
        g_kid_down = down[0];
        g_failed = 0;
        g_detail[0] = '\0';
        alarm(CASE_TIMEOUT_S);
        if (!nobody || drop_to_nobody() == 0)
            fn(arg);
        if (g_failed) {
            ssize_t w = write(res[1], g_detail, strlen(g_detail));
            (void)w;
        }
        _exit(g_failed ? 1 : 0);
    }
    close(res[1]);
    close(up[1]);
    close(down[0]);
    k->pid = pid;
    k->res = res[0];
    k->up = up[0];
    k->down = down[1];
    return 0;
}

/* Waits for the child; 0 if it passed, else takes over its detail. */
static int kid_finish(struct kid *k, const char *who)
{
    int status;
    while (waitpid(k->pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fail_at("waitpid: %s", en(errno));
            return -1;
        }
    }
    char buf[sizeof g_detail];
    fcntl(k->res, F_SETFL, O_NONBLOCK); /* a grandchild may hold the write end */
    ssize_t n = read(k->res, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(k->res);
    close(k->up);
    close(k->down);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFSIGNALED(status))
        fail_at("%s: killed by SIG%s%s", who, sigabbrev_np(WTERMSIG(status)),
                WTERMSIG(status) == SIGALRM ? " (timed out)" : "");
    else if (n > 0)
        fail_at("%s: %s", who, buf);
    else
        fail_at("%s: exit status %d", who, WEXITSTATUS(status));
    return -1;
}

static int run_kid(int nobody, void (*fn)(void *), void *arg, const char *who)
{
    struct kid k;
    if (kid_start(&k, nobody, fn, arg))
        return -1;
    return kid_finish(&k, who);
}

#define AS_NOBODY(fn, arg) TRY(run_kid(1, fn, arg, "as nobody"))
#define IN_CHILD(fn, arg) TRY(run_kid(0, fn, arg, "in the child"))

static int sig_put(int fd)
{
    char c = 1;
    if (write(fd, &c, 1) == 1)
        return 0;
    fail_at("signalling the other process: %s", en(errno));
    return -1;
}

static int sig_get(int fd, const char *whom)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    while ((r = poll(&p, 1, SYNC_TIMEOUT_MS)) < 0 && errno == EINTR)
        ;
    char c;
    if (r == 1 && read(fd, &c, 1) == 1)
        return 0;
    fail_at("waiting for %s: %s", whom, r == 0 ? "timed out" : "it went away");
    return -1;
}

/* In a child. */
#define TELL_PARENT() TRY(sig_put(g_kid_up))
#define AWAIT_PARENT() TRY(sig_get(g_kid_down, "the parent"))
/* In the parent. */
#define TELL_KID(k) TRY(sig_put((k)->down))
#define AWAIT_KID(k) TRY(sig_get((k)->up, "the child"))

/* ======================================================================== */
/* chmod                                                                    */

static void t_chmod_file_modes(void)
{
    static const mode_t modes[] = {0, 0400, 0644, 0755, 0777, 0111, 0640, 0606};
    TRY(mkfile("f", 0600, NULL));
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        OK(chmod("f", modes[i]));
        TRY(want_mode("f", S_IFREG | modes[i]));
    }
}

static void t_chmod_dir_modes(void)
{
    static const mode_t modes[] = {0700, 0555, 0751, 0, 0777};
    TRY(mkdir_exact("d", 0755));
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        OK(chmod("d", modes[i]));
        TRY(want_mode("d", S_IFDIR | modes[i]));
    }
}

static void t_chmod_setuid(void)
{
    TRY(mkfile("f", 0755, "#!/bin/sh\n"));
    OK(chmod("f", 04755));
    TRY(want_mode("f", S_IFREG | 04755));
}

static void t_chmod_setgid(void)
{
    TRY(mkfile("f", 0755, "#!/bin/sh\n"));
    OK(chmod("f", 02755));
    TRY(want_mode("f", S_IFREG | 02755));
}

static void t_chmod_sticky_dir(void)
{
    TRY(mkdir_exact("d", 0777));
    OK(chmod("d", 01777));
    TRY(want_mode("d", S_IFDIR | 01777));
}

static void t_chmod_all_bits(void)
{
    TRY(mkfile("f", 0600, NULL));
    OK(chmod("f", 07777));
    TRY(want_mode("f", S_IFREG | 07777));
    TRY(mkdir_exact("d", 0700));
    OK(chmod("d", 07777));
    TRY(want_mode("d", S_IFDIR | 07777));
}

static void t_chmod_fchmod(void)
{
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_RDWR, 0600));
    OK(fchmod(fd, 0751));
    struct stat st;
    OK(fstat(fd, &st));
    CHECK(st.st_mode == (S_IFREG | 0751), "fstat mode 0%o, expected 0100751", (unsigned)st.st_mode);
    close(fd);
    TRY(want_mode("f", S_IFREG | 0751));
}

static void t_chmod_follows_symlink(void)
{
    TRY(mkfile("f", 0600, NULL));
    OK(symlink("f", "l"));
    struct stat before;
    TRY(st_of("l", &before));
    OK(chmod("l", 0604));
    TRY(want_mode("f", S_IFREG | 0604));
    TRY(want_mode("l", before.st_mode));
}

static void t_chmod_enoent(void)
{
    ERR(chmod("missing", 0644), ENOENT);
}

static void nb_chmod_eperm(void *a)
{
    (void)a;
    ERR(chmod("f", 0777), EPERM);
}

static void t_chmod_nobody_eperm(void)
{
    TRY(mkfile("f", 0644, NULL));
    AS_NOBODY(nb_chmod_eperm, NULL);
    TRY(want_mode("f", S_IFREG | 0644));
}

static void nb_chmod_own(void *a)
{
    (void)a;
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
    OK(chmod("f", 0600));
    TRY(want_mode("f", S_IFREG | 0600));
}

static void t_chmod_nobody_own(void)
{
    AS_NOBODY(nb_chmod_own, NULL);
    TRY(want_owner("f", NOBODY, NOBODY));
    TRY(want_mode("f", S_IFREG | 0600));
}

static void nb_chmod_sgid(void *a)
{
    (void)a;
    OK(chmod("f", 02755)); /* succeeds, but S_ISGID is dropped: not in group 0 */
}

static void t_chmod_sgid_nonmember(void)
{
    TRY(mkfile("f", 0644, NULL));
    TRY(chown_or_fail("f", NOBODY, 0));
    AS_NOBODY(nb_chmod_sgid, NULL);
    TRY(want_mode("f", S_IFREG | 0755));
}

static void t_chmod_ctime(void)
{
    struct stat a, b;
    TRY(mkfile("f", 0644, NULL));
    TRY(st_of("f", &a));
    sleep_ms(30);
    OK(chmod("f", 0640));
    TRY(st_of("f", &b));
    CHECK(ts_cmp(b.st_ctim, a.st_ctim) > 0, "ctime did not advance (%lld.%09ld -> %lld.%09ld)",
          (long long)a.st_ctim.tv_sec, a.st_ctim.tv_nsec, (long long)b.st_ctim.tv_sec,
          b.st_ctim.tv_nsec);
    CHECK(ts_cmp(b.st_mtim, a.st_mtim) == 0, "chmod changed mtime");
}

/* ======================================================================== */
/* chown                                                                    */

static void t_chown_root(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(chown("f", NOBODY, NOBODY));
    TRY(want_owner("f", NOBODY, NOBODY));
    OK(chown("f", 0, 0));
    TRY(want_owner("f", 0, 0));
}

static void t_chown_minus_one(void)
{
    TRY(mkfile("f", 0644, NULL));
    TRY(chown_or_fail("f", NOBODY, NOBODY));
    OK(chown("f", (uid_t)-1, (gid_t)-1));
    TRY(want_owner("f", NOBODY, NOBODY));
}

static void t_chown_gid_only(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(chown("f", (uid_t)-1, NOBODY));
    TRY(want_owner("f", 0, NOBODY));
    OK(chown("f", NOBODY, (gid_t)-1));
    TRY(want_owner("f", NOBODY, NOBODY));
}

static void nb_chown_take(void *a)
{
    (void)a;
    ERR(chown("f", NOBODY, NOBODY), EPERM);
}

static void t_chown_nobody_eperm(void)
{
    TRY(mkfile("f", 0666, NULL));
    AS_NOBODY(nb_chown_take, NULL);
    TRY(want_owner("f", 0, 0));
}

static void nb_chown_give(void *a)
{
    (void)a;
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
    ERR(chown("f", 0, (gid_t)-1), EPERM);
    ERR(chown("f", (uid_t)-1, 0), EPERM); /* not a member of group 0 */
    OK(chown("f", NOBODY, NOBODY));       /* no change: allowed */
    OK(chown("f", (uid_t)-1, (gid_t)-1));
}

static void t_chown_nobody_own(void)
{
    AS_NOBODY(nb_chown_give, NULL);
    TRY(want_owner("f", NOBODY, NOBODY));
}

static void t_chown_clears_suid(void)
{
    TRY(mkfile("f", 04755, "#!/bin/sh\n"));
    OK(chown("f", NOBODY, NOBODY));
    TRY(want_mode("f", S_IFREG | 0755));
}

static void t_chown_clears_sgid_exec(void)
{
    TRY(mkfile("f", 02755, "#!/bin/sh\n"));
    OK(chown("f", NOBODY, NOBODY));
    TRY(want_mode("f", S_IFREG | 0755));
}

static void t_chown_keeps_sgid_noexec(void)
{
    /* S_ISGID without group execute (the old mandatory-locking mark) stays */
    TRY(mkfile("f", 02745, NULL));
    OK(chown("f", NOBODY, NOBODY));
    TRY(want_mode("f", S_IFREG | 02745));
}

static void t_chown_clears_suid_noexec(void)
{
    TRY(mkfile("f", 04644, NULL));
    OK(chown("f", NOBODY, NOBODY));
    TRY(want_mode("f", S_IFREG | 0644));
}

static void t_chown_same_clears_suid(void)
{
    /* chown(-1, -1) still kills S_ISUID on a regular file (ext4 does) */
    TRY(mkfile("f", 04755, NULL));
    OK(chown("f", (uid_t)-1, (gid_t)-1));
    TRY(want_mode("f", S_IFREG | 0755));
}

static void t_chown_dir_keeps_sgid(void)
{
    TRY(mkdir_exact("d", 02775));
    OK(chown("d", NOBODY, NOBODY));
    TRY(want_mode("d", S_IFDIR | 02775));
    TRY(want_owner("d", NOBODY, NOBODY));
}

static void t_chown_lchown(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(symlink("f", "l"));
    OK(lchown("l", NOBODY, NOBODY));
    TRY(want_owner("l", NOBODY, NOBODY));
    TRY(want_owner("f", 0, 0));
    OK(chown("l", NOBODY, 0)); /* follows */
    TRY(want_owner("f", NOBODY, 0));
    TRY(want_owner("l", NOBODY, NOBODY));
}

static void t_chown_fchown(void)
{
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_RDWR, 0600));
    OK(fchown(fd, NOBODY, NOBODY));
    struct stat st;
    OK(fstat(fd, &st));
    close(fd);
    CHECK(st.st_uid == NOBODY && st.st_gid == NOBODY, "fstat owner %u:%u", (unsigned)st.st_uid,
          (unsigned)st.st_gid);
    TRY(want_owner("f", NOBODY, NOBODY));
}

static void t_chown_enoent(void)
{
    ERR(chown("missing", 0, 0), ENOENT);
}

/* ======================================================================== */
/* link                                                                     */

static void t_link_nlink_ino(void)
{
    struct stat a, b;
    TRY(mkfile("f", 0644, "x"));
    OK(link("f", "g"));
    TRY(st_of("f", &a));
    TRY(st_of("g", &b));
    CHECK(a.st_ino == b.st_ino, "st_ino differs: %llu vs %llu", (unsigned long long)a.st_ino,
          (unsigned long long)b.st_ino);
    CHECK(a.st_nlink == 2 && b.st_nlink == 2, "st_nlink %lu and %lu, expected 2",
          (unsigned long)a.st_nlink, (unsigned long)b.st_nlink);
    OK(link("g", "h"));
    TRY(want_nlink("f", 3));
}

static void t_link_data(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(link("f", "g"));
    TRY(put("f", "through f", 9, 0));
    TRY(want_text("g", "through f"));
    TRY(put("g", "THROUGH G", 9, 0));
    TRY(want_text("f", "THROUGH G"));
}

static void t_link_eexist(void)
{
    TRY(mkfile("f", 0644, NULL));
    TRY(mkfile("g", 0644, NULL));
    ERR(link("f", "g"), EEXIST);
    OK(symlink("nowhere", "l"));
    ERR(link("f", "l"), EEXIST);
    TRY(want_nlink("f", 1));
}

static void t_link_dir_eperm(void)
{
    TRY(mkdir_exact("d", 0755));
    ERR(link("d", "e"), EPERM);
    TRY(want_absent("e"));
}

static void t_link_enoent(void)
{
    ERR(link("missing", "g"), ENOENT);
    TRY(mkfile("f", 0644, NULL));
    ERR(link("f", "nodir/g"), ENOENT);
}

static void t_link_unlink_one(void)
{
    TRY(mkfile("f", 0644, "kept"));
    OK(link("f", "g"));
    OK(unlink("f"));
    TRY(want_nlink("g", 1));
    TRY(want_text("g", "kept"));
}

static void t_link_ctime(void)
{
    struct stat a, b;
    TRY(mkfile("f", 0644, NULL));
    TRY(st_of("f", &a));
    sleep_ms(30);
    OK(link("f", "g"));
    TRY(st_of("f", &b));
    CHECK(ts_cmp(b.st_ctim, a.st_ctim) > 0, "link did not advance the ctime");
}

static void nb_link_eacces(void *a)
{
    (void)a;
    ERR(link("f", "d/g"), EACCES);
}

static void t_link_nobody_eacces(void)
{
    TRY(mkfile("f", 0666, NULL));
    TRY(mkdir_exact("d", 0755));
    AS_NOBODY(nb_link_eacces, NULL);
    TRY(want_absent("d/g"));
}

static void t_link_symlink_itself(void)
{
    /* link() does not follow a final symlink (Linux): the new name is a symlink */
    TRY(mkfile("f", 0644, NULL));
    OK(symlink("f", "l"));
    OK(link("l", "m"));
    TRY(want_mode("m", S_IFLNK | 0777));
    TRY(want_nlink("l", 2));
    TRY(want_nlink("f", 1));
}

/* ======================================================================== */
/* mkdir                                                                    */

static void mkdir_mode_case(mode_t mode)
{
    OK(mkdir("d", mode));
    TRY(want_mode("d", S_IFDIR | mode));
}

static void t_mkdir_0777(void) { mkdir_mode_case(0777); }
static void t_mkdir_01777(void) { mkdir_mode_case(01777); }
/* Linux's mkdir ignores S_ISGID in the mode (ext4 included): a directory
 * gets it only from a set-group-ID parent. */
static void t_mkdir_02775(void)
{
    OK(mkdir("d", 02775));
    TRY(want_mode("d", S_IFDIR | 0775));
    OK(chmod("d", 02775));
    OK(mkdir("d/e", 02775));
    TRY(want_mode("d/e", S_IFDIR | 02775));
    OK(mkdir("d/f", 0775));
    TRY(want_mode("d/f", S_IFDIR | 02775));
}
static void t_mkdir_0700(void) { mkdir_mode_case(0700); }
static void t_mkdir_0(void) { mkdir_mode_case(0); }

static void t_mkdir_umask(void)
{
    umask(022);
    OK(mkdir("d", 0777));
    umask(0);
    TRY(want_mode("d", S_IFDIR | 0755));
}

static void t_mkdir_eexist(void)
{
    TRY(mkdir_exact("d", 0755));
    TRY(mkfile("f", 0644, NULL));
    OK(symlink("nowhere", "l"));
    ERR(mkdir("d", 0755), EEXIST);
    ERR(mkdir("f", 0755), EEXIST);
    ERR(mkdir("l", 0755), EEXIST); /* a dangling symlink is not followed */
    TRY(want_absent("nowhere"));
}

static void t_mkdir_enoent_enotdir(void)
{
    ERR(mkdir("missing/d", 0755), ENOENT);
    TRY(mkfile("f", 0644, NULL));
    ERR(mkdir("f/d", 0755), ENOTDIR);
}

static void t_mkdir_nlink(void)
{
    TRY(mkdir_exact("p", 0755));
    TRY(want_nlink("p", 2));
    OK(mkdir("p/a", 0755));
    TRY(want_nlink("p/a", 2));
    TRY(want_nlink("p", 3));
    OK(mkdir("p/b", 0755));
    TRY(want_nlink("p", 4));
}

static void t_mkdir_empty_readdir(void)
{
    OK(mkdir("d", 0755));
    DIR *d = opendir("d");
    CHECK(d, "opendir(d): %s", en(errno));
    int dot = 0, dotdot = 0, other = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        !strcmp(e->d_name, ".") ? dot++ : !strcmp(e->d_name, "..") ? dotdot++ : other++;
    closedir(d);
    CHECK(dot == 1 && dotdot == 1 && other == 0, "readdir of a new directory: %d '.', %d '..', %d others",
          dot, dotdot, other);
}

static void nb_mkdir_own(void *a)
{
    (void)a;
    OK(mkdir("d", 0750));
}

static void t_mkdir_nobody_owner(void)
{
    AS_NOBODY(nb_mkdir_own, NULL);
    TRY(want_owner("d", NOBODY, NOBODY));
    TRY(want_mode("d", S_IFDIR | 0750));
}

static void nb_mkdir_eacces(void *a)
{
    (void)a;
    ERR(mkdir("p/d", 0755), EACCES);
}

static void t_mkdir_nobody_eacces(void)
{
    TRY(mkdir_exact("p", 0755));
    AS_NOBODY(nb_mkdir_eacces, NULL);
    TRY(want_absent("p/d"));
}

static void t_mkdir_sgid_inherit(void)
{
    TRY(mkdir_exact("p", 02775));
    TRY(chown_or_fail("p", 0, NOBODY));
    OK(mkdir("p/d", 0755));
    TRY(want_owner("p/d", 0, NOBODY));
    TRY(want_mode("p/d", S_IFDIR | 02755));
    int fd;
    OK(fd = open("p/f", O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
    TRY(want_owner("p/f", 0, NOBODY));
    TRY(want_mode("p/f", S_IFREG | 0644));
}

static void t_mkdir_parent_times(void)
{
    struct stat a, b;
    TRY(mkdir_exact("p", 0755));
    TRY(st_of("p", &a));
    sleep_ms(30);
    OK(mkdir("p/d", 0755));
    TRY(st_of("p", &b));
    CHECK(ts_cmp(b.st_mtim, a.st_mtim) > 0, "the parent's mtime did not advance");
    CHECK(ts_cmp(b.st_ctim, a.st_ctim) > 0, "the parent's ctime did not advance");
}

/* ======================================================================== */
/* mkfifo                                                                   */

static void t_mkfifo_mode(void)
{
    OK(mkfifo("p", 0644));
    TRY(want_mode("p", S_IFIFO | 0644));
    OK(mkfifo("q", 0600));
    TRY(want_mode("q", S_IFIFO | 0600));
}

static void t_mkfifo_eexist(void)
{
    OK(mkfifo("p", 0644));
    ERR(mkfifo("p", 0644), EEXIST);
    TRY(mkfile("f", 0644, NULL));
    ERR(mkfifo("f", 0644), EEXIST);
}

static void t_mkfifo_data(void)
{
    OK(mkfifo("p", 0600));
    int fd;
    OK(fd = open("p", O_RDWR | O_NONBLOCK));
    OK(write(fd, "fifo", 4));
    char buf[8];
    ssize_t n;
    OK(n = read(fd, buf, sizeof buf));
    close(fd);
    CHECK(n == 4 && !memcmp(buf, "fifo", 4), "read %zd bytes back from the fifo", n);
    TRY(want_size("p", 0));
}

static void nb_mkfifo(void *a)
{
    (void)a;
    OK(mkfifo("p", 0640));
}

static void t_mkfifo_nobody(void)
{
    AS_NOBODY(nb_mkfifo, NULL);
    TRY(want_owner("p", NOBODY, NOBODY));
    TRY(want_mode("p", S_IFIFO | 0640));
}

static void t_mkfifo_enoent(void)
{
    ERR(mkfifo("missing/p", 0644), ENOENT);
}

/* ======================================================================== */
/* mknod                                                                    */

static void t_mknod_fifo(void)
{
    OK(mknod("p", S_IFIFO | 0640, 0));
    TRY(want_mode("p", S_IFIFO | 0640));
}

static void t_mknod_socket(void)
{
    OK(mknod("s", S_IFSOCK | 0755, 0));
    TRY(want_mode("s", S_IFSOCK | 0755));
}

static void t_mknod_bind(void)
{
    int s;
    OK(s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, "sock");
    OK(bind(s, (struct sockaddr *)&a, sizeof a));
    TRY(want_mode("sock", S_IFSOCK | 0777)); /* umask 0 */
    int c;
    OK(c = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    OK(connect(c, (struct sockaddr *)&a, sizeof a));
    OK(send(c, "hello", 5, 0));
    char buf[8];
    ssize_t n;
    OK(n = recv(s, buf, sizeof buf, MSG_DONTWAIT));
    CHECK(n == 5 && !memcmp(buf, "hello", 5), "received %zd bytes through the socket", n);
    close(c);
    close(s);
}

static void t_mknod_bind_eaddrinuse(void)
{
    TRY(mkfile("f", 0644, NULL));
    int s;
    OK(s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, "f");
    ERR(bind(s, (struct sockaddr *)&a, sizeof a), EADDRINUSE);
    close(s);
}

static int want_dev(const char *p, mode_t type, unsigned maj, unsigned min)
{
    struct stat st;
    if (st_of(p, &st))
        return -1;
    if ((st.st_mode & S_IFMT) != type || major(st.st_rdev) != maj || minor(st.st_rdev) != min) {
        fail_at("%s: mode 0%o rdev %u:%u, expected type 0%o rdev %u:%u", p, (unsigned)st.st_mode,
                major(st.st_rdev), minor(st.st_rdev), (unsigned)type, maj, min);
        return -1;
    }
    return 0;
}

static void t_mknod_chr(void)
{
    OK(mknod("null", S_IFCHR | 0666, makedev(1, 3)));
    TRY(want_mode("null", S_IFCHR | 0666));
    TRY(want_dev("null", S_IFCHR, 1, 3));
}

static void t_mknod_blk(void)
{
    OK(mknod("loop", S_IFBLK | 0660, makedev(7, 0)));
    TRY(want_mode("loop", S_IFBLK | 0660));
    TRY(want_dev("loop", S_IFBLK, 7, 0));
    OK(mknod("big", S_IFBLK | 0600, makedev(259, 70000)));
    TRY(want_dev("big", S_IFBLK, 259, 70000));
}

static void t_mknod_reg(void)
{
    OK(mknod("f", S_IFREG | 0640, 0));
    TRY(want_mode("f", S_IFREG | 0640));
    TRY(want_size("f", 0));
    OK(mknod("g", 0604, 0)); /* no type: a regular file */
    TRY(want_mode("g", S_IFREG | 0604));
}

static void t_mknod_eexist(void)
{
    TRY(mkfile("f", 0644, NULL));
    ERR(mknod("f", S_IFIFO | 0644, 0), EEXIST);
    ERR(mknod("f", S_IFCHR | 0644, makedev(1, 3)), EEXIST);
}

static void nb_mknod(void *a)
{
    (void)a;
    ERR(mknod("c", S_IFCHR | 0666, makedev(1, 3)), EPERM);
    ERR(mknod("b", S_IFBLK | 0666, makedev(7, 0)), EPERM);
    OK(mknod("p", S_IFIFO | 0600, 0));
}

static void t_mknod_nobody(void)
{
    AS_NOBODY(nb_mknod, NULL);
    TRY(want_absent("c"));
    TRY(want_owner("p", NOBODY, NOBODY));
}

/* ======================================================================== */
/* open                                                                     */

static void open_mode_case(mode_t mode)
{
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_WRONLY, mode));
    struct stat st;
    OK(fstat(fd, &st));
    close(fd);
    CHECK(st.st_mode == (S_IFREG | mode), "fstat mode 0%o, expected 0%o", (unsigned)st.st_mode,
          (unsigned)(S_IFREG | mode));
    TRY(want_mode("f", S_IFREG | mode));
    TRY(want_owner("f", 0, 0));
}

static void t_open_0666(void) { open_mode_case(0666); }
static void t_open_0600(void) { open_mode_case(0600); }
static void t_open_04755(void) { open_mode_case(04755); }
static void t_open_02775(void) { open_mode_case(02775); }
static void t_open_0(void) { open_mode_case(0); }
static void t_open_01644(void) { open_mode_case(01644); }

static void t_open_umask(void)
{
    umask(027);
    int fd = open("f", O_CREAT | O_EXCL | O_WRONLY, 0666);
    int e = errno;
    umask(0);
    CHECK(fd >= 0, "open(O_CREAT) under umask 027: %s", en(e));
    close(fd);
    TRY(want_mode("f", S_IFREG | 0640));
}

static void t_open_excl(void)
{
    TRY(mkfile("f", 0644, "data"));
    ERR(open("f", O_CREAT | O_EXCL | O_WRONLY, 0600), EEXIST);
    TRY(mkdir_exact("d", 0755));
    ERR(open("d", O_CREAT | O_EXCL | O_WRONLY, 0600), EEXIST);
    OK(symlink("nowhere", "l"));
    ERR(open("l", O_CREAT | O_EXCL | O_WRONLY, 0600), EEXIST); /* not followed */
    TRY(want_absent("nowhere"));
    TRY(want_text("f", "data"));
}

static void t_open_creat_via_dangling(void)
{
    OK(symlink("target", "l"));
    int fd;
    OK(fd = open("l", O_CREAT | O_WRONLY, 0640));
    close(fd);
    TRY(want_mode("target", S_IFREG | 0640));
    TRY(want_mode("l", S_IFLNK | 0777));
}

static void t_open_trunc(void)
{
    TRY(mkfile("f", 0644, "some data to be cut"));
    int fd;
    OK(fd = open("f", O_WRONLY | O_TRUNC));
    struct stat st;
    OK(fstat(fd, &st));
    close(fd);
    CHECK(st.st_size == 0, "fstat size %lld after O_TRUNC", (long long)st.st_size);
    TRY(want_size("f", 0));
}

static void t_open_creat_existing(void)
{
    TRY(mkfile("f", 0640, "kept"));
    int fd;
    OK(fd = open("f", O_CREAT | O_WRONLY, 0777));
    close(fd);
    TRY(want_mode("f", S_IFREG | 0640));
    TRY(want_text("f", "kept"));
}

static void t_open_enoent(void)
{
    ERR(open("missing", O_RDONLY), ENOENT);
    ERR(open("missing", O_WRONLY), ENOENT);
    ERR(open("nodir/f", O_CREAT | O_WRONLY, 0644), ENOENT);
}

static void t_open_eisdir(void)
{
    TRY(mkdir_exact("d", 0755));
    ERR(open("d", O_WRONLY), EISDIR);
    ERR(open("d", O_RDWR), EISDIR);
    ERR(open("d", O_CREAT | O_WRONLY, 0644), EISDIR);
    int fd;
    OK(fd = open("d", O_RDONLY));
    close(fd);
}

static void t_open_enotdir(void)
{
    TRY(mkfile("f", 0644, NULL));
    ERR(open("f", O_RDONLY | O_DIRECTORY), ENOTDIR);
    ERR(open("f/x", O_RDONLY), ENOTDIR);
    ERR(open("f/x", O_CREAT | O_WRONLY, 0644), ENOTDIR);
}

static void nb_open_eacces(void *a)
{
    (void)a;
    ERR(open("secret", O_RDONLY), EACCES);
    ERR(open("pub", O_WRONLY), EACCES);
    ERR(open("pub", O_RDWR | O_TRUNC), EACCES);
    int fd;
    OK(fd = open("pub", O_RDONLY));
    close(fd);
}

static void t_open_nobody_eacces(void)
{
    TRY(mkfile("secret", 0600, "secret"));
    TRY(mkfile("pub", 0644, "public"));
    AS_NOBODY(nb_open_eacces, NULL);
    TRY(want_text("pub", "public"));
}

static void nb_open_create(void *a)
{
    (void)a;
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_RDWR, 0640));
    TRY(put_fd(fd, "f", "mine", 4, 0));
    close(fd);
}

static void t_open_nobody_creates(void)
{
    AS_NOBODY(nb_open_create, NULL);
    TRY(want_owner("f", NOBODY, NOBODY));
    TRY(want_mode("f", S_IFREG | 0640));
    TRY(want_text("f", "mine"));
}

static void nb_open_create_eacces(void *a)
{
    (void)a;
    ERR(open("p/f", O_CREAT | O_WRONLY, 0644), EACCES);
}

static void t_open_nobody_dir_eacces(void)
{
    TRY(mkdir_exact("p", 0755));
    AS_NOBODY(nb_open_create_eacces, NULL);
    TRY(want_absent("p/f"));
}

static void nb_open_sgid(void *a)
{
    (void)a;
    int fd;
    OK(fd = open("p/f", O_CREAT | O_EXCL | O_WRONLY, 02755));
    close(fd);
}

static void t_open_sgid_stripped(void)
{
    /* a file created in a set-group-ID directory of a group the creator is
     * not in: its group is the directory's, so S_ISGID is stripped */
    TRY(mkdir_exact("p", 02777));
    AS_NOBODY(nb_open_sgid, NULL);
    TRY(want_owner("p/f", NOBODY, 0));
    TRY(want_mode("p/f", S_IFREG | 0755));
}

static void t_open_nofollow(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(symlink("f", "l"));
    ERR(open("l", O_RDONLY | O_NOFOLLOW), ELOOP);
    int fd;
    OK(fd = open("f", O_RDONLY | O_NOFOLLOW));
    close(fd);
}

static void t_open_append(void)
{
    TRY(mkfile("f", 0644, "head"));
    int fd;
    OK(fd = open("f", O_WRONLY | O_APPEND));
    OK(lseek(fd, 0, SEEK_SET));
    OK(write(fd, "-tail", 5));
    close(fd);
    TRY(want_text("f", "head-tail"));
}

static void t_open_root_ignores_bits(void)
{
    TRY(mkfile("f", 0, "x"));
    int fd;
    OK(fd = open("f", O_RDWR));
    close(fd);
    TRY(mkdir_exact("d", 0));
    OK(fd = open("d/g", O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
}

static void t_open_parent_times(void)
{
    struct stat a, b;
    TRY(mkdir_exact("p", 0755));
    TRY(st_of("p", &a));
    sleep_ms(30);
    int fd;
    OK(fd = open("p/f", O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
    TRY(st_of("p", &b));
    CHECK(ts_cmp(b.st_mtim, a.st_mtim) > 0, "the parent's mtime did not advance");
}

/* ======================================================================== */
/* rename                                                                   */

static int ino_of(const char *p, ino_t *ino)
{
    struct stat st;
    if (st_of(p, &st))
        return -1;
    *ino = st.st_ino;
    return 0;
}

static int renameat2_(const char *a, const char *b, unsigned flags)
{
    return (int)syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, flags);
}

static void t_rename_file(void)
{
    ino_t i, j;
    TRY(mkfile("a", 0640, "content"));
    TRY(ino_of("a", &i));
    OK(rename("a", "b"));
    TRY(want_absent("a"));
    TRY(ino_of("b", &j));
    CHECK(i == j, "st_ino changed from %llu to %llu", (unsigned long long)i, (unsigned long long)j);
    TRY(want_mode("b", S_IFREG | 0640));
    TRY(want_text("b", "content"));
}

static void t_rename_dir(void)
{
    TRY(mkdir_exact("a", 0755));
    TRY(mkfile("a/f", 0644, "inside"));
    OK(rename("a", "b"));
    TRY(want_absent("a"));
    TRY(want_mode("b", S_IFDIR | 0755));
    TRY(want_text("b/f", "inside"));
}

static void t_rename_over_file(void)
{
    TRY(mkfile("a", 0644, "new"));
    TRY(mkfile("b", 0644, "old"));
    OK(link("b", "b2"));
    OK(rename("a", "b"));
    TRY(want_absent("a"));
    TRY(want_text("b", "new"));
    TRY(want_nlink("b2", 1));
    TRY(want_text("b2", "old"));
}

static void t_rename_dir_over_empty(void)
{
    TRY(mkdir_exact("a", 0755));
    TRY(mkfile("a/f", 0644, NULL));
    TRY(mkdir_exact("b", 0700));
    OK(rename("a", "b"));
    TRY(want_absent("a"));
    TRY(want_mode("b", S_IFDIR | 0755));
    TRY(want_size("b/f", 0));
}

static void t_rename_dir_over_nonempty(void)
{
    TRY(mkdir_exact("a", 0755));
    TRY(mkdir_exact("b", 0755));
    TRY(mkfile("b/f", 0644, NULL));
    ERR(rename("a", "b"), ENOTEMPTY);
    TRY(want_size("b/f", 0));
    TRY(want_mode("a", S_IFDIR | 0755));
}

static void t_rename_type_mismatch(void)
{
    TRY(mkfile("f", 0644, NULL));
    TRY(mkdir_exact("d", 0755));
    ERR(rename("f", "d"), EISDIR);
    ERR(rename("d", "f"), ENOTDIR);
}

static void t_rename_noreplace(void)
{
    TRY(mkfile("a", 0644, "a"));
    TRY(mkfile("b", 0644, "b"));
    ERR(renameat2_("a", "b", RENAME_NOREPLACE), EEXIST);
    TRY(want_text("a", "a"));
    TRY(want_text("b", "b"));
    OK(renameat2_("a", "c", RENAME_NOREPLACE));
    TRY(want_absent("a"));
    TRY(want_text("c", "a"));
}

static void t_rename_exchange(void)
{
    ino_t ia, ib, ja, jb;
    TRY(mkfile("a", 0644, "first"));
    TRY(mkfile("b", 0600, "second"));
    TRY(ino_of("a", &ia));
    TRY(ino_of("b", &ib));
    OK(renameat2_("a", "b", RENAME_EXCHANGE));
    TRY(ino_of("a", &ja));
    TRY(ino_of("b", &jb));
    CHECK(ja == ib && jb == ia, "inodes not swapped");
    TRY(want_text("a", "second"));
    TRY(want_text("b", "first"));
    TRY(want_mode("a", S_IFREG | 0600));
}

static void t_rename_exchange_dir(void)
{
    TRY(mkfile("f", 0644, "file"));
    TRY(mkdir_exact("d", 0755));
    TRY(mkfile("d/x", 0644, "x"));
    OK(renameat2_("f", "d", RENAME_EXCHANGE));
    TRY(want_mode("f", S_IFDIR | 0755));
    TRY(want_text("f/x", "x"));
    TRY(want_text("d", "file"));
}

static void t_rename_exchange_enoent(void)
{
    TRY(mkfile("a", 0644, NULL));
    ERR(renameat2_("a", "missing", RENAME_EXCHANGE), ENOENT);
    TRY(want_size("a", 0));
}

static void t_rename_enoent(void)
{
    ERR(rename("missing", "b"), ENOENT);
    TRY(mkfile("a", 0644, NULL));
    ERR(rename("a", "nodir/b"), ENOENT);
}

static void t_rename_into_self(void)
{
    TRY(mkdir_exact("a", 0755));
    TRY(mkdir_exact("a/b", 0755));
    ERR(rename("a", "a/b/c"), EINVAL);
    ERR(rename("a", "a/c"), EINVAL);
}

static void t_rename_same_inode(void)
{
    TRY(mkfile("a", 0644, "x"));
    OK(link("a", "b"));
    OK(rename("a", "b")); /* the same file: nothing happens */
    TRY(want_nlink("a", 2));
    TRY(want_nlink("b", 2));
}

static void t_rename_across_dirs(void)
{
    TRY(mkdir_exact("p", 0755));
    TRY(mkdir_exact("q", 0755));
    TRY(mkdir_exact("p/d", 0755));
    TRY(mkfile("p/f", 0644, "f"));
    OK(rename("p/d", "q/d"));
    OK(rename("p/f", "q/f"));
    TRY(want_nlink("p", 2));
    TRY(want_nlink("q", 3));
    TRY(want_text("q/f", "f"));
    ino_t q, dd;
    TRY(ino_of("q", &q));
    TRY(ino_of("q/d/..", &dd));
    CHECK(q == dd, "q/d/.. is inode %llu, q is %llu", (unsigned long long)dd, (unsigned long long)q);
}

static void nb_rename_sticky(void *a)
{
    (void)a;
    ERR(rename("t/root", "t/mine"), EPERM);
    int fd;
    OK(fd = open("t/own", O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
    OK(rename("t/own", "t/own2"));
}

static void t_rename_sticky(void)
{
    TRY(mkdir_exact("t", 01777));
    TRY(mkfile("t/root", 0666, NULL));
    AS_NOBODY(nb_rename_sticky, NULL);
    TRY(want_size("t/root", 0));
    TRY(want_owner("t/own2", NOBODY, NOBODY));
}

static void t_rename_symlink(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(symlink("f", "l"));
    OK(rename("l", "m"));
    TRY(want_mode("m", S_IFLNK | 0777));
    TRY(want_mode("f", S_IFREG | 0644));
}

static void t_rename_ctime(void)
{
    struct stat a, b;
    TRY(mkfile("f", 0644, NULL));
    TRY(st_of("f", &a));
    sleep_ms(30);
    OK(rename("f", "g"));
    TRY(st_of("g", &b));
    CHECK(ts_cmp(b.st_ctim, a.st_ctim) > 0, "rename did not advance the ctime");
}

/* ======================================================================== */
/* rmdir                                                                    */

static void t_rmdir_empty(void)
{
    TRY(mkdir_exact("p", 0755));
    TRY(mkdir_exact("p/d", 0755));
    OK(rmdir("p/d"));
    TRY(want_absent("p/d"));
    TRY(want_nlink("p", 2));
}

static void t_rmdir_enotempty(void)
{
    TRY(mkdir_exact("d", 0755));
    TRY(mkfile("d/.hidden", 0644, NULL));
    ERR(rmdir("d"), ENOTEMPTY);
    TRY(mkdir_exact("e", 0755));
    TRY(mkdir_exact("e/sub", 0755));
    ERR(rmdir("e"), ENOTEMPTY);
}

static void t_rmdir_enotdir(void)
{
    TRY(mkfile("f", 0644, NULL));
    ERR(rmdir("f"), ENOTDIR);
    TRY(mkdir_exact("d", 0755));
    OK(symlink("d", "l"));
    ERR(rmdir("l"), ENOTDIR);
    TRY(want_mode("d", S_IFDIR | 0755));
}

static void t_rmdir_enoent(void)
{
    ERR(rmdir("missing"), ENOENT);
}

static void t_rmdir_dot(void)
{
    TRY(mkdir_exact("d", 0755));
    ERR(rmdir("d/."), EINVAL);
}

static void nb_rmdir_denied(void *a)
{
    (void)a;
    ERR(rmdir("p/d"), EACCES);
    ERR(rmdir("t/d"), EPERM);
}

static void t_rmdir_nobody(void)
{
    TRY(mkdir_exact("p", 0755));
    TRY(mkdir_exact("p/d", 0777));
    TRY(mkdir_exact("t", 01777));
    TRY(mkdir_exact("t/d", 0777));
    AS_NOBODY(nb_rmdir_denied, NULL);
    TRY(want_mode("p/d", S_IFDIR | 0777));
    TRY(want_mode("t/d", S_IFDIR | 0777));
}

/* ======================================================================== */
/* symlink                                                                  */

static int want_link(const char *p, const char *target)
{
    static char buf[PATH_MAX + 1];
    ssize_t n = readlink(p, buf, sizeof buf);
    if (n < 0) {
        fail_at("readlink(%s): %s", p, en(errno));
        return -1;
    }
    size_t len = strlen(target);
    if ((size_t)n != len || memcmp(buf, target, len) != 0) {
        fail_at("readlink(%s) gave %zd bytes \"%.*s\", expected %zu \"%s\"", p, n,
                (int)(n > 80 ? 80 : n), buf, len, len > 80 ? "(long)" : target);
        return -1;
    }
    return 0;
}

static void t_symlink_readlink(void)
{
    static const char *targets[] = {"f", "../x/y", "/abs/path", "with space", "d/", "ünïcødé",
                                    "a\nb"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        char name[16];
        snprintf(name, sizeof name, "l%zu", i);
        OK(symlink(targets[i], name));
        TRY(want_link(name, targets[i]));
    }
}

static void t_symlink_lstat(void)
{
    OK(symlink("some/target", "l"));
    TRY(want_mode("l", S_IFLNK | 0777));
    TRY(want_size("l", 11));
    TRY(want_nlink("l", 1));
}

static void t_symlink_dangling(void)
{
    OK(symlink("missing", "l"));
    struct stat st;
    ERR(stat("l", &st), ENOENT);
    TRY(want_mode("l", S_IFLNK | 0777));
    TRY(want_link("l", "missing"));
}

static void t_symlink_eexist(void)
{
    TRY(mkfile("f", 0644, NULL));
    ERR(symlink("x", "f"), EEXIST);
    OK(symlink("x", "l"));
    ERR(symlink("y", "l"), EEXIST);
    TRY(want_link("l", "x"));
}

static void t_symlink_follow(void)
{
    TRY(mkfile("f", 0640, "target data"));
    OK(symlink("f", "l1"));
    OK(symlink("l1", "l2"));
    struct stat a, b;
    OK(stat("l2", &a));
    TRY(st_of("f", &b));
    CHECK(a.st_ino == b.st_ino && a.st_mode == (S_IFREG | 0640), "stat through the links: ino %llu mode 0%o",
          (unsigned long long)a.st_ino, (unsigned)a.st_mode);
    TRY(want_data("l2", 0, "target data", 11));
}

static void t_symlink_long(void)
{
    static char t[4096];
    memset(t, 'a', sizeof t);
    for (size_t i = 50; i < sizeof t; i += 50)
        t[i] = '/';
    t[1000] = '\0';
    OK(symlink(t, "l1000"));
    TRY(want_link("l1000", t));
    TRY(want_size("l1000", 1000));
    t[1000] = 'a';
    t[4095] = '\0';
    OK(symlink(t, "l4095"));
    TRY(want_link("l4095", t));
}

static void t_symlink_readlink_einval(void)
{
    TRY(mkfile("f", 0644, NULL));
    char buf[16];
    ERR(readlink("f", buf, sizeof buf), EINVAL);
    ERR(readlink("missing", buf, sizeof buf), ENOENT);
}

static void t_symlink_short_buffer(void)
{
    OK(symlink("0123456789", "l"));
    char buf[16];
    memset(buf, '#', sizeof buf);
    ssize_t n;
    OK(n = readlink("l", buf, 4));
    CHECK(n == 4 && !memcmp(buf, "0123", 4) && buf[4] == '#', "readlink into 4 bytes gave %zd", n);
}

static void t_symlink_eloop(void)
{
    OK(symlink("b", "a"));
    OK(symlink("a", "b"));
    ERR(open("a", O_RDONLY), ELOOP);
    struct stat st;
    ERR(stat("a", &st), ELOOP);
}

static void nb_symlink(void *a)
{
    (void)a;
    OK(symlink("target", "l"));
}

static void t_symlink_nobody(void)
{
    AS_NOBODY(nb_symlink, NULL);
    TRY(want_owner("l", NOBODY, NOBODY));
    TRY(want_link("l", "target"));
}

/* ======================================================================== */
/* truncate                                                                 */

static void t_truncate_grow(void)
{
    TRY(mkfile("f", 0644, "abc"));
    OK(truncate("f", 10000));
    TRY(want_size("f", 10000));
    TRY(want_data("f", 0, "abc", 3));
    TRY(want_zeros("f", 3, 10000 - 3));
}

static void t_truncate_shrink(void)
{
    TRY(mkfile("f", 0644, "0123456789"));
    OK(truncate("f", 4));
    TRY(want_text("f", "0123"));
    OK(truncate("f", 0));
    TRY(want_size("f", 0));
}

static void t_ftruncate_grow(void)
{
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_RDWR, 0644));
    TRY(put_fd(fd, "f", "xyz", 3, 0));
    OK(ftruncate(fd, 70000));
    struct stat st;
    OK(fstat(fd, &st));
    CHECK(st.st_size == 70000, "fstat size %lld", (long long)st.st_size);
    close(fd);
    TRY(want_data("f", 0, "xyz", 3));
    TRY(want_zeros("f", 3, 70000 - 3));
}

static void t_ftruncate_shrink(void)
{
    const char *p = pattern(65536, 1);
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_RDWR, 0644));
    TRY(put_fd(fd, "f", p, 65536, 0));
    OK(ftruncate(fd, 5000));
    close(fd);
    TRY(want_size("f", 5000));
    TRY(want_data("f", 0, p, 5000));
}

static void t_truncate_shrink_grow(void)
{
    const char *p = pattern(20000, 2);
    TRY(mkfile("f", 0644, NULL));
    TRY(put("f", p, 20000, 0));
    OK(truncate("f", 100));
    OK(truncate("f", 20000));
    TRY(want_data("f", 0, p, 100));
    TRY(want_zeros("f", 100, 20000 - 100)); /* the old data must not come back */
}

static void t_truncate_errors(void)
{
    TRY(mkdir_exact("d", 0755));
    ERR(truncate("d", 0), EISDIR);
    TRY(mkfile("f", 0644, "x"));
    ERR(truncate("f", -1), EINVAL);
    ERR(truncate("missing", 0), ENOENT);
    int fd;
    OK(fd = open("f", O_RDONLY));
    ERR2(ftruncate(fd, 0), EINVAL, EBADF);
    close(fd);
    TRY(want_size("f", 1));
}

static void nb_truncate(void *a)
{
    (void)a;
    ERR(truncate("f", 0), EACCES);
    OK(truncate("g", 3));
}

static void t_truncate_nobody(void)
{
    TRY(mkfile("f", 0644, "root's"));
    TRY(mkfile("g", 0666, "anyone's"));
    AS_NOBODY(nb_truncate, NULL);
    TRY(want_text("f", "root's"));
    TRY(want_text("g", "any"));
}

static void t_truncate_times(void)
{
    struct stat a, b;
    TRY(mkfile("f", 0644, "abc"));
    TRY(st_of("f", &a));
    sleep_ms(30);
    OK(truncate("f", 1));
    TRY(st_of("f", &b));
    CHECK(ts_cmp(b.st_mtim, a.st_mtim) > 0, "truncate did not advance the mtime");
    CHECK(ts_cmp(b.st_ctim, a.st_ctim) > 0, "truncate did not advance the ctime");
}

static void t_truncate_hole_write(void)
{
    TRY(mkfile("f", 0644, NULL));
    TRY(put("f", "end", 3, 1000000));
    TRY(want_size("f", 1000003));
    TRY(want_zeros("f", 0, 1000000));
    TRY(want_data("f", 1000000, "end", 3));
}

static void t_truncate_huge(void)
{
    TRY(mkfile("f", 0644, NULL));
    off_t big = (off_t)1 << 40;
    OK(truncate("f", big));
    TRY(want_size("f", big));
    TRY(want_zeros("f", big - 4096, 4096));
    TRY(put("f", "tail", 4, big - 4));
    TRY(want_data("f", big - 4, "tail", 4));
    OK(truncate("f", 0));
}

/* ======================================================================== */
/* unlink                                                                   */

static void t_unlink_nlink(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(link("f", "g"));
    OK(link("f", "h"));
    TRY(want_nlink("f", 3));
    OK(unlink("g"));
    TRY(want_nlink("f", 2));
    TRY(want_absent("g"));
    OK(unlink("h"));
    TRY(want_nlink("f", 1));
}

static void t_unlink_dir(void)
{
    TRY(mkdir_exact("d", 0755));
    ERR2(unlink("d"), EISDIR, EPERM);
    TRY(want_mode("d", S_IFDIR | 0755));
}

static void t_unlink_enoent(void)
{
    ERR(unlink("missing"), ENOENT);
    ERR(unlink("nodir/f"), ENOENT);
}

static void t_unlink_open_file(void)
{
    TRY(mkfile("f", 0644, "still here"));
    int fd;
    OK(fd = open("f", O_RDWR));
    OK(unlink("f"));
    TRY(want_absent("f"));
    struct stat st;
    OK(fstat(fd, &st));
    CHECK(st.st_nlink == 0, "fstat st_nlink %lu after unlink", (unsigned long)st.st_nlink);
    TRY(want_data_fd(fd, "the unlinked f", 0, "still here", 10));
    TRY(put_fd(fd, "the unlinked f", "STILL", 5, 0));
    TRY(want_data_fd(fd, "the unlinked f", 0, "STILL here", 10));
    close(fd);
}

static void nb_unlink_denied(void *a)
{
    (void)a;
    ERR(unlink("t/root"), EPERM);
    ERR(unlink("p/f"), EACCES);
    int fd;
    OK(fd = open("t/own", O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
    OK(unlink("t/own"));
}

static void t_unlink_nobody(void)
{
    TRY(mkdir_exact("t", 01777));
    TRY(mkfile("t/root", 0666, NULL));
    TRY(mkdir_exact("p", 0755));
    TRY(mkfile("p/f", 0666, NULL));
    AS_NOBODY(nb_unlink_denied, NULL);
    TRY(want_size("t/root", 0));
    TRY(want_size("p/f", 0));
    TRY(want_absent("t/own"));
}

static void t_unlink_symlink(void)
{
    TRY(mkfile("f", 0644, "x"));
    OK(symlink("f", "l"));
    OK(unlink("l"));
    TRY(want_absent("l"));
    TRY(want_text("f", "x"));
}

static void t_unlink_special(void)
{
    OK(mkfifo("p", 0644));
    OK(mknod("s", S_IFSOCK | 0644, 0));
    OK(mknod("c", S_IFCHR | 0644, makedev(1, 3)));
    OK(unlink("p"));
    OK(unlink("s"));
    OK(unlink("c"));
    TRY(want_absent("p"));
    TRY(want_absent("s"));
    TRY(want_absent("c"));
}

static void t_unlink_parent_times(void)
{
    struct stat a, b;
    TRY(mkdir_exact("p", 0755));
    TRY(mkfile("p/f", 0644, NULL));
    TRY(st_of("p", &a));
    sleep_ms(30);
    OK(unlink("p/f"));
    TRY(st_of("p", &b));
    CHECK(ts_cmp(b.st_mtim, a.st_mtim) > 0, "the parent's mtime did not advance");
}

/* ======================================================================== */
/* utimensat                                                                */

static int want_times(const char *p, int nofollow, struct timespec at, struct timespec mt)
{
    struct stat st;
    if ((nofollow ? lstat(p, &st) : stat(p, &st)) != 0) {
        fail_at("stat(%s): %s", p, en(errno));
        return -1;
    }
    if (ts_cmp(st.st_atim, at) == 0 && ts_cmp(st.st_mtim, mt) == 0)
        return 0;
    fail_at("%s: atime %lld.%09ld mtime %lld.%09ld, expected %lld.%09ld and %lld.%09ld", p,
            (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec, (long long)st.st_mtim.tv_sec,
            st.st_mtim.tv_nsec, (long long)at.tv_sec, at.tv_nsec, (long long)mt.tv_sec, mt.tv_nsec);
    return -1;
}

static const struct timespec T1 = {1000000000, 123456789}, T2 = {1200000000, 987654321},
                             T3 = {1300000000, 5};

static void t_utimens_explicit(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec ts[2] = {T1, T2};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    TRY(want_times("f", 0, T1, T2));
}

/* The time is "now" give or take the guest/host clock skew and granularity. */
static int near_now(const char *what, struct timespec t, time_t lo, time_t hi)
{
    if (t.tv_sec >= lo - 10 && t.tv_sec <= hi + 10)
        return 0;
    fail_at("%s is %lld, now is %lld..%lld", what, (long long)t.tv_sec, (long long)lo, (long long)hi);
    return -1;
}

static void t_utimens_now(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec ts[2] = {T1, T2};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    time_t lo = time(NULL);
    ts[0].tv_nsec = UTIME_NOW;
    ts[1].tv_nsec = UTIME_NOW;
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    time_t hi = time(NULL);
    struct stat st;
    TRY(st_of("f", &st));
    TRY(near_now("atime", st.st_atim, lo, hi));
    TRY(near_now("mtime", st.st_mtim, lo, hi));
}

static void t_utimens_null(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec ts[2] = {T1, T2};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    time_t lo = time(NULL);
    OK(utimensat(AT_FDCWD, "f", NULL, 0));
    time_t hi = time(NULL);
    struct stat st;
    TRY(st_of("f", &st));
    TRY(near_now("atime", st.st_atim, lo, hi));
    TRY(near_now("mtime", st.st_mtim, lo, hi));
}

static void t_utimens_omit_atime(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec ts[2] = {T1, T2};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    ts[0].tv_nsec = UTIME_OMIT;
    ts[1] = T3;
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    TRY(want_times("f", 0, T1, T3));
}

static void t_utimens_omit_mtime(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec ts[2] = {T1, T2};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    ts[0] = T3;
    ts[1].tv_nsec = UTIME_OMIT;
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    TRY(want_times("f", 0, T3, T2));
    ts[0].tv_nsec = UTIME_OMIT;
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    TRY(want_times("f", 0, T3, T2));
}

static void t_utimens_nofollow(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(symlink("f", "l"));
    struct timespec ts[2] = {T1, T2}, us[2] = {T3, T3};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    OK(utimensat(AT_FDCWD, "l", us, AT_SYMLINK_NOFOLLOW));
    TRY(want_times("l", 1, T3, T3));
    TRY(want_times("f", 0, T1, T2));
    OK(utimensat(AT_FDCWD, "l", ts, 0)); /* follows (and may touch the link's atime) */
    TRY(want_times("f", 0, T1, T2));
    struct stat st;
    TRY(st_of("l", &st));
    CHECK(ts_cmp(st.st_mtim, T3) == 0, "following l changed its mtime");
}

static void t_utimens_futimens(void)
{
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_RDWR, 0644));
    struct timespec ts[2] = {T2, T1};
    OK(futimens(fd, ts));
    close(fd);
    TRY(want_times("f", 0, T2, T1));
}

static void nb_utimens(void *a)
{
    (void)a;
    struct timespec ts[2] = {T3, T3};
    ERR(utimensat(AT_FDCWD, "ro", ts, 0), EPERM);
    ERR(utimensat(AT_FDCWD, "ro", NULL, 0), EACCES);
    ERR(utimensat(AT_FDCWD, "rw", ts, 0), EPERM);
    OK(utimensat(AT_FDCWD, "rw", NULL, 0)); /* write permission suffices for "now" */
    int fd;
    OK(fd = open("own", O_CREAT | O_EXCL | O_WRONLY, 0600));
    close(fd);
    OK(utimensat(AT_FDCWD, "own", ts, 0));
    TRY(want_times("own", 0, T3, T3));
}

static void t_utimens_nobody(void)
{
    struct timespec ts[2] = {T1, T2};
    TRY(mkfile("ro", 0644, NULL));
    TRY(mkfile("rw", 0666, NULL));
    OK(utimensat(AT_FDCWD, "ro", ts, 0));
    OK(utimensat(AT_FDCWD, "rw", ts, 0));
    AS_NOBODY(nb_utimens, NULL);
    TRY(want_times("ro", 0, T1, T2));
}

static void t_utimens_enoent(void)
{
    ERR(utimensat(AT_FDCWD, "missing", NULL, 0), ENOENT);
}

static void t_utimens_y2100(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec big = {4102444800, 999999999}; /* 2100-01-01 */
    struct timespec ts[2] = {big, big};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    TRY(want_times("f", 0, big, big));
}

static void t_utimens_pre1970(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec old = {-31536000, 500}; /* 1969-01-01 */
    struct timespec ts[2] = {old, old};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    TRY(want_times("f", 0, old, old));
}

static void t_utimens_ctime(void)
{
    TRY(mkfile("f", 0644, NULL));
    time_t lo = time(NULL);
    struct timespec ts[2] = {T1, T2};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    struct stat st;
    TRY(st_of("f", &st));
    TRY(near_now("ctime", st.st_ctim, lo, time(NULL)));
}

static void t_utimens_write_after(void)
{
    TRY(mkfile("f", 0644, NULL));
    struct timespec ts[2] = {T1, T2};
    OK(utimensat(AT_FDCWD, "f", ts, 0));
    time_t lo = time(NULL);
    TRY(put("f", "x", 1, 0));
    struct stat st;
    TRY(st_of("f", &st));
    TRY(near_now("mtime after a write", st.st_mtim, lo, time(NULL)));
}

/* ======================================================================== */
/* names                                                                    */

static char *name_of(size_t len, char c)
{
    static char n[2][300];
    static int which;
    char *p = n[which ^= 1];
    memset(p, c, len);
    p[len] = '\0';
    return p;
}

static void t_names_255(void)
{
    const char *n = name_of(255, 'a');
    int fd;
    OK(fd = open(n, O_CREAT | O_EXCL | O_WRONLY, 0644));
    close(fd);
    TRY(want_mode(n, S_IFREG | 0644));
    const char *m = name_of(255, 'b');
    OK(mkdir(m, 0755));
    OK(rmdir(m));
    OK(symlink(n, m));
    OK(unlink(m));
    OK(link(n, m));
    OK(unlink(n));
    OK(rename(m, n));
    TRY(want_nlink(n, 1));
}

static void t_names_256_open(void)
{
    ERR(open(name_of(256, 'a'), O_CREAT | O_WRONLY, 0644), ENAMETOOLONG);
}

static void t_names_256_mkdir(void)
{
    ERR(mkdir(name_of(256, 'a'), 0755), ENAMETOOLONG);
}

static void t_names_256_symlink(void)
{
    ERR(symlink("target", name_of(256, 'a')), ENAMETOOLONG);
}

static void t_names_256_link(void)
{
    TRY(mkfile("f", 0644, NULL));
    ERR(link("f", name_of(256, 'a')), ENAMETOOLONG);
    TRY(want_nlink("f", 1));
}

static void t_names_256_rename(void)
{
    TRY(mkfile("f", 0644, NULL));
    ERR(rename("f", name_of(256, 'a')), ENAMETOOLONG);
    TRY(want_size("f", 0));
}

static void t_names_256_lookup(void)
{
    struct stat st;
    const char *n = name_of(256, 'a');
    ERR(lstat(n, &st), ENAMETOOLONG);
    ERR(unlink(n), ENAMETOOLONG);
    char path[600];
    TRY(mkdir_exact("x", 0755));
    snprintf(path, sizeof path, "x/%s/y", n);
    ERR(lstat(path, &st), ENAMETOOLONG);
}

static void t_names_bytes(void)
{
    static const char *names[] = {" lead space", "-dash", "new\nline", "tab\there", "ünïcødé 名前",
                                  "*?[]{}", "back\\slash", "\x01\x7f\xfe\xff", "..dots", "trail.",
                                  "'\"quotes\"'"};
    const size_t n = sizeof names / sizeof names[0];
    for (size_t i = 0; i < n; i++)
        TRY(mkfile(names[i], 0644, names[i]));
    int seen[sizeof names / sizeof names[0]] = {0};
    DIR *d = opendir(".");
    CHECK(d, "opendir: %s", en(errno));
    struct dirent *e;
    int other = 0;
    while ((e = readdir(d))) {
        size_t i;
        for (i = 0; i < n && strcmp(e->d_name, names[i]); i++)
            ;
        if (i < n)
            seen[i]++;
        else if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            other++;
    }
    closedir(d);
    CHECK(other == 0, "readdir returned %d unexpected names", other);
    for (size_t i = 0; i < n; i++) {
        CHECK(seen[i] == 1, "readdir listed name #%zu %d times", i, seen[i]);
        TRY(want_text(names[i], names[i]));
    }
}

static void t_names_readdir_many(void)
{
    enum { N = 600 };
    static unsigned char seen[N];
    char name[256];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "%s-%04d", name_of(200, 'n'), i);
        int fd = open(name, O_CREAT | O_EXCL | O_WRONLY, 0644);
        CHECK(fd >= 0, "creating entry %d: %s", i, en(errno));
        close(fd);
    }
    DIR *d = opendir(".");
    CHECK(d, "opendir: %s", en(errno));
    struct dirent *e;
    int dots = 0, other = 0;
    while ((e = readdir(d))) {
        const char *dash = strrchr(e->d_name, '-');
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            dots++;
        else if (strlen(e->d_name) == 205 && dash && atoi(dash + 1) < N)
            seen[atoi(dash + 1)]++;
        else
            other++;
    }
    closedir(d);
    CHECK(dots == 2 && other == 0, "readdir: %d dot entries, %d unexpected", dots, other);
    for (int i = 0; i < N; i++)
        CHECK(seen[i] == 1, "readdir listed entry %d %d times", i, seen[i]);
}

static void t_names_dtype(void)
{
    TRY(mkfile("f", 0644, NULL));
    TRY(mkdir_exact("d", 0755));
    OK(symlink("f", "l"));
    OK(mkfifo("p", 0644));
    OK(mknod("s", S_IFSOCK | 0644, 0));
    OK(mknod("c", S_IFCHR | 0644, makedev(1, 3)));
    OK(mknod("b", S_IFBLK | 0644, makedev(7, 0)));
    static const struct { const char *n; unsigned char t; } want[] = {
        {"f", DT_REG}, {"d", DT_DIR}, {"l", DT_LNK}, {"p", DT_FIFO},
        {"s", DT_SOCK}, {"c", DT_CHR}, {"b", DT_BLK}, {".", DT_DIR}};
    DIR *dd = opendir(".");
    CHECK(dd, "opendir: %s", en(errno));
    struct dirent *e;
    int found = 0;
    while ((e = readdir(dd))) {
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            if (strcmp(e->d_name, want[i].n))
                continue;
            found++;
            if (e->d_type != want[i].t) {
                closedir(dd);
                FAIL("d_type of %s is %d, expected %d", want[i].n, e->d_type, want[i].t);
            }
        }
    }
    closedir(dd);
    CHECK(found == 8, "readdir found %d of the 8 entries", found);
}

/* ======================================================================== */
/* xattr                                                                    */

static int want_xattr(const char *p, const char *name, const char *val, size_t len)
{
    char buf[4096];
    ssize_t n = lgetxattr(p, name, buf, sizeof buf);
    if (n < 0) {
        fail_at("lgetxattr(%s, %s): %s", p, name, en(errno));
        return -1;
    }
    if ((size_t)n != len || memcmp(buf, val, len) != 0) {
        fail_at("lgetxattr(%s, %s) gave %zd bytes, expected %zu", p, name, n, len);
        return -1;
    }
    return 0;
}

/* The names listxattr gives, NUL-separated, into buf; count returned. */
static int list_names(const char *p, char *buf, size_t size, ssize_t *len)
{
    *len = llistxattr(p, buf, size);
    if (*len < 0) {
        fail_at("llistxattr(%s): %s", p, en(errno));
        return -1;
    }
    return 0;
}

static int has_name(const char *list, ssize_t len, const char *name)
{
    for (const char *q = list; q < list + len; q += strlen(q) + 1)
        if (!strcmp(q, name))
            return 1;
    return 0;
}

static void t_xattr_set_get(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.test", "value", 5, 0));
    TRY(want_xattr("f", "user.test", "value", 5));
    OK(setxattr("f", "user.test", "longer value", 12, 0));
    TRY(want_xattr("f", "user.test", "longer value", 12));
    OK(setxattr("f", "user.bin", "\0\1\2\0", 4, 0));
    TRY(want_xattr("f", "user.bin", "\0\1\2\0", 4));
}

static void t_xattr_list(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.one", "1", 1, 0));
    OK(setxattr("f", "user.two", "22", 2, 0));
    char buf[4096];
    ssize_t len;
    TRY(list_names("f", buf, sizeof buf, &len));
    CHECK(has_name(buf, len, "user.one") && has_name(buf, len, "user.two"),
          "listxattr lacks user.one or user.two");
    ssize_t need;
    OK(need = llistxattr("f", NULL, 0));
    CHECK(need == len, "listxattr size query %zd, the list is %zd", need, len);
    if (len > 1)
        ERR(llistxattr("f", buf, (size_t)len - 1), ERANGE);
}

static void t_xattr_remove(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.test", "v", 1, 0));
    OK(removexattr("f", "user.test"));
    char buf[16];
    ERR(getxattr("f", "user.test", buf, sizeof buf), ENODATA);
    ERR(removexattr("f", "user.test"), ENODATA);
    ssize_t len;
    char list[4096];
    TRY(list_names("f", list, sizeof list, &len));
    CHECK(!has_name(list, len, "user.test"), "user.test still listed");
}

static void t_xattr_create_replace(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.test", "v1", 2, XATTR_CREATE));
    ERR(setxattr("f", "user.test", "v2", 2, XATTR_CREATE), EEXIST);
    TRY(want_xattr("f", "user.test", "v1", 2));
    ERR(setxattr("f", "user.other", "v", 1, XATTR_REPLACE), ENODATA);
    OK(setxattr("f", "user.test", "v3", 2, XATTR_REPLACE));
    TRY(want_xattr("f", "user.test", "v3", 2));
}

static void t_xattr_missing(void)
{
    TRY(mkfile("f", 0644, NULL));
    char buf[16];
    ERR(getxattr("f", "user.missing", buf, sizeof buf), ENODATA);
    ERR(getxattr("f", "user.missing", NULL, 0), ENODATA);
}

static void t_xattr_size_query(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.test", "0123456789", 10, 0));
    ssize_t n;
    OK(n = getxattr("f", "user.test", NULL, 0));
    CHECK(n == 10, "size query gave %zd, expected 10", n);
    char buf[16];
    ERR(getxattr("f", "user.test", buf, 9), ERANGE);
}

static void t_xattr_empty_large(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.empty", "", 0, 0));
    TRY(want_xattr("f", "user.empty", "", 0));
    const char *p = pattern(2000, 3);
    OK(setxattr("f", "user.large", p, 2000, 0));
    TRY(want_xattr("f", "user.large", p, 2000));
}

static void t_xattr_dir(void)
{
    TRY(mkdir_exact("d", 0755));
    OK(setxattr("d", "user.dir", "yes", 3, 0));
    TRY(want_xattr("d", "user.dir", "yes", 3));
}

static void t_xattr_symlink(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(symlink("f", "l"));
    ERR(lsetxattr("l", "user.test", "v", 1, 0), EPERM); /* user.* only on files and dirs */
    OK(setxattr("l", "user.test", "v", 1, 0));          /* follows */
    TRY(want_xattr("f", "user.test", "v", 1));
    OK(lsetxattr("l", "trusted.test", "t", 1, 0));
    TRY(want_xattr("l", "trusted.test", "t", 1));
    char buf[16];
    ERR(getxattr("f", "trusted.test", buf, sizeof buf), ENODATA);
}

static void t_xattr_fd(void)
{
    int fd;
    OK(fd = open("f", O_CREAT | O_EXCL | O_RDWR, 0644));
    OK(fsetxattr(fd, "user.fd", "via fd", 6, 0));
    char buf[16];
    ssize_t n;
    OK(n = fgetxattr(fd, "user.fd", buf, sizeof buf));
    CHECK(n == 6 && !memcmp(buf, "via fd", 6), "fgetxattr gave %zd bytes", n);
    OK(fremovexattr(fd, "user.fd"));
    ERR(fgetxattr(fd, "user.fd", buf, sizeof buf), ENODATA);
    close(fd);
}

static void t_xattr_trusted(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "trusted.test", "trusted value", 13, 0));
    TRY(want_xattr("f", "trusted.test", "trusted value", 13));
    char list[4096];
    ssize_t len;
    TRY(list_names("f", list, sizeof list, &len));
    CHECK(has_name(list, len, "trusted.test"), "trusted.test not listed");
    OK(removexattr("f", "trusted.test"));
    char buf[16];
    ERR(getxattr("f", "trusted.test", buf, sizeof buf), ENODATA);
}

static void t_xattr_security(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "security.test", "security value", 14, 0));
    TRY(want_xattr("f", "security.test", "security value", 14));
    char list[4096];
    ssize_t len;
    TRY(list_names("f", list, sizeof list, &len));
    CHECK(has_name(list, len, "security.test"), "security.test not listed");
    OK(removexattr("f", "security.test"));
}

static int ignorable_xattr(const char *n)
{
    return !strncmp(n, "system.", 7) || !strcmp(n, "security.selinux") || !strcmp(n, "security.ima") ||
           !strcmp(n, "security.evm");
}

static void t_xattr_list_exact(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.a", "1", 1, 0));
    OK(setxattr("f", "trusted.b", "2", 1, 0));
    OK(setxattr("f", "security.c", "3", 1, 0));
    char list[4096];
    ssize_t len;
    TRY(list_names("f", list, sizeof list, &len));
    int n = 0;
    for (const char *q = list; q < list + len; q += strlen(q) + 1) {
        if (ignorable_xattr(q))
            continue;
        CHECK(!strcmp(q, "user.a") || !strcmp(q, "trusted.b") || !strcmp(q, "security.c"),
              "listxattr gives an unexpected name \"%s\"", q);
        n++;
    }
    CHECK(n == 3, "listxattr gives %d of the 3 names", n);
}

static void nb_xattr(void *a)
{
    (void)a;
    char buf[64];
    ssize_t n;
    OK(n = getxattr("f", "user.test", buf, sizeof buf)); /* read permission suffices */
    CHECK(n == 3, "getxattr as nobody gave %zd bytes", n);
    ERR(setxattr("f", "user.test", "new", 3, 0), EACCES);
    ERR(removexattr("f", "user.test"), EACCES);
    ERR(setxattr("own", "trusted.x", "v", 1, 0), EPERM);
    ERR(getxattr("f", "trusted.test", buf, sizeof buf), ENODATA); /* hidden */
    char list[4096];
    ssize_t len;
    TRY(list_names("f", list, sizeof list, &len));
    for (const char *q = list; q < list + len; q += strlen(q) + 1)
        CHECK(!strncmp(q, "user.test", 10) || ignorable_xattr(q) || !strncmp(q, "security.", 9),
              "listxattr as nobody shows \"%s\"", q);
    CHECK(has_name(list, len, "user.test"), "listxattr as nobody lacks user.test");
    OK(setxattr("own", "user.mine", "m", 1, 0));
}

static void t_xattr_nobody(void)
{
    TRY(mkfile("f", 0644, NULL));
    OK(setxattr("f", "user.test", "val", 3, 0));
    OK(setxattr("f", "trusted.test", "hidden", 6, 0));
    TRY(mkfile("own", 0644, NULL));
    TRY(chown_or_fail("own", NOBODY, NOBODY));
    AS_NOBODY(nb_xattr, NULL);
    TRY(want_xattr("f", "user.test", "val", 3));
    TRY(want_xattr("own", "user.mine", "m", 1));
}

/* ======================================================================== */
/* fallocate                                                                */

/* A new file of n pattern bytes (seed), opened O_RDWR. */
static int pattern_file(const char *p, size_t n, unsigned seed, int *fdp)
{
    int fd = open(p, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) {
        fail_at("set-up: open(%s, O_CREAT): %s", p, en(errno));
        return -1;
    }
    if (n && put_fd(fd, p, pattern(n, seed), n, 0)) {
        close(fd);
        return -1;
    }
    *fdp = fd;
    return 0;
}

static void t_falloc_grow(void)
{
    int fd;
    TRY(pattern_file("f", 1000, 4, &fd));
    OK(fallocate(fd, 0, 0, 100000));
    struct stat st;
    OK(fstat(fd, &st));
    close(fd);
    CHECK(st.st_size == 100000, "size %lld after fallocate(0, 0, 100000)", (long long)st.st_size);
    TRY(want_data("f", 0, pattern(1000, 4), 1000));
    TRY(want_zeros("f", 1000, 99000));
}

static void t_falloc_inside(void)
{
    int fd;
    TRY(pattern_file("f", 50000, 5, &fd));
    OK(fallocate(fd, 0, 4096, 8192));
    close(fd);
    TRY(want_size("f", 50000));
    TRY(want_data("f", 0, pattern(50000, 5), 50000));
}

static void t_falloc_keep_size(void)
{
    int fd;
    TRY(pattern_file("f", 1000, 6, &fd));
    struct stat a, b;
    OK(fstat(fd, &a));
    OK(fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20));
    OK(fstat(fd, &b));
    close(fd);
    CHECK(b.st_size == 1000, "size %lld after KEEP_SIZE", (long long)b.st_size);
    CHECK(b.st_blocks > a.st_blocks, "st_blocks %lld -> %lld: nothing allocated",
          (long long)a.st_blocks, (long long)b.st_blocks);
    TRY(want_data("f", 0, pattern(1000, 6), 1000));
}

static void t_falloc_punch(void)
{
    enum { N = 65536 };
    int fd;
    TRY(pattern_file("f", N, 7, &fd));
    OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 16384, 16384));
    close(fd);
    const char *p = pattern(N, 7);
    TRY(want_size("f", N));
    TRY(want_data("f", 0, p, 16384));
    TRY(want_zeros("f", 16384, 16384));
    TRY(want_data("f", 32768, p + 32768, N - 32768));
}

static void t_falloc_punch_unaligned(void)
{
    enum { N = 20000 };
    int fd;
    TRY(pattern_file("f", N, 8, &fd));
    OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 9000));
    close(fd);
    const char *p = pattern(N, 8);
    TRY(want_size("f", N));
    TRY(want_data("f", 0, p, 100));
    TRY(want_zeros("f", 100, 9000));
    TRY(want_data("f", 9100, p + 9100, N - 9100));
}

static void t_falloc_punch_needs_keep(void)
{
    int fd;
    TRY(pattern_file("f", 8192, 9, &fd));
    ERR(fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 4096), EOPNOTSUPP);
    close(fd);
    TRY(want_data("f", 0, pattern(8192, 9), 8192));
}

static void t_falloc_zero_range(void)
{
    enum { N = 40000 };
    int fd;
    TRY(pattern_file("f", N, 10, &fd));
    OK(fallocate(fd, FALLOC_FL_ZERO_RANGE, 5000, 20000));
    close(fd);
    const char *p = pattern(N, 10);
    TRY(want_size("f", N));
    TRY(want_data("f", 0, p, 5000));
    TRY(want_zeros("f", 5000, 20000));
    TRY(want_data("f", 25000, p + 25000, N - 25000));
}

static void t_falloc_zero_range_grow(void)
{
    int fd;
    TRY(pattern_file("f", 3000, 11, &fd));
    OK(fallocate(fd, FALLOC_FL_ZERO_RANGE, 2000, 10000));
    close(fd);
    TRY(want_size("f", 12000));
    TRY(want_data("f", 0, pattern(3000, 11), 2000));
    TRY(want_zeros("f", 2000, 10000));
}

static void t_falloc_errors(void)
{
    TRY(mkfile("f", 0644, "x"));
    int fd;
    OK(fd = open("f", O_RDONLY));
    ERR(fallocate(fd, 0, 0, 4096), EBADF);
    close(fd);
    OK(fd = open("f", O_RDWR));
    ERR(fallocate(fd, 0, 0, 0), EINVAL);
    ERR(fallocate(fd, 0, -1, 4096), EINVAL);
    close(fd);
    TRY(want_size("f", 1));
}

static void t_falloc_posix(void)
{
    int fd;
    TRY(pattern_file("f", 0, 0, &fd));
    int r = posix_fallocate(fd, 0, 12345);
    close(fd);
    CHECK(r == 0, "posix_fallocate: %s", en(r));
    TRY(want_size("f", 12345));
    TRY(want_zeros("f", 0, 12345));
}

/* ======================================================================== */
/* lseek                                                                    */

/* 16 KiB of data with a hole punched at [4 KiB, 12 KiB). */
static int holey(int *fdp)
{
    int fd;
    if (pattern_file("f", 16384, 12, &fd))
        return -1;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192) != 0) {
        fail_at("set-up: punching [4096, 12288): %s", en(errno));
        close(fd);
        return -1;
    }
    *fdp = fd;
    return 0;
}

static int want_seek(int fd, off_t from, int whence, off_t want)
{
    const char *wn = whence == SEEK_DATA ? "SEEK_DATA" : whence == SEEK_HOLE ? "SEEK_HOLE" : "SEEK_?";
    off_t r = lseek(fd, from, whence);
    if (r == want)
        return 0;
    if (r < 0)
        fail_at("lseek(%lld, %s): %s, expected %lld", (long long)from, wn, en(errno), (long long)want);
    else
        fail_at("lseek(%lld, %s) = %lld, expected %lld", (long long)from, wn, (long long)r,
                (long long)want);
    return -1;
}

static void t_lseek_data_start(void)
{
    int fd;
    TRY(holey(&fd));
    TRY(want_seek(fd, 0, SEEK_DATA, 0));
    TRY(want_seek(fd, 100, SEEK_DATA, 100));
    close(fd);
}

static void t_lseek_hole_middle(void)
{
    int fd;
    TRY(holey(&fd));
    TRY(want_seek(fd, 0, SEEK_HOLE, 4096));
    TRY(want_seek(fd, 4096, SEEK_HOLE, 4096));
    TRY(want_seek(fd, 8000, SEEK_HOLE, 8000));
    close(fd);
}

static void t_lseek_data_after_hole(void)
{
    int fd;
    TRY(holey(&fd));
    TRY(want_seek(fd, 4096, SEEK_DATA, 12288));
    TRY(want_seek(fd, 5000, SEEK_DATA, 12288));
    TRY(want_seek(fd, 13000, SEEK_DATA, 13000));
    close(fd);
}

static void t_lseek_hole_at_eof(void)
{
    int fd;
    TRY(holey(&fd));
    TRY(want_seek(fd, 12288, SEEK_HOLE, 16384));
    TRY(want_seek(fd, 16000, SEEK_HOLE, 16384));
    close(fd);
}

static void t_lseek_past_eof(void)
{
    int fd;
    TRY(holey(&fd));
    ERR(lseek(fd, 16384, SEEK_DATA), ENXIO);
    ERR(lseek(fd, 100000, SEEK_DATA), ENXIO);
    ERR(lseek(fd, 16384, SEEK_HOLE), ENXIO);
    close(fd);
}

static void t_lseek_all_hole(void)
{
    int fd;
    TRY(pattern_file("f", 0, 0, &fd));
    OK(ftruncate(fd, 1 << 20));
    TRY(want_seek(fd, 0, SEEK_HOLE, 0));
    ERR(lseek(fd, 0, SEEK_DATA), ENXIO);
    close(fd);
}

static void t_lseek_basic(void)
{
    int fd;
    TRY(pattern_file("f", 1000, 13, &fd));
    off_t r;
    OK(r = lseek(fd, 0, SEEK_END));
    CHECK(r == 1000, "SEEK_END gave %lld", (long long)r);
    OK(r = lseek(fd, -10, SEEK_CUR));
    CHECK(r == 990, "SEEK_CUR -10 gave %lld", (long long)r);
    OK(r = lseek(fd, 5000, SEEK_SET));
    CHECK(r == 5000, "SEEK_SET past EOF gave %lld", (long long)r);
    ERR(lseek(fd, -1, SEEK_SET), EINVAL);
    close(fd);
}

/* ======================================================================== */
/* copy_file_range                                                          */

/* Copies len bytes, looping over short copies. */
static int cfr_all(int in, off_t *ino, int out, off_t *outo, size_t len)
{
    while (len) {
        ssize_t n = copy_file_range(in, ino, out, outo, len, 0);
        if (n < 0) {
            fail_at("copy_file_range(%zu bytes): %s", len, en(errno));
            return -1;
        }
        if (n == 0) {
            fail_at("copy_file_range returned 0 with %zu bytes left", len);
            return -1;
        }
        len -= (size_t)n;
    }
    return 0;
}

static void t_cfr_two_files(void)
{
    enum { N = 300000 };
    int in, out;
    TRY(pattern_file("src", N, 14, &in));
    TRY(pattern_file("dst", 0, 0, &out));
    off_t a = 0, b = 0;
    TRY(cfr_all(in, &a, out, &b, N));
    close(in);
    close(out);
    CHECK(a == N && b == N, "offsets %lld and %lld after the copy", (long long)a, (long long)b);
    TRY(want_size("dst", N));
    TRY(want_data("dst", 0, pattern(N, 14), N));
}

static void t_cfr_offsets(void)
{
    int in, out;
    TRY(pattern_file("src", 10000, 15, &in));
    TRY(pattern_file("dst", 5000, 16, &out));
    OK(lseek(in, 7, SEEK_SET));
    OK(lseek(out, 9, SEEK_SET));
    off_t a = 500, b = 3000;
    TRY(cfr_all(in, &a, out, &b, 1000));
    CHECK(a == 1500 && b == 4000, "offsets %lld and %lld, expected 1500 and 4000", (long long)a,
          (long long)b);
    off_t ci = lseek(in, 0, SEEK_CUR), co = lseek(out, 0, SEEK_CUR);
    close(in);
    close(out);
    CHECK(ci == 7 && co == 9, "file offsets moved to %lld and %lld", (long long)ci, (long long)co);
    const char *d = pattern(5000, 16);
    TRY(want_size("dst", 5000));
    TRY(want_data("dst", 0, d, 3000));
    TRY(want_data("dst", 3000, pattern(10000, 15) + 500, 1000));
    TRY(want_data("dst", 4000, pattern(5000, 16) + 4000, 1000));
}

static void t_cfr_fd_offsets(void)
{
    int in, out;
    TRY(pattern_file("src", 4000, 17, &in));
    TRY(pattern_file("dst", 0, 0, &out));
    OK(lseek(in, 1000, SEEK_SET));
    TRY(cfr_all(in, NULL, out, NULL, 2000));
    off_t ci = lseek(in, 0, SEEK_CUR), co = lseek(out, 0, SEEK_CUR);
    close(in);
    close(out);
    CHECK(ci == 3000 && co == 2000, "file offsets %lld and %lld, expected 3000 and 2000",
          (long long)ci, (long long)co);
    TRY(want_size("dst", 2000));
    TRY(want_data("dst", 0, pattern(4000, 17) + 1000, 2000));
}

static void t_cfr_same_file(void)
{
    enum { N = 16384 };
    int fd;
    TRY(pattern_file("f", N, 18, &fd));
    off_t a = 0, b = 8192;
    TRY(cfr_all(fd, &a, fd, &b, 4096));
    a = 100;
    b = 20000;
    TRY(cfr_all(fd, &a, fd, &b, 3000));
    close(fd);
    const char *p = pattern(N, 18);
    TRY(want_size("f", 23000));
    TRY(want_data("f", 0, p, 8192));
    TRY(want_data("f", 8192, p, 4096));
    TRY(want_data("f", 12288, p + 12288, N - 12288));
    TRY(want_zeros("f", N, 20000 - N));
    TRY(want_data("f", 20000, p + 100, 3000));
}

static void t_cfr_overlap(void)
{
    int fd;
    TRY(pattern_file("f", 8192, 19, &fd));
    off_t a = 0, b = 100;
    ERR(copy_file_range(fd, &a, fd, &b, 4096, 0), EINVAL);
    close(fd);
    TRY(want_data("f", 0, pattern(8192, 19), 8192));
}

static void t_cfr_eof(void)
{
    int in, out;
    TRY(pattern_file("src", 100, 20, &in));
    TRY(pattern_file("dst", 0, 0, &out));
    off_t a = 100, b = 0;
    ssize_t n;
    OK(n = copy_file_range(in, &a, out, &b, 1000, 0));
    CHECK(n == 0, "copy from EOF gave %zd", n);
    a = 50;
    OK(n = copy_file_range(in, &a, out, &b, 1000, 0));
    CHECK(n == 50, "copy across EOF gave %zd, expected 50", n);
    close(in);
    close(out);
    TRY(want_data("dst", 0, pattern(100, 20) + 50, 50));
}

static void t_cfr_ebadf(void)
{
    TRY(mkfile("src", 0644, "data"));
    TRY(mkfile("dst", 0644, NULL));
    int in, out, ro;
    OK(in = open("src", O_WRONLY));
    OK(out = open("dst", O_WRONLY));
    OK(ro = open("dst", O_RDONLY));
    ERR(copy_file_range(in, NULL, out, NULL, 4, 0), EBADF);
    close(in);
    OK(in = open("src", O_RDONLY));
    ERR(copy_file_range(in, NULL, ro, NULL, 4, 0), EBADF);
    close(in);
    close(out);
    close(ro);
    TRY(want_size("dst", 0));
}

/* ======================================================================== */
/* locks (fcntl)                                                            */

static struct flock range(short type, off_t start, off_t len)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    return fl;
}

static int setlk(int fd, int cmd, short type, off_t start, off_t len)
{
    struct flock fl = range(type, start, len);
    return fcntl(fd, cmd, &fl);
}

/* The case's file "f" (1000 bytes), O_RDWR, with a write lock on 0-99. */
static int locked_file(int *fdp)
{
    int fd;
    if (pattern_file("f", 1000, 21, &fd))
        return -1;
    if (setlk(fd, F_SETLK, F_WRLCK, 0, 100) != 0) {
        fail_at("set-up: F_SETLK F_WRLCK 0-99: %s", en(errno));
        close(fd);
        return -1;
    }
    *fdp = fd;
    return 0;
}

static int open_f(int flags, int *fdp)
{
    *fdp = open("f", flags | O_CLOEXEC);
    if (*fdp >= 0)
        return 0;
    fail_at("open(f): %s", en(errno));
    return -1;
}

/* F_GETLK for (type, start, len) must report (want, wstart, wlen, wpid). */
static int want_getlk(int fd, int cmd, short type, off_t start, off_t len, short want, off_t wstart,
                      off_t wlen, pid_t wpid)
{
    struct flock fl = range(type, start, len);
    if (fcntl(fd, cmd, &fl) != 0) {
        fail_at("F_GETLK: %s", en(errno));
        return -1;
    }
    if (fl.l_type != want) {
        fail_at("F_GETLK(%lld+%lld) reports type %d, expected %d", (long long)start, (long long)len,
                fl.l_type, want);
        return -1;
    }
    if (want != F_UNLCK && (fl.l_start != wstart || fl.l_len != wlen || fl.l_pid != wpid)) {
        fail_at("F_GETLK reports start %lld len %lld pid %d, expected %lld %lld %d",
                (long long)fl.l_start, (long long)fl.l_len, (int)fl.l_pid, (long long)wstart,
                (long long)wlen, (int)wpid);
        return -1;
    }
    return 0;
}

static void kid_getlk(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    TRY(want_getlk(fd, F_GETLK, F_WRLCK, 0, 200, F_WRLCK, 0, 100, getppid()));
    TRY(want_getlk(fd, F_GETLK, F_RDLCK, 50, 1, F_WRLCK, 0, 100, getppid()));
    TRY(want_getlk(fd, F_GETLK, F_WRLCK, 100, 100, F_UNLCK, 0, 0, 0));
}

static void t_locks_getlk(void)
{
    int fd;
    TRY(locked_file(&fd));
    IN_CHILD(kid_getlk, NULL);
}

static void kid_setlk_conflict(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 0, 100), EAGAIN, EACCES);
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 99, 1), EAGAIN, EACCES);
    ERR2(setlk(fd, F_SETLK, F_RDLCK, 50, 10), EAGAIN, EACCES);
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 0, 0), EAGAIN, EACCES);
}

static void t_locks_setlk_conflict(void)
{
    int fd;
    TRY(locked_file(&fd));
    IN_CHILD(kid_setlk_conflict, NULL);
}

static void kid_setlk_free(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    OK(setlk(fd, F_SETLK, F_WRLCK, 100, 100));
    OK(setlk(fd, F_SETLK, F_WRLCK, 5000, 0)); /* to infinity, past EOF */
}

static void t_locks_setlk_free(void)
{
    int fd;
    TRY(locked_file(&fd));
    IN_CHILD(kid_setlk_free, NULL);
}

static void kid_after_unlock(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 0, 100), EAGAIN, EACCES);
    TELL_PARENT();
    AWAIT_PARENT();
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 100));
}

static void t_locks_unlock(void)
{
    int fd;
    TRY(locked_file(&fd));
    struct kid k;
    TRY(kid_start(&k, 0, kid_after_unlock, NULL));
    AWAIT_KID(&k);
    OK(setlk(fd, F_SETLK, F_UNLCK, 0, 100));
    TELL_KID(&k);
    TRY(kid_finish(&k, "in the child"));
}

static void kid_setlkw(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    TELL_PARENT();
    uint64_t t0 = now_ns();
    OK(setlk(fd, F_SETLKW, F_WRLCK, 0, 100));
    uint64_t ms = (now_ns() - t0) / 1000000;
    CHECK(ms >= 200, "F_SETLKW returned after %llu ms, before the unlock (300 ms)",
          (unsigned long long)ms);
    CHECK(ms < 5000, "F_SETLKW took %llu ms after a 300 ms hold", (unsigned long long)ms);
}

static void t_locks_setlkw(void)
{
    int fd;
    TRY(locked_file(&fd));
    struct kid k;
    TRY(kid_start(&k, 0, kid_setlkw, NULL));
    AWAIT_KID(&k);
    sleep_ms(300);
    OK(setlk(fd, F_SETLK, F_UNLCK, 0, 100));
    TRY(kid_finish(&k, "in the child"));
}

static void kid_free_now(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    TRY(want_getlk(fd, F_GETLK, F_WRLCK, 0, 0, F_UNLCK, 0, 0, 0));
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 100));
}

static void t_locks_close_any_fd(void)
{
    int fd, other;
    TRY(locked_file(&fd));
    OK(other = open("f", O_RDONLY));
    close(other); /* POSIX: drops every lock this process holds on the file */
    IN_CHILD(kid_free_now, NULL);
}

static void t_locks_close_dup(void)
{
    int fd, d;
    TRY(locked_file(&fd));
    OK(d = dup(fd));
    close(d);
    IN_CHILD(kid_free_now, NULL);
}

static void kid_shared(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    OK(setlk(fd, F_SETLK, F_RDLCK, 0, 100));
    OK(setlk(fd, F_SETLK, F_UNLCK, 0, 100));
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 0, 100), EAGAIN, EACCES);
    TRY(want_getlk(fd, F_GETLK, F_WRLCK, 0, 100, F_RDLCK, 0, 100, getppid()));
    TRY(want_getlk(fd, F_GETLK, F_RDLCK, 0, 100, F_UNLCK, 0, 0, 0));
}

static void t_locks_shared(void)
{
    int fd;
    TRY(pattern_file("f", 1000, 22, &fd));
    OK(setlk(fd, F_SETLK, F_RDLCK, 0, 100));
    IN_CHILD(kid_shared, NULL);
}

static void kid_sees_rdlck(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    TRY(want_getlk(fd, F_GETLK, F_WRLCK, 0, 100, F_RDLCK, 0, 100, getppid()));
}

static void t_locks_own(void)
{
    int fd;
    TRY(locked_file(&fd));
    TRY(want_getlk(fd, F_GETLK, F_WRLCK, 0, 100, F_UNLCK, 0, 0, 0)); /* own lock: no conflict */
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 100));                          /* relock */
    OK(setlk(fd, F_SETLK, F_RDLCK, 0, 100));                          /* downgrade */
    IN_CHILD(kid_sees_rdlck, NULL);
}

static void kid_split(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    OK(setlk(fd, F_SETLK, F_WRLCK, 40, 20));
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 0, 10), EAGAIN, EACCES);
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 39, 1), EAGAIN, EACCES);
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 60, 1), EAGAIN, EACCES);
    TRY(want_getlk(fd, F_GETLK, F_WRLCK, 70, 100, F_WRLCK, 60, 40, getppid()));
}

static void t_locks_split(void)
{
    int fd;
    TRY(locked_file(&fd));
    OK(setlk(fd, F_SETLK, F_UNLCK, 40, 20));
    IN_CHILD(kid_split, NULL);
}

static void t_locks_ebadf(void)
{
    TRY(mkfile("f", 0644, "x"));
    int ro, wo;
    OK(ro = open("f", O_RDONLY));
    OK(wo = open("f", O_WRONLY));
    ERR(setlk(ro, F_SETLK, F_WRLCK, 0, 10), EBADF);
    ERR(setlk(wo, F_SETLK, F_RDLCK, 0, 10), EBADF);
    OK(setlk(ro, F_SETLK, F_RDLCK, 0, 10));
    OK(setlk(wo, F_SETLK, F_WRLCK, 20, 10));
}

static void kid_lock_and_exit(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 0));
    TELL_PARENT();
    AWAIT_PARENT();
}

static void t_locks_exit_releases(void)
{
    int fd;
    TRY(pattern_file("f", 100, 23, &fd));
    struct kid k;
    TRY(kid_start(&k, 0, kid_lock_and_exit, NULL));
    AWAIT_KID(&k);
    ERR2(setlk(fd, F_SETLK, F_WRLCK, 0, 0), EAGAIN, EACCES);
    TELL_KID(&k);
    TRY(kid_finish(&k, "in the child"));
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 0));
}

static void kid_to_eof(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    ERR2(setlk(fd, F_SETLK, F_WRLCK, (off_t)1 << 40, 1), EAGAIN, EACCES);
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 1000));
}

static void t_locks_to_eof(void)
{
    int fd;
    TRY(pattern_file("f", 100, 24, &fd));
    OK(setlk(fd, F_SETLK, F_WRLCK, 1000, 0)); /* l_len 0: to the end, however far */
    IN_CHILD(kid_to_eof, NULL);
}

static void t_locks_ofd(void)
{
    int a, b;
    TRY(pattern_file("f", 100, 25, &a));
    OK(b = open("f", O_RDWR));
    OK(setlk(a, F_OFD_SETLK, F_WRLCK, 0, 10));
    ERR2(setlk(b, F_OFD_SETLK, F_WRLCK, 0, 10), EAGAIN, EACCES);
    TRY(want_getlk(b, F_OFD_GETLK, F_WRLCK, 0, 10, F_WRLCK, 0, 10, -1));
    close(a);
    OK(setlk(b, F_OFD_SETLK, F_WRLCK, 0, 10));
}

/* ======================================================================== */
/* flock                                                                    */

static void t_flock_ex_conflict(void)
{
    int a, b;
    TRY(pattern_file("f", 10, 26, &a));
    OK(b = open("f", O_RDONLY));
    OK(flock(a, LOCK_EX | LOCK_NB));
    ERR(flock(b, LOCK_EX | LOCK_NB), EWOULDBLOCK);
    ERR(flock(b, LOCK_SH | LOCK_NB), EWOULDBLOCK);
}

static void t_flock_shared(void)
{
    int a, b, c;
    TRY(pattern_file("f", 10, 27, &a));
    OK(b = open("f", O_RDONLY));
    OK(c = open("f", O_RDONLY));
    OK(flock(a, LOCK_SH | LOCK_NB));
    OK(flock(b, LOCK_SH | LOCK_NB));
    ERR(flock(c, LOCK_EX | LOCK_NB), EWOULDBLOCK);
}

static void t_flock_unlock(void)
{
    int a, b;
    TRY(pattern_file("f", 10, 28, &a));
    OK(b = open("f", O_RDONLY));
    OK(flock(a, LOCK_EX | LOCK_NB));
    ERR(flock(b, LOCK_EX | LOCK_NB), EWOULDBLOCK);
    OK(flock(a, LOCK_UN));
    OK(flock(b, LOCK_EX | LOCK_NB));
    ERR(flock(a, LOCK_SH | LOCK_NB), EWOULDBLOCK);
}

static void t_flock_dup_close(void)
{
    int a, b, d;
    TRY(pattern_file("f", 10, 29, &a));
    OK(b = open("f", O_RDONLY));
    OK(flock(a, LOCK_EX | LOCK_NB));
    OK(d = dup(a));
    OK(flock(d, LOCK_EX | LOCK_NB)); /* the same open file description */
    close(a);
    ERR(flock(b, LOCK_EX | LOCK_NB), EWOULDBLOCK); /* d still holds it */
    close(d);
    OK(flock(b, LOCK_EX | LOCK_NB));
}

static void t_flock_upgrade(void)
{
    int a, b;
    TRY(pattern_file("f", 10, 30, &a));
    OK(b = open("f", O_RDONLY));
    OK(flock(a, LOCK_SH | LOCK_NB));
    OK(flock(a, LOCK_EX | LOCK_NB));
    ERR(flock(b, LOCK_SH | LOCK_NB), EWOULDBLOCK);
    OK(flock(a, LOCK_SH | LOCK_NB));
    OK(flock(b, LOCK_SH | LOCK_NB));
}

static void kid_flock_wait(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDONLY, &fd));
    ERR(flock(fd, LOCK_EX | LOCK_NB), EWOULDBLOCK);
    TELL_PARENT();
    uint64_t t0 = now_ns();
    OK(flock(fd, LOCK_EX));
    uint64_t ms = (now_ns() - t0) / 1000000;
    CHECK(ms >= 200 && ms < 5000, "flock(LOCK_EX) waited %llu ms for a 300 ms hold",
          (unsigned long long)ms);
}

static void t_flock_processes(void)
{
    int fd;
    TRY(pattern_file("f", 10, 31, &fd));
    OK(flock(fd, LOCK_EX));
    struct kid k;
    TRY(kid_start(&k, 0, kid_flock_wait, NULL));
    AWAIT_KID(&k);
    sleep_ms(300);
    OK(flock(fd, LOCK_UN));
    TRY(kid_finish(&k, "in the child"));
}

static void kid_fcntl_vs_flock(void *a)
{
    (void)a;
    int fd;
    TRY(open_f(O_RDWR, &fd));
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 0)); /* the parent's flock does not conflict */
    ERR(flock(fd, LOCK_EX | LOCK_NB), EWOULDBLOCK);
}

static void t_flock_vs_fcntl(void)
{
    int fd, b;
    TRY(pattern_file("f", 10, 32, &fd));
    OK(flock(fd, LOCK_EX | LOCK_NB));
    IN_CHILD(kid_fcntl_vs_flock, NULL);
    OK(flock(fd, LOCK_UN));
    /* and a POSIX lock does not block a flock */
    OK(setlk(fd, F_SETLK, F_WRLCK, 0, 0));
    OK(b = open("f", O_RDONLY));
    OK(flock(b, LOCK_EX | LOCK_NB));
}

/* ======================================================================== */
/* tmpfile (O_TMPFILE)                                                      */

/* open(dir, O_TMPFILE | flags, mode); a file system without O_TMPFILE
 * fails the case with the reason (EOPNOTSUPP, or EISDIR from a kernel or
 * file system that does not know the flag). */
static int tmpfile_in(const char *dir, int flags, mode_t mode, int *fdp)
{
    *fdp = open(dir, O_TMPFILE | flags | O_CLOEXEC, mode);
    if (*fdp >= 0)
        return 0;
    int e = errno;
    fail_at("open(%s, O_TMPFILE): %s%s", dir, en(e),
            e == EOPNOTSUPP || e == EISDIR ? " (no O_TMPFILE support)" : "");
    return -1;
}

static int link_fd(int fd, const char *name)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0)
        return 0;
    fail_at("linkat(%s, %s, AT_SYMLINK_FOLLOW): %s", proc, name, en(errno));
    return -1;
}

static void t_tmpfile_link(void)
{
    int fd;
    TRY(tmpfile_in(".", O_RDWR, 0640, &fd));
    TRY(put_fd(fd, "the tmpfile", "tmpfile data", 12, 0));
    TRY(link_fd(fd, "named"));
    TRY(want_text("named", "tmpfile data"));
    TRY(want_mode("named", S_IFREG | 0640));
    TRY(want_nlink("named", 1));
    TRY(put_fd(fd, "the tmpfile", "TMP", 3, 0)); /* still the same file */
    close(fd);
    TRY(want_text("named", "TMPfile data"));
}

static void t_tmpfile_unnamed(void)
{
    int fd;
    TRY(tmpfile_in(".", O_RDWR, 0600, &fd));
    struct stat st;
    OK(fstat(fd, &st));
    CHECK(st.st_nlink == 0, "st_nlink %lu, expected 0", (unsigned long)st.st_nlink);
    CHECK(st.st_mode == (S_IFREG | 0600), "mode 0%o, expected 0100600", (unsigned)st.st_mode);
    DIR *d = opendir(".");
    CHECK(d, "opendir: %s", en(errno));
    struct dirent *e;
    int other = 0;
    while ((e = readdir(d)))
        other += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    CHECK(other == 0, "the directory lists %d entries", other);
    close(fd);
}

static void t_tmpfile_excl(void)
{
    int fd;
    TRY(tmpfile_in(".", O_RDWR | O_EXCL, 0600, &fd));
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ERR(linkat(AT_FDCWD, proc, AT_FDCWD, "named", AT_SYMLINK_FOLLOW), ENOENT);
    close(fd);
    TRY(want_absent("named"));
}

static void t_tmpfile_empty_path(void)
{
    int fd;
    TRY(tmpfile_in(".", O_WRONLY, 0644, &fd));
    TRY(put_fd(fd, "the tmpfile", "empty path", 10, 0));
    OK(linkat(fd, "", AT_FDCWD, "named", AT_EMPTY_PATH));
    close(fd);
    TRY(want_text("named", "empty path"));
}

static void nb_tmpfile(void *a)
{
    (void)a;
    int fd;
    TRY(tmpfile_in(".", O_RDWR, 0600, &fd));
    TRY(put_fd(fd, "the tmpfile", "nobody's", 8, 0));
    TRY(link_fd(fd, "named"));
    close(fd);
}

static void t_tmpfile_nobody(void)
{
    AS_NOBODY(nb_tmpfile, NULL);
    TRY(want_owner("named", NOBODY, NOBODY));
    TRY(want_text("named", "nobody's"));
}

static void t_tmpfile_subdir(void)
{
    TRY(mkdir_exact("d", 0755));
    int fd;
    TRY(tmpfile_in("d", O_RDWR, 0644, &fd));
    TRY(put_fd(fd, "the tmpfile", "in d", 4, 0));
    TRY(link_fd(fd, "d/named"));
    close(fd);
    TRY(want_text("d/named", "in d"));
    TRY(mkfile("f", 0644, NULL));
    ERR(open("f", O_TMPFILE | O_RDWR, 0600), ENOTDIR);
}

/* ======================================================================== */
/* access                                                                   */

static void nb_access_0600(void *a)
{
    (void)a;
    ERR(access("f", R_OK), EACCES);
    ERR(access("f", W_OK), EACCES);
    OK(access("f", F_OK));
}

static void t_access_nobody_0600(void)
{
    TRY(mkfile("f", 0600, NULL));
    AS_NOBODY(nb_access_0600, NULL);
}

static void nb_access_0644(void *a)
{
    (void)a;
    OK(access("f", R_OK));
    ERR(access("f", W_OK), EACCES);
    ERR(access("f", R_OK | W_OK), EACCES);
    ERR(access("f", X_OK), EACCES);
    OK(access("x", R_OK | X_OK));
    OK(access("w", R_OK | W_OK));
}

static void t_access_nobody_0644(void)
{
    TRY(mkfile("f", 0644, NULL));
    TRY(mkfile("x", 0755, NULL));
    TRY(mkfile("w", 0666, NULL));
    AS_NOBODY(nb_access_0644, NULL);
}

static void t_access_root(void)
{
    TRY(mkfile("f", 0, NULL));
    OK(access("f", R_OK | W_OK));
    ERR(access("f", X_OK), EACCES); /* root needs one execute bit */
    TRY(mkfile("x", 0100, NULL));
    OK(access("x", X_OK));
    TRY(mkdir_exact("d", 0));
    OK(access("d", R_OK | W_OK | X_OK));
}

static void t_access_enoent(void)
{
    ERR(access("missing", F_OK), ENOENT);
    ERR(access("missing", R_OK), ENOENT);
}

static void nb_access_search(void *a)
{
    (void)a;
    ERR(access("d/f", F_OK), EACCES);
    struct stat st;
    ERR(stat("d/f", &st), EACCES);
    ERR(open("d/f", O_RDONLY), EACCES);
    OK(access("e/f", R_OK)); /* search (x) without read (r) suffices */
}

static void t_access_search(void)
{
    TRY(mkdir_exact("d", 0700));
    TRY(mkfile("d/f", 0644, NULL));
    TRY(mkdir_exact("e", 0711));
    TRY(mkfile("e/f", 0644, NULL));
    AS_NOBODY(nb_access_search, NULL);
}

static void nb_access_group(void *a)
{
    (void)a;
    OK(access("g", R_OK | W_OK)); /* group bits: nobody is in group 65534 */
    ERR(access("o", R_OK), EACCES); /* owner class wins, though others may */
}

static void t_access_classes(void)
{
    TRY(mkfile("g", 0060, NULL));
    TRY(chown_or_fail("g", 0, NOBODY));
    TRY(mkfile("o", 0044, NULL));
    TRY(chown_or_fail("o", NOBODY, 0));
    AS_NOBODY(nb_access_group, NULL);
}

/* ======================================================================== */
/* mmap                                                                     */

static void t_mmap_link(void)
{
    enum { N = 8192 };
    int fd, other;
    TRY(pattern_file("f", N, 33, &fd));
    OK(link("f", "g"));
    OK(other = open("g", O_RDONLY));
    char *m = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED, "mmap: %s", en(errno));
    const char *p = pattern(N, 34);
    memcpy(m + 100, p, 5000);
    OK(msync(m, N, MS_SYNC));
    char buf[N];
    ssize_t n;
    OK(n = read(other, buf, N));
    munmap(m, N);
    close(fd);
    close(other);
    CHECK(n == N, "read(2) through g gave %zd bytes", n);
    CHECK(!memcmp(buf + 100, p, 5000), "read(2) through g does not see the store through f");
    CHECK(!memcmp(buf, pattern(N, 33), 100), "bytes before the store changed");
}

static void t_mmap_sees_write(void)
{
    enum { N = 12288 };
    int fd, w;
    TRY(pattern_file("f", N, 35, &fd));
    char *m = mmap(NULL, N, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED, "mmap: %s", en(errno));
    OK(w = open("f", O_WRONLY));
    TRY(put_fd(w, "f", "written by pwrite", 17, 5000));
    CHECK(!memcmp(m + 5000, "written by pwrite", 17), "the mapping does not see the pwrite");
    munmap(m, N);
    close(w);
    close(fd);
}

static void t_mmap_grown(void)
{
    int fd;
    TRY(pattern_file("f", 100, 36, &fd));
    OK(ftruncate(fd, 3 * 4096));
    char *m = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED, "mmap: %s", en(errno));
    for (int i = 100; i < 3 * 4096; i++)
        CHECK(m[i] == 0, "byte %d of the grown file is 0x%02x", i, (unsigned char)m[i]);
    memcpy(m + 2 * 4096 + 10, "past old EOF", 12);
    OK(msync(m, 3 * 4096, MS_SYNC));
    munmap(m, 3 * 4096);
    close(fd);
    TRY(want_data("f", 2 * 4096 + 10, "past old EOF", 12));
    TRY(want_size("f", 3 * 4096));
}

static void t_mmap_private(void)
{
    int fd;
    TRY(pattern_file("f", 4096, 37, &fd));
    char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(m != MAP_FAILED, "mmap: %s", en(errno));
    memcpy(m, "private", 7);
    munmap(m, 4096);
    close(fd);
    TRY(want_data("f", 0, pattern(4096, 37), 4096));
}

static void t_mmap_eacces(void)
{
    TRY(mkfile("f", 0644, "data"));
    int ro, wo;
    OK(ro = open("f", O_RDONLY));
    OK(wo = open("f", O_WRONLY));
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0);
    CHECK(m == MAP_FAILED && errno == EACCES, "shared writable mmap of an O_RDONLY fd: %s",
          m == MAP_FAILED ? en(errno) : "succeeded");
    m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, wo, 0);
    CHECK(m == MAP_FAILED && errno == EACCES, "mmap of an O_WRONLY fd: %s",
          m == MAP_FAILED ? en(errno) : "succeeded");
    close(ro);
    close(wo);
}

/* ======================================================================== */
/* statfs                                                                   */

static void t_statfs_namelen(void)
{
    struct statfs s;
    OK(statfs(".", &s));
    CHECK(s.f_namelen == 255, "f_namelen %ld, expected 255", (long)s.f_namelen);
}

static void t_statfs_counts(void)
{
    struct statfs s;
    OK(statfs(".", &s));
    CHECK(s.f_bsize > 0 && s.f_blocks > 0, "f_bsize %ld f_blocks %llu", (long)s.f_bsize,
          (unsigned long long)s.f_blocks);
    CHECK(s.f_bfree <= s.f_blocks && s.f_bavail <= s.f_bfree,
          "f_blocks %llu f_bfree %llu f_bavail %llu", (unsigned long long)s.f_blocks,
          (unsigned long long)s.f_bfree, (unsigned long long)s.f_bavail);
    CHECK(s.f_ffree <= s.f_files, "f_files %llu f_ffree %llu", (unsigned long long)s.f_files,
          (unsigned long long)s.f_ffree);
}

static void t_statfs_fstatfs(void)
{
    struct statfs a, b;
    int fd;
    OK(fd = open(".", O_RDONLY | O_DIRECTORY));
    OK(fstatfs(fd, &b));
    close(fd);
    OK(statfs(".", &a));
    CHECK(a.f_type == b.f_type && a.f_bsize == b.f_bsize && a.f_blocks == b.f_blocks &&
              a.f_namelen == b.f_namelen,
          "statfs and fstatfs differ");
    struct statvfs v;
    OK(statvfs(".", &v));
    CHECK(v.f_namemax == 255, "statvfs f_namemax %lu", (unsigned long)v.f_namemax);
}

/* ======================================================================== */
/* AREAS-END: further areas go above this line.                             */

/* ------------------------------------------------------------------------ */
/* The case table.                                                          */

struct tcase {
    const char *area, *name;
    void (*fn)(void);
};

static const struct tcase cases[] = {
    {"chmod", "file modes", t_chmod_file_modes},
    {"chmod", "directory modes", t_chmod_dir_modes},
    {"chmod", "S_ISUID kept as root", t_chmod_setuid},
    {"chmod", "S_ISGID kept as root", t_chmod_setgid},
    {"chmod", "sticky directory", t_chmod_sticky_dir},
    {"chmod", "all 07777 bits", t_chmod_all_bits},
    {"chmod", "fchmod", t_chmod_fchmod},
    {"chmod", "follows a symlink", t_chmod_follows_symlink},
    {"chmod", "ENOENT", t_chmod_enoent},
    {"chmod", "EPERM as nobody on root's file", t_chmod_nobody_eperm},
    {"chmod", "nobody on its own file", t_chmod_nobody_own},
    {"chmod", "S_ISGID dropped for a non-member", t_chmod_sgid_nonmember},
    {"chmod", "updates ctime not mtime", t_chmod_ctime},
    {"chown", "root gives and takes", t_chown_root},
    {"chown", "-1 -1 changes nothing", t_chown_minus_one},
    {"chown", "group or owner alone", t_chown_gid_only},
    {"chown", "EPERM as nobody on root's file", t_chown_nobody_eperm},
    {"chown", "nobody cannot give away its file", t_chown_nobody_own},
    {"chown", "clears S_ISUID of an executable", t_chown_clears_suid},
    {"chown", "clears S_ISGID of a group executable", t_chown_clears_sgid_exec},
    {"chown", "keeps S_ISGID without group execute", t_chown_keeps_sgid_noexec},
    {"chown", "clears S_ISUID of a non-executable", t_chown_clears_suid_noexec},
    {"chown", "-1 -1 still clears S_ISUID", t_chown_same_clears_suid},
    {"chown", "directory keeps S_ISGID", t_chown_dir_keeps_sgid},
    {"chown", "lchown changes the link only", t_chown_lchown},
    {"chown", "fchown", t_chown_fchown},
    {"chown", "ENOENT", t_chown_enoent},
    {"link", "st_nlink and st_ino", t_link_nlink_ino},
    {"link", "data through both names", t_link_data},
    {"link", "EEXIST", t_link_eexist},
    {"link", "EPERM on a directory", t_link_dir_eperm},
    {"link", "ENOENT", t_link_enoent},
    {"link", "unlink one name keeps the other", t_link_unlink_one},
    {"link", "updates ctime", t_link_ctime},
    {"link", "EACCES as nobody into root's 0755 dir", t_link_nobody_eacces},
    {"link", "of a symlink links the symlink", t_link_symlink_itself},
    {"mkdir", "mode 0777", t_mkdir_0777},
    {"mkdir", "mode 01777", t_mkdir_01777},
    {"mkdir", "mode 02775", t_mkdir_02775},
    {"mkdir", "mode 0700", t_mkdir_0700},
    {"mkdir", "mode 0", t_mkdir_0},
    {"mkdir", "umask applies", t_mkdir_umask},
    {"mkdir", "EEXIST", t_mkdir_eexist},
    {"mkdir", "ENOENT and ENOTDIR", t_mkdir_enoent_enotdir},
    {"mkdir", "st_nlink of the new and the parent", t_mkdir_nlink},
    {"mkdir", "new directory lists . and .. only", t_mkdir_empty_readdir},
    {"mkdir", "nobody owns what it makes", t_mkdir_nobody_owner},
    {"mkdir", "EACCES as nobody in root's 0755 dir", t_mkdir_nobody_eacces},
    {"mkdir", "set-group-ID directory is inherited", t_mkdir_sgid_inherit},
    {"mkdir", "updates the parent's times", t_mkdir_parent_times},
    {"mkfifo", "type and mode", t_mkfifo_mode},
    {"mkfifo", "EEXIST", t_mkfifo_eexist},
    {"mkfifo", "carries data", t_mkfifo_data},
    {"mkfifo", "as nobody", t_mkfifo_nobody},
    {"mkfifo", "ENOENT", t_mkfifo_enoent},
    {"mknod", "fifo", t_mknod_fifo},
    {"mknod", "socket", t_mknod_socket},
    {"mknod", "socket by AF_UNIX bind", t_mknod_bind},
    {"mknod", "bind EADDRINUSE on a file", t_mknod_bind_eaddrinuse},
    {"mknod", "character device 1:3", t_mknod_chr},
    {"mknod", "block devices", t_mknod_blk},
    {"mknod", "regular file", t_mknod_reg},
    {"mknod", "EEXIST", t_mknod_eexist},
    {"mknod", "devices EPERM as nobody, fifo ok", t_mknod_nobody},
    {"open", "O_CREAT 0666", t_open_0666},
    {"open", "O_CREAT 0600", t_open_0600},
    {"open", "O_CREAT 04755 keeps S_ISUID", t_open_04755},
    {"open", "O_CREAT 02775 keeps S_ISGID", t_open_02775},
    {"open", "O_CREAT 0", t_open_0},
    {"open", "O_CREAT 01644", t_open_01644},
    {"open", "O_CREAT umask applies", t_open_umask},
    {"open", "O_EXCL EEXIST", t_open_excl},
    {"open", "O_CREAT through a dangling symlink", t_open_creat_via_dangling},
    {"open", "O_TRUNC", t_open_trunc},
    {"open", "O_CREAT on an existing file", t_open_creat_existing},
    {"open", "ENOENT", t_open_enoent},
    {"open", "EISDIR", t_open_eisdir},
    {"open", "ENOTDIR and O_DIRECTORY", t_open_enotdir},
    {"open", "EACCES as nobody", t_open_nobody_eacces},
    {"open", "O_CREAT as nobody", t_open_nobody_creates},
    {"open", "O_CREAT EACCES as nobody in root's 0755 dir", t_open_nobody_dir_eacces},
    {"open", "S_ISGID stripped for a non-member", t_open_sgid_stripped},
    {"open", "O_NOFOLLOW ELOOP", t_open_nofollow},
    {"open", "O_APPEND", t_open_append},
    {"open", "root ignores permission bits", t_open_root_ignores_bits},
    {"open", "O_CREAT updates the parent's mtime", t_open_parent_times},
    {"rename", "file", t_rename_file},
    {"rename", "directory", t_rename_dir},
    {"rename", "over an existing file", t_rename_over_file},
    {"rename", "directory over an empty directory", t_rename_dir_over_empty},
    {"rename", "directory over a non-empty directory ENOTEMPTY", t_rename_dir_over_nonempty},
    {"rename", "EISDIR and ENOTDIR", t_rename_type_mismatch},
    {"rename", "RENAME_NOREPLACE", t_rename_noreplace},
    {"rename", "RENAME_EXCHANGE files", t_rename_exchange},
    {"rename", "RENAME_EXCHANGE file and directory", t_rename_exchange_dir},
    {"rename", "RENAME_EXCHANGE ENOENT", t_rename_exchange_enoent},
    {"rename", "ENOENT", t_rename_enoent},
    {"rename", "into its own subdirectory EINVAL", t_rename_into_self},
    {"rename", "between two links of one file", t_rename_same_inode},
    {"rename", "across directories", t_rename_across_dirs},
    {"rename", "sticky directory as nobody", t_rename_sticky},
    {"rename", "a symlink itself", t_rename_symlink},
    {"rename", "updates ctime", t_rename_ctime},
    {"rmdir", "empty directory", t_rmdir_empty},
    {"rmdir", "ENOTEMPTY", t_rmdir_enotempty},
    {"rmdir", "ENOTDIR", t_rmdir_enotdir},
    {"rmdir", "ENOENT", t_rmdir_enoent},
    {"rmdir", "dot EINVAL", t_rmdir_dot},
    {"rmdir", "EACCES and sticky EPERM as nobody", t_rmdir_nobody},
    {"symlink", "readlink round trip", t_symlink_readlink},
    {"symlink", "lstat type, mode and size", t_symlink_lstat},
    {"symlink", "dangling allowed", t_symlink_dangling},
    {"symlink", "EEXIST", t_symlink_eexist},
    {"symlink", "stat and open follow a chain", t_symlink_follow},
    {"symlink", "1000 and 4095 byte targets", t_symlink_long},
    {"symlink", "readlink EINVAL and ENOENT", t_symlink_readlink_einval},
    {"symlink", "readlink truncates to the buffer", t_symlink_short_buffer},
    {"symlink", "loop ELOOP", t_symlink_eloop},
    {"symlink", "as nobody", t_symlink_nobody},
    {"truncate", "grow reads zeros", t_truncate_grow},
    {"truncate", "shrink", t_truncate_shrink},
    {"truncate", "ftruncate grow reads zeros", t_ftruncate_grow},
    {"truncate", "ftruncate shrink", t_ftruncate_shrink},
    {"truncate", "shrink then grow reads zeros", t_truncate_shrink_grow},
    {"truncate", "EISDIR, EINVAL, ENOENT, read-only fd", t_truncate_errors},
    {"truncate", "EACCES as nobody", t_truncate_nobody},
    {"truncate", "updates mtime and ctime", t_truncate_times},
    {"truncate", "write past EOF leaves zeros", t_truncate_hole_write},
    {"truncate", "to 1 TiB", t_truncate_huge},
    {"unlink", "st_nlink decrements", t_unlink_nlink},
    {"unlink", "EISDIR on a directory", t_unlink_dir},
    {"unlink", "ENOENT", t_unlink_enoent},
    {"unlink", "open file stays usable", t_unlink_open_file},
    {"unlink", "sticky EPERM and EACCES as nobody", t_unlink_nobody},
    {"unlink", "a symlink, not its target", t_unlink_symlink},
    {"unlink", "fifo, socket and device nodes", t_unlink_special},
    {"unlink", "updates the parent's mtime", t_unlink_parent_times},
    {"utimensat", "explicit times", t_utimens_explicit},
    {"utimensat", "UTIME_NOW", t_utimens_now},
    {"utimensat", "NULL times", t_utimens_null},
    {"utimensat", "UTIME_OMIT atime", t_utimens_omit_atime},
    {"utimensat", "UTIME_OMIT mtime", t_utimens_omit_mtime},
    {"utimensat", "AT_SYMLINK_NOFOLLOW sets the link's times", t_utimens_nofollow},
    {"utimensat", "futimens", t_utimens_futimens},
    {"utimensat", "EPERM and EACCES as nobody", t_utimens_nobody},
    {"utimensat", "ENOENT", t_utimens_enoent},
    {"utimensat", "year 2100", t_utimens_y2100},
    {"utimensat", "before 1970", t_utimens_pre1970},
    {"utimensat", "ctime is now", t_utimens_ctime},
    {"utimensat", "a write sets mtime to now", t_utimens_write_after},
    {"names", "255 bytes", t_names_255},
    {"names", "256 bytes open ENAMETOOLONG", t_names_256_open},
    {"names", "256 bytes mkdir ENAMETOOLONG", t_names_256_mkdir},
    {"names", "256 bytes symlink ENAMETOOLONG", t_names_256_symlink},
    {"names", "256 bytes link ENAMETOOLONG", t_names_256_link},
    {"names", "256 bytes rename ENAMETOOLONG", t_names_256_rename},
    {"names", "256 bytes lookup ENAMETOOLONG", t_names_256_lookup},
    {"names", "odd bytes round trip through readdir", t_names_bytes},
    {"names", "readdir lists 600 long names once each", t_names_readdir_many},
    {"names", "readdir d_type", t_names_dtype},
    {"xattr", "user set and get", t_xattr_set_get},
    {"xattr", "list and its size query", t_xattr_list},
    {"xattr", "remove", t_xattr_remove},
    {"xattr", "XATTR_CREATE EEXIST, XATTR_REPLACE ENODATA", t_xattr_create_replace},
    {"xattr", "get missing ENODATA", t_xattr_missing},
    {"xattr", "size query and ERANGE", t_xattr_size_query},
    {"xattr", "empty and 2000 byte values", t_xattr_empty_large},
    {"xattr", "on a directory", t_xattr_dir},
    {"xattr", "on a symlink", t_xattr_symlink},
    {"xattr", "through an fd", t_xattr_fd},
    {"xattr", "trusted round trip", t_xattr_trusted},
    {"xattr", "security round trip", t_xattr_security},
    {"xattr", "list gives exactly the names set", t_xattr_list_exact},
    {"xattr", "as nobody", t_xattr_nobody},
    {"fallocate", "mode 0 grows the size", t_falloc_grow},
    {"fallocate", "mode 0 inside keeps the data", t_falloc_inside},
    {"fallocate", "KEEP_SIZE keeps the size", t_falloc_keep_size},
    {"fallocate", "PUNCH_HOLE reads back zeros", t_falloc_punch},
    {"fallocate", "unaligned PUNCH_HOLE", t_falloc_punch_unaligned},
    {"fallocate", "PUNCH_HOLE without KEEP_SIZE EOPNOTSUPP", t_falloc_punch_needs_keep},
    {"fallocate", "ZERO_RANGE zeros", t_falloc_zero_range},
    {"fallocate", "ZERO_RANGE past EOF grows", t_falloc_zero_range_grow},
    {"fallocate", "EBADF and EINVAL", t_falloc_errors},
    {"fallocate", "posix_fallocate", t_falloc_posix},
    {"lseek", "SEEK_DATA in data", t_lseek_data_start},
    {"lseek", "SEEK_HOLE finds the punched hole", t_lseek_hole_middle},
    {"lseek", "SEEK_DATA skips the hole", t_lseek_data_after_hole},
    {"lseek", "SEEK_HOLE at EOF", t_lseek_hole_at_eof},
    {"lseek", "SEEK_DATA and SEEK_HOLE past EOF ENXIO", t_lseek_past_eof},
    {"lseek", "file of holes only", t_lseek_all_hole},
    {"lseek", "SEEK_SET, SEEK_CUR, SEEK_END", t_lseek_basic},
    {"copy_file_range", "between two files", t_cfr_two_files},
    {"copy_file_range", "explicit offsets", t_cfr_offsets},
    {"copy_file_range", "file offsets advance", t_cfr_fd_offsets},
    {"copy_file_range", "within one file", t_cfr_same_file},
    {"copy_file_range", "overlapping EINVAL", t_cfr_overlap},
    {"copy_file_range", "at and across EOF", t_cfr_eof},
    {"copy_file_range", "EBADF", t_cfr_ebadf},
    {"locks", "F_GETLK reports the holder", t_locks_getlk},
    {"locks", "F_SETLK conflict EAGAIN", t_locks_setlk_conflict},
    {"locks", "F_SETLK on a free range", t_locks_setlk_free},
    {"locks", "unlock lets the other process in", t_locks_unlock},
    {"locks", "F_SETLKW waits for the unlock", t_locks_setlkw},
    {"locks", "closing any fd drops the locks", t_locks_close_any_fd},
    {"locks", "closing a dup drops the locks", t_locks_close_dup},
    {"locks", "read locks are shared", t_locks_shared},
    {"locks", "own locks do not conflict, downgrade", t_locks_own},
    {"locks", "unlocking the middle splits a lock", t_locks_split},
    {"locks", "EBADF for the open mode", t_locks_ebadf},
    {"locks", "exit releases the locks", t_locks_exit_releases},
    {"locks", "l_len 0 reaches past EOF", t_locks_to_eof},
    {"locks", "OFD locks", t_locks_ofd},
    {"flock", "LOCK_EX conflict EWOULDBLOCK", t_flock_ex_conflict},
    {"flock", "LOCK_SH shared by two", t_flock_shared},
    {"flock", "unlock then success", t_flock_unlock},
    {"flock", "a dup shares the lock until the last close", t_flock_dup_close},
    {"flock", "upgrade and downgrade", t_flock_upgrade},
    {"flock", "LOCK_EX waits for another process", t_flock_processes},
    {"flock", "independent of fcntl locks", t_flock_vs_fcntl},
    {"tmpfile", "linkat gives it a name with the data", t_tmpfile_link},
    {"tmpfile", "unnamed until linked", t_tmpfile_unnamed},
    {"tmpfile", "O_EXCL cannot be linked", t_tmpfile_excl},
    {"tmpfile", "linkat AT_EMPTY_PATH", t_tmpfile_empty_path},
    {"tmpfile", "as nobody", t_tmpfile_nobody},
    {"tmpfile", "in a subdirectory, ENOTDIR on a file", t_tmpfile_subdir},
    {"access", "EACCES as nobody on a 0600 file", t_access_nobody_0600},
    {"access", "R_OK as nobody on a 0644 file", t_access_nobody_0644},
    {"access", "root and execute bits", t_access_root},
    {"access", "ENOENT", t_access_enoent},
    {"access", "search permission as nobody", t_access_search},
    {"access", "group and owner classes as nobody", t_access_classes},
    {"mmap", "MAP_SHARED store read through a link", t_mmap_link},
    {"mmap", "mapping sees pwrite", t_mmap_sees_write},
    {"mmap", "store into a grown file", t_mmap_grown},
    {"mmap", "MAP_PRIVATE stays private", t_mmap_private},
    {"mmap", "EACCES for the open mode", t_mmap_eacces},
    {"statfs", "f_namelen 255", t_statfs_namelen},
    {"statfs", "sane counts", t_statfs_counts},
    {"statfs", "fstatfs and statvfs agree", t_statfs_fstatfs},
    /* CASES-END */
};

#define NCASES (sizeof cases / sizeof cases[0])

/* ------------------------------------------------------------------------ */
/* The runner.                                                              */

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        return rmdir(p) == 0 ? 0 : (fprintf(stderr, "cxlfs-posix: rmdir %s: %s\n", p, en(errno)), 0);
    return unlink(p) == 0 ? 0 : (fprintf(stderr, "cxlfs-posix: unlink %s: %s\n", p, en(errno)), 0);
}

static void rm_tree(const char *p)
{
    nftw(p, rm_entry, 32, FTW_DEPTH | FTW_PHYS);
}

/* Runs one case in a fork; 0 if it passed, else detail is filled in. */
static int run_case(const struct tcase *c, const char *dir, char *detail, size_t dlen)
{
    detail[0] = '\0';
    if (mkdir(dir, 0777) != 0 || chmod(dir, 0777) != 0) {
        snprintf(detail, dlen, "runner: mkdir(%.400s): %s", dir, en(errno));
        return -1;
    }
    int res[2];
    if (pipe2(res, O_CLOEXEC) != 0) {
        snprintf(detail, dlen, "runner: pipe2: %s", en(errno));
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(detail, dlen, "runner: fork: %s", en(errno));
        close(res[0]);
        close(res[1]);
        return -1;
    }
    if (pid == 0) {
        close(res[0]);
        setpgid(0, 0);
        umask(0);
        alarm(CASE_TIMEOUT_S);
        g_failed = 0;
        g_detail[0] = '\0';
        if (chdir(dir) != 0)
            fail_at("chdir(%s): %s", dir, en(errno));
        else
            c->fn();
        if (g_failed) {
            ssize_t w = write(res[1], g_detail, strlen(g_detail));
            (void)w;
        }
        _exit(g_failed ? 1 : 0);
    }
    close(res[1]);
    setpgid(pid, pid);
    int status;
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd >= 0) {
        struct pollfd p = {.fd = pfd, .events = POLLIN};
        int r;
        while ((r = poll(&p, 1, (CASE_TIMEOUT_S + 10) * 1000)) < 0 && errno == EINTR)
            ;
        if (r == 0)
            kill(pid, SIGKILL);
        close(pfd);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    kill(-pid, SIGKILL); /* what the case left running */
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    fcntl(res[0], F_SETFL, O_NONBLOCK);
    ssize_t n = read(res[0], detail, dlen - 1);
    detail[n > 0 ? n : 0] = '\0';
    close(res[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFSIGNALED(status))
        snprintf(detail, dlen, "killed by SIG%s%s", sigabbrev_np(WTERMSIG(status)),
                 WTERMSIG(status) == SIGALRM || WTERMSIG(status) == SIGKILL ? " (timed out)" : "");
    else if (n <= 0)
        snprintf(detail, dlen, "exit status %d", WEXITSTATUS(status));
    return -1;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static int cmd_run(int argc, char **argv)
{
    const char *dir = NULL, *json = NULL, *only = NULL;
    int keep = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--keep"))
            keep = 1;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            usage();
            return 2;
        }
    }
    if (!dir) {
        usage();
        return 2;
    }
    umask(0);
    if (geteuid() != 0)
        fprintf(stderr, "cxlfs-posix: not root: the root-only cases will fail\n");
    signal(SIGPIPE, SIG_IGN);
    char top[PATH_MAX];
    snprintf(top, sizeof top, "%s/cxlfs-posix.%d", dir, (int)getpid());
    if (mkdir(top, 0755) != 0 || chmod(top, 0755) != 0) {
        fprintf(stderr, "cxlfs-posix: mkdir %s: %s\n", top, strerror(errno));
        return 2;
    }
    size_t cap = 16, nfail = 0;
    char **failures = malloc(cap * sizeof *failures);
    int passed = 0, total = 0;
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < NCASES; i++) {
        const struct tcase *c = &cases[i];
        char full[256];
        snprintf(full, sizeof full, "%s %s", c->area, c->name);
        if (only && strncmp(full, only, strlen(only)) != 0)
            continue;
        char cdir[PATH_MAX + 16], detail[sizeof g_detail];
        snprintf(cdir, sizeof cdir, "%s/%03zu", top, i);
        total++;
        if (run_case(c, cdir, detail, sizeof detail) == 0) {
            passed++;
            printf("ok %s\n", full);
        } else {
            printf("FAIL %s: %s\n", full, detail);
            if (nfail == cap)
                failures = realloc(failures, (cap *= 2) * sizeof *failures);
            if (!failures || asprintf(&failures[nfail++], "%s: %s", full, detail) < 0) {
                fprintf(stderr, "cxlfs-posix: out of memory\n");
                return 2;
            }
        }
        fflush(stdout);
        if (!keep)
            rm_tree(cdir);
    }
    if (!keep)
        rm_tree(top);
    int failed = total - passed;
    printf("cxlfs-posix: passed=%d failed=%d total=%d\n", passed, failed, total);
    fprintf(stderr, "cxlfs-posix: %.2f s\n", (double)(now_ns() - t0) / 1e9);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "cxlfs-posix: %s: %s\n", json, strerror(errno));
            return 2;
        }
        fprintf(f, "{\"passed\":%d,\"failed\":%d,\"total\":%d,\"failures\":[", passed, failed, total);
        for (size_t i = 0; i < nfail; i++) {
            if (i)
                fputc(',', f);
            json_str(f, failures[i]);
        }
        fprintf(f, "]}\n");
        if (fclose(f) != 0) {
            fprintf(stderr, "cxlfs-posix: %s: %s\n", json, strerror(errno));
            return 2;
        }
    }
    return failed == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------------ */
/* Cross-process / cross-VM lock tools.                                     */

static struct flock whole(short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 0;
    return fl;
}

static int open_rw(const char *p, int flags)
{
    int fd = open(p, O_RDWR | O_CLOEXEC | flags, 0666);
    if (fd < 0)
        fprintf(stderr, "cxlfs-posix: open %s: %s\n", p, strerror(errno));
    return fd;
}

static int cmd_lock_hold(const char *file, const char *secs, const char *marker)
{
    char *end;
    errno = 0;
    double s = strtod(secs, &end);
    if (errno || end == secs || *end || s < 0) {
        usage();
        return 2;
    }
    int fd = open_rw(file, O_CREAT);
    if (fd < 0)
        return 1;
    struct flock fl = whole(F_WRLCK);
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        fprintf(stderr, "cxlfs-posix: F_SETLK %s: %s\n", file, en(errno));
        return 1;
    }
    int m = open(marker, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    if (m < 0) {
        fprintf(stderr, "cxlfs-posix: create %s: %s\n", marker, strerror(errno));
        return 1;
    }
    close(m);
    sleep_ms((unsigned)(s * 1000));
    fl = whole(F_UNLCK);
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        fprintf(stderr, "cxlfs-posix: unlock %s: %s\n", file, en(errno));
        return 1;
    }
    close(fd);
    return 0;
}

static int cmd_lock_probe(const char *file)
{
    int fd = open_rw(file, 0);
    if (fd < 0)
        return 1;
    struct flock fl = whole(F_WRLCK);
    if (fcntl(fd, F_GETLK, &fl) != 0) {
        fprintf(stderr, "cxlfs-posix: F_GETLK %s: %s\n", file, en(errno));
        return 1;
    }
    if (fl.l_type == F_UNLCK) {
        printf("free\n");
        return 1;
    }
    printf("conflict type=%s\n", fl.l_type == F_WRLCK ? "wr" : fl.l_type == F_RDLCK ? "rd" : "?");
    fl = whole(F_WRLCK);
    if (fcntl(fd, F_SETLK, &fl) == 0) {
        printf("setlk=ok\n");
        fl = whole(F_UNLCK);
        fcntl(fd, F_SETLK, &fl);
    } else if (errno == EAGAIN || errno == EACCES) {
        printf("setlk=EAGAIN\n");
    } else {
        printf("setlk=%s\n", en(errno));
    }
    close(fd);
    return 0;
}

static int cmd_lock_wait(const char *file)
{
    int fd = open_rw(file, 0);
    if (fd < 0)
        return 1;
    struct flock fl = whole(F_WRLCK);
    uint64_t t0 = now_ns();
    if (fcntl(fd, F_SETLKW, &fl) != 0) {
        fprintf(stderr, "cxlfs-posix: F_SETLKW %s: %s\n", file, en(errno));
        return 1;
    }
    printf("waited_ms=%llu\n", (unsigned long long)((now_ns() - t0) / 1000000));
    fl = whole(F_UNLCK);
    fcntl(fd, F_SETLK, &fl);
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage();
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "run"))
        return cmd_run(argc - 2, argv + 2);
    if (argc == 2 && !strcmp(argv[1], "list")) {
        for (size_t i = 0; i < NCASES; i++)
            printf("%s %s\n", cases[i].area, cases[i].name);
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "lock-hold"))
        return cmd_lock_hold(argv[2], argv[3], argv[4]);
    if (argc == 3 && !strcmp(argv[1], "lock-probe"))
        return cmd_lock_probe(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "lock-wait"))
        return cmd_lock_wait(argv[2]);
    usage();
    return 2;
}
