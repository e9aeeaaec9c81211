//! Who holds which pin. A device page stays pinned while anyone (the host
//! or a VM) holds it; each VM's pages count against its quota, a guest's
//! unpin releases only its own pins, the host's releases everyone's.

use super::range::{pages_of, Target};
use super::{ControlCommandError, Controller, Principal};
use crate::device::Publish;
use crate::sync::lock;
use cxlfs_api::control::RangeResult;
use cxlfs_device_model::{Device, PAGE_SIZE};
use std::collections::{BTreeMap, BTreeSet};

/// Pins held per device page: who holds them.
#[derive(Debug, Default)]
pub(super) struct PinTable {
    holders: BTreeMap<u64, BTreeSet<Principal>>,
}

impl PinTable {
    /// Pages `who` holds.
    pub(super) fn held_by(&self, who: &Principal) -> u64 {
        self.holders.values().filter(|h| h.contains(who)).count() as u64
    }
}

impl Controller {
    /// Bytes `who` holds pinned.
    pub(super) fn pinned_bytes(&self, who: &Principal) -> u64 {
        lock(&self.pins).held_by(who) * PAGE_SIZE
    }

    /// Drops pin records of pages the device no longer holds pinned (their
    /// file was deleted and its pages discarded).
    pub(super) fn prune_pins(&self) {
        let mut pins = lock(&self.pins);
        self.prune(&mut pins);
    }

    fn prune(&self, pins: &mut PinTable) {
        self.shared.read(|_, dev| {
            pins.holders.retain(|&p, _| dev.is_pinned(p * PAGE_SIZE));
        });
    }

    /// Pins the pages of `segs` for `who`, within its quota; all or
    /// nothing (a refusal of the device is rolled back page by page). The
    /// caller bounded `segs` by the quota and `max_range_bytes` already
    /// (`Controller::segments`), so the page lists here are bounded too.
    pub(super) fn pin(
        &self,
        who: &Principal,
        target: &Target,
        segs: &[(u64, u64)],
        now: u64,
        r: &mut RangeResult,
    ) -> Result<(), ControlCommandError> {
        let mut pins = lock(&self.pins);
        self.prune(&mut pins);
        let pages: Vec<u64> = segs.iter().flat_map(|&(a, l)| pages_of(a, l)).collect();
        let new: Vec<u64> = pages
            .iter()
            .copied()
            .filter(|p| !pins.holders.get(p).is_some_and(|h| h.contains(who)))
            .collect();
        if let Principal::Vm(vm) = who {
            let held = pins.held_by(who) * PAGE_SIZE;
            let want = new.len() as u64 * PAGE_SIZE;
            if held + want > self.opts.pin_quota_bytes {
                return Err(ControlCommandError::QuotaExceeded {
                    vm: vm.clone(),
                    requested_bytes: want,
                    held_bytes: held,
                    quota_bytes: self.opts.pin_quota_bytes,
                });
            }
        }
        // Pin page by page so that a refusal can be rolled back exactly;
        // one device transaction per 2 MiB segment, so the data path of
        // other VMs waits for one segment at most.
        let mut newly_pinned = Vec::new();
        let mut fresh = Vec::new();
        let mut failure = None;
        let is_new: BTreeSet<u64> = new.iter().copied().collect();
        for &(a, l) in segs {
            self.shared.transact(Publish::Hand, |_, dev| {
                for p in pages_of(a, l).filter(|p| is_new.contains(p)) {
                    let addr = p * PAGE_SIZE;
                    if dev.is_pinned(addr) {
                        continue;
                    }
                    let resident = dev.is_resident(addr);
                    match dev.pin(now, addr, PAGE_SIZE) {
                        Ok(o) => {
                            newly_pinned.push(p);
                            if !resident {
                                fresh.push(p);
                            }
                            r.completes_at_ns = r.completes_at_ns.max(o.completes_at_ns);
                        }
                        Err(e) => {
                            failure = Some(e);
                            return;
                        }
                    }
                }
            });
            if failure.is_some() {
                break;
            }
        }
        if failure.is_some() {
            for chunk in newly_pinned.chunks(512) {
                self.shared.transact(Publish::Hand, |_, dev| {
                    for &p in chunk {
                        let _ = dev.unpin(p * PAGE_SIZE, PAGE_SIZE);
                    }
                });
            }
        }
        if let Some(e) = failure {
            return Err(e.into());
        }
        for &p in &new {
            pins.holders.entry(p).or_default().insert(who.clone());
        }
        r.pages = pages.len() as u64;
        r.changed = new.len() as u64;
        r.skipped = r.pages - r.changed;
        drop(pins);
        r.plane_filled = self.fill_plane(target, &fresh);
        Ok(())
    }

    /// Releases `who`'s pins on the pages of `segs` (the host: everyone's);
    /// a page leaves the device's pinned set when nobody holds it.
    pub(super) fn unpin(
        &self,
        who: &Principal,
        segs: &[(u64, u64)],
        r: &mut RangeResult,
    ) -> Result<(), ControlCommandError> {
        let mut pins = lock(&self.pins);
        for &(addr, len) in segs {
            self.shared
                .transact(Publish::Hand, |_, dev| {
                    unpin_pages(&mut pins, dev, who, addr, len, r)
                })
                .0?;
        }
        Ok(())
    }
}

/// Releases `who`'s pins on the pages of `[addr, addr + len)` in `pins`;
/// a page leaves the device's pinned set when nobody holds it.
fn unpin_pages(
    pins: &mut PinTable,
    dev: &mut Device,
    who: &Principal,
    addr: u64,
    len: u64,
    r: &mut RangeResult,
) -> Result<(), ControlCommandError> {
    for p in pages_of(addr, len) {
        r.pages += 1;
        let release = match pins.holders.get_mut(&p) {
            Some(h) if *who == Principal::Host => {
                h.clear();
                true
            }
            Some(h) => {
                if h.remove(who) {
                    r.changed += 1;
                } else {
                    r.skipped += 1;
                }
                h.is_empty()
            }
            None => *who == Principal::Host,
        };
        if release {
            pins.holders.remove(&p);
            let was = dev.unpin(p * PAGE_SIZE, PAGE_SIZE)?;
            if *who == Principal::Host {
                r.changed += was;
            }
        }
    }
    Ok(())
}
