//! Independent jobs over a list, one thread per CPU this process may run
//! on (at most 8), their results in the list's order: the miniatures of a
//! sampled curve, each a replay of the whole sample into its own device.

use std::thread;

/// CPUs this process may run on, at most 8: the threads a job list (or a
/// split trace, `split_pass`) is spread over.
pub fn cpus() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// Threads to use for `items` jobs: [`cpus`], no more than there are items.
fn threads_for(items: usize) -> usize {
    cpus().min(items).max(1)
}

/// `f` of every item, in order. Items are dealt round-robin (thread k takes
/// items k, k + n, …), so that jobs whose cost grows along the list are
/// shared evenly; on one CPU, or for one item, no thread is started. A
/// panicking job panics the caller, as it would have run here.
pub fn map_in_order<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let n = threads_for(items.len());
    if n == 1 {
        return items.iter().map(f).collect();
    }
    let f = &f;
    let dealt: Vec<Vec<R>> = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|k| s.spawn(move || items.iter().skip(k).step_by(n).map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut iters: Vec<_> = dealt.into_iter().map(Vec::into_iter).collect();
    (0..items.len())
        .filter_map(|i| iters.get_mut(i % n).and_then(Iterator::next))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_the_items_order() {
        let items: Vec<u64> = (0..37).collect();
        let got = map_in_order(&items, |&x| x * x);
        assert_eq!(got, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert!(map_in_order(&[] as &[u64], |&x| x).is_empty());
        assert_eq!(map_in_order(&[5u64], |&x| x + 1), vec![6]);
    }

    #[test]
    fn jobs_run_on_several_threads_where_there_are_cpus() {
        let items: Vec<u64> = (0..16).collect();
        let ids = map_in_order(&items, |_| thread::current().id());
        let distinct = ids.iter().collect::<std::collections::HashSet<_>>().len();
        assert_eq!(distinct, threads_for(items.len()));
    }
}
