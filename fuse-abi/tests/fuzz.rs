//! Property tests: decoding arbitrary bytes never panics, succeeds exactly
//! when enough bytes are there, and gives back the bytes it read.

use fuse_abi::*;
use proptest::prelude::*;

/// Decodes `T` from `b` and checks the contract of [`Cursor::read`].
fn check<T: Wire + PartialEq>(b: &[u8]) {
    let mut c = Cursor::new(b);
    match c.read::<T>() {
        Ok(v) => {
            let n = core::mem::size_of::<T>();
            assert!(b.len() >= n, "{}", T::KERNEL_NAME);
            assert_eq!(v.as_bytes(), &b[..n], "{}", T::KERNEL_NAME);
            assert_eq!(c.position(), n);
            let mut again = Vec::new();
            again.extend_from_slice(v.as_bytes());
            assert_eq!(Cursor::new(&again).read::<T>().ok(), Some(v));
        }
        Err(DecodeError::Truncated { at, need, have }) => {
            assert!(b.len() < core::mem::size_of::<T>(), "{}", T::KERNEL_NAME);
            assert_eq!((at, need, have), (0, core::mem::size_of::<T>(), b.len()));
            assert_eq!(c.position(), 0);
        }
        Err(e) => panic!("{}: unexpected {e}", T::KERNEL_NAME),
    }
}

/// Every structure a request can carry (and the headers and replies, which
/// the front-end test drivers decode).
fn decode_all(b: &[u8]) {
    check::<InHeader>(b);
    check::<OutHeader>(b);
    check::<ForgetIn>(b);
    check::<ForgetOne>(b);
    check::<BatchForgetIn>(b);
    check::<GetattrIn>(b);
    check::<SetattrIn>(b);
    check::<MknodIn>(b);
    check::<MkdirIn>(b);
    check::<RenameIn>(b);
    check::<Rename2In>(b);
    check::<LinkIn>(b);
    check::<OpenIn>(b);
    check::<CreateIn>(b);
    check::<ReleaseIn>(b);
    check::<FlushIn>(b);
    check::<ReadIn>(b);
    check::<WriteIn>(b);
    check::<FsyncIn>(b);
    check::<SetxattrIn>(b);
    check::<GetxattrIn>(b);
    check::<LkIn>(b);
    check::<AccessIn>(b);
    check::<InitIn>(b);
    check::<InitInExt>(b);
    check::<InterruptIn>(b);
    check::<BmapIn>(b);
    check::<IoctlIn>(b);
    check::<PollIn>(b);
    check::<FallocateIn>(b);
    check::<LseekIn>(b);
    check::<CopyFileRangeIn>(b);
    check::<SetupMappingIn>(b);
    check::<RemoveMappingIn>(b);
    check::<RemoveMappingOne>(b);
    check::<NotifyRetrieveIn>(b);
    check::<Attr>(b);
    check::<EntryOut>(b);
    check::<AttrOut>(b);
    check::<InitOut>(b);
    check::<Kstatfs>(b);
    check::<Dirent>(b);
    check::<DirentPlus>(b);
    // The composite decoders.
    let _ = InitIn::parse(&mut Cursor::new(b));
    let _ = WriteIn::parse_with_data(&mut Cursor::new(b));
    let _ = RemoveMappingIn::parse_with_entries(&mut Cursor::new(b));
}

/// One cursor operation, chosen by the fuzzer.
#[derive(Debug, Clone)]
enum Op {
    U16,
    U32,
    U64,
    Skip(usize),
    Bytes(usize),
    Name,
    Rest,
    ZeroExtended,
    Many(usize),
    Header,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::U16),
        Just(Op::U32),
        Just(Op::U64),
        any::<usize>().prop_map(Op::Skip),
        (0usize..64).prop_map(Op::Bytes),
        Just(Op::Name),
        Just(Op::Rest),
        Just(Op::ZeroExtended),
        any::<usize>().prop_map(Op::Many),
        Just(Op::Header),
    ]
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        decode_all(&b);
    }

    #[test]
    fn cursor_ops_never_panic_and_stay_in_bounds(
        b in proptest::collection::vec(any::<u8>(), 0..128),
        ops in proptest::collection::vec(op(), 0..32),
    ) {
        let mut c = Cursor::new(&b);
        for o in ops {
            let before = c.position();
            let ok = match o {
                Op::U16 => c.u16().is_ok(),
                Op::U32 => c.u32().is_ok(),
                Op::U64 => c.u64().is_ok(),
                Op::Skip(n) => c.skip(n).is_ok(),
                Op::Bytes(n) => c.bytes(n).is_ok(),
                Op::Name => c.name().is_ok(),
                Op::Rest => { c.rest(); true }
                Op::ZeroExtended => { let _: InitInExt = c.read_zero_extended(); true }
                Op::Many(n) => c.read_many::<ForgetOne>(n).is_ok(),
                Op::Header => InHeader::parse(&mut c).is_ok(),
            };
            prop_assert!(c.position() <= b.len());
            prop_assert_eq!(c.position() + c.remaining(), b.len());
            if !ok {
                prop_assert_eq!(c.position(), before);
            }
        }
    }

    #[test]
    fn in_header_round_trips(len: u32, op: u32, unique: u64, nodeid: u64, uid: u32, gid: u32,
                             pid: u32, extlen: u16) {
        let h = InHeader { len, opcode: op, unique, nodeid, uid, gid, pid, total_extlen: extlen,
                           padding: 0 };
        let mut b = Vec::new();
        h.encode(&mut b);
        prop_assert_eq!(InHeader::parse(&mut Cursor::new(&b)).unwrap(), h);
    }

    #[test]
    fn reply_length_is_what_it_says(parts in proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..40), 0..5)) {
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let r = reply(1, 0, &refs).unwrap();
        let h = OutHeader::parse(&mut Cursor::new(&r)).unwrap();
        prop_assert_eq!(h.len as usize, r.len());
        let all = parts.concat();
        prop_assert_eq!(&r[OUT_HEADER_LEN..], all.as_slice());
    }
}
