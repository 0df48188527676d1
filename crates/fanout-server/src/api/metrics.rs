//! `/metrics` in Prometheus's text format: every family from the paths' registries and the
//! engine's counters.

use super::*;

/// Writes one metric family: its HELP and TYPE lines, then its samples as (labels, value).
pub(super) fn family(
    m: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl IntoIterator<Item = (String, u64)>,
) {
    let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(m, "{name}{labels} {v}");
    }
}

/// A Prometheus label value, escaped.
pub(super) fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The node's place in its cluster: the directory, its pulls, its parents.
pub(super) fn cluster_metrics(m: &mut String, c: &crate::cluster::Cluster) {
    let node = label(&c.cfg.node);
    let d = c.directory_state();
    let up = u64::from(d.state == "connected");
    let help = "1 while the node is registered in the cluster directory (etcd).";
    family(m, "fanout_cluster_directory_up", "gauge", help, [(format!("{{node=\"{node}\"}}"), up)]);
    let help = "Registrations in the directory (a new one after etcd came back).";
    family(
        m,
        "fanout_cluster_registrations_total",
        "counter",
        help,
        [(format!("{{node=\"{node}\"}}"), d.registrations)],
    );
    let pulls = c.pulls();
    let help = "Channels pulled from another node (1 per channel, labelled with the node).";
    let samples =
        pulls.iter().map(|p| (format!("{{channel=\"{}\",from=\"{}\"}}", label(&p.channel), label(&p.from)), 1));
    family(m, "fanout_cluster_pull", "gauge", help, samples);
    let help = "Moves of a pull to another node (failovers).";
    let samples = pulls.iter().map(|p| (format!("{{channel=\"{}\"}}", label(&p.channel)), p.switches));
    family(m, "fanout_cluster_pull_switches_total", "counter", help, samples);
    let help = "1 while a configured parent answers its health check.";
    let samples = c
        .parent_status()
        .into_iter()
        .map(|p| (format!("{{parent=\"{}\"}}", label(&p.url)), u64::from(p.health == "up")));
    family(m, "fanout_cluster_parent_up", "gauge", help, samples);
}

/// Prometheus text exposition of the same counters the status calls show.
/// The process's own figures from /proc (Prometheus' conventional `process_*` names).
pub(super) fn process_metrics(m: &mut String) {
    if let Ok(s) = fanout_io::sys::ProcStat::read(None) {
        let _ = writeln!(m, "# HELP process_cpu_seconds_total User and system CPU time.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}", s.cpu_s);
        let _ = writeln!(m, "# HELP process_resident_memory_bytes Resident memory.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}", s.rss_bytes);
        let _ =
            writeln!(m, "# HELP process_threads Threads.\n# TYPE process_threads gauge\nprocess_threads {}", s.threads);
    }
    if let Some((in_use, kept)) = fanout_io::sys::malloc_figures() {
        let _ = writeln!(m, "# HELP fanout_malloc_in_use_bytes Memory the allocator has given out and not had back.\n# TYPE fanout_malloc_in_use_bytes gauge\nfanout_malloc_in_use_bytes {in_use}");
        let _ = writeln!(m, "# HELP fanout_malloc_kept_free_bytes Memory in free chunks the allocator keeps for reuse (resident until given back: the relay trims every 30 s).\n# TYPE fanout_malloc_kept_free_bytes gauge\nfanout_malloc_kept_free_bytes {kept}");
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        let _ = writeln!(
            m,
            "# HELP process_open_fds Open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {}",
            fds.count()
        );
    }
}

pub(super) async fn metrics(State(relay): State<Arc<Relay>>) -> impl IntoResponse {
    let mut m = String::new();
    let sessions = relay.sessions();
    relay_families(&mut m, &relay, sessions.len());
    reader_families(&mut m, &relay);
    publisher_families(&mut m, &relay);
    forward_families(&mut m, &relay);
    process_metrics(&mut m);
    if let Some(c) = &relay.cluster {
        cluster_metrics(&mut m, c);
    }
    let statuses: Vec<_> = sessions.iter().map(|s| (s.status(), s.sinks())).collect();
    session_families(&mut m, &statuses);
    let rtsp = relay.rtsp.lock().as_ref().map(|r| r.clients());
    rtsp_families(&mut m, rtsp.as_deref());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m)
}

/// The relay's own: the engine, its paths, refusals, logins, the build.
fn relay_families(m: &mut String, relay: &Relay, sessions: usize) {
    let one = |v: u64| [(String::new(), v)];
    family(
        m,
        "fanout_engine_task_runs_total",
        "counter",
        "Tasks run by the engine's workers.",
        one(relay.engine.runs()),
    );
    let help = "Sessions of a class below this are shed for overload (0: none).";
    family(m, "fanout_engine_shed_below_class", "gauge", help, one(u64::from(relay.engine.shed().0)));
    family(m, "fanout_sessions", "gauge", "Sessions configured.", one(sessions as u64));
    let refused = relay.books.totals().into_iter().map(|(why, n)| (format!("{{reason=\"{}\"}}", label(why)), n));
    let help = "Connections refused at accept, by reason (a cap per address or per listener).";
    family(m, "fanout_connections_refused_total", "counter", help, refused);
    let (failed, banned) = relay.books.failed_logins();
    let failed = failed.into_iter().map(|(face, n)| (format!("{{face=\"{}\"}}", label(face)), n));
    let help = "Logins that failed (wrong credentials given; a wrong SRT passphrase), by face.";
    family(m, "fanout_failed_logins_total", "counter", help, failed);
    let help = "Addresses refused now for failing to log in too often (max_failed_logins).";
    family(m, "fanout_banned_addresses", "gauge", help, one(banned as u64));
    let build = [(format!("{{version=\"{}\"}}", env!("CARGO_PKG_VERSION")), 1)];
    family(m, "fanout_build_info", "gauge", "The running build (always 1).", build);
}

/// Readers, every face's, from each path's registry: by protocol, and (the older families)
/// by face.
fn reader_families(m: &mut String, relay: &Relay) {
    let mut by_protocol: std::collections::BTreeMap<(String, Protocol), u64> = Default::default();
    for p in relay.paths() {
        for (protocol, n) in p.readers.counts() {
            by_protocol.insert((p.name.clone(), protocol), n as u64);
        }
    }
    let of = |protocols: &[Protocol]| {
        let mut n: std::collections::BTreeMap<&str, u64> = Default::default();
        for ((path, p), k) in &by_protocol {
            if protocols.contains(p) {
                *n.entry(path.as_str()).or_default() += k;
            }
        }
        n.into_iter().map(|(path, n)| (format!("{{session=\"{}\"}}", label(path)), n)).collect::<Vec<_>>()
    };
    let help = "HLS players of the session: names with a playlist request in the last 10 s.";
    family(m, "fanout_hls_players", "gauge", help, of(&[Protocol::Hls]));
    let help = "RTMP players of the session.";
    family(m, "fanout_rtmp_players", "gauge", help, of(&[Protocol::Rtmp, Protocol::Rtmps]));
    family(m, "fanout_srt_readers", "gauge", "SRT readers of the session.", of(&[Protocol::Srt]));
    let help = "WebRTC (WHEP) viewers of the session.";
    family(m, "fanout_webrtc_viewers", "gauge", help, of(&[Protocol::Webrtc]));
    let readers = by_protocol.iter().map(|((path, protocol), n)| {
        (format!("{{session=\"{}\",protocol=\"{}\"}}", label(path), protocol.as_str()), *n)
    });
    let help = "Readers of the session by protocol, from its readers' registry (every face).";
    family(m, "fanout_readers", "gauge", help, readers);
}

/// Forward targets: whether each pushes now, what it pushed, how often it connected again.
fn forward_families(m: &mut String, relay: &Relay) {
    let mut all = Vec::new();
    for p in relay.paths() {
        for f in &p.forwards {
            all.push((format!("{{session=\"{}\",url=\"{}\"}}", label(&p.name), label(&f.shown)), f.status()));
        }
    }
    let pushing = all.iter().map(|(l, s)| (l.clone(), u64::from(s.state == "pushing")));
    family(m, "fanout_forward_pushing", "gauge", "1 while the forward target takes the path's stream.", pushing);
    let bytes = all.iter().map(|(l, s)| (l.clone(), s.bytes));
    family(m, "fanout_forward_bytes_total", "counter", "Bytes pushed to the forward target.", bytes);
    let again = all.iter().map(|(l, s)| (l.clone(), s.reconnects));
    let help = "Connections to the forward target that failed (not ended by the path).";
    family(m, "fanout_forward_reconnects_total", "counter", help, again);
}

/// Publish sessions: who publishes now, over what; how many have.
fn publisher_families(m: &mut String, relay: &Relay) {
    let pubs: Vec<_> = relay.paths().iter().filter_map(|p| Some((p.name.clone(), p.publisher()?.status()))).collect();
    let publishing = pubs.iter().filter(|(_, st)| st.state == "publishing").map(|(n, st)| {
        let protocol = st.transport.map_or("rtsp", |t| t.protocol());
        (format!("{{session=\"{}\",protocol=\"{protocol}\"}}", label(n)), 1)
    });
    let help = "1 while the session's publisher publishes, by protocol (rtsp, rtmp, srt).";
    family(m, "fanout_publishing", "gauge", help, publishing);
    let publishes = pubs.iter().map(|(n, st)| (format!("{{session=\"{}\"}}", label(n)), st.publishes));
    family(m, "fanout_publishes_total", "counter", "Publishers the session has had.", publishes);
}

/// Each relay session's counters, its sinks' and its kernel path's.
fn session_families(m: &mut String, statuses: &[(fanout_io::SessionStatus, Vec<fanout_io::SinkStatus>)]) {
    type SessionFn = fn(&fanout_io::SessionStatus) -> u64;
    let per_session: [(&str, &str, &str, SessionFn); 10] = [
        (
            "fanout_delivered_packets_total",
            "counter",
            "Packets delivered to the session's sinks, removed ones too.",
            |s| s.delivered_packets_total,
        ),
        ("fanout_delivered_bytes_total", "counter", "Bytes delivered to the session's sinks, removed ones too.", |s| {
            s.delivered_bytes_total
        }),
        ("fanout_source_packets_total", "counter", "Packets received from the source.", |s| s.source.packets),
        ("fanout_source_bytes_total", "counter", "Bytes received from the source.", |s| s.source.bytes),
        ("fanout_source_oversized_total", "counter", "Datagrams dropped as larger than max_datagram.", |s| {
            s.source.oversized
        }),
        ("fanout_source_malformed_total", "counter", "Datagrams dropped as empty or not RTP.", |s| s.source.malformed),
        (
            "fanout_source_shed_total",
            "counter",
            "Packets dropped on arrival while the session's class was shed.",
            |s| s.source.shed,
        ),
        ("fanout_ring_used", "gauge", "Packets held in the session ring.", |s| s.ring_used as u64),
        ("fanout_session_sinks", "gauge", "Sinks of the session.", |s| s.sinks as u64),
        ("fanout_session_sinks_failed", "gauge", "Sinks of the session marked failed.", |s| s.sinks_failed as u64),
    ];
    for (name, kind, help, f) in per_session {
        let samples = statuses.iter().map(|(s, _)| (format!("{{session=\"{}\"}}", s.name), f(s)));
        family(m, name, kind, help, samples);
    }
    type SinkFn = fn(&fanout_io::SinkStatus) -> u64;
    let per_sink: [(&str, &str, &str, SinkFn); 5] = [
        ("fanout_sink_packets_total", "counter", "Packets sent to the sink.", |k| k.packets_sent),
        ("fanout_sink_bytes_total", "counter", "Bytes sent to the sink.", |k| k.bytes_sent),
        ("fanout_sink_skipped_total", "counter", "Packets the sink skipped by slowest-sink-drop.", |k| {
            k.packets_skipped
        }),
        ("fanout_sink_errors_total", "counter", "Send errors seen by the sink.", |k| k.errors),
        ("fanout_sink_lag", "gauge", "Packets published but not yet handed to the sink.", |k| k.lag),
    ];
    for (name, kind, help, f) in per_sink {
        let samples = statuses.iter().flat_map(|(s, sinks)| {
            sinks
                .iter()
                .map(move |k| (format!("{{session=\"{}\",sink=\"{}\",path=\"{}\"}}", s.name, k.id, k.path), f(k)))
        });
        family(m, name, kind, help, samples);
    }
    type KernelFn = fn(&fanout_io::kernel::KernelSessionStats) -> u64;
    let per_kernel: [(&str, &str, &str, KernelFn); 3] = [
        ("fanout_kernel_packets_total", "counter", "Source datagrams the eBPF program fanned out.", |k| k.packets),
        ("fanout_kernel_unhandled_total", "counter", "Source datagrams the eBPF program could not fan out.", |k| {
            k.unhandled
        }),
        ("fanout_kernel_sinks", "gauge", "Sinks served by the eBPF program.", |k| k.sinks as u64),
    ];
    for (name, kind, help, f) in per_kernel {
        let samples = statuses
            .iter()
            .filter_map(|(s, _)| s.kernel.as_ref().map(|k| (format!("{{session=\"{}\"}}", s.name), f(k))));
        family(m, name, kind, help, samples);
    }
}

/// The RTSP clients (none without RTSP), their tracks playing, and what their receiver
/// reports say. (Each family once: a second `fanout_rtsp_clients` made the text invalid.)
fn rtsp_families(m: &mut String, clients: Option<&[crate::clients::ClientStatus]>) {
    let rtsp = clients.unwrap_or_default();
    family(m, "fanout_rtsp_clients", "gauge", "RTSP client sessions.", [(String::new(), rtsp.len() as u64)]);
    let playing = rtsp.iter().filter(|c| c.playing).map(|c| c.sinks.len() as u64).sum();
    family(m, "fanout_rtsp_tracks_playing", "gauge", "RTSP tracks being played.", [(String::new(), playing)]);
    type ClientFn = fn(&crate::clients::ClientStatus) -> Option<u64>;
    let per_client: [(&str, &str, &str, ClientFn); 3] = [
        ("fanout_rtsp_rtcp_reports_total", "counter", "RTCP reports from the client.", |c| Some(c.rtcp_reports)),
        ("fanout_rtsp_cumulative_lost", "gauge", "Packets the client reports lost since it started.", |c| {
            c.cumulative_lost.map(|v| v.max(0) as u64)
        }),
        ("fanout_rtsp_jitter", "gauge", "Interarrival jitter the client reports (RTP units).", |c| {
            c.jitter.map(u64::from)
        }),
    ];
    for (name, kind, help, f) in per_client {
        let samples = rtsp.iter().filter_map(|c| {
            f(c).map(|v| (format!("{{resource=\"{}\",rtsp_session=\"{}\"}}", c.resource, c.session), v))
        });
        family(m, name, kind, help, samples);
    }
}
