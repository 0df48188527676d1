//! `fanout ctl`: every control-API call from the shell, as readable tables or `--json`.

use anyhow::Context;
use clap::{Args, Subcommand};
use fanout_server::spec::{SessionSpec, SinkSpec, SourceFields, SourceSpec};
use fanout_tools::client::ApiClient;
use serde_json::Value;
use std::net::SocketAddr;

/// `HOST:PORT` as an address: an IP literal, or a name resolved here (IPv4 first), so
/// `localhost:6000` works as people type it.
fn resolve(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs as _;
    let all: Vec<SocketAddr> =
        s.to_socket_addrs().map_err(|e| format!("{s:?}: give HOST:PORT, e.g. 127.0.0.1:6000 ({e})"))?.collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().ok_or_else(|| format!("{s:?}: no address"))
}

#[derive(Args)]
pub struct CtlArgs {
    /// The relay's API: `http://HOST:PORT`, `https://HOST:PORT` (or just `HOST:PORT`).
    #[arg(long, default_value = "http://127.0.0.1:7070", env = "FANOUT_API")]
    api: String,
    /// Bearer token, if the relay requires one.
    #[arg(long, env = "FANOUT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Over HTTPS, trust the certificates in this PEM file (e.g. `serve --self-signed`'s)
    /// instead of the public roots.
    #[arg(long, env = "FANOUT_CACERT")]
    cacert: Option<std::path::PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: CtlCmd,
}

// Parsed once per run: the size of `Create` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum CtlCmd {
    /// The server as a whole: workers, queued tasks, load shedding, RTSP addresses, egress.
    Status,
    /// List sessions.
    Sessions,
    /// Show one session's status and its sinks.
    Session { name: String },
    /// Create a session (OMSS SET_SOURCE). Give exactly one source.
    Create {
        name: String,
        /// Receive UDP on this address (a multicast group address joins the group).
        #[arg(long)]
        udp: Option<SocketAddr>,
        /// Local interface address for a multicast --udp group.
        #[arg(long)]
        interface: Option<std::net::Ipv4Addr>,
        /// Listen here for one TCP publisher at a time.
        #[arg(long)]
        tcp_listen: Option<SocketAddr>,
        /// Connect out to a TCP publisher (reconnects with backoff); HOST:PORT.
        #[arg(long, value_parser = resolve)]
        tcp_connect: Option<SocketAddr>,
        /// The built-in test pattern.
        #[arg(long)]
        demo: bool,
        /// Pull from an RTSP server (rtsp://[user:pass@]host[:port]/path).
        #[arg(long)]
        rtsp: Option<String>,
        /// Play a recording, looped: MPEG-TS or MP4 (H.264/H.265 + AAC), or a directory of
        /// them as a playlist. A path on the relay's machine under its `file_roots`; a
        /// relative one is made absolute here.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// With --file: play it once instead of looping (the same as `--loop false`).
        #[arg(long, requires = "file", conflicts_with = "looped")]
        once: bool,
        /// With --file: `true` (default) loops it, `false` plays it once.
        #[arg(long = "loop", id = "looped", requires = "file", value_name = "BOOL")]
        looped: Option<bool>,
        /// Take the stream from publishers: RTSP (ANNOUNCE/RECORD to rtsp://relay/NAME), RTMP
        /// (rtmp://relay/NAME) or SRT (streamid=publish:NAME), one at a time.
        #[arg(long)]
        publish: bool,
        /// With --publish: a new publisher replaces the one publishing (else it is refused).
        #[arg(long, requires = "publish")]
        takeover: bool,
        /// With --rtsp: udp, tcp or auto.
        #[arg(long, requires = "rtsp")]
        rtsp_transport: Option<String>,
        /// With --rtsp: `true` (default) connects only while someone watches, `false` always.
        #[arg(long, requires = "rtsp", value_name = "BOOL")]
        on_demand: Option<bool>,
        /// With --rtsp on demand: seconds the upstream stays after the last client left.
        #[arg(long, requires = "rtsp", value_name = "SECONDS")]
        linger_s: Option<f64>,
        /// keep (default), remove or retry: what becomes of a sink that failed.
        #[arg(long)]
        failed_sinks: Option<String>,
        /// auto (default: strip RTP headers for HTTP subscribers), rtp or raw.
        #[arg(long)]
        payload: Option<String>,
        /// Priority class 0-7 (higher is served first).
        #[arg(long, default_value_t = 0)]
        priority: i64,
        /// daemon, copy, shared, uring or kernel (default: the relay's `datapath`).
        #[arg(long)]
        datapath: Option<String>,
        /// Ring capacity in packets.
        #[arg(long)]
        ring: Option<usize>,
        /// The RTP video codec (h264 or h265): keyframe starts and per-layer dropping.
        #[arg(long)]
        video: Option<String>,
    },
    /// Delete a session and all its sinks.
    Delete { name: String },
    /// Add a sink (OMSS ADD_SINK). Give --udp or --tcp.
    AddSink {
        session: String,
        /// Send each datagram to this UDP address (HOST:PORT; a name is resolved here).
        #[arg(long, value_parser = resolve)]
        udp: Option<SocketAddr>,
        /// Connect to this TCP address and push the byte stream (HOST:PORT).
        #[arg(long, value_parser = resolve)]
        tcp: Option<SocketAddr>,
    },
    /// Show one sink (OMSS GET_STATUS).
    Sink { session: String, id: u64 },
    /// Remove one sink (OMSS REMOVE_SINK).
    RemoveSink { session: String, id: u64 },
    /// Cap the scalable layers a sink gets (ids left out are not capped); RTSP clients'
    /// sink ids are in `GET /v1/rtsp`.
    Pin {
        session: String,
        id: u64,
        /// Highest dependency (spatial) layer.
        #[arg(long)]
        did: Option<u8>,
        /// Highest quality layer.
        #[arg(long)]
        qid: Option<u8>,
        /// Highest temporal layer.
        #[arg(long)]
        tid: Option<u8>,
    },
    /// Lift a sink's layer cap.
    Unpin { session: String, id: u64 },
    /// Remove every sink of a session.
    Flush { session: String },
    /// List the RTSP clients: what they play, how, their reports and sink ids.
    Rtsp,
    /// The cluster: this node, the nodes and their load, the channels, what it pulls from whom.
    Cluster,
    /// Print the Prometheus metrics.
    Metrics,
    /// Load the config file again and apply what changed (as SIGHUP does).
    Reload,
    /// Start the relay's binary (the file at its path, e.g. just upgraded) in a new process
    /// that takes the listeners over; the old process serves the connections it has until
    /// they end or `upgrade_drain_s` passes.
    Upgrade,
}

pub fn run(a: CtlArgs) -> anyhow::Result<()> {
    // Like any Unix tool: a reader that went away (`| head`) ends us quietly, not in a panic.
    // SAFETY: setting a signal's disposition to the default has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let c = ApiClient::parse(&a.api, a.token, a.cacert.as_deref())?;
    let out = match a.cmd {
        CtlCmd::Status => c.call("GET", "/v1/engine", None)?,
        CtlCmd::Sessions => c.call("GET", "/v1/sessions", None)?,
        CtlCmd::Session { name } => {
            let mut s = c.call("GET", &format!("/v1/sessions/{name}"), None)?;
            s["sinks_list"] = c.call("GET", &format!("/v1/sessions/{name}/sinks"), None)?["sinks"].take();
            s
        }
        CtlCmd::Create {
            name,
            udp,
            interface,
            tcp_listen,
            tcp_connect,
            demo,
            rtsp,
            file,
            once,
            looped,
            publish,
            takeover,
            rtsp_transport,
            on_demand,
            linger_s,
            failed_sinks,
            payload,
            priority,
            datapath,
            ring,
            video,
        } => {
            let sources = [
                udp.is_some(),
                tcp_listen.is_some(),
                tcp_connect.is_some(),
                demo,
                rtsp.is_some(),
                file.is_some(),
                publish,
            ];
            if sources.iter().filter(|b| **b).count() != 1 {
                anyhow::bail!(
                    "give exactly one source: --udp ADDR, --tcp-listen ADDR, --tcp-connect HOST:PORT, \
                     --rtsp URL, --file PATH, --demo or --publish (see `fanout ctl create --help`)"
                );
            }
            let source = SourceFields {
                udp,
                interface,
                tcp_listen,
                tcp_connect,
                demo: demo.then_some(true),
                rtsp,
                file: file.map(|f| std::fs::canonicalize(&f).unwrap_or(f)),
                looped: if once { Some(false) } else { looped },
                publish: publish.then_some(true),
                takeover: takeover.then_some(true),
                rtsp_transport: word("--rtsp-transport", rtsp_transport, "udp, tcp or auto")?,
                on_demand,
                linger_s,
                ..Default::default()
            };
            // Checked here as the relay checks it: the same message, before any request.
            let source = SourceSpec::try_from(source).map_err(anyhow::Error::msg)?;
            let spec = SessionSpec {
                priority,
                datapath: word("--datapath", datapath, "daemon, copy, shared, uring or kernel")?,
                ring,
                video: word("--video", video, "h264 or h265")?,
                failed_sinks: word("--failed-sinks", failed_sinks, "keep, remove or retry")?.unwrap_or_default(),
                payload: word("--payload", payload, "auto, rtp or raw")?.unwrap_or_default(),
                ..SessionSpec::new(name, source)
            };
            c.call("POST", "/v1/sessions", Some(serde_json::to_value(spec)?))?
        }
        CtlCmd::Delete { name } => ok(c.call("DELETE", &format!("/v1/sessions/{name}"), None)?),
        CtlCmd::AddSink { session, udp, tcp } => {
            let spec = SinkSpec { udp, tcp };
            c.call("POST", &format!("/v1/sessions/{session}/sinks"), Some(serde_json::to_value(spec)?))?
        }
        CtlCmd::Sink { session, id } => c.call("GET", &format!("/v1/sessions/{session}/sinks/{id}"), None)?,
        CtlCmd::RemoveSink { session, id } => {
            ok(c.call("DELETE", &format!("/v1/sessions/{session}/sinks/{id}"), None)?)
        }
        CtlCmd::Pin { session, id, did, qid, tid } => {
            let mut max = serde_json::Map::new();
            for (k, v) in [("did", did), ("qid", qid), ("tid", tid)] {
                if let Some(v) = v {
                    max.insert(k.into(), v.into());
                }
            }
            c.call(
                "PUT",
                &format!("/v1/sessions/{session}/sinks/{id}/layers"),
                Some(serde_json::json!({ "max": max })),
            )?
        }
        CtlCmd::Unpin { session, id } => c.call(
            "PUT",
            &format!("/v1/sessions/{session}/sinks/{id}/layers"),
            Some(serde_json::json!({ "max": null })),
        )?,
        CtlCmd::Flush { session } => c.call("DELETE", &format!("/v1/sessions/{session}/sinks"), None)?,
        CtlCmd::Rtsp => c.call("GET", "/v1/rtsp", None)?,
        CtlCmd::Cluster => c.call("GET", "/v1/cluster", None)?,
        CtlCmd::Reload => c.call("POST", "/v1/reload", None)?,
        CtlCmd::Upgrade => c.call("POST", "/v1/upgrade", None)?,
        CtlCmd::Metrics => {
            print!("{}", c.text("/metrics")?);
            return Ok(());
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_human(&out);
    }
    Ok(())
}

/// A flag whose value is one of the API's lower-case words, read as the API reads it.
fn word<T: serde::de::DeserializeOwned>(flag: &str, v: Option<String>, expected: &str) -> anyhow::Result<Option<T>> {
    v.map(|w| {
        serde_json::from_value(Value::String(w.clone())).with_context(|| format!("{flag} {w:?}: expected {expected}"))
    })
    .transpose()
}

/// A call that answers nothing (204) prints "ok".
fn ok(v: Value) -> Value {
    if v.is_null() {
        Value::String("ok".into())
    } else {
        v
    }
}

fn print_human(v: &Value) {
    if let Some(list) = v["sessions"].as_array() {
        let rows: Vec<Vec<String>> = list.iter().map(session_row).collect();
        table(&["NAME", "PRIO", "PATH", "SOURCE", "STATE", "PKTS IN", "SINKS", "FAILED", "RING"], &rows);
    } else if v["ring_capacity"].is_number() {
        table(&["NAME", "PRIO", "PATH", "SOURCE", "STATE", "PKTS IN", "SINKS", "FAILED", "RING"], &[session_row(v)]);
        if let Some(sinks) = v["sinks_list"].as_array() {
            println!();
            let rows: Vec<Vec<String>> = sinks.iter().map(sink_row).collect();
            table(&["ID", "TARGET", "STATE", "SENT", "BYTES", "SKIPPED", "LAG", "REASON"], &rows);
        }
    } else if v["packets_sent"].is_number() {
        table(&["ID", "TARGET", "STATE", "SENT", "BYTES", "SKIPPED", "LAG", "REASON"], &[sink_row(v)]);
        if v["layers"].is_object() {
            println!("\nlayers: pinned at {}, gets {}", layer(&v["layers"]["pin"]), layer(&v["layers"]["allowance"]));
        }
    } else if v["workers"].is_number() {
        print_engine(v);
    } else if v["directory"].is_object() {
        print_cluster(v);
    } else if let Some(clients) = v["clients"].as_array() {
        let rows: Vec<Vec<String>> = clients.iter().map(rtsp_row).collect();
        table(
            &["RTSP SESSION", "PLAYS", "PEER", "TRANSPORT", "PLAYING", "REPORTS", "LOST", "RTT MS", "SINKS (TRACK:ID)"],
            &rows,
        );
    } else if let Some(id) = v["id"].as_u64() {
        println!("sink {id} added");
    } else if let Some(n) = v["removed"].as_u64() {
        println!("{n} sinks removed");
    } else if let Some(pid) = v["new_pid"].as_u64() {
        println!(
            "upgraded: process {pid} serves; the old one ({}) drains {} clients for up to {} s",
            s(&v["old_pid"]),
            s(&v["clients_draining"]),
            s(&v["upgrade_drain_s"])
        );
    } else if let Some(s) = v.as_str() {
        println!("{s}");
    } else {
        println!("{v:#}");
    }
}

fn print_engine(v: &Value) {
    println!("process        {} (fanout {})", s(&v["pid"]), s(&v["version"]));
    println!("workers        {}", s(&v["workers"]));
    println!("queued tasks   {}", s(&v["queued_tasks"]));
    println!("task runs      {}", s(&v["task_runs"]));
    let shed = match v["shed_below_class"].as_u64() {
        Some(0) | None => "no".to_string(),
        Some(c) => format!("classes below {c}"),
    };
    println!("shedding       {shed} ({} changes)", s(&v["shed_changes"]));
    println!("rtsp           {}", s(&v["rtsp"]));
    println!("rtsps          {}", s(&v["rtsps"]));
    let e = &v["egress"];
    if e.is_object() {
        println!("egress         {} kbit/s, {} reserved", s(&e["rate_kbps"]), s(&e["reserved_kbps"]));
    }
}

fn print_cluster(v: &Value) {
    let d = &v["directory"];
    println!(
        "node {} (tier {}), directory {}{}",
        s(&v["node"]["name"]),
        s(&v["node"]["tier"]),
        s(&d["state"]),
        d["last_error"].as_str().map(|e| format!(": {e}")).unwrap_or_default()
    );
    let nodes: Vec<Vec<String>> = v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let l = &n["load"];
            vec![
                s(&n["name"]),
                s(&n["tier"]),
                s(&n["region"]),
                s(&n["rtsp_url"]),
                s(&l["sessions"]),
                s(&l["subscribers"]),
                s(&l["cpu"]),
                s(&l["egress_kbps"]),
            ]
        })
        .collect();
    if !nodes.is_empty() {
        println!();
        table(&["NODE", "TIER", "REGION", "RTSP", "SESSIONS", "SUBSCRIBERS", "CPU", "EGRESS KBIT/S"], &nodes);
    }
    let mut channels = Vec::new();
    for (name, entries) in v["channels"].as_object().into_iter().flatten() {
        for e in entries.as_array().into_iter().flatten() {
            let how = if e["origin"] == true { "origin".to_string() } else { format!("via {}", join(&e["path"])) };
            channels.push(vec![name.clone(), s(&e["node"]), how, join(&e["codecs"]), s(&e["rate_kbps"])]);
        }
    }
    if !channels.is_empty() {
        println!();
        table(&["CHANNEL", "NODE", "FROM", "CODECS", "KBIT/S"], &channels);
    }
    let pulls: Vec<Vec<String>> = v["pulls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| vec![s(&p["channel"]), s(&p["from"]), join(&p["path"]), s(&p["switches"])])
        .collect();
    if !pulls.is_empty() {
        println!();
        table(&["PULLS", "FROM", "PATH", "SWITCHES"], &pulls);
    }
    for p in v["parents"].as_array().into_iter().flatten() {
        println!("parent {} {}", s(&p["url"]), s(&p["health"]));
    }
    for w in d["conflicts"].as_array().into_iter().flatten().chain(d["rejected"].as_array().into_iter().flatten()) {
        println!("warning: {}", s(w));
    }
}

fn join(v: &Value) -> String {
    let parts: Vec<String> = v.as_array().into_iter().flatten().map(s).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

/// A layer cap as a person reads it: `did<=0 tid<=1`, `every layer` for none.
fn layer(v: &Value) -> String {
    if !v.is_object() {
        return "every layer".into();
    }
    // An id at its largest value (did 7, qid 15, tid 7) is not capped.
    let parts: Vec<String> = [("did", 7), ("qid", 15), ("tid", 7)]
        .iter()
        .filter_map(|(k, top)| v[k].as_u64().filter(|n| n < top).map(|n| format!("{k}<={n}")))
        .collect();
    if parts.is_empty() {
        "every layer".into()
    } else {
        parts.join(" ")
    }
}

fn rtsp_row(v: &Value) -> Vec<String> {
    let transport = if v["interleaved"].as_bool() == Some(true) {
        "tcp".to_string()
    } else {
        v["rtp_port"].as_u64().map_or("-".into(), |p| format!("udp :{p}"))
    };
    let sinks: Vec<String> = v["sinks"]
        .as_array()
        .map(|a| a.iter().map(|x| format!("{}:{}", s(&x["track"]), s(&x["sink"]))).collect())
        .unwrap_or_default();
    vec![
        s(&v["session"]),
        s(&v["resource"]),
        s(&v["peer"]),
        transport,
        s(&v["playing"]),
        s(&v["rtcp_reports"]),
        v["fraction_lost"].as_f64().map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
        v["rtt_ms"].as_f64().map_or("-".into(), |r| format!("{r:.1}")),
        if sinks.is_empty() { "-".into() } else { sinks.join(" ") },
    ]
}

fn session_row(v: &Value) -> Vec<String> {
    vec![
        s(&v["name"]),
        s(&v["priority"]),
        s(&v["datapath"]),
        s(&v["source"]["kind"]),
        s(&v["source"]["state"]),
        s(&v["source"]["packets"]),
        s(&v["sinks"]),
        s(&v["sinks_failed"]),
        format!("{}/{}", s(&v["ring_used"]), s(&v["ring_capacity"])),
    ]
}

fn sink_row(v: &Value) -> Vec<String> {
    let target = ["udp", "tcp", "http", "local"].iter().find_map(|k| v[k].as_str().map(|a| format!("{k} {a}")));
    vec![
        s(&v["id"]),
        target.unwrap_or_default(),
        s(&v["state"]),
        s(&v["packets_sent"]),
        s(&v["bytes_sent"]),
        s(&v["packets_skipped"]),
        s(&v["lag"]),
        s(&v["reason"]),
    ]
}

fn table(head: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let l: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<0$}", w[i])).collect();
        println!("{}", l.join("  ").trim_end());
    };
    line(head.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}
