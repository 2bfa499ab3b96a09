//! Per-chunk compression codecs for the wire, and error feedback.
//!
//! A codec turns a chunk of f32 partial sums into payload bytes and back. The engine always reduces in
//! f32; codecs only change what travels between ranks.
//!
//! | codec | payload | error bound per element, one encode/decode |
//! |---|---|---|
//! | [`RawF32Codec`] (`none`) | 4 B/elem, bit-exact | 0 |
//! | [`Fp16Codec`] | 2 B/elem IEEE binary16, round-to-nearest-even | `|x|·2⁻¹¹` for `2⁻¹⁴ ≤ |x| ≤ 65504`, `2⁻²⁵` below; overflow to ±inf above 65519 |
//! | [`Bf16Codec`] | 2 B/elem bfloat16, round-to-nearest-even | `|x|·2⁻⁸` for `|x| ≥ 2⁻¹²⁶` (full f32 range), `2⁻¹³⁴` below |
//! | [`Int8Codec`] | 4 B scale + 1 B/elem, symmetric per-chunk scale `max|x|/127`; a NaN scale marks a non-finite chunk | `max|x|/254 · (1 + 2⁻¹³) + 2⁻¹⁴³` (over the chunk), for every finite chunk |
//! | [`TopKCodec`] | 4 B count + 8 B per kept (u32 index, f32 value) | kept values exact; every dropped `|x|` ≤ the smallest kept `|x|` |
//!
//! Invariants:
//! - Decoding validates the payload length against the element count (and top-k indices against the
//!   chunk), so a malformed payload is an error, never a silent partial result.
//! - No input panics a codec: not a tenant's chunk (any f32 bit pattern) in `encode` or
//!   [`encode_with_feedback`], not a peer's payload in `decode`. Every encoder's payload is accepted
//!   by its own decoder.
//! - Non-finite values are carried, not preserved exactly (gradients are expected to be finite, but
//!   an overflow must still reach every rank so that a loss scaler such as torch's `GradScaler`
//!   sees it and skips the step, as with an uncompressed allreduce): fp16/bf16 keep inf/NaN per
//!   element and round values beyond their range to ±inf (fp16 `|x| > 65519`, bf16 `|x|` from
//!   about 3.396e38); int8 turns a chunk holding an inf or a NaN into NaN for every element of the
//!   chunk (the NaN scale, [`Int8Codec`]); top-k ranks inf/NaN above every finite magnitude, so it
//!   keeps them first, as they are. A partial sum that overflows to inf is such a value on the next
//!   hop. Error feedback resets the residual of a chunk that was not finite to 0.
//! - The bf16/int8 loops and the fp16 decoder are branch-free per element so LLVM auto-vectorises them
//!   (int8's edge cases, non-finite, tiny and near-`f32::MAX` chunks, are decided once per chunk);
//!   the fp16 encoder uses the `half` crate's slice conversion (F16C / FEAT_FP16 when detected at run
//!   time), checked bit for bit against the scalar reference. Measured by the
//!   `ringside-collective-bench codecs` command.
//!
//! Error feedback ([`encode_with_feedback`]): the sender adds the residual left over from the previous
//! time it sent these element positions, encodes, and keeps `input + residual − decoded` as the new
//! residual. Over steps, the sum of what was transmitted equals the sum of the inputs minus the current
//! residual, so compression error does not accumulate.

use crate::wire::FrameError;
use half::slice::HalfFloatSliceExt;

/// Which codec a plan asks for. `TopK.ratio` is the kept fraction in (0, 1]. This is the tenant wire
/// type [`ringside_client::Codec`] itself (one definition: a hint's `compression` is a plan's codec
/// without conversion); it is serialised as its command-line spelling (`"int8"`, `"topk:0.1"`).
pub use ringside_client::Codec as CodecKind;

/// The id of `kind` carried in [`crate::wire::FrameHeader::codec`] and in the control header.
pub fn wire_id(kind: CodecKind) -> u8 {
    match kind {
        CodecKind::None => 0,
        CodecKind::Fp16 => 1,
        CodecKind::Bf16 => 2,
        CodecKind::Int8 => 3,
        CodecKind::TopK { .. } => 4,
    }
}

/// The codec a [`wire_id`] names; `ratio` is the top-k ratio (ignored by the others). `None` for
/// an unknown id. The ratio is not validated here.
pub fn from_wire_id(id: u8, ratio: f32) -> Option<CodecKind> {
    Some(match id {
        0 => CodecKind::None,
        1 => CodecKind::Fp16,
        2 => CodecKind::Bf16,
        3 => CodecKind::Int8,
        4 => CodecKind::TopK { ratio },
        _ => return None,
    })
}

/// The codec object for `kind`.
pub fn for_kind(kind: CodecKind) -> Box<dyn ChunkCodec + Send + Sync> {
    match kind {
        CodecKind::None => Box::new(RawF32Codec),
        CodecKind::Fp16 => Box::new(Fp16Codec),
        CodecKind::Bf16 => Box::new(Bf16Codec),
        CodecKind::Int8 => Box::new(Int8Codec),
        CodecKind::TopK { ratio } => Box::new(TopKCodec { ratio }),
    }
}

/// How a decoded value is applied to the destination element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeMode {
    /// `dst = decoded` (allgather / broadcast).
    Overwrite,
    /// `dst += decoded` (reduction).
    Accumulate,
    /// `dst -= decoded` (computing an error-feedback residual).
    Subtract,
}

/// One wire codec. Implementations are stateless; error feedback lives with the caller.
pub trait ChunkCodec {
    fn kind(&self) -> CodecKind;
    /// Payload bytes for `elems` elements: exact for fixed-size codecs, an upper bound for top-k.
    fn max_encoded_len(&self, elems: usize) -> usize;
    /// Appends the payload for `src` to `out`.
    fn encode(&self, src: &[f32], out: &mut Vec<u8>);
    /// Decodes a payload of exactly `dst.len()` elements and applies it to `dst`.
    fn decode(&self, payload: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError>;
    /// The smallest finite `|x|` this codec may decode as ±inf (`f32::INFINITY`: none does). Below
    /// it, a finite chunk decodes to finite values within a finite distance of it, which lets
    /// [`encode_with_feedback`] skip checking the residual.
    fn overflows_from(&self) -> f32 {
        f32::INFINITY
    }
}

#[inline(always)]
fn apply<const MODE: u8>(d: &mut f32, v: f32) {
    match MODE {
        0 => *d = v,
        1 => *d += v,
        _ => *d -= v,
    }
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), FrameError> {
    if expected == got {
        Ok(())
    } else {
        Err(FrameError::PayloadLength { what, expected, got })
    }
}

macro_rules! dispatch_mode {
    ($mode:expr, $f:ident ( $($arg:expr),* )) => {
        match $mode {
            DecodeMode::Overwrite => $f::<0>($($arg),*),
            DecodeMode::Accumulate => $f::<1>($($arg),*),
            DecodeMode::Subtract => $f::<2>($($arg),*),
        }
    };
}

// ---------------------------------------------------------------- none (raw f32)

/// Lossless: little-endian f32.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawF32Codec;

fn raw_decode<const M: u8>(p: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(p.chunks_exact(4)) {
        apply::<M>(d, f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    }
}

impl ChunkCodec for RawF32Codec {
    fn kind(&self) -> CodecKind {
        CodecKind::None
    }
    fn max_encoded_len(&self, elems: usize) -> usize {
        elems * 4
    }
    fn encode(&self, src: &[f32], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + src.len() * 4, 0);
        for (o, &x) in out[start..].chunks_exact_mut(4).zip(src) {
            o.copy_from_slice(&x.to_le_bytes());
        }
    }
    fn decode(&self, p: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError> {
        check_len("f32 chunk", dst.len() * 4, p.len())?;
        dispatch_mode!(mode, raw_decode(p, dst));
        Ok(())
    }
}

// ---------------------------------------------------------------- fp16

/// f32 → IEEE binary16 bits, round to nearest even, branch-free (after F. Giesen's
/// `float_to_half_fast3_rtne`). Overflow gives ±inf, NaN gives a quiet NaN that keeps the top 10
/// payload bits (what F16C's `vcvtps2ph` and the `half` crate produce, so this scalar reference and the
/// codec's slice path agree bit for bit on every input).
#[inline(always)]
pub fn f32_to_f16_bits(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7fff_ffff;
    let inf_nan = if a > 0x7f80_0000 { 0x7e00 | ((a >> 13) & 0x3ff) } else { 0x7c00 };
    // Subnormal results: adding a magic float aligns the 10 mantissa bits at the bottom and the FPU
    // does the round-to-nearest-even for us.
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let sub = (f32::from_bits(a) + f32::from_bits(DENORM_MAGIC)).to_bits().wrapping_sub(DENORM_MAGIC);
    let mant_odd = (a >> 13) & 1;
    let norm = a.wrapping_add(0xc800_0000u32.wrapping_add(0xfff)).wrapping_add(mant_odd) >> 13;
    let o = if a >= 0x4780_0000 {
        inf_nan
    } else if a < 0x3880_0000 {
        sub
    } else {
        norm
    };
    (o | sign) as u16
}

/// IEEE binary16 bits → f32 (exact), branch-free (after F. Giesen's `half_to_float_fast5`): shift
/// exponent and mantissa into f32 position and rescale by 2¹¹² (which also normalises subnormals);
/// anything that lands at or above 2¹⁶ was inf/NaN and gets the all-ones exponent.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    const SCALE: f32 = f32::from_bits((254 - 15) << 23); // 2^112
    let f = f32::from_bits((h & 0x7fff) << 13) * SCALE;
    let inf_nan = if f >= 65536.0 { 0x7f80_0000 } else { 0 };
    f32::from_bits(f.to_bits() | inf_nan | ((h & 0x8000) << 16))
}

/// IEEE binary16 on the wire.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp16Codec;

/// Elements per fp16 staging block (2 KiB of f16 on the stack, L1-resident).
const FP16_BLOCK: usize = 1024;

/// Encodes with `half`'s slice conversion (F16C `vcvtps2ph` on x86, FEAT_FP16 on aarch64, detected at
/// run time; a portable round-to-nearest-even fallback otherwise). The payload is a byte buffer at any
/// alignment (it follows a frame header), so the conversion writes an aligned stack block that a plain
/// vectorised loop copies out.
fn fp16_encode(src: &[f32], out: &mut [u8]) {
    let mut h = [half::f16::ZERO; FP16_BLOCK];
    for (s, o) in src.chunks(FP16_BLOCK).zip(out.chunks_mut(2 * FP16_BLOCK)) {
        let h = &mut h[..s.len()];
        h.convert_from_f32_slice(s);
        for (o, x) in o.chunks_exact_mut(2).zip(h.iter()) {
            o.copy_from_slice(&x.to_bits().to_le_bytes());
        }
    }
}

/// Decodes with the portable [`f16_bits_to_f32`] (it vectorises to ~9 GB/s here, as fast as F16C's
/// `vcvtph2ps` through `half`, and keeps signalling-NaN payloads bit for bit). Two passes per block:
/// gather the little-endian u16s into an aligned stack buffer, then convert. Fused into one loop, LLVM
/// split each u16 into its two bytes and gathered them one at a time (2 GB/s).
fn fp16_decode<const M: u8>(p: &[u8], dst: &mut [f32]) {
    let mut h = [0u16; FP16_BLOCK];
    for (d, c) in dst.chunks_mut(FP16_BLOCK).zip(p.chunks(2 * FP16_BLOCK)) {
        let h = &mut h[..d.len()];
        for (x, b) in h.iter_mut().zip(c.chunks_exact(2)) {
            *x = u16::from_le_bytes([b[0], b[1]]);
        }
        for (d, &x) in d.iter_mut().zip(h.iter()) {
            apply::<M>(d, f16_bits_to_f32(x));
        }
    }
}

impl ChunkCodec for Fp16Codec {
    fn kind(&self) -> CodecKind {
        CodecKind::Fp16
    }
    fn max_encoded_len(&self, elems: usize) -> usize {
        elems * 2
    }
    fn encode(&self, src: &[f32], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + src.len() * 2, 0);
        fp16_encode(src, &mut out[start..]);
    }
    fn decode(&self, p: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError> {
        check_len("fp16 chunk", dst.len() * 2, p.len())?;
        dispatch_mode!(mode, fp16_decode(p, dst));
        Ok(())
    }
    fn overflows_from(&self) -> f32 {
        65520.0 // rounds to 2^16, one step above 65504
    }
}

// ---------------------------------------------------------------- bf16

/// f32 → bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN.
#[inline(always)]
pub fn f32_to_bf16_bits(f: f32) -> u16 {
    let x = f.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x40;
    (if (x & 0x7fff_ffff) > 0x7f80_0000 { nan } else { rounded }) as u16
}

/// bfloat16 bits → f32 (exact).
#[inline(always)]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// A bfloat16 element of a user buffer (`--dtype bf16`). Its bytes can be viewed in place
/// (zerocopy), as the managed host link sends buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    pub fn from_f32(f: f32) -> Self {
        Bf16(f32_to_bf16_bits(f))
    }
    pub fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self.0)
    }
}

/// bfloat16 on the wire.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bf16Codec;

fn bf16_decode<const M: u8>(p: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(p.chunks_exact(2)) {
        apply::<M>(d, bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])));
    }
}

impl ChunkCodec for Bf16Codec {
    fn kind(&self) -> CodecKind {
        CodecKind::Bf16
    }
    fn max_encoded_len(&self, elems: usize) -> usize {
        elems * 2
    }
    fn encode(&self, src: &[f32], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + src.len() * 2, 0);
        for (o, &x) in out[start..].chunks_exact_mut(2).zip(src) {
            o.copy_from_slice(&f32_to_bf16_bits(x).to_le_bytes());
        }
    }
    fn decode(&self, p: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError> {
        check_len("bf16 chunk", dst.len() * 2, p.len())?;
        dispatch_mode!(mode, bf16_decode(p, dst));
        Ok(())
    }
    fn overflows_from(&self) -> f32 {
        f32::from_bits(0x7f7f_8000) // about 3.396e38: half-way to 2^128 rounds up from 0x7f7f
    }
}

// ---------------------------------------------------------------- int8

/// Symmetric int8 with one f32 scale per chunk: `q = round(x · 127 / max|x|)`, `x̂ = q · scale` with
/// `scale ≈ max|x|/127`.
///
/// Payload: the scale (f32, little endian), then one `i8` per element. A finite scale ≥ 0 (−0.0
/// included) decodes element `i` as `q[i] · scale`. A NaN scale (any NaN bit pattern; the encoder
/// writes [`INT8_NONFINITE_SCALE`] and zero bytes) marks a chunk that was not finite: every element
/// decodes as NaN, so an inf or NaN a tenant's gradient held reaches every rank as NaN, as an
/// uncompressed allreduce would carry it (as inf or NaN), and a framework's overflow check (torch's
/// `GradScaler`) sees it. A `+inf` scale (what encoders before the NaN scale wrote for a chunk with an
/// infinity) reads the same as NaN. A negative scale (−inf included) is malformed and refused.
///
/// Error bound for a finite chunk, `m = max|x|` (the whole finite range, subnormals included):
/// `|x − x̂| ≤ m/254 · (1 + 2⁻¹³) + 2⁻¹⁴³`. The relative term is the half quantisation step plus f32
/// rounding of the scale, its inverse and the product (at most `m · 6 · 2⁻²⁴`, under the `2⁻¹³`);
/// the absolute term, 64 subnormal steps, is the rounding of a subnormal scale
/// (`m < 127 · 2⁻¹²⁶`, about 1.5e-36; for `m ≤ 63.5 · 2⁻¹⁴⁹` the scale rounds to 0 and the chunk
/// decodes as zeros). Two edges are handled once per chunk, outside the element loop: where
/// `127 / m` overflows f32 (`m < 127 / f32::MAX`, about 3.7e-37) the chunk is quantised scaled up by
/// 2⁶⁴ (exact), and where `127 · scale` would round up to infinity (`m` within a few ulps of
/// `f32::MAX`) the scale is lowered by one ulp, so every finite chunk decodes to finite values.
#[derive(Clone, Copy, Debug, Default)]
pub struct Int8Codec;

/// The scale int8's encoder writes for a chunk holding an inf or a NaN: the canonical quiet NaN.
pub const INT8_NONFINITE_SCALE: f32 = f32::NAN;

/// Largest |x| over the chunk, computed on the bit patterns (for non-negative floats the integer order
/// is the float order), which vectorises where an f32 max-reduction would not. NaN if any element is
/// NaN (its magnitude bits are above infinity's), else infinity if any element is infinite.
#[inline]
fn max_abs(src: &[f32]) -> f32 {
    let m = src.iter().fold(0u32, |m, &x| m.max(x.to_bits() & 0x7fff_ffff));
    f32::from_bits(m)
}

/// Power of two a tiny chunk is multiplied by before quantising, so that `127 / max|x|` is finite.
const INT8_TINY_PRESCALE: f32 = 18_446_744_073_709_551_616.0; // 2^64

/// `q = round(x · inv)` into `out`, with `x` first multiplied by [`INT8_TINY_PRESCALE`] when `TINY`.
/// Adding 1.5·2²³ rounds to nearest even and leaves the integer in the low mantissa bits (for
/// |y| < 2²²), so the conversion is integer arithmetic that vectorises on plain SSE2. The caller
/// makes `|x · inv| ≤ 127` (up to f32 rounding, which still rounds to 127), so no clamp is needed.
#[inline(always)]
fn int8_quantize<const TINY: bool>(src: &[f32], inv: f32, out: &mut [u8]) {
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: i32 = 0x4b40_0000;
    for (o, &x) in out.iter_mut().zip(src) {
        let x = if TINY { x * INT8_TINY_PRESCALE } else { x };
        let q = ((x * inv + ROUND).to_bits() as i32).wrapping_sub(ROUND_BITS);
        *o = q as u8;
    }
}

fn int8_decode<const M: u8>(q: &[u8], scale: f32, dst: &mut [f32]) {
    for (d, &b) in dst.iter_mut().zip(q) {
        apply::<M>(d, f32::from(b as i8) * scale);
    }
}

impl ChunkCodec for Int8Codec {
    fn kind(&self) -> CodecKind {
        CodecKind::Int8
    }
    fn max_encoded_len(&self, elems: usize) -> usize {
        4 + elems
    }
    fn encode(&self, src: &[f32], out: &mut Vec<u8>) {
        let m = max_abs(src);
        let start = out.len();
        out.resize(start + 4 + src.len(), 0);
        let (head, q) = out[start..].split_at_mut(4);
        if !m.is_finite() {
            // An inf or a NaN: the NaN scale, and zero bytes (the decoder ignores them).
            head.copy_from_slice(&INT8_NONFINITE_SCALE.to_le_bytes());
            return;
        }
        let mut scale = m / 127.0;
        if (127.0 * scale).is_infinite() {
            // m near f32::MAX: 127 · (m/127) rounds up past f32::MAX. One ulp less decodes finite, and
            // still within the bound (the error grows by at most 127 ulps of the scale).
            scale = f32::from_bits(scale.to_bits() - 1);
        }
        head.copy_from_slice(&scale.to_le_bytes());
        let inv = 127.0 / m;
        if inv.is_finite() {
            int8_quantize::<false>(src, inv, q);
        } else if m > 0.0 {
            // m < 127 / f32::MAX: quantise the chunk scaled by 2^64 (exact) with the inverse of the
            // scaled maximum, the same q without the overflow.
            int8_quantize::<true>(src, 127.0 / (m * INT8_TINY_PRESCALE), q);
        }
        // m == 0: every q is 0, as resized.
    }
    fn decode(&self, p: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError> {
        check_len("int8 chunk", 4 + dst.len(), p.len())?;
        let scale = f32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        if scale < 0.0 {
            return Err(FrameError::MalformedPayload { what: "int8 scale is negative" });
        }
        // A NaN scale decodes every element as NaN through the product itself (q · NaN, q = 0
        // included); +inf reads as NaN too (q · inf would give ±inf and, for q = 0, NaN).
        let scale = if scale == f32::INFINITY { f32::NAN } else { scale };
        dispatch_mode!(mode, int8_decode(&p[4..], scale, dst));
        Ok(())
    }
}

// ---------------------------------------------------------------- top-k

/// Keeps the `ceil(ratio · n)` largest-magnitude elements of the chunk as (index, value) pairs with
/// strictly increasing indices; the rest decode as 0 (and go to the residual under error feedback).
#[derive(Clone, Copy, Debug)]
pub struct TopKCodec {
    pub ratio: f32,
}

impl TopKCodec {
    /// How many elements of an `elems`-element chunk are kept.
    pub fn kept(&self, elems: usize) -> usize {
        if elems == 0 {
            return 0;
        }
        ((f64::from(self.ratio) * elems as f64).ceil() as usize).clamp(1, elems)
    }
}

fn topk_decode<const M: u8>(pairs: &[u8], dst: &mut [f32]) -> Result<(), FrameError> {
    let mut next_min = 0usize;
    let mut idx_ok = true;
    // Validate every index before touching dst, so a bad payload changes nothing.
    for c in pairs.chunks_exact(8) {
        let i = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
        idx_ok &= i >= next_min && i < dst.len();
        next_min = i + 1;
    }
    if !idx_ok {
        return Err(FrameError::MalformedPayload { what: "top-k indices out of range or not increasing" });
    }
    if M == 0 {
        dst.fill(0.0);
    }
    for c in pairs.chunks_exact(8) {
        let i = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
        apply::<M>(&mut dst[i], f32::from_le_bytes([c[4], c[5], c[6], c[7]]));
    }
    Ok(())
}

/// Magnitude histogram key width: the top 12 of the 31 magnitude bits (4096 bins).
const TOPK_SHIFT: u32 = 19;
const TOPK_BINS: usize = 1 << (31 - TOPK_SHIFT);
/// Elements per block of the histogram and compaction passes.
const TOPK_BLOCK: usize = 256;

/// For `1 ≤ k ≤ src.len()`: the histogram bin (top 12 magnitude bits) holding the k-th largest
/// magnitude among `f32_bits` of the elements, how many elements lie in higher bins, and how many in
/// that bin.
fn topk_threshold_bin<T: Copy>(src: &[T], f32_bits: impl Fn(T) -> u32, k: usize) -> (u32, usize, usize) {
    // Two passes per block: the bin numbers (a shift, vectorised) into a small u16 buffer, then the
    // counting, spread over four sub-histograms so runs of equal bins do not serialise on one counter
    // (store-to-load forwarding). `(bits << 1) >> 20` drops the sign bit; masking the u16 with
    // `TOPK_BINS - 1` lets the compiler drop the bounds checks.
    let mut hist = [[0u32; TOPK_BINS]; 4];
    let mut bins = [0u16; TOPK_BLOCK];
    for blk in src.chunks(TOPK_BLOCK) {
        let bins = &mut bins[..blk.len()];
        for (b, x) in bins.iter_mut().zip(blk) {
            *b = ((f32_bits(*x) << 1) >> (TOPK_SHIFT + 1)) as u16;
        }
        let mut quads = bins.chunks_exact(4);
        for q in &mut quads {
            hist[0][usize::from(q[0]) & (TOPK_BINS - 1)] += 1;
            hist[1][usize::from(q[1]) & (TOPK_BINS - 1)] += 1;
            hist[2][usize::from(q[2]) & (TOPK_BINS - 1)] += 1;
            hist[3][usize::from(q[3]) & (TOPK_BINS - 1)] += 1;
        }
        for &b in quads.remainder() {
            hist[0][usize::from(b) & (TOPK_BINS - 1)] += 1;
        }
    }
    let mut above = 0usize;
    for b in (0..TOPK_BINS).rev() {
        let n = hist.iter().map(|h| h[b] as usize).sum::<usize>();
        if above + n >= k {
            return (b as u32, above, n);
        }
        above += n;
    }
    unreachable!("k <= src.len()")
}

/// A kept element as it goes on the wire: index in the low half, f32 bits in the high half (so its
/// little-endian bytes are the (u32 index, f32 value) pair).
#[inline(always)]
fn topk_pair(i: usize, x: f32) -> u64 {
    (i as u64 & 0xffff_ffff) | (u64::from(x.to_bits()) << 32)
}

/// The selection order of a pair: magnitude, then the lower index first (so the largest key wins).
#[inline(always)]
fn topk_key(pair: u64) -> u64 {
    (pair & 0x7fff_ffff_0000_0000) | (!pair & 0xffff_ffff)
}

/// Every element with `|x|` bits ≥ `lo`, as wire pairs in index order. Branch-free: each element is
/// written at the cursor, which only advances for those kept; the stack stage has room for a whole
/// block past any cursor, so the index mask removes the bounds check.
fn topk_compact_at_least(src: &[f32], lo: u32) -> Vec<u64> {
    let mut sup: Vec<u64> = Vec::new();
    let mut stage = [0u64; 2 * TOPK_BLOCK];
    for (bi, blk) in src.chunks(TOPK_BLOCK).enumerate() {
        let base = bi * TOPK_BLOCK;
        let mut pos = 0usize;
        for (j, &x) in blk.iter().enumerate() {
            stage[pos & (2 * TOPK_BLOCK - 1)] = topk_pair(base + j, x);
            pos += usize::from((x.to_bits() & 0x7fff_ffff) >= lo);
        }
        sup.extend_from_slice(&stage[..pos]);
    }
    sup
}

/// Sample stride for the threshold estimate (odd and prime, so periodic data is still sampled across
/// its period).
const TOPK_SAMPLE_STRIDE: usize = 13;

/// A magnitude floor (a histogram-bin boundary) that, judging by a strided sample, at least `k`
/// elements reach with a safety margin while few others do; `None` for chunks too small to sample.
/// Only a speed hint: the caller checks the count and falls back to the exact bin.
fn topk_sampled_floor(src: &[f32], k: usize) -> Option<u32> {
    let n = src.len();
    if n < 64 * TOPK_BLOCK {
        return None;
    }
    let sample: Vec<f32> = src.iter().step_by(TOPK_SAMPLE_STRIDE).copied().collect();
    let s = sample.len();
    let want = (k * s).div_ceil(n);
    let want = want + want / 8 + 32;
    if want >= s {
        return Some(0);
    }
    Some(topk_threshold_bin(&sample, f32::to_bits, want).0 << TOPK_SHIFT)
}

impl ChunkCodec for TopKCodec {
    fn kind(&self) -> CodecKind {
        CodecKind::TopK { ratio: self.ratio }
    }
    fn max_encoded_len(&self, elems: usize) -> usize {
        4 + 8 * self.kept(elems)
    }
    fn encode(&self, src: &[f32], out: &mut Vec<u8>) {
        let k = self.kept(src.len());
        out.reserve(4 + 8 * k + 8);
        out.extend_from_slice(&(k as u32).to_le_bytes());
        if k == 0 {
            return;
        }
        // Magnitude order on the bit patterns (for non-negative floats the integer order is the float
        // order); ties broken by the lower index, so encoding is deterministic. As one key per element,
        // `topk_key` = (|x| bits, !index): the kept elements are exactly those whose key is at least
        // the k-th largest key `T`. Radix select without sorting:
        // 1. a magnitude floor from a histogram (top 12 magnitude bits) of a 1-in-13 sample, with a
        //    margin; small chunks, or a floor that turns out to keep fewer than k, use the exact bin
        //    holding rank k from a histogram of the whole chunk;
        // 2. one branch-free compaction pass keeps, in index order, every element at or above the
        //    floor (a superset of the answer, typically little more than k elements);
        // 3. a histogram of the superset finds the bin holding rank k, `T` is selected among that
        //    bin's elements, and a second branch-free compaction keeps the keys ≥ `T`, in index order.
        let lo = match topk_sampled_floor(src, k) {
            Some(lo) => lo,
            None => topk_threshold_bin(src, f32::to_bits, k).0 << TOPK_SHIFT,
        };
        let mut sup = topk_compact_at_least(src, lo);
        if sup.len() < k {
            // The sample overestimated the threshold: fall back to the exact bin.
            sup = topk_compact_at_least(src, topk_threshold_bin(src, f32::to_bits, k).0 << TOPK_SHIFT);
        }
        let start = out.len();
        out.resize(start + 8 * k, 0);
        let mut kept = sup.len();
        if kept > k {
            // The k-th largest key among the superset's elements: histogram of the (few) superset
            // magnitudes, then a selection inside the bin holding rank k.
            let (bin, above, _) = topk_threshold_bin(&sup, |p| (p >> 32) as u32, k);
            let (lo, hi) = (u64::from(bin) << TOPK_SHIFT, (u64::from(bin) + 1) << TOPK_SHIFT);
            let mut cand: Vec<u64> =
                sup.iter().map(|&p| topk_key(p)).filter(|&key| (lo..hi).contains(&(key >> 32))).collect();
            let (_, &mut t, _) = cand.select_nth_unstable_by(k - above - 1, |a, b| b.cmp(a));
            let mut pos = 0usize;
            for i in 0..sup.len() {
                let p = sup[i];
                sup[pos] = p;
                pos += usize::from(topk_key(p) >= t);
            }
            kept = pos;
        }
        debug_assert_eq!(kept, k);
        for (o, p) in out[start..].chunks_exact_mut(8).zip(&sup[..k]) {
            o.copy_from_slice(&p.to_le_bytes());
        }
    }
    fn decode(&self, p: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError> {
        if p.len() < 4 {
            return Err(FrameError::PayloadLength { what: "top-k chunk", expected: 4, got: p.len() });
        }
        let k = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
        if k > dst.len() {
            return Err(FrameError::MalformedPayload { what: "top-k count exceeds chunk length" });
        }
        check_len("top-k chunk", 4 + 8 * k, p.len())?;
        dispatch_mode!(mode, topk_decode(&p[4..], dst))
    }
}

// ---------------------------------------------------------------- error feedback

/// Encodes `src + residual` into `out` (appending) and replaces `residual` with what the receiver will
/// not see: `src + residual − decode(payload)`. `scratch` is reused between calls.
///
/// If that residual is not finite somewhere (the chunk held an inf or a NaN, `src + residual`
/// overflowed, or the codec made a finite value infinite: fp16 from 65520), the whole chunk's
/// residual becomes 0 instead. Kept, it would make these positions inf or NaN in every later step
/// (`x + inf`, then `inf − inf`), so a tenant whose loss scaler skips the overflowing step would
/// never get a finite gradient there again; reset, the next step compresses cleanly. The largest
/// `|src + residual|` comes with the sum (same pass); only a chunk that is not finite or reaches
/// the codec's [`ChunkCodec::overflows_from`] has its residual checked, in one more pass.
pub fn encode_with_feedback(
    codec: &dyn ChunkCodec,
    src: &[f32],
    residual: &mut [f32],
    scratch: &mut Vec<f32>,
    out: &mut Vec<u8>,
) {
    debug_assert_eq!(src.len(), residual.len());
    scratch.clear();
    let mut m = 0u32; // max |src + residual| on the bit patterns, as `max_abs`
    scratch.extend(src.iter().zip(residual.iter()).map(|(a, b)| {
        let x = a + b;
        m = m.max(x.to_bits() & 0x7fff_ffff);
        x
    }));
    let m = f32::from_bits(m);
    let start = out.len();
    codec.encode(scratch, out);
    residual.copy_from_slice(scratch);
    // Every codec's encoder writes a payload its decoder accepts, for any input (int8 marks a
    // non-finite chunk with a NaN scale, which decodes; the others cannot refuse their own layout):
    // the unit tests and the `ipu_codec` fuzz target check this for every f32 bit pattern.
    codec
        .decode(&out[start..], residual, DecodeMode::Subtract)
        .expect("a payload we just encoded decodes");
    if m < codec.overflows_from() {
        debug_assert!(max_abs(residual).is_finite(), "{}: a finite chunk below overflows_from left a non-finite residual", codec.kind());
    } else if !max_abs(residual).is_finite() {
        // m is NaN, infinite or at least overflows_from.
        residual.fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(codec: &dyn ChunkCodec, src: &[f32]) -> Vec<f32> {
        let mut p = Vec::new();
        codec.encode(src, &mut p);
        assert!(p.len() <= codec.max_encoded_len(src.len()));
        let mut d = vec![f32::NAN; src.len()];
        codec.decode(&p, &mut d, DecodeMode::Overwrite).unwrap();
        d
    }

    fn f16_reference(h: u16) -> f64 {
        let s = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((h >> 10) & 0x1f);
        let m = f64::from(h & 0x3ff);
        match e {
            0 => s * m * 2f64.powi(-24),
            31 => {
                if m == 0.0 {
                    s * f64::INFINITY
                } else {
                    f64::NAN
                }
            }
            _ => s * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn f16_decode_matches_reference_for_all_65536_values_and_roundtrips() {
        for h in 0..=u16::MAX {
            let f = f16_bits_to_f32(h);
            let r = f16_reference(h);
            if r.is_nan() {
                assert!(f.is_nan(), "{h:#06x}");
                assert!(f16_bits_to_f32(f32_to_f16_bits(f)).is_nan());
            } else {
                assert_eq!(f64::from(f), r, "{h:#06x}");
                assert_eq!(f32_to_f16_bits(f), h, "{h:#06x}");
            }
        }
    }

    /// f32 inputs that cover every sign/exponent/top-10-mantissa combination, each with the low 13
    /// bits that decide rounding set to below-half, exactly half (tie), above half, and a few others.
    fn f16_rounding_probe() -> Vec<f32> {
        let lows = [0u32, 1, 0x0fff, 0x1000, 0x1001, 0x1555, 0x1fff];
        (0..1u32 << 19).flat_map(|hi| lows.iter().map(move |&lo| f32::from_bits(hi << 13 | lo))).collect()
    }

    #[test]
    fn fp16_codec_matches_the_scalar_reference_bit_for_bit() {
        // Encode: the codec's slice path (F16C/NEON when present), half's portable fallback
        // (`from_f32_const`, what runs without those extensions) and the scalar reference agree on every
        // probe, including subnormals, overflow, ±inf and NaN payloads.
        let src = f16_rounding_probe();
        let mut p = Vec::new();
        Fp16Codec.encode(&src, &mut p);
        for (i, (&x, c)) in src.iter().zip(p.chunks_exact(2)).enumerate() {
            let h = u16::from_le_bytes([c[0], c[1]]);
            assert_eq!(h, f32_to_f16_bits(x), "codec, #{i}: {:#010x}", x.to_bits());
            assert_eq!(half::f16::from_f32_const(x).to_bits(), h, "fallback, {:#010x}", x.to_bits());
        }
        // Decode: all 65,536 values, in every mode, at an odd payload offset (the payload follows a header).
        let mut p = vec![0xa5u8];
        p.extend((0..=u16::MAX).flat_map(u16::to_le_bytes));
        let expect: Vec<f32> = (0..=u16::MAX).map(f16_bits_to_f32).collect();
        let mut d = vec![0f32; expect.len()];
        Fp16Codec.decode(&p[1..], &mut d, DecodeMode::Overwrite).unwrap();
        for (h, (a, b)) in d.iter().zip(&expect).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{h:#06x}");
        }
        let base: Vec<f32> = (0..expect.len()).map(|i| (i % 13) as f32 - 6.0).collect();
        for (mode, op) in [(DecodeMode::Accumulate, 1.0f32), (DecodeMode::Subtract, -1.0)] {
            let mut d = base.clone();
            Fp16Codec.decode(&p[1..], &mut d, mode).unwrap();
            for (h, ((a, b), e)) in d.iter().zip(&base).zip(&expect).enumerate() {
                let want = b + op * e;
                assert!(a.to_bits() == want.to_bits() || (a.is_nan() && want.is_nan()), "{mode:?} {h:#06x}");
            }
        }
    }

    #[test]
    fn f16_encode_overflow_and_ties() {
        assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(65519.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00);
        assert_eq!(f32_to_f16_bits(1e10), 0x7c00);
        assert_eq!(f32_to_f16_bits(-1e10), 0xfc00);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: rounds to even (1.0).
        assert_eq!(f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    }

    #[test]
    fn bf16_exact_values_and_nan() {
        for v in [0.0f32, -0.0, 1.0, -2.5, 256.0, 2f32.powi(100)] {
            assert_eq!(bf16_bits_to_f32(f32_to_bf16_bits(v)).to_bits(), v.to_bits());
        }
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16_bits(1.0 + 2f32.powi(-8)), f32_to_bf16_bits(1.0)); // tie to even
        assert_eq!(bf16_bits_to_f32(f32_to_bf16_bits(257.0)), 256.0);
    }

    #[test]
    fn wire_ids_round_trip() {
        for k in [CodecKind::None, CodecKind::Fp16, CodecKind::Bf16, CodecKind::Int8, CodecKind::TopK { ratio: 0.3 }] {
            assert_eq!(from_wire_id(wire_id(k), 0.3), Some(k));
            assert_eq!(for_kind(k).kind(), k);
        }
        assert_eq!(from_wire_id(5, 0.3), None);
    }

    #[test]
    fn codec_names_parse_and_print() {
        for s in ["none", "fp16", "bf16", "int8", "topk:0.1", "topk:1"] {
            let k: CodecKind = s.parse().unwrap();
            assert_eq!(k.to_string().parse::<CodecKind>().unwrap(), k);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("{s:?}"));
            assert_eq!(serde_json::from_str::<CodecKind>(&json).unwrap(), k);
        }
        for s in ["", "zip", "topk:0", "topk:1.5", "topk:x", "topk:NaN"] {
            assert!(s.parse::<CodecKind>().is_err(), "{s}");
        }
    }

    #[test]
    fn wrong_payload_lengths_are_rejected() {
        let mut d = vec![0f32; 10];
        for k in [CodecKind::None, CodecKind::Fp16, CodecKind::Bf16, CodecKind::Int8] {
            let c = for_kind(k);
            let mut p = Vec::new();
            c.encode(&[1.0; 11], &mut p);
            assert!(c.decode(&p, &mut d, DecodeMode::Accumulate).is_err(), "{k}");
        }
        assert!(d.iter().all(|&x| x == 0.0));
        let t = TopKCodec { ratio: 0.5 };
        // index 10 out of range for a 10-element chunk.
        let mut p = 1u32.to_le_bytes().to_vec();
        p.extend_from_slice(&10u32.to_le_bytes());
        p.extend_from_slice(&1f32.to_le_bytes());
        assert!(t.decode(&p, &mut d, DecodeMode::Overwrite).is_err());
        // repeated index
        let mut p = 2u32.to_le_bytes().to_vec();
        for _ in 0..2 {
            p.extend_from_slice(&3u32.to_le_bytes());
            p.extend_from_slice(&1f32.to_le_bytes());
        }
        assert!(t.decode(&p, &mut d, DecodeMode::Overwrite).is_err());
        assert!(d.iter().all(|&x| x == 0.0));
        // Negative int8 scales are malformed, −inf and −MAX included (a NaN scale is not: below).
        for scale in [-1.0f32, f32::NEG_INFINITY, -f32::MAX, -f32::from_bits(1)] {
            let mut p = scale.to_le_bytes().to_vec();
            p.resize(14, 7);
            assert!(Int8Codec.decode(&p, &mut d, DecodeMode::Accumulate).is_err(), "{scale}");
        }
        assert!(d.iter().all(|&x| x == 0.0));
    }

    /// The int8 payload `scale | q…` with every q the same.
    fn int8_payload(scale: f32, q: i8, n: usize) -> Vec<u8> {
        let mut p = scale.to_le_bytes().to_vec();
        p.resize(4 + n, q as u8);
        p
    }

    #[test]
    fn int8_chunk_holding_inf_or_nan_encodes_a_nan_scale_and_decodes_as_nan() {
        let chunks: [&[f32]; 6] = [
            &[1.0, f32::NAN, -2.0],
            &[f32::INFINITY],
            &[0.0, f32::NEG_INFINITY, 3.0, 1e-30],
            &[f32::from_bits(0xffc0_0001), 5.0], // a negative NaN with a payload
            &[f32::from_bits(0x7f80_0001), f32::MAX], // a signalling NaN
            &[f32::INFINITY, f32::NAN, f32::NEG_INFINITY],
        ];
        for src in chunks {
            let mut p = vec![0xa5]; // at an offset, after other bytes
            Int8Codec.encode(src, &mut p);
            assert_eq!(p.len(), 1 + Int8Codec.max_encoded_len(src.len()));
            assert_eq!(f32::from_le_bytes([p[1], p[2], p[3], p[4]]).to_bits(), INT8_NONFINITE_SCALE.to_bits(), "{src:?}");
            assert!(p[5..].iter().all(|&q| q == 0), "{src:?}");
            for mode in [DecodeMode::Overwrite, DecodeMode::Accumulate, DecodeMode::Subtract] {
                let mut d = vec![1.0f32; src.len()];
                Int8Codec.decode(&p[1..], &mut d, mode).unwrap();
                assert!(d.iter().all(|x| x.is_nan()), "{src:?} {mode:?}: {d:?}");
            }
        }
        // A peer's NaN scale with any bytes and any NaN bits, or +inf (what encoders before the NaN
        // scale wrote for a chunk with an infinity), decodes as NaN too; −0.0 is a zero scale.
        for (scale, q) in [(f32::NAN, 127i8), (f32::from_bits(0xffff_ffff), -128), (f32::INFINITY, 0), (f32::INFINITY, 5)] {
            let mut d = vec![2.0f32; 9];
            Int8Codec.decode(&int8_payload(scale, q, 9), &mut d, DecodeMode::Accumulate).unwrap();
            assert!(d.iter().all(|x| x.is_nan()), "scale {scale}, q {q}: {d:?}");
        }
        let mut d = vec![2.0f32; 9];
        Int8Codec.decode(&int8_payload(-0.0, 100, 9), &mut d, DecodeMode::Overwrite).unwrap();
        assert!(d.iter().all(|&x| x == 0.0));
    }

    /// The documented int8 bound, in f64 (exact for the difference of two f32).
    fn int8_bound(m: f32) -> f64 {
        f64::from(m) / 254.0 * (1.0 + 2f64.powi(-13)) + 2f64.powi(-143)
    }

    fn assert_int8_within_bound(src: &[f32]) {
        let d = roundtrip(&Int8Codec, src);
        let m = max_abs(src);
        for (x, y) in src.iter().zip(&d) {
            assert!(y.is_finite(), "{x:e} -> {y:e} (max {m:e})");
            let err = (f64::from(*x) - f64::from(*y)).abs();
            assert!(err <= int8_bound(m), "{x:e} -> {y:e} (max {m:e}): error {err:e}, bound {:e}", int8_bound(m));
        }
    }

    /// Chunks whose largest |x| is `m`: m itself (both signs) and fractions of it that land on and
    /// between the quantisation steps.
    fn int8_probe(m: f32) -> Vec<f32> {
        let mut v = vec![m, -m, 0.0];
        for k in 1..=20 {
            let f = k as f32 / 20.0;
            v.push(m * f);
            v.push(-m * (f * 0.997));
            v.push(m * ((k as f32 + 0.5) / 127.0)); // half-way between steps
        }
        v
    }

    #[test]
    fn int8_huge_chunks_decode_finite_within_the_bound() {
        // 127 · (f32::MAX / 127) rounds up to infinity: the encoder lowers the scale by one ulp.
        // (docs/fuzzing.md, finding 1: the fuzzer's input was one f32::MAX.)
        let below_max = |k: u32| f32::from_bits(f32::MAX.to_bits() - k);
        for m in [f32::MAX, below_max(1), below_max(7), below_max(1000), 3.0e38, 1.7e38, 1e36] {
            assert_int8_within_bound(&int8_probe(m));
            assert_int8_within_bound(&[m]);
            assert_int8_within_bound(&[-m, 1.0]);
            let mut p = Vec::new();
            Int8Codec.encode(&[m], &mut p);
            let scale = f32::from_le_bytes([p[0], p[1], p[2], p[3]]);
            assert!((127.0 * scale).is_finite(), "{m:e}: scale {scale:e}");
        }
    }

    #[test]
    fn int8_tiny_chunks_are_within_the_bound() {
        // Below 127 / f32::MAX (about 3.7e-37), 127 / max|x| overflows: the encoder quantises the chunk
        // scaled by 2^64 instead; below 127 · 2^-126 the scale itself is subnormal. Every exponent from
        // the smallest subnormal up to 2^-100, several mantissas each, and the fuzzer's input (one
        // 2.35e-38: docs/fuzzing.md, finding 2).
        let mut ms = vec![f32::from_bits(0x0100_0000), 127.0 / f32::MAX, f32::MIN_POSITIVE, 127.0 * f32::MIN_POSITIVE];
        for bits in 1u32..64 {
            ms.push(f32::from_bits(bits));
        }
        for e in 0u32..28 {
            for mant in [0u32, 1, 0x2a_aaab, 0x40_0000, 0x7f_ffff] {
                ms.push(f32::from_bits((e << 23) | mant.max(u32::from(e == 0))));
            }
        }
        for m in ms {
            assert!(m > 0.0 && m < 1e-29);
            let next = f32::from_bits(m.to_bits() + 1);
            for src in [int8_probe(m), vec![m], vec![-m], vec![m, next * 0.5, -f32::from_bits(1)]] {
                assert_int8_within_bound(&src);
            }
            // Not all zeros, unless the scale itself rounds to 0 (m ≤ 63.5 subnormal steps).
            let d = roundtrip(&Int8Codec, &[m]);
            assert_eq!(d[0] == 0.0, m.to_bits() <= 63, "{m:e} -> {:e}", d[0]);
        }
    }

    #[test]
    fn a_peer_int8_chunk_that_overflows_decodes_to_inf_and_reencodes_as_nan() {
        // Scale f32::MAX with q = 127 is well formed: its reading is ±inf (docs/fuzzing.md, finding 3).
        // The rank's sum is then infinite, and re-encoding it (the engine's `finalize_chunk`) gives the
        // NaN scale, which decodes.
        let mut sum = vec![1.0f32, -2.0, 3.0];
        let mut p = int8_payload(f32::MAX, 127, 3);
        p[5] = (-127i8) as u8;
        Int8Codec.decode(&p, &mut sum, DecodeMode::Accumulate).unwrap();
        assert_eq!(sum, [f32::INFINITY, f32::NEG_INFINITY, f32::INFINITY]);
        let d = roundtrip(&Int8Codec, &sum);
        assert!(d.iter().all(|x| x.is_nan()));
        let mut residual = vec![0f32; 3];
        let mut out = Vec::new();
        encode_with_feedback(&Int8Codec, &sum, &mut residual, &mut Vec::new(), &mut out);
        assert_eq!(residual, [0.0; 3]);
    }

    fn lossy_codecs() -> [CodecKind; 5] {
        [CodecKind::Fp16, CodecKind::Bf16, CodecKind::Int8, CodecKind::TopK { ratio: 0.2 }, CodecKind::TopK { ratio: 1.0 }]
    }

    #[test]
    fn error_feedback_resets_the_residual_of_a_chunk_that_was_not_finite() {
        // A chunk holding an inf or a NaN, or a value the codec turns into one (fp16 above 65519,
        // bf16 and a sum near f32::MAX), leaves residual 0 for the whole chunk; the next, finite
        // step then encodes exactly as with a fresh residual. Kept, `x + inf` and then `inf − inf`
        // would send NaN at that position in every later step.
        let n = 17;
        let clean: Vec<f32> = (0..n).map(|i| ((i * 7) % 5) as f32 * 0.3 - 0.61).collect();
        for kind in lossy_codecs() {
            let c = for_kind(kind);
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0e5, f32::MAX] {
                let mut residual = vec![0f32; n];
                let mut scratch = Vec::new();
                let mut out = Vec::new();
                // A finite step first, so the residual is not zero already.
                encode_with_feedback(c.as_ref(), &clean, &mut residual, &mut scratch, &mut out);
                let mut chunk = clean.clone();
                chunk[3] = bad;
                chunk[4] = if bad == f32::MAX { f32::MAX } else { chunk[4] };
                out.clear();
                encode_with_feedback(c.as_ref(), &chunk, &mut residual, &mut scratch, &mut out);
                let mut sent = vec![0f32; n];
                c.decode(&out, &mut sent, DecodeMode::Overwrite).unwrap();
                let mut want_residual = vec![0f32; n];
                if sent.iter().all(|x| x.is_finite()) {
                    // Finite on the wire (f32::MAX with int8 or top-k, 1e5 but with fp16): an ordinary residual.
                    assert!(bad == f32::MAX || (bad == 1.0e5 && kind != CodecKind::Fp16), "{kind} {bad:e}: {sent:?}");
                    assert!(residual.iter().all(|r| r.is_finite()), "{kind} {bad:e}: {residual:?}");
                    continue;
                }
                assert!(!sent[3].is_finite(), "{kind} {bad:e}: {sent:?}");
                if kind == CodecKind::Int8 {
                    assert!(sent.iter().all(|x| x.is_nan()), "{kind} {bad:e}: {sent:?}");
                }
                assert_eq!(residual, want_residual, "{kind} {bad:e}");
                // The next step compresses as if it were the first.
                out.clear();
                encode_with_feedback(c.as_ref(), &clean, &mut residual, &mut scratch, &mut out);
                let mut fresh = Vec::new();
                encode_with_feedback(c.as_ref(), &clean, &mut want_residual, &mut scratch, &mut fresh);
                assert_eq!(out, fresh, "{kind} {bad:e}");
                assert_eq!(residual, want_residual, "{kind} {bad:e}");
            }
        }
    }

    #[test]
    fn overflows_from_is_the_smallest_magnitude_that_decodes_infinite() {
        // Error feedback checks the residual only for chunks reaching it: it must not be too high.
        for kind in [CodecKind::Fp16, CodecKind::Bf16] {
            let c = for_kind(kind);
            let t = c.overflows_from();
            let below = f32::from_bits(t.to_bits() - 1);
            for sign in [1.0f32, -1.0] {
                assert!(roundtrip(c.as_ref(), &[sign * below])[0].is_finite(), "{kind}");
                assert!(roundtrip(c.as_ref(), &[sign * t])[0].is_infinite(), "{kind}");
            }
        }
        for kind in [CodecKind::None, CodecKind::Int8, CodecKind::TopK { ratio: 0.5 }] {
            let c = for_kind(kind);
            assert_eq!(c.overflows_from(), f32::INFINITY, "{kind}");
            assert!(roundtrip(c.as_ref(), &[f32::MAX, -f32::MAX, 1.0]).iter().all(|x| x.is_finite()), "{kind}");
        }
    }

    /// Any f32 bit pattern, with NaNs, infinities, the extremes and subnormals made likely.
    fn any_bits() -> impl Strategy<Value = f32> {
        prop_oneof![
            any::<u32>().prop_map(f32::from_bits),
            prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -f32::MAX, f32::from_bits(1), 0.0, -0.0]),
            (0u32..0x0080_0000).prop_map(f32::from_bits),
            (0x7f00_0000u32..0x7f80_0000).prop_map(f32::from_bits),
            finite(),
        ]
    }

    #[test]
    fn every_codec_decodes_what_it_encodes_for_any_bits() {
        // Every exponent and sign with a few mantissas, NaNs and infinities included, beside a 1.0
        // (the proptest `no_input_panics_a_codec_and_the_encoder_output_decodes` covers chunks).
        for kind in lossy_codecs().into_iter().chain([CodecKind::None]) {
            let c = for_kind(kind);
            for hi in 0u32..512 {
                for lo in [0u32, 1, 0x40_0000, 0x7f_ffff] {
                    let x = f32::from_bits(hi << 23 | lo);
                    let d = roundtrip(c.as_ref(), &[x, 1.0]);
                    match kind {
                        CodecKind::None | CodecKind::TopK { ratio: 1.0 } => assert_eq!(d[0].to_bits(), x.to_bits()),
                        CodecKind::Int8 => assert!(d.iter().all(|y| y.is_finite() == x.is_finite()), "{x:e}: {d:?}"),
                        _ => assert!(x.is_finite() || !d[0].is_finite(), "{kind} {x:e}: {d:?}"),
                    }
                    let mut residual = [0f32; 2];
                    encode_with_feedback(c.as_ref(), &[x, 1.0], &mut residual, &mut Vec::new(), &mut Vec::new());
                    assert!(residual.iter().all(|r| r.is_finite()), "{kind} {x:e}: {residual:?}");
                }
            }
        }
    }

    /// Full sort by (magnitude descending, index ascending), keep k, emit by index.
    fn topk_sort_reference(src: &[f32], k: usize) -> Vec<u8> {
        let mut idx: Vec<u32> = (0..src.len() as u32).collect();
        idx.sort_by_key(|&i| (std::cmp::Reverse(src[i as usize].to_bits() & 0x7fff_ffff), i));
        idx.truncate(k);
        idx.sort_unstable();
        let mut want = (k as u32).to_le_bytes().to_vec();
        for i in idx {
            want.extend_from_slice(&i.to_le_bytes());
            want.extend_from_slice(&src[i as usize].to_le_bytes());
        }
        want
    }

    #[test]
    fn topk_large_chunks_match_the_sort_reference() {
        // Chunks large enough for the sampled threshold estimate, including data that fools the
        // sample in both directions (the sampled positions hold the largest / the smallest values).
        let n = 70_001;
        let stride = TOPK_SAMPLE_STRIDE;
        let inputs: Vec<Vec<f32>> = vec![
            (0..n).map(|i| ((i as f32 * 0.618).sin() * 3.0) * (1.0 + (i % 7) as f32)).collect(),
            vec![0.0; n],
            (0..n).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }).collect(),
            (0..n).map(|i| ((i * 7919) % 7) as f32 - 3.0).collect(),
            (0..n).map(|i| if i % stride == 0 { 100.0 + (i % 5) as f32 } else { (i % 11) as f32 }).collect(),
            (0..n).map(|i| if i % stride == 0 { 0.5 } else { 50.0 + (i % 3) as f32 }).collect(),
            (0..n).map(|i| f32::from_bits(0x3f80_0000 + ((i as u32).wrapping_mul(2_654_435_761) >> 12))).collect(),
        ];
        for (which, src) in inputs.iter().enumerate() {
            for ratio in [0.0001f32, 0.01, 0.1, 0.3, 0.5, 0.9, 1.0] {
                let c = TopKCodec { ratio };
                let mut got = Vec::new();
                c.encode(src, &mut got);
                assert!(got == topk_sort_reference(src, c.kept(src.len())), "input {which}, ratio {ratio}");
            }
        }
    }

    fn finite() -> impl Strategy<Value = f32> {
        prop_oneof![-1.0e4f32..1.0e4, -1.0f32..1.0, -1.0e-3f32..1.0e-3, Just(0.0f32)]
    }

    proptest! {
        #[test]
        fn none_is_exact(src in proptest::collection::vec(any::<f32>().prop_filter("finite", |x| x.is_finite()), 0..300)) {
            let d = roundtrip(&RawF32Codec, &src);
            prop_assert!(d.iter().zip(&src).all(|(a, b)| a.to_bits() == b.to_bits()));
        }

        #[test]
        fn fp16_error_bound(src in proptest::collection::vec(-65504.0f32..65504.0, 0..300)) {
            let d = roundtrip(&Fp16Codec, &src);
            for (x, y) in src.iter().zip(&d) {
                let bound = (x.abs() * 2f32.powi(-11)).max(2f32.powi(-25));
                prop_assert!((x - y).abs() <= bound, "{} -> {} (bound {})", x, y, bound);
            }
        }

        #[test]
        fn fp16_is_nearest(x in -65504.0f32..65504.0) {
            let h = f32_to_f16_bits(x);
            let err = (f16_bits_to_f32(h) - x).abs();
            for n in [h.wrapping_add(1), h.wrapping_sub(1)] {
                let v = f16_bits_to_f32(n);
                if v.is_finite() && (n & 0x7fff) < 0x7c00 {
                    prop_assert!(err <= (v - x).abs());
                }
            }
        }

        #[test]
        fn bf16_error_bound(src in proptest::collection::vec(any::<f32>().prop_filter("finite", |x| x.is_finite() && x.abs() < 3.0e38), 0..300)) {
            let d = roundtrip(&Bf16Codec, &src);
            for (x, y) in src.iter().zip(&d) {
                // Relative below 2^-8 for normal values; half a subnormal step (2^-134) below 2^-126.
                prop_assert!((x - y).abs() <= (x.abs() * 2f32.powi(-8)).max(f32::from_bits(1 << 15)), "{} -> {}", x, y);
            }
        }

        #[test]
        fn int8_error_bound(src in proptest::collection::vec(finite(), 0..300)) {
            let d = roundtrip(&Int8Codec, &src);
            let m = src.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (x, y) in src.iter().zip(&d) {
                prop_assert!((f64::from(*x) - f64::from(*y)).abs() <= int8_bound(m), "{} -> {} (max {})", x, y, m);
            }
        }

        #[test]
        fn int8_error_bound_over_the_whole_finite_range(m_bits in 0u32..0x7f80_0000,
                                                        fracs in proptest::collection::vec(-1.0f32..=1.0, 0..64)) {
            // A chunk of any magnitude, from subnormal to f32::MAX: m and fractions of it.
            let m = f32::from_bits(m_bits);
            let mut src: Vec<f32> = fracs.iter().map(|f| m * f).collect();
            src.push(if m_bits % 2 == 0 { m } else { -m });
            let d = roundtrip(&Int8Codec, &src);
            let m = max_abs(&src);
            for (x, y) in src.iter().zip(&d) {
                prop_assert!(y.is_finite());
                prop_assert!((f64::from(*x) - f64::from(*y)).abs() <= int8_bound(m), "{:e} -> {:e} (max {:e})", x, y, m);
            }
        }

        #[test]
        fn no_input_panics_a_codec_and_the_encoder_output_decodes(
            src in proptest::collection::vec(any_bits(), 0..80), which in 0usize..6, steps in 1usize..4) {
            let kind = lossy_codecs().into_iter().chain([CodecKind::None]).nth(which).unwrap();
            let c = for_kind(kind);
            let mut p = Vec::new();
            c.encode(&src, &mut p);
            prop_assert!(p.len() <= c.max_encoded_len(src.len()));
            let mut d = vec![0f32; src.len()];
            c.decode(&p, &mut d, DecodeMode::Overwrite).unwrap();
            if kind == CodecKind::Int8 {
                // NaN for the whole chunk iff it held an inf or a NaN; finite otherwise.
                let finite = src.iter().all(|x| x.is_finite());
                prop_assert!(d.iter().all(|y| y.is_finite() == finite && y.is_nan() != finite), "{:?} -> {:?}", src, d);
            }
            // Error feedback over a few steps of the same chunk: never a non-finite residual.
            let mut residual = vec![0f32; src.len()];
            let mut scratch = Vec::new();
            for _ in 0..steps {
                let mut out = Vec::new();
                encode_with_feedback(c.as_ref(), &src, &mut residual, &mut scratch, &mut out);
                prop_assert!(residual.iter().all(|r| r.is_finite()), "{:?}", residual);
            }
        }

        #[test]
        fn topk_keeps_the_largest(src in proptest::collection::vec(finite(), 0..300), ratio in 0.01f32..=1.0) {
            let c = TopKCodec { ratio };
            let d = roundtrip(&c, &src);
            let kept: Vec<usize> = (0..src.len()).filter(|&i| d[i] == src[i] && (src[i] != 0.0 || d[i] == 0.0)).collect();
            let nonzero_out = d.iter().filter(|&&y| y != 0.0).count();
            prop_assert!(nonzero_out <= c.kept(src.len()));
            let min_kept = (0..src.len()).filter(|&i| d[i] != 0.0).map(|i| src[i].abs()).fold(f32::INFINITY, f32::min);
            for i in 0..src.len() {
                prop_assert!(d[i] == 0.0 || d[i] == src[i]);
                if d[i] == 0.0 && nonzero_out == c.kept(src.len()) {
                    prop_assert!(src[i].abs() <= min_kept);
                }
            }
            prop_assert!(kept.len() >= nonzero_out);
            if ratio >= 1.0 { prop_assert_eq!(&d, &src); }
        }

        #[test]
        fn topk_matches_the_sort_reference(src in proptest::collection::vec(
            prop_oneof![finite(), (-3i32..=3).prop_map(|v| v as f32), Just(-0.0f32)], 0..600), ratio in 0.01f32..=1.0) {
            // Reference: full sort by (magnitude descending, index ascending), keep k, emit by index.
            let c = TopKCodec { ratio };
            let k = c.kept(src.len());
            let mut idx: Vec<u32> = (0..src.len() as u32).collect();
            idx.sort_by_key(|&i| (std::cmp::Reverse(src[i as usize].to_bits() & 0x7fff_ffff), i));
            idx.truncate(k);
            idx.sort_unstable();
            let mut want = (k as u32).to_le_bytes().to_vec();
            for i in idx {
                want.extend_from_slice(&i.to_le_bytes());
                want.extend_from_slice(&src[i as usize].to_le_bytes());
            }
            let mut got = vec![7u8];
            c.encode(&src, &mut got);
            prop_assert_eq!(&got[1..], &want[..]);
        }

        #[test]
        fn error_feedback_conserves_the_sum(steps in proptest::collection::vec(proptest::collection::vec(-10.0f32..10.0, 17), 1..8),
                                            which in 0usize..4) {
            let codec = for_kind([CodecKind::Fp16, CodecKind::Bf16, CodecKind::Int8, CodecKind::TopK { ratio: 0.2 }][which]);
            let mut residual = vec![0f32; 17];
            let mut scratch = Vec::new();
            let mut sent_total = vec![0f64; 17];
            let mut in_total = vec![0f64; 17];
            for s in &steps {
                let mut p = Vec::new();
                encode_with_feedback(codec.as_ref(), s, &mut residual, &mut scratch, &mut p);
                let mut d = vec![0f32; 17];
                codec.decode(&p, &mut d, DecodeMode::Overwrite).unwrap();
                for i in 0..17 { sent_total[i] += f64::from(d[i]); in_total[i] += f64::from(s[i]); }
            }
            // transmitted + residual == inputs, up to f32 rounding of the running residual.
            for i in 0..17 {
                let lhs = sent_total[i] + f64::from(residual[i]);
                prop_assert!((lhs - in_total[i]).abs() <= 1e-4 * (1.0 + in_total[i].abs()) * steps.len() as f64,
                    "elem {}: sent {} + residual {} vs {}", i, sent_total[i], residual[i], in_total[i]);
            }
        }
    }
}
