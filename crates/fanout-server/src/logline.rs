//! One event, one log line, whatever a client sent: the log's writer escapes every control
//! character inside an event (`\n` and `\r` above all, which would start a forged line of
//! the attacker's own), keeping the event's final newline. Escape sequences in fields are
//! tracing-subscriber's to neutralise; where the log has no colours, ESC is escaped here too.

use std::io::Write;

/// Writes to stderr, an event at a time, each made one line.
#[derive(Clone, Copy)]
pub struct OneLine {
    /// The formatter writes colour codes (a person's terminal): ESC is its own.
    pub colours: bool,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for OneLine {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line { colours: self.colours }
    }
}

pub struct Line {
    colours: bool,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().lock().write_all(&escape(buf, self.colours))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `event` with its control characters written as `\n`, `\r`, `\t`, `\x1b`…, but its last
/// newline (and ESC where `colours`) kept.
pub fn escape(event: &[u8], colours: bool) -> Vec<u8> {
    let (body, end) = match event.strip_suffix(b"\n") {
        Some(b) => (b, &b"\n"[..]),
        None => (event, &b""[..]),
    };
    let mut out = Vec::with_capacity(event.len() + 8);
    for &b in body {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0x1b if colours => out.push(b),
            b'\t' => out.push(b),
            0..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.extend_from_slice(end);
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn an_event_stays_one_line() {
        let forged = b"WARN refused path=\"cam\nINFO admin logged in\r\x1b[2J\x07\" peer=1\n";
        let out = escape(forged, false);
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(out.ends_with(b"\n"));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "WARN refused path=\"cam\\nINFO admin logged in\\r\\x1b[2J\\x07\" peer=1\n"
        );
        // Colours are the formatter's: ESC passes, the rest is escaped as ever.
        assert_eq!(escape(b"\x1b[32mINFO\x1b[0m a\nb\n", true), b"\x1b[32mINFO\x1b[0m a\\nb\n");
    }

    proptest::proptest! {
        #[test]
        fn never_more_than_one_newline(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200), colours: bool) {
            let out = escape(&bytes, colours);
            let newlines = out.iter().filter(|&&b| b == b'\n').count();
            proptest::prop_assert!(newlines <= 1);
            proptest::prop_assert!(!out.contains(&b'\r'));
            if newlines == 1 {
                proptest::prop_assert!(out.ends_with(b"\n"));
            }
        }
    }
}
