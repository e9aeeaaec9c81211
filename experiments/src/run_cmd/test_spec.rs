//! The experiment spec the unit tests of `cxlfs run` expand: two VMs, two
//! files, two phases, DAX on, swept over `daemon.cxl_ratio`.

/// Two runs (`cxl_ratio` 0 and 100) of two guests and two phases.
pub(super) const SPEC: &str = r#"
name = "t"
[daemon]
preset = "femu"
device.cache.size_bytes = "8MiB"
dax = true
[vms]
count = 2
[[files]]
path = "f{i}.bin"
size = "1MiB"
count = 2
[[phases]]
name = "a"
fio.rw = "read"
[[phases]]
name = "b"
[sweep]
"daemon.cxl_ratio" = [0, 100]
"#;
