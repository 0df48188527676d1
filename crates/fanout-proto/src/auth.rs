//! Who may do what, decided outside the relay (issue 34): the question every face asks (a
//! [`Request`]: who, from where, which action on which path, over which protocol), the JSON
//! an HTTP auth callback receives, JWT checking against a JWKS with the permissions its
//! claims list, and the short cache of answers. Sans-IO: the caller fetches the keys, posts
//! the callback and passes the time.

pub use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;

/// What a client wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Publish,
    Read,
    Playback,
    Api,
    /// `/metrics` (an `api` permission allows it too).
    Metrics,
}

/// The question a face asks: the JSON body an HTTP callback gets, as is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    pub user: String,
    pub password: String,
    /// A bearer token or a `token` query parameter.
    pub token: String,
    pub ip: IpAddr,
    pub action: Action,
    /// The stream name (empty for `api`).
    pub path: String,
    /// `rtsp`, `rtsps`, `rtmp`, `rtmps`, `srt`, `webrtc`, `http`, `hls` or `api`.
    pub protocol: &'static str,
    /// The request's query string, without the credentials it carried.
    pub query: String,
}

impl Request {
    /// The callback's body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a plain struct serializes")
    }

    /// The JWT this request carries: the token, else the password (players that can only
    /// send a user and a password put it there).
    pub fn jwt(&self) -> Option<&str> {
        [self.token.as_str(), self.password.as_str()].into_iter().find(|t| t.matches('.').count() == 2)
    }

    /// What the cache files an answer under: everything the answer depends on, hashed, so
    /// that the cache holds no secret in the clear.
    pub fn cache_key(&self) -> [u8; 20] {
        use sha1::Digest as _;
        let mut h = sha1::Sha1::new();
        for part in [&self.user, &self.password, &self.token, &self.path, &self.query] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        h.update(self.ip.to_string().as_bytes());
        h.update([self.action as u8]);
        h.update(self.protocol.as_bytes());
        h.finalize().into()
    }
}

/// A path rule: the name itself, `~regex` (found anywhere in the name, as MediaMTX's are:
/// anchor it with `^…$` to match the whole), or none (any).
#[derive(Debug, Clone)]
pub enum PathRule {
    Any,
    Exact(String),
    Pattern(regex::Regex),
}

impl PathRule {
    pub fn parse(s: Option<&str>) -> Result<Self, crate::Invalid> {
        match s {
            None | Some("") => Ok(Self::Any),
            Some(p) => match p.strip_prefix('~') {
                Some(re) => {
                    regex::Regex::new(re).map(Self::Pattern).map_err(|e| crate::Invalid(format!("path {p:?}: {e}")))
                }
                None => Ok(Self::Exact(p.to_string())),
            },
        }
    }

    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(p) => p == path,
            Self::Pattern(re) => re.is_match(path),
        }
    }
}

impl PartialEq for PathRule {
    fn eq(&self, o: &Self) -> bool {
        match (self, o) {
            (Self::Any, Self::Any) => true,
            (Self::Exact(a), Self::Exact(b)) => a == b,
            (Self::Pattern(a), Self::Pattern(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

/// One thing a token or a user allows: an action on the paths its rule matches.
#[derive(Debug, Clone, PartialEq)]
pub struct Permission {
    pub action: Action,
    pub path: PathRule,
}

/// Whether `perms` allow `action` on `path` (`api` and `metrics` take no path; `api`
/// allows `metrics` too).
pub fn permits(perms: &[Permission], action: Action, path: &str) -> bool {
    perms.iter().any(|p| match action {
        Action::Api => p.action == Action::Api,
        Action::Metrics => matches!(p.action, Action::Api | Action::Metrics),
        _ => p.action == action && p.path.matches(path),
    })
}

/// Why a JWT was not taken (said in the log; never the token).
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum JwtError {
    #[error("not a JWT ({0})")]
    Malformed(String),
    #[error("algorithm {0:?} is not taken (RS256, ES256, EdDSA are)")]
    Algorithm(Algorithm),
    #[error("no key in the JWKS for kid {0:?}")]
    NoKey(Option<String>),
    #[error("the signature does not verify ({0})")]
    Signature(String),
    #[error("expired")]
    Expired,
    #[error("not valid yet")]
    NotYet,
    #[error("claim {claim:?}: {why}")]
    Claim { claim: String, why: String },
}

/// Seconds a token's `exp` and `nbf` may be off, for clocks that differ.
pub const LEEWAY_S: u64 = 30;

/// Checks `token` against `keys` at `now` (Unix seconds): signed with RS256, ES256 or EdDSA
/// by a key of the set (by `kid`, or the only key), not expired (`exp` is required), valid
/// already (`nbf`); returns what its `claim` allows: a list of `{action, path}` (`path`
/// optional, exact or `~regex`).
pub fn verify_jwt(token: &str, keys: &JwkSet, claim: &str, now: u64) -> Result<Vec<Permission>, JwtError> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| JwtError::Malformed(e.to_string()))?;
    if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA) {
        return Err(JwtError::Algorithm(header.alg));
    }
    let jwk = match &header.kid {
        Some(kid) => keys.find(kid),
        None if keys.keys.len() == 1 => keys.keys.first(),
        None => None,
    }
    .ok_or_else(|| JwtError::NoKey(header.kid.clone()))?;
    let key = DecodingKey::from_jwk(jwk).map_err(|e| JwtError::NoKey(Some(format!("{e}"))))?;
    // The clock is ours to read (below), not the library's.
    let mut v = Validation::new(header.alg);
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    v.required_spec_claims.clear();
    let data = jsonwebtoken::decode::<serde_json::Value>(token, &key, &v).map_err(|e| match e.kind() {
        jsonwebtoken::errors::ErrorKind::InvalidSignature => JwtError::Signature(e.to_string()),
        _ => JwtError::Malformed(e.to_string()),
    })?;
    let claims = data.claims;
    let time = |name: &str| claims.get(name).and_then(serde_json::Value::as_u64);
    match time("exp") {
        None => return Err(JwtError::Claim { claim: "exp".into(), why: "missing".into() }),
        // Saturating: an `exp` near 2^64 is far in the future, not wrapped into the past.
        Some(exp) if exp.saturating_add(LEEWAY_S) < now => return Err(JwtError::Expired),
        _ => {}
    }
    if time("nbf").is_some_and(|nbf| nbf > now.saturating_add(LEEWAY_S)) {
        return Err(JwtError::NotYet);
    }
    let bad = |why: crate::Invalid| JwtError::Claim { claim: claim.to_string(), why: why.0 };
    #[derive(Deserialize)]
    struct Entry {
        action: Action,
        path: Option<String>,
    }
    let list = claims.get(claim).cloned().ok_or_else(|| bad("missing".into()))?;
    let entries: Vec<Entry> = serde_json::from_value(list).map_err(|e| bad(crate::Invalid(e.to_string())))?;
    entries
        .into_iter()
        .map(|e| Ok(Permission { action: e.action, path: PathRule::parse(e.path.as_deref()).map_err(bad)? }))
        .collect()
}

/// Answers remembered for a while, so that a player's SETUP and PLAY after its DESCRIBE, or
/// an HLS player's every playlist, do not each ask again. Bounded: past `cap` entries the
/// expired go, and if none has, all.
pub struct Cache {
    entries: HashMap<[u8; 20], (u64, bool)>,
    cap: usize,
}

impl Cache {
    pub fn new(cap: usize) -> Self {
        Self { entries: HashMap::new(), cap }
    }

    /// The answer for `key` if it is still fresh at `now_ms`.
    pub fn get(&self, key: &[u8; 20], now_ms: u64) -> Option<bool> {
        self.entries.get(key).filter(|(until, _)| *until > now_ms).map(|(_, ok)| *ok)
    }

    /// Remembers `ok` for `key` until `until_ms`.
    pub fn put(&mut self, key: [u8; 20], ok: bool, until_ms: u64, now_ms: u64) {
        if self.entries.len() >= self.cap {
            self.entries.retain(|_, (until, _)| *until > now_ms);
            if self.entries.len() >= self.cap {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (until_ms, ok));
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

// Credentials as requests carry them.

/// Whether a request carries the configured token: header `Authorization: Bearer T` (the
/// scheme in any case, RFC 7235), or, where `query` is given (stream URLs only, for players
/// that cannot set headers), `?token=T`. Compared in constant time.
pub fn token_given(token: Option<&str>, auth_header: Option<&str>, query: Option<&str>) -> bool {
    let Some(t) = token else { return true };
    let eq = |given: &str| crate::secret::ct_eq(given.as_bytes(), t.as_bytes());
    let header = auth_header
        .and_then(|h| h.trim().split_once(' '))
        .is_some_and(|(scheme, v)| scheme.eq_ignore_ascii_case("bearer") && eq(v.trim()));
    header
        || query.is_some_and(|q| {
            q.split('&').filter_map(|kv| kv.strip_prefix("token=")).any(|v| eq(&crate::rtsp::client::percent_decode(v)))
        })
}

/// The question a request asks `[auth]`: its credentials (Basic user and password, a
/// Bearer token or a `token` query parameter), where from, and the rest of its query.
pub fn http_request(
    auth_header: Option<&str>,
    query: Option<&str>,
    ip: std::net::IpAddr,
    action: Action,
    path: &str,
    protocol: &'static str,
) -> Request {
    let (mut user, mut password, mut token) = (String::new(), String::new(), String::new());
    match auth_header.and_then(|h| h.trim().split_once(' ')) {
        Some((scheme, v)) if scheme.eq_ignore_ascii_case("bearer") => token = v.trim().to_string(),
        _ => {
            if let Some((u, p)) = auth_header.and_then(crate::http::basic_credentials) {
                (user, password) = (u, p);
            }
        }
    }
    let mut rest = Vec::new();
    for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
        match kv.strip_prefix("token=").or_else(|| kv.strip_prefix("jwt=")) {
            Some(v) if token.is_empty() => token = crate::rtsp::client::percent_decode(v),
            Some(_) => {}
            None => rest.push(kv),
        }
    }
    Request { user, password, token, ip, action, path: path.into(), protocol, query: rest.join("&") }
}

/// The credentials in a query: `user=U&pass=P`, or `token=T` (the user `token`).
pub fn query_credentials(query: &str) -> (Option<&str>, Option<&str>) {
    let param = |k: &str| query.split('&').find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='));
    match (param("user"), param("pass"), param("token")) {
        (Some(u), Some(p), _) => (Some(u), Some(p)),
        (_, _, Some(t)) => (Some("token"), Some(t)),
        _ => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(action: Action, path: &str) -> Request {
        Request {
            user: "u".into(),
            password: "p".into(),
            token: String::new(),
            ip: "192.0.2.1".parse().unwrap(),
            action,
            path: path.into(),
            protocol: "rtsp",
            query: String::new(),
        }
    }

    #[test]
    fn the_callback_gets_every_field() {
        let v: serde_json::Value = serde_json::from_slice(&req(Action::Publish, "cam1").to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({ "user": "u", "password": "p", "token": "", "ip": "192.0.2.1",
                                "action": "publish", "path": "cam1", "protocol": "rtsp", "query": "" })
        );
    }

    #[test]
    fn rules_match_names_as_written() {
        let re = PathRule::parse(Some("~^cam[0-9]+$")).unwrap();
        assert!(re.matches("cam12") && !re.matches("cam") && !re.matches("xcam1") && !re.matches("cam1x"));
        // Without anchors, found anywhere in the name.
        let loose = PathRule::parse(Some("~cam[0-9]")).unwrap();
        assert!(loose.matches("cam1") && loose.matches("mycam12x") && !loose.matches("camera"));
        assert!(PathRule::parse(Some("cam1")).unwrap().matches("cam1"));
        assert!(!PathRule::parse(Some("cam1")).unwrap().matches("cam12"));
        assert!(PathRule::parse(None).unwrap().matches("anything"));
        assert!(PathRule::parse(Some("~(")).is_err());
        let perms = vec![
            Permission { action: Action::Read, path: PathRule::parse(Some("~^cam")).unwrap() },
            Permission { action: Action::Api, path: PathRule::Any },
        ];
        assert!(permits(&perms, Action::Read, "cam7") && !permits(&perms, Action::Read, "lobby"));
        assert!(!permits(&perms, Action::Publish, "cam7") && permits(&perms, Action::Api, ""));
    }

    #[test]
    fn the_jwt_is_the_token_or_else_the_password() {
        let mut r = req(Action::Read, "a");
        assert_eq!(r.jwt(), None);
        r.password = "x.y.z".into();
        assert_eq!(r.jwt(), Some("x.y.z"));
        r.token = "a.b.c".into();
        assert_eq!(r.jwt(), Some("a.b.c"));
    }

    #[test]
    fn the_cache_forgets_and_stays_bounded() {
        let mut c = Cache::new(2);
        let (a, b, x) = (req(Action::Read, "a").cache_key(), req(Action::Read, "b").cache_key(), [9; 20]);
        assert_ne!(a, b);
        assert_ne!(a, req(Action::Publish, "a").cache_key());
        c.put(a, true, 1000, 0);
        assert_eq!(c.get(&a, 999), Some(true));
        assert_eq!(c.get(&a, 1000), None);
        c.put(b, false, 5000, 0);
        // Full: the expired one goes first.
        c.put(x, true, 5000, 2000);
        assert_eq!((c.len(), c.get(&b, 2000), c.get(&x, 2000)), (2, Some(false), Some(true)));
    }

    #[test]
    fn garbage_is_not_a_jwt() {
        let keys = JwkSet { keys: Vec::new() };
        for t in ["", "a.b.c", "eyJhbGciOiJIUzI1NiJ9.e30.x", "...."] {
            assert!(verify_jwt(t, &keys, "fanout", 0).is_err(), "{t}");
        }
        // HS256 (a shared secret) is refused by name.
        let hs = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjF9.sig";
        assert_eq!(verify_jwt(hs, &keys, "fanout", 0).unwrap_err(), JwtError::Algorithm(Algorithm::HS256));
    }

    /// Keys made here (ring), their public halves as a JWKS, tokens signed with them.
    mod signed {
        use super::*;
        use base64::Engine as _;
        use jsonwebtoken::{EncodingKey, Header};
        use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

        fn b64(b: &[u8]) -> String {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
        }

        /// (ES256 key, EdDSA key, the JWKS naming them "ec" and "ed").
        fn keys() -> (EncodingKey, EncodingKey, JwkSet) {
            let rng = ring::rand::SystemRandom::new();
            let ec = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let ec_pub = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, ec.as_ref(), &rng).unwrap();
            let point = ec_pub.public_key().as_ref(); // 0x04 ‖ x ‖ y
            let ed = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
            let ed_pub = Ed25519KeyPair::from_pkcs8(ed.as_ref()).unwrap();
            let set = serde_json::json!({ "keys": [
                { "kty": "EC", "crv": "P-256", "kid": "ec", "alg": "ES256",
                  "x": b64(&point[1..33]), "y": b64(&point[33..]) },
                { "kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "EdDSA", "x": b64(ed_pub.public_key().as_ref()) },
            ]});
            (
                EncodingKey::from_ec_der(ec.as_ref()),
                EncodingKey::from_ed_der(ed.as_ref()),
                serde_json::from_value(set).unwrap(),
            )
        }

        fn token(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: serde_json::Value) -> String {
            let mut h = Header::new(alg);
            h.kid = kid.map(str::to_string);
            jsonwebtoken::encode(&h, &claims, key).unwrap()
        }

        #[test]
        fn a_signed_token_gives_its_permissions_until_it_expires() {
            let (ec, ed, set) = keys();
            let now = 1_800_000_000;
            let claims = serde_json::json!({ "exp": now + 60, "fanout": [
                { "action": "read", "path": "~^cam[0-9]+$" }, { "action": "publish", "path": "cam1" } ] });
            for (alg, kid, key) in [(Algorithm::ES256, "ec", &ec), (Algorithm::EdDSA, "ed", &ed)] {
                let t = token(alg, Some(kid), key, claims.clone());
                let perms = verify_jwt(&t, &set, "fanout", now).unwrap();
                assert!(permits(&perms, Action::Read, "cam7") && permits(&perms, Action::Publish, "cam1"));
                assert!(!permits(&perms, Action::Publish, "cam7") && !permits(&perms, Action::Api, ""));
                // Expired past the leeway; valid within it.
                assert!(verify_jwt(&t, &set, "fanout", now + 60 + LEEWAY_S).is_ok());
                assert_eq!(verify_jwt(&t, &set, "fanout", now + 61 + LEEWAY_S).unwrap_err(), JwtError::Expired);
                // Another claim name: missing.
                assert!(matches!(verify_jwt(&t, &set, "other", now), Err(JwtError::Claim { .. })));
            }
            // The largest `exp` is far off, not wrapped past zero (nor an overflow panic).
            let far = token(Algorithm::ES256, Some("ec"), &ec, serde_json::json!({ "exp": u64::MAX, "fanout": [] }));
            assert!(verify_jwt(&far, &set, "fanout", now).is_ok());
            // Signed by one key, naming the other: the signature does not verify.
            let forged = token(Algorithm::ES256, Some("ec"), &keys().0, claims.clone());
            assert!(matches!(verify_jwt(&forged, &set, "fanout", now), Err(JwtError::Signature(_))));
            let unknown = token(Algorithm::ES256, Some("nope"), &ec, claims.clone());
            assert_eq!(verify_jwt(&unknown, &set, "fanout", now).unwrap_err(), JwtError::NoKey(Some("nope".into())));
            // Without kid, only a set of one key says which.
            let bare = token(Algorithm::ES256, None, &ec, claims.clone());
            assert!(matches!(verify_jwt(&bare, &set, "fanout", now), Err(JwtError::NoKey(None))));
            let one = JwkSet { keys: vec![set.find("ec").unwrap().clone()] };
            assert!(verify_jwt(&bare, &one, "fanout", now).is_ok());
            // No exp: refused; nbf ahead: not yet.
            let forever = token(Algorithm::ES256, Some("ec"), &ec, serde_json::json!({ "fanout": [] }));
            assert!(matches!(verify_jwt(&forever, &set, "fanout", now), Err(JwtError::Claim { .. })));
            let later = token(
                Algorithm::ES256,
                Some("ec"),
                &ec,
                serde_json::json!({ "exp": now + 999, "nbf": now + 99, "fanout": [] }),
            );
            assert_eq!(verify_jwt(&later, &set, "fanout", now).unwrap_err(), JwtError::NotYet);
            // A permission that does not parse refuses the token.
            let bad = token(
                Algorithm::ES256,
                Some("ec"),
                &ec,
                serde_json::json!({ "exp": now + 9, "fanout": [{ "action": "fly" }] }),
            );
            assert!(matches!(verify_jwt(&bad, &set, "fanout", now), Err(JwtError::Claim { .. })));
        }
    }

    proptest! {
        #[test]
        fn any_bytes_are_refused_without_a_panic(t in ".{0,300}") {
            let keys = JwkSet { keys: Vec::new() };
            prop_assert!(verify_jwt(&t, &keys, "fanout", 0).is_err());
        }

        #[test]
        fn any_rule_parses_or_says_why(p in ".{0,40}", name in "[a-z0-9]{0,12}") {
            if let Ok(rule) = PathRule::parse(Some(&p)) {
                let _ = rule.matches(&name);
            }
        }
    }

    #[test]
    fn token_checks() {
        assert!(token_given(None, None, None));
        assert!(token_given(Some("t"), Some("Bearer t"), None));
        assert!(token_given(Some("t"), None, Some("a=1&token=t")));
        assert!(!token_given(Some("t"), Some("Bearer x"), None));
        assert!(!token_given(Some("t"), None, Some("token=tt")));
        assert!(!token_given(Some("t"), None, None));
        assert!(token_given(Some("t"), Some("bearer t"), None), "the scheme is case-insensitive");
        assert!(token_given(Some("t"), Some("BEARER  t "), None));
        assert!(!token_given(Some("t"), Some("Basic t"), None));
        assert!(token_given(Some("a b/c"), None, Some("token=a%20b%2Fc")), "as the banner encodes it");
    }

    #[test]
    fn credentials_in_queries_and_headers() {
        assert_eq!(query_credentials("user=u&pass=p"), (Some("u"), Some("p")));
        assert_eq!(query_credentials("a=1&token=t"), (Some("token"), Some("t")));
        assert_eq!(query_credentials("user=u"), (None, None));
        let ip = "192.0.2.1".parse().unwrap();
        let r = http_request(Some("Basic dTpw"), Some("x=1&token=t%20"), ip, Action::Read, "live/cam1", "hls");
        assert_eq!((r.user.as_str(), r.password.as_str(), r.token.as_str(), r.query.as_str()), ("u", "p", "t ", "x=1"));
        let r = http_request(Some("bearer jwt"), Some("token=other"), ip, Action::Read, "a", "http");
        assert_eq!((r.token.as_str(), r.query.as_str()), ("jwt", ""));
    }
}
