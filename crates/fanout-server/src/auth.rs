//! External authentication (issue 34), the I/O half: `[auth] method = "http"` posts each
//! question to the operator's service (2xx allows), `"jwt"` checks the token against the
//! keys of a JWKS URL. Answers are cached briefly (allowed for `cache_s`, refused for a
//! second); a service that fails, hangs past `timeout_s` or cannot be reached refuses, and
//! the reason is logged, never the secret. The decisions are `fanout_proto::auth`'s.

use crate::config::{AuthConfig, AuthMethod};
use fanout_proto::auth::{permits, verify_jwt, Cache, JwkSet, JwtError, Request};
use parking_lot::Mutex;
use std::io::Read as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a refusal is remembered: long enough that a flood of wrong passwords does not
/// become a flood of calls, short enough that a fixed account works at once.
const DENY_CACHE: Duration = Duration::from_secs(1);
/// A token naming a key the set lacks fetches the set again, at most this often.
const REFETCH_AT_MOST: Duration = Duration::from_secs(10);
/// The answers remembered at once.
const CACHE_ENTRIES: usize = 65_536;
/// The largest JWKS taken.
const MAX_JWKS: u64 = 1 << 20;

pub struct Auth {
    cache: Mutex<Cache>,
    keys: tokio::sync::Mutex<Option<Keys>>,
    t0: Instant,
}

/// A JWKS as fetched.
struct Keys {
    url: String,
    set: Arc<JwkSet>,
    at: Instant,
}

impl Default for Auth {
    fn default() -> Self {
        Self { cache: Mutex::new(Cache::new(CACHE_ENTRIES)), keys: Default::default(), t0: Instant::now() }
    }
}

impl Auth {
    /// Forgets every answer (the settings changed).
    pub fn clear(&self) {
        self.cache.lock().clear();
    }

    /// Whether `req` is allowed by the external method `cfg`.
    pub async fn check(&self, cfg: &AuthConfig, req: &Request) -> bool {
        let now = self.t0.elapsed().as_millis() as u64;
        let key = req.cache_key();
        if let Some(ok) = self.cache.lock().get(&key, now) {
            return ok;
        }
        let answer = match cfg.method {
            AuthMethod::Http => callback(cfg, req).await,
            AuthMethod::Jwt => self.jwt(cfg, req).await,
        };
        let ok = match answer {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(
                    user = req.user, ip = %req.ip, action = ?req.action, path = req.path, protocol = req.protocol,
                    "refused by [auth]: {why}"
                );
                false
            }
        };
        let keep = if ok { Duration::from_secs_f64(cfg.cache_s) } else { DENY_CACHE };
        self.cache.lock().put(key, ok, now + keep.as_millis() as u64, now);
        ok
    }

    async fn jwt(&self, cfg: &AuthConfig, req: &Request) -> Result<(), Denied> {
        let token = req.jwt().ok_or("no JWT (bearer header, token query or password)")?;
        let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut set = self.keys(cfg, false).await?;
        let mut result = verify_jwt(token, &set, &cfg.jwt_claim, unix);
        // A key the set lacks: it may have rotated since it was fetched.
        if matches!(result, Err(JwtError::NoKey(_))) {
            set = self.keys(cfg, true).await?;
            result = verify_jwt(token, &set, &cfg.jwt_claim, unix);
        }
        let perms = result.map_err(|e| format!("JWT: {e}"))?;
        if permits(&perms, req.action, &req.path) {
            Ok(())
        } else {
            Err(format!("the JWT does not allow {:?} on {:?}", req.action, req.path).into())
        }
    }

    /// The JWKS: fetched when there is none, it is older than `jwks_refresh_s`, its URL
    /// changed, or `stale` (not more often than [`REFETCH_AT_MOST`]). A failed fetch keeps
    /// the keys there are.
    async fn keys(&self, cfg: &AuthConfig, stale: bool) -> Result<Arc<JwkSet>, Denied> {
        let url = cfg.jwks_url.clone().ok_or("no jwks_url")?;
        let mut keys = self.keys.lock().await;
        let refresh = Duration::from_secs_f64(cfg.jwks_refresh_s);
        let fresh = keys
            .as_ref()
            .filter(|k| k.url == url && k.at.elapsed() < refresh && !(stale && k.at.elapsed() >= REFETCH_AT_MOST));
        if let Some(k) = fresh {
            return Ok(k.set.clone());
        }
        match fetch_jwks(&url, cfg.timeout()).await {
            Ok(set) => {
                tracing::info!(url, keys = set.keys.len(), "JWKS fetched");
                let set = Arc::new(set);
                *keys = Some(Keys { url, set: set.clone(), at: Instant::now() });
                Ok(set)
            }
            Err(e) => match keys.as_ref().filter(|k| k.url == url) {
                Some(k) => {
                    tracing::warn!(url, "JWKS fetch failed, the keys fetched before stay: {e}");
                    Ok(k.set.clone())
                }
                None => Err(format!("JWKS {url}: {e}").into()),
            },
        }
    }
}

/// Why `[auth]` said no, or could not answer (logged with the refusal; the client is only
/// refused).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Denied(String);

impl From<String> for Denied {
    fn from(s: String) -> Self {
        Denied(s)
    }
}

impl From<&str> for Denied {
    fn from(s: &str) -> Self {
        Denied(s.to_string())
    }
}

/// The auth service's calls and the JWKS fetches (blocking HTTP): threads of their own, so
/// nothing else a client can make slow (downloads, session changes) delays an answer, and a
/// hanging service holds at most these.
static CALLS: std::sync::LazyLock<crate::workers::Workers> =
    std::sync::LazyLock::new(|| crate::workers::Workers::new("auth", 32, 256));

/// Posts the question to the service: `Ok` on 2xx.
async fn callback(cfg: &AuthConfig, req: &Request) -> Result<(), Denied> {
    let url = cfg.http_url.clone().ok_or("no http_url")?;
    let (body, timeout) = (req.to_json(), cfg.timeout());
    let t0 = Instant::now();
    // The status the service answered, or why there was none.
    let call = CALLS.run(move || -> Result<u16, Box<ureq::Error>> {
        match ureq::post(&url).timeout(timeout).set("Content-Type", "application/json").send_bytes(&body) {
            Ok(r) => Ok(r.status()),
            Err(ureq::Error::Status(code, _)) => Ok(code),
            Err(e) => Err(Box::new(e)),
        }
    });
    let late = || Denied(format!("the auth service did not answer within {timeout:?}"));
    match tokio::time::timeout(timeout + Duration::from_millis(100), call).await {
        Err(_) => Err(late()),
        Ok(Err(e)) => Err(Denied(format!("the auth call failed: {e}"))),
        Ok(Ok(Ok(code))) if (200..300).contains(&code) => Ok(()),
        Ok(Ok(Ok(code))) => Err(Denied(format!("the auth service answered {code}"))),
        Ok(Ok(Err(_))) if t0.elapsed() >= timeout => Err(late()),
        Ok(Ok(Err(e))) => Err(Denied(format!("the auth service cannot be reached: {e}"))),
    }
}

async fn fetch_jwks(url: &str, timeout: Duration) -> Result<JwkSet, Denied> {
    let url = url.to_string();
    let get = CALLS.run(move || -> Result<JwkSet, Denied> {
        let r = ureq::get(&url).timeout(timeout).call().map_err(|e| Denied(e.to_string()))?;
        let mut text = String::new();
        r.into_reader().take(MAX_JWKS).read_to_string(&mut text).map_err(|e| Denied(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| Denied(format!("not a JWKS: {e}")))
    });
    match tokio::time::timeout(timeout + Duration::from_millis(100), get).await {
        Err(_) => Err(Denied(format!("no answer within {timeout:?}"))),
        Ok(Err(e)) => Err(Denied(e.to_string())),
        Ok(Ok(r)) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An auth service on loopback answering every call with `status`; its calls counted.
    fn service(status: u16) -> (String, Arc<AtomicUsize>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/auth", l.local_addr().unwrap());
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = write!(c, "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            }
        });
        (url, calls)
    }

    fn cfg(url: &str) -> AuthConfig {
        AuthConfig {
            method: AuthMethod::Http,
            http_url: Some(url.into()),
            jwks_url: None,
            jwt_claim: "fanout".into(),
            timeout_s: 2.0,
            cache_s: 60.0,
            jwks_refresh_s: 300.0,
        }
    }

    fn asks(user: &str) -> Request {
        Request {
            user: user.into(),
            password: "pw".into(),
            token: String::new(),
            ip: [127, 0, 0, 1].into(),
            action: fanout_proto::auth::Action::Read,
            path: "cam".into(),
            protocol: "rtsp",
            query: String::new(),
        }
    }

    #[tokio::test]
    async fn the_services_answer_decides_and_is_remembered() {
        let (ok_url, ok_calls) = service(204);
        let auth = Auth::default();
        assert!(auth.check(&cfg(&ok_url), &asks("ann")).await);
        assert!(auth.check(&cfg(&ok_url), &asks("ann")).await, "remembered");
        assert_eq!(ok_calls.load(Ordering::SeqCst), 1, "the second answer came from the cache");
        let (no_url, _) = service(403);
        assert!(!auth.check(&cfg(&no_url), &asks("bob")).await, "a 403 refuses");
        auth.clear();
        let gone = cfg("http://127.0.0.1:1/auth");
        assert!(!auth.check(&gone, &asks("ann")).await, "a service that cannot be reached refuses");
        let jwt = AuthConfig { method: AuthMethod::Jwt, jwks_url: None, ..cfg(&ok_url) };
        assert!(!auth.check(&jwt, &asks("ann")).await, "no JWT given: refused without a call");
    }
}
