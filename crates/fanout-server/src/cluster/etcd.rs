//! The directory in etcd: this node registers under a lease and publishes its channels;
//! lookups read the whole prefix (a lookup is the first subscriber of a channel on a node,
//! rare enough to read fresh rather than to keep a watched copy).
//!
//! Keys (`prefix` is `/fanout` unless configured), all under this node's lease:
//! - `{prefix}/nodes/{node}`: its [`NodeInfo`] (JSON), rewritten every 2 s with its load;
//! - `{prefix}/channels/{channel}/{node}`: a [`ChannelEntry`] (JSON) per channel it has.
//!
//! When etcd cannot be reached the node keeps serving and pulling what it has; it registers
//! again (a new lease, every entry rewritten) as soon as etcd answers.

use super::{Cluster, Local};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use fanout_proto::directory::{channel_key, conflicts, node_key, Snapshot};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Every etcd call is given this long, but writes:
const CALL: Duration = Duration::from_secs(2);
/// A write waits for etcd's disk, which on a busy host takes seconds; the lease is kept
/// alive meanwhile, so a slow write costs nothing but its wait.
const WRITE: Duration = Duration::from_secs(6);
const NODE_EVERY: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_secs(1);

pub struct Etcd {
    endpoints: Vec<String>,
    prefix: String,
    client: tokio::sync::Mutex<Option<Client>>,
    /// The lease this node holds now (0: none), revoked when it leaves.
    lease: parking_lot::Mutex<i64>,
}

/// Why a call to etcd failed (unreachable, no answer in time, refused), for the log and the
/// cluster's status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct EtcdError(pub String);

impl From<String> for EtcdError {
    fn from(s: String) -> Self {
        EtcdError(s)
    }
}

async fn within<T, E: std::fmt::Display>(f: impl std::future::Future<Output = Result<T, E>>) -> Result<T, EtcdError> {
    limited(CALL, f).await
}

async fn written<T, E: std::fmt::Display>(f: impl std::future::Future<Output = Result<T, E>>) -> Result<T, EtcdError> {
    limited(WRITE, f).await
}

async fn limited<T, E: std::fmt::Display>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| EtcdError(e.to_string())),
        Err(_) => Err(EtcdError(format!("no answer within {limit:?}"))),
    }
}

impl Etcd {
    pub fn new(cfg: &crate::config::ClusterConfig) -> Self {
        Self {
            endpoints: cfg.etcd.clone(),
            prefix: cfg.prefix.clone(),
            client: tokio::sync::Mutex::new(None),
            lease: parking_lot::Mutex::new(0),
        }
    }

    /// A connected client (made on first use, and again after a failure).
    async fn client(&self) -> Result<Client, EtcdError> {
        let mut c = self.client.lock().await;
        if let Some(c) = c.as_ref() {
            return Ok(c.clone());
        }
        let opts = ConnectOptions::new().with_connect_timeout(CALL).with_keep_alive(CALL, CALL);
        let made = within(Client::connect(&self.endpoints, Some(opts)))
            .await
            .map_err(|e| format!("etcd {}: {e}", self.endpoints.join(",")))?;
        *c = Some(made.clone());
        Ok(made)
    }

    /// Forgets the client after a failure, so that the next call connects again.
    async fn reset(&self) {
        *self.client.lock().await = None;
    }

    pub async fn snapshot(&self) -> Result<Snapshot, EtcdError> {
        let mut c = self.client().await?;
        let prefix = format!("{}/", self.prefix);
        // Serializable: the member's own copy, without a round of consensus that would wait
        // behind writes on a slow disk (a directory a moment stale is good enough).
        match within(c.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_serializable()))).await {
            Ok(r) => Ok(Snapshot::parse(&self.prefix, r.kvs().iter().map(|kv| (kv.key(), kv.value())))),
            Err(e) => {
                self.reset().await;
                Err(EtcdError(format!("etcd {}: {e}", self.endpoints.join(","))))
            }
        }
    }

    pub async fn leave(&self) {
        let id = std::mem::take(&mut *self.lease.lock());
        if id != 0 {
            if let Ok(mut c) = self.client().await {
                let _ = within(c.lease_revoke(id)).await;
            }
        }
    }
}

/// Registers the node and keeps its entries current, for as long as the process runs.
pub async fn run(cluster: Arc<Cluster>, local: Weak<dyn Local>) {
    let mut last_error = String::new();
    loop {
        let e = match registered(&cluster, &local).await {
            Ok(()) => return, // the relay is gone
            Err(e) => e.0,
        };
        if e != last_error {
            tracing::warn!(node = %cluster.cfg.node, "cluster directory: {e}; trying again");
            last_error = e.clone();
        }
        {
            let mut d = cluster.directory.lock();
            if d.state != "name-taken" {
                d.state = "unreachable".into();
            }
            d.last_error = Some(e);
        }
        if let Some(etcd) = &cluster.etcd {
            etcd.reset().await;
        }
        tokio::time::sleep(TICK).await;
    }
}

/// One registration: from a new lease until etcd fails (`Err`) or the relay is gone (`Ok`).
async fn registered(cluster: &Arc<Cluster>, local: &Weak<dyn Local>) -> Result<(), EtcdError> {
    let etcd = cluster.etcd.as_ref().expect("started with etcd");
    let mut c = etcd.client().await?;
    let (node, prefix) = (&cluster.cfg.node, &etcd.prefix);
    let granted = written(c.lease_grant(cluster.cfg.lease_s as i64, None)).await?;
    let (lease, granted_ttl) = (granted.id(), granted.ttl());
    let mut lapsed = keep_alive(&mut c, lease, granted_ttl).await?;
    claim_name(cluster, etcd, &mut c, lease).await?;
    tracing::info!(node = %node, lease, "registered in the cluster directory");
    let key = node_key(prefix, node);
    let with_lease = || Some(PutOptions::new().with_lease(lease));
    let mut published: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut node_at = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            why = &mut lapsed.0 => return Err(why.unwrap_or_else(|e| EtcdError(format!("the lease's keeper: {e}")))),
        }
        let Some(l) = local.upgrade() else { return Ok(()) };
        if node_at.elapsed() >= NODE_EVERY {
            written(c.put(key.clone(), node_info(cluster), with_lease())).await?;
            node_at = tokio::time::Instant::now();
        }
        let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (channel, e) in cluster.entries(&*l) {
            want.insert(channel_key(prefix, &channel, node), serde_json::to_vec(&e).expect("serializable"));
        }
        drop(l);
        for (k, v) in &want {
            if published.get(k) != Some(v) {
                written(c.put(k.clone(), v.clone(), with_lease())).await?;
                published.insert(k.clone(), v.clone());
            }
        }
        let gone: Vec<String> = published.keys().filter(|k| !want.contains_key(*k)).cloned().collect();
        for k in gone {
            written(c.delete(k.clone(), None)).await?;
            published.remove(&k);
        }
        note_conflicts(cluster, etcd).await;
    }
}

fn node_info(cluster: &Cluster) -> Vec<u8> {
    serde_json::to_vec(&cluster.me()).expect("serializable")
}

/// The lease kept alive from now on, on its own beat, three times a TTL: the writes wait for
/// etcd's disk, and a slow one must not let the lease lapse (on a busy host it did, with a
/// 2 s lease, and the node left the directory). The task ends with why it lapsed.
async fn keep_alive(c: &mut Client, lease: i64, ttl: i64) -> Result<Aborting<EtcdError>, EtcdError> {
    let (mut keeper, mut alive) = within(c.lease_keep_alive(lease)).await?;
    let beat = Duration::from_millis((ttl.max(1) as u64 * 1000 / 3).max(300));
    Ok(Aborting(tokio::spawn(async move {
        let mut every = tokio::time::interval(beat);
        loop {
            every.tick().await;
            if let Err(e) = within(keeper.keep_alive()).await {
                return e;
            }
            match within(alive.message()).await {
                Ok(Some(r)) if r.ttl() > 0 => {}
                Err(e) => return e,
                Ok(_) => return EtcdError("the lease expired (etcd lost us for too long)".into()),
            }
        }
    })))
}

/// The node's name under `lease`: ours if nobody holds it, or if the holder is our own
/// earlier lease (etcd restarted and kept it); else refused, the lease let go.
async fn claim_name(cluster: &Cluster, etcd: &Etcd, c: &mut Client, lease: i64) -> Result<(), EtcdError> {
    let node = &cluster.cfg.node;
    let key = node_key(&etcd.prefix, node);
    let with_lease = || Some(PutOptions::new().with_lease(lease));
    let earlier = std::mem::replace(&mut *etcd.lease.lock(), lease);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), node_info(cluster), with_lease())])
        .or_else([TxnOp::get(key.clone(), None)]);
    let r = written(c.txn(txn)).await?;
    if !r.succeeded() {
        let holder = r.op_responses().into_iter().find_map(|o| match o {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
            _ => None,
        });
        match holder {
            Some(h) if h == earlier && h != 0 => {
                let _ = within(c.lease_revoke(h)).await;
                written(c.put(key.clone(), node_info(cluster), with_lease())).await?;
            }
            _ => {
                let _ = within(c.lease_revoke(lease)).await;
                *etcd.lease.lock() = 0;
                cluster.directory.lock().state = "name-taken".into();
                return Err(EtcdError(format!(
                    "node name {node:?} is held by another live node (lease {}); waiting for it to go",
                    holder.unwrap_or(0)
                )));
            }
        }
    }
    let mut d = cluster.directory.lock();
    d.state = "connected".into();
    d.last_error = None;
    d.registrations += 1;
    Ok(())
}

/// What others wrote that we cannot read, and channels whose origins disagree: shown in the
/// status, logged when they change.
async fn note_conflicts(cluster: &Cluster, etcd: &Etcd) {
    let Ok(snap) = etcd.snapshot().await else { return };
    let found: Vec<String> = snap.channels.iter().flat_map(|(ch, es)| conflicts(ch, es)).collect();
    let mut d = cluster.directory.lock();
    for w in found.iter().chain(&snap.rejected) {
        if !d.conflicts.contains(w) && !d.rejected.contains(w) {
            tracing::warn!("cluster directory: {w}");
        }
    }
    d.conflicts = found;
    d.rejected = snap.rejected;
}

/// A task aborted when its handle is dropped (the lease's keeper ends with its registration).
struct Aborting<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
