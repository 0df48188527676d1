//! SRTP and SRTCP (RFC 3711), sans-IO: AES_CM_128_HMAC_SHA1_80 and _32, key derivation
//! rate 0, no MKI. A [`Context`] is one direction under one master key; it keeps each SSRC's
//! rollover counter (RFC 3711 §3.3.1, Appendix A) and a 64-packet replay window, so the
//! same context protects a sender's packets or checks a receiver's.
//!
//! Also the SDES attribute (RFC 4568 `a=crypto`) that carries a master key in SDP.

use aes::cipher::{KeyIvInit, StreamCipher};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use std::collections::HashMap;

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;
type HmacSha1 = Hmac<Sha1>;

pub const MASTER_KEY_LEN: usize = 16;
pub const MASTER_SALT_LEN: usize = 14;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suite {
    AesCm128HmacSha1_80,
    AesCm128HmacSha1_32,
}

impl Suite {
    pub fn name(self) -> &'static str {
        match self {
            Suite::AesCm128HmacSha1_80 => "AES_CM_128_HMAC_SHA1_80",
            Suite::AesCm128HmacSha1_32 => "AES_CM_128_HMAC_SHA1_32",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "AES_CM_128_HMAC_SHA1_80" => Some(Suite::AesCm128HmacSha1_80),
            "AES_CM_128_HMAC_SHA1_32" => Some(Suite::AesCm128HmacSha1_32),
            _ => None,
        }
    }

    /// The authentication tag's length on SRTP packets. SRTCP always carries 80 bits
    /// (RFC 3711 §5.2; the _32 suite shortens the RTP tag only, RFC 4568 §6.2.1).
    pub fn rtp_tag_len(self) -> usize {
        match self {
            Suite::AesCm128HmacSha1_80 => 10,
            Suite::AesCm128HmacSha1_32 => 4,
        }
    }
}

pub const RTCP_TAG_LEN: usize = 10;

/// A master key and salt.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterKey {
    pub key: [u8; MASTER_KEY_LEN],
    pub salt: [u8; MASTER_SALT_LEN],
}

impl std::fmt::Debug for MasterKey {
    /// Never the key itself: it ends up in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    /// From 30 bytes: the key, then the salt (the order SDES and MIKEY carry them in).
    pub fn from_concat(b: &[u8]) -> Option<Self> {
        if b.len() != MASTER_KEY_LEN + MASTER_SALT_LEN {
            return None;
        }
        let mut k = Self { key: [0; MASTER_KEY_LEN], salt: [0; MASTER_SALT_LEN] };
        k.key.copy_from_slice(&b[..MASTER_KEY_LEN]);
        k.salt.copy_from_slice(&b[MASTER_KEY_LEN..]);
        Some(k)
    }

    pub fn concat(&self) -> Vec<u8> {
        [&self.key[..], &self.salt[..]].concat()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("too short for SRTP")]
    TooShort,
    #[error("not an RTP/RTCP packet")]
    Malformed,
    #[error("authentication failed")]
    AuthFailed,
    #[error("replayed or too old")]
    Replayed,
}

/// The session keys of one of RTP and RTCP.
#[derive(Clone)]
struct Keys {
    enc: [u8; 16],
    /// HMAC keyed once; cloned per packet.
    auth: HmacSha1,
    salt: [u8; 14],
}

/// The AES-CM PRF of RFC 3711 §4.3.1 with a key derivation rate of 0: `n` bytes for `label`.
fn derive(master: &MasterKey, label: u8, n: usize) -> Vec<u8> {
    let mut iv = [0u8; 16];
    iv[..14].copy_from_slice(&master.salt);
    // key_id = label || index DIV kdr (0): the label lands on byte 7 of the salt.
    iv[7] ^= label;
    let mut out = vec![0u8; n];
    Aes128Ctr::new(&master.key.into(), &iv.into()).apply_keystream(&mut out);
    out
}

impl Keys {
    fn new(master: &MasterKey, base_label: u8) -> Self {
        let mut enc = [0u8; 16];
        enc.copy_from_slice(&derive(master, base_label, 16));
        let auth = HmacSha1::new_from_slice(&derive(master, base_label + 1, 20)).expect("HMAC takes any key length");
        let mut salt = [0u8; 14];
        salt.copy_from_slice(&derive(master, base_label + 2, 14));
        Self { enc, auth, salt }
    }

    /// The keystream IV for `ssrc` and packet `index` (§4.1.1).
    fn iv(&self, ssrc: u32, index: u64) -> [u8; 16] {
        let mut iv = [0u8; 16];
        iv[..14].copy_from_slice(&self.salt);
        for (i, b) in ssrc.to_be_bytes().iter().enumerate() {
            iv[4 + i] ^= b;
        }
        for (i, b) in index.to_be_bytes()[2..].iter().enumerate() {
            iv[8 + i] ^= b;
        }
        iv
    }

    fn crypt(&self, ssrc: u32, index: u64, data: &mut [u8]) {
        Aes128Ctr::new(&self.enc.into(), &self.iv(ssrc, index).into()).apply_keystream(data);
    }

    fn tag(&self, parts: &[&[u8]]) -> [u8; 20] {
        let mut m = self.auth.clone();
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }
}

/// Per SSRC: the highest sequence number and rollover counter seen (or sent), the replay
/// window below it, and SRTCP's index.
#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    /// Whether an RTP packet was seen: the first one sets `s_l` (an SRTCP packet may come
    /// first, and must not start the RTP index space at 0).
    rtp_seen: bool,
    s_l: u16,
    roc: u32,
    /// Bit i: index (highest − i) was accepted.
    window: u64,
    srtcp_sent: u32,
    srtcp_highest: Option<u32>,
    srtcp_window: u64,
}

impl Stream {
    /// The packet index `seq` most likely has (RFC 3711 Appendix A).
    fn estimate(&self, seq: u16) -> u64 {
        let roc = if self.s_l < 0x8000 {
            if seq > self.s_l && seq - self.s_l > 0x8000 {
                self.roc.wrapping_sub(1)
            } else {
                self.roc
            }
        } else if self.s_l - 0x8000 > seq {
            self.roc.wrapping_add(1)
        } else {
            self.roc
        };
        (u64::from(roc) << 16) | u64::from(seq)
    }

    fn highest(&self) -> u64 {
        (u64::from(self.roc) << 16) | u64::from(self.s_l)
    }

    /// Whether `index` is new: above the highest, or in the window and not yet seen.
    fn fresh(&self, index: u64) -> bool {
        let h = self.highest();
        index > h || (h - index < 64 && self.window & (1 << (h - index)) == 0)
    }

    fn accept(&mut self, index: u64) {
        let h = self.highest();
        if index > h {
            let shift = index - h;
            self.window = if shift >= 64 { 1 } else { (self.window << shift) | 1 };
            self.roc = (index >> 16) as u32;
            self.s_l = index as u16;
        } else {
            self.window |= 1 << (h - index);
        }
    }
}

/// The length of an RTP packet's header (fixed part, CSRCs, extension).
fn rtp_header_len(p: &[u8]) -> Result<usize, Error> {
    if p.len() < 12 || p[0] >> 6 != 2 {
        return Err(Error::Malformed);
    }
    let mut n = 12 + 4 * usize::from(p[0] & 0x0f);
    if p[0] & 0x10 != 0 {
        if p.len() < n + 4 {
            return Err(Error::Malformed);
        }
        n += 4 + 4 * usize::from(u16::from_be_bytes([p[n + 2], p[n + 3]]));
    }
    if p.len() < n {
        return Err(Error::Malformed);
    }
    Ok(n)
}

/// One direction of SRTP and SRTCP under one master key.
#[derive(Clone)]
pub struct Context {
    suite: Suite,
    rtp: Keys,
    rtcp: Keys,
    streams: HashMap<u32, Stream>,
}

impl std::fmt::Debug for Context {
    /// Never the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("suite", &self.suite).field("streams", &self.streams.len()).finish()
    }
}

/// SSRCs a context follows at most: a receiver fed packets with ever new SSRCs must not
/// grow without bound.
const MAX_STREAMS: usize = 1024;

impl Context {
    pub fn new(suite: Suite, master: &MasterKey) -> Self {
        Self { suite, rtp: Keys::new(master, 0), rtcp: Keys::new(master, 3), streams: HashMap::new() }
    }

    pub fn suite(&self) -> Suite {
        self.suite
    }

    /// The rollover counter `ssrc`'s packets start at, as a MIKEY message gives it for a
    /// stream that had already run (RFC 3830 §6.1.1, CS ID map): before its first packet.
    pub fn set_roc(&mut self, ssrc: u32, roc: u32) {
        let st = self.stream(ssrc, None);
        if !st.rtp_seen {
            st.roc = roc;
        }
    }

    fn stream(&mut self, ssrc: u32, seq: Option<u16>) -> &mut Stream {
        if self.streams.len() >= MAX_STREAMS && !self.streams.contains_key(&ssrc) {
            self.streams.clear();
        }
        let st = self.streams.entry(ssrc).or_default();
        if let (Some(seq), false) = (seq, st.rtp_seen) {
            (st.s_l, st.rtp_seen) = (seq, true);
        }
        st
    }

    /// Encrypts an RTP packet's payload in place and appends its tag.
    pub fn protect_rtp(&mut self, pkt: &mut Vec<u8>) -> Result<(), Error> {
        let len = pkt.len();
        pkt.resize(len + self.suite.rtp_tag_len(), 0);
        let n = self.protect_rtp_in(pkt, len);
        pkt.truncate(n.unwrap_or(len));
        n.map(|_| ())
    }

    /// [`Context::protect_rtp`] in a buffer: the packet is its first `len` bytes, the tag
    /// goes after them (the buffer must have room); the protected length comes back.
    pub fn protect_rtp_in(&mut self, buf: &mut [u8], len: usize) -> Result<usize, Error> {
        let tag_len = self.suite.rtp_tag_len();
        if buf.len() < len + tag_len {
            return Err(Error::TooShort);
        }
        let pkt = &mut buf[..len];
        let h = rtp_header_len(pkt)?;
        let seq = u16::from_be_bytes([pkt[2], pkt[3]]);
        let ssrc = u32::from_be_bytes([pkt[8], pkt[9], pkt[10], pkt[11]]);
        let st = self.stream(ssrc, Some(seq));
        let index = st.estimate(seq);
        if index > st.highest() {
            st.accept(index);
        }
        let roc = (index >> 16) as u32;
        self.rtp.crypt(ssrc, index, &mut pkt[h..]);
        let tag = self.rtp.tag(&[pkt, &roc.to_be_bytes()]);
        buf[len..len + tag_len].copy_from_slice(&tag[..tag_len]);
        Ok(len + tag_len)
    }

    /// Checks an SRTP packet's tag and replay, decrypts it in place and drops the tag.
    pub fn unprotect_rtp(&mut self, pkt: &mut Vec<u8>) -> Result<(), Error> {
        let n = self.unprotect_rtp_in(pkt)?;
        pkt.truncate(n);
        Ok(())
    }

    /// [`Context::unprotect_rtp`] on a slice: the RTP packet's length, at its start.
    pub fn unprotect_rtp_in(&mut self, pkt: &mut [u8]) -> Result<usize, Error> {
        let tag_len = self.suite.rtp_tag_len();
        if pkt.len() < 12 + tag_len {
            return Err(Error::TooShort);
        }
        let body = pkt.len() - tag_len;
        let h = rtp_header_len(&pkt[..body])?;
        let seq = u16::from_be_bytes([pkt[2], pkt[3]]);
        let ssrc = u32::from_be_bytes([pkt[8], pkt[9], pkt[10], pkt[11]]);
        let st = *self.stream(ssrc, Some(seq));
        let index = st.estimate(seq);
        if !st.fresh(index) {
            return Err(Error::Replayed);
        }
        let roc = (index >> 16) as u32;
        let tag = self.rtp.tag(&[&pkt[..body], &roc.to_be_bytes()]);
        if !constant_time_eq(&tag[..tag_len], &pkt[body..]) {
            return Err(Error::AuthFailed);
        }
        self.streams.get_mut(&ssrc).expect("made above").accept(index);
        self.rtp.crypt(ssrc, index, &mut pkt[h..body]);
        Ok(body)
    }

    /// Encrypts an RTCP compound packet (after its first 8 bytes), appends the E flag and
    /// SRTCP index, and the tag.
    pub fn protect_rtcp(&mut self, pkt: &mut Vec<u8>) -> Result<(), Error> {
        if pkt.len() < 8 || pkt[0] >> 6 != 2 {
            return Err(Error::Malformed);
        }
        let ssrc = u32::from_be_bytes([pkt[4], pkt[5], pkt[6], pkt[7]]);
        let st = self.stream(ssrc, None);
        let index = st.srtcp_sent;
        st.srtcp_sent = (st.srtcp_sent + 1) & 0x7fff_ffff;
        self.rtcp.crypt(ssrc, u64::from(index), &mut pkt[8..]);
        pkt.extend_from_slice(&(index | 0x8000_0000).to_be_bytes());
        let tag = self.rtcp.tag(&[pkt]);
        pkt.extend_from_slice(&tag[..RTCP_TAG_LEN]);
        Ok(())
    }

    /// Checks an SRTCP packet and decrypts it in place to the RTCP compound packet.
    pub fn unprotect_rtcp(&mut self, pkt: &mut Vec<u8>) -> Result<(), Error> {
        let n = self.unprotect_rtcp_in(pkt)?;
        pkt.truncate(n);
        Ok(())
    }

    /// [`Context::unprotect_rtcp`] on a slice: the RTCP packet's length, at its start.
    pub fn unprotect_rtcp_in(&mut self, pkt: &mut [u8]) -> Result<usize, Error> {
        if pkt.len() < 8 + 4 + RTCP_TAG_LEN {
            return Err(Error::TooShort);
        }
        if pkt[0] >> 6 != 2 {
            return Err(Error::Malformed);
        }
        let body = pkt.len() - RTCP_TAG_LEN;
        let tag = self.rtcp.tag(&[&pkt[..body]]);
        if !constant_time_eq(&tag[..RTCP_TAG_LEN], &pkt[body..]) {
            return Err(Error::AuthFailed);
        }
        let e_index = u32::from_be_bytes([pkt[body - 4], pkt[body - 3], pkt[body - 2], pkt[body - 1]]);
        let (encrypted, index) = (e_index & 0x8000_0000 != 0, e_index & 0x7fff_ffff);
        let ssrc = u32::from_be_bytes([pkt[4], pkt[5], pkt[6], pkt[7]]);
        let st = self.stream(ssrc, None);
        match st.srtcp_highest {
            Some(h) if index <= h && (h - index >= 64 || st.srtcp_window & (1 << (h - index)) != 0) => {
                return Err(Error::Replayed)
            }
            Some(h) if index <= h => st.srtcp_window |= 1 << (h - index),
            Some(h) => {
                let shift = index - h;
                st.srtcp_window = if shift >= 64 { 1 } else { (st.srtcp_window << shift) | 1 };
                st.srtcp_highest = Some(index);
            }
            None => {
                st.srtcp_window = 1;
                st.srtcp_highest = Some(index);
            }
        }
        let end = body - 4;
        if encrypted {
            self.rtcp.crypt(ssrc, u64::from(index), &mut pkt[8..end]);
        }
        Ok(end)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An SDES crypto attribute (RFC 4568 §9.1): `a=crypto:TAG SUITE inline:KEY||SALT[|…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crypto {
    pub tag: u32,
    pub suite: Suite,
    pub key: MasterKey,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdesError {
    #[error("not an a=crypto value")]
    Syntax,
    #[error("crypto suite {0:?} is not supported (AES_CM_128_HMAC_SHA1_80 and _32 are)")]
    Suite(String),
    #[error("the key is not base64 of a 16-byte key and 14-byte salt")]
    Key,
    #[error("MKI or key lifetimes other than the default are not supported")]
    Params,
}

impl Crypto {
    /// The attribute's value (after `a=crypto:`).
    pub fn to_value(&self) -> String {
        let inline = base64::engine::general_purpose::STANDARD.encode(self.key.concat());
        format!("{} {} inline:{inline}", self.tag, self.suite.name())
    }

    /// Parses the attribute's value (after `crypto:`).
    pub fn parse(value: &str) -> Result<Self, SdesError> {
        let mut f = value.split_ascii_whitespace();
        let tag = f.next().and_then(|t| t.parse().ok()).filter(|t| *t < 1_000_000_000).ok_or(SdesError::Syntax)?;
        let suite_name = f.next().ok_or(SdesError::Syntax)?;
        let suite =
            Suite::from_name(suite_name).ok_or_else(|| SdesError::Suite(suite_name.chars().take(64).collect()))?;
        // Several keys may be listed (`;`-separated); one, without MKI, is what we take.
        let params = f.next().ok_or(SdesError::Syntax)?;
        let first = params.split(';').next().unwrap_or("");
        let inline = first.strip_prefix("inline:").ok_or(SdesError::Syntax)?;
        let mut parts = inline.split('|');
        let b64 = parts.next().unwrap_or("");
        let raw = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| SdesError::Key)?;
        let key = MasterKey::from_concat(&raw).ok_or(SdesError::Key)?;
        // A lifetime (`2^31` or a number) is harmless; an MKI (`n:len`) changes the packet
        // format, which we do not speak.
        if parts.any(|p| p.contains(':')) {
            return Err(SdesError::Params);
        }
        Ok(Self { tag, suite, key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn master() -> MasterKey {
        MasterKey::from_concat(&hex("E1F97A0D3E018BE0D64FA32C06DE41390EC675AD498AFEEBB6960B3AABE6")).unwrap()
    }

    /// RFC 3711 Appendix B.3.
    #[test]
    fn key_derivation_matches_the_rfc() {
        let m = master();
        assert_eq!(derive(&m, 0, 16), hex("C61E7A93744F39EE10734AFE3FF7A087"));
        assert_eq!(derive(&m, 2, 14), hex("30CBBC08863D8C85D49DB34A9AE1"));
        assert_eq!(derive(&m, 1, 20), hex("CEBE321F6FF7716B6FD4AB49AF256A156D38BAA4"));
    }

    /// RFC 3711 Appendix B.2: the AES-CM keystream for a given session key, salt, SSRC 0
    /// and index 0.
    #[test]
    fn the_keystream_matches_the_rfc() {
        let keys = Keys {
            enc: hex("2B7E151628AED2A6ABF7158809CF4F3C").try_into().unwrap(),
            auth: HmacSha1::new_from_slice(&[0; 20]).unwrap(),
            salt: hex("F0F1F2F3F4F5F6F7F8F9FAFBFCFD").try_into().unwrap(),
        };
        let mut ks = vec![0u8; 48];
        keys.crypt(0, 0, &mut ks);
        assert_eq!(
            ks,
            hex("E03EAD0935C95E80E166B16DD92B4EB4D23513162B02D0F72A43A2FE4A5F97AB41E95B3BB0A2E8DD477901E4FCA894C0")
        );
    }

    fn rtp(seq: u16, ssrc: u32, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x80, 96];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&1234u32.to_be_bytes());
        p.extend_from_slice(&ssrc.to_be_bytes());
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn protect_then_unprotect_restores_rtp_and_rejects_tampering_and_replay() {
        for suite in [Suite::AesCm128HmacSha1_80, Suite::AesCm128HmacSha1_32] {
            let (mut tx, mut rx) = (Context::new(suite, &master()), Context::new(suite, &master()));
            let plain = rtp(65530, 7, b"hello, encrypted world");
            let mut p = plain.clone();
            tx.protect_rtp(&mut p).unwrap();
            assert_eq!(p.len(), plain.len() + suite.rtp_tag_len());
            assert_eq!(&p[..12], &plain[..12], "the header stays in clear");
            assert_ne!(&p[12..plain.len()], &plain[12..]);
            let mut q = p.clone();
            rx.unprotect_rtp(&mut q).unwrap();
            assert_eq!(q, plain);
            assert_eq!(rx.unprotect_rtp(&mut p.clone()), Err(Error::Replayed));
            let mut bad = p.clone();
            bad[13] ^= 1;
            assert_eq!(Context::new(suite, &master()).unprotect_rtp(&mut bad), Err(Error::AuthFailed));
        }
    }

    /// Across the 16-bit wrap the rollover counter goes up on both sides.
    #[test]
    fn the_rollover_counter_follows_the_wrap() {
        let (mut tx, mut rx) =
            (Context::new(Suite::AesCm128HmacSha1_80, &master()), Context::new(Suite::AesCm128HmacSha1_80, &master()));
        for i in 0..200u32 {
            let seq = 65_500u16.wrapping_add(i as u16);
            let plain = rtp(seq, 9, &i.to_be_bytes());
            let mut p = plain.clone();
            tx.protect_rtp(&mut p).unwrap();
            rx.unprotect_rtp(&mut p).unwrap();
            assert_eq!(p, plain, "packet {i}");
        }
        assert_eq!(rx.streams[&9].roc, 1);
    }

    /// A receiver joining a stream past its first wrap reads it only with the rollover
    /// counter the key exchange gave it (MIKEY carries it; ROC 0 fails the tag).
    #[test]
    fn a_given_rollover_counter_reads_a_stream_that_had_wrapped() {
        let suite = Suite::AesCm128HmacSha1_80;
        let mut tx = Context::new(suite, &master());
        tx.set_roc(9, 3);
        let plain = rtp(100, 9, b"later");
        let mut p = plain.clone();
        tx.protect_rtp(&mut p).unwrap();
        assert_eq!(Context::new(suite, &master()).unprotect_rtp(&mut p.clone()), Err(Error::AuthFailed));
        let mut rx = Context::new(suite, &master());
        rx.set_roc(9, 3);
        rx.unprotect_rtp(&mut p).unwrap();
        assert_eq!(p, plain);
        // Once packets flow, the counter is theirs.
        rx.set_roc(9, 0);
        assert_eq!(rx.streams[&9].roc, 3);
    }

    /// A sender report protected (or checked) before the stream's first RTP packet leaves
    /// the RTP index space alone: the first packet's own sequence number starts it.
    #[test]
    fn srtcp_before_the_first_rtp_packet_does_not_shift_the_rollover_counter() {
        let (mut tx, mut rx) =
            (Context::new(Suite::AesCm128HmacSha1_80, &master()), Context::new(Suite::AesCm128HmacSha1_80, &master()));
        let mut sr = vec![0x80, 200, 0, 6];
        sr.extend_from_slice(&9u32.to_be_bytes());
        sr.extend_from_slice(&[7; 20]);
        tx.protect_rtcp(&mut sr).unwrap();
        rx.unprotect_rtcp(&mut sr).unwrap();
        let plain = rtp(40_000, 9, b"after the report");
        let mut p = plain.clone();
        tx.protect_rtp(&mut p).unwrap();
        // A receiver that starts at ROC 0 with this packet (a new client) reads it.
        Context::new(Suite::AesCm128HmacSha1_80, &master()).unprotect_rtp(&mut p.clone()).unwrap();
        rx.unprotect_rtp(&mut p).unwrap();
        assert_eq!(p, plain);
    }

    #[test]
    fn srtcp_round_trips_and_counts_its_index() {
        let (mut tx, mut rx) =
            (Context::new(Suite::AesCm128HmacSha1_80, &master()), Context::new(Suite::AesCm128HmacSha1_80, &master()));
        let sr = {
            let mut p = vec![0x80, 200, 0, 6];
            p.extend_from_slice(&5u32.to_be_bytes());
            p.extend_from_slice(&[7; 20]);
            p
        };
        for i in 0..3u32 {
            let mut p = sr.clone();
            tx.protect_rtcp(&mut p).unwrap();
            assert_eq!(u32::from_be_bytes(p[p.len() - 14..p.len() - 10].try_into().unwrap()), 0x8000_0000 | i);
            let replay = p.clone();
            rx.unprotect_rtcp(&mut p).unwrap();
            assert_eq!(p, sr);
            assert_eq!(rx.unprotect_rtcp(&mut replay.clone()), Err(Error::Replayed));
        }
    }

    #[test]
    fn sdes_attributes_parse_and_print() {
        let c = Crypto { tag: 1, suite: Suite::AesCm128HmacSha1_80, key: master() };
        let v = c.to_value();
        assert!(v.starts_with("1 AES_CM_128_HMAC_SHA1_80 inline:"), "{v}");
        assert_eq!(Crypto::parse(&v), Ok(c.clone()));
        assert_eq!(Crypto::parse(&format!("{v}|2^31")), Ok(c.clone()));
        assert_eq!(Crypto::parse(&format!("{v}|2^20|1:4")), Err(SdesError::Params));
        assert!(matches!(Crypto::parse("1 F8_128_HMAC_SHA1_80 inline:AAAA"), Err(SdesError::Suite(_))));
        assert_eq!(Crypto::parse("1 AES_CM_128_HMAC_SHA1_80 inline:AAAA"), Err(SdesError::Key));
        assert_eq!(Crypto::parse("x AES_CM_128_HMAC_SHA1_80"), Err(SdesError::Syntax));
    }

    proptest! {
        /// Whatever comes in, unprotecting never panics, and what a context protected
        /// comes back byte for byte.
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut c = Context::new(Suite::AesCm128HmacSha1_80, &master());
            let _ = c.unprotect_rtp(&mut data.clone());
            let _ = c.unprotect_rtcp(&mut data.clone());
            let _ = Crypto::parse(&String::from_utf8_lossy(&data));
        }

        #[test]
        fn protected_packets_round_trip(seqs in proptest::collection::vec(any::<u16>(), 1..50), payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut tx = Context::new(Suite::AesCm128HmacSha1_80, &master());
            let mut rx = Context::new(Suite::AesCm128HmacSha1_80, &master());
            let mut seq = seqs[0];
            for step in seqs {
                seq = seq.wrapping_add(step % 100 + 1);
                let plain = rtp(seq, 3, &payload);
                let mut p = plain.clone();
                tx.protect_rtp(&mut p).unwrap();
                rx.unprotect_rtp(&mut p).unwrap();
                prop_assert_eq!(p, plain);
            }
        }
    }
}
