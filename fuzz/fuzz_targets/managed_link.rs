//! The host ↔ IPU link of the managed collective service (`ipu_firmware::managed`): the bytes a
//! tenant sends to `ringside-ipu`, served by the real session loop (`serve_stream`) over an
//! in-memory link, with a stand-in for the engine.
//!
//! Input: a flags byte, then the tenant's byte stream. Flag bit 0: the stream ends in a read
//! timeout instead of a close; bit 1: the link delivers at most 5 bytes per read.
//!
//! Checked (module docs of `managed.rs`):
//! - a header that parses re-encodes to its 40 bytes;
//! - nothing malformed reaches the engine: every request the runner gets has a payload within
//!   `max_buffer`, a broadcast root below the world size, bf16 only for allreduce, and a buffer
//!   of exactly `elems` elements of its dtype;
//! - what the service writes is a sequence of valid frames: one reply per request run, whose
//!   header echoes the request and whose report (JSON) and result buffer are the runner's; at most
//!   one error frame, last, with a known code and a message of at most `MAX_ERROR_MESSAGE` bytes;
//! - the session's end says the same: `Refused(code)` iff the last frame is that error (counted
//!   once in the service's stats), `Closed` only at a frame boundary at the end of the stream,
//!   `LinkFailed` with no error frame.
#![no_main]

use std::io::{ErrorKind, Read, Write};

use ipu_firmware::managed::{
    serve_stream, validate_request, Buffer, CollectiveRunner, ErrorCode, Header, Kind, ManagedReport, Op, Request,
    ServiceConfig, ServiceStats, SessionEnd, HEADER_LEN, MAX_ERROR_MESSAGE,
};
use ipu_firmware::{CollectiveError, Dtype, Plan};
use libfuzzer_sys::fuzz_target;

const WORLD: usize = 4;
/// Small, so that buffers stay small and `TooLarge` is reachable.
const MAX_BUFFER: u64 = 64 << 10;

/// The tenant's end of the link: reads come from the fuzz input, writes are kept.
struct Link<'a> {
    input: &'a [u8],
    timeout_at_end: bool,
    max_read: usize,
    written: Vec<u8>,
}

impl Read for Link<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.input.is_empty() {
            return if self.timeout_at_end { Err(ErrorKind::WouldBlock.into()) } else { Ok(0) };
        }
        let n = buf.len().min(self.input.len()).min(self.max_read);
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

impl Write for Link<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The engine's stand-in: checks what it is given, negates the buffer, and fails the collectives
/// whose step ends in 0xee (as a peer's death would).
#[derive(Default)]
struct Runner {
    /// Per successful run: the request, its report and the result's bytes.
    ran: Vec<(Request, ManagedReport, Vec<u8>)>,
    calls: u64,
}

impl CollectiveRunner for Runner {
    fn run(&mut self, req: &Request, buf: &mut Buffer) -> Result<ManagedReport, CollectiveError> {
        self.calls += 1;
        assert!((req.payload_len() as u64) <= MAX_BUFFER, "{req:?}");
        assert!(req.op != Op::Broadcast || req.root < WORLD, "{req:?}");
        assert!(req.dtype == Dtype::F32 || req.op == Op::Allreduce, "{req:?}");
        let bytes = match buf {
            Buffer::F32(v) => {
                assert_eq!((req.dtype, v.len()), (Dtype::F32, req.elems));
                v.iter_mut().for_each(|x| *x = -*x);
                v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()
            }
            Buffer::Bf16(v) => {
                assert_eq!((req.dtype, v.len()), (Dtype::Bf16, req.elems));
                v.iter_mut().for_each(|x| x.0 ^= 0x8000);
                v.iter().flat_map(|x| x.0.to_le_bytes()).collect::<Vec<u8>>()
            }
        };
        if req.step & 0xff == 0xee {
            return Err(CollectiveError::PeerDisconnected { peer: 1, channel: 0 });
        }
        let report = ManagedReport { op: self.calls, plan: Plan::default(), hint_rank: None, bytes_sent: 40, service_ms: 1.5, hint_version: Some(req.step) };
        self.ran.push((*req, report, bytes));
        Ok(report)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, stream)) = data.split_first() else { return };
    if let Some(first) = stream.first_chunk::<HEADER_LEN>() {
        if let Ok(h) = Header::parse(first) {
            assert_eq!(h.encode(), *first, "{h:?}");
        }
        if let Ok(req) = validate_request(first, WORLD, MAX_BUFFER) {
            assert_eq!(req.payload_len() as u64, u64::from_le_bytes(first[32..40].try_into().unwrap()));
        }
    }

    let mut link = Link { input: stream, timeout_at_end: flags & 1 != 0, max_read: if flags & 2 != 0 { 5 } else { usize::MAX }, written: Vec::new() };
    let mut runner = Runner::default();
    let cfg = ServiceConfig { max_buffer: MAX_BUFFER, ..ServiceConfig::default() };
    let stats = ServiceStats::default();
    let end = serve_stream(&mut link, &mut runner, WORLD, &cfg, &stats);

    // Read back what the service wrote, as the tenant would.
    let mut out = &link.written[..];
    let mut replies = 0usize;
    let mut refused = None;
    while !out.is_empty() {
        assert!(refused.is_none(), "a frame after the error frame");
        let hb: &[u8; HEADER_LEN] = out.first_chunk().expect("a whole header");
        let h = Header::parse(hb).unwrap_or_else(|e| panic!("the service wrote a header its tenant refuses: {e}"));
        let payload = &out[HEADER_LEN..HEADER_LEN + h.payload_len as usize];
        out = &out[HEADER_LEN + h.payload_len as usize..];
        match h.kind {
            Kind::Reply => {
                let (req, report, result) = runner.ran.get(replies).expect("one reply per collective run");
                replies += 1;
                assert_eq!((h.op, h.elems, h.step), (req.op as u8, req.elems as u64, req.step));
                let (json, buffer) = payload.split_at(h.arg as usize);
                assert_eq!(serde_json::from_slice::<ManagedReport>(json).expect("the report is JSON"), *report);
                assert_eq!(buffer, &result[..]);
            }
            Kind::Error => {
                assert!(payload.len() <= MAX_ERROR_MESSAGE);
                let code = ErrorCode::ALL.into_iter().find(|c| *c as u32 == h.arg).unwrap_or_else(|| panic!("unknown error code {}", h.arg));
                refused = Some(code);
            }
            Kind::Request => panic!("the service sent a request"),
        }
    }
    assert_eq!(replies, runner.ran.len());
    // Counted when validated: the last one may not have run (its payload never came).
    let requests = stats.requests.load(std::sync::atomic::Ordering::Relaxed);
    assert!(runner.calls == requests || runner.calls + 1 == requests, "{requests} requests, {} runs", runner.calls);
    match end {
        SessionEnd::Refused(code) => {
            assert_eq!(refused, Some(code));
            assert_eq!(stats.errors(code), 1);
            assert!(code != ErrorCode::Timeout || link.timeout_at_end);
        }
        SessionEnd::Closed => {
            assert_eq!(refused, None);
            assert!(link.input.is_empty() && !link.timeout_at_end);
        }
        SessionEnd::LinkFailed => {
            assert_eq!(refused, None);
            assert!(!link.timeout_at_end, "a timeout is refused with an error frame");
        }
    }
});
