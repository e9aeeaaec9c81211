//! The VMs that use the plane: their [`VmId`]s and counters, their VMM
//! processes (whose traps count for them) and their sessions' windows.

use super::{DaxPlane, DaxSession};
use crate::ids::{FileKey, VmId};
use crate::metrics::VmMetrics;
use crate::sync::lock;
use std::sync::{Arc, Mutex};

/// The per-VM counters the plane's traps are charged to, indexed by [`VmId`].
pub(super) type VmTable = Mutex<Vec<Arc<VmMetrics>>>;

impl DaxPlane {
    /// The [`VmId`] of VM `metrics.name` (assigned on first use).
    pub fn vm_id(&self, metrics: &Arc<VmMetrics>) -> VmId {
        let mut vms = lock(&self.state.vms);
        if let Some(i) = vms.iter().position(|v| v.name == metrics.name) {
            return i as VmId;
        }
        vms.push(metrics.clone());
        (vms.len() - 1) as VmId
    }

    /// The [`VmId`] of VM `name`, if it has one.
    pub fn find_vm_id(&self, name: &str) -> Option<VmId> {
        lock(&self.state.vms)
            .iter()
            .position(|v| v.name == name)
            .map(|i| i as VmId)
    }

    /// The names of the VMs that used the plane so far.
    pub fn vm_names(&self) -> Vec<String> {
        lock(&self.state.vms)
            .iter()
            .map(|v| v.name.clone())
            .collect()
    }

    /// The name of VM `id`.
    pub fn vm_name(&self, id: VmId) -> Option<String> {
        lock(&self.state.vms)
            .get(id as usize)
            .map(|v| v.name.clone())
    }

    /// A VM's VMM process connected: its threads' traps count for it.
    pub fn register_vmm(&self, vm: VmId, pid: u32) {
        {
            let mut pids = lock(&self.state.vmm_pids);
            pids.retain(|(_, v)| *v != vm);
            pids.push((pid, vm));
        }
        if let Some(p) = self.plane() {
            p.register_vmm(vm, pid);
        }
    }

    /// A VM's VMM disconnected.
    pub fn unregister_vmm(&self, vm: VmId) {
        lock(&self.state.vmm_pids).retain(|(_, v)| *v != vm);
        if let Some(p) = self.plane() {
            p.unregister_vmm(vm);
        }
    }

    /// Tracks `session`'s window for [`DaxPlane::shared_pages`].
    pub fn register_session(&self, session: &Arc<DaxSession>) {
        let mut s = lock(&self.sessions);
        s.retain(|w| w.strong_count() > 0);
        s.push(Arc::downgrade(session));
    }

    /// The VM sessions still alive.
    pub(super) fn live_sessions(&self) -> Vec<Arc<DaxSession>> {
        lock(&self.sessions)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect()
    }

    /// The pool (device) pages behind pages `window_pages` of VM `name`'s
    /// DAX window, through its slot tables now, appended to `out`; a
    /// window page no slot maps is left out.
    pub fn window_pool_pages(&self, name: &str, window_pages: &[u64], out: &mut Vec<u64>) {
        let Some(vm) = self.find_vm_id(name) else {
            return;
        };
        for s in self.live_sessions().iter().filter(|s| s.vm == vm) {
            s.pool_pages(window_pages, out);
        }
    }

    /// Bytes VM `vm`'s DAX window maps now (its slots' lengths, summed).
    pub(super) fn mapped_bytes(&self, vm: VmId) -> u64 {
        self.live_sessions()
            .iter()
            .filter(|s| s.vm == vm)
            .map(|s| lock(&s.slots).values().map(|slot| slot.len).sum::<u64>())
            .sum()
    }

    /// Whether any VM maps pool extent `extent` writable (its pages may
    /// then hold guest stores the host file does not have yet).
    pub(super) fn mapped_writable(&self, extent: u64) -> bool {
        let sessions = self.live_sessions();
        sessions.iter().any(|s| {
            lock(&s.slots)
                .values()
                .any(|slot| slot.writable && slot.extent == extent)
        })
    }

    /// The byte ranges `[start, end)` of `key`'s file that some VM's
    /// window maps writable now (slots in flight included), merged and in
    /// file order.
    pub(super) fn writable_ranges(&self, key: FileKey) -> Vec<(u64, u64)> {
        let sessions = self.live_sessions();
        let mut ranges: Vec<(u64, u64)> = sessions
            .iter()
            .flat_map(|s| {
                lock(&s.slots)
                    .values()
                    .filter(|slot| slot.writable && slot.key == key)
                    .map(|slot| (slot.foffset, slot.foffset.saturating_add(slot.len)))
                    .collect::<Vec<_>>()
            })
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }

    /// Pool pages mapped by the windows of two or more VMs now.
    pub fn shared_pages(&self) -> u64 {
        let sessions = self.live_sessions();
        // extent -> (vm, bytes mapped from the extent's start), largest per VM.
        let mut by_extent: std::collections::HashMap<u64, Vec<(VmId, u64)>> =
            std::collections::HashMap::new();
        for s in &sessions {
            for slot in lock(&s.slots).values() {
                let vms = by_extent.entry(slot.extent).or_default();
                match vms.iter_mut().find(|(v, _)| *v == s.vm) {
                    Some((_, len)) => *len = (*len).max(slot.len),
                    None => vms.push((s.vm, slot.len)),
                }
            }
        }
        by_extent
            .values()
            .map(|vms| {
                // Pages [0, second-largest len) are mapped by >= 2 VMs.
                let mut lens: Vec<u64> = vms.iter().map(|(_, l)| *l).collect();
                lens.sort_unstable_by(|a, b| b.cmp(a));
                lens.get(1).copied().unwrap_or(0) / residency::PAGE_SIZE
            })
            .sum()
    }
}
