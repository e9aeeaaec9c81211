//! The FUSE kernel ABI (placeholder: filled by the fuse-abi work of issue 10).
