//! Who may do what: `[auth]`'s answer for a request, and a stream's login.

use super::*;

impl Relay {
    /// Whether a client may do what it asks. `local`: whether the face's own credentials
    /// (the token, the stream users) matched, `None` where that face has none configured.
    /// They are asked first; then `[auth]`, where configured; with neither, anyone may.
    /// An address that failed too often lately is refused whatever it gives; a request that
    /// gave credentials and is refused counts as a failed login of its address.
    pub async fn permit(&self, local: Option<bool>, req: fanout_proto::auth::Request) -> bool {
        if self.books.login_banned(req.ip) {
            return false;
        }
        if local == Some(true) {
            return true;
        }
        let ok = match &self.cfg().auth {
            Some(a) => self.auth.check(a, &req).await,
            None => local.is_none(),
        };
        // (A first request without credentials, answered with a challenge, is no guess.)
        let gave = !(req.user.is_empty() && req.password.is_empty() && req.token.is_empty());
        if !ok && gave {
            self.books.failed_login(req.protocol, req.ip);
        }
        ok
    }

    /// Whether `user` and `pass` are a user's who may do `action` on `path` from `ip`: the
    /// `[[user]]`s, and on the stream faces (`stream_face`: RTSP, RTMP, SRT, WebRTC) the RTSP
    /// users too (with `token` where RTSP requires it); `None` where there are none. A
    /// known user refused for its address or permissions is logged (once a login: the
    /// caller's answer follows).
    pub fn login(
        &self,
        user: Option<&str>,
        pass: Option<&str>,
        ip: std::net::IpAddr,
        action: fanout_proto::auth::Action,
        path: &str,
        stream_face: bool,
    ) -> Option<bool> {
        use fanout_proto::users;
        let all = self.cfg().login_users(stream_face);
        if all.is_empty() {
            return None;
        }
        let (Some(name), Some(pass)) = (user, pass) else { return Some(false) };
        let found = users::find(&all, name, pass, |u, p| self.verify(u, p));
        Some(match found {
            None => false,
            Some(u) if u.may(ip, action, path) => true,
            Some(u) => {
                tracing::warn!(user = u.name, %ip, ?action, path, "refused: the user may not do that from there");
                false
            }
        })
    }

    /// A user's password check; an Argon2 one is remembered once it passed (it costs
    /// milliseconds, and players log in per connection), bounded.
    fn verify(&self, u: &fanout_proto::users::User, pass: &str) -> bool {
        let Some(key) = u.password.remember_key(&u.name, pass) else { return u.password.verify(pass) };
        if self.verified.lock().contains(&key) {
            return true;
        }
        let ok = u.password.verify(pass);
        if ok {
            let mut v = self.verified.lock();
            if v.len() >= 4096 {
                v.clear();
            }
            v.insert(key);
        }
        ok
    }
}

/// The local decision on an HTTP request (the API, HTTP TS and FLV, HLS, playback, metrics):
/// the API token (`Authorization: Bearer`, or `?token=` where `query` is given: stream
/// URLs), or a `[[user]]` (HTTP Basic, or `?user=U&pass=P` where `query` is given) who may
/// do `action` on `path`; `None` where neither is configured.
pub fn http_login(
    relay: &Relay,
    auth_header: Option<&str>,
    query: Option<&str>,
    ip: std::net::IpAddr,
    action: fanout_proto::auth::Action,
    path: &str,
) -> Option<bool> {
    let token = relay.cfg().token.clone();
    let by_token = token.is_some().then(|| fanout_proto::auth::token_given(token.as_deref(), auth_header, query));
    let basic = auth_header.and_then(fanout_proto::http::basic_credentials);
    let (user, pass) = match (&basic, query.map(fanout_proto::auth::query_credentials)) {
        (Some((u, p)), _) => (Some(u.clone()), Some(p.clone())),
        (None, Some((Some(u), Some(p)))) if u != "token" => {
            (Some(fanout_proto::rtsp::client::percent_decode(u)), Some(fanout_proto::rtsp::client::percent_decode(p)))
        }
        _ => (None, None),
    };
    let by_user = relay.login(user.as_deref(), pass.as_deref(), ip, action, path, false);
    match (by_token, by_user) {
        (None, None) => None,
        (a, b) => Some(a == Some(true) || b == Some(true)),
    }
}
