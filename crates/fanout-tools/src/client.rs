//! A small blocking client of the control API, shared by `ctl`, `sub` and `bench`.

use anyhow::bail;
use serde_json::Value;
use std::time::Duration;

pub struct ApiClient {
    /// `http://IP:PORT` or `https://…`, no trailing slash.
    pub base: String,
    pub token: Option<String>,
    agent: ureq::Agent,
}

impl ApiClient {
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self { base: base.trim_end_matches('/').to_string(), token, agent: ureq::agent() }
    }

    /// A client of the API at `api`: `http(s)://HOST:PORT`, or `HOST:PORT` (http is
    /// implied); any other scheme is a clear error. Over HTTPS the server is verified against
    /// the public roots, or against `cacert` alone (a PEM file, e.g. a self-signed one).
    pub fn parse(api: &str, token: Option<String>, cacert: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let base = match api.split_once("://") {
            Some(("http" | "https", _)) => api.to_string(),
            Some((scheme, _)) => {
                bail!("--api {api:?}: the API speaks http or https, not {scheme} (e.g. http://127.0.0.1:7070)")
            }
            None => format!("http://{api}"),
        };
        let host = base.split_once("://").map_or("", |(_, h)| h).trim_end_matches('/');
        if host.is_empty() || host.contains('/') {
            bail!("--api {api:?}: expected HOST:PORT or http(s)://HOST:PORT (e.g. 127.0.0.1:7070)");
        }
        let mut c = Self::new(&base, token);
        if let Some(path) = cacert {
            c.agent = ureq::AgentBuilder::new()
                .tls_config(crate::tls::trusting(path).map_err(|e| anyhow::anyhow!("--cacert {e:#}"))?)
                .build();
        }
        Ok(c)
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let r = self.agent.request(method, &format!("{}{path}", self.base)).timeout(Duration::from_secs(30));
        match &self.token {
            Some(t) => r.set("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    /// Calls the API; a 204 answers `null`. Errors carry the status and the API's message.
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let req = self.request(method, path);
        let r = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match r {
            Ok(resp) if resp.status() == 204 => Ok(Value::Null),
            Ok(resp) => Ok(resp.into_json()?),
            Err(ureq::Error::Status(code, resp)) => {
                let body: Value = resp.into_json().unwrap_or(Value::Null);
                bail!("{code}: {}", body["error"].as_str().unwrap_or("(no error message)"))
            }
            // A relay that answered with a certificate we do not trust is running: say so.
            Err(e) if e.to_string().to_ascii_lowercase().contains("certificate") => bail!(
                "the relay at {} answered with a TLS certificate this client does not trust ({e}): \
                 pass --cacert FILE (the relay prints the file or fingerprint at start)",
                self.base
            ),
            Err(e) => bail!("cannot reach the relay at {}: {e} (is `fanout serve` running?)", self.base),
        }
    }

    pub fn text(&self, path: &str) -> anyhow::Result<String> {
        self.request("GET", path)
            .call()
            .map_err(|e| anyhow::anyhow!("cannot reach the relay at {}: {e}", self.base))?
            .into_string()
            .map_err(Into::into)
    }
}
