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

    /// Whether `user` and `pass` are one of the stream users (RTSP's, which RTMP, SRT and
    /// WebRTC take too, with `token` and the API token where RTSP requires it); `None`
    /// where there are none.
    pub fn stream_login(&self, user: Option<&str>, pass: Option<&str>) -> Option<bool> {
        let users = self.cfg().rtsp_credentials();
        if users.is_empty() {
            return None;
        }
        let (Some(user), Some(pass)) = (user, pass) else { return Some(false) };
        // Every user is compared, so the time taken does not tell which names exist.
        Some(users.iter().fold(false, |ok, (u, p)| {
            let hit = fanout_proto::secret::ct_eq(u.as_bytes(), user.as_bytes())
                & fanout_proto::secret::ct_eq(p.as_bytes(), pass.as_bytes());
            ok | hit
        }))
    }
}
