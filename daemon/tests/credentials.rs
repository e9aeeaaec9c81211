//! Guest credentials on the host, through the passthrough filesystem on a
//! real host directory: nodes are created as the caller with the mode asked
//! for, CREATE keeps the kernel's O_EXCL rules, special files are never
//! opened, read-only stays read-only, and uid translation keeps a guest
//! root from making a set-uid-root file. Needs root (credential switches);
//! without it the tests fail under CI=true and pass vacuously otherwise.

#![allow(clippy::unwrap_used)]
use cxlfsd::abi::{self, fattr, SetattrIn};
use cxlfsd::server::{BufferIo, Context, Creation, FileIo, FileSystem, Named};
use cxlfsd::{CacheMode, GuestIds, IdMap, PassthroughFs};
use rustix::io::Errno;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

const ROOT: Context = Context {
    uid: 0,
    gid: 0,
    pid: 1,
    arrival_ns: 0,
};

fn user(uid: u32, gid: u32) -> Context {
    Context { uid, gid, ..ROOT }
}

fn as_root() -> bool {
    let root = rustix::process::geteuid().is_root();
    assert!(
        root || std::env::var("CI").as_deref() != Ok("true"),
        "credential tests need root (CI=true)"
    );
    root
}

/// A share anyone may create in (what the caller's own rights are checked against).
fn share() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn fs(dir: &Path, ids: GuestIds) -> PassthroughFs {
    PassthroughFs::new(dir, CacheMode::Never)
        .unwrap()
        .with_guest_ids(ids)
}

fn at(name: &str) -> Named<'_> {
    Named {
        parent: abi::ROOT_ID,
        name: name.as_bytes(),
    }
}

fn how(mode: u32, umask: u32, flags: i32) -> Creation {
    Creation {
        mode: libc::S_IFREG | mode,
        umask,
        flags: flags as u32,
        open_flags: 0,
    }
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn owner_of(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

fn write(fs: &PassthroughFs, fh: u64, data: &[u8]) -> Result<usize, Errno> {
    let mut io = BufferIo {
        req: data,
        data: Vec::new(),
    };
    let args = FileIo {
        nodeid: 0,
        fh,
        offset: 0,
        size: data.len() as u32,
        flags: 0,
        at: 0,
        payload: &mut io,
    };
    fs.write(&ROOT, args).map(|t| t.value)
}

#[test]
fn mode_is_kept_exactly_whatever_the_daemon_umask() {
    if !as_root() {
        return;
    }
    let d = share();
    // What the daemon inherits from a login shell; each worker's own is 0.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let fs = fs(d.path(), GuestIds::default());
    fs.create(&ROOT, at("rw"), how(0o666, 0, libc::O_RDWR))
        .unwrap();
    assert_eq!(mode_of(&d.path().join("rw")), 0o666);
    fs.create(&ROOT, at("masked"), how(0o666, 0o022, libc::O_RDWR))
        .unwrap();
    assert_eq!(mode_of(&d.path().join("masked")), 0o644);
    let dir = Creation {
        mode: libc::S_IFDIR | 0o777,
        ..Creation::default()
    };
    fs.mkdir(&ROOT, at("d"), dir).unwrap();
    assert_eq!(mode_of(&d.path().join("d")), 0o777);
    // The owner's own set-id files keep their bits when nothing strips them.
    let u = user(1000, 1000);
    fs.create(&u, at("suid"), how(0o4755, 0, libc::O_RDWR))
        .unwrap();
    assert_eq!(mode_of(&d.path().join("suid")), 0o4755);
    // mkdir(2) drops set-id bits from its mode: `mkdir -m 2775` is a
    // MKDIR, then a chmod.
    let dir = Creation {
        mode: libc::S_IFDIR | 0o775,
        ..Creation::default()
    };
    let e = fs.mkdir(&u, at("sgid"), dir).unwrap().value;
    let chmod = SetattrIn {
        valid: fattr::MODE,
        mode: 0o2775,
        ..SetattrIn::default()
    };
    fs.setattr(&u, e.nodeid, &chmod).unwrap();
    assert_eq!(mode_of(&d.path().join("sgid")), 0o2775);
}

#[test]
fn strip_setid_strips_from_create_and_chmod_but_not_from_directories() {
    if !as_root() {
        return;
    }
    let d = share();
    let ids = GuestIds {
        strip_setid: true,
        ..GuestIds::default()
    };
    let fs = fs(d.path(), ids);
    let u = user(1000, 1000);
    let (e, _) = fs
        .create(&u, at("f"), how(0o6755, 0, libc::O_RDWR))
        .unwrap()
        .value;
    assert_eq!(mode_of(&d.path().join("f")), 0o755);
    let chmod = SetattrIn {
        valid: fattr::MODE,
        mode: 0o6777,
        ..SetattrIn::default()
    };
    fs.setattr(&u, e.nodeid, &chmod).unwrap();
    assert_eq!(mode_of(&d.path().join("f")), 0o777);
    let dir = Creation {
        mode: libc::S_IFDIR | 0o775,
        ..Creation::default()
    };
    let e = fs.mkdir(&u, at("d"), dir).unwrap().value;
    let chmod = SetattrIn {
        valid: fattr::MODE,
        mode: 0o6775,
        ..SetattrIn::default()
    };
    fs.setattr(&u, e.nodeid, &chmod).unwrap();
    assert_eq!(mode_of(&d.path().join("d")), 0o2775);
}

#[test]
fn nodes_are_created_as_the_caller() {
    if !as_root() {
        return;
    }
    let d = share();
    let fs = fs(d.path(), GuestIds::default());
    let u = user(1234, 5678);
    fs.create(&u, at("f"), how(0o644, 0, libc::O_WRONLY))
        .unwrap();
    let dir = Creation {
        mode: libc::S_IFDIR | 0o755,
        ..Creation::default()
    };
    fs.mkdir(&u, at("d"), dir).unwrap();
    fs.symlink(&u, at("l"), b"f").unwrap();
    for n in ["f", "d", "l"] {
        assert_eq!(owner_of(&d.path().join(n)), (1234, 5678), "{n}");
    }
    // Guest root stays root (virtiofsd's default).
    fs.create(&ROOT, at("r"), how(0o644, 0, libc::O_WRONLY))
        .unwrap();
    assert_eq!(owner_of(&d.path().join("r")), (0, 0));
    // The host checks the caller's own rights: a directory only root may
    // write to refuses the caller (no create-as-root-then-chown).
    let closed = d.path().join("d/closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = fs.lookup(&ROOT, abi::ROOT_ID, b"d").unwrap().value;
    let c = fs.lookup(&ROOT, c.nodeid, b"closed").unwrap().value;
    let inside = Named {
        parent: c.nodeid,
        name: b"x",
    };
    assert_eq!(
        fs.create(&u, inside, how(0o644, 0, libc::O_WRONLY))
            .unwrap_err(),
        Errno::ACCESS
    );
    assert!(!closed.join("x").exists());
}

#[test]
fn create_keeps_o_excl_and_leaves_an_existing_file_alone() {
    if !as_root() {
        return;
    }
    let d = share();
    std::fs::write(d.path().join("old"), b"host data").unwrap();
    // Explicit: another test changes the process umask.
    std::fs::set_permissions(d.path().join("old"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let fs = fs(d.path(), GuestIds::default());
    let u = user(1000, 1000);
    let excl = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    assert_eq!(
        fs.create(&u, at("old"), how(0o600, 0, excl)).unwrap_err(),
        Errno::EXIST
    );
    // Without O_EXCL the existing file is opened, not taken over.
    let (e, o) = fs
        .create(&u, at("old"), how(0o600, 0, libc::O_RDONLY | libc::O_CREAT))
        .unwrap()
        .value;
    assert_eq!(owner_of(&d.path().join("old")), (0, 0));
    assert_eq!(mode_of(&d.path().join("old")), 0o644);
    assert_eq!(e.attr.size, 9);
    fs.release(&u, e.nodeid, o.fh);
    assert_eq!(std::fs::read(d.path().join("old")).unwrap(), b"host data");
    // A new name with O_EXCL is created.
    fs.create(&u, at("new"), how(0o600, 0, excl)).unwrap();
    assert_eq!(owner_of(&d.path().join("new")), (1000, 1000));
}

#[test]
fn a_host_fifo_never_blocks_a_worker() {
    if !as_root() {
        return;
    }
    let d = share();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        d.path().join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    let path = d.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    // On its own thread: were the FIFO opened, the open would wait for a
    // writer forever, and the timeout below fails the test.
    std::thread::spawn(move || {
        let fs = fs(&path, GuestIds::default());
        let e = fs.lookup(&ROOT, abi::ROOT_ID, b"fifo").unwrap().value;
        assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFIFO);
        let open = fs
            .open(&ROOT, e.nodeid, libc::O_RDONLY as u32, 0)
            .map(|_| ());
        let create = fs
            .create(
                &ROOT,
                at("fifo"),
                how(0o644, 0, libc::O_RDONLY | libc::O_CREAT),
            )
            .map(|_| ());
        let truncate = fs
            .setattr(
                &ROOT,
                e.nodeid,
                &SetattrIn {
                    valid: fattr::SIZE,
                    ..SetattrIn::default()
                },
            )
            .map(|_| ());
        tx.send((open, create, truncate)).unwrap();
    });
    let (open, create, truncate) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a FIFO open blocked the worker");
    assert_eq!(open.unwrap_err(), Errno::BADF);
    assert_eq!(create.unwrap_err(), Errno::BADF);
    assert_eq!(truncate.unwrap_err(), Errno::BADF);
}

#[test]
fn read_only_opens_stay_read_only() {
    if !as_root() {
        return;
    }
    let d = share();
    let f = d.path().join("ro");
    std::fs::write(&f, b"read me").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).unwrap();
    let fs = fs(d.path(), GuestIds::default());
    let e = fs.lookup(&ROOT, abi::ROOT_ID, b"ro").unwrap().value;
    let o = fs
        .open(&ROOT, e.nodeid, libc::O_RDONLY as u32, 0)
        .unwrap()
        .value;
    assert_eq!(write(&fs, o.fh, b"x").unwrap_err(), Errno::BADF);
    let h = fs.handle(o.fh).unwrap();
    let acc = rustix::fs::fcntl_getfl(&h.file).unwrap() & rustix::fs::OFlags::ACCMODE;
    assert_eq!(acc, rustix::fs::OFlags::RDONLY);
    assert_eq!(std::fs::read(&f).unwrap(), b"read me");
}

/// `map:0:100000:65536` for uids and gids: guest root is host 100000.
fn container_ids() -> GuestIds {
    GuestIds {
        uids: IdMap::parse(&["map:0:100000:65536", "forbid-guest:65536:1000"]).unwrap(),
        gids: IdMap::parse(&["map:0:100000:65536"]).unwrap(),
        strip_setid: false,
    }
}

#[test]
fn translated_guest_root_cannot_make_a_setuid_root_file() {
    if !as_root() {
        return;
    }
    let d = share();
    rustix::fs::chown(
        d.path(),
        Some(rustix::fs::Uid::from_raw(100_000)),
        Some(rustix::fs::Gid::from_raw(100_000)),
    )
    .unwrap();
    // A host root program in the share.
    let host_bin = d.path().join("host-bin");
    std::fs::write(&host_bin, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&host_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fs = fs(d.path(), container_ids());

    // The share's root is the guest root's own.
    let root_attr = fs.getattr(&ROOT, abi::ROOT_ID, None).unwrap().value.attr;
    assert_eq!((root_attr.uid, root_attr.gid), (0, 0));
    // What guest root creates is host 100000's; it sees it as its own.
    let (e, _) = fs
        .create(&ROOT, at("f"), how(0o755, 0, libc::O_RDWR))
        .unwrap()
        .value;
    assert_eq!((e.attr.uid, e.attr.gid), (0, 0));
    let f = d.path().join("f");
    assert_eq!(owner_of(&f), (100_000, 100_000));
    // `chown 0:0 f; chmod 4755 f`: set-uid, but to host 100000, not root.
    let chown = SetattrIn {
        valid: fattr::UID | fattr::GID,
        ..SetattrIn::default()
    };
    fs.setattr(&ROOT, e.nodeid, &chown).unwrap();
    let chmod = SetattrIn {
        valid: fattr::MODE,
        mode: 0o4755,
        ..SetattrIn::default()
    };
    fs.setattr(&ROOT, e.nodeid, &chmod).unwrap();
    assert_eq!(owner_of(&f), (100_000, 100_000));
    assert_eq!(mode_of(&f), 0o4755);
    // Guest root may hand files to its own users (host 101000) ...
    let to_user = SetattrIn {
        valid: fattr::UID,
        uid: 1000,
        ..SetattrIn::default()
    };
    fs.setattr(&ROOT, e.nodeid, &to_user).unwrap();
    assert_eq!(owner_of(&f).0, 101_000);
    // ... but not to a forbidden id.
    let forbidden = SetattrIn {
        valid: fattr::UID,
        uid: 65_600,
        ..SetattrIn::default()
    };
    assert_eq!(
        fs.setattr(&ROOT, e.nodeid, &forbidden).unwrap_err(),
        Errno::PERM
    );
    // A forbidden caller creates nothing.
    assert_eq!(
        fs.create(&user(65_600, 0), at("g"), how(0o644, 0, libc::O_RDWR))
            .unwrap_err(),
        Errno::PERM
    );
    // The host root's program: no chmod 4755, no chown from the guest.
    let b = fs.lookup(&ROOT, abi::ROOT_ID, b"host-bin").unwrap().value;
    assert_eq!(
        fs.setattr(&ROOT, b.nodeid, &chmod).unwrap_err(),
        Errno::PERM
    );
    assert_eq!(
        fs.setattr(&ROOT, b.nodeid, &chown).unwrap_err(),
        Errno::PERM
    );
    assert_eq!(mode_of(&host_bin), 0o755);
    assert_eq!(owner_of(&host_bin), (0, 0));
    // Nothing in the share is set-uid root.
    for entry in std::fs::read_dir(d.path()).unwrap() {
        let m = entry.unwrap().metadata().unwrap();
        assert!(!(m.uid() == 0 && m.mode() & libc::S_ISUID != 0));
    }
}

#[test]
fn mknod_and_tmpfile_keep_the_mode_and_belong_to_the_caller() {
    if !as_root() {
        return;
    }
    let d = share();
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let fs = fs(d.path(), GuestIds::default());
    let u = user(1000, 1000);
    let fifo = Creation {
        mode: libc::S_IFIFO | 0o666,
        ..Creation::default()
    };
    fs.mknod(&u, at("fifo"), fifo, 0).unwrap();
    let p = d.path().join("fifo");
    assert_eq!(mode_of(&p), 0o666);
    assert_eq!(owner_of(&p), (1000, 1000));
    // A device node needs CAP_MKNOD: a guest user has none on the host,
    // guest root (host root) does.
    let dev = Creation {
        mode: libc::S_IFCHR | 0o600,
        ..Creation::default()
    };
    let null = (1u32 << 8) | 3;
    assert_eq!(
        fs.mknod(&u, at("null"), dev, null).unwrap_err(),
        Errno::PERM
    );
    let e = fs.mknod(&ROOT, at("null"), dev, null).unwrap().value;
    assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFCHR);
    assert_eq!(e.attr.rdev, null);
    // The daemon never opens it.
    assert_eq!(
        fs.open(&ROOT, e.nodeid, libc::O_RDWR as u32, 0)
            .unwrap_err(),
        Errno::BADF
    );
    let (t, _) = fs
        .tmpfile(&u, abi::ROOT_ID, how(0o640, 0, libc::O_RDWR))
        .unwrap()
        .value;
    assert_eq!(t.attr.mode & 0o7777, 0o640);
    assert_eq!((t.attr.uid, t.attr.gid), (1000, 1000));
}
