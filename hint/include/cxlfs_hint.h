/* cxlfs_hint.h — cache hints from applications inside a cxlfs guest.
 *
 * An application opens a file on the virtio-fs share (or the share's
 * directory, for the device-wide commands) and issues CXLFS_IOC_HINT on it.
 * The guest kernel forwards the ioctl unchanged to cxlfsd as FUSE_IOCTL
 * (a "restricted" ioctl: the size and direction encoded in the command tell
 * the kernel what to copy), so no guest kernel change is needed.
 *
 * ioctl() returns 0 on success, or -1 with errno set:
 *   EINVAL      malformed request (bad abi_version, op, flags, range, policy)
 *   EPERM       a device-wide command and the daemon does not allow guests
 *               to change the device (cxlfsd --guest-device-control)
 *   EDQUOT      the pin would take this VM over its pin quota
 *   ENOSPC      every way of a cache set is already pinned
 *   EOPNOTSUPP  set_cxl_ratio: this daemon has no DRAM/CXL placement
 *   EISDIR      a range command on a directory
 *   ENOTTY      not a cxlfs share (or an old daemon)
 * The "out" fields are filled in on success and on errors from the daemon.
 *
 * Keep in sync with hint/src/lib.rs (the Rust crate `cxlfs-hint`, also used
 * by cxlfsd itself to decode the request).
 */
#ifndef CXLFS_HINT_H
#define CXLFS_HINT_H

#include <stdint.h>
#include <sys/ioctl.h>

#define CXLFS_HINT_ABI_VERSION 1u
#define CXLFS_HINT_IOC_MAGIC 0xCF

enum cxlfs_hint_op {
	CXLFS_HINT_PREFETCH = 1,      /* bring [offset, offset+length) into the device cache */
	CXLFS_HINT_PIN = 2,           /* ... and keep it there (counts against the VM's quota) */
	CXLFS_HINT_UNPIN = 3,         /* release this VM's pins on the range */
	CXLFS_HINT_EVICT = 4,         /* drop the range from the device cache (pins stay) */
	CXLFS_HINT_SET_POLICY = 5,    /* policy[]: fifo lifo lru clock s3fifo 2q lfru */
	CXLFS_HINT_SET_PREFETCH = 6,  /* degree, stride (pages; 0 = keep the current one) */
	CXLFS_HINT_SET_CXL_RATIO = 7, /* percent */
	CXLFS_HINT_QUERY_STATS = 8,   /* only fills the "out" fields */
	CXLFS_HINT_RESET_STATS = 9,
};

struct cxlfs_hint {
	/* in */
	uint32_t abi_version;      /* CXLFS_HINT_ABI_VERSION */
	uint32_t op;               /* enum cxlfs_hint_op */
	uint64_t offset;           /* range commands: file offset in bytes */
	uint64_t length;           /* range commands: bytes; 0 = to the end of the file */
	uint32_t degree;           /* SET_PREFETCH: pages prefetched after a miss (0 = off) */
	uint32_t stride;           /* SET_PREFETCH: stride in pages (0 = keep) */
	uint32_t percent;          /* SET_CXL_RATIO */
	uint32_t flags;            /* must be 0 */
	char policy[16];           /* SET_POLICY: NUL-terminated name */
	/* out */
	uint64_t pages;            /* pages in the range */
	uint64_t changed;          /* pages filled / pinned / unpinned / evicted */
	uint64_t skipped;          /* pages left alone (e.g. pinned pages an evict skipped) */
	uint64_t hits;             /* this VM's device page hits */
	uint64_t misses;           /* this VM's device page misses */
	uint64_t traps;            /* this VM's DAX pool traps */
	uint64_t pinned_bytes;     /* bytes this VM holds pinned */
	uint64_t pin_quota_bytes;  /* this VM's pin quota */
	uint64_t latency_ns;       /* modeled time the command took on the device */
	char current_policy[16];   /* the eviction policy in force */
	uint32_t prefetch_degree;  /* the prefetcher in force */
	uint32_t prefetch_stride;
	uint64_t reserved[4];
};

#define CXLFS_IOC_HINT _IOWR(CXLFS_HINT_IOC_MAGIC, 0x01, struct cxlfs_hint)

#ifdef __cplusplus
static_assert(sizeof(struct cxlfs_hint) == 184, "cxlfs_hint ABI size");
#else
_Static_assert(sizeof(struct cxlfs_hint) == 184, "cxlfs_hint ABI size");
#endif

#endif /* CXLFS_HINT_H */
