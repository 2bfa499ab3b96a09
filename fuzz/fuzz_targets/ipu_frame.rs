//! The collective engine's wire frames between IPU services (`ipu_firmware::wire`,
//! `ipu_firmware::plan`): one frame as a peer's connection delivers it, a 40-byte
//! [`FrameHeader`] and the payload its kind names (a [`Hello`], rank 0's [`ControlHeader`], a
//! rank's plan vote, or a data chunk for the header's codec).
//!
//! Input: a flags byte, then the frame. Flag bit 0 writes the right FNV-1a checksum into the
//! header first, so that the fuzzer gets past the checksum to the fields behind it.
//!
//! Checked (module docs of `wire.rs` and `plan.rs`):
//! - fewer than 40 bytes is `Truncated` and nothing else; a header with its checksum fixed is
//!   never refused for the checksum;
//! - an accepted header has `payload_len <= MAX_PAYLOAD` and re-encodes to exactly its 40 bytes
//!   (every field is kept, checksum included);
//! - a payload as long as the header says is handed to the parser of its kind, as the transport
//!   and the engine do: a hello is accepted iff it is 12 bytes and re-encodes to them; a control
//!   header or a vote that is accepted re-encodes to its bytes (the padding and a ratio the codec
//!   ignores aside) and parses again to the same value; a data chunk decodes as the codec's
//!   layout says or is refused without touching the buffer.
#![no_main]

#[path = "common/codec.rs"]
mod codec_check;

use ipu_firmware::codec::DecodeMode;
use ipu_firmware::plan::{encode_vote, parse_vote, ControlHeader, VOTE_LEN};
use ipu_firmware::wire::{header_checksum, FrameError, FrameHeader, FrameKind, Hello, HEADER_LEN, MAX_PAYLOAD};
use ipu_firmware::CodecKind;
use libfuzzer_sys::fuzz_target;

/// Largest data chunk decoded here (elements): a header may claim up to 2³² − 1.
const MAX_ELEMS: usize = 1 << 16;

/// Bytes of the control header's wire layout the parser ignores: the two padding fields, and the
/// top-k ratio when the codec is not top-k.
fn control_ignored(at: usize, c: &ControlHeader) -> bool {
    let ratio_unused = !matches!(c.plan.compression.codec, CodecKind::TopK { .. });
    (6..8).contains(&at) || (20..24).contains(&at) || (ratio_unused && (12..16).contains(&at))
}

fn check_control(payload: &[u8]) {
    if let Ok(c) = ControlHeader::parse(payload) {
        let again = c.encode();
        for (at, (a, b)) in again.iter().zip(payload).enumerate() {
            assert!(a == b || control_ignored(at, &c), "control header byte {at}: {b:#04x} re-encoded as {a:#04x}: {c:?}");
        }
        assert_eq!(ControlHeader::parse(&again), Ok(c));
    }
    match parse_vote(payload) {
        Ok((h, proposal)) => {
            assert_eq!(payload.len(), VOTE_LEN);
            let again = encode_vote(&h, proposal.as_ref());
            for at in 0..ControlHeader::LEN {
                assert!(again[at] == payload[at] || control_ignored(at, &h), "vote byte {at}: {h:?} {proposal:?}");
            }
            if let Some(p) = proposal {
                assert_eq!(again[ControlHeader::LEN..ControlHeader::LEN + 10], payload[ControlHeader::LEN..ControlHeader::LEN + 10]);
                assert_eq!(p.plan, h.plan);
            }
            assert_eq!(parse_vote(&again), Ok((h, proposal)));
        }
        Err(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, frame)) = data.split_first() else { return };
    let mut frame = frame.to_vec();
    let fixed = flags & 1 != 0 && frame.len() >= HEADER_LEN;
    if fixed {
        let sum = header_checksum(&frame[..HEADER_LEN - 4]);
        frame[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    }
    let h = match FrameHeader::parse(&frame) {
        Ok(h) => h,
        Err(FrameError::Truncated { needed, got }) => {
            assert_eq!((needed, got), (HEADER_LEN, frame.len()));
            assert!(frame.len() < HEADER_LEN);
            return;
        }
        Err(e) => {
            assert!(frame.len() >= HEADER_LEN);
            assert!(!(fixed && matches!(e, FrameError::HeaderChecksum { .. })), "{e} with the checksum fixed");
            return;
        }
    };
    assert_eq!(h.to_bytes()[..], frame[..HEADER_LEN], "{h:?}");
    assert!(h.payload_len <= MAX_PAYLOAD);
    // The transport reads exactly `payload_len` bytes; with fewer the connection ends first.
    let Some(payload) = frame.get(HEADER_LEN..HEADER_LEN + h.payload_len as usize) else { return };
    match h.kind {
        FrameKind::Hello => match Hello::parse(payload) {
            Ok(hello) => assert_eq!(hello.encode()[..], payload[..]),
            Err(e) => {
                assert_ne!(payload.len(), Hello::LEN, "{e}");
                assert_eq!(e, FrameError::PayloadLength { what: "hello", expected: Hello::LEN, got: payload.len() });
            }
        },
        FrameKind::Control => check_control(payload),
        FrameKind::Data => {
            let n = h.elem_count as usize;
            if n <= MAX_ELEMS {
                let mut dst = codec_check::destination(n);
                let _ = codec_check::check_decode(codec_check::kind_of(h.codec), payload, &mut dst, DecodeMode::Accumulate);
            }
        }
        FrameKind::Goodbye => {}
    }
});
