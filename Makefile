# cxlfs — the two set-up commands are `make demo` (the main job) and `make test`.
CARGO ?= cargo
# Honours CARGO_TARGET_DIR, like cargo itself.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
CXLFS := $(TARGET_DIR)/release/cxlfs
export CARGO_TERM_COLOR ?= never

.PHONY: demo test bench fuzz lint unit e2e soak image qemu slurm toolchain fonts build clean fuse-uring

## The main job: the virtiofs-on-CXL ratio sweep, small (experiments/demo.toml):
## cxlfsd with a DAX window, two guests sharing four files, fio zipf random reads,
## 0 / 50 / 100 % of the file pages on the CXL-SSD tier, first and second touch.
## Builds what it needs (cxlfs + cxlfsd release, the guest image, the patched QEMU
## for DAX: ~5 min cold, cached after), then prints the results table; the
## results directory (CSV, JSON, plots, logs, provenance) is $(DEMO_OUT).
DEMO_OUT ?= results/demo
demo: build fonts image qemu fuse-uring
	$(CARGO) build --release --locked -p cxlfsd
	$(CXLFS) run experiments/demo.toml --out $(DEMO_OUT) --force

## Every test: formatting, clippy with -D warnings, unit, property, golden and CLI tests,
## the fuzz targets' seeds and regressions replayed on stable (fuzz/README.md),
## then the end-to-end tests with real QEMU guests (tests/, see tests/README.md),
## one test binary at a time; ends with a table of what each stage, each e2e
## binary and the slowest e2e tests took (tests/timed-suite.sh).
test:
	@tests/timed-suite.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## The fuzz harness's stable tests build into the workspace's target dir: its
## crates and dependencies are the workspace's, compiled once (the nightly
## `make fuzz` keeps fuzz/target, with its sanitizer flags).
unit: fonts
	$(CARGO) test --workspace --locked --exclude cxlfs-e2e
	cd fuzz && CARGO_TARGET_DIR=$(abspath $(TARGET_DIR)) $(CARGO) test --locked -p cxlfs-fuzz-harness

## Real guests on cxlfsd: builds the guest image (cached; installs QEMU etc. with
## apt-get when missing) and cxlfsd in release mode, starts the one-node Slurm
## cluster (`cxlfs run --slurm`'s test), then runs the guests one test at a time
## (2 cores, TCG).
e2e: toolchain image qemu fonts slurm
	$(CARGO) build --release --locked -p cxlfsd
	$(CARGO) test --locked -p cxlfs-e2e -- --test-threads=1

## The soak (tests/tests/soak.rs, tests/README.md): SOAK_VMS guests (default 4) on
## one cxlfsd for SOAK_MINUTES (default 60 here; `make test` runs the 2-minute form),
## every fault on a schedule; prints its table (also into SOAK_REPORT) and fails on
## any loss, leak, stuck guest or guest kernel problem.
SOAK_MINUTES ?= 60
SOAK_VMS ?= 4
SOAK_REPORT ?= results/soak.txt
soak: toolchain image qemu fonts
	$(CARGO) build --release --locked -p cxlfsd
	mkdir -p $(dir $(SOAK_REPORT))
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_VMS=$(SOAK_VMS) SOAK_REPORT=$(abspath $(SOAK_REPORT)) \
		$(CARGO) test --locked -p cxlfs-e2e --test soak -- --nocapture

## FUSE over io_uring for the residency plane (Linux >= 6.14, kvm-ept/README.md):
## turns on the fuse module's switch where it exists and we may (root). It only
## lets a FUSE server that asks for the ring use it. Elsewhere the plane stays on
## /dev/fuse, and the io_uring tests say why (and fail under CI=true).
fuse-uring:
	@p=/sys/module/fuse/parameters/enable_uring; \
	if [ -e $$p ] && [ "$$(cat $$p)" != Y ]; then \
		if (echo Y > $$p) 2>/dev/null; then echo "fuse: enable_uring=Y"; \
		else echo "fuse: cannot set $$p (not root?); the pool plane stays on /dev/fuse"; fi; \
	fi

## A one-node Slurm cluster on this machine (slurm-wlm and munge with apt-get when
## missing; munged, slurmctld, slurmd started; idempotent): tests/README.md.
slurm:
	tests/slurm/start-cluster.sh

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
## then the residency plane without a VM (kvm-ept/benches/pool_latency.rs, ~1 min):
## hit latency through the pool vs a memfd page, miss-path floor, achieved vs
## modeled miss latency with latency compensation off and auto side by side,
## NOTIFY_STORE / NOTIFY_INVAL_INODE costs; then what
## metrics cost (daemon/benches/metrics_overhead.rs, ~1 min): 4 KiB READ
## throughput and daemon CPU per request, metrics on vs off, ratios printed.
bench: toolchain fuse-uring
	$(CARGO) bench --locked -p cxlfs-device-model --bench replay_throughput
	daemon/bench/virtiofsd-comparison.sh
	$(CARGO) bench --locked -p cxlfs-residency --bench pool_latency
	$(CARGO) bench --locked -p cxlfs-residency --bench host_wake
	$(CARGO) bench --locked -p cxlfsd --bench metrics_overhead
	$(CARGO) bench --locked -p cxlfsd --bench device_threads
	daemon/bench/memory-mode.sh

## The cargo-fuzz targets (fuzz/README.md), each for FUZZ_SECONDS (default 60) in
## turn, from the committed seeds (fuzz/corpus); fails on the first crash, hang
## (FUZZ_TIMEOUT s per input) or leak. Nightly toolchain; installs cargo-fuzz with
## `cargo install --locked` when missing. First replays every seed and saved crash
## on stable. Its own workspace and target dir (fuzz/target), whatever CARGO_TARGET_DIR.
FUZZ_SECONDS ?= 60
FUZZ_TIMEOUT ?= 10
FUZZ_TARGETS ?= fuse_request control_line hint_ioctl chain_walk
fuzz:
	@cargo +nightly fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && env -u CARGO_TARGET_DIR $(CARGO) test --locked -p cxlfs-fuzz-harness
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		mkdir -p target/corpus/$$t && \
		env -u CARGO_TARGET_DIR cargo +nightly fuzz run $$t target/corpus/$$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -print_final_stats=1 \
			|| exit 1; \
	done

build: toolchain
	$(CARGO) build --release --locked -p cxlfs --bin cxlfs

toolchain:
	@.ci/ensure-toolchain.sh

## The TrueType font plots are drawn with (fonts-dejavu-core; apt-get when missing).
fonts:
	@.ci/ensure-plot-font.sh

clean:
	$(CARGO) clean
