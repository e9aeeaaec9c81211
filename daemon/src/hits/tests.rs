#![allow(clippy::unwrap_used)]
use super::*;
use crate::metrics::HitSourcesSource;

/// A source that covers the listed VM regions.
struct Fixed(HitSourceKind, Vec<(&'static str, RegionKind)>);

impl HitSource for Fixed {
    fn kind(&self) -> HitSourceKind {
        self.0
    }
    fn covers(&self, vm: &str, region: RegionKind) -> bool {
        self.1.iter().any(|&(v, r)| v == vm && r == region)
    }
    fn samples(&self) -> Vec<HitSourceSample> {
        self.1
            .iter()
            .map(|&(vm, r)| HitSourceSample {
                vm: vm.into(),
                region: r,
                source: self.0,
                ..HitSourceSample::default()
            })
            .collect()
    }
}

#[test]
fn the_first_source_that_covers_a_region_serves_it() {
    let mut s = HitSources::default();
    assert_eq!(s.source_of("vm0", RegionKind::File), HitSourceKind::None);
    s.push(Arc::new(Fixed(
        HitSourceKind::AccessBits,
        vec![("vm0", RegionKind::Memory)],
    )));
    s.push(Arc::new(Fixed(
        HitSourceKind::Sampling,
        vec![("vm0", RegionKind::Memory), ("vm1", RegionKind::Memory)],
    )));
    assert_eq!(
        s.source_of("vm0", RegionKind::Memory),
        HitSourceKind::AccessBits
    );
    assert_eq!(
        s.source_of("vm1", RegionKind::Memory),
        HitSourceKind::Sampling
    );
    assert_eq!(s.source_of("vm1", RegionKind::File), HitSourceKind::None);
    let rows = s.samples();
    assert_eq!(rows.len(), 3);
    assert!(rows
        .iter()
        .all(|r| r.serving == s.source_of(&r.vm, RegionKind::Memory)));
}
