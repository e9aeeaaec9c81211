//! Counters per VM and the Prometheus text endpoint.
//!
//! VM counters survive reconnects (they are keyed by the VM's name). The
//! endpoint is a tiny blocking HTTP server on its own thread: every request
//! gets the full text exposition, whatever its path.

use crate::abi::opcode;
use crate::pool::SharedDevice;
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

/// Counters of one VM.
#[derive(Debug)]
pub struct VmMetrics {
    /// The VM's name (label `vm`).
    pub name: String,
    requests: Vec<AtomicU64>,
    /// Bytes returned by READ.
    pub read_bytes: AtomicU64,
    /// Bytes accepted by WRITE.
    pub write_bytes: AtomicU64,
    /// Device page hits caused by this VM.
    pub device_hits: AtomicU64,
    /// Device page misses caused by this VM.
    pub device_misses: AtomicU64,
    /// Descriptor chains that could not be served (bad addresses, no room).
    pub bad_chains: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// DAX window slots mapped (`SHMEM_MAP` accepted by the front-end).
    pub dax_maps: AtomicU64,
    /// DAX window slots unmapped (`SHMEM_UNMAP` accepted by the front-end).
    pub dax_unmaps: AtomicU64,
    pacing: Mutex<Histogram<u64>>,
    pacing_long: Mutex<Histogram<u64>>,
}

/// Modeled latencies from which on pacing is held to its target (issue 3:
/// p99 < 5 µs for modeled latencies >= 20 µs).
pub const LONG_MODELED_NS: u64 = 20_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s, 3 significant digits: constant, valid bounds.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("constant histogram bounds are valid")
}

impl VmMetrics {
    /// Zeroed counters for `name`.
    pub fn new(name: &str) -> Self {
        VmMetrics {
            name: name.to_string(),
            requests: (0..=opcode::MAX).map(|_| AtomicU64::new(0)).collect(),
            read_bytes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            device_hits: AtomicU64::new(0),
            device_misses: AtomicU64::new(0),
            bad_chains: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            dax_maps: AtomicU64::new(0),
            dax_unmaps: AtomicU64::new(0),
            pacing: Mutex::new(new_histogram()),
            pacing_long: Mutex::new(new_histogram()),
        }
    }

    /// Counts one request of `op` (unknown opcodes share one slot).
    pub fn count_request(&self, op: u32) {
        let i = (op.min(opcode::MAX)) as usize;
        self.requests[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests seen with opcode `op`.
    pub fn requests(&self, op: u32) -> u64 {
        self.requests[(op.min(opcode::MAX)) as usize].load(Ordering::Relaxed)
    }

    /// Records one pacing error: actual minus modeled completion, in ns
    /// (early completions, which pacing prevents, count as 0), for a reply
    /// whose modeled latency was `modeled_ns`.
    pub fn record_pacing_error(&self, error_ns: i64, modeled_ns: u64) {
        let v = error_ns.max(1) as u64;
        let record = |m: &Mutex<Histogram<u64>>| {
            let mut h = lock(m);
            if h.record(v).is_err() {
                let high = h.high();
                let _ = h.record(high);
            }
        };
        record(&self.pacing);
        if modeled_ns >= LONG_MODELED_NS {
            record(&self.pacing_long);
        }
    }

    /// `(count, [p50, p90, p99, p999, max])` of the pacing error in ns, over
    /// all data-path replies or (`long_only`) those modeled at >= 20 µs.
    pub fn pacing_summary(&self, long_only: bool) -> (u64, [u64; 5]) {
        let h = lock(if long_only {
            &self.pacing_long
        } else {
            &self.pacing
        });
        (
            h.len(),
            [
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.9),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.max(),
            ],
        )
    }
}

type CounterFn = fn(&VmMetrics) -> u64;

/// All metrics of the daemon.
#[derive(Debug)]
pub struct Metrics {
    vms: Mutex<Vec<Arc<VmMetrics>>>,
    shared: Arc<SharedDevice>,
    dax: std::sync::OnceLock<Arc<crate::dax::DaxPlane>>,
    /// Plane trap counts at the last `reset_stats` (the plane's own
    /// counters never go back), by VM id (`None`: unknown threads).
    trap_baseline: Mutex<std::collections::BTreeMap<Option<kvm_ept::VmId>, u64>>,
}

impl Metrics {
    /// Metrics over the shared device.
    pub fn new(shared: Arc<SharedDevice>) -> Self {
        Metrics {
            vms: Mutex::new(Vec::new()),
            shared,
            dax: std::sync::OnceLock::new(),
            trap_baseline: Mutex::new(std::collections::BTreeMap::new()),
        }
    }

    /// The counters of VM `name`, if it was ever configured or seen.
    pub fn vm_if_known(&self, name: &str) -> Option<Arc<VmMetrics>> {
        lock(&self.vms).iter().find(|v| v.name == name).cloned()
    }

    /// Names of the VMs with counters.
    pub fn vm_names(&self) -> Vec<String> {
        lock(&self.vms).iter().map(|v| v.name.clone()).collect()
    }

    /// Pool traps of `vm` since start or the last reset (0 without DAX);
    /// the value of `cxlfs_pool_traps_total{vm}`.
    pub fn traps_of(&self, vm: &str) -> u64 {
        let Some(d) = self.dax.get() else { return 0 };
        let Some(id) = d.find_vm_id(vm) else { return 0 };
        let snap = d.plane_metrics().unwrap_or_default();
        self.traps_since_reset(Some(id), &snap)
    }

    /// All pool traps (VMs and unknown threads) since start or the last reset.
    pub fn traps_total(&self) -> u64 {
        let Some(d) = self.dax.get() else { return 0 };
        let snap = d.plane_metrics().unwrap_or_default();
        snap.traps_by_vm
            .keys()
            .map(|&k| self.traps_since_reset(k, &snap))
            .sum()
    }

    fn traps_since_reset(
        &self,
        vm: Option<kvm_ept::VmId>,
        snap: &kvm_ept::PlaneMetricsSnapshot,
    ) -> u64 {
        let now = snap.traps_by_vm.get(&vm).copied().unwrap_or(0);
        let base = lock(&self.trap_baseline).get(&vm).copied().unwrap_or(0);
        now.saturating_sub(base)
    }

    /// `reset_stats`: zeroes every VM's device hit and miss counters and
    /// restarts the trap counts (Prometheus sees a counter reset).
    pub fn reset_device_counters(&self) {
        for v in lock(&self.vms).iter() {
            v.device_hits.store(0, Ordering::Relaxed);
            v.device_misses.store(0, Ordering::Relaxed);
        }
        if let Some(snap) = self.dax.get().and_then(|d| d.plane_metrics()) {
            *lock(&self.trap_baseline) = snap.traps_by_vm.clone();
        }
    }

    /// Adds the residency plane's counters (DAX on). Once only.
    pub fn attach_dax(&self, dax: Arc<crate::dax::DaxPlane>) {
        let _ = self.dax.set(dax);
    }

    /// The counters of VM `name` (created on first use, kept across reconnects).
    pub fn vm(&self, name: &str) -> Arc<VmMetrics> {
        let mut vms = lock(&self.vms);
        if let Some(v) = vms.iter().find(|v| v.name == name) {
            return v.clone();
        }
        let v = Arc::new(VmMetrics::new(name));
        vms.push(v.clone());
        v
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let vms = lock(&self.vms).clone();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP cxlfs_fuse_requests_total FUSE requests received, by VM and opcode.\n# TYPE cxlfs_fuse_requests_total counter"
        );
        for v in &vms {
            for op in 0..=opcode::MAX {
                let n = v.requests(op);
                if n > 0 {
                    let _ = writeln!(
                        s,
                        "cxlfs_fuse_requests_total{{vm=\"{}\",opcode=\"{}\"}} {n}",
                        v.name,
                        opcode::name(op)
                    );
                }
            }
        }
        let per_vm: [(&str, &str, CounterFn); 8] = [
            (
                "cxlfs_read_bytes_total",
                "Bytes returned by FUSE READ.",
                |v| v.read_bytes.load(Ordering::Relaxed),
            ),
            (
                "cxlfs_write_bytes_total",
                "Bytes written by FUSE WRITE.",
                |v| v.write_bytes.load(Ordering::Relaxed),
            ),
            (
                "cxlfs_device_hits_total",
                "Device DRAM-cache page hits caused by the VM.",
                |v| v.device_hits.load(Ordering::Relaxed),
            ),
            (
                "cxlfs_device_misses_total",
                "Device DRAM-cache page misses caused by the VM.",
                |v| v.device_misses.load(Ordering::Relaxed),
            ),
            (
                "cxlfs_bad_descriptor_chains_total",
                "Descriptor chains dropped as malformed.",
                |v| v.bad_chains.load(Ordering::Relaxed),
            ),
            (
                "cxlfs_vm_connections_total",
                "vhost-user connections accepted.",
                |v| v.connections.load(Ordering::Relaxed),
            ),
            (
                "cxlfs_dax_maps_total",
                "DAX window slots mapped (VHOST_USER_BACKEND_SHMEM_MAP).",
                |v| v.dax_maps.load(Ordering::Relaxed),
            ),
            (
                "cxlfs_dax_unmaps_total",
                "DAX window slots unmapped (VHOST_USER_BACKEND_SHMEM_UNMAP).",
                |v| v.dax_unmaps.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, get) in per_vm {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
            for v in &vms {
                let _ = writeln!(s, "{name}{{vm=\"{}\"}} {}", v.name, get(v));
            }
        }
        let _ = writeln!(
            s,
            "# HELP cxlfs_pacing_error_seconds Actual minus modeled completion of data-path replies.\n# TYPE cxlfs_pacing_error_seconds summary"
        );
        for v in &vms {
            for (long, class) in [(false, "all"), (true, "ge20us")] {
                let (count, q) = v.pacing_summary(long);
                for (label, val) in ["0.5", "0.9", "0.99", "0.999", "1"].iter().zip(q) {
                    let _ = writeln!(
                        s,
                        "cxlfs_pacing_error_seconds{{vm=\"{}\",modeled=\"{class}\",quantile=\"{label}\"}} {:.9}",
                        v.name,
                        val as f64 / 1e9
                    );
                }
                let _ = writeln!(
                    s,
                    "cxlfs_pacing_error_seconds_count{{vm=\"{}\",modeled=\"{class}\"}} {count}",
                    v.name
                );
            }
        }
        let st = self.shared.stats();
        let pool = self.shared.pool();
        let global = [
            ("cxlfs_nand_reads_total", "counter", st.nand.reads()),
            ("cxlfs_nand_programs_total", "counter", st.nand.programs()),
            ("cxlfs_device_hits_all_total", "counter", st.hits),
            ("cxlfs_device_misses_all_total", "counter", st.misses),
            ("cxlfs_device_evictions_total", "counter", st.evictions),
            ("cxlfs_device_resident_pages", "gauge", st.resident_pages),
            ("cxlfs_device_dirty_pages", "gauge", st.dirty_pages),
            (
                "cxlfs_pool_allocated_bytes",
                "gauge",
                pool.allocated_extents() * crate::pool::EXTENT_SIZE,
            ),
            (
                "cxlfs_pool_aliased_extents_total",
                "counter",
                pool.aliased_chunks(),
            ),
        ];
        drop(pool);
        for (name, typ, v) in global {
            let _ = writeln!(s, "# TYPE {name} {typ}\n{name} {v}");
        }
        self.render_pool(&vms, &mut s);
        s
    }
}

impl Metrics {
    /// The residency plane's families (zeros while DAX is off).
    fn render_pool(&self, vms: &[Arc<VmMetrics>], s: &mut String) {
        let dax = self.dax.get();
        let snap = dax.and_then(|d| d.plane_metrics()).unwrap_or_default();
        let _ = writeln!(
            s,
            "# HELP cxlfs_pool_traps_total Pool page misses that trapped into the daemon, by VM (unknown: not a registered VMM).\n# TYPE cxlfs_pool_traps_total counter"
        );
        for v in vms {
            let n = dax
                .and_then(|d| d.find_vm_id(&v.name))
                .map_or(0, |id| self.traps_since_reset(Some(id), &snap));
            let _ = writeln!(s, "cxlfs_pool_traps_total{{vm=\"{}\"}} {n}", v.name);
        }
        let unknown = self.traps_since_reset(None, &snap);
        let _ = writeln!(s, "cxlfs_pool_traps_total{{vm=\"unknown\"}} {unknown}");
        let _ = writeln!(
            s,
            "# HELP cxlfs_pool_resident_bytes Pool bytes resident in the residency plane (upper bound).\n# TYPE cxlfs_pool_resident_bytes gauge\ncxlfs_pool_resident_bytes {}",
            snap.resident_bytes
        );
        let _ = writeln!(
            s,
            "# HELP cxlfs_pool_evictions_total Pool ranges evicted from the residency plane.\n# TYPE cxlfs_pool_evictions_total counter\ncxlfs_pool_evictions_total {}",
            snap.invalidations
        );
    }
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartMetricsError {
    /// Not a loopback address and `--metrics-allow-remote` not given.
    #[error("metrics address {0} is not loopback; pass --metrics-allow-remote to expose it")]
    NotLoopback(SocketAddr),
    /// bind() failed.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Starts the HTTP endpoint; returns the bound address.
pub fn serve(
    addr: SocketAddr,
    allow_remote: bool,
    metrics: Arc<Metrics>,
) -> Result<SocketAddr, StartMetricsError> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(StartMetricsError::NotLoopback(addr));
    }
    let listener =
        TcpListener::bind(addr).map_err(|source| StartMetricsError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartMetricsError::Bind { addr, source })?;
    thread::Builder::new()
        .name("cxlfsd-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        if let Err(e) = answer(s, &metrics) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "metrics accept failed"),
                }
            }
        })
        .map_err(|source| StartMetricsError::Bind { addr, source })?;
    Ok(bound)
}

fn answer(stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    // Read the request head (and ignore it).
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let body = metrics.render();
    let mut w = stream;
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlfs_device_model::{Device, DeviceConfig};

    #[test]
    fn renders_required_families() {
        let shared = Arc::new(SharedDevice::new(
            Device::new(DeviceConfig::default()).unwrap(),
        ));
        let m = Metrics::new(shared);
        let v = m.vm("vm0");
        v.count_request(opcode::READ);
        v.count_request(999);
        v.record_pacing_error(1500, 30_000);
        let text = m.render();
        for needle in [
            "cxlfs_fuse_requests_total{vm=\"vm0\",opcode=\"read\"} 1",
            "cxlfs_fuse_requests_total{vm=\"vm0\",opcode=\"unknown\"} 1",
            "cxlfs_read_bytes_total{vm=\"vm0\"} 0",
            "cxlfs_write_bytes_total{vm=\"vm0\"}",
            "cxlfs_device_hits_total{vm=\"vm0\"}",
            "cxlfs_device_misses_total{vm=\"vm0\"}",
            "cxlfs_nand_reads_total 0",
            "cxlfs_nand_programs_total 0",
            "cxlfs_pacing_error_seconds{vm=\"vm0\",modeled=\"ge20us\",quantile=\"0.99\"}",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        assert!(Arc::ptr_eq(&m.vm("vm0"), &v));
    }

    #[test]
    fn refuses_remote_without_flag() {
        let shared = Arc::new(SharedDevice::new(
            Device::new(DeviceConfig::default()).unwrap(),
        ));
        let m = Arc::new(Metrics::new(shared));
        let addr: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert!(matches!(
            serve(addr, false, m.clone()),
            Err(StartMetricsError::NotLoopback(_))
        ));
        let bound = serve("127.0.0.1:0".parse().unwrap(), false, m).unwrap();
        let mut s = TcpStream::connect(bound).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut s, &mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"));
        assert!(out.contains("cxlfs_nand_reads_total"));
    }
}
