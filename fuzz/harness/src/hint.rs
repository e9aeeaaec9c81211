//! `hint_ioctl`: one `FUSE_IOCTL` carrying a `struct cxlfs_hint`, through
//! the server's ioctl seam into the daemon's `HintHandler` and controller
//! (`daemon/src/control/hint.rs`: `cxlfs_hint::decode`, the checks, the
//! range or device-wide command, the reply's encoding), over a real
//! temporary share and device; and `cxlfs_hint::decode` / `encode` alone.
//!
//! Input: a selector byte, then `cmd` (u32 LE), `flags` (u32), `fh` (u64),
//! `in_size` (u32), `out_size` (u32), then the ioctl's input bytes. Where a
//! selector bit is clear the field takes the value the guest kernel sends
//! for a well-formed hint (so that the fuzzer spends its time in the
//! payload): bit 0 `cmd` (else `CXLFS_IOC_HINT`), bit 1 `flags` (else 0),
//! bit 2 `fh` (else `f`'s handle; bit 3 then picks the root's directory
//! handle), bit 4 the sizes (else [`HINT_SIZE`]).
//!
//! Each input starts from a fresh device, controller and server over the
//! share of [`crate::fuse`] (its own copy), `f` open.

use crate::fuse::{self, FuzzServer, F_FH, F_NODEID, ROOT_FH};
use cxlfs_api::control::DaemonSummary;
use cxlfs_hint::{CXLFS_IOC_HINT, HINT_SIZE};
use cxlfsd::abi::{opcode, Cursor, IoctlIn, IoctlOut, OutHeader};
use cxlfsd::server::IoctlHandler;
use cxlfsd::{ControlOptions, Controller, DevicePlacement, HintHandler, Metrics};
use std::sync::{Arc, Mutex, OnceLock};
use zerocopy::{FromBytes, IntoBytes};

/// The pin quota of the fuzzed controller.
pub const PIN_QUOTA: u64 = 32 * 4096;

fn server(dir: &std::path::Path) -> FuzzServer {
    let shared = fuse::device();
    let metrics = Arc::new(Metrics::new(shared.clone(), None));
    let controller = Controller::new(
        shared.clone(),
        metrics.clone(),
        cxlfsd::Planes::default(),
        Arc::new(DevicePlacement(shared.clone())),
        dir,
        ControlOptions {
            pin_quota_bytes: PIN_QUOTA,
            guest_device_control: true,
            max_range_bytes: 1 << 20,
            prefetch_budget_bytes: 1 << 20,
        },
        DaemonSummary::default(),
    )
    .expect("a controller");
    let handler = Arc::new(HintHandler::new(controller, "fuzz")) as Arc<dyn IoctlHandler>;
    fuse::server(dir, shared, metrics.vm("fuzz")).with_ioctl(Some(handler))
}

/// The IOCTL request's arguments for `ioc` and input bytes `data`.
pub fn ioctl_args(ioc: &IoctlIn, data: &[u8]) -> Vec<u8> {
    let mut b = ioc.as_bytes().to_vec();
    b.extend_from_slice(data);
    b
}

/// An input for this target: a well-formed hint (selector 0) with `payload`.
pub fn input(payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 1 + 4 + 4 + 8 + 4 + 4];
    b.extend_from_slice(payload);
    b
}

/// Runs one input (see the module's documentation).
///
/// # Panics
/// When the server or the handler panics, when `decode` and `encode` do
/// not agree, or when the reply is not a FUSE reply with an ioctl result
/// that is 0 or a negative errno, followed by a whole `struct cxlfs_hint`.
///
/// Returns the FUSE error (`Err`) or the ioctl's result.
pub fn run(data: &[u8]) -> Result<i32, i32> {
    let mut rest = data;
    let sel = crate::take::<1>(&mut rest)[0];
    let cmd = u32::from_le_bytes(crate::take::<4>(&mut rest));
    let flags = u32::from_le_bytes(crate::take::<4>(&mut rest));
    let fh = u64::from_le_bytes(crate::take::<8>(&mut rest));
    let in_size = u32::from_le_bytes(crate::take::<4>(&mut rest));
    let out_size = u32::from_le_bytes(crate::take::<4>(&mut rest));
    let size = HINT_SIZE as u32;
    let ioc = IoctlIn {
        fh: match (sel & 4 != 0, sel & 8 != 0) {
            (true, _) => fh,
            (false, false) => F_FH,
            (false, true) => ROOT_FH,
        },
        flags: if sel & 2 != 0 { flags } else { 0 },
        cmd: if sel & 1 != 0 { cmd } else { CXLFS_IOC_HINT },
        arg: 0,
        in_size: if sel & 16 != 0 { in_size } else { size },
        out_size: if sel & 16 != 0 { out_size } else { size },
    };

    // The ABI crate alone: decode, then encode, gives the same bytes (the
    // reserved tail is written as zero).
    if let Some((req, reply)) = cxlfs_hint::decode(rest) {
        let enc = cxlfs_hint::encode(&req, &reply);
        assert_eq!(enc[..152], rest[..152], "decode/encode round trip");
        assert!(enc[152..].iter().all(|&b| b == 0), "reserved is zero");
        let _ = (req.policy_name(), reply.policy());
        if let Some(op) = cxlfs_hint::HintOp::from_u32(req.op) {
            assert_eq!(op as u32, req.op);
        }
    } else {
        assert!(
            rest.len() < HINT_SIZE,
            "decode refused {} bytes",
            rest.len()
        );
    }

    static SHARE: OnceLock<tempfile::TempDir> = OnceLock::new();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fuse::share(&SHARE);
    fuse::reset(dir);
    let s = server(dir);
    fuse::prepare(&s);
    let req = fuse::request(opcode::IOCTL, 77, F_NODEID, &ioctl_args(&ioc, rest));
    let out_cap = 4096;
    let reply = s
        .handle(1_000, &req, out_cap)
        .reply
        .expect("IOCTL always takes a reply");
    let h = OutHeader::parse(&mut Cursor::new(&reply)).expect("a reply header");
    assert_eq!(h.len as usize, reply.len());
    assert_eq!(h.unique, 77);
    assert!((-4095..=0).contains(&h.error), "error {}", h.error);
    if h.error != 0 {
        assert_eq!(reply.len(), std::mem::size_of::<OutHeader>());
        return Err(h.error);
    }
    let body = &reply[std::mem::size_of::<OutHeader>()..];
    let (out, hint) = IoctlOut::read_from_prefix(body).expect("a fuse_ioctl_out");
    assert!(
        (-4095..=0).contains(&out.result),
        "ioctl result {}",
        out.result
    );
    assert_eq!(hint.len(), HINT_SIZE, "a whole struct cxlfs_hint follows");
    let (back, _) = cxlfs_hint::decode(hint).expect("the reply decodes");
    let (sent, _) = cxlfs_hint::decode(rest).expect("a handled hint was decodable");
    assert_eq!(back, sent, "the \"in\" half comes back unchanged");
    Ok(out.result)
}
