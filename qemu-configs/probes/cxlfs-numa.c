/*
 * cxlfs-numa: set a NUMA memory policy and exec a command under it (the
 * policy survives execve and is inherited by children):
 *
 *   cxlfs-numa --membind NODES | --interleave NODES | --preferred NODE
 *              | --weighted-interleave NODE:W[,NODE:W...]  -- COMMAND [ARGS...]
 *
 * Exists for --weighted-interleave (MPOL_WEIGHTED_INTERLEAVE, Linux >= 6.9),
 * which Debian 12's numactl 2.0.16 does not know. Raw set_mempolicy(2), so
 * it needs no libnuma. Built static into the guest image
 * (qemu-configs/build-guest-image.sh).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cxlfs-probe.h"

#define MPOL_PREFERRED 1
#define MPOL_BIND 2
#define MPOL_INTERLEAVE 3
#define MPOL_WEIGHTED_INTERLEAVE 6

#define WI_DIR "/sys/kernel/mm/mempolicy/weighted_interleave"

static unsigned long mask[MAX_NODES / ULONG_BITS];
static int weight[MAX_NODES];

static void usage(void)
{
    fprintf(stderr,
        "usage: cxlfs-numa --membind NODES | --interleave NODES | --preferred NODE\n"
        "                  | --weighted-interleave NODE:W[,NODE:W...]  -- COMMAND [ARGS...]\n"
        "\n"
        "NODES: a list such as 1, 0,1 or 0-3. W: 1..255. Sets the policy with\n"
        "set_mempolicy(2) and execs COMMAND under it. --weighted-interleave first\n"
        "writes each weight to " WI_DIR "/nodeN\n"
        "(system-wide) and needs Linux >= 6.9.\n");
}

static int parse_num(const char *s, char **end, long max)
{
    errno = 0;
    long v = strtol(s, end, 10);
    if (errno || *end == s || v < 0 || v > max)
        return -1;
    return (int)v;
}

static void set_node(int n)
{
    mask[n / ULONG_BITS] |= 1UL << (n % ULONG_BITS);
}

/* "0,2-3" -> mask; returns the number of nodes or -1. */
static int parse_nodes(const char *s)
{
    int count = 0;
    while (*s) {
        char *end;
        int a = parse_num(s, &end, MAX_NODES - 1), b = a;
        if (a < 0)
            return -1;
        if (*end == '-') {
            b = parse_num(end + 1, &end, MAX_NODES - 1);
            if (b < a)
                return -1;
        }
        for (int n = a; n <= b; n++, count++)
            set_node(n);
        if (*end == ',' && end[1])
            end++;
        else if (*end)
            return -1;
        s = end;
    }
    return count;
}

/* "0:3,1:1" -> mask + weights; returns the number of nodes or -1. */
static int parse_weights(const char *s)
{
    int count = 0;
    while (*s) {
        char *end;
        int n = parse_num(s, &end, MAX_NODES - 1);
        if (n < 0 || *end != ':')
            return -1;
        int w = parse_num(end + 1, &end, 255);
        if (w < 1)
            return -1;
        set_node(n);
        weight[n] = w;
        count++;
        if (*end == ',' && end[1])
            end++;
        else if (*end)
            return -1;
        s = end;
    }
    return count;
}

static int no_weighted(void)
{
    fprintf(stderr, "cxlfs-numa: this kernel has no weighted interleave (MPOL_WEIGHTED_INTERLEAVE "
                    "needs Linux >= 6.9: build the image with --kernel backports)\n");
    return 2;
}

static int write_weights(void)
{
    struct stat st;
    if (stat(WI_DIR, &st) != 0)
        return no_weighted();
    for (int n = 0; n < MAX_NODES; n++) {
        if (!weight[n])
            continue;
        char path[128], val[8];
        snprintf(path, sizeof path, WI_DIR "/node%d", n);
        int len = snprintf(val, sizeof val, "%d\n", weight[n]);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, val, (size_t)len) != len) {
            fprintf(stderr, "cxlfs-numa: cannot set weight %d in %s: %s\n", weight[n], path,
                    strerror(errno));
            if (fd >= 0)
                close(fd);
            return 1;
        }
        close(fd);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage();
        return 0;
    }
    if (argc < 5 || strcmp(argv[3], "--")) {
        usage();
        return 2;
    }
    const char *opt = argv[1], *val = argv[2];
    int mode, count;
    if (!strcmp(opt, "--membind")) {
        mode = MPOL_BIND;
        count = parse_nodes(val);
    } else if (!strcmp(opt, "--interleave")) {
        mode = MPOL_INTERLEAVE;
        count = parse_nodes(val);
    } else if (!strcmp(opt, "--preferred")) {
        mode = MPOL_PREFERRED;
        count = parse_nodes(val);
        if (count != 1)
            count = -1;
    } else if (!strcmp(opt, "--weighted-interleave")) {
        mode = MPOL_WEIGHTED_INTERLEAVE;
        count = parse_weights(val);
    } else {
        fprintf(stderr, "cxlfs-numa: unknown policy %s\n", opt);
        usage();
        return 2;
    }
    if (count < 1) {
        fprintf(stderr, "cxlfs-numa: bad node list for %s: %s\n", opt, val);
        usage();
        return 2;
    }
    if (mode == MPOL_WEIGHTED_INTERLEAVE) {
        int rc = write_weights();
        if (rc)
            return rc;
    }
    /* maxnode counts bits plus one: the kernel reads maxnode - 1 bits. */
    if (syscall(SYS_set_mempolicy, mode, mask, (unsigned long)MAX_NODES + 1) != 0) {
        int e = errno;
        if (mode == MPOL_WEIGHTED_INTERLEAVE && e == EINVAL)
            return no_weighted();
        fprintf(stderr, "cxlfs-numa: set_mempolicy(%s %s): %s\n", opt, val, strerror(e));
        return 1;
    }
    execvp(argv[4], argv + 4);
    fprintf(stderr, "cxlfs-numa: cannot run %s: %s\n", argv[4], strerror(errno));
    return 127;
}
