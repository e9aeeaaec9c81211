/*
 * cxlfs-memlat: dependent loads over a working set, one load per 4 KiB page
 * (or per cache line), in a random cyclic order, so that every load waits
 * for the one before it. Run it under numactl to place the working set on a
 * node:  numactl --membind=1 cxlfs-memlat SIZE_MIB [STRIDE] [PASSES]
 *
 * Prints one JSON line: the working set, the mean ns per load of the timed
 * passes (all loads timed together: hits), and the per-load latency
 * percentiles of the first touch of every page (each load timed alone:
 * misses on a set larger than the device cache). Built static into the
 * guest image (qemu-configs/build-guest-image.sh).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: cxlfs-memlat SIZE_MIB [STRIDE_BYTES=4096] [PASSES=3]\n");
        return 2;
    }
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
