//! Frame layout on the wire: a fixed 40-byte [`FrameHeader`] followed by `payload_len` payload bytes.
//!
//! Invariants:
//! - Every byte that crosses a connection belongs to a frame; there is no other framing.
//! - A header is accepted only if its magic, version, kind and header checksum are valid and its
//!   `payload_len` is at most [`MAX_PAYLOAD`]. Anything else is garbage: the stream cannot be
//!   resynchronised, so the connection is declared failed (never skipped or reduced into a result).
//! - `seq` counts frames per directed (peer, channel) stream starting at 0 with the hello frame; the
//!   transport assigns it on send and checks it on receive, so a lost, duplicated or replayed frame is
//!   detected. `op` is the collective sequence number the engine checks for every data frame.
//! - All integers are little endian. Parsing is pure and bounds-checked over byte slices.
//! - The byte layouts are `#[repr(C)]` structs of single-byte and explicit little-endian fields
//!   ([`WireHeader`], [`WireHello`]) with zerocopy derives: no padding, alignment 1, and their sizes
//!   checked at compile time, so reading and writing them is a checked copy with no `unsafe` and no
//!   hand-kept offset table.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `b"RSG1"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RSG1");
/// Wire format version; bump on any incompatible change of the header or a payload layout.
/// 2: the control header grew from 48 to 56 bytes (`plan_held_until`, [`crate::plan::ControlHeader`]),
/// so a version-1 peer fails at hello with [`FrameError::UnsupportedVersion`] instead of a bad
/// control payload in its first collective.
pub const VERSION: u8 = 2;
/// Size of [`FrameHeader`] on the wire.
pub const HEADER_LEN: usize = 40;
/// Largest payload a receiver accepts (a chunk of 64 MiB f32 plus top-k overhead fits).
pub const MAX_PAYLOAD: u32 = 256 << 20;

/// The header exactly as it is on the wire: magic and version, the [`FrameHeader`] fields in
/// order, then the checksum (FNV-1a over the 36 bytes before it).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct WireHeader {
    pub magic: U32,
    pub version: u8,
    pub kind: u8,
    pub codec: u8,
    pub channel: u8,
    pub op: U64,
    pub seq: U32,
    pub payload_len: U32,
    pub elem_offset: U64,
    pub elem_count: U32,
    pub checksum: U32,
}

const _: () = assert!(std::mem::size_of::<WireHeader>() == HEADER_LEN);
/// Bytes the header checksum covers: everything before the checksum field.
const CHECKSUM_AT: usize = std::mem::offset_of!(WireHeader, checksum);
const _: () = assert!(CHECKSUM_AT == HEADER_LEN - 4);

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// First frame on every connection, both directions: [`Hello`].
    Hello = 1,
    /// Rank 0's per-collective control header: [`crate::plan::ControlHeader`].
    Control = 2,
    /// A chunk of buffer elements `[elem_offset, elem_offset + elem_count)` encoded with `codec`.
    Data = 3,
    /// Graceful close: the sender will send nothing more on this connection.
    Goodbye = 4,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Hello),
            2 => Some(Self::Control),
            3 => Some(Self::Data),
            4 => Some(Self::Goodbye),
            _ => None,
        }
    }
}

/// Why a header (or a payload) is garbage.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {got:#010x} (expected {MAGIC:#010x}); the peer is not a ringside rank or the stream lost sync")]
    BadMagic { got: u32 },
    #[error("unsupported wire version {got} (this build speaks {VERSION}); run the same ringside build on every rank")]
    UnsupportedVersion { got: u8 },
    #[error("unknown frame kind {got}")]
    UnknownKind { got: u8 },
    #[error("header checksum {got:#010x} does not match computed {computed:#010x}")]
    HeaderChecksum { got: u32, computed: u32 },
    #[error("payload length {len} exceeds the maximum {max}")]
    PayloadTooLong { len: u32, max: u32 },
    #[error("truncated: need {needed} bytes, have {got}")]
    Truncated { needed: usize, got: usize },
    #[error("payload length {got} does not match the {expected} bytes expected for {what}")]
    PayloadLength { what: &'static str, expected: usize, got: usize },
    #[error("malformed payload: {what}")]
    MalformedPayload { what: &'static str },
}

/// The fixed header in front of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    /// [`crate::codec::wire_id`] of the payload (data frames), 0 otherwise.
    pub codec: u8,
    pub channel: u8,
    /// Collective sequence number (0-based, per communicator).
    pub op: u64,
    /// Frame counter of this directed (peer, channel) stream; set by the transport.
    pub seq: u32,
    pub payload_len: u32,
    pub elem_offset: u64,
    pub elem_count: u32,
}

/// FNV-1a over the header bytes before the checksum field. Cheap, and enough to catch garbage
/// (TCP already checksums the bytes in flight; this catches peers that are not speaking our protocol).
pub fn header_checksum(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

impl FrameHeader {
    /// A header with everything but kind zeroed.
    pub fn new(kind: FrameKind) -> Self {
        Self { kind, codec: 0, channel: 0, op: 0, seq: 0, payload_len: 0, elem_offset: 0, elem_count: 0 }
    }

    /// The header's wire form, checksum included.
    pub fn to_wire(&self) -> WireHeader {
        let mut w = WireHeader {
            magic: MAGIC.into(),
            version: VERSION,
            kind: self.kind as u8,
            codec: self.codec,
            channel: self.channel,
            op: self.op.into(),
            seq: self.seq.into(),
            payload_len: self.payload_len.into(),
            elem_offset: self.elem_offset.into(),
            elem_count: self.elem_count.into(),
            checksum: 0.into(),
        };
        w.checksum = header_checksum(&w.as_bytes()[..CHECKSUM_AT]).into();
        w
    }

    /// Writes the header (with checksum) into `out[..HEADER_LEN]`.
    pub fn write(&self, out: &mut [u8]) {
        out[..HEADER_LEN].copy_from_slice(self.to_wire().as_bytes());
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Parses and validates a header. Checks magic first so that a stranger's bytes are reported as
    /// such rather than as a checksum error.
    pub fn parse(b: &[u8]) -> Result<Self, FrameError> {
        let (w, _) = WireHeader::ref_from_prefix(b).map_err(|_| FrameError::Truncated { needed: HEADER_LEN, got: b.len() })?;
        let magic = w.magic.get();
        if magic != MAGIC {
            return Err(FrameError::BadMagic { got: magic });
        }
        if w.version != VERSION {
            return Err(FrameError::UnsupportedVersion { got: w.version });
        }
        let got = w.checksum.get();
        let computed = header_checksum(&w.as_bytes()[..CHECKSUM_AT]);
        if got != computed {
            return Err(FrameError::HeaderChecksum { got, computed });
        }
        let kind = FrameKind::from_u8(w.kind).ok_or(FrameError::UnknownKind { got: w.kind })?;
        let payload_len = w.payload_len.get();
        if payload_len > MAX_PAYLOAD {
            return Err(FrameError::PayloadTooLong { len: payload_len, max: MAX_PAYLOAD });
        }
        Ok(Self {
            kind,
            codec: w.codec,
            channel: w.channel,
            op: w.op.get(),
            seq: w.seq.get(),
            payload_len,
            elem_offset: w.elem_offset.get(),
            elem_count: w.elem_count.get(),
        })
    }
}

/// A [`Hello`] payload as it is on the wire.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct WireHello {
    pub world: U32,
    pub rank: U32,
    pub channels: U32,
}

const _: () = assert!(std::mem::size_of::<WireHello>() == Hello::LEN);

/// Payload of a [`FrameKind::Hello`] frame: who is calling and what mesh it expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub world: u32,
    pub rank: u32,
    pub channels: u32,
}

impl Hello {
    pub const LEN: usize = 12;

    pub fn encode(&self) -> [u8; Self::LEN] {
        zerocopy::transmute!(WireHello { world: self.world.into(), rank: self.rank.into(), channels: self.channels.into() })
    }

    pub fn parse(b: &[u8]) -> Result<Self, FrameError> {
        let w = WireHello::read_from_bytes(b)
            .map_err(|_| FrameError::PayloadLength { what: "hello", expected: Self::LEN, got: b.len() })?;
        Ok(Self { world: w.world.get(), rank: w.rank.get(), channels: w.channels.get() })
    }

    /// A complete hello frame (header + payload) with the given channel and seq 0.
    pub fn frame(&self, channel: u8) -> Vec<u8> {
        let mut h = FrameHeader::new(FrameKind::Hello);
        h.channel = channel;
        h.payload_len = Self::LEN as u32;
        let mut v = h.to_bytes().to_vec();
        v.extend_from_slice(&self.encode());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameHeader {
        FrameHeader {
            kind: FrameKind::Data,
            codec: 3,
            channel: 2,
            op: 0x0102_0304_0506_0708,
            seq: 77,
            payload_len: 4096,
            elem_offset: 1 << 33,
            elem_count: 1024,
        }
    }

    /// The bytes on the wire, pinned: written from the layout in the module docs (magic, version,
    /// kind, codec, channel, op, seq, payload_len, elem_offset, elem_count, FNV-1a checksum; all
    /// little endian), not from this module's code.
    #[test]
    fn layout_is_pinned() {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(
            hex(&sample().to_bytes()),
            "525347310203030208070605040302014d00000000100000000000000200000000040000b73a8565"
        );
        assert_eq!(
            hex(&Hello { world: 5, rank: 3, channels: 2 }.frame(1)),
            "52534731020100010000000000000000000000000c0000000000000000000000000000001cae1403050000000300000002000000"
        );
    }

    /// A hello from a version-1 build (48-byte control header) is refused as such, with a valid
    /// checksum, so the mix of builds is reported at connect time rather than mid-collective.
    #[test]
    fn version_1_is_refused() {
        let mut b = Hello { world: 5, rank: 3, channels: 2 }.frame(1);
        b[4] = 1;
        let sum = header_checksum(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(FrameHeader::parse(&b), Err(FrameError::UnsupportedVersion { got: 1 }));
    }

    #[test]
    fn header_roundtrips() {
        let h = sample();
        assert_eq!(FrameHeader::parse(&h.to_bytes()), Ok(h));
    }

    #[test]
    fn bad_magic_is_reported_before_checksum() {
        let mut b = sample().to_bytes();
        b[0] ^= 0xff;
        assert!(matches!(FrameHeader::parse(&b), Err(FrameError::BadMagic { .. })));
    }

    #[test]
    fn any_flipped_bit_after_magic_is_rejected() {
        let good = sample().to_bytes();
        for byte in 4..HEADER_LEN {
            for bit in 0..8 {
                let mut b = good;
                b[byte] ^= 1 << bit;
                assert!(FrameHeader::parse(&b).is_err(), "flip byte {byte} bit {bit} accepted");
            }
        }
    }

    #[test]
    fn oversized_payload_rejected() {
        let mut h = sample();
        h.payload_len = MAX_PAYLOAD + 1;
        assert_eq!(
            FrameHeader::parse(&h.to_bytes()),
            Err(FrameError::PayloadTooLong { len: MAX_PAYLOAD + 1, max: MAX_PAYLOAD })
        );
    }

    #[test]
    fn truncated_and_unknown_kind() {
        assert!(matches!(FrameHeader::parse(&[0u8; 10]), Err(FrameError::Truncated { .. })));
        let mut b = sample().to_bytes();
        b[5] = 9; // kind
        let sum = header_checksum(&b[..36]);
        b[36..40].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(FrameHeader::parse(&b), Err(FrameError::UnknownKind { got: 9 }));
    }

    #[test]
    fn hello_roundtrips_and_checks_length() {
        let h = Hello { world: 5, rank: 3, channels: 2 };
        assert_eq!(Hello::parse(&h.encode()), Ok(h));
        assert!(Hello::parse(&[0u8; 11]).is_err());
        let f = h.frame(1);
        let hdr = FrameHeader::parse(&f).unwrap();
        assert_eq!(hdr.kind, FrameKind::Hello);
        assert_eq!(Hello::parse(&f[HEADER_LEN..]), Ok(h));
    }
}
