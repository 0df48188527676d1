//! The probe `fanout gen` puts in every packet's payload and `fanout sub` reads back: which
//! stream, which packet, and when it was sent (same-host monotonic clock), so a receiver can
//! measure loss, reordering and one-way latency over UDP, TCP and HTTP alike.
//!
//! Layout (big-endian), at the start of the RTP payload:
//! `"FOUT" | stream: u32 | seq: u64 | sent_ns: u64` = 24 bytes, then filler.

pub const MAGIC: [u8; 4] = *b"FOUT";
pub const LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub stream: u32,
    pub seq: u64,
    pub sent_ns: u64,
}

impl Probe {
    /// Writes the probe into `out` (at least [`LEN`] bytes); returns [`LEN`].
    pub fn write_to(&self, out: &mut [u8]) -> usize {
        out[..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&self.stream.to_be_bytes());
        out[8..16].copy_from_slice(&self.seq.to_be_bytes());
        out[16..24].copy_from_slice(&self.sent_ns.to_be_bytes());
        LEN
    }

    /// Reads a probe from the start of `buf`, if one is there.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let b = buf.get(..LEN)?;
        if b[..4] != MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Self {
            stream: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            seq: u64_at(8),
            sent_ns: u64_at(16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(stream: u32, seq: u64, sent_ns: u64, tail in proptest::collection::vec(any::<u8>(), 0..16)) {
            let p = Probe { stream, seq, sent_ns };
            let mut buf = vec![0u8; LEN];
            p.write_to(&mut buf);
            buf.extend_from_slice(&tail);
            prop_assert_eq!(Probe::parse(&buf), Some(p));
        }

        #[test]
        fn parse_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = Probe::parse(&buf);
        }
    }

    #[test]
    fn rejects_short_or_foreign() {
        assert_eq!(Probe::parse(b"FOUT"), None);
        assert_eq!(Probe::parse(&[0u8; 24]), None);
    }
}
