//! Local users (issue 53 item 6): `[[user]]` in the config, each with a password (plain, or
//! kept as a SHA-256 or Argon2 hash), the addresses it may come from and what it may do on
//! which paths, the same rules on every face (MediaMTX's `authInternalUsers`). Sans-IO: a
//! login is a name, a password, an address, an action and a path in, a decision out.

use crate::auth::{permits, Action, PathRule, Permission};
use serde::Deserialize;
use std::net::IpAddr;

/// A password as the config keeps it.
#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    Plain(String),
    /// `sha256:` and the digest in base64 (as MediaMTX writes it: `echo -n PASS | openssl
    /// dgst -binary -sha256 | openssl base64`).
    Sha256([u8; 32]),
    /// `argon2:` and the PHC string (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`).
    Argon2(String),
}

impl std::fmt::Debug for Password {
    // (Never the secret, not even hashed, in a log or a panic.)
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Password::Plain(_) => "Password::Plain(…)",
            Password::Sha256(_) => "Password::Sha256(…)",
            Password::Argon2(_) => "Password::Argon2(…)",
        })
    }
}

impl Password {
    pub fn parse(s: &str) -> Result<Self, crate::Invalid> {
        use base64::Engine as _;
        if let Some(b64) = s.strip_prefix("sha256:") {
            let d = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| format!("password \"sha256:…\": not base64 ({e})"))?;
            let d: [u8; 32] =
                d.try_into().map_err(|_| "password \"sha256:…\": the digest must be 32 bytes".to_string())?;
            return Ok(Password::Sha256(d));
        }
        if let Some(phc) = s.strip_prefix("argon2:") {
            let h =
                argon2::PasswordHash::new(phc).map_err(|e| format!("password \"argon2:…\": not a PHC string ({e})"))?;
            if !h.algorithm.as_str().starts_with("argon2") || h.hash.is_none() {
                return Err("password \"argon2:…\": not an Argon2 hash ($argon2id$v=19$m=…,t=…,p=…$SALT$HASH)".into());
            }
            return Ok(Password::Argon2(phc.to_string()));
        }
        if s.is_empty() {
            return Err("a user's password must not be empty".into());
        }
        Ok(Password::Plain(s.to_string()))
    }

    /// Whether `given` is this password. Plain and SHA-256 compare in constant time; Argon2
    /// costs what its parameters say (milliseconds).
    pub fn verify(&self, given: &str) -> bool {
        match self {
            Password::Plain(p) => crate::secret::ct_eq(p.as_bytes(), given.as_bytes()),
            Password::Sha256(d) => {
                use sha2::Digest as _;
                crate::secret::ct_eq(&sha2::Sha256::digest(given.as_bytes()), d)
            }
            Password::Argon2(phc) => {
                use argon2::PasswordVerifier as _;
                argon2::PasswordHash::new(phc)
                    .is_ok_and(|h| argon2::Argon2::default().verify_password(given.as_bytes(), &h).is_ok())
            }
        }
    }

    /// The plain password, where the config gives it (RTSP's Digest needs it).
    pub fn plain(&self) -> Option<&str> {
        match self {
            Password::Plain(p) => Some(p),
            _ => None,
        }
    }

    /// Whether checking it is slow enough to be worth remembering.
    pub fn is_slow(&self) -> bool {
        matches!(self, Password::Argon2(_))
    }

    /// What a caller remembers a passed check of a slow password by: a digest of the
    /// user's name, the password given and the hash (so a new hash is checked afresh);
    /// `None` for a fast one.
    pub fn remember_key(&self, name: &str, given: &str) -> Option<[u8; 32]> {
        use sha2::Digest as _;
        let Password::Argon2(phc) = self else { return None };
        let mut h = sha2::Sha256::new();
        for part in [name, given, phc] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        Some(h.finalize().into())
    }
}

impl<'de> Deserialize<'de> for Password {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Password::parse(&String::deserialize(d)?).map_err(|e| serde::de::Error::custom(e.0))
    }
}

/// An address range, `10.0.0.0/8`, `2001:db8::/32`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange(ipnet::IpNet);

impl IpRange {
    pub fn parse(s: &str) -> Result<Self, crate::Invalid> {
        match s.parse::<ipnet::IpNet>() {
            Ok(n) => Ok(IpRange(n.trunc())),
            Err(_) => s
                .parse::<IpAddr>()
                .map(|a| IpRange(a.into()))
                .map_err(|_| format!("ips: {s:?} is not an address or a CIDR range (10.0.0.0/8)").into()),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket comes as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}

impl<'de> Deserialize<'de> for IpRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IpRange::parse(&String::deserialize(d)?).map_err(|e| serde::de::Error::custom(e.0))
    }
}

/// A permission as the config writes it: `{ action = "read", path = "cam1" }` (`~regex`, or
/// no path: every path).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionSpec {
    action: Action,
    path: Option<String>,
}

fn permissions<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Permission>, D::Error> {
    let specs = Vec::<PermissionSpec>::deserialize(d)?;
    specs
        .into_iter()
        .map(|p| {
            let path = PathRule::parse(p.path.as_deref()).map_err(|e| serde::de::Error::custom(e.0))?;
            Ok(Permission { action: p.action, path })
        })
        .collect()
}

/// `[[user]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    pub password: Password,
    /// Where it may log in from; empty: anywhere.
    #[serde(default)]
    pub ips: Vec<IpRange>,
    /// What it may do; a user with none can do nothing.
    #[serde(deserialize_with = "permissions")]
    pub permissions: Vec<Permission>,
}

impl PartialEq for User {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name && self.password == o.password && self.ips == o.ips && self.permissions == o.permissions
    }
}

impl User {
    /// A user of the deprecated `[[rtsp_user]]`: what those could do, read and publish
    /// every path, from anywhere.
    pub fn legacy(name: &str, password: &str) -> Self {
        let every = |action| Permission { action, path: PathRule::Any };
        User {
            name: name.into(),
            password: Password::Plain(password.into()),
            ips: Vec::new(),
            permissions: vec![every(Action::Read), every(Action::Publish)],
        }
    }

    pub fn validate(&self) -> Result<(), crate::Invalid> {
        if self.name.is_empty() || self.name.contains(':') {
            return Err(format!("user {:?}: a name must be non-empty and hold no ':'", self.name).into());
        }
        if self.permissions.is_empty() {
            return Err(format!(
                "user {:?}: no permissions; give some, e.g. permissions = [{{ action = \"read\", path = \"cam1\" }}]",
                self.name
            )
            .into());
        }
        Ok(())
    }

    /// Whether it may do `action` on `path` from `ip` (its password aside).
    pub fn may(&self, ip: IpAddr, action: Action, path: &str) -> bool {
        (self.ips.is_empty() || self.ips.iter().any(|r| r.contains(ip))) && permits(&self.permissions, action, path)
    }
}

/// What a login comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    /// Its name and password are a user's, who may do what it asks.
    Allowed,
    /// No user by that name and password (or none given).
    Unknown,
    /// A user, but not from that address or not for that action and path.
    NotAllowed,
}

/// The user `name` is, by its password: every user is looked at whatever matches, so the
/// time taken does not tell which names exist (`verify` decides for the one named; an
/// Argon2 password is checked only for its own name).
pub fn find<'a>(
    users: &'a [User],
    name: &str,
    password: &str,
    verify: impl Fn(&User, &str) -> bool,
) -> Option<&'a User> {
    let mut found = None;
    for u in users {
        if crate::secret::ct_eq(u.name.as_bytes(), name.as_bytes()) && verify(u, password) && found.is_none() {
            found = Some(u);
        }
    }
    found
}

/// The decision for a login to do `action` on `path` from `ip`.
pub fn login(users: &[User], name: &str, password: &str, ip: IpAddr, action: Action, path: &str) -> Login {
    match find(users, name, password, |u, p| u.password.verify(p)) {
        None => Login::Unknown,
        Some(u) if u.may(ip, action, path) => Login::Allowed,
        Some(_) => Login::NotAllowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn users(toml_text: &str) -> Vec<User> {
        #[derive(Deserialize)]
        struct C {
            user: Vec<User>,
        }
        let c: C = toml_de(toml_text);
        c.user
    }

    // (A few lines of TOML as JSON: the proto crate has no TOML parser.)
    fn toml_de<T: serde::de::DeserializeOwned>(json: &str) -> T {
        serde_json::from_str(json).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const SHA256_OF_SECRET: &str = "sha256:K7gNU3sdo+OL0wNhqoVWhr3g6s1xYv72ol/pe/Unols=";

    #[test]
    fn a_user_reads_what_it_may_and_nothing_else() {
        let us = users(
            r#"{"user": [
                {"name": "viewer", "password": "pw", "permissions": [{"action": "read", "path": "cam1"}]},
                {"name": "cams", "password": "pw2", "ips": ["10.0.0.0/8", "192.0.2.7"],
                 "permissions": [{"action": "publish", "path": "~^cam[0-9]+$"}, {"action": "read"}]}
            ]}"#,
        );
        let any = ip("203.0.113.1");
        assert_eq!(login(&us, "viewer", "pw", any, Action::Read, "cam1"), Login::Allowed);
        assert_eq!(login(&us, "viewer", "pw", any, Action::Read, "cam2"), Login::NotAllowed);
        assert_eq!(login(&us, "viewer", "pw", any, Action::Publish, "cam1"), Login::NotAllowed);
        assert_eq!(login(&us, "viewer", "wrong", any, Action::Read, "cam1"), Login::Unknown);
        assert_eq!(login(&us, "nobody", "pw", any, Action::Read, "cam1"), Login::Unknown);
        // Its addresses: a range, one address, and an IPv4 client seen as IPv6.
        assert_eq!(login(&us, "cams", "pw2", ip("10.1.2.3"), Action::Publish, "cam12"), Login::Allowed);
        assert_eq!(login(&us, "cams", "pw2", ip("::ffff:10.1.2.3"), Action::Publish, "cam12"), Login::Allowed);
        assert_eq!(login(&us, "cams", "pw2", ip("192.0.2.7"), Action::Read, "lobby"), Login::Allowed);
        assert_eq!(login(&us, "cams", "pw2", ip("192.0.2.8"), Action::Read, "lobby"), Login::NotAllowed);
        assert_eq!(login(&us, "cams", "pw2", ip("10.1.2.3"), Action::Publish, "lobby"), Login::NotAllowed);
        assert_eq!(login(&us, "cams", "pw2", ip("10.1.2.3"), Action::Api, ""), Login::NotAllowed);
    }

    #[test]
    fn hashed_passwords_verify_and_say_nothing() {
        let sha = Password::parse(SHA256_OF_SECRET).unwrap();
        assert!(sha.verify("secret") && !sha.verify("Secret") && !sha.verify(""));
        // A cheap Argon2id (m = 64 KiB, t = 1) of "secret", salt "c2FsdHNhbHQ".
        let phc = argon2_of("secret");
        let a = Password::parse(&format!("argon2:{phc}")).unwrap();
        assert!(a.verify("secret") && !a.verify("secreT") && a.is_slow());
        assert!(Password::parse("plain").unwrap().verify("plain"));
        assert_eq!(format!("{a:?} {sha:?}"), "Password::Argon2(…) Password::Sha256(…)");
        for bad in ["sha256:not base64!", "sha256:AAAA", "argon2:$nope", ""] {
            assert!(Password::parse(bad).is_err(), "{bad}");
        }
    }

    fn argon2_of(pass: &str) -> String {
        use argon2::PasswordHasher as _;
        let salt = argon2::password_hash::SaltString::from_b64("c2FsdHNhbHQ").unwrap();
        let params = argon2::Params::new(64, 1, 1, None).unwrap();
        let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        a.hash_password(pass.as_bytes(), &salt).unwrap().to_string()
    }

    #[test]
    fn bad_users_are_refused_with_a_reason() {
        let no_perms = users(r#"{"user": [{"name": "a", "password": "p", "permissions": []}]}"#);
        assert!(no_perms[0].validate().unwrap_err().0.contains("no permissions"));
        let colon = users(r#"{"user": [{"name": "a:b", "password": "p", "permissions": [{"action": "read"}]}]}"#);
        assert!(colon[0].validate().is_err());
        for bad in [
            r#"{"user": [{"name": "a", "password": "p", "permissions": [{"action": "fly"}]}]}"#,
            r#"{"user": [{"name": "a", "password": "p", "ips": ["10.0.0.0/33"], "permissions": []}]}"#,
            r#"{"user": [{"name": "a", "password": "p", "permissions": [{"action": "read", "path": "~("}]}]}"#,
        ] {
            assert!(serde_json::from_str::<serde_json::Value>(bad).is_ok());
            #[derive(Deserialize, Debug)]
            #[allow(dead_code)]
            struct C {
                user: Vec<User>,
            }
            assert!(serde_json::from_str::<C>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_rtsp_user_reads_and_publishes_everything() {
        let us = vec![User::legacy("old", "pw")];
        let any = ip("203.0.113.1");
        assert_eq!(login(&us, "old", "pw", any, Action::Publish, "x"), Login::Allowed);
        assert_eq!(login(&us, "old", "pw", any, Action::Read, "y"), Login::Allowed);
        assert_eq!(login(&us, "old", "pw", any, Action::Api, ""), Login::NotAllowed);
    }

    proptest! {
        /// Whatever is given, a login decides without a panic, and only the right password
        /// of a user who may do it is let in.
        #[test]
        fn only_the_password_and_a_permission_let_in(name in ".{0,12}", pass in ".{0,12}", path in "[a-z0-9/]{0,10}") {
            let us = vec![
                User { name: "u".into(), password: Password::Plain("p".into()), ips: vec![],
                       permissions: vec![Permission { action: Action::Read, path: PathRule::parse(Some("cam")).unwrap() }] },
            ];
            let got = login(&us, &name, &pass, ip("192.0.2.1"), Action::Read, &path);
            let right = name == "u" && pass == "p";
            prop_assert_eq!(got == Login::Allowed, right && path == "cam");
            prop_assert_eq!(got == Login::Unknown, !right);
        }

        #[test]
        fn any_text_as_a_password_or_range_parses_or_is_refused(s in "\\PC{0,60}") {
            let _ = Password::parse(&s);
            let _ = IpRange::parse(&s);
        }
    }
}
