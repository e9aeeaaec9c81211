# cxlfs — the two set-up commands are `make demo` (the main job) and `make test`.
CARGO ?= cargo
CXLFS := target/release/cxlfs
export CARGO_TERM_COLOR ?= never

.PHONY: demo test bench lint unit e2e image qemu toolchain build clean

## The main job. Until the daemon lands (issue 3) it is a trace-replay study:
## every eviction policy on a zipf(0.99) working set twice the cache, then the
## prefetch degree on a strided scan (Cylon's two tables), on the cylon preset.
demo: build
	@echo "== eviction policies: zipf(0.99), working set 2x cache (Cylon preset, 64 MiB cache) =="
	$(CXLFS) replay --preset cylon --set cache.size_bytes=64MiB \
	  --workload zipf:0.99 --wss 128MiB --accesses 2000000 --access-size 64 --warmup 500000 \
	  --sweep cache.policy=fifo,lifo,lru,clock,s3fifo,2q,lfru \
	  --sweep cache.hits_visible=true,false
	@echo
	@echo "== prefetch degree: stride-4KiB scan, working set 2x cache (Cylon preset, s3fifo) =="
	$(CXLFS) replay --preset cylon --set cache.size_bytes=64MiB --set cache.policy=s3fifo \
	  --workload stride:4KiB --wss 128MiB --passes 2 --access-size 64 \
	  --sweep prefetch.degree=0,1,2,4,8

## Every test: formatting, clippy with -D warnings, unit, property, golden and CLI tests,
## then the end-to-end tests with real QEMU guests (tests/, see tests/README.md).
test: toolchain lint unit e2e

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) test --workspace --locked --exclude cxlfs-e2e

## Real guests on cxlfsd: builds the guest image (cached; installs QEMU etc. with
## apt-get when missing) and cxlfsd in release mode, then runs the guests one
## test at a time (2 cores, TCG).
e2e: toolchain image qemu
	$(CARGO) build --release --locked -p cxlfsd
	$(CARGO) test --locked -p cxlfs-e2e -- --test-threads=1

## The test-guest image (kernel + initramfs with fio, busybox), cached by content hash.
image:
	qemu-configs/build-guest-image.sh

## QEMU 7.2 with a virtio-fs DAX window (Debian source + our patch), cached by
## patch hash; ~5 min cold on 2 cores. The DAX e2e tests and experiments use it.
qemu:
	qemu-configs/build-qemu.sh

## Replay throughput for every policy, uniform and zipf(0.99), NAND model off and on;
## then cxlfsd (zero device latency) against stock virtiofsd with real guests (fio
## 1 MiB sequential and 4 KiB random reads, one run, ratio printed) and cxlfsd's
## pacing error on NAND misses (daemon/bench/virtiofsd-comparison.sh, ~6 min here);
## then the residency plane without a VM (kvm-ept/benches/pool_latency.rs, ~20 s):
## hit latency through the pool vs a memfd page, miss-path floor, achieved vs
## modeled miss latency, NOTIFY_STORE / NOTIFY_INVAL_INODE costs.
bench: toolchain
	$(CARGO) bench --locked -p cxlfs-device-model --bench replay_throughput
	daemon/bench/virtiofsd-comparison.sh
	$(CARGO) bench --locked -p cxlfs-kvm-ept --bench pool_latency

build: toolchain
	$(CARGO) build --release --locked --bin cxlfs

toolchain:
	@.ci/ensure-toolchain.sh

clean:
	$(CARGO) clean
