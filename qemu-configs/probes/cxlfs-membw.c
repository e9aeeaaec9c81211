/*
 * cxlfs-membw: STREAM-like sequential bandwidth of a working set, for
 * memory mode (run it under numactl to place the set on a node):
 *
 *   numactl --membind=1 cxlfs-membw --size 64m --threads 2
 *
 * read: sums the set as u64 loads; write: stores u64s over it; copy:
 * memcpy from its first half to its second half (counted as bytes read +
 * bytes written, as STREAM counts). N threads, each on its own contiguous
 * chunk, a barrier around every pass; a pass takes from the release of the
 * start barrier to the last thread's arrival at the end barrier. Prints one
 * JSON line (MB = 10^6 bytes; the op's figure is the mean of its measured
 * passes' MB/s). Built static into the guest image
 * (qemu-configs/build-guest-image.sh).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cxlfs-probe.h"

enum op { OP_READ, OP_WRITE, OP_COPY, NOPS };
static const char *const op_name[NOPS] = {"read", "write", "copy"};

#define MAX_THREADS 1024
#define MAX_PASSES 10000

static void usage(void)
{
    fprintf(stderr,
        "usage: cxlfs-membw --size BYTES[k|m|g] [--threads N (online CPUs)]\n"
        "                   [--op read|write|copy|all (all)] [--passes N (3)]\n"
        "                   [--warmup-passes N (1)]\n"
        "\n"
        "Sequential read (sum of u64 loads), write (u64 stores) and copy (memcpy from\n"
        "the first half of the set to the second; bytes read + written) over a\n"
        "working set of BYTES, N threads on contiguous chunks, a barrier per pass.\n"
        "Prints one JSON line; MB = 10^6 bytes, the mean of the measured passes.\n");
}

struct shared {
    char *mem;
    uint64_t size;
    unsigned threads;
    unsigned passes_per_op; /* warm-up + measured */
    int run[NOPS];
    pthread_barrier_t start, end;
};

struct worker {
    pthread_t tid;
    unsigned idx;
    struct shared *sh;
    uint64_t sink;
};

/* [off, off+len) of thread i's share of n bytes, in whole u64s. */
static void chunk(uint64_t n, unsigned threads, unsigned i, uint64_t *off, uint64_t *len)
{
    uint64_t words = n / 8, per = words / threads, extra = words % threads;
    uint64_t first = i * per + (i < extra ? i : extra);
    *off = first * 8;
    *len = (per + (i < extra ? 1 : 0)) * 8;
}

static uint64_t do_read(const uint64_t *p, uint64_t words)
{
    uint64_t a = 0, b = 0, c = 0, d = 0, i = 0;
    for (; i + 4 <= words; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    for (; i < words; i++)
        a += p[i];
    return a + b + c + d;
}

static void do_write(uint64_t *p, uint64_t words, uint64_t v)
{
    for (uint64_t i = 0; i < words; i++)
        p[i] = v;
}

static void run_op(struct worker *w, enum op op, unsigned pass)
{
    struct shared *sh = w->sh;
    uint64_t off, len;
    if (op == OP_COPY) {
        uint64_t half = sh->size / 2;
        chunk(half, sh->threads, w->idx, &off, &len);
        memcpy(sh->mem + half + off, sh->mem + off, len);
        return;
    }
    chunk(sh->size, sh->threads, w->idx, &off, &len);
    if (op == OP_READ)
        w->sink += do_read((const uint64_t *)(sh->mem + off), len / 8);
    else
        do_write((uint64_t *)(sh->mem + off), len / 8, pass + 1);
}

/* Every thread (the main one too, as worker 0) runs the same sequence of
 * barriers: per op run, per pass, start then end. */
static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct shared *sh = w->sh;
    for (int op = 0; op < NOPS; op++) {
        if (!sh->run[op])
            continue;
        for (unsigned k = 0; k < sh->passes_per_op; k++) {
            pthread_barrier_wait(&sh->start);
            run_op(w, (enum op)op, k);
            pthread_barrier_wait(&sh->end);
        }
    }
    return NULL;
}

static double mb_s[NOPS][MAX_PASSES];
static volatile uint64_t sink_out;

int main(int argc, char **argv)
{
    uint64_t size = 0, threads = 0, passes = 3, warmup = 1;
    int run[NOPS] = {1, 1, 1};
    if (argc < 2) {
        usage();
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "cxlfs-membw: %s needs a value\n", a);
            usage();
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--size"))
            bad = parse_size(v, &size);
        else if (!strcmp(a, "--threads"))
            bad = parse_u64(v, &threads);
        else if (!strcmp(a, "--passes"))
            bad = parse_u64(v, &passes);
        else if (!strcmp(a, "--warmup-passes"))
            bad = parse_u64(v, &warmup);
        else if (!strcmp(a, "--op")) {
            int o = -1;
            for (int k = 0; k < NOPS; k++)
                if (!strcmp(v, op_name[k]))
                    o = k;
            if (o >= 0) {
                memset(run, 0, sizeof run);
                run[o] = 1;
            } else if (!strcmp(v, "all")) {
                run[OP_READ] = run[OP_WRITE] = run[OP_COPY] = 1;
            } else {
                bad = 1;
            }
        } else {
            fprintf(stderr, "cxlfs-membw: unknown argument %s\n", a);
            usage();
            return 2;
        }
        if (bad) {
            fprintf(stderr, "cxlfs-membw: bad value for %s: %s\n", a, v);
            usage();
            return 2;
        }
    }
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint64_t)n : 1;
    }
    if (threads > MAX_THREADS || passes < 1 || passes > MAX_PASSES
        || warmup > MAX_PASSES || size < 16 * threads) {
        fprintf(stderr, "cxlfs-membw: need --size >= 16 bytes per thread, 1 <= --threads <= %d, "
                        "1 <= --passes <= %d, --warmup-passes <= %d\n",
                MAX_THREADS, MAX_PASSES, MAX_PASSES);
        usage();
        return 2;
    }
    static struct shared sh;
    sh.size = size;
    sh.threads = (unsigned)threads;
    sh.passes_per_op = (unsigned)(warmup + passes);
    memcpy(sh.run, run, sizeof run);
    sh.mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct worker *ws = calloc(threads, sizeof *ws);
    if (sh.mem == MAP_FAILED || !ws) {
        fprintf(stderr, "cxlfs-membw: out of memory\n");
        return 1;
    }
    /* Populate every page before any pass, so that no pass pays page faults. */
    memset(sh.mem, 1, size);
    if (pthread_barrier_init(&sh.start, NULL, (unsigned)threads)
        || pthread_barrier_init(&sh.end, NULL, (unsigned)threads)) {
        fprintf(stderr, "cxlfs-membw: pthread_barrier_init failed\n");
        return 1;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    /* Small stacks: every page touched may be on the measured node. */
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (unsigned i = 0; i < threads; i++) {
        ws[i].idx = i;
        ws[i].sh = &sh;
    }
    for (unsigned i = 1; i < threads; i++) {
        int rc = pthread_create(&ws[i].tid, &attr, worker_main, &ws[i]);
        if (rc) {
            fprintf(stderr, "cxlfs-membw: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    /* The main thread is worker 0 and keeps the clock. */
    for (int op = 0; op < NOPS; op++) {
        if (!run[op])
            continue;
        uint64_t bytes = op == OP_COPY ? (size / 2 / 8 * 8) * 2 : size / 8 * 8;
        for (unsigned k = 0; k < sh.passes_per_op; k++) {
            pthread_barrier_wait(&sh.start);
            uint64_t t0 = now_ns();
            run_op(&ws[0], (enum op)op, k);
            pthread_barrier_wait(&sh.end);
            uint64_t dt = now_ns() - t0;
            if (k >= warmup)
                mb_s[op][k - warmup] = (double)bytes / (dt ? (double)dt : 1.0) * 1e3;
        }
    }
    uint64_t sink = ws[0].sink;
    for (unsigned i = 1; i < threads; i++) {
        pthread_join(ws[i].tid, NULL);
        sink += ws[i].sink;
    }
    printf("{\"probe\":\"membw\",\"size_bytes\":%" PRIu64 ",\"threads\":%" PRIu64
           ",\"passes\":%" PRIu64,
           size, threads, passes);
    for (int op = 0; op < NOPS; op++) {
        if (!run[op])
            continue;
        double s = 0;
        for (uint64_t k = 0; k < passes; k++)
            s += mb_s[op][k];
        printf(",\"%s_mb_s\":%.1f", op_name[op], s / (double)passes);
    }
    printf(",\"pass_mb_s\":{");
    int first = 1;
    for (int op = 0; op < NOPS; op++) {
        if (!run[op])
            continue;
        printf("%s\"%s\":[", first ? "" : ",", op_name[op]);
        for (uint64_t k = 0; k < passes; k++)
            printf("%s%.1f", k ? "," : "", mb_s[op][k]);
        printf("]");
        first = 0;
    }
    printf("}}\n");
    /* (stored where the compiler must keep it: the read loads are live) */
    sink_out = sink;
    return fflush(stdout) == 0 ? 0 : 1;
}
