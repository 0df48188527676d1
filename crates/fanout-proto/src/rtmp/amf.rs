//! AMF0 (Adobe's Action Message Format, version 0), the encoding of RTMP's commands and
//! metadata: numbers, booleans, strings, objects, arrays, null. AMF3 is not spoken: a client
//! that switches to it (the `avmplus` marker) is refused with an error, not misread.

use thiserror::Error;

/// Nesting deeper than this is refused (a hostile peer could recurse without end).
const MAX_DEPTH: usize = 16;
/// Entries in one object or array at most (a count field could claim four billion).
const MAX_ENTRIES: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub enum Amf {
    Number(f64),
    Bool(bool),
    String(String),
    Object(Vec<(String, Amf)>),
    Null,
    Undefined,
    /// An associative array (its count is a hint; the entries end like an object's).
    EcmaArray(Vec<(String, Amf)>),
    StrictArray(Vec<Amf>),
    /// Milliseconds since the epoch (the time zone field is ignored, as the spec says).
    Date(f64),
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AmfError {
    #[error("AMF0 value cut short")]
    Short,
    #[error("AMF0 type marker {0:#04x} is not supported")]
    Marker(u8),
    #[error("AMF0 values nested deeper than {MAX_DEPTH}")]
    Deep,
    #[error("an AMF0 object or array of more than {MAX_ENTRIES} entries")]
    Large,
    #[error("an AMF0 string is not UTF-8")]
    Utf8,
}

impl Amf {
    pub fn str(&self) -> Option<&str> {
        match self {
            Amf::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn number(&self) -> Option<f64> {
        match self {
            Amf::Number(n) => Some(*n),
            _ => None,
        }
    }

    /// A property of an object or associative array.
    pub fn get(&self, key: &str) -> Option<&Amf> {
        match self {
            Amf::Object(v) | Amf::EcmaArray(v) => v.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// An object of the given properties.
    pub fn object<'a>(props: impl IntoIterator<Item = (&'a str, Amf)>) -> Amf {
        Amf::Object(props.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    pub fn string(s: &str) -> Amf {
        Amf::String(s.to_string())
    }
}

/// Every value in `buf`, in order (a command's name, transaction id and arguments).
pub fn decode_all(mut buf: &[u8]) -> Result<Vec<Amf>, AmfError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (v, n) = decode(buf)?;
        out.push(v);
        buf = &buf[n..];
        if out.len() > MAX_ENTRIES {
            return Err(AmfError::Large);
        }
    }
    Ok(out)
}

/// One value from the start of `buf`, and how many bytes it took.
pub fn decode(buf: &[u8]) -> Result<(Amf, usize), AmfError> {
    let mut r = Reader { buf, pos: 0 };
    let v = r.value(0)?;
    Ok((v, r.pos))
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], AmfError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(AmfError::Short)?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, AmfError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<usize, AmfError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u32(&mut self) -> Result<usize, AmfError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn f64(&mut self) -> Result<f64, AmfError> {
        let b = self.take(8)?;
        Ok(f64::from_be_bytes(b.try_into().expect("8 bytes")))
    }

    fn utf8(&mut self, n: usize) -> Result<String, AmfError> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| AmfError::Utf8)
    }

    /// Key/value pairs up to the empty key and the object-end marker.
    fn props(&mut self, depth: usize) -> Result<Vec<(String, Amf)>, AmfError> {
        let mut v = Vec::new();
        loop {
            let n = self.u16()?;
            if n == 0 && self.buf.get(self.pos) == Some(&0x09) {
                self.pos += 1;
                return Ok(v);
            }
            let k = self.utf8(n)?;
            v.push((k, self.value(depth + 1)?));
            if v.len() > MAX_ENTRIES {
                return Err(AmfError::Large);
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<Amf, AmfError> {
        if depth > MAX_DEPTH {
            return Err(AmfError::Deep);
        }
        Ok(match self.u8()? {
            0x00 => Amf::Number(self.f64()?),
            0x01 => Amf::Bool(self.u8()? != 0),
            0x02 => {
                let n = self.u16()?;
                Amf::String(self.utf8(n)?)
            }
            0x03 => Amf::Object(self.props(depth)?),
            0x05 => Amf::Null,
            0x06 => Amf::Undefined,
            0x08 => {
                self.u32()?; // a hint only
                Amf::EcmaArray(self.props(depth)?)
            }
            0x0a => {
                let n = self.u32()?;
                if n > MAX_ENTRIES {
                    return Err(AmfError::Large);
                }
                Amf::StrictArray((0..n).map(|_| self.value(depth + 1)).collect::<Result<_, _>>()?)
            }
            0x0b => {
                let ms = self.f64()?;
                self.take(2)?;
                Amf::Date(ms)
            }
            0x0c => {
                let n = self.u32()?;
                Amf::String(self.utf8(n)?)
            }
            m => return Err(AmfError::Marker(m)),
        })
    }
}

/// Appends `v`'s encoding to `out`.
pub fn encode(v: &Amf, out: &mut Vec<u8>) {
    fn key(k: &str, out: &mut Vec<u8>) {
        let k = &k.as_bytes()[..k.len().min(0xffff)];
        out.extend_from_slice(&(k.len() as u16).to_be_bytes());
        out.extend_from_slice(k);
    }
    match v {
        Amf::Number(n) => {
            out.push(0x00);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Amf::Bool(b) => out.extend_from_slice(&[0x01, u8::from(*b)]),
        Amf::String(s) if s.len() <= 0xffff => {
            out.push(0x02);
            key(s, out);
        }
        Amf::String(s) => {
            out.push(0x0c);
            out.extend_from_slice(&(s.len() as u32).to_be_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Amf::Object(props) | Amf::EcmaArray(props) => {
            if let Amf::EcmaArray(_) = v {
                out.push(0x08);
                out.extend_from_slice(&(props.len() as u32).to_be_bytes());
            } else {
                out.push(0x03);
            }
            for (k, v) in props {
                key(k, out);
                encode(v, out);
            }
            out.extend_from_slice(&[0, 0, 0x09]);
        }
        Amf::Null => out.push(0x05),
        Amf::Undefined => out.push(0x06),
        Amf::StrictArray(items) => {
            out.push(0x0a);
            out.extend_from_slice(&(items.len() as u32).to_be_bytes());
            for v in items {
                encode(v, out);
            }
        }
        Amf::Date(ms) => {
            out.push(0x0b);
            out.extend_from_slice(&ms.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
        }
    }
}

/// The encoding of several values, one after another.
pub fn encode_all(values: &[Amf]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        encode(v, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_connect_command_as_ffmpeg_sends_it() {
        // "connect", 1, { app: "live", flashVer: "FMLE/3.0", tcUrl: "rtmp://h/live", fpad: false }
        let cmd = encode_all(&[
            Amf::string("connect"),
            Amf::Number(1.0),
            Amf::object([
                ("app", Amf::string("live")),
                ("flashVer", Amf::string("FMLE/3.0")),
                ("tcUrl", Amf::string("rtmp://h/live")),
                ("fpad", Amf::Bool(false)),
            ]),
        ]);
        assert_eq!(&cmd[..3], &[0x02, 0x00, 0x07]);
        let v = decode_all(&cmd).unwrap();
        assert_eq!(v[0].str(), Some("connect"));
        assert_eq!(v[1].number(), Some(1.0));
        assert_eq!(v[2].get("tcUrl").and_then(Amf::str), Some("rtmp://h/live"));
        assert_eq!(v[2].get("fpad"), Some(&Amf::Bool(false)));
    }

    #[test]
    fn hostile_input_is_refused_not_followed() {
        assert_eq!(decode(&[0x02, 0x00, 0x05, b'a']), Err(AmfError::Short));
        assert_eq!(decode(&[0x11, 0x02]), Err(AmfError::Marker(0x11)), "AMF3 switch");
        assert_eq!(decode(&[0x0a, 0xff, 0xff, 0xff, 0xff]), Err(AmfError::Large));
        let deep: Vec<u8> = std::iter::repeat_n([0x0a, 0, 0, 0, 1], 40).flatten().collect();
        assert_eq!(decode(&deep), Err(AmfError::Deep));
        assert_eq!(decode(&[0x02, 0x00, 0x01, 0xff]), Err(AmfError::Utf8));
    }

    fn value() -> impl Strategy<Value = Amf> {
        let leaf = prop_oneof![
            any::<i32>().prop_map(|n| Amf::Number(f64::from(n))),
            any::<bool>().prop_map(Amf::Bool),
            "[a-zA-Z0-9 ]{0,20}".prop_map(Amf::String),
            Just(Amf::Null),
            Just(Amf::Undefined),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(("[a-z]{1,8}", inner.clone()), 0..6).prop_map(Amf::Object),
                proptest::collection::vec(("[a-z]{1,8}", inner.clone()), 0..6).prop_map(Amf::EcmaArray),
                proptest::collection::vec(inner, 0..6).prop_map(Amf::StrictArray),
            ]
        })
    }

    proptest! {
        #[test]
        fn what_is_encoded_decodes_the_same(v in proptest::collection::vec(value(), 0..5)) {
            prop_assert_eq!(decode_all(&encode_all(&v)).unwrap(), v);
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_all(&b);
        }
    }
}
