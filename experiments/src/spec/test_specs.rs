//! The specs the unit tests of `spec` load: a fio spec swept over two keys
//! with repeats, and a memory-mode spec with a command phase.

/// Two repeats of two fio phases over files in the share, swept over
/// `daemon.cxl_ratio` (2 values) and `vms.count` (3 values).
pub(super) const SPEC: &str = r#"
name = "t"
repeats = 2
[daemon]
preset = "femu"
device.cache.size_bytes = "16MiB"
device.nand.read_ns = "40us"
cxl_ratio = 50
[vms]
count = 2
[[files]]
path = "data/f{i}.bin"
size = "32MiB"
count = 3
[fio]
rw = "randread"
size = "32m"
runtime = "10s"
time_based = 1
[[phases]]
name = "first"
[[phases]]
name = "second"
fio.bs = "64k"
[sweep]
"daemon.cxl_ratio" = [0, 100]
"vms.count" = [1, 2, 3]
"#;

/// Memory mode: a command phase with a NUMA ratio, outputs, a replay
/// check, a swept variable and `[quick] set` keys.
pub(super) const MEMORY: &str = r#"
name = "m"
[daemon]
device.cache.size_bytes = "32MiB"
cxl_memory = "256MiB"
[vars]
x = 1.0
[[phases]]
name = "cxl"
command = "probe --size {int:x*cache_bytes}"
numa = { ratio = "3:1" }
outputs.bw = { json = "read_mb_s" }
outputs.lat = { json = "histogram", histogram = true }
replay_check = { sequence = "seq.bin", histogram = "lat", hit_below_ns = 5000 }
[sweep]
"vars.x" = [0.5, 2.0]
[quick]
size_divisor = 1
set = { "daemon.device.cache.size_bytes" = "8MiB", "sweep.vars.x" = [1.0] }
"#;

/// Two guests over the DAX window, a fio phase and a command phase,
/// their fio I/O replayed.
pub(crate) const REPLAYED: &str = r#"
name = "t"
replay_iolog = true
[daemon]
dax = true
[vms]
count = 2
[fio]
filename = "f.bin"
rw = "randread"
[[phases]]
name = "a"
[[phases]]
name = "b"
command = "true"
"#;
