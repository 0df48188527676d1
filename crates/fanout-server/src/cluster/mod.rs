//! This relay as a node of a tree of relays: where a channel it does not have can be pulled
//! from, and what it tells the others about itself.
//!
//! Two ways to know the other nodes, usable together:
//! - **etcd** (feature `etcd`): each node registers under a lease with its load, and publishes
//!   every channel it has; a lookup reads the directory and picks a node
//!   ([`directory::candidates`]).
//! - **parents**: an ordered list of relays from the config, health-checked; the first one up
//!   is asked for the channel.
//!
//! A pull is an ordinary `rtsp://` upstream of a session named like the channel, whose URL
//! comes from here at each (re)connect ([`crate::upstream::Origin`]): when the node it pulls
//! from fails, the next connect goes to another node that has the channel, and the upstream's
//! restamping keeps the subscribers' SSRC and sequence numbers unbroken. The session is
//! deleted when no node has the channel any more, or `linger_s` after its last subscriber.
//!
//! This module knows nothing of the relay: the relay hands it a [`Local`] view.

#[cfg(feature = "etcd")]
mod etcd;
mod parents;

use crate::config::ClusterConfig;
use crate::upstream::PullEnds;
#[cfg(feature = "etcd")]
use fanout_proto::directory::{self, Me};
use fanout_proto::directory::{ChannelEntry, Choice, Load, NodeInfo};
use fanout_proto::rtsp::client::Url;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A node that just failed is not chosen again for this long (unless nothing else has the
/// channel).
const FAILED_FOR: Duration = Duration::from_secs(2);

/// What the relay tells the cluster about itself.
pub trait Local: Send + Sync {
    /// Every session with its own source or a pull, as a channel.
    fn channels(&self) -> Vec<LocalChannel>;
    /// Sessions, subscribers, and the delivered bytes so far (for the egress rate).
    fn counters(&self) -> (u64, u64, u64);
}

pub struct LocalChannel {
    pub name: String,
    pub codecs: Vec<String>,
    /// What its source brought so far (for its rate).
    pub bytes_in: u64,
    /// For a pulled channel: its upstream plays (only then do others get it from here).
    pub playing: bool,
}

/// Why a lookup found nothing.
#[derive(Debug)]
pub enum LookupError {
    /// No node has the channel (with the reasons nodes were left out).
    NotFound(String),
    /// The directory cannot be read now.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Down(String),
}

/// A channel this node pulls.
#[derive(Debug, Clone, Serialize)]
pub struct Pull {
    pub channel: String,
    /// The node (or parent URL) it pulls from now.
    pub from: String,
    pub url: String,
    /// The nodes its copy comes through, nearest first.
    pub path: Vec<String>,
    /// How often it moved to another node.
    pub switches: u64,
    #[serde(skip)]
    trouble_since: Option<Instant>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct DirectoryState {
    /// `connected`, `unreachable`, `name-taken`, or `none` (no etcd configured).
    pub state: String,
    pub last_error: Option<String>,
    /// Directory entries that did not parse or disagree with their key.
    pub rejected: Vec<String>,
    /// Channels whose entries disagree (e.g. two origins with different media).
    pub conflicts: Vec<String>,
    /// How often this node registered (again, after etcd came back).
    pub registrations: u64,
}

/// `GET /v1/cluster`.
#[derive(Debug, Serialize)]
pub struct ClusterView {
    pub node: NodeInfo,
    /// The channels this node serves to others, as it publishes them.
    pub serves: Vec<ChannelEntry>,
    pub directory: DirectoryState,
    /// What the directory says now (empty without etcd, or when it cannot be read).
    pub nodes: Vec<NodeInfo>,
    /// Why the directory could not be read for this view (`nodes` and `channels` are empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_error: Option<String>,
    pub channels: BTreeMap<String, Vec<ChannelEntry>>,
    pub pulls: Vec<Pull>,
    pub parents: Vec<parents::ParentStatus>,
}

pub struct Cluster {
    pub cfg: ClusterConfig,
    /// Where others pull from this node.
    rtsp_url: String,
    #[cfg(feature = "etcd")]
    etcd: Option<etcd::Etcd>,
    parents: parents::Parents,
    pulls: Mutex<BTreeMap<String, Pull>>,
    failed: Mutex<HashMap<String, Instant>>,
    pub(crate) directory: Mutex<DirectoryState>,
    load: Mutex<Load>,
    /// Per channel: when its bytes were last counted, how many, and the rate they gave.
    rates: Mutex<HashMap<String, (Instant, u64, f64)>>,
    local: std::sync::OnceLock<Weak<dyn Local>>,
}

impl Cluster {
    /// `rtsp`: the relay's RTSP address (the advertised URL unless the config names one).
    pub fn new(cfg: ClusterConfig, rtsp: Option<std::net::SocketAddr>) -> anyhow::Result<Arc<Self>> {
        cfg.validate().map_err(anyhow::Error::msg)?;
        let rtsp_url = match (&cfg.rtsp_url, rtsp) {
            (Some(u), _) => u.trim_end_matches('/').to_string(),
            (None, Some(a)) if cfg.etcd.is_empty() || (!a.ip().is_unspecified() && a.port() != 0) => {
                format!("rtsp://{a}")
            }
            (None, _) => anyhow::bail!(
                "[cluster] rtsp_url: the RTSP address is a wildcard, port 0 or off; say where other nodes reach this one"
            ),
        };
        #[cfg(not(feature = "etcd"))]
        if !cfg.etcd.is_empty() {
            anyhow::bail!(
                "[cluster] etcd: this fanout was built without etcd support; build it with \
                 `cargo build --release --features etcd` (needs protoc: Debian's protobuf-compiler and \
                 libprotobuf-dev), or use `parents` alone"
            );
        }
        let state = if cfg.etcd.is_empty() { "none" } else { "connecting" };
        Ok(Arc::new(Self {
            #[cfg(feature = "etcd")]
            etcd: (!cfg.etcd.is_empty()).then(|| etcd::Etcd::new(&cfg)),
            parents: parents::Parents::new(&cfg.parents),
            rtsp_url,
            cfg,
            pulls: Mutex::new(BTreeMap::new()),
            failed: Mutex::new(HashMap::new()),
            directory: Mutex::new(DirectoryState { state: state.into(), ..Default::default() }),
            load: Mutex::new(Load::default()),
            rates: Mutex::new(HashMap::new()),
            local: std::sync::OnceLock::new(),
        }))
    }

    /// Starts the background work: load sampling, parent health checks, and with etcd the
    /// registration and the publication of this node's channels.
    pub fn start(self: &Arc<Self>, local: Weak<dyn Local>) {
        let _ = self.local.set(local.clone());
        tokio::spawn(sample_load(Arc::downgrade(self), local.clone()));
        self.parents.start();
        #[cfg(feature = "etcd")]
        if self.etcd.is_some() {
            tokio::spawn(etcd::run(self.clone(), local));
        }
    }

    /// Leaves the directory at once (revokes the lease) instead of waiting for it to expire.
    pub async fn leave(&self) {
        #[cfg(feature = "etcd")]
        if let Some(e) = &self.etcd {
            e.leave().await;
        }
    }

    /// This node as the directory shows it.
    pub fn me(&self) -> NodeInfo {
        NodeInfo {
            name: self.cfg.node.clone(),
            rtsp_url: self.rtsp_url.clone(),
            api_url: self.cfg.api_url.clone(),
            region: self.cfg.region.clone(),
            tier: self.cfg.tier,
            max_subscribers: self.cfg.max_subscribers,
            load: self.load.lock().clone(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// This node's channel entries: its own sources as origins, its pulls (while they play)
    /// with their paths.
    fn entries(&self, local: &dyn Local) -> Vec<(String, ChannelEntry)> {
        let channels = local.channels();
        let pulls = self.pulls.lock();
        let mut rates = self.rates.lock();
        rates.retain(|name, _| channels.iter().any(|c| &c.name == name));
        channels
            .into_iter()
            .filter_map(|c| {
                let now = Instant::now();
                let r = rates.entry(c.name.clone()).or_insert((now, c.bytes_in, 0.0));
                let dt = now.duration_since(r.0).as_secs_f64();
                if dt >= 1.0 {
                    *r = (now, c.bytes_in, (c.bytes_in.saturating_sub(r.1) as f64 * 8.0 / 1000.0 / dt).round());
                }
                let rate_kbps = r.2;
                let pull = pulls.get(&c.name);
                if pull.is_some() && !c.playing {
                    return None;
                }
                let e = ChannelEntry {
                    node: self.cfg.node.clone(),
                    url: format!("{}/{}", self.rtsp_url, c.name),
                    origin: pull.is_none(),
                    path: pull.map(|p| p.path.clone()).unwrap_or_default(),
                    codecs: c.codecs,
                    rate_kbps,
                };
                Some((c.name, e))
            })
            .collect()
    }

    fn recently_failed(&self) -> HashSet<String> {
        let mut f = self.failed.lock();
        f.retain(|_, at| at.elapsed() < FAILED_FOR);
        f.keys().cloned().collect()
    }

    /// Where to pull `channel` from now: the directory's best node, else the first parent up.
    pub async fn locate(&self, channel: &str) -> Result<Choice, LookupError> {
        let failed = self.recently_failed();
        let mut why = Vec::new();
        #[cfg(feature = "etcd")]
        if let Some(e) = &self.etcd {
            match e.snapshot().await {
                Ok(snap) => {
                    let me = Me { name: &self.cfg.node, tier: self.cfg.tier, region: self.cfg.region.as_deref() };
                    let entries = snap.channels.get(channel).map(Vec::as_slice).unwrap_or_default();
                    let (choices, left_out) = directory::candidates(&me, entries, &snap.nodes, &failed);
                    if let Some(c) = choices.into_iter().next() {
                        return Ok(c);
                    }
                    why.extend(left_out);
                }
                Err(e) if self.parents.is_empty() => {
                    return Err(LookupError::Down(format!("the cluster directory (etcd) cannot be read: {e}")));
                }
                Err(e) => why.push(format!("etcd: {e}")),
            }
        }
        if let Some(c) = self.parents.pick(channel, &failed, &mut why) {
            return Ok(c);
        }
        let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) };
        Err(LookupError::NotFound(format!("no node of the cluster has channel {channel:?}{why}")))
    }

    /// Where a new client of `channel` goes instead, when this node is at its cap and
    /// redirects (`[cluster] redirect`): a node with room, from the directory.
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    async fn redirect_to(&self, channel: &str) -> Option<NodeInfo> {
        let cap = self.cfg.max_subscribers.filter(|_| self.cfg.redirect)?;
        if self.load.lock().subscribers < cap {
            return None;
        }
        #[cfg(feature = "etcd")]
        if let Some(e) = &self.etcd {
            let snap = e.snapshot().await.ok()?;
            let entries = snap.channels.get(channel).map(Vec::as_slice).unwrap_or_default();
            return directory::redirect_target(&self.cfg.node, entries, &snap.nodes).cloned();
        }
        None
    }

    /// The RTSP URL a new RTSP client of `channel` is redirected to, if any.
    pub async fn redirect(&self, channel: &str) -> Option<String> {
        self.redirect_to(channel).await.map(|n| format!("{}/{channel}", n.rtsp_url))
    }

    /// The stream URL a new HTTP client of `channel` is redirected to, if any (a node that
    /// published its `api_url`).
    pub async fn redirect_http(&self, channel: &str) -> Option<String> {
        self.redirect_api(channel, "stream").await
    }

    /// The playlist URL a new HLS player of `channel` is redirected to, if any.
    pub async fn redirect_hls(&self, channel: &str) -> Option<String> {
        self.redirect_api(channel, "hls/index.m3u8").await
    }

    async fn redirect_api(&self, channel: &str, file: &str) -> Option<String> {
        let n = self.redirect_to(channel).await?;
        Some(format!("{}/v1/sessions/{channel}/{file}", n.api_url?.trim_end_matches('/')))
    }

    /// Records a new pull (the session is being created).
    pub fn begin_pull(&self, channel: &str, c: &Choice) {
        self.pulls.lock().insert(
            channel.to_string(),
            Pull {
                channel: channel.to_string(),
                from: c.node.clone(),
                url: c.url.clone(),
                path: c.path.clone(),
                switches: 0,
                trouble_since: None,
            },
        );
    }

    pub fn end_pull(&self, channel: &str) {
        self.pulls.lock().remove(channel);
    }

    /// The pull's (re)connect target: the node it has unless that one failed, else the next
    /// best. A failed node stays a candidate while it is registered, for `lease_s` + 2 s after
    /// the trouble began (a restarting origin comes back); after that, with no node left, the
    /// pull ends (`Err`).
    async fn next_url(&self, channel: &str, failed: bool) -> Result<String, PullEnds> {
        let (current, from) = {
            let mut pulls = self.pulls.lock();
            let p = pulls.get_mut(channel).ok_or("the pull was ended")?;
            if !failed {
                p.trouble_since = None;
                return Ok(p.url.clone());
            }
            p.trouble_since.get_or_insert_with(Instant::now);
            (p.url.clone(), p.from.clone())
        };
        self.failed.lock().insert(from.clone(), Instant::now());
        let give_up = Duration::from_secs(self.cfg.lease_s + 2);
        loop {
            let trouble = self.pulls.lock().get(channel).and_then(|p| p.trouble_since).map(|t| t.elapsed());
            let Some(trouble) = trouble else { return Err("the pull was ended".into()) };
            match self.locate(channel).await {
                Ok(c) => {
                    let mut pulls = self.pulls.lock();
                    let p = pulls.get_mut(channel).ok_or("the pull was ended")?;
                    if c.node != p.from {
                        tracing::warn!(channel, from = %p.from, to = %c.node, "pull moves to another node");
                        p.switches += 1;
                    }
                    (p.from, p.url, p.path) = (c.node, c.url, c.path);
                    return Ok(p.url.clone());
                }
                // The directory is down: stay with the node we know.
                Err(LookupError::Down(_)) => return Ok(current),
                Err(LookupError::NotFound(why)) if trouble >= give_up => return Err(PullEnds(why)),
                Err(LookupError::NotFound(_)) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// The [`crate::upstream::Origin`] of a pulled channel.
    pub fn origin(self: &Arc<Self>, channel: &str) -> Arc<dyn crate::upstream::Origin> {
        Arc::new(PullOrigin { cluster: self.clone(), channel: channel.to_string() })
    }

    pub fn directory_state(&self) -> DirectoryState {
        self.directory.lock().clone()
    }

    pub fn parent_status(&self) -> Vec<parents::ParentStatus> {
        self.parents.status()
    }

    pub fn pulls(&self) -> Vec<Pull> {
        self.pulls.lock().values().cloned().collect()
    }

    pub async fn view(&self) -> ClusterView {
        #[cfg_attr(not(feature = "etcd"), allow(unused_mut))]
        let (mut nodes, mut channels, mut read_error) = (Vec::new(), BTreeMap::new(), None);
        #[cfg(feature = "etcd")]
        if let Some(e) = &self.etcd {
            match e.snapshot().await {
                Ok(snap) => {
                    nodes = snap.nodes.into_values().collect();
                    channels = snap.channels;
                }
                Err(e) => read_error = Some(e.0),
            }
        }
        let local = self.local.get().and_then(Weak::upgrade);
        ClusterView {
            node: self.me(),
            serves: local.map(|l| self.entries(&*l).into_iter().map(|(_, e)| e).collect()).unwrap_or_default(),
            directory: self.directory.lock().clone(),
            nodes,
            read_error,
            channels,
            pulls: self.pulls(),
            parents: self.parents.status(),
        }
    }
}

struct PullOrigin {
    cluster: Arc<Cluster>,
    channel: String,
}

impl crate::upstream::Origin for PullOrigin {
    fn next(&self, failed: bool) -> crate::upstream::BoxFuture<'_, Result<Url, PullEnds>> {
        Box::pin(async move {
            let url = self.cluster.next_url(&self.channel, failed).await?;
            Url::parse(&url).map_err(|e| PullEnds(format!("{url}: {e}")))
        })
    }
}

/// The process's CPU seconds so far (user + system).
fn cpu_seconds() -> f64 {
    fanout_io::sys::ProcStat::read(None).map_or(0.0, |s| s.cpu_s)
}

/// Keeps [`Cluster::me`]'s load current: counts now, CPU and egress over the last 2 s.
async fn sample_load(cluster: Weak<Cluster>, local: Weak<dyn Local>) {
    let every = Duration::from_secs(2);
    let mut last = (Instant::now(), cpu_seconds(), 0u64);
    loop {
        tokio::time::sleep(every).await;
        let (Some(c), Some(l)) = (cluster.upgrade(), local.upgrade()) else { return };
        let (sessions, subscribers, bytes) = l.counters();
        let (now, cpu) = (Instant::now(), cpu_seconds());
        let dt = now.duration_since(last.0).as_secs_f64().max(1e-3);
        *c.load.lock() = Load {
            sessions,
            subscribers,
            cpu: ((cpu - last.1) / dt * 100.0).round() / 100.0,
            egress_kbps: (bytes.saturating_sub(last.2) as f64 * 8.0 / 1000.0 / dt).round(),
        };
        last = (now, cpu, bytes);
    }
}
