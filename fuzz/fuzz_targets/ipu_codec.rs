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
//!   `max|x|/254 · (1 + 2⁻¹³) + 2⁻¹⁴³` over the whole finite range, top-k keeps exactly
//!   `kept(n)` values unchanged and drops none larger than the smallest it kept; int8 decodes a
//!   chunk holding an inf or a NaN as NaN everywhere; and error feedback leaves
//!   `input + old residual − decoded` as the new residual, or 0 for the whole chunk where that
//!   is not finite somewhere (so the residual is always finite).
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
/// the unit tests' bounds and domains (`codec.rs`), `None` outside the domain. Int8's holds for
/// every finite chunk; its error is computed in f64 (exact for the difference of two f32).
fn within_bound(kind: CodecKind, x: f32, y: f32, m: f32) -> Option<bool> {
    let err = (x - y).abs();
    match kind {
        CodecKind::None => Some(x.to_bits() == y.to_bits()),
        CodecKind::Fp16 => (x.abs() <= 65504.0).then(|| err <= (x.abs() * 2f32.powi(-11)).max(2f32.powi(-25))),
        CodecKind::Bf16 => (x.abs() < 3.0e38).then(|| err <= (x.abs() * 2f32.powi(-8)).max(f32::from_bits(1 << 15))),
        CodecKind::Int8 => {
            let err = (f64::from(x) - f64::from(y)).abs();
            Some(err <= f64::from(m) / 254.0 * (1.0 + 2f64.powi(-13)) + 2f64.powi(-143))
        }
        CodecKind::TopK { .. } => Some(y.to_bits() == x.to_bits() || y == 0.0),
    }
}

/// The residual `encode_with_feedback` leaves: `chunk − sent` per element, or 0 for the whole
/// chunk where that is not finite somewhere.
fn expected_residual(chunk: &[f32], sent: &[f32]) -> Vec<f32> {
    let r: Vec<f32> = chunk.iter().zip(sent).map(|(x, y)| x - y).collect();
    if r.iter().all(|x| x.is_finite()) {
        r
    } else {
        vec![0.0; r.len()]
    }
}

fn check_encode(kind: CodecKind, src: &[f32]) {
    let c = codec::for_kind(kind);
    let n = src.len();

    // Error feedback, as the engine sends: two steps, the second with the first one's residual.
    // `encode_with_feedback` decodes what it encoded and panics if it cannot.
    let mut residual = vec![0f32; n];
    let (mut scratch, mut out, mut sent) = (Vec::new(), Vec::new(), vec![0f32; n]);
    for step in 0..2 {
        let chunk: Vec<f32> = src.iter().zip(&residual).map(|(x, r)| x + r).collect();
        out.clear();
        encode_with_feedback(c.as_ref(), src, &mut residual, &mut scratch, &mut out);
        c.decode(&out, &mut sent, DecodeMode::Overwrite).expect("encode_with_feedback decoded it");
        let want = expected_residual(&chunk, &sent);
        for i in 0..n {
            assert!(residual[i].to_bits() == want[i].to_bits(), "{kind}: step {step} residual {i}: {} for {}", residual[i], want[i]);
        }
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

    if kind == CodecKind::Int8 {
        // NaN for the whole chunk iff it held an inf or a NaN; finite otherwise.
        let finite = src.iter().all(|x| x.is_finite());
        assert!(d.iter().all(|y| y.is_finite() == finite && y.is_nan() != finite), "{kind}: a chunk (finite: {finite}) decoded as {d:?}");
    }
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
