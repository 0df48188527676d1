//! Parents named in the config: relays to pull from, in order, each checked every 2 s by
//! opening a TCP connection to its RTSP port. Without a directory nothing says which parent
//! has a channel: the first one up is asked, and one that fails (a 404 too) is passed over
//! for a moment.

use fanout_proto::directory::Choice;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

const CHECK_EVERY: Duration = Duration::from_secs(2);
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize)]
pub struct ParentStatus {
    pub url: String,
    /// `unknown` (not checked yet), `up` or `down`.
    pub health: &'static str,
    pub last_error: Option<String>,
}

pub struct Parents {
    list: Arc<Vec<Mutex<ParentStatus>>>,
}

impl Parents {
    pub fn new(urls: &[String]) -> Self {
        let list = urls
            .iter()
            .map(|u| {
                Mutex::new(ParentStatus {
                    url: u.trim_end_matches('/').to_string(),
                    health: "unknown",
                    last_error: None,
                })
            })
            .collect();
        Self { list: Arc::new(list) }
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn status(&self) -> Vec<ParentStatus> {
        self.list.iter().map(|p| p.lock().clone()).collect()
    }

    /// Checks every parent now and then, for as long as the process runs.
    pub fn start(&self) {
        if self.list.is_empty() {
            return;
        }
        let list = self.list.clone();
        tokio::spawn(async move {
            loop {
                for p in list.iter() {
                    let url = p.lock().url.clone();
                    let r = check(&url).await;
                    let mut s = p.lock();
                    match r {
                        Ok(()) => (s.health, s.last_error) = ("up", None),
                        Err(e) => {
                            if s.health != "down" {
                                tracing::warn!(parent = %url, "parent is down: {e}");
                            }
                            (s.health, s.last_error) = ("down", Some(e.to_string()));
                        }
                    }
                }
                tokio::time::sleep(CHECK_EVERY).await;
            }
        });
    }

    /// The first parent not down and not failed lately, with the channel's URL on it.
    pub fn pick(&self, channel: &str, failed: &HashSet<String>, why: &mut Vec<String>) -> Option<Choice> {
        for p in self.list.iter() {
            let p = p.lock();
            if p.health == "down" {
                why.push(format!("parent {}: down", p.url));
            } else if failed.contains(&p.url) {
                why.push(format!("parent {}: failed a moment ago", p.url));
            } else {
                return Some(Choice {
                    node: p.url.clone(),
                    url: format!("{}/{channel}", p.url),
                    path: vec![p.url.clone()],
                });
            }
        }
        None
    }
}

async fn check(url: &str) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    let u = fanout_proto::rtsp::client::Url::parse(url).map_err(|e| Error::new(ErrorKind::InvalidInput, e))?;
    match tokio::time::timeout(CHECK_TIMEOUT, tokio::net::TcpStream::connect((u.host.as_str(), u.port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::new(e.kind(), format!("cannot connect: {e}"))),
        Err(_) => Err(Error::new(ErrorKind::TimedOut, format!("no answer within {CHECK_TIMEOUT:?}"))),
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_parent_is_up_when_it_takes_a_connection() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = open.local_addr().unwrap();
        assert!(super::check(&format!("rtsp://{at}")).await.is_ok());
        drop(open);
        let e = super::check(&format!("rtsp://{at}")).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        let e = super::check("http://example.invalid/").await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    }
}
