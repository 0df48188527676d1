//! The server's errors, by where they come from, and the HTTP and RTSP status each is
//! answered with: the one place that says so; and the HTTP error answer itself.

/// What a control request (the API, an RTSP DESCRIBE that must make or find a session) ran
/// into.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The request is wrong (a bad name, an impossible spec): HTTP 400.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// What the request needs is not available on this machine (e.g. eBPF without root).
    #[error("{0}")]
    Unavailable(String),
    /// A peer we had to reach (a TCP sink, an upstream) could not be reached.
    #[error("{0}")]
    Peer(String),
    /// The session's media cannot be given in the form asked for (HTTP: 415).
    #[error("{0}")]
    Unsupported(String),
    /// A service the request depends on is down (the cluster directory): 503.
    #[error("{0}")]
    Down(String),
    /// Not this asker's to ask for (a file outside `file_roots`): 403.
    #[error("{0}")]
    Forbidden(String),
    /// The path has its `max_readers`: HTTP 503, RTSP 453 (Not Enough Bandwidth).
    #[error("{0}")]
    Full(String),
    #[error("{0}")]
    Internal(String),
}

/// A user's input that does not check (a spec, a name, a URL, a config section): a 400 where
/// it comes through the API (a line of the refusal where it comes from the config file).
impl From<fanout_proto::Invalid> for RelayError {
    fn from(e: fanout_proto::Invalid) -> Self {
        RelayError::BadRequest(e.0)
    }
}

impl From<crate::readers::Full> for RelayError {
    fn from(f: crate::readers::Full) -> Self {
        RelayError::Full(f.to_string())
    }
}

impl RelayError {
    /// The HTTP status the API answers it with.
    pub fn http_status(&self) -> u16 {
        match self {
            RelayError::BadRequest(_) => 400,
            RelayError::Forbidden(_) => 403,
            RelayError::NotFound(_) => 404,
            RelayError::Conflict(_) => 409,
            RelayError::Unsupported(_) => 415,
            RelayError::Unavailable(_) => 501,
            RelayError::Peer(_) => 502,
            RelayError::Down(_) | RelayError::Full(_) => 503,
            RelayError::Internal(_) => 500,
        }
    }

    /// The RTSP status an RTSP client is answered with (RFC 2326 §7.1.1 uses HTTP's codes
    /// where they mean the same; what RTSP has no word for is 503 or 500).
    pub fn rtsp_status(&self) -> u16 {
        match self {
            RelayError::Conflict(_) => 455,
            RelayError::Full(_) => 453,
            RelayError::Unsupported(_) => 415,
            RelayError::Unavailable(_) | RelayError::Peer(_) => 503,
            e => e.http_status(),
        }
    }
}

/// An HTTP error answer (the API, WHEP/WHIP, recordings, streams): a status and a JSON
/// body `{"error": "...", "status": N}`.
pub struct ApiError(pub axum::http::StatusCode, pub String);

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let body = serde_json::json!({ "error": self.1, "status": self.0.as_u16() });
        (self.0, axum::Json(body)).into_response()
    }
}

impl From<RelayError> for ApiError {
    fn from(e: RelayError) -> Self {
        let code =
            axum::http::StatusCode::from_u16(e.http_status()).unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        ApiError(code, e.to_string())
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        ApiError(r.status(), r.body_text())
    }
}

/// Why an RTSP upstream session (a pull) ended, by where it went wrong.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The server could not be reached: the TCP connection, or its timeout.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The TLS handshake or the server's certificate.
    #[error("TLS: {0}")]
    Tls(String),
    /// The server refused our credentials (401, 403).
    #[error("{0}")]
    Auth(String),
    /// The server answered with another error, or with what is not RTSP.
    #[error("{0}")]
    Protocol(String),
    /// What its description offers cannot be served: the tracks, the SRTP keys.
    #[error("{0}")]
    Describe(String),
    /// The connection failed or closed, or the stream went silent.
    #[error("{0}")]
    Io(String),
}

impl UpstreamError {
    /// Its origin, as the status shows it: `connect`, `tls`, `auth`, `protocol`, `describe`
    /// or `io`.
    pub fn origin(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Tls(_) => "tls",
            UpstreamError::Auth(_) => "auth",
            UpstreamError::Protocol(_) => "protocol",
            UpstreamError::Describe(_) => "describe",
            UpstreamError::Io(_) => "io",
        }
    }

    /// An error answer from the server (`status`, if it answered at all).
    pub fn answered(status: Option<u16>, why: String) -> Self {
        match status {
            Some(401 | 403) => UpstreamError::Auth(why),
            _ => UpstreamError::Protocol(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_status_and_origin() {
        assert_eq!(RelayError::NotFound("x".into()).http_status(), 404);
        assert_eq!(RelayError::NotFound("x".into()).rtsp_status(), 404);
        assert_eq!(RelayError::Conflict("x".into()).rtsp_status(), 455);
        assert_eq!(RelayError::Down("x".into()).rtsp_status(), 503);
        assert_eq!(RelayError::Peer("x".into()).http_status(), 502);
        assert_eq!(UpstreamError::answered(Some(401), "401 Unauthorized".into()).origin(), "auth");
        assert_eq!(UpstreamError::answered(Some(404), "404 Not Found".into()).origin(), "protocol");
        assert_eq!(UpstreamError::answered(None, "garbage".into()).origin(), "protocol");
        assert_eq!(UpstreamError::Connect("refused".into()).to_string(), "cannot connect: refused");
    }
}
