//! Paths made on demand: by a pattern's match (counted per pattern), or ensured for a
//! reader or a publisher that names them.

use super::*;

impl Relay {
    /// Makes sure a session named `name` exists: when it does not, the first `[[pattern]]`
    /// it matches makes it; else, where this relay is a cluster node, the channel is looked
    /// up and pulled from the node that serves it best.
    pub async fn ensure(self: &Arc<Self>, name: &str) -> Result<(), RelayError> {
        use crate::cluster::LookupError;
        let existing = self.path(name);
        let pattern = self.pattern(name);
        let ended = existing.as_ref().map(|p| p.upstream().is_some_and(|u| u.finished()));
        let (drop_ended, way) = way(ended, pattern.is_some(), self.cluster.is_some());
        if let (true, Some(p)) = (drop_ended, &existing) {
            self.delete_exact(name, &p.session).await;
        }
        let cluster = match (way, pattern, &self.cluster) {
            (Way::Have, ..) => {
                // An on-demand pull is woken, and the reader waits for its stream.
                let publisher = existing.and_then(|p| p.publisher().cloned());
                if let Some(p) = publisher {
                    p.demand(Duration::from_secs(10)).await;
                }
                return Ok(());
            }
            (Way::Pattern, Some(p), _) => return self.from_pattern(name, p, false).await,
            (Way::Cluster, _, Some(c)) => c,
            _ => return Err(no_such(name)),
        };
        let choice = cluster.locate(name).await.map_err(|e| match e {
            LookupError::NotFound(why) => RelayError::NotFound(why),
            LookupError::Down(why) => RelayError::Down(why),
        })?;
        let source = SourceSpec::Rtsp(crate::spec::RtspSource {
            url: choice.url.clone(),
            transport: Some(cluster.cfg.pull_transport),
            on_demand: Some(true),
            linger_s: Some(cluster.cfg.linger_s),
            tls_ca: cluster.cfg.tls_ca.clone(),
            ..Default::default()
        });
        tracing::info!(channel = name, from = %choice.node, url = %choice.url, "pulling a channel");
        cluster.begin_pull(name, &choice);
        match self.create_with(crate::spec::SessionSpec::new(name, source), Some(cluster.origin(name))).await {
            // Someone else's request made it first.
            Ok(_) | Err(RelayError::Conflict(_)) => Ok(()),
            Err(e) => {
                cluster.end_pull(name);
                Err(e)
            }
        }
    }

    /// The first `[[pattern]]` that matches `name`.
    pub(super) fn pattern(&self, name: &str) -> Option<crate::config::PatternSpec> {
        self.cfg().patterns.iter().find(|p| p.rule().is_ok_and(|r| r.matches(name))).cloned()
    }

    /// Whether a path has `name`, or a pattern would make it.
    pub fn knows(&self, name: &str) -> bool {
        self.path(name).is_some() || self.pattern(name).is_some()
    }

    /// Whether a publisher may make `name`: no path has it, and the first pattern it
    /// matches takes publishers (`source = { publish = true }`).
    pub fn publishable_by_pattern(&self, name: &str) -> bool {
        self.path(name).is_none() && self.pattern(name).is_some_and(|p| matches!(p.source, SourceSpec::Publish { .. }))
    }

    /// Before a publisher's request for `name` (ANNOUNCE, RTMP publish, SRT, WHIP): a name
    /// no path has, which a pattern of publishers matches, is made now (any stream key an
    /// encoder pushes, as MediaMTX's `all_others`). Such a path lasts while it is published
    /// or read, then `linger_s`.
    pub async fn ensure_publishable(self: &Arc<Self>, name: &str) {
        let publish = |p: &crate::config::PatternSpec| matches!(p.source, SourceSpec::Publish { .. });
        let Some(p) = self.pattern(name).filter(|p| publish(p) && self.path(name).is_none()) else { return };
        if let Err(e) = self.from_pattern(name, p, true).await {
            tracing::warn!(path = name, "a publisher's path could not be made: {e}");
        }
    }

    /// Makes `name`'s path from pattern `p`; starts its `run_on_demand` command, and waits
    /// for the publisher that command starts (so that the one who asked gets a stream).
    /// The path goes `linger_s` after its last reader (or, made for a publisher, after its
    /// publisher and last reader left), its command with it.
    pub(super) async fn from_pattern(
        self: &Arc<Self>,
        name: &str,
        p: crate::config::PatternSpec,
        for_publisher: bool,
    ) -> Result<(), RelayError> {
        let spec = p.session(name)?;
        let count = self.pattern_paths.lock().entry(p.matches.clone()).or_default().clone();
        use std::sync::atomic::Ordering::SeqCst;
        if count.fetch_update(SeqCst, SeqCst, |n| (n < p.max_paths).then_some(n + 1)).is_err() {
            return Err(RelayError::Down(format!(
                "pattern {:?} has its max_paths ({}) paths now; {name:?} can be made when one ends",
                p.matches, p.max_paths
            )));
        }
        let slot = PatternSlot(count);
        let session = match self.create(spec).await {
            Ok(s) => s,
            Err(RelayError::Conflict(_)) => return Ok(()), // another request made it first
            Err(e) => return Err(e),
        };
        tracing::info!(path = name, pattern = p.matches, "path made on demand");
        let hook = match &p.run_on_demand {
            Some(cmd) => match crate::hook::Hook::spawn("run_on_demand", cmd, name, &self.hook_env(name)) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.delete_exact(name, &session).await;
                    return Err(RelayError::Internal(format!("run_on_demand for {name:?}: {e}")));
                }
            },
            None => None,
        };
        if let (Some(_), Some(publisher)) = (&hook, self.path(name).and_then(|p| p.publisher().cloned())) {
            // Woken as the command's publisher starts (or ON_DEMAND_START passes).
            let mut changes = publisher.changes();
            let _ = tokio::time::timeout(ON_DEMAND_START, async {
                while publisher.sdp().is_none() && changes.changed().await.is_ok() {}
            })
            .await;
        }
        let linger = Duration::from_secs_f64(p.linger_s);
        let watch = Unwatched { name: name.to_string(), session, hook, linger, slot, for_publisher };
        tokio::spawn(end_unwatched(Arc::downgrade(self), watch));
        Ok(())
    }
}

/// How a named path comes to be for whoever asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// It is there.
    Have,
    /// The first pattern it matches makes it.
    Pattern,
    /// The cluster finds the node that serves it, and it is pulled from there.
    Cluster,
    /// Nothing makes it: 404.
    Unknown,
}

/// The choice of [`Relay::ensure`], without the relay: `existing` is `None` without a path of
/// that name, else whether its pull just ended (a lingering pull about to go: it goes first,
/// so a new one serves the asker, instead of a path deleted under it). The `bool` says to
/// delete the ended one first.
fn way(existing: Option<bool>, pattern: bool, cluster: bool) -> (bool, Way) {
    let drop_ended = existing == Some(true);
    let way = match (existing, pattern, cluster) {
        (Some(false), ..) => Way::Have,
        (_, true, _) => Way::Pattern,
        (_, false, true) => Way::Cluster,
        _ => Way::Unknown,
    };
    (drop_ended, way)
}

#[cfg(test)]
mod tests {
    use super::{way, Way};

    #[test]
    fn a_path_is_had_else_made_by_a_pattern_else_pulled_through_the_cluster() {
        assert_eq!(way(Some(false), true, true), (false, Way::Have), "a path there is used as it is");
        assert_eq!(way(None, true, true), (false, Way::Pattern), "a pattern before the cluster");
        assert_eq!(way(None, false, true), (false, Way::Cluster));
        assert_eq!(way(None, false, false), (false, Way::Unknown));
        // A pull whose linger ended goes first, and the path is made again.
        assert_eq!(way(Some(true), false, true), (true, Way::Cluster));
        assert_eq!(way(Some(true), true, false), (true, Way::Pattern));
        assert_eq!(way(Some(true), false, false), (true, Way::Unknown));
    }
}
