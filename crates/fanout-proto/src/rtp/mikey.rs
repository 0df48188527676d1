//! MIKEY (RFC 3830) as RTSP servers and clients carry SRTP keys in `a=key-mgmt:mikey` and
//! the `KeyMgmt` header (RFC 4567), the way GStreamer and MediaMTX do: a pre-shared-key
//! initiation message whose key transport is not encrypted and not MACed (the TLS of RTSPS
//! protects it), with one crypto session per SSRC, a timestamp, a RAND, an SRTP security
//! policy and the TEK + salt.

use crate::rtp::srtp::{MasterKey, Suite, MASTER_KEY_LEN, MASTER_SALT_LEN};

// Payload types (RFC 3830 §6.1).
const LAST: u8 = 0;
const KEMAC: u8 = 1;
const T: u8 = 5;
const SP: u8 = 10;
const RAND: u8 = 11;
/// Data type: pre-shared key initiation; and its verification message (a responder's).
const PSK_INIT: u8 = 0;
const PSK_VERIFY: u8 = 1;
/// Key data sub-payload types: TEK, TEK + salt.
const KEY_TEK: u8 = 2;
const KEY_TEK_SALT: u8 = 3;

/// A MIKEY message as RTSP uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mikey {
    pub csb_id: u32,
    /// Per crypto session: (SSRC, rollover counter).
    pub sessions: Vec<(u32, u32)>,
    pub suite: Suite,
    pub key: MasterKey,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MikeyError {
    #[error("MIKEY message truncated")]
    Truncated,
    #[error("MIKEY version {0} (1 is known)")]
    Version(u8),
    #[error("MIKEY data type {0} (a pre-shared-key message is expected)")]
    DataType(u8),
    #[error("MIKEY payload type {0} is not supported")]
    Payload(u8),
    #[error("MIKEY key transport is encrypted or MACed (only the plain form inside TLS is supported)")]
    Protected,
    #[error("MIKEY policy is not AES-CM with HMAC-SHA1 and 128-bit keys")]
    Policy,
    #[error("MIKEY message carries no TEK and salt")]
    NoKey,
    #[error("KeyMgmt header without prot=mikey and its data")]
    NotMikey,
}

/// The MIKEY message of a `KeyMgmt` header (RFC 4567 §3.3: `prot=mikey; uri="…";
/// data="…"`), as a client sends its own key in SETUP.
pub fn parse_key_mgmt(header: &str) -> Result<Mikey, MikeyError> {
    let mut prot = false;
    let mut data = None;
    for field in header.split(';') {
        let (k, v) = field.split_once('=').unwrap_or((field, ""));
        match k.trim() {
            "prot" => prot = v.trim() == "mikey",
            "data" => data = Some(v.trim().trim_matches('"')),
            _ => {}
        }
    }
    match (prot, data) {
        (true, Some(d)) => Mikey::parse_base64(d),
        _ => Err(MikeyError::NotMikey),
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MikeyError> {
        let s = self.b.get(self.at..self.at + n).ok_or(MikeyError::Truncated)?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, MikeyError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, MikeyError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, MikeyError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
}

impl Mikey {
    /// The message that gives `key` for the stream `ssrc` from its start (ROC 0), as base64:
    /// what `a=key-mgmt` and the `KeyMgmt` header carry. `rand` (16 bytes of RAND, then the
    /// CSB ID) and `ntp` (the timestamp) come from the caller.
    pub fn announce(suite: Suite, key: &MasterKey, ssrc: u32, rand: [u8; 20], ntp: u64) -> String {
        let csb_id = u32::from_be_bytes([rand[16], rand[17], rand[18], rand[19]]);
        let m = Mikey { csb_id, sessions: vec![(ssrc, 0)], suite, key: key.clone() };
        m.write_base64(rand[..16].try_into().expect("16 bytes"), ntp)
    }

    /// An SRTP context under this message's key, each of its streams starting at the
    /// rollover counter the message gives (a stream that ran before the receiver came).
    pub fn context(&self) -> crate::rtp::srtp::Context {
        let mut ctx = crate::rtp::srtp::Context::new(self.suite, &self.key);
        for &(ssrc, roc) in &self.sessions {
            ctx.set_roc(ssrc, roc);
        }
        ctx
    }

    /// The message's bytes; `rand` and `ntp` (the timestamp) come from the caller.
    pub fn write(&self, rand: [u8; 16], ntp: u64) -> Vec<u8> {
        let mut o = vec![1, PSK_INIT, T, 0];
        o.extend_from_slice(&self.csb_id.to_be_bytes());
        o.push(self.sessions.len() as u8);
        o.push(0); // CS ID map type: SRTP-ID
        for &(ssrc, roc) in &self.sessions {
            o.push(0); // policy 0
            o.extend_from_slice(&ssrc.to_be_bytes());
            o.extend_from_slice(&roc.to_be_bytes());
        }
        // T: NTP-UTC.
        o.extend_from_slice(&[RAND, 0]);
        o.extend_from_slice(&ntp.to_be_bytes());
        // RAND.
        o.extend_from_slice(&[SP, rand.len() as u8]);
        o.extend_from_slice(&rand);
        // SP: policy 0, SRTP.
        let params: [(u8, u8); 9] = [
            (0, 1),                    // encryption: AES-CM
            (1, MASTER_KEY_LEN as u8), // session encryption key length
            (2, 1),                    // authentication: HMAC-SHA-1
            // Session authentication key length: GStreamer and gortsplib (MediaMTX) read and
            // write the tag length here (10 for HMAC-SHA1-80), and gortsplib refuses 20.
            (3, self.suite.rtp_tag_len() as u8),
            (4, MASTER_SALT_LEN as u8),           // session salt length
            (7, 1),                               // SRTP encryption on
            (8, 1),                               // SRTCP encryption on
            (10, 1),                              // SRTP authentication on
            (11, self.suite.rtp_tag_len() as u8), // tag length
        ];
        o.extend_from_slice(&[KEMAC, 0, 0]);
        o.extend_from_slice(&((params.len() * 3) as u16).to_be_bytes());
        for (t, v) in params {
            o.extend_from_slice(&[t, 1, v]);
        }
        // KEMAC: no encryption, one key data sub-payload, no MAC. The key and salt travel as
        // one 30-byte TEK, as GStreamer writes and reads them (it takes a TEK's bytes as the
        // whole SRTP master key, and ignores a separate salt).
        let mut kd = vec![LAST, KEY_TEK << 4];
        kd.extend_from_slice(&((MASTER_KEY_LEN + MASTER_SALT_LEN) as u16).to_be_bytes());
        kd.extend_from_slice(&self.key.concat());
        o.extend_from_slice(&[LAST, 0]);
        o.extend_from_slice(&(kd.len() as u16).to_be_bytes());
        o.extend_from_slice(&kd);
        o.push(0); // MAC: NULL
        o
    }

    /// [`Mikey::write`] in base64, as `a=key-mgmt:mikey` and `KeyMgmt` carry it.
    pub fn write_base64(&self, rand: [u8; 16], ntp: u64) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(self.write(rand, ntp))
    }

    /// Parses the base64 form.
    pub fn parse_base64(s: &str) -> Result<Self, MikeyError> {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD.decode(s.trim()).map_err(|_| MikeyError::Truncated)?;
        Self::parse(&b)
    }

    /// Parses a message of the plain, pre-shared-key form.
    pub fn parse(b: &[u8]) -> Result<Self, MikeyError> {
        let mut r = Reader { b, at: 0 };
        let version = r.u8()?;
        if version != 1 {
            return Err(MikeyError::Version(version));
        }
        let data_type = r.u8()?;
        if data_type != PSK_INIT && data_type != PSK_VERIFY {
            return Err(MikeyError::DataType(data_type));
        }
        let mut next = r.u8()?;
        let _prf = r.u8()?;
        let csb_id = r.u32()?;
        let n = r.u8()?;
        let _map_type = r.u8()?;
        let mut sessions = Vec::new();
        for _ in 0..n {
            let _policy = r.u8()?;
            sessions.push((r.u32()?, r.u32()?));
        }
        let (mut suite, mut key) = (Suite::AesCm128HmacSha1_80, None);
        while next != LAST {
            let this = next;
            next = r.u8()?;
            match this {
                T => {
                    let len = match r.u8()? {
                        0 | 1 => 8, // NTP-UTC, NTP
                        2 => 4,     // COUNTER
                        _ => return Err(MikeyError::Payload(T)),
                    };
                    r.take(len)?;
                }
                RAND => {
                    let len = r.u8()?;
                    r.take(usize::from(len))?;
                }
                SP => {
                    let (_no, _prot) = (r.u8()?, r.u8()?);
                    let len = r.u16()?;
                    let mut p = Reader { b: r.take(usize::from(len))?, at: 0 };
                    while p.at < p.b.len() {
                        let (t, l) = (p.u8()?, p.u8()?);
                        let v = p.take(usize::from(l))?;
                        let one = v.first().copied();
                        match (t, one) {
                            (0, Some(1)) | (2, Some(1)) | (1, Some(16)) | (3, Some(20)) | (4, Some(14)) => {}
                            // GStreamer (and its followers) put the tag length here.
                            (3, Some(4)) => suite = Suite::AesCm128HmacSha1_32,
                            (3, Some(10)) => suite = Suite::AesCm128HmacSha1_80,
                            (0..=4, _) => return Err(MikeyError::Policy),
                            (11, Some(4)) => suite = Suite::AesCm128HmacSha1_32,
                            (11, Some(10)) => suite = Suite::AesCm128HmacSha1_80,
                            (11, _) => return Err(MikeyError::Policy),
                            _ => {}
                        }
                    }
                }
                KEMAC => {
                    let enc = r.u8()?;
                    let len = r.u16()?;
                    let data = r.take(usize::from(len))?;
                    let mac = r.u8()?;
                    if enc != 0 || mac != 0 {
                        return Err(MikeyError::Protected);
                    }
                    key = Some(key_data(data)?);
                }
                other => return Err(MikeyError::Payload(other)),
            }
        }
        Ok(Self { csb_id, sessions, suite, key: key.ok_or(MikeyError::NoKey)? })
    }
}

/// The first key data sub-payload with a TEK and salt.
fn key_data(b: &[u8]) -> Result<MasterKey, MikeyError> {
    let mut r = Reader { b, at: 0 };
    loop {
        let next = r.u8()?;
        let type_kv = r.u8()?;
        let (kind, kv) = (type_kv >> 4, type_kv & 0x0f);
        let key_len = r.u16()?;
        let key = r.take(usize::from(key_len))?;
        let salt = if kind == KEY_TEK_SALT {
            let salt_len = r.u16()?;
            Some(r.take(usize::from(salt_len))?)
        } else {
            None
        };
        match kv {
            0 => {}
            1 => {
                // SPI/MKI: length and value.
                let l = r.u8()?;
                r.take(usize::from(l))?;
            }
            2 => {
                // Interval: from and to, each with a length.
                for _ in 0..2 {
                    let l = r.u8()?;
                    r.take(usize::from(l))?;
                }
            }
            _ => return Err(MikeyError::Payload(20)),
        }
        // A TEK with its salt apart, or the key and salt as one TEK (GStreamer's way).
        let whole = match (kind, salt) {
            (KEY_TEK_SALT, Some(salt)) => [key, salt].concat(),
            (KEY_TEK, None) => key.to_vec(),
            _ => Vec::new(),
        };
        if let Some(k) = MasterKey::from_concat(&whole) {
            return Ok(k);
        }
        if next == LAST {
            return Err(MikeyError::NoKey);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Mikey {
        Mikey {
            csb_id: 0x1234_5678,
            sessions: vec![(0xdead_beef, 3)],
            suite: Suite::AesCm128HmacSha1_80,
            key: MasterKey { key: [1; 16], salt: [2; 14] },
        }
    }

    #[test]
    fn a_written_message_parses_back() {
        let m = sample();
        let b = m.write([9; 16], 0x0102_0304_0506_0708);
        assert_eq!(b[0..3], [1, PSK_INIT, T]);
        assert_eq!(Mikey::parse(&b), Ok(m.clone()));
        let m32 = Mikey { suite: Suite::AesCm128HmacSha1_32, ..m };
        assert_eq!(Mikey::parse(&m32.write([0; 16], 0)), Ok(m32));
    }

    /// Key data with the salt apart (RFC 3830's TEK + salt) reads the same.
    #[test]
    fn a_tek_with_its_salt_apart_reads_too() {
        let mut kd = vec![LAST, KEY_TEK_SALT << 4, 0, 16];
        kd.extend_from_slice(&[1; 16]);
        kd.extend_from_slice(&[0, 14]);
        kd.extend_from_slice(&[2; 14]);
        assert_eq!(key_data(&kd), Ok(MasterKey { key: [1; 16], salt: [2; 14] }));
        assert_eq!(key_data(&kd[..kd.len() - 1]), Err(MikeyError::Truncated));
    }

    /// A stream's rollover counter in the message is where its context starts.
    #[test]
    fn an_announced_key_gives_its_context() {
        let key = MasterKey { key: [1; 16], salt: [2; 14] };
        let b64 = Mikey::announce(Suite::AesCm128HmacSha1_80, &key, 7, [5; 20], 9);
        let m = Mikey::parse_base64(&b64).unwrap();
        assert_eq!((m.csb_id, m.sessions.clone(), m.key.clone()), (0x0505_0505, vec![(7, 0)], key.clone()));
        let with_roc = Mikey { sessions: vec![(7, 2)], ..m };
        let mut tx = crate::rtp::srtp::Context::new(Suite::AesCm128HmacSha1_80, &key);
        tx.set_roc(7, 2);
        let mut p = vec![0x80, 96, 0, 5, 0, 0, 0, 1, 0, 0, 0, 7, 1, 2, 3];
        tx.protect_rtp(&mut p).unwrap();
        with_roc.context().unprotect_rtp(&mut p).unwrap();
    }

    #[test]
    fn refusals_say_why() {
        let b = sample().write([9; 16], 0);
        assert_eq!(Mikey::parse(&b[..b.len() - 5]), Err(MikeyError::Truncated));
        let mut v = b.clone();
        v[0] = 2;
        assert_eq!(Mikey::parse(&v), Err(MikeyError::Version(2)));
        let mut v = b.clone();
        v[1] = 2; // public-key initiation
        assert_eq!(Mikey::parse(&v), Err(MikeyError::DataType(2)));
        // KEMAC with an encryption algorithm set: the KEMAC payload starts after the SP's.
        let kemac = b.len() - (1 + 1 + 2 + 2 + 2 + 30 + 1);
        let mut v = b.clone();
        v[kemac + 1] = 1;
        assert_eq!(Mikey::parse(&v), Err(MikeyError::Protected));
    }

    /// The header as GStreamer and gortsplib write it (spaces after `;` or not).
    #[test]
    fn a_key_mgmt_header_gives_its_message() {
        let b64 = sample().write_base64([9; 16], 0);
        for h in [
            format!("prot=mikey; uri=\"rtsps://h/s/trackID=0\"; data=\"{b64}\""),
            format!("prot=mikey;uri=\"rtsps://h/s\";data=\"{b64}\""),
        ] {
            assert_eq!(parse_key_mgmt(&h), Ok(sample()));
        }
        assert_eq!(parse_key_mgmt(&format!("prot=other; data=\"{b64}\"")), Err(MikeyError::NotMikey));
        assert_eq!(parse_key_mgmt("prot=mikey; uri=\"x\""), Err(MikeyError::NotMikey));
        assert_eq!(parse_key_mgmt("prot=mikey; data=\"AQ==\""), Err(MikeyError::Truncated));
    }

    proptest! {
        #[test]
        fn key_mgmt_headers_never_panic(h in ".{0,120}") {
            let _ = parse_key_mgmt(&h);
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Mikey::parse(&data);
        }

        #[test]
        fn any_message_round_trips(csb in any::<u32>(), ssrc in any::<u32>(), roc in any::<u32>(), key in any::<[u8; 16]>(), salt in any::<[u8; 14]>()) {
            let m = Mikey { csb_id: csb, sessions: vec![(ssrc, roc)], suite: Suite::AesCm128HmacSha1_80, key: MasterKey { key, salt } };
            prop_assert_eq!(Mikey::parse(&m.write([7; 16], 1)), Ok(m));
        }
    }
}
