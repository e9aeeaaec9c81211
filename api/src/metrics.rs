//! The metrics snapshot as JSON: what `/metrics.json` and `--metrics-file` carry.
