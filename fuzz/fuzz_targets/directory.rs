//! The cluster directory's parser on arbitrary keys and values (what etcd holds may be
//! written by anything): never a panic; every kept entry agrees with its key; and choosing
//! a node (to pull from, or to redirect to) from what was kept never names the asking node
//! or one whose copy loops through it.
#![no_main]
use fanout_proto::directory::{candidates, conflicts, redirect_target, Me, Snapshot};
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    // Pairs split at 0xff: key, value, key, value, ...
    let parts: Vec<&[u8]> = data.split(|b| *b == 0xff).collect();
    let kvs: Vec<(&[u8], &[u8])> = parts.chunks_exact(2).map(|c| (c[0], c[1])).collect();
    let snap = Snapshot::parse("/f", kvs.iter().copied());
    for (name, n) in &snap.nodes {
        assert_eq!(name, &n.name);
    }
    let me = Me { name: "n0", tier: 1, region: Some("eu") };
    for (channel, entries) in &snap.channels {
        let _ = conflicts(channel, entries);
        if let Some(n) = redirect_target("n0", entries, &snap.nodes) {
            assert_ne!(n.name, "n0");
        }
        let (choices, _) = candidates(&me, entries, &snap.nodes, &HashSet::new());
        for c in choices {
            assert_ne!(c.node, "n0");
            assert!(!c.path[1..].iter().any(|p| p == "n0"));
            assert!(snap.nodes.contains_key(&c.node));
        }
    }
});
