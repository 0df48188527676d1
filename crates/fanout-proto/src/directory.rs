//! The cluster's directory as data, and the choice of where to pull a channel from: no
//! sockets, no clocks (the caller says which nodes failed lately), so every rule is tested
//! on its own.
//!
//! What nodes publish (as JSON, in etcd or anywhere else):
//! - a node: its name, the RTSP base URL others pull from, tier, region, cap and load;
//! - a channel entry per (channel, node that has it): whether that node is an origin (the
//!   source is its own) or relays it, and then the path it pulls through (nearest node first).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// What a node publishes about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// `rtsp://host:port` (or `rtsps://`): where others pull this node's channels.
    pub rtsp_url: String,
    /// `http://host:port`: its API (for people and `fanout ctl`).
    #[serde(default)]
    pub api_url: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    /// 0 for origins; an edge that pulls from tier N is usually N+1.
    #[serde(default)]
    pub tier: u32,
    /// Subscribers it takes; none = no cap.
    #[serde(default)]
    pub max_subscribers: Option<u64>,
    #[serde(default)]
    pub load: Load,
    #[serde(default)]
    pub version: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    pub sessions: u64,
    /// Sinks and RTSP clients of all sessions (not a repackaging's own), and HLS players.
    pub subscribers: u64,
    /// The process's CPU use, in cores (1.0 = one core busy).
    pub cpu: f64,
    /// What it sends, all sessions together.
    pub egress_kbps: f64,
}

/// One node's copy of a channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelEntry {
    pub node: String,
    /// The channel's RTSP URL on that node.
    pub url: String,
    /// The node takes the source itself (not from another node).
    pub origin: bool,
    /// For a relayed copy: the nodes it comes through, nearest first, the origin last.
    #[serde(default)]
    pub path: Vec<String>,
    #[serde(default)]
    pub codecs: Vec<String>,
    #[serde(default)]
    pub rate_kbps: f64,
}

/// Where to pull a channel from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    pub node: String,
    pub url: String,
    /// The path this node's copy will have: the chosen node, then its own path.
    pub path: Vec<String>,
}

/// The node that asks.
pub struct Me<'a> {
    pub name: &'a str,
    pub tier: u32,
    pub region: Option<&'a str>,
}

/// The nodes that can serve `entries`' channel to `me`, best first, and why the others were
/// left out. Rules, in order:
/// - never itself, never a node whose copy already comes through it (a loop), never a node
///   whose registration is gone (its lease expired), never one in `failed` (it just failed);
/// - then a parent (a lower tier) before a peer or a lower node, the nearest tier first
///   (a tier-2 edge pulls from tier 1, not from the origin), the same region first,
///   a node under its cap before one at it, origins before relays at equal rank, fewer
///   hops, the least loaded (subscribers), and the name, so that equal nodes choose alike.
pub fn candidates(
    me: &Me,
    entries: &[ChannelEntry],
    nodes: &BTreeMap<String, NodeInfo>,
    failed: &HashSet<String>,
) -> (Vec<Choice>, Vec<String>) {
    let mut why_not = Vec::new();
    let mut ok: Vec<(&ChannelEntry, &NodeInfo)> = Vec::new();
    for e in entries {
        if e.node == me.name {
            continue;
        }
        if e.path.iter().any(|n| n == me.name) {
            why_not.push(format!("{}: its copy comes through this node (a loop)", e.node));
            continue;
        }
        let Some(n) = nodes.get(&e.node) else {
            why_not.push(format!("{}: not registered (its lease is gone)", e.node));
            continue;
        };
        if failed.contains(&e.node) {
            why_not.push(format!("{}: failed a moment ago", e.node));
            continue;
        }
        ok.push((e, n));
    }
    ok.sort_by(|(ea, na), (eb, nb)| {
        let rank = |e: &ChannelEntry, n: &NodeInfo| {
            let parent = n.tier < me.tier;
            let same_region = me.region.is_some() && n.region.as_deref() == me.region;
            let full = n.max_subscribers.is_some_and(|cap| n.load.subscribers >= cap);
            (!parent, n.tier.abs_diff(me.tier), !same_region, full, !e.origin, e.path.len(), n.load.subscribers)
        };
        rank(ea, na).cmp(&rank(eb, nb)).then_with(|| ea.node.cmp(&eb.node))
    });
    let choices = ok
        .into_iter()
        .map(|(e, _)| Choice {
            node: e.node.clone(),
            url: e.url.clone(),
            path: std::iter::once(e.node.clone()).chain(e.path.iter().cloned()).collect(),
        })
        .collect();
    (choices, why_not)
}

/// Where a node at its subscriber cap sends a new client: another node with room (no cap,
/// or below it), one that has the channel first (it need not pull), then the least loaded,
/// then by name. `None` when no node has room.
pub fn redirect_target<'a>(
    me: &str,
    entries: &[ChannelEntry],
    nodes: &'a BTreeMap<String, NodeInfo>,
) -> Option<&'a NodeInfo> {
    nodes
        .values()
        .filter(|n| n.name != me && n.max_subscribers.is_none_or(|cap| n.load.subscribers < cap))
        .min_by_key(|n| (!entries.iter().any(|e| e.node == n.name), n.load.subscribers, n.name.clone()))
}

/// What looks wrong in a channel's entries: several origins whose media differ (the same
/// name for two streams), or a relayed copy whose path names no origin. Edges still pull,
/// but a person should look.
pub fn conflicts(channel: &str, entries: &[ChannelEntry]) -> Vec<String> {
    let mut out = Vec::new();
    let origins: Vec<&ChannelEntry> = entries.iter().filter(|e| e.origin).collect();
    if let Some(first) = origins.first() {
        for o in &origins[1..] {
            if !o.codecs.is_empty() && !first.codecs.is_empty() && o.codecs != first.codecs {
                out.push(format!(
                    "channel {channel:?} has origins with different media: {} {:?}, {} {:?}",
                    first.node, first.codecs, o.node, o.codecs
                ));
            }
        }
    }
    for e in entries.iter().filter(|e| !e.origin && e.path.is_empty()) {
        out.push(format!("channel {channel:?}: {} relays it from nowhere (empty path)", e.node));
    }
    out
}

/// The channel and node a directory key names: `{prefix}/channels/{channel}/{node}`.
pub fn channel_key(prefix: &str, channel: &str, node: &str) -> String {
    format!("{prefix}/channels/{channel}/{node}")
}

pub fn node_key(prefix: &str, node: &str) -> String {
    format!("{prefix}/nodes/{node}")
}

/// Everything under a prefix, parsed: nodes, and channels with their entries. A value that
/// does not parse, or whose name disagrees with its key, is left out with a reason (another
/// program may share the keyspace).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub nodes: BTreeMap<String, NodeInfo>,
    pub channels: BTreeMap<String, Vec<ChannelEntry>>,
    pub rejected: Vec<String>,
}

impl Snapshot {
    pub fn parse<'a>(prefix: &str, kvs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Snapshot {
        let mut s = Snapshot::default();
        let nodes = format!("{prefix}/nodes/");
        let channels = format!("{prefix}/channels/");
        for (k, v) in kvs {
            let Ok(key) = std::str::from_utf8(k) else {
                s.rejected.push(format!("a key that is not UTF-8: {k:?}"));
                continue;
            };
            if let Some(name) = key.strip_prefix(&nodes) {
                match serde_json::from_slice::<NodeInfo>(v) {
                    Ok(n) if n.name == name => {
                        s.nodes.insert(n.name.clone(), n);
                    }
                    Ok(n) => s.rejected.push(format!("{key}: names node {:?}", n.name)),
                    Err(e) => s.rejected.push(format!("{key}: not a node entry: {e}")),
                }
            } else if let Some(rest) = key.strip_prefix(&channels) {
                let Some((channel, node)) = rest.rsplit_once('/') else {
                    s.rejected.push(format!("{key}: not {channels}CHANNEL/NODE"));
                    continue;
                };
                match serde_json::from_slice::<ChannelEntry>(v) {
                    Ok(e) if e.node == node => s.channels.entry(channel.to_string()).or_default().push(e),
                    Ok(e) => s.rejected.push(format!("{key}: names node {:?}", e.node)),
                    Err(e) => s.rejected.push(format!("{key}: not a channel entry: {e}")),
                }
            } else {
                s.rejected.push(format!("{key}: not under {nodes} or {channels}"));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(name: &str, tier: u32, region: Option<&str>, subs: u64) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            rtsp_url: format!("rtsp://{name}:8554"),
            api_url: None,
            region: region.map(Into::into),
            tier,
            max_subscribers: None,
            load: Load { subscribers: subs, ..Load::default() },
            version: String::new(),
        }
    }

    fn entry(node: &str, path: &[&str]) -> ChannelEntry {
        ChannelEntry {
            node: node.into(),
            url: format!("rtsp://{node}:8554/tv"),
            origin: path.is_empty(),
            path: path.iter().map(|s| s.to_string()).collect(),
            codecs: vec!["H264/90000".into()],
            rate_kbps: 300.0,
        }
    }

    fn nodes(list: &[NodeInfo]) -> BTreeMap<String, NodeInfo> {
        list.iter().map(|n| (n.name.clone(), n.clone())).collect()
    }

    fn names(c: &[Choice]) -> Vec<&str> {
        c.iter().map(|c| c.node.as_str()).collect()
    }

    #[test]
    fn a_parent_before_a_peer_then_region_then_load() {
        let me = Me { name: "e1", tier: 1, region: Some("eu") };
        let ns = nodes(&[
            node("o1", 0, Some("us"), 50),
            node("o2", 0, Some("eu"), 90),
            node("e2", 1, Some("eu"), 0),
            node("e1", 1, Some("eu"), 0),
        ]);
        let es = [entry("o1", &[]), entry("e2", &["o2"]), entry("o2", &[]), entry("e1", &["o2"])];
        let (c, _) = candidates(&me, &es, &ns, &HashSet::new());
        assert_eq!(names(&c), ["o2", "o1", "e2"]);
        assert_eq!(c[2].path, ["e2", "o2"]);
    }

    #[test]
    fn the_nearest_tier_above_is_the_parent() {
        let me = Me { name: "e3", tier: 2, region: None };
        let ns = nodes(&[node("o1", 0, None, 0), node("e1", 1, None, 40)]);
        let (c, _) = candidates(&me, &[entry("o1", &[]), entry("e1", &["o1"])], &ns, &HashSet::new());
        assert_eq!(names(&c), ["e1", "o1"]);
    }

    #[test]
    fn loops_gone_nodes_and_failed_nodes_are_left_out_with_reasons() {
        let me = Me { name: "e1", tier: 1, region: None };
        let ns = nodes(&[node("o1", 0, None, 0), node("e2", 2, None, 0), node("e3", 2, None, 0)]);
        let es = [entry("o1", &[]), entry("e2", &["e1", "o1"]), entry("gone", &[]), entry("e3", &["o1"])];
        let failed = HashSet::from(["o1".to_string()]);
        let (c, why) = candidates(&me, &es, &ns, &failed);
        assert_eq!(names(&c), ["e3"]);
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(why.iter().any(|w| w.contains("loop")));
        assert!(why.iter().any(|w| w.contains("lease")));
        assert!(why.iter().any(|w| w.contains("failed")));
    }

    #[test]
    fn a_node_at_its_cap_comes_after_one_below_it() {
        let me = Me { name: "e1", tier: 1, region: None };
        let mut full = node("o1", 0, None, 10);
        full.max_subscribers = Some(10);
        let ns = nodes(&[full, node("o2", 0, None, 500)]);
        let (c, _) = candidates(&me, &[entry("o1", &[]), entry("o2", &[])], &ns, &HashSet::new());
        assert_eq!(names(&c), ["o2", "o1"]);
    }

    #[test]
    fn a_full_node_redirects_to_one_with_room_that_has_the_channel() {
        let mut full = node("o2", 0, None, 10);
        full.max_subscribers = Some(10);
        let ns = nodes(&[node("e1", 1, None, 3), full, node("o1", 0, None, 50), node("e9", 1, None, 0)]);
        let es = [entry("o1", &[]), entry("o2", &[])];
        // o2 is full; o1 has the channel; e9 is idle but would have to pull it.
        assert_eq!(redirect_target("e1", &es, &ns).map(|n| n.name.as_str()), Some("o1"));
        assert_eq!(redirect_target("e1", &[], &ns).map(|n| n.name.as_str()), Some("e9"));
        let only_me = nodes(&[node("e1", 1, None, 3)]);
        assert!(redirect_target("e1", &es, &only_me).is_none());
    }

    #[test]
    fn snapshot_keeps_good_entries_and_says_why_it_drops_others() {
        let n = serde_json::to_vec(&node("o1", 0, None, 0)).unwrap();
        let e = serde_json::to_vec(&entry("o1", &[])).unwrap();
        let kvs: Vec<(&[u8], &[u8])> = vec![
            (b"/f/nodes/o1", &n),
            (b"/f/nodes/o2", &n), // names o1
            (b"/f/channels/tv/o1", &e),
            (b"/f/channels/tv/o9", &e),
            (b"/f/channels/junk", b"{}"),
            (b"/f/nodes/x", b"not json"),
            (b"/f/other", b"1"),
        ];
        let s = Snapshot::parse("/f", kvs);
        assert_eq!(s.nodes.len(), 1);
        assert_eq!(s.channels["tv"].len(), 1);
        assert_eq!(s.rejected.len(), 5, "{:?}", s.rejected);
    }

    #[test]
    fn two_origins_with_different_media_are_a_conflict() {
        let mut b = entry("o2", &[]);
        b.codecs = vec!["H265/90000".into()];
        assert_eq!(conflicts("tv", &[entry("o1", &[]), b]).len(), 1);
        assert!(conflicts("tv", &[entry("o1", &[]), entry("o2", &[])]).is_empty());
    }

    proptest! {
        /// Whatever the directory says, the choice never names the asking node, a node whose
        /// copy passes through it, an unregistered or failed node; and every choice is an entry.
        #[test]
        fn choices_are_always_safe(
            raw in proptest::collection::vec((0u8..6, proptest::collection::vec(0u8..6, 0..4), 0u32..3, 0u64..100), 0..12),
            registered in proptest::collection::vec(any::<bool>(), 6),
            failed in proptest::collection::vec(any::<bool>(), 6),
            my_tier in 0u32..3,
        ) {
            let name = |i: u8| format!("n{i}");
            let me = Me { name: "n0", tier: my_tier, region: None };
            let ns = nodes(&(0..6u8).filter(|i| registered[*i as usize]).map(|i| node(&name(i), i as u32 % 3, None, i as u64)).collect::<Vec<_>>());
            let es: Vec<ChannelEntry> = raw.iter().map(|(n, path, _, _)| {
                let p: Vec<String> = path.iter().map(|i| name(*i)).collect();
                let refs: Vec<&str> = p.iter().map(String::as_str).collect();
                entry(&name(*n), &refs)
            }).collect();
            let bad: HashSet<String> = (0..6u8).filter(|i| failed[*i as usize]).map(name).collect();
            let (c, _) = candidates(&me, &es, &ns, &bad);
            for ch in &c {
                prop_assert_ne!(&ch.node, "n0");
                prop_assert!(!ch.path[1..].iter().any(|p| p == "n0"));
                prop_assert!(ns.contains_key(&ch.node));
                prop_assert!(!bad.contains(&ch.node));
                prop_assert!(es.iter().any(|e| e.node == ch.node && e.url == ch.url));
            }
        }
    }
}
