//! Guest credentials with uid/gid translation, in a real guest: the guest's
//! root is host uid 100000 (`--translate-uid map:0:100000:65536`, likewise
//! for gids, the share owned by 100000 as a container's root would be).
//! The guest runs `chown 0:0 f; chmod 4755 f` on its own file and tries the
//! same on a host root program in the share; the host then checks that no
//! file in the share is set-uid root, that the guest's file belongs to host
//! 100000, that the host's program is untouched, and that a file created
//! with umask 0 has exactly mode 0666.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, Daemon, VmOptions, GUEST_PRELUDE};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

const HOST_ROOT_OF_GUEST: u32 = 100_000;

fn chown(p: &Path, id: u32) {
    std::os::unix::fs::chown(p, Some(id), Some(id)).unwrap();
}

#[test]
fn translated_guest_root_cannot_make_a_setuid_root_file() {
    let _serial = exclusive();
    let map = format!("map:0:{HOST_ROOT_OF_GUEST}:65536");
    let mut d = Daemon::start(
        &["vm0"],
        &["--translate-uid", &map, "--translate-gid", &map],
        |share| {
            chown(share, HOST_ROOT_OF_GUEST);
            chown(&share.join(".cxlfs"), HOST_ROOT_OF_GUEST);
            let bin = share.join("host-bin");
            fs::write(&bin, b"#!/bin/sh\necho host\n").unwrap();
            fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        },
    );
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
cd /mnt
echo "root dir: $(stat -c '%u:%g' /mnt)"
echo data >f
run chown 0:0 f
run chmod 4755 f
echo "GUEST-F=$(stat -c '%u:%g:%a' f)"
if chmod 4755 host-bin 2>/dev/null; then echo HOSTBIN-CHMOD=done; else echo HOSTBIN-CHMOD=refused; fi
if chown 0:0 host-bin 2>/dev/null; then echo HOSTBIN-CHOWN=done; else echo HOSTBIN-CHOWN=refused; fi
(umask 0 && : >m666 && mkdir d777)
run mkdir -p sub
run ln -s f link
echo guest-done
"#
    ));
    let run = d.boot("vm0", &VmOptions::default()).wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    assert!(run.serial.contains("guest-done"), "{}", run.describe());
    // The guest sees its own file as root's, set-uid.
    assert!(
        run.serial.contains("GUEST-F=0:0:4755"),
        "{}",
        run.describe()
    );
    assert!(
        run.serial.contains("HOSTBIN-CHMOD=refused"),
        "{}",
        run.describe()
    );
    assert!(
        run.serial.contains("HOSTBIN-CHOWN=refused"),
        "{}",
        run.describe()
    );
    let st = d.stop();
    assert!(st.success(), "cxlfsd exited with {st}\n{}", d.diagnostics());

    let share = d.share();
    let f = fs::symlink_metadata(share.join("f")).unwrap();
    assert_eq!((f.uid(), f.gid()), (HOST_ROOT_OF_GUEST, HOST_ROOT_OF_GUEST));
    assert_eq!(f.mode() & 0o7777, 0o4755, "set-uid, but to host 100000");
    let bin = fs::symlink_metadata(share.join("host-bin")).unwrap();
    assert_eq!((bin.uid(), bin.gid()), (0, 0));
    assert_eq!(bin.mode() & 0o7777, 0o755);
    for (name, mode) in [("m666", 0o666), ("d777", 0o777)] {
        let m = fs::symlink_metadata(share.join(name)).unwrap();
        assert_eq!(m.mode() & 0o7777, mode, "{name}: the mode asked for");
        assert_eq!(m.uid(), HOST_ROOT_OF_GUEST, "{name}: created as the caller");
    }
    for name in ["sub", "link"] {
        let m = fs::symlink_metadata(share.join(name)).unwrap();
        assert_eq!(m.uid(), HOST_ROOT_OF_GUEST, "{name}: created as the caller");
    }
    // Nothing in the share is set-uid (or set-gid) root.
    for e in fs::read_dir(share).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        let setuid_root = m.uid() == 0 && m.mode() & libc::S_ISUID != 0;
        let setgid_root = m.is_file() && m.gid() == 0 && m.mode() & libc::S_ISGID != 0;
        assert!(
            !setuid_root && !setgid_root,
            "{}: set-id root on the host ({:o})",
            e.path().display(),
            m.mode()
        );
    }
}
