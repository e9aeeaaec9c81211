/*
 * cxlfs-memlat: dependent loads over a working set, one load per slot (a
 * 4 KiB page or a 64-byte line), in a random cyclic order, so that every
 * load waits for the one before it; or (--pattern zipf:S) as many loads,
 * each to a random line of a page drawn from a Zipf(S) popularity over the
 * working set's pages. Run it under numactl to place the working set on a
 * node:
 *
 *   numactl --membind=1 cxlfs-memlat --size 24m --stride 64 --laps 1
 *
 * Flag form: one JSON line with a log-spaced histogram of every measured
 * load, each timed alone (see usage()). Positional form, kept for
 * daemon/bench/memory-mode.sh and tests/tests/memory_mode.rs:
 *
 *   cxlfs-memlat SIZE_MIB [STRIDE] [PASSES]
 *
 * prints {"size_bytes","stride","loads","ns_per_load" (timed passes, all
 * loads together), "first_p50_ns"... (the first pass, each load alone)}.
 * Built static into the guest image (qemu-configs/build-guest-image.sh).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cxlfs-probe.h"

/* Loads per turn of an --against-node run (on each working set in turn). */
#define TURN 4096u

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ------------------------------------------------------ positional form */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int legacy_main(int argc, char **argv)
{
    size_t size = (size_t)strtoull(argv[1], NULL, 10) << 20;
    size_t stride = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 4096;
    int passes = argc > 3 ? atoi(argv[3]) : 3;
    if (size == 0 || stride < sizeof(void *) || stride > size || passes < 1) {
        fprintf(stderr, "cxlfs-memlat: bad arguments\n");
        return 2;
    }
    size_t n = size / stride;
    char *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t *order = malloc(n * sizeof(size_t));
    uint64_t *lat = malloc(n * sizeof(uint64_t));
    if (mem == MAP_FAILED || !order || !lat) {
        fprintf(stderr, "cxlfs-memlat: out of memory\n");
        return 1;
    }
    /* A random cyclic permutation (Sattolo). */
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = next_rand() % i;
        size_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    /* Each slot points at the next one in the cycle (this writes every
     * page once: on a set larger than the device cache, the early pages
     * are evicted, written back, and trap again below). */
    for (size_t i = 0; i < n; i++)
        *(void **)(mem + order[i] * stride) = mem + order[(i + 1) % n] * stride;
    /* Pass 0: every load timed alone (misses where the set exceeds the
     * cache). */
    void **p = (void **)(mem + order[0] * stride);
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        p = (void **)*p;
        lat[i] = now_ns() - t0;
    }
    /* Timed passes: all loads together (no clock per load). */
    uint64_t t0 = now_ns();
    for (int k = 0; k < passes; k++)
        for (size_t i = 0; i < n; i++)
            p = (void **)*p;
    uint64_t total = now_ns() - t0;
    qsort(lat, n, sizeof(uint64_t), cmp_u64);
    printf("{\"size_bytes\":%zu,\"stride\":%zu,\"loads\":%zu,\"ns_per_load\":%.1f,"
           "\"first_p50_ns\":%llu,\"first_p90_ns\":%llu,\"first_p99_ns\":%llu,\"sink\":%d}\n",
           size, stride, n, (double)total / ((double)n * passes),
           (unsigned long long)lat[n / 2], (unsigned long long)lat[n * 9 / 10],
           (unsigned long long)lat[n * 99 / 100], p == NULL);
    return 0;
}

/* ------------------------------------------------------------ flag form */

static void usage(void)
{
    fprintf(stderr,
        "usage: cxlfs-memlat --size BYTES[k|m|g] [--stride BYTES (4096)] [--laps N (2)]\n"
        "                    [--warmup-laps N (1)] [--seed S (1)] [--sequence FILE]\n"
        "                    [--pattern uniform|zipf:S (uniform)] [--file PATH]\n"
        "                    [--against-node N] [--min-seconds S (0)]\n"
        "       cxlfs-memlat SIZE_MIB [STRIDE_BYTES=4096] [PASSES=3]   (old form, old JSON)\n"
        "\n"
        "Chases pointers through a random cyclic permutation of the working set's\n"
        "slots (one slot per stride; the cycle comes from the seed). The pass that\n"
        "builds the chain writes the slots in exactly the order the laps load them;\n"
        "then come the warm-up laps (untimed), then the measured laps, each load\n"
        "timed alone with clock_gettime(CLOCK_MONOTONIC) into a log-spaced\n"
        "histogram (16 buckets per power of two; nothing is subtracted:\n"
        "timer_overhead_ns is the median cost of one clock read). Every lap loads\n"
        "the same order. Prints one JSON line.\n"
        "\n"
        "--sequence FILE: before the chain is built, writes the page index (byte\n"
        "offset in the working set / 4096) of every load of one lap, in load order,\n"
        "as little-endian u32, for replaying build + warm-up + laps through a\n"
        "cache model on the host.\n"
        "\n"
        "--file PATH: the working set is PATH (created, sized to --size), mapped\n"
        "MAP_SHARED: on a DAX mount each first touch of a page is a DAX fault. The\n"
        "JSON then has \"file\":PATH after the seed.\n"
        "\n"
        "--pattern zipf:S (S > 0): a lap is still size/stride loads, but each goes\n"
        "to a random 64-byte line of a page drawn from a Zipf(S) popularity over\n"
        "the working set's whole 4 KiB pages (page k of the popularity ranking is\n"
        "a random page, so hot pages are scattered; the draws come from the seed,\n"
        "and every lap repeats the same draws). Every line holds 0 and each load's\n"
        "address is the line's plus the value the previous load returned, so the\n"
        "loads stay dependent. The build pass writes the lines in load order (pages\n"
        "never drawn are never touched); the lap's order (4 bytes a load) stays\n"
        "mapped during the laps and is read sequentially (on the CPU's node: see\n"
        "Placement). The JSON adds pattern, pages, distinct_pages (drawn in a\n"
        "lap) and loads_per_s (measured laps' loads over their wall time, clock\n"
        "reads included).\n"
        "\n"
        "--against-node N (uniform chase, anonymous memory): a second working set\n"
        "of the same size and the same cycle, bound to node N (mbind), is chased\n"
        "in turn with the first, %u loads of one then %u of the other, warm-up\n"
        "and measured laps alike: the two are timed through the same moments of\n"
        "the host, whatever else it does. The histogram is the first's; the JSON\n"
        "adds against_node, against_mean_ns, against_min_ns, against_p50_ns and\n"
        "against_p99_ns for the second.\n"
        "\n"
        "Placement: started under a memory policy whose nodes leave out the node\n"
        "of the CPU it runs on (numactl --membind=1, node 1 a CPU-less CXL node),\n"
        "the probe gives that policy to the working set alone and moves its own\n"
        "pages (the lap's order, the histogram, its stack, page tables made from\n"
        "then on) to the CPU's node, so that the measured node sees the chase's\n"
        "loads and nothing else, as a replay of --sequence assumes.\n"
        "\n"
        "--min-seconds S: the measured laps go on past --laps until they have\n"
        "run S seconds (for what needs time to act, e.g. NUMA balancing's\n"
        "scanner, whatever the guest's speed); \"laps\" in the JSON says how\n"
        "many ran.\n", TURN, TURN);
}

/* Histogram: values < 16 ns get one bucket per ns; from 16 ns on, each
 * power of two [2^o, 2^(o+1)) is split into 16 equal buckets (integer
 * bounds, <= 6.25% wide), up to 2^30 ns (~1.07 s); the last bucket takes
 * everything above. 433 counters, 3.4 KiB of bss: the probe's own
 * footprint stays a few pages (each costs device-cache space on node 1). */
#define SUB 16
#define TOP_OCTAVE 30
#define NBUCKETS (SUB + (TOP_OCTAVE - 4) * SUB + 1)

/* One working set's measured loads: the histogram, their sum, min and max. */
struct stats {
    uint64_t hist[NBUCKETS];
    uint64_t sum, min, max;
};
#define STATS_INIT { .min = UINT64_MAX }
/* The working set's (the JSON's histogram), and --against-node's. */
static struct stats st = STATS_INIT, against_st = STATS_INIT;

static unsigned bucket_of(uint64_t v)
{
    if (v < SUB)
        return (unsigned)v;
    unsigned o = 63u - (unsigned)__builtin_clzll(v);
    if (o >= TOP_OCTAVE)
        return NBUCKETS - 1;
    return SUB + (o - 4) * SUB + (unsigned)((v >> (o - 4)) & (SUB - 1));
}

/* [lo, hi) of bucket b; the last one's hi is max + 1. */
static void bucket_bounds(unsigned b, uint64_t max, uint64_t *lo, uint64_t *hi)
{
    if (b < SUB) {
        *lo = b;
        *hi = b + 1;
    } else if (b == NBUCKETS - 1) {
        *lo = (uint64_t)1 << TOP_OCTAVE;
        *hi = max + 1;
    } else {
        unsigned o = 4 + (b - SUB) / SUB, j = (b - SUB) % SUB;
        uint64_t w = (uint64_t)1 << (o - 4);
        *lo = ((uint64_t)1 << o) + j * w;
        *hi = *lo + w;
    }
}

/* The q-quantile from the histogram `hist`: linear inside the bucket that
 * holds rank q*count, clamped to [min, max]. */
static double quantile(const uint64_t *hist, double q, uint64_t count, uint64_t min, uint64_t max)
{
    double rank = q * (double)count, cum = 0;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        if (!hist[b])
            continue;
        if (cum + (double)hist[b] >= rank) {
            uint64_t lo, hi;
            bucket_bounds(b, max, &lo, &hi);
            double v = (double)lo + (double)(hi - lo) * (rank - cum) / (double)hist[b];
            if (v < (double)min)
                v = (double)min;
            if (v > (double)max)
                v = (double)max;
            return v;
        }
        cum += (double)hist[b];
    }
    return (double)max;
}

/* order[k] * unit is the byte offset of load k (unit: the stride, or 64 for
 * the line indices of a zipf lap). */
static int write_sequence(const char *path, const uint32_t *order, uint64_t n, uint64_t unit)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    static unsigned char buf[4096];
    size_t used = 0;
    for (uint64_t k = 0; k <= n; k++) {
        if (used == sizeof buf || (k == n && used)) {
            size_t off = 0;
            while (off < used) {
                ssize_t w = write(fd, buf + off, used - off);
                if (w < 0) {
                    if (errno == EINTR)
                        continue;
                    close(fd);
                    return -1;
                }
                off += (size_t)w;
            }
            used = 0;
        }
        if (k == n)
            break;
        uint32_t page = (uint32_t)(((uint64_t)order[k] * unit) / 4096);
        buf[used++] = (unsigned char)page;
        buf[used++] = (unsigned char)(page >> 8);
        buf[used++] = (unsigned char)(page >> 16);
        buf[used++] = (unsigned char)(page >> 24);
    }
    return close(fd);
}

static inline void record(struct stats *s, uint64_t d)
{
    s->hist[bucket_of(d)]++;
    s->sum += d;
    if (d < s->min)
        s->min = d;
    if (d > s->max)
        s->max = d;
}

/* Cost of one clock read, as each measured load includes it: the median of
 * back-to-back reads (the median: a vCPU preempted under TCG must not
 * count), through the same histogram, cleared after. */
static double timer_overhead(void)
{
    enum { TIMER_READS = 1001 };
    struct stats t_st = STATS_INIT;
    uint64_t prev = now_ns();
    for (int i = 0; i < TIMER_READS; i++) {
        uint64_t t = now_ns();
        record(&t_st, t - prev);
        prev = t;
    }
    return quantile(t_st.hist, 0.5, TIMER_READS, t_st.min, t_st.max);
}

/* What a run was asked to do, for the JSON line. */
struct run_args {
    uint64_t size, stride, n, laps, warmup, seed;
    uint64_t min_ns; /* --min-seconds, in ns */
};

/* The JSON line; `extra` (empty, or starting with a comma) goes after seed. */
/* --file PATH: the working set is that file, mapped shared (NULL: anonymous). */
static const char *map_file;

static int print_result(const struct run_args *a, double timer_ns, const char *extra)
{
    uint64_t count = a->laps * a->n, min = st.min, max = st.max;
    char with_file[4352];
    snprintf(with_file, sizeof with_file, "%s%s%s%s", extra, map_file ? ",\"file\":\"" : "",
             map_file ? map_file : "", map_file ? "\"" : "");
    extra = with_file;
    printf("{\"probe\":\"memlat\",\"size_bytes\":%" PRIu64 ",\"stride\":%" PRIu64
           ",\"loads_per_lap\":%" PRIu64 ",\"laps\":%" PRIu64 ",\"warmup_laps\":%" PRIu64
           ",\"seed\":%" PRIu64 "%s,\"clock\":\"clock_gettime(CLOCK_MONOTONIC)\""
           ",\"timer_overhead_ns\":%.1f,\"mean_ns\":%.1f,\"min_ns\":%" PRIu64
           ",\"p50_ns\":%.1f,\"p90_ns\":%.1f,\"p99_ns\":%.1f,\"p999_ns\":%.1f,\"max_ns\":%" PRIu64
           ",\"histogram\":{\"unit\":\"ns\",\"buckets\":[",
           a->size, a->stride, a->n, a->laps, a->warmup, a->seed, extra, timer_ns,
           (double)st.sum / (double)count, min, quantile(st.hist, 0.5, count, min, max),
           quantile(st.hist, 0.9, count, min, max), quantile(st.hist, 0.99, count, min, max),
           quantile(st.hist, 0.999, count, min, max), max);
    int first = 1;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        if (!st.hist[b])
            continue;
        uint64_t lo, hi;
        bucket_bounds(b, max, &lo, &hi);
        printf("%s[%" PRIu64 ",%" PRIu64 ",%" PRIu64 "]", first ? "" : ",", lo, hi, st.hist[b]);
        first = 0;
    }
    printf("]}}\n");
    return fflush(stdout) == 0 ? 0 : 1;
}

/* ------------------------------------------------------------- zipf lap */

/* `uniform` (0) or `zipf:S` (S > 0, at most 100) into *zipf_s. */
static int parse_pattern(const char *v, double *zipf_s)
{
    if (!strcmp(v, "uniform")) {
        *zipf_s = 0;
        return 0;
    }
    if (strncmp(v, "zipf:", 5) != 0)
        return -1;
    char *end;
    errno = 0;
    double s = strtod(v + 5, &end);
    if (errno || end == v + 5 || *end != '\0' || !(s > 0) || s > 100)
        return -1;
    *zipf_s = s;
    return 0;
}

/* One lap of n loads: lines[k] is the 64-byte line index (byte offset / 64)
 * of load k, on a page drawn from Zipf(s) over `pages` pages whose ranks
 * are shuffled. Counts the distinct pages drawn. 0, or -1 when out of
 * memory. */
static int zipf_lap(uint32_t *lines, uint64_t n, uint64_t pages, double s, uint64_t *distinct)
{
    size_t cdf_len = pages * sizeof(double), rank_len = pages * sizeof(uint32_t);
    double *cdf = mmap(NULL, cdf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint32_t *page_of = mmap(NULL, rank_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (cdf == MAP_FAILED || page_of == MAP_FAILED)
        return -1;
    double total = 0;
    for (uint64_t r = 0; r < pages; r++) {
        total += pow((double)(r + 1), -s);
        cdf[r] = total;
    }
    for (uint64_t i = 0; i < pages; i++)
        page_of[i] = (uint32_t)i;
    for (uint64_t i = pages - 1; i > 0; i--) { /* Fisher-Yates */
        uint64_t j = next_rand() % (i + 1);
        uint32_t t = page_of[i];
        page_of[i] = page_of[j];
        page_of[j] = t;
    }
    for (uint64_t k = 0; k < n; k++) {
        double u = (double)(next_rand() >> 11) * 0x1p-53 * total;
        uint64_t lo = 0, hi = pages - 1; /* the first rank with cdf > u */
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (cdf[mid] > u)
                hi = mid;
            else
                lo = mid + 1;
        }
        lines[k] = page_of[lo] * 64u + (uint32_t)(next_rand() % 64);
    }
    /* Distinct pages: the cdf's room, reused as a bitmap. */
    uint64_t *seen = (uint64_t *)cdf;
    memset(seen, 0, (pages + 63) / 64 * sizeof(uint64_t));
    *distinct = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint32_t pg = lines[k] / 64;
        uint64_t bit = (uint64_t)1 << (pg % 64);
        if (!(seen[pg / 64] & bit)) {
            seen[pg / 64] |= bit;
            ++*distinct;
        }
    }
    munmap(cdf, cdf_len);
    munmap(page_of, rank_len);
    return 0;
}

/* The zipf run over `mem`: the lap, its sequence file, the build pass,
 * warm-up and measured laps, the JSON line. */
static int zipf_main(char *mem, const struct run_args *a, double s, const char *seq_path)
{
    uint64_t pages = a->size / 4096, n = a->n, distinct = 0;
    size_t lines_len = n * sizeof(uint32_t);
    uint32_t *lines = mmap(NULL, lines_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (lines == MAP_FAILED || zipf_lap(lines, n, pages, s, &distinct) != 0) {
        fprintf(stderr, "cxlfs-memlat: out of memory\n");
        return 1;
    }
    if (seq_path && write_sequence(seq_path, lines, n, 64) != 0) {
        fprintf(stderr, "cxlfs-memlat: cannot write %s: %s\n", seq_path, strerror(errno));
        return 1;
    }
    /* The build pass: every line of the lap holds 0, written in load order. */
    for (uint64_t k = 0; k < n; k++)
        *(volatile uint64_t *)(mem + (uint64_t)lines[k] * 64) = 0;
    double timer_ns = timer_overhead();

    uint64_t v = 0; /* each load's value (0) joins the next one's address */
    for (uint64_t l = 0; l < a->warmup; l++)
        for (uint64_t i = 0; i < n; i++)
            v = *(volatile uint64_t *)(mem + (uint64_t)lines[i] * 64 + v);
    uint64_t start = now_ns();
    struct run_args ran = *a;
    for (ran.laps = 0; ran.laps < a->laps || now_ns() - start < a->min_ns; ran.laps++) {
        for (uint64_t i = 0; i < n; i++) {
            uint64_t off = (uint64_t)lines[i] * 64 + v;
            uint64_t t0 = now_ns();
            v = *(volatile uint64_t *)(mem + off);
            record(&st, now_ns() - t0);
        }
    }
    uint64_t wall = now_ns() - start;
    char extra[160];
    snprintf(extra, sizeof extra,
             ",\"pattern\":\"zipf:%g\",\"pages\":%" PRIu64 ",\"distinct_pages\":%" PRIu64
             ",\"loads_per_s\":%.1f",
             s, pages, distinct, (double)(ran.laps * n) * 1e9 / (double)(wall ? wall : 1));
    /* (v is 0: adding it keeps the last load live.) */
    return print_result(&ran, timer_ns, extra) | (v != 0);
}

/* `size` bytes of anonymous memory bound to `node` (MPOL_BIND), or
 * MAP_FAILED. The probe is static: no libnuma, the syscall itself. */
static char *map_on_node(uint64_t size, uint64_t node)
{
    enum { MPOL_BIND_ = 2 };
    char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return m;
    unsigned long mask = 1ul << node;
    /* maxnode counts the mask's bits plus one, as libnuma passes it. */
    if (syscall(SYS_mbind, m, size, MPOL_BIND_, &mask, 8 * sizeof mask + 1, 0) != 0) {
        munmap(m, size);
        return MAP_FAILED;
    }
    return m;
}

/* Builds the cycle in load order in `mem`: slot order[k] points at
 * order[k+1]. Returns the first slot. */
static void **build_chain(char *mem, const uint32_t *order, uint64_t n, uint64_t stride)
{
    for (uint64_t k = 0; k < n; k++)
        *(void **)(mem + (uint64_t)order[k] * stride) = mem + (uint64_t)order[(k + 1) % n] * stride;
    return (void **)(mem + (uint64_t)order[0] * stride);
}

/* `count` loads of the chase from *p, each timed into `s` (NULL: untimed). */
static void chase(void *volatile **p, uint64_t count, struct stats *s)
{
    void *volatile *q = *p;
    if (!s) {
        for (uint64_t i = 0; i < count; i++)
            q = (void *volatile *)*q;
    } else {
        for (uint64_t i = 0; i < count; i++) {
            uint64_t t0 = now_ns();
            q = (void *volatile *)*q;
            record(s, now_ns() - t0);
        }
    }
    *p = q;
}

/* `laps` laps of n loads over the chain at *p (more, until `min_ns` have
 * passed) — and, with `other`, as many over the chain at *other, TURN loads
 * of each in turn. Returns the laps run. */
static uint64_t laps_in_turn(void *volatile **p, void *volatile **other, uint64_t laps,
                             uint64_t n, struct stats *s, struct stats *other_s, uint64_t min_ns)
{
    uint64_t start = now_ns(), l;
    for (l = 0; l < laps || (min_ns && now_ns() - start < min_ns); l++) {
        for (uint64_t i = 0; i < n; i += TURN) {
            uint64_t m = n - i < TURN ? n - i : TURN;
            chase(p, m, s);
            if (other)
                chase(other, m, other_s);
        }
    }
    return l;
}

/* ------------------------------------------------------ own pages local */

/* Words of a node mask (cxlfs-probe.h's MAX_NODES bits). */
#define MASK_WORDS (MAX_NODES / ULONG_BITS)

/* The memory policy the probe was started under (cxlfs-numa / numactl),
 * meant for the working set alone. */
struct ws_policy {
    int mode; /* 0 (MPOL_DEFAULT): nothing to re-apply */
    unsigned long mask[MASK_WORDS];
};

/* Started under a policy whose nodes leave out the node of the CPU the
 * probe runs on (numactl --membind=1 for a CPU-less CXL node), the probe
 * keeps that policy for the working set (see bind_working_set) and moves
 * everything else it owns -- the lap's order, the histogram, its stack,
 * the page tables made from now on -- to the CPU's node: the memory
 * measured sees the chase's loads and nothing else, as the host's replay
 * of the lap assumes. A policy that includes the CPU's node, or none, is
 * left as it is. 0, or -1 with errno. */
static int keep_own_pages_local(struct ws_policy *ws)
{
    enum { MPOL_LOCAL_ = 4 };
    memset(ws, 0, sizeof *ws);
    int mode = 0;
    unsigned long mask[MASK_WORDS] = { 0 };
    if (syscall(SYS_get_mempolicy, &mode, mask, (unsigned long)MAX_NODES, NULL, 0UL) != 0)
        return errno == ENOSYS ? 0 : -1; /* a kernel without NUMA: one node */
    unsigned cpu = 0, node = 0;
    if (syscall(SYS_getcpu, &cpu, &node, NULL) != 0)
        return -1;
    int any = 0;
    for (size_t w = 0; w < MASK_WORDS; w++)
        any |= mask[w] != 0;
    if (mode == 0 || !any || node >= MAX_NODES || node_in_mask(mask, node))
        return 0;
    unsigned long here[MASK_WORDS] = { 0 };
    here[node / ULONG_BITS] = 1ul << (node % ULONG_BITS);
    if (syscall(SYS_set_mempolicy, MPOL_LOCAL_, NULL, 0UL) != 0)
        return -1;
    /* What was placed before this point (stack, data, the C library's
     * pages) moves; maxnode counts bits plus one. */
    if (syscall(SYS_migrate_pages, 0, (unsigned long)MAX_NODES + 1, mask, here) < 0)
        return -1;
    ws->mode = mode;
    memcpy(ws->mask, mask, sizeof mask);
    return 0;
}

/* Gives the working set `[mem, mem + size)` the policy the probe was
 * started under (nothing when keep_own_pages_local kept none). */
static int bind_working_set(const struct ws_policy *ws, void *mem, uint64_t size)
{
    if (ws->mode == 0)
        return 0;
    return (int)syscall(SYS_mbind, mem, size, (unsigned long)ws->mode, ws->mask,
                        (unsigned long)MAX_NODES + 1, 0UL);
}

static int flag_main(int argc, char **argv)
{
    uint64_t size = 0, stride = 4096, laps = 2, warmup = 1, seed = 1, against = UINT64_MAX;
    uint64_t min_s = 0;
    double zipf_s = 0;
    const char *seq_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "cxlfs-memlat: %s needs a value\n", a);
            usage();
            return 2;
        }
        const char *v = argv[++i];
        int bad;
        if (!strcmp(a, "--size"))
            bad = parse_size(v, &size);
        else if (!strcmp(a, "--stride"))
            bad = parse_size(v, &stride);
        else if (!strcmp(a, "--laps"))
            bad = parse_u64(v, &laps);
        else if (!strcmp(a, "--warmup-laps"))
            bad = parse_u64(v, &warmup);
        else if (!strcmp(a, "--min-seconds"))
            bad = parse_u64(v, &min_s) || min_s > 86400;
        else if (!strcmp(a, "--seed"))
            bad = parse_u64(v, &seed);
        else if (!strcmp(a, "--pattern"))
            bad = parse_pattern(v, &zipf_s);
        else if (!strcmp(a, "--against-node"))
            bad = parse_u64(v, &against) || against >= 64;
        else if (!strcmp(a, "--sequence")) {
            seq_path = v;
            bad = 0;
        } else if (!strcmp(a, "--file")) {
            map_file = v;
            bad = strchr(v, '"') != NULL || strchr(v, '\\') != NULL || strlen(v) > 4096;
        } else {
            fprintf(stderr, "cxlfs-memlat: unknown argument %s\n", a);
            usage();
            return 2;
        }
        if (bad) {
            fprintf(stderr, "cxlfs-memlat: bad value for %s: %s\n", a, v);
            usage();
            return 2;
        }
    }
    if (size == 0 || stride < sizeof(void *) || stride % sizeof(void *) || stride > size
        || laps < 1 || laps > 1000000 || warmup > 1000000) {
        fprintf(stderr, "cxlfs-memlat: need --size >= --stride >= 8 (a multiple of 8), "
                        "1 <= --laps <= 1e6, --warmup-laps <= 1e6\n");
        usage();
        return 2;
    }
    uint64_t n = size / stride;
    if (n > UINT32_MAX) {
        fprintf(stderr, "cxlfs-memlat: more than 2^32 slots: use a larger stride\n");
        return 2;
    }
    if (against != UINT64_MAX && (zipf_s > 0 || map_file)) {
        fprintf(stderr, "cxlfs-memlat: --against-node is for the uniform chase of anonymous memory\n");
        return 2;
    }
    if (zipf_s > 0 && (size < 4096 || size / 64 > UINT32_MAX)) {
        fprintf(stderr, "cxlfs-memlat: --pattern zipf needs 4 KiB <= --size <= 256 GiB\n");
        return 2;
    }
    struct ws_policy ws;
    if (keep_own_pages_local(&ws) != 0) {
        fprintf(stderr, "cxlfs-memlat: cannot keep the probe's own pages off the working set's node: %s\n",
                strerror(errno));
        return 1;
    }
    char *mem;
    if (map_file) {
        int fd = open(map_file, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
            fprintf(stderr, "cxlfs-memlat: %s: %s\n", map_file, strerror(errno));
            return 1;
        }
        mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    } else {
        mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem != MAP_FAILED && bind_working_set(&ws, mem, size) != 0) {
            fprintf(stderr, "cxlfs-memlat: cannot bind the working set to its node: %s\n",
                    strerror(errno));
            return 1;
        }
    }
    size_t order_len = n * sizeof(uint32_t);
    uint32_t *order = mmap(NULL, order_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED || order == MAP_FAILED) {
        fprintf(stderr, "cxlfs-memlat: out of memory\n");
        return 1;
    }
    /* splitmix64 of the seed: a nonzero xorshift state for any seed. */
    uint64_t z = seed + 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    rng = (z ^ (z >> 31)) | 1;
    struct run_args ra = { size, stride, n, laps, warmup, seed, min_s * 1000000000u };
    if (zipf_s > 0)
        return zipf_main(mem, &ra, zipf_s, seq_path);
    /* A random cyclic permutation (Sattolo): order[k] is the k-th slot loaded. */
    for (uint64_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = next_rand() % i;
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    if (seq_path && write_sequence(seq_path, order, n, stride) != 0) {
        fprintf(stderr, "cxlfs-memlat: cannot write %s: %s\n", seq_path, strerror(errno));
        return 1;
    }
    void *volatile *p = (void *volatile *)build_chain(mem, order, n, stride);
    void *volatile *q = NULL;
    if (against != UINT64_MAX) {
        char *other = map_on_node(size, against);
        if (other == MAP_FAILED) {
            fprintf(stderr, "cxlfs-memlat: --against-node %" PRIu64 ": %s\n", against, strerror(errno));
            return 1;
        }
        q = (void *volatile *)build_chain(other, order, n, stride);
    }
    /* Freed before any lap, so that its pages (on the measured node under
     * --membind) do not compete with the working set. */
    munmap(order, order_len);
    order = NULL;

    double timer_ns = timer_overhead();
    laps_in_turn(&p, q ? &q : NULL, warmup, n, NULL, NULL, 0);
    ra.laps = laps_in_turn(&p, q ? &q : NULL, laps, n, &st, &against_st, ra.min_ns);
    char extra[256] = "";
    if (q) {
        uint64_t count = ra.laps * n, lo = against_st.min, hi = against_st.max;
        snprintf(extra, sizeof extra,
                 ",\"against_node\":%" PRIu64 ",\"against_mean_ns\":%.1f,\"against_min_ns\":%" PRIu64
                 ",\"against_p50_ns\":%.1f,\"against_p99_ns\":%.1f",
                 against, (double)against_st.sum / (double)count, lo,
                 quantile(against_st.hist, 0.5, count, lo, hi),
                 quantile(against_st.hist, 0.99, count, lo, hi));
    }
    /* (p and q are volatile: the chases cannot be optimised away.) */
    return print_result(&ra, timer_ns, extra) | (p == NULL);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage();
        return 2;
    }
    if (argv[1][0] == '-')
        return flag_main(argc, argv);
    return legacy_main(argc, argv);
}
