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
//! | [`Int8Codec`] | 4 B scale + 1 B/elem, symmetric per-chunk scale `max|x|/127` | `max|x| / 254` (over the chunk) |
//! | [`TopKCodec`] | 4 B count + 8 B per kept (u32 index, f32 value) | kept values exact; every dropped `|x|` ≤ the smallest kept `|x|` |
//!
//! Invariants:
//! - Decoding validates the payload length against the element count (and top-k indices against the
//!   chunk), so a malformed payload is an error, never a silent partial result.
//! - Non-finite inputs are not supported by the lossy codecs (fp16/bf16 keep inf/NaN; int8 and top-k
//!   may turn a chunk containing them into NaN). Gradients are expected to be finite.
//! - The bf16/int8 loops and the fp16 decoder are branch-free per element so LLVM auto-vectorises them;
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
}

// ---------------------------------------------------------------- int8

/// Symmetric int8 with one f32 scale per chunk: `q = round(x · 127 / max|x|)`, `x̂ = q · max|x| / 127`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Int8Codec;

/// Largest |x| over the chunk, computed on the bit patterns (for non-negative floats the integer order
/// is the float order), which vectorises where an f32 max-reduction would not.
#[inline]
fn max_abs(src: &[f32]) -> f32 {
    let m = src.iter().fold(0u32, |m, &x| m.max(x.to_bits() & 0x7fff_ffff));
    f32::from_bits(m)
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
        let scale = m / 127.0;
        let inv = if m > 0.0 { 127.0 / m } else { 0.0 };
        out.extend_from_slice(&scale.to_le_bytes());
        let start = out.len();
        out.resize(start + src.len(), 0);
        // Adding 1.5·2²³ rounds to nearest even and leaves the integer in the low mantissa bits
        // (for |y| < 2²²), so the conversion is integer arithmetic that vectorises on plain SSE2.
        // |x · inv| ≤ 127 by construction of inv, so no clamp is needed for finite inputs.
        const ROUND: f32 = 12_582_912.0;
        const ROUND_BITS: i32 = 0x4b40_0000;
        for (o, &x) in out[start..].iter_mut().zip(src) {
            let q = ((x * inv + ROUND).to_bits() as i32).wrapping_sub(ROUND_BITS);
            *o = q as u8;
        }
    }
    fn decode(&self, p: &[u8], dst: &mut [f32], mode: DecodeMode) -> Result<(), FrameError> {
        check_len("int8 chunk", 4 + dst.len(), p.len())?;
        let scale = f32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        if !scale.is_finite() || scale < 0.0 {
            return Err(FrameError::MalformedPayload { what: "int8 scale is negative or not finite" });
        }
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
pub fn encode_with_feedback(
    codec: &dyn ChunkCodec,
    src: &[f32],
    residual: &mut [f32],
    scratch: &mut Vec<f32>,
    out: &mut Vec<u8>,
) {
    debug_assert_eq!(src.len(), residual.len());
    scratch.clear();
    scratch.extend(src.iter().zip(residual.iter()).map(|(a, b)| a + b));
    let start = out.len();
    codec.encode(scratch, out);
    residual.copy_from_slice(scratch);
    codec
        .decode(&out[start..], residual, DecodeMode::Subtract)
        .expect("a payload we just encoded decodes");
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
        let mut p = f32::NAN.to_le_bytes().to_vec();
        p.resize(14, 0);
        assert!(Int8Codec.decode(&p, &mut d, DecodeMode::Overwrite).is_err());
        let mut p = (-1.0f32).to_le_bytes().to_vec();
        p.resize(14, 0);
        assert!(Int8Codec.decode(&p, &mut d, DecodeMode::Overwrite).is_err());
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
                prop_assert!((x - y).abs() <= m / 254.0 * 1.0001 + f32::MIN_POSITIVE, "{} -> {} (max {})", x, y, m);
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
