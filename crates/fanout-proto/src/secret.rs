//! Secrets on the wire: comparing them (tokens, passwords, Digest responses) in time that
//! does not depend on where they first differ, so a network peer cannot find one byte at a
//! time; identifiers nobody can predict ([`IdGen`]); and Digest nonces that expire and cannot
//! be replayed ([`Nonces`]).
//!
//! Both generators are AES-128 under a key the caller draws from the system's randomness
//! (this crate reads no device and no clock): the block cipher is a permutation, so a
//! counter gives ids that never repeat, and without the key one id says nothing of another.

use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use std::collections::HashMap;

/// Whether `a == b`, looking at every byte of both (only the lengths can leak).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    // `black_box` keeps the compiler from turning the fold into an early-exit comparison.
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

/// Unpredictable, unique identifiers (RTSP session ids): AES-128 of a counter.
pub struct IdGen {
    cipher: aes::Aes128,
    next: u128,
}

impl IdGen {
    /// `key`: 16 bytes from a CSPRNG (the caller's `getrandom`).
    pub fn new(key: [u8; 16]) -> Self {
        Self { cipher: aes::Aes128::new(&key.into()), next: 0 }
    }

    /// The next id: 96 unpredictable bits as 24 upper-case hex digits (RFC 2326's
    /// session-id wants at least 8 characters; clients take any length).
    pub fn next_hex(&mut self) -> String {
        let mut block = self.next.to_be_bytes().into();
        self.next = self.next.wrapping_add(1);
        self.cipher.encrypt_block(&mut block);
        block[..12].iter().map(|b| format!("{b:02X}")).collect()
    }
}

impl std::fmt::Debug for IdGen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdGen(..)")
    }
}

/// How long a Digest nonce is good for; after it, the client is told `stale=true` and
/// answers the new one without asking its user.
pub const NONCE_LIFETIME_MS: u64 = 10 * 60_000;
/// Nonces whose counts (`nc`) are kept at once: only answers with the right password add
/// one, and expired ones go first.
const NONCES_KEPT: usize = 65_536;
/// Marks a nonce as ours once decrypted (with the time window, a forged one passes with odds
/// of about 2^-45; nothing is gained by forging one anyway: the answer needs the password).
const NONCE_MAGIC: u16 = 0xfa0e;

/// What a Digest nonce is worth now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceCheck {
    /// Ours, in time, and not replayed.
    Fresh,
    /// Ours but expired, or (without `qop`) answered on another connection than the one it
    /// was given on, or (with `qop`) its count did not rise: a new nonce with `stale=true`.
    Stale,
    /// Not one of ours.
    Invalid,
}

/// Digest nonces (RFC 2617 §3.2.1) bound to this server's key, the time they were issued and
/// the connection they were issued on. With `qop=auth` every answer must count `nc` up, so a
/// captured header cannot be sent again; a client without `qop` (RFC 2069, as GStreamer and
/// live555 answer) may use a nonce only on the connection it was given on.
pub struct Nonces {
    cipher: aes::Aes128,
    serial: u32,
    /// Per nonce (by serial) answered with `qop`: its issue time and the highest `nc`.
    counts: HashMap<u32, (u64, u32)>,
}

impl std::fmt::Debug for Nonces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nonces({} counted)", self.counts.len())
    }
}

impl Nonces {
    pub fn new(key: [u8; 16]) -> Self {
        Self { cipher: aes::Aes128::new(&key.into()), serial: 0, counts: HashMap::new() }
    }

    /// A new nonce for connection `conn` at `now_ms`: 32 hex digits.
    pub fn issue(&mut self, now_ms: u64, conn: u64) -> String {
        self.serial = self.serial.wrapping_add(1);
        let mut b = [0u8; 16];
        b[..6].copy_from_slice(&now_ms.to_be_bytes()[2..]);
        b[6..10].copy_from_slice(&(conn as u32).to_be_bytes());
        b[10..14].copy_from_slice(&self.serial.to_be_bytes());
        b[14..].copy_from_slice(&NONCE_MAGIC.to_be_bytes());
        let mut block = b.into();
        self.cipher.encrypt_block(&mut block);
        block.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// (issued at, connection, serial) of one of our nonces.
    fn open(&self, nonce: &str) -> Option<(u64, u32, u32)> {
        if nonce.len() != 32 || !nonce.is_ascii() {
            return None;
        }
        let mut b = [0u8; 16];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&nonce[2 * i..2 * i + 2], 16).ok()?;
        }
        let mut block = b.into();
        self.cipher.decrypt_block(&mut block);
        let b: [u8; 16] = block.into();
        if u16::from_be_bytes([b[14], b[15]]) != NONCE_MAGIC {
            return None;
        }
        let mut t = [0u8; 8];
        t[2..].copy_from_slice(&b[..6]);
        let conn = u32::from_be_bytes(b[6..10].try_into().expect("4 bytes"));
        let serial = u32::from_be_bytes(b[10..14].try_into().expect("4 bytes"));
        Some((u64::from_be_bytes(t), conn, serial))
    }

    /// Checks a nonce an answer used, whose response was already found right: `nc` is the
    /// answer's count with `qop=auth`, `None` without `qop`. A fresh count is recorded.
    pub fn check(&mut self, nonce: &str, now_ms: u64, conn: u64, nc: Option<u32>) -> NonceCheck {
        self.check_and(nonce, now_ms, conn, nc, true)
    }

    /// [`Nonces::check`] without recording the count: the same request is checked again
    /// (and its count recorded) when it is served.
    pub fn peek(&mut self, nonce: &str, now_ms: u64, conn: u64, nc: Option<u32>) -> NonceCheck {
        self.check_and(nonce, now_ms, conn, nc, false)
    }

    fn check_and(&mut self, nonce: &str, now_ms: u64, conn: u64, nc: Option<u32>, commit: bool) -> NonceCheck {
        let Some((issued, by, serial)) = self.open(nonce) else { return NonceCheck::Invalid };
        if issued > now_ms || now_ms - issued > NONCE_LIFETIME_MS {
            return NonceCheck::Stale;
        }
        let Some(nc) = nc else {
            return if by == conn as u32 { NonceCheck::Fresh } else { NonceCheck::Stale };
        };
        if let Some(&(_, last)) = self.counts.get(&serial) {
            if nc <= last {
                return NonceCheck::Stale;
            }
        } else if self.counts.len() >= NONCES_KEPT {
            self.counts.retain(|_, (at, _)| now_ms.saturating_sub(*at) <= NONCE_LIFETIME_MS);
            if self.counts.len() >= NONCES_KEPT {
                return NonceCheck::Stale;
            }
        }
        if commit {
            self.counts.insert(serial, (issued, nc));
        }
        NonceCheck::Fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Ids never repeat and do not follow from one another: no two of many share a prefix
    /// of their first 8 digits by more than chance, and two keys give unrelated sequences.
    #[test]
    fn ids_are_unique_and_keyed() {
        let mut g = IdGen::new([7; 16]);
        let ids: Vec<String> = (0..10_000).map(|_| g.next_hex()).collect();
        let set: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(set.len(), ids.len());
        assert!(ids.iter().all(|i| i.len() == 24 && i.bytes().all(|b| b.is_ascii_hexdigit())));
        let mut other = IdGen::new([8; 16]);
        assert_ne!(other.next_hex(), ids[0]);
        // Consecutive ids differ in about half their bits (no counter shows through).
        let bits = |a: &str, b: &str| {
            let (x, y) = (u128::from_str_radix(a, 16).unwrap(), u128::from_str_radix(b, 16).unwrap());
            (x ^ y).count_ones()
        };
        let mean = ids.windows(2).map(|w| bits(&w[0], &w[1]) as f64).sum::<f64>() / (ids.len() - 1) as f64;
        assert!((44.0..52.0).contains(&mean), "{mean}");
    }

    #[test]
    fn nonces_expire_bind_to_their_connection_and_count_up() {
        let mut n = Nonces::new([1; 16]);
        let a = n.issue(1_000, 5);
        assert_eq!(n.check(&a, 2_000, 5, None), NonceCheck::Fresh);
        assert_eq!(n.check(&a, 2_000, 5, None), NonceCheck::Fresh, "the same connection may answer again");
        assert_eq!(n.check(&a, 2_000, 6, None), NonceCheck::Stale, "without qop, only on its connection");
        assert_eq!(n.check(&a, 1_000 + NONCE_LIFETIME_MS + 1, 5, None), NonceCheck::Stale);
        // With qop: any connection, but every count only once, rising.
        assert_eq!(n.peek(&a, 3_000, 9, Some(1)), NonceCheck::Fresh);
        assert_eq!(n.peek(&a, 3_000, 9, Some(1)), NonceCheck::Fresh, "a peek records nothing");
        assert_eq!(n.check(&a, 3_000, 9, Some(1)), NonceCheck::Fresh);
        assert_eq!(n.check(&a, 3_000, 9, Some(1)), NonceCheck::Stale, "a replayed count");
        assert_eq!(n.check(&a, 3_000, 5, Some(2)), NonceCheck::Fresh);
        assert_eq!(n.check(&a, 3_000, 5, Some(2)), NonceCheck::Stale);
        let b = n.issue(1_000, 5);
        assert_ne!(a, b);
        assert_eq!(n.check(&b, 3_000, 5, Some(1)), NonceCheck::Fresh, "counts are per nonce");
        // Not ours: another key's, garbage, a flipped digit.
        let theirs = Nonces::new([2; 16]).issue(1_000, 5);
        assert_eq!(n.check(&theirs, 2_000, 5, None), NonceCheck::Invalid);
        assert_eq!(n.check("zz", 2_000, 5, None), NonceCheck::Invalid);
        let mut flipped = a.clone().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        assert_eq!(n.check(std::str::from_utf8(&flipped).unwrap(), 2_000, 5, None), NonceCheck::Invalid);
    }

    proptest! {
        /// Whatever string comes as a nonce: no panic, and only ours pass.
        #[test]
        fn any_nonce_text_is_checked_safely(t in ".{0,40}", now in 0u64..1 << 40, conn in any::<u64>()) {
            let mut n = Nonces::new([3; 16]);
            prop_assert_ne!(n.check(&t, now, conn, None), NonceCheck::Fresh);
        }
    }

    proptest! {
        #[test]
        fn agrees_with_eq(a in proptest::collection::vec(any::<u8>(), 0..40), b in proptest::collection::vec(any::<u8>(), 0..40)) {
            prop_assert_eq!(ct_eq(&a, &b), a == b);
            prop_assert!(ct_eq(&a, &a));
        }
    }
}
