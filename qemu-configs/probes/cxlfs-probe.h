/*
 * What the cxlfs probes share: argument parsing, node masks and the clock. Each probe
 * is one static binary (qemu-configs/build-guest-image.sh), so this header
 * holds static functions rather than a library.
 */
#ifndef CXLFS_PROBE_H
#define CXLFS_PROBE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Node masks as the kernel's memory-policy calls take them: MAX_NODES
 * bits, passed with maxnode = MAX_NODES + 1 (the kernel reads maxnode - 1
 * bits). */
#define MAX_NODES 1024
#define ULONG_BITS (8 * sizeof(unsigned long))

/* Whether node `n` is set in `mask` (MAX_NODES bits). */
static inline int node_in_mask(const unsigned long *mask, unsigned n)
{
    return n < MAX_NODES && (mask[n / ULONG_BITS] >> (n % ULONG_BITS)) & 1;
}

/* A size in bytes with an optional k/m/g suffix (powers of 1024). */
static inline int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end != '\0' || v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

/* A whole number (decimal, or 0x hex). */
static inline int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end != '\0' || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
