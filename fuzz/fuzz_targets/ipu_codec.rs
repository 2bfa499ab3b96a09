//! The engine's chunk codecs (`ipu_firmware::codec`: none, fp16, bf16, int8, top-k), both ways.
//!
//! Input: `codec (u8) | mode (u8) | ratio (u8) | elems (u16 LE) | rest`. Codec id mod 5 as on the
//! wire; top-k keeps `(ratio + 1) / 256` of the chunk. Mode bit 7 clear: `rest` is a payload
//! received from a peer, decoded into `elems` elements (at most 4096) in mode `mode % 3`
//! (overwrite, accumulate, subtract). Bit 7 set: `rest` is a chunk of f32 (little endian) to
//! send, encoded with error feedback as the engine sends it.
//!
//! Checked (module docs of `codec.rs`):
//! - decode: the result is exactly the scalar reading of the codec's layout, or an error that left
//!   the destination untouched (`common/codec.rs`);
//! - encode: the payload is at most `max_encoded_len` (exactly, for the fixed-size codecs), and
//!   decodes again (what `encode_with_feedback` relies on: it panics otherwise); for finite
//!   chunks the documented error bounds hold (in the domains the unit tests state them for):
//!   none is exact, fp16 within `|x|·2⁻¹¹` (or 2⁻²⁵), bf16 within `|x|·2⁻⁸`, int8 within
//!   `max|x|/254`, top-k keeps exactly `kept(n)` values unchanged and drops none larger than
//!   the smallest it kept; and error feedback leaves `input + old residual − decoded` as the
//!   new residual. (Int8 on a chunk with a NaN or infinity is a known failure, left out:
//!   `known_int8_nonfinite`.)
#![no_main]

#[path = "common/codec.rs"]
mod codec_check;

use ipu_firmware::codec::{self, encode_with_feedback, DecodeMode, TopKCodec};
use ipu_firmware::CodecKind;
use libfuzzer_sys::fuzz_target;

const MAX_ELEMS: usize = 4096;

fn kind(id: u8, ratio: u8) -> CodecKind {
    match codec_check::kind_of(id) {
        CodecKind::TopK { .. } => CodecKind::TopK { ratio: (f32::from(ratio) + 1.0) / 256.0 },
        k => k,
    }
}

/// The error bound of one element `x` decoded as `y`, where `m` is the chunk's largest `|x|`:
/// the unit tests' bounds and domains (`codec.rs`), `None` outside the domain.
fn within_bound(kind: CodecKind, x: f32, y: f32, m: f32) -> Option<bool> {
    let err = (x - y).abs();
    match kind {
        CodecKind::None => Some(x.to_bits() == y.to_bits()),
        CodecKind::Fp16 => (x.abs() <= 65504.0).then(|| err <= (x.abs() * 2f32.powi(-11)).max(2f32.powi(-25))),
        CodecKind::Bf16 => (x.abs() < 3.0e38).then(|| err <= (x.abs() * 2f32.powi(-8)).max(f32::from_bits(1 << 15))),
        // Not below 127 / f32::MAX (about 3.7e-37): there `127 / max|x|` overflows and the chunk
        // decodes as zeros, an error of up to max|x| (a known finding, docs/fuzzing.md).
        CodecKind::Int8 => (m >= 127.0 / f32::MAX && m <= 1.0e30).then(|| err <= m / 254.0 * 1.0001 + f32::MIN_POSITIVE),
        CodecKind::TopK { .. } => Some(y.to_bits() == x.to_bits() || y == 0.0),
    }
}

/// Known finding (docs/fuzzing.md): int8 encodes a chunk holding a NaN or an infinity with a
/// non-finite scale, which its own decoder refuses, so `encode_with_feedback` panics ("a payload we
/// just encoded decodes") and, without error feedback, the receiving rank fails the collective
/// with a bad frame; the module docs say such a chunk "may turn into NaN". Finite values near
/// `f32::MAX` get there too: their decoded value rounds to infinity, the residual is infinite, and
/// the next step's chunk is not finite. Left out here (values above 1e30) so that the bounded runs
/// look for other failures; `RINGSIDE_FUZZ_INT8_NONFINITE=1` puts it back (the reproducer is
/// `0384ffffffffffffff`). Remove the exclusion when the codec is fixed.
fn known_int8_nonfinite(kind: CodecKind, src: &[f32]) -> bool {
    static INCLUDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    kind == CodecKind::Int8
        && src.iter().any(|x| !(x.abs() <= 1.0e30))
        && !*INCLUDE.get_or_init(|| std::env::var_os("RINGSIDE_FUZZ_INT8_NONFINITE").is_some())
}

fn check_encode(kind: CodecKind, src: &[f32]) {
    if known_int8_nonfinite(kind, src) {
        return;
    }
    let c = codec::for_kind(kind);
    let n = src.len();

    // Error feedback, as the engine sends: two steps, the second with the first one's residual.
    // `encode_with_feedback` decodes what it encoded and panics if it cannot.
    let mut residual = vec![0f32; n];
    let (mut scratch, mut out) = (Vec::new(), Vec::new());
    encode_with_feedback(c.as_ref(), src, &mut residual, &mut scratch, &mut out);
    let first = residual.clone();
    out.clear();
    encode_with_feedback(c.as_ref(), src, &mut residual, &mut scratch, &mut out);
    let mut sent = vec![0f32; n];
    c.decode(&out, &mut sent, DecodeMode::Overwrite).expect("encode_with_feedback decoded it");
    for i in 0..n {
        let want = (src[i] + first[i]) - sent[i];
        assert!(residual[i].to_bits() == want.to_bits() || (want.is_nan() && residual[i].is_nan()), "{kind}: residual {i}");
    }

    let mut payload = Vec::new();
    c.encode(src, &mut payload);
    let max = c.max_encoded_len(n);
    match kind {
        CodecKind::TopK { .. } => assert!(payload.len() <= max, "{kind}: {} bytes, at most {max}", payload.len()),
        _ => assert_eq!(payload.len(), max, "{kind}"),
    }
    let mut d = vec![f32::NAN; n];
    codec_check::check_decode(kind, &payload, &mut d, DecodeMode::Overwrite)
        .unwrap_or_else(|e| panic!("{kind}: a chunk of {n} just encoded does not decode: {e}"));

    if src.iter().all(|x| x.is_finite()) {
        let m = src.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (i, (&x, &y)) in src.iter().zip(&d).enumerate() {
            assert!(within_bound(kind, x, y, m) != Some(false), "{kind}: element {i}: {x} decoded as {y} (max |x| {m})");
        }
        if let CodecKind::TopK { ratio } = kind {
            let kept = TopKCodec { ratio }.kept(n);
            assert_eq!(payload.len(), 4 + 8 * kept, "{kind}");
            let mut min_kept = f32::INFINITY;
            for c in payload[4..].chunks_exact(8) {
                let i = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                assert_eq!(d[i].to_bits(), src[i].to_bits(), "{kind}: kept element {i} changed");
                min_kept = min_kept.min(src[i].abs());
            }
            for (i, &x) in src.iter().enumerate() {
                assert!(d[i].to_bits() == x.to_bits() || x.abs() <= min_kept, "{kind}: dropped {x} at {i}, kept one of {min_kept}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let kind = kind(data[0], data[2]);
    let n = usize::from(u16::from_le_bytes([data[3], data[4]])).min(MAX_ELEMS);
    let rest = &data[5..];
    if data[1] & 0x80 == 0 {
        let mode = [DecodeMode::Overwrite, DecodeMode::Accumulate, DecodeMode::Subtract][usize::from(data[1] & 0x7f) % 3];
        let mut dst = codec_check::destination(n);
        let _ = codec_check::check_decode(kind, rest, &mut dst, mode);
    } else {
        let src: Vec<f32> = rest.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        check_encode(kind, &src);
    }
});
