/* cxlfs-hint: cache hints from inside a cxlfs guest (see include/cxlfs_hint.h).
 *
 *   cxlfs-hint prefetch|pin|unpin|evict FILE [--offset N] [--len N]
 *   cxlfs-hint set-policy PATH NAME
 *   cxlfs-hint set-prefetch PATH --degree N [--stride N]
 *   cxlfs-hint set-cxl-ratio PATH PERCENT
 *   cxlfs-hint stats PATH
 *   cxlfs-hint reset-stats PATH
 *
 * PATH is any file or directory on the share (e.g. /mnt). N takes k, m, g
 * suffixes (KiB, MiB, GiB). Output: key=value lines. Exit status: 0, or 1
 * with "cxlfs-hint: OP PATH: <strerror>" on stderr, 2 on a usage error.
 * Built static by qemu-configs/build-guest-image.sh.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlfs_hint.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: cxlfs-hint prefetch|pin|unpin|evict FILE [--offset N] [--len N]\n"
		"       cxlfs-hint set-policy PATH NAME\n"
		"       cxlfs-hint set-prefetch PATH --degree N [--stride N]\n"
		"       cxlfs-hint set-cxl-ratio PATH PERCENT\n"
		"       cxlfs-hint stats|reset-stats PATH\n");
	exit(2);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s || s[0] == '-')
		usage();
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (*end)
		usage();
	return v;
}

static void print_reply(const struct cxlfs_hint *h)
{
	char policy[sizeof(h->current_policy) + 1];
	memcpy(policy, h->current_policy, sizeof(h->current_policy));
	policy[sizeof(h->current_policy)] = 0;
	printf("pages=%llu\nchanged=%llu\nskipped=%llu\nhits=%llu\nmisses=%llu\ntraps=%llu\n"
	       "pinned_bytes=%llu\npin_quota_bytes=%llu\nlatency_ns=%llu\npolicy=%s\n"
	       "prefetch_degree=%u\nprefetch_stride=%u\n",
	       (unsigned long long)h->pages, (unsigned long long)h->changed,
	       (unsigned long long)h->skipped, (unsigned long long)h->hits,
	       (unsigned long long)h->misses, (unsigned long long)h->traps,
	       (unsigned long long)h->pinned_bytes, (unsigned long long)h->pin_quota_bytes,
	       (unsigned long long)h->latency_ns, policy, h->prefetch_degree, h->prefetch_stride);
}

int main(int argc, char **argv)
{
	struct cxlfs_hint h;
	const char *cmd, *path;
	int i = 3;

	if (argc < 3)
		usage();
	cmd = argv[1];
	path = argv[2];
	memset(&h, 0, sizeof(h));
	h.abi_version = CXLFS_HINT_ABI_VERSION;
	if (!strcmp(cmd, "prefetch") || !strcmp(cmd, "pin") || !strcmp(cmd, "unpin") ||
	    !strcmp(cmd, "evict")) {
		h.op = !strcmp(cmd, "prefetch") ? CXLFS_HINT_PREFETCH
		     : !strcmp(cmd, "pin")      ? CXLFS_HINT_PIN
		     : !strcmp(cmd, "unpin")    ? CXLFS_HINT_UNPIN
		                                : CXLFS_HINT_EVICT;
		for (; i < argc; i += 2) {
			if (i + 1 >= argc)
				usage();
			if (!strcmp(argv[i], "--offset"))
				h.offset = parse_size(argv[i + 1]);
			else if (!strcmp(argv[i], "--len"))
				h.length = parse_size(argv[i + 1]);
			else
				usage();
		}
	} else if (!strcmp(cmd, "set-policy")) {
		if (argc != 4 || strlen(argv[3]) >= sizeof(h.policy))
			usage();
		h.op = CXLFS_HINT_SET_POLICY;
		strcpy(h.policy, argv[3]);
	} else if (!strcmp(cmd, "set-prefetch")) {
		int have_degree = 0;
		h.op = CXLFS_HINT_SET_PREFETCH;
		for (; i < argc; i += 2) {
			if (i + 1 >= argc)
				usage();
			if (!strcmp(argv[i], "--degree")) {
				h.degree = (uint32_t)parse_size(argv[i + 1]);
				have_degree = 1;
			} else if (!strcmp(argv[i], "--stride")) {
				h.stride = (uint32_t)parse_size(argv[i + 1]);
			} else {
				usage();
			}
		}
		if (!have_degree)
			usage();
	} else if (!strcmp(cmd, "set-cxl-ratio")) {
		if (argc != 4)
			usage();
		h.op = CXLFS_HINT_SET_CXL_RATIO;
		h.percent = (uint32_t)parse_size(argv[3]);
	} else if (!strcmp(cmd, "stats") || !strcmp(cmd, "reset-stats")) {
		if (argc != 3)
			usage();
		h.op = !strcmp(cmd, "stats") ? CXLFS_HINT_QUERY_STATS : CXLFS_HINT_RESET_STATS;
	} else {
		usage();
	}

	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "cxlfs-hint: open %s: %s\n", path, strerror(errno));
		return 1;
	}
	int rc = ioctl(fd, CXLFS_IOC_HINT, &h);
	int err = errno;
	close(fd);
	if (rc < 0) {
		fprintf(stderr, "cxlfs-hint: %s %s: %s\n", cmd, path, strerror(err));
		if (err == EDQUOT)
			fprintf(stderr, "cxlfs-hint: this VM pins %llu of %llu bytes allowed\n",
				(unsigned long long)h.pinned_bytes,
				(unsigned long long)h.pin_quota_bytes);
		return 1;
	}
	print_reply(&h);
	return 0;
}
