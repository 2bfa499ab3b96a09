//! The decoder check shared by `ipu_frame` (data frames) and `ipu_codec`: a payload either decodes
//! to exactly what a scalar reading of the layout in `ipu_firmware::codec`'s module docs gives, or
//! is an error that left the destination untouched ("a malformed payload is an error, never a
//! silent partial result").
use ipu_firmware::codec::{self, bf16_bits_to_f32, f16_bits_to_f32, DecodeMode};
use ipu_firmware::wire::FrameError;
use ipu_firmware::CodecKind;

fn le32(c: &[u8]) -> u32 {
    u32::from_le_bytes([c[0], c[1], c[2], c[3]])
}

/// Per element: the value the payload carries for it, if any (top-k leaves the others alone, or
/// zero under `Overwrite`). `None` when the payload does not follow the layout.
fn reference(kind: CodecKind, p: &[u8], n: usize) -> Option<Vec<Option<f32>>> {
    match kind {
        CodecKind::None => (p.len() == 4 * n).then(|| p.chunks_exact(4).map(|c| Some(f32::from_bits(le32(c)))).collect()),
        CodecKind::Fp16 => (p.len() == 2 * n).then(|| p.chunks_exact(2).map(|c| Some(f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])))).collect()),
        CodecKind::Bf16 => (p.len() == 2 * n).then(|| p.chunks_exact(2).map(|c| Some(bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])))).collect()),
        CodecKind::Int8 => {
            if p.len() != 4 + n {
                return None;
            }
            // A negative scale is refused; a NaN or +inf scale marks a chunk that was not finite
            // and reads as NaN everywhere.
            let scale = f32::from_bits(le32(p));
            if scale < 0.0 {
                return None;
            }
            let nonfinite = scale.is_nan() || scale == f32::INFINITY;
            Some(p[4..].iter().map(|&b| Some(if nonfinite { f32::NAN } else { f32::from(b as i8) * scale })).collect())
        }
        CodecKind::TopK { .. } => {
            let k = le32(p.get(..4)?) as usize;
            if k > n || p.len() != 4 + 8 * k {
                return None;
            }
            let mut out = vec![None; n];
            let mut next = 0usize;
            for c in p[4..].chunks_exact(8) {
                let i = le32(c) as usize;
                if i < next || i >= n {
                    return None;
                }
                out[i] = Some(f32::from_bits(le32(&c[4..])));
                next = i + 1;
            }
            Some(out)
        }
    }
}

/// Bitwise equal, or both NaN (a NaN's payload after arithmetic depends on operand order, which a
/// vectorised loop may change).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Decodes `payload` into `dst` with `kind`'s codec and checks the result against [`reference`].
pub fn check_decode(kind: CodecKind, payload: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError> {
    let before = dst.to_vec();
    let got = codec::for_kind(kind).decode(payload, dst, mode);
    let want = reference(kind, payload, before.len());
    match (&got, want) {
        (Err(e), None) => {
            assert!(before.iter().zip(dst.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "{kind}: a refused payload ({e}) changed the destination");
        }
        (Ok(()), Some(vals)) => {
            for (i, ((&b, &d), v)) in before.iter().zip(dst.iter()).zip(vals).enumerate() {
                let want = match (mode, v) {
                    (DecodeMode::Overwrite, v) => v.unwrap_or(0.0),
                    (_, None) => b,
                    (DecodeMode::Accumulate, Some(v)) => b + v,
                    (DecodeMode::Subtract, Some(v)) => b - v,
                };
                assert!(same(d, want), "{kind} {mode:?} element {i}: {b} became {d}, expected {want}");
            }
        }
        (Ok(()), None) => panic!("{kind}: accepted a payload of {} bytes for {} elements that breaks the layout", payload.len(), before.len()),
        (Err(e), Some(_)) => panic!("{kind}: refused a well-formed payload of {} bytes for {} elements: {e}", payload.len(), before.len()),
    }
    got
}

/// The codec of a wire id (`FrameHeader::codec`), top-k with a ratio that does not matter to
/// the decoder.
pub fn kind_of(id: u8) -> CodecKind {
    codec::from_wire_id(id % 5, 0.5).expect("ids 0..5 are codecs")
}

/// A destination with distinct, recognisable values (so an untouched element is told apart).
pub fn destination(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 97) as f32 - 48.5).collect()
}
