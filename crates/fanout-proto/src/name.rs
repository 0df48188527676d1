//! Path names: the one rule every face, pattern, recording and API call shares, and where a
//! name ends inside an HTTP request path.
//!
//! A name is 1-128 characters in steps split by `/` (`live/cam1`, as MediaMTX users name
//! them); each step is 1+ of `A-Z a-z 0-9 _ - .` and not only dots (URLs resolve `.` and `..`
//! away, and a recording directory named `..` would leave its root). No `=`, so the last step
//! of an RTSP URL that has one (`trackID=0`, `streamid=0`, `stream=0`) is always a track's
//! control, never part of the name.

/// The longest name.
pub const MAX_LEN: usize = 128;

/// A regular expression for the characters a name may hold (steps unchecked).
pub const CHARS: &str = "[A-Za-z0-9_./-]";

/// Checks `name` against the rule; the error says what is wrong.
pub fn check(name: &str) -> Result<(), crate::Invalid> {
    let chars = name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b));
    if name.is_empty() || name.len() > MAX_LEN || !chars {
        return Err(format!(
            "path name {name:?} must be 1-{MAX_LEN} characters of A-Z a-z 0-9 _ - . and / between steps"
        )
        .into());
    }
    if let Some(step) = name.split('/').find(|s| s.bytes().all(|b| b == b'.')) {
        return Err(match step {
            "" => format!("path name {name:?} has an empty step (a leading, trailing or double /)"),
            _ => format!("path name {name:?} has a step of only dots: it cannot be addressed in a URL or recorded"),
        }
        .into());
    }
    Ok(())
}

/// The request shapes after a name, for each prefix a name follows in an HTTP path: `*` is
/// any one step. Longer shapes are tried first, so a name's own last step may equal a
/// suffix's word only where `%2F` spells its slashes (`/v1/sessions/a%2Fstream`).
const SHAPES: &[(&str, &[&[&str]])] = &[
    (
        "/v1/sessions/",
        &[
            &["sinks", "*", "layers"],
            &["sinks", "*"],
            &["readers", "*"],
            &["readers"],
            &["publisher"],
            &["whep", "*"],
            &["whip", "*"],
            &["hls", "*"],
            &["sinks"],
            &["stream"],
            &["whep"],
            &["whip"],
            &[],
        ],
    ),
    ("/v1/recordings/", &[&["files", "*"], &["get"], &["index.m3u8"], &["fragment.m4s"], &["fragment.ts"], &[]]),
    ("/", &[&["whep", "*"], &["whip", "*"], &["whep"], &["whip"]]),
];

/// An HTTP request path whose name has `/` in it, with those slashes written `%2F` so the
/// name is one step for the router (`/live/cam1/whep` → `/live%2Fcam1/whep`); `None` where
/// nothing is to change (a name of one step, or no name at all).
pub fn encode_in_http_path(path: &str) -> Option<String> {
    for (prefix, shapes) in SHAPES {
        let Some(rest) = path.strip_prefix(prefix) else { continue };
        let steps: Vec<&str> = rest.split('/').collect();
        for shape in *shapes {
            let Some(named) = steps.len().checked_sub(shape.len()).filter(|&n| n >= 1) else { continue };
            let fits = shape.iter().zip(&steps[named..]).all(|(want, got)| *want == "*" || want == got);
            if !fits || steps[..named].iter().any(|s| s.is_empty()) {
                continue;
            }
            if named == 1 {
                return None;
            }
            let tail: String = steps[named..].iter().map(|s| format!("/{s}")).collect();
            return Some(format!("{prefix}{}{tail}", steps[..named].join("%2F")));
        }
        if *prefix != "/" {
            // Under the API's prefixes a path that fits no shape is the API's own 404.
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names() {
        let long = "x".repeat(MAX_LEN);
        for good in ["cam1", "a", "live.cam-1_x", "..a", "a..", "live/cam1", "a/b/c.d", "x/..y", &long] {
            assert!(check(good).is_ok(), "{good:?}");
        }
        let too_long = "x".repeat(MAX_LEN + 1);
        for bad in [
            "",
            ".",
            "..",
            "....",
            "a b",
            "a\nb",
            "/a",
            "a/",
            "a//b",
            "a/../b",
            "live/.",
            "./a",
            "a=b",
            "\u{1b}[2J",
            &too_long,
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_in_http_paths() {
        let cases = [
            ("/live/cam1/whep", Some("/live%2Fcam1/whep")),
            ("/live/cam1/whep/ab12", Some("/live%2Fcam1/whep/ab12")),
            ("/a/b/c/whip", Some("/a%2Fb%2Fc/whip")),
            ("/cam1/whep", None),
            ("/v1/sessions/live/cam1", Some("/v1/sessions/live%2Fcam1")),
            ("/v1/sessions/live/cam1/hls/index.m3u8", Some("/v1/sessions/live%2Fcam1/hls/index.m3u8")),
            ("/v1/sessions/live/cam1/sinks/7/layers", Some("/v1/sessions/live%2Fcam1/sinks/7/layers")),
            ("/v1/sessions/live/cam1/whep", Some("/v1/sessions/live%2Fcam1/whep")),
            ("/v1/sessions/cam1/sinks", None),
            // A one-step name before a shape's word: the shape wins.
            ("/v1/sessions/live/stream", None),
            // A file's own steps are `%2F` (as listings write them).
            ("/v1/recordings/live/cam1/files/2026%2Fx.mp4", Some("/v1/recordings/live%2Fcam1/files/2026%2Fx.mp4")),
            ("/v1/recordings/live/cam1/get", Some("/v1/recordings/live%2Fcam1/get")),
            ("/v1/recordings/live/cam1", Some("/v1/recordings/live%2Fcam1")),
            ("/v1/events", None),
            ("/ui/app.js", None),
            ("/", None),
            ("//whep", None),
            ("/a//b/whep", None),
        ];
        for (path, want) in cases {
            assert_eq!(encode_in_http_path(path).as_deref(), want, "{path}");
        }
    }

    proptest! {
        /// Whatever the path: no panic, and a rewrite keeps every step but joins the name's.
        #[test]
        fn rewrites_only_join_a_names_steps(path in "/[a-z0-9/.%]{0,40}") {
            if let Some(out) = encode_in_http_path(&path) {
                prop_assert_eq!(out.replace("%2F", "/"), path.clone());
                prop_assert!(out.len() > path.len());
            }
        }

        #[test]
        fn a_checked_name_has_no_empty_or_dot_step(name in "[a-z./]{0,12}") {
            if check(&name).is_ok() {
                prop_assert!(name.split('/').all(|s| !s.is_empty() && s.bytes().any(|b| b != b'.')));
            }
        }
    }
}
