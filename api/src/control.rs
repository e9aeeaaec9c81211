//! The control socket protocol (JSON lines): requests, replies, error codes.
