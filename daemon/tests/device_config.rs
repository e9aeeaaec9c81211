//! The virtio-fs config space over a real vhost-user socket
//! (`VHOST_USER_GET_CONFIG`): the tag and the number of request queues, for
//! front-ends that take the config space from the back-end (QEMU >= 11.1's
//! `vhost-user-test-device-pci,virtio-id=26`); the VM reconnects after.
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::{Device, DeviceConfig};
use cxlfsd::server::ServerOptions;
use cxlfsd::{CacheMode, DaemonState, FsTag, QueueOptions, SessionOptions, SharedDevice, VmSpec};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

fn connect(socket: &std::path::Path) -> Frontend {
    let t = Instant::now();
    loop {
        match Frontend::connect(socket, 3) {
            Ok(f) => return f,
            Err(e) if t.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("cannot connect to {}: {e}", socket.display()),
        }
    }
}

#[test]
fn get_config_reports_the_tag_and_request_queues() {
    let share = tempfile::tempdir().unwrap();
    let socks = tempfile::tempdir().unwrap();
    let cfg = DeviceConfig::default()
        .with_overrides(&["cache.size_bytes=1MiB"])
        .unwrap();
    let state = DaemonState::new(
        Arc::new(SharedDevice::new(Device::new(cfg).unwrap())),
        SessionOptions {
            shared_dir: share.path().to_path_buf(),
            max_open_files: cxlfsd::DEFAULT_MAX_OPEN_FILES,
            cache: CacheMode::Never,
            queues: QueueOptions {
                request_queues: 2,
                tag: "share-0".parse::<FsTag>().unwrap(),
                ..QueueOptions::default()
            },
            server: ServerOptions {
                max_readahead: None,
            },
            guest_ids: Default::default(),
        },
    );
    let socket = socks.path().join("c.sock");
    let thread = state
        .spawn_vm(VmSpec {
            name: "c".into(),
            socket: socket.clone(),
            dir: None,
        })
        .unwrap();
    let mut f = connect(&socket);
    let features = f.get_features().unwrap();
    f.set_owner().unwrap();
    f.set_features(features).unwrap();
    let proto = f.get_protocol_features().unwrap();
    assert!(
        proto.contains(VhostUserProtocolFeatures::CONFIG),
        "{proto:?}"
    );
    f.set_protocol_features(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ)
        .unwrap();
    let (_, payload) = f
        .get_config(0, 40, VhostUserConfigFlags::WRITABLE, &[0u8; 40])
        .unwrap();
    let mut want = [0u8; 40];
    want[..7].copy_from_slice(b"share-0");
    want[36..].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(
        &payload[..],
        &want[..],
        "tag, NUL padded, then num_request_queues"
    );
    // A read of one field.
    let (_, q) = f
        .get_config(36, 4, VhostUserConfigFlags::WRITABLE, &[0u8; 4])
        .unwrap();
    assert_eq!(&q[..], &2u32.to_le_bytes());
    // (A read past the end gets the empty reply that signals an error in
    // vhost-user; the `vhost` crate's front-end then waits for a payload
    // that never comes, so it is not exercised from here.)
    drop(f);
    let f = connect(&socket);
    f.set_owner().unwrap();
    assert!(f.get_features().is_ok(), "the daemon serves the VM again");
    drop(f);
    state.request_shutdown();
    thread.join().unwrap();
}

#[test]
fn bad_tags_are_refused() {
    assert!("".parse::<FsTag>().is_err());
    assert!("x".repeat(37).parse::<FsTag>().is_err());
    assert!("a\0b".parse::<FsTag>().is_err());
    assert_eq!("x".repeat(36).parse::<FsTag>().unwrap().as_str().len(), 36);
    assert_eq!(FsTag::default().as_str(), "cxlfs");
}
