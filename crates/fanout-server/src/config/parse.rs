//! Reading a config file: every problem found in one pass, each at its line (syntax, types,
//! unknown keys, ranges), so that a user fixes them all at once.

use super::*;

/// Where in the file a span is: its line, and the message to show with it.
pub(super) type LineOf<'a> = dyn Fn(Option<std::ops::Range<usize>>, &str) -> (usize, String) + 'a;

/// A field's message that names its key (serde's type errors do not).
pub(super) fn named(key: &str, msg: &str) -> String {
    if msg.contains(key) {
        msg.to_string()
    } else {
        format!("{key}: {msg}")
    }
}

/// A parser's message, with what a person should write instead where it is not plain.
pub(super) fn explain(msg: &str) -> String {
    if msg.contains("invalid socket address syntax") {
        return format!("{msg}: expected \"IP:PORT\", e.g. \"127.0.0.1:5000\" or \"[::1]:5000\"");
    }
    if msg.contains("invalid float") || msg.contains("invalid integer") || msg.contains("invalid number") {
        return format!(
            "{msg} (an address, a URL or a name is a string: put it in quotes, e.g. api = \"127.0.0.1:7070\")"
        );
    }
    msg.to_string()
}

/// Every field error of one `[[session]]`: each of its keys deserialized on its own, beside
/// a name and a source that are right, so that a typo in its source does not hide a
/// misspelt key after it.
pub(super) fn session_field_errors(s: &toml::Spanned<toml::de::DeValue<'_>>, at: &LineOf<'_>) -> Vec<(usize, String)> {
    // A session that is right but for the key tried: its name and source where it lacks them.
    const STAND_IN: &str = "name = \"x\"\nsource = { demo = true }\n";
    let Some(table) = s.get_ref().as_table() else {
        let e = SessionSpec::deserialize(toml::de::ValueDeserializer::from(s.clone())).err();
        return e.map(|e| at(e.span().or(Some(s.span())), e.message())).into_iter().collect();
    };
    let stand_in = DeTable::parse(STAND_IN).expect("a constant").into_inner();
    let mut errors = Vec::new();
    for (key, value) in table.iter() {
        let mut one = stand_in.clone();
        one.remove(key.get_ref().as_ref());
        one.insert(key.clone(), value.clone());
        let de = toml::de::Deserializer::from(toml::Spanned::new(value.span(), one));
        if let Err(e) = SessionSpec::deserialize(de) {
            errors.push(at(e.span().or(Some(key.span())), &named(key.get_ref(), e.message())));
        }
    }
    // Its name checked too (the rest of it waits for its fields to be mended).
    if let Some((key, name)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == "name") {
        let mut one = stand_in.clone();
        one.remove("name");
        one.insert(key.clone(), name.clone());
        let de = toml::de::Deserializer::from(toml::Spanned::new(name.span(), one));
        if let Err(why) = SessionSpec::deserialize(de).map(|spec| spec.validate()).unwrap_or(Ok(())) {
            errors.push(at(Some(key.span()), &why.0));
        }
    }
    if errors.is_empty() {
        // Wrong only as a whole (a key missing): say that.
        if let Err(e) = SessionSpec::deserialize(toml::de::ValueDeserializer::from(s.clone())) {
            errors.push(at(e.span().or(Some(s.span())), e.message()));
        }
    }
    errors
}

impl Config {
    /// Reads and checks a config file; every problem is reported, each with the file and the
    /// line it is on.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|errors| {
            let file = path.display();
            anyhow::anyhow!("{}", errors.iter().map(|e| format!("{file}:{e}")).collect::<Vec<_>>().join("\n"))
        })
    }

    /// Parses and checks a config; on failure, every problem found as `line N: what`, in
    /// order of line: syntax, then each key's type (each key of each session on its own),
    /// then the ranges of everything else, so one pass shows them all.
    pub fn parse(text: &str) -> Result<Self, Problems> {
        let line = |offset: usize| text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1;
        let at = |span: Option<std::ops::Range<usize>>, msg: &str| match span {
            Some(s) => (line(s.start), explain(msg.trim())),
            None => (0, explain(msg.trim())),
        };
        let (doc, syntax) = DeTable::parse_recoverable(text);
        let mut errors: Vec<(usize, String)> = syntax.iter().map(|e| at(e.span(), e.message())).collect();
        // One syntax error a line: the one that says what is wrong ("invalid …") over what
        // followed from it ("number overflowed").
        let said: Vec<usize> = errors.iter().filter(|(_, m)| m.starts_with("invalid")).map(|(l, _)| *l).collect();
        errors.retain(|(l, m)| m.starts_with("invalid") || !said.contains(l));
        let (fields, good) = Self::field_errors(doc.get_ref(), &at);
        // (A value the syntax error already named is not told of again.)
        let syntax_lines: Vec<usize> = errors.iter().map(|(l, _)| *l).collect();
        errors.extend(fields.into_iter().filter(|(l, _)| !syntax_lines.contains(l)));
        // The keys (and sessions) that deserialize, checked for their ranges.
        let de = toml::de::Deserializer::from(toml::Spanned::new(0..text.len(), good.clone()));
        match Config::deserialize(de) {
            Ok(cfg) => errors.extend(cfg.range_errors(&good, &line)),
            Err(e) => errors.push(at(e.span(), e.message())),
        }
        if errors.is_empty() {
            return Ok(toml::from_str(text).expect("parsed above"));
        }
        errors.sort();
        errors.dedup();
        Err(Problems(errors.into_iter().map(|(l, m)| if l > 0 { format!("line {l}: {m}") } else { m }).collect()))
    }

    /// Type and unknown-field errors, each top-level key and each key of each session
    /// deserialized on its own so that one bad field does not hide the next; and the document
    /// without the keys and sessions that had one.
    fn field_errors<'i>(doc: &DeTable<'i>, at: &LineOf<'_>) -> (Vec<(usize, String)>, DeTable<'i>) {
        let mut errors = Vec::new();
        let mut good = DeTable::new();
        for (key, value) in doc.iter() {
            if key.get_ref().as_ref() == "session" {
                if let Some(sessions) = value.get_ref().as_array() {
                    let mut kept = toml::de::DeArray::new();
                    for s in sessions.iter() {
                        let de = toml::de::ValueDeserializer::from(s.clone());
                        if SessionSpec::deserialize(de).is_ok() {
                            kept.push(s.clone());
                        } else {
                            errors.extend(session_field_errors(s, at));
                        }
                    }
                    let span = value.span();
                    good.insert(key.clone(), toml::Spanned::new(span, toml::de::DeValue::Array(kept)));
                    continue;
                }
            }
            let mut one = DeTable::new();
            one.insert(key.clone(), value.clone());
            let de = toml::de::Deserializer::from(toml::Spanned::new(value.span(), one));
            match Config::deserialize(de) {
                Ok(_) => {
                    good.insert(key.clone(), value.clone());
                }
                Err(e) => errors.push(at(e.span().or(Some(key.span())), &named(key.get_ref(), e.message()))),
            }
        }
        (errors, good)
    }

    /// Values of the right type but out of their range, each at the line of its key; then
    /// the sections' and the sessions' problems.
    fn range_errors(&self, doc: &DeTable, line: &dyn Fn(usize) -> usize) -> Vec<(usize, String)> {
        let key_line =
            |key: &str| doc.iter().find(|(k, _)| k.get_ref().as_ref() == key).map_or(0, |(k, _)| line(k.span().start));
        let keyed = self.engine_problems().into_iter().chain(self.face_problems()).chain(self.section_problems());
        let mut errors: Vec<(usize, String)> = keyed.map(|(key, msg)| (key_line(key), msg)).collect();
        errors.extend(self.session_problems(doc, line));
        errors
    }

    /// The engine's values out of their range, by key.
    fn engine_problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &'static str, msg: String| {
            if !ok {
                problems.push((key, msg));
            }
        };
        let max_ring = crate::spec::MAX_RING;
        check(
            (2..=max_ring).contains(&self.ring),
            "ring",
            format!("ring {} is out of range 2..={max_ring}", self.ring),
        );
        let max_dg = crate::spec::MAX_DATAGRAM;
        check(
            (188..=max_dg).contains(&self.max_datagram),
            "max_datagram",
            format!("max_datagram {} is out of range 188..={max_dg}", self.max_datagram),
        );
        check(
            (1..=crate::spec::MAX_SINKS_PER_GROUP).contains(&self.sinks_per_group),
            "sinks_per_group",
            format!(
                "sinks_per_group {} is out of range 1..={}",
                self.sinks_per_group,
                crate::spec::MAX_SINKS_PER_GROUP
            ),
        );
        check(
            KERNEL_SINKS.contains(&self.kernel_sinks),
            "kernel_sinks",
            format!(
                "kernel_sinks {} is out of range {}..={}",
                self.kernel_sinks,
                KERNEL_SINKS.start(),
                KERNEL_SINKS.end()
            ),
        );
        check(
            self.workers <= MAX_WORKERS,
            "workers",
            format!("workers {} is out of range 0..={MAX_WORKERS}", self.workers),
        );
        if let Err(e) = self.worker_priority.parse::<fanout_io::ThreadPriority>() {
            check(false, "worker_priority", format!("worker_priority {e}"));
        }
        check(
            self.shed_after_ms <= MAX_SHED_AFTER_MS,
            "shed_after_ms",
            format!("shed_after_ms {} is out of range 0..={MAX_SHED_AFTER_MS}", self.shed_after_ms),
        );
        check(
            self.egress_kbps == 0 || (8..=MAX_EGRESS_KBPS).contains(&self.egress_kbps),
            "egress_kbps",
            format!("egress_kbps {} is out of range 8..={MAX_EGRESS_KBPS} (0: not limited)", self.egress_kbps),
        );
        problems
    }

    /// The faces' values (RTSP, SRT, hooks, publishers, timeouts, the token) out of their
    /// range, by key.
    fn face_problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &'static str, msg: String| {
            if !ok {
                problems.push((key, msg));
            }
        };
        check(self.rtsp_max_connections >= 1, "rtsp_max_connections", "rtsp_max_connections must be at least 1".into());
        if let Some(Err(e)) = self.rtsp_multicast.as_ref().map(super::RtspMulticast::groups) {
            check(false, "rtsp_multicast", e);
        }
        check(
            (1.0..=86_400.0).contains(&self.rtsp_idle_s),
            "rtsp_idle_s",
            format!("rtsp_idle_s {} is out of range 1..=86400", self.rtsp_idle_s),
        );
        for (key, cmd) in [("on_connect", &self.on_connect), ("on_disconnect", &self.on_disconnect)] {
            if let Err(e) = crate::spec::check_command(key, cmd) {
                check(false, key, e.0);
            }
        }
        let pass_len = self.srt_passphrase.as_ref().map_or(10, |p| p.chars().count());
        check(
            (10..=79).contains(&pass_len),
            "srt_passphrase",
            format!("srt_passphrase has {pass_len} characters: SRT takes 10 to 79"),
        );
        check(
            matches!(self.srt_pbkeylen, 16 | 24 | 32),
            "srt_pbkeylen",
            format!("srt_pbkeylen {}: 16, 24 or 32 (AES-128, -192, -256)", self.srt_pbkeylen),
        );
        check(
            (20..=10_000).contains(&self.srt_latency_ms),
            "srt_latency_ms",
            format!("srt_latency_ms {} is out of range 20..=10000", self.srt_latency_ms),
        );
        check(
            (0.0..=86_400.0).contains(&self.publisher_grace_s),
            "publisher_grace_s",
            format!("publisher_grace_s {} is out of range 0..=86400", self.publisher_grace_s),
        );
        check(
            (0.0..=604_800.0).contains(&self.upgrade_drain_s),
            "upgrade_drain_s",
            format!("upgrade_drain_s {} is out of range 0..=604800", self.upgrade_drain_s),
        );
        let layout = fanout_proto::container::record::Layout::new(&self.record_path);
        check(layout.is_ok(), "record_path", layout.err().map(|e| e.0).unwrap_or_default());
        check(
            (0.5..=600.0).contains(&self.request_timeout_s),
            "request_timeout_s",
            format!("request_timeout_s {} is out of range 0.5..=600", self.request_timeout_s),
        );
        check(self.api_max_connections >= 1, "api_max_connections", "api_max_connections must be at least 1".into());
        check(
            !self.rtsp_require_token || self.token.is_some(),
            "rtsp_require_token",
            "rtsp_require_token needs a token".into(),
        );
        let max_flush = crate::spec::MAX_STREAM_FLUSH_MS;
        check(
            self.stream_flush_ms <= max_flush,
            "stream_flush_ms",
            format!("stream_flush_ms {} is out of range 0..={max_flush}", self.stream_flush_ms),
        );
        check(self.max_body >= MIN_BODY, "max_body", format!("max_body {} is below {MIN_BODY}", self.max_body));
        check(
            self.token.as_ref().is_none_or(|t| !t.is_empty()),
            "token",
            "token must not be empty (leave it out for an open API)".into(),
        );
        problems
    }

    /// `[cluster]`, `[auth]`, the patterns, the ICE servers and the RTSP users, by key.
    fn section_problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &'static str, msg: String| {
            if !ok {
                problems.push((key, msg));
            }
        };
        if let Some(c) = &self.cluster {
            if let Err(e) = c.validate() {
                check(false, "cluster", e.0);
            }
        }
        if let Some(a) = &self.auth {
            if let Err(e) = a.validate() {
                check(false, "auth", e.0);
            }
        }
        for p in &self.patterns {
            if let Err(e) = p.rule() {
                check(false, "pattern", format!("pattern {e}"));
            }
            check(
                (0.0..=3600.0).contains(&p.linger_s),
                "pattern",
                format!("pattern {:?}: linger_s {} is out of range 0..=3600", p.matches, p.linger_s),
            );
            check(
                (1..=10_000).contains(&p.max_paths),
                "pattern",
                format!("pattern {:?}: max_paths {} is out of range 1..=10000", p.matches, p.max_paths),
            );
            // The template as a name would make it (the pattern's text as the name).
            if let Err(e) = p.session("x") {
                check(false, "pattern", e.0);
            }
        }
        for ice in &self.webrtc_ice_servers {
            let scheme = ice.url.split(':').next().unwrap_or("");
            let quoted = |v: &Option<String>| v.as_deref().is_none_or(|v| !v.contains(['"', '\\', '\r', '\n']));
            check(
                matches!(scheme, "stun" | "stuns" | "turn" | "turns")
                    && !ice.url.contains(['<', '>', ' ', '"', '\r', '\n'])
                    && quoted(&ice.username)
                    && quoted(&ice.credential)
                    && (scheme.starts_with("turn") == (ice.username.is_some() && ice.credential.is_some())),
                "webrtc_ice_server",
                format!(
                    "webrtc_ice_server {:?}: a stun:, stuns:, turn: or turns: URL (no spaces, quotes or angle brackets); a TURN server needs username and credential, a STUN server neither",
                    ice.url
                ),
            );
        }
        for u in &self.rtsp_users {
            check(
                !u.name.is_empty() && !u.name.contains(':'),
                "rtsp_user",
                format!("rtsp_user name {:?} must be non-empty, without ':'", u.name),
            );
        }
        let mut names = std::collections::HashSet::new();
        for u in &self.users {
            if let Err(e) = u.validate() {
                check(false, "user", e.0);
            }
            check(names.insert(u.name.as_str()), "user", format!("user {:?} is given twice", u.name));
        }
        for u in &self.rtsp_users {
            check(
                !names.contains(u.name.as_str()),
                "rtsp_user",
                format!("{:?} is both an rtsp_user and a [[user]]: keep the [[user]]", u.name),
            );
        }
        problems
    }

    /// Each session's problem, at the line of the field it names, else of its table.
    fn session_problems(&self, doc: &DeTable, line: &dyn Fn(usize) -> usize) -> Vec<(usize, String)> {
        let mut errors = Vec::new();
        let sessions =
            doc.iter().find(|(k, _)| k.get_ref().as_ref() == "session").and_then(|(_, v)| v.get_ref().as_array());
        for (i, s) in self.sessions.iter().enumerate() {
            let Err(e) = s.validate() else { continue };
            let table = sessions.and_then(|a| a.get(i));
            let l = table.map_or(0, |t| {
                let mut keys = Vec::new();
                collect_keys(t, &mut keys);
                keys.iter()
                    .filter(|(k, _)| e.0.contains(k.as_str()))
                    .max_by_key(|(k, _)| k.len())
                    .map_or(line(t.span().start), |(_, off)| line(*off))
            });
            errors.push((l, format!("session {:?}: {e}", s.name)));
        }
        // Names are what a reload tells sessions apart by: each once.
        for (i, s) in self.sessions.iter().enumerate() {
            if self.sessions[..i].iter().any(|o| o.name == s.name) {
                let l = sessions.and_then(|a| a.get(i)).map_or(0, |t| line(t.span().start));
                errors.push((l, format!("session {:?} is named twice", s.name)));
            }
        }
        errors
    }
}

/// Every key of a table and of the tables within it, with its offset.
pub(super) fn collect_keys(value: &toml::Spanned<toml::de::DeValue>, out: &mut Vec<(String, usize)>) {
    match value.get_ref() {
        toml::de::DeValue::Table(t) => {
            for (k, v) in t.iter() {
                out.push((k.get_ref().to_string(), k.span().start));
                collect_keys(v, out);
            }
        }
        toml::de::DeValue::Array(a) => a.iter().for_each(|v| collect_keys(v, out)),
        _ => {}
    }
}
