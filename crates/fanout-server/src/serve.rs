//! `fanout serve`: the relay as a process: its flags, the config they override, the
//! listeners, the start-up banner, signals and shutdown.

use crate::{api, cluster, config, http, relay, rtsp, spec, tls, upgrade};
use std::path::PathBuf;

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// TOML config file (see docs/config.md); every field is optional.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Check the configuration (every problem, with its line; the TLS files) and exit:
    /// 0 if it would start, 1 if not. Nothing is bound or served.
    #[arg(long)]
    check: bool,
    /// Address for the control API and HTTP streams (overrides the config).
    #[arg(long)]
    api: Option<std::net::SocketAddr>,
    /// Require this bearer token on every API call and stream (overrides the config).
    #[arg(long, env = "FANOUT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Worker threads; 0 = one per core (overrides the config).
    #[arg(long)]
    workers: Option<usize>,
    /// Scheduling of the relay's threads: normal, nice:N, realtime:N or slice:US (overrides the config).
    #[arg(long)]
    worker_priority: Option<fanout_io::ThreadPriority>,
    /// Shed the lowest classes while the others wait longer than this; 0 = never
    /// (overrides the config).
    #[arg(long)]
    shed_after_ms: Option<u64>,
    /// The egress all sessions share, in kbit/s: shared by reserved rates, then by class;
    /// 0 = not limited (overrides the config).
    #[arg(long)]
    egress_kbps: Option<u64>,
    /// Ring capacity in packets per session (overrides the config).
    #[arg(long)]
    ring: Option<usize>,
    /// Address for RTSP clients (overrides the config; port 0 picks a free one).
    #[arg(long)]
    rtsp: Option<std::net::SocketAddr>,
    /// Address for RTMP publishers, or `off` (overrides the config; port 0 picks a free one).
    #[arg(long, env = "FANOUT_RTMP", value_parser = parse_rtmp)]
    rtmp: Option<RtmpAddr>,
    /// UDP address for SRT callers, or `off` (overrides the config; port 0 picks a free one).
    #[arg(long, env = "FANOUT_SRT", value_parser = parse_rtmp)]
    srt: Option<RtmpAddr>,
    /// UDP address for WebRTC media, or `off` (overrides the config; port 0 picks a free one).
    #[arg(long, env = "FANOUT_WEBRTC", value_parser = parse_rtmp)]
    webrtc: Option<RtmpAddr>,
    /// Do not create the built-in `demo` session.
    #[arg(long)]
    no_demo: bool,
    /// Serve the API or RTSP beyond loopback without a token or RTSP users (warns).
    #[arg(long)]
    allow_unauthenticated: bool,
    /// TLS with a certificate made at start (for trying it out): HTTPS on the API address,
    /// RTSPS beside RTSP; prints the certificate's fingerprint and the file to trust.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    self_signed: bool,
    /// PEM certificate chain for TLS (overrides the config's [tls] cert; needs --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Address for RTSPS clients (overrides [tls] rtsps; port 0 picks a free one).
    #[arg(long)]
    rtsps: Option<std::net::SocketAddr>,
    /// A directory (or file) `file` sources may be read from (repeat it for more; adds to
    /// the config's file_roots).
    #[arg(long)]
    file_root: Vec<PathBuf>,
    /// Where the sessions made through the API are kept across restarts; '' keeps none
    /// (overrides the config's state_file).
    #[arg(long, env = "FANOUT_STATE_FILE", value_name = "PATH")]
    state_file: Option<String>,
    /// Connections one client address may hold on each listener; 0 = no cap (a load tool
    /// on the relay's own host needs it) (overrides the config).
    #[arg(long)]
    max_connections_per_ip: Option<usize>,
}

/// A line on stdout for scripts and people; a reader that went away is not an error.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// Runs the relay until SIGTERM or Ctrl-C.
pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    upgrade::remember_binary();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FANOUT_LOG").unwrap_or_else(|_| "info".into()))
        // One line an event, whatever a client put in its fields.
        .with_writer(crate::logline::OneLine { colours: std::io::stderr().is_terminal() })
        // Colour codes only for a person at a terminal, not in files and journals.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // An upgrade's new process: what the old one handed over (read before any thread starts).
    let inherited = upgrade::Inherited::from_env();
    let cfg = configure(&a)?;
    let tls_source = if a.self_signed {
        let cert = std::env::temp_dir().join(format!("fanout-self-signed-{}.pem", std::process::id()));
        Some(tls::Source::SelfSigned { cert })
    } else {
        cfg.tls.as_ref().map(|t| tls::Source::Files { cert: t.cert.clone(), key: t.key.clone() })
    };
    for w in cfg.exposure().map_err(|e| anyhow::anyhow!(e))? {
        tracing::warn!("{w}");
    }
    // A bad or mismatched pair stops the start, naming the files.
    let names: Vec<String> = [cfg.api.ip()].iter().filter(|ip| !ip.is_unspecified()).map(|ip| ip.to_string()).collect();
    let tls = tls_source.map(|s| tls::Tls::new(s, &names)).transpose()?;
    if a.check {
        // The files sessions play must be there (at the start a missing one fails its path
        // alone, said in the log).
        let missing: Vec<String> = cfg
            .sessions
            .iter()
            .filter_map(|s| {
                let path = match &s.source {
                    spec::SourceSpec::File { path, .. } => path,
                    spec::SourceSpec::Publish { fallback: Some(path), .. } if !spec::fallback_is_generated(path) => {
                        path
                    }
                    _ => return None,
                };
                let e = std::fs::File::open(path).err()?;
                Some(format!("session {:?}: its file {}: {e}", s.name, path.display()))
            })
            .collect();
        anyhow::ensure!(missing.is_empty(), "{}", missing.join("\n"));
        let what = a.config.as_ref().map_or("the defaults".to_string(), |p| p.display().to_string());
        println!(
            "fanout: {what} is good: {} session(s), API on {}{}",
            cfg.sessions.len(),
            cfg.api,
            if tls.is_some() { ", TLS certificate and key load" } else { "" }
        );
        return Ok(());
    }
    // The control plane (API, RTSP/RTMP/SRT control, WebRTC, auth): two workers, so one
    // slow request never holds every other face's (the data plane has its own threads).
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let done = rt.block_on(run(cfg, tls, a, inherited));
    // A thread blocked in a library call (libsrt's accept) does not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    done
}

/// The configuration the flags make of the file (or of the defaults): at the start, and
/// again at each reload.
fn configure(a: &ServeArgs) -> anyhow::Result<config::Config> {
    let mut cfg = match &a.config {
        Some(p) => config::Config::load(p)?,
        None => config::Config::default(),
    };
    if let Some(x) = a.api {
        cfg.api = x;
    }
    if a.token.is_some() {
        cfg.token = a.token.clone();
    }
    if let Some(w) = a.workers {
        cfg.workers = w;
    }
    if let Some(p) = &a.worker_priority {
        cfg.worker_priority = p.to_string();
    }
    limits(a, &mut cfg)?;
    if let Some(x) = a.rtsp {
        cfg.rtsp = Some(x);
    }
    if let Some(RtmpAddr(x)) = a.rtmp {
        cfg.rtmp = x;
    }
    if let Some(RtmpAddr(x)) = a.srt {
        cfg.srt = x;
    }
    if let Some(RtmpAddr(x)) = a.webrtc {
        cfg.webrtc = x;
    }
    if a.no_demo {
        cfg.demo = false;
    }
    if a.allow_unauthenticated {
        cfg.allow_unauthenticated = true;
    }
    cfg.file_roots.extend(a.file_root.iter().cloned());
    if let Some(f) = &a.state_file {
        cfg.state_file = Some(f.into());
    }
    if let Some(n) = a.max_connections_per_ip {
        cfg.max_connections_per_ip = n;
    }
    tls_flags(a, &mut cfg);
    // What the config's own sessions name is the operator's choice: allowed.
    let files: Vec<PathBuf> = cfg
        .sessions
        .iter()
        .filter_map(|s| match &s.source {
            spec::SourceSpec::File { path, .. } => Some(path.clone()),
            spec::SourceSpec::Publish { fallback: Some(path), .. } if !spec::fallback_is_generated(path) => {
                Some(path.clone())
            }
            _ => None,
        })
        .collect();
    cfg.file_roots.extend(files);
    Ok(cfg)
}

/// The flags that bound the data plane, checked as the file's values are.
fn limits(a: &ServeArgs, cfg: &mut config::Config) -> anyhow::Result<()> {
    if let Some(ms) = a.shed_after_ms {
        anyhow::ensure!(
            ms <= config::MAX_SHED_AFTER_MS,
            "--shed-after-ms {ms} is out of range 0..={}",
            config::MAX_SHED_AFTER_MS
        );
        cfg.shed_after_ms = ms;
    }
    if let Some(k) = a.egress_kbps {
        anyhow::ensure!(
            k == 0 || (8..=config::MAX_EGRESS_KBPS).contains(&k),
            "--egress-kbps {k} is out of range 8..={} (0: not limited)",
            config::MAX_EGRESS_KBPS
        );
        cfg.egress_kbps = k;
    }
    if let Some(r) = a.ring {
        anyhow::ensure!((2..=spec::MAX_RING).contains(&r), "--ring {r} is out of range 2..={}", spec::MAX_RING);
        cfg.ring = r;
    }
    Ok(())
}

/// `--tls-cert`/`--tls-key` over the file's, or `--self-signed`; `--rtsps` where TLS is on.
fn tls_flags(a: &ServeArgs, cfg: &mut config::Config) {
    if let (false, Some(cert), Some(key)) = (a.self_signed, &a.tls_cert, &a.tls_key) {
        let t = cfg.tls.get_or_insert_with(|| config::TlsConfig::new(cert.clone(), key.clone()));
        (t.cert, t.key) = (cert.clone(), key.clone());
    }
    if a.self_signed && cfg.tls.is_none() {
        cfg.tls = Some(config::TlsConfig::new(PathBuf::new(), PathBuf::new()));
    }
    if let (Some(x), Some(t)) = (a.rtsps, cfg.tls.as_mut()) {
        t.rtsps = Some(x);
    }
}

async fn run(
    mut cfg: config::Config,
    tls: Option<std::sync::Arc<tls::Tls>>,
    args: ServeArgs,
    mut inherited: upgrade::Inherited,
) -> anyhow::Result<()> {
    let loaded = cfg.clone();
    // An upgrade's new process takes the state file once the old one let it go.
    let late_state = if inherited.upgrading() { cfg.state_file.take() } else { None };
    let sockets = upgrade::Sockets::default();
    // Taken before anything is printed: a SIGHUP right after the start must not end it.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| anyhow::anyhow!("installing a SIGHUP handler: {e}"))?;
    // SIGUSR2 (an upgrade) too: its default would end the process.
    let usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
        .map_err(|e| anyhow::anyhow!("installing a SIGUSR2 handler: {e}"))?;
    let listener = match inherited.listener("api", cfg.api) {
        Some(l) => l,
        None => tokio::net::TcpListener::bind(cfg.api)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {} for the API: {e}", cfg.api))?,
    };
    sockets.keep("api", &listener);
    cfg.api = listener.local_addr()?;
    let statics = cfg.sessions.clone();
    let demo = cfg.demo;
    let relay = relay::Relay::new(cfg)?;
    let config_file = args.config.clone();
    let load = Box::new(move || configure(&args));
    *relay.loader.lock().await = Some(config::Loader { loaded, load });
    let api = relay.cfg().api;
    // RTSP first: its RTP port is where every UDP sink's packets come from (clients such as
    // retina accept RTP only from the server_port SETUP named), so it must be known before
    // any session sends.
    let rtsp = listen_rtsp(&relay, tls.as_deref(), &mut inherited, &sockets).await?;
    if let Some(c) = &relay.cluster {
        let local: std::sync::Weak<dyn cluster::Local> = std::sync::Arc::downgrade(&relay) as _;
        c.start(local);
    }
    let restored = first_paths(&relay, demo, statics, inherited.upgrading()).await?;
    let router = api::router(
        relay.clone(),
        crate::webrtc::routes().merge(crate::playback::routes()).merge(crate::reload::routes()),
    );
    let http = if relay.cfg().https() { "https" } else { "http" };
    let banner = Banner { relay: &relay, api, http, demo };
    banner.say(tls.as_deref(), restored);
    let mut tasks: Vec<_> = rtsp.map(|(listeners, state)| banner.rtsp(listeners, state)).into_iter().collect();
    on_sighup(hup, &relay, tls.clone());
    // watch_config: the file read again whenever its contents change, as SIGHUP does.
    if let Some(file) = config_file.filter(|_| relay.cfg().watch_config) {
        tokio::spawn(watch_config(file, std::sync::Arc::downgrade(&relay)));
    }
    tasks.extend(start_rtmp(&relay, &mut inherited, &sockets, tls.as_deref()).await);
    tokio::spawn(relay.books.clone().tell());
    give_back_kept_memory();
    tokio::spawn(crate::playback::keep_recording(relay.clone()));
    tokio::spawn(crate::watch::run_hooks(relay.clone()));
    let https = tls.filter(|_| relay.cfg().https());
    // SRT and WebRTC (UDP: one process at a time) before the API serves, so that it shows
    // them from its first answer; an upgrade's new process binds them once the old one let go.
    let faces = Faces::default();
    if !inherited.upgrading() {
        start_udp_faces(relay.clone(), upgrade::Released::default(), faces.clone(), api, http.to_string()).await;
    }
    tasks.push(tokio::spawn(http::serve(listener, relay.clone(), router, https)));
    if inherited.upgrading() {
        take_over(&relay, &mut inherited, late_state, &faces, api, http).await;
    }
    run_until_done(&relay, &sockets, &faces, usr2).await;
    tracing::info!("shutting down");
    for t in tasks {
        t.abort();
    }
    faces.stop(&relay, false);
    if let Some(c) = &relay.cluster {
        c.leave().await;
    }
    relay.shutdown().await;
    Ok(())
}

/// The paths the relay starts with: the demo, the config's, and (unless an upgrade's new
/// process, which takes the old one's) those the state file kept; how many it restored.
async fn first_paths(
    relay: &std::sync::Arc<relay::Relay>,
    demo: bool,
    statics: Vec<spec::SessionSpec>,
    upgrading: bool,
) -> anyhow::Result<usize> {
    if demo {
        let spec = spec::SessionSpec::new("demo", spec::SourceSpec::Demo);
        relay.create(spec).await.map_err(|e| anyhow::anyhow!("demo session: {e}"))?;
    }
    for s in statics {
        let name = s.name.clone();
        relay.create(s).await.map_err(|e| anyhow::anyhow!("session {name:?} from the config: {e}"))?;
    }
    Ok(if upgrading { 0 } else { relay.restore().await })
}

/// What the start prints plainly on stdout, so scripts (and people) can pick it up: with a
/// token, URLs that work as printed with the token put in. The token is never printed
/// (consoles end up in journals and screenshots): URLs show where it goes, and the
/// dashboard asks for it.
struct Banner<'a> {
    relay: &'a std::sync::Arc<relay::Relay>,
    api: std::net::SocketAddr,
    http: &'static str,
    demo: bool,
}

impl Banner<'_> {
    fn token(&self) -> Option<&'static str> {
        self.relay.cfg().token.as_ref().map(|_| "TOKEN")
    }

    fn say(&self, tls: Option<&tls::Tls>, restored: usize) {
        let (relay, api, http) = (self.relay, self.api, self.http);
        tracing::info!(
            "fanout {} listening on {http}://{api} ({} workers)",
            env!("CARGO_PKG_VERSION"),
            relay.engine.workers()
        );
        say!("fanout: API {http}://{api}/v1/sessions");
        if let Some(t) = tls {
            say!("fanout: TLS certificate SHA-256 {}", t.fingerprint());
            if let Some(f) = t.self_signed_file() {
                say!("fanout: self-signed: trust it with curl --cacert {}", f.display());
            }
        }
        if let Some(st) = relay.state.get() {
            say!("fanout: API sessions kept in {} ({restored} made again)", st.path().display());
        }
        if let Some(c) = &relay.cluster {
            say!("fanout: cluster node {:?} (tier {}), pulled from at {}", c.cfg.node, c.cfg.tier, c.me().rtsp_url);
        }
        let q = self.token().map(|t| format!("?token={t}")).unwrap_or_default();
        let asks = if self.token().is_some() { "; it asks for the token" } else { "" };
        say!("fanout: dashboard {http}://{api}/  (open it in a browser{asks})");
        if self.token().is_some() {
            say!("fanout: API calls need the token (TOKEN below: the one configured, not printed): curl -H 'Authorization: Bearer TOKEN' {http}://{api}/v1/sessions");
        }
        if self.demo {
            say!("fanout: demo stream {http}://{api}/v1/sessions/demo/stream{q}  (try: ffplay '{http}://{api}/v1/sessions/demo/stream{q}')");
            say!("fanout: demo over HLS {http}://{api}/v1/sessions/demo/hls/index.m3u8{q}  (try: ffplay '{http}://{api}/v1/sessions/demo/hls/index.m3u8{q}')");
        }
    }

    /// RTSP's URLs told, and its listeners served.
    fn rtsp(&self, listeners: RtspListenerList, state: std::sync::Arc<rtsp::Rtsp>) -> tokio::task::JoinHandle<()> {
        let cfg = self.relay.cfg();
        let who = match (self.token(), cfg.rtsp_require_token, cfg.rtsp_users.first()) {
            (Some(t), true, _) => format!("token:{t}@"),
            (_, _, Some(u)) => format!("{}:PASSWORD@", fanout_proto::http::percent_encode(&u.name)),
            _ => String::new(),
        };
        for (l, acceptor) in &listeners {
            let (scheme, bound) = (if acceptor.is_some() { "rtsps" } else { "rtsp" }, l.local_addr().ok());
            let Some(bound) = bound else { continue };
            say!("fanout: RTSP {scheme}://{bound}/{{session}}");
            if self.demo {
                say!(
                    "fanout: demo over RTSP {scheme}://{who}{bound}/demo  (try: ffplay '{scheme}://{who}{bound}/demo')"
                );
            }
        }
        tokio::spawn(rtsp::serve(listeners, self.relay.clone(), state))
    }
}

/// SIGHUP (`systemctl reload`, an operator's habit) is always taken, never fatal: it
/// re-reads the certificate and key (connections open keep theirs), then the configuration
/// (`crate::reload`), and says what it did.
fn on_sighup(
    mut hup: tokio::signal::unix::Signal,
    relay: &std::sync::Arc<relay::Relay>,
    tls: Option<std::sync::Arc<tls::Tls>>,
) {
    let files = tls.filter(|t| t.self_signed_file().is_none());
    let relay = std::sync::Arc::downgrade(relay);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if let Some(t) = &files {
                match t.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded: SHA-256 {}", t.fingerprint()),
                    Err(e) => tracing::error!("SIGHUP: TLS reload failed, still serving the old certificate: {e:#}"),
                }
            }
            let Some(relay) = relay.upgrade() else { return };
            if let Err(e) = crate::reload::reload(&relay).await {
                tracing::error!("SIGHUP: the configuration is refused, the running one stays:\n{e}");
            }
        }
    });
}

/// RTMP and, with the relay's certificate, RTMPS: a port taken is not fatal, as for plain
/// RTSP (a second relay on one host).
async fn start_rtmp(
    relay: &std::sync::Arc<relay::Relay>,
    inherited: &mut upgrade::Inherited,
    sockets: &upgrade::Sockets,
    tls: Option<&tls::Tls>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let faces = [
        ("rtmp", "RTMP", relay.cfg().rtmp, None, &relay.rtmp_addr),
        ("rtmps", "RTMPS", relay.cfg().rtmps().filter(|_| tls.is_some()), tls, &relay.rtmps_addr),
    ];
    for (key, what, addr, tls, bound_at) in faces {
        let Some(addr) = addr else { continue };
        match bind(inherited, sockets, key, addr).await {
            Ok(l) => {
                if let Ok(bound) = l.local_addr() {
                    *bound_at.lock() = Some(bound);
                    match tls {
                        None => say!("fanout: RTMP rtmp://{bound}/{{path}}  (play any path; publish one with source = {{ publish = true }})"),
                        Some(_) => say!("fanout: RTMPS rtmps://{bound}/{{path}}"),
                    }
                }
                tasks.push(tokio::spawn(crate::rtmp::serve(l, relay.clone(), tls.map(|t| t.acceptor().clone()))));
            }
            Err(e) => tracing::warn!("cannot listen on {addr} for {what}, serving without it: {e}"),
        }
    }
    tasks
}

/// An upgrade's new process, serving: it takes the state file, the sinks the old one
/// released and (in the background: libsrt may hold the old port a while) SRT and WebRTC.
async fn take_over(
    relay: &std::sync::Arc<relay::Relay>,
    inherited: &mut upgrade::Inherited,
    late_state: Option<std::path::PathBuf>,
    faces: &Faces,
    api: std::net::SocketAddr,
    http: &str,
) {
    let released = inherited.ready().await;
    if let Err(e) = late_state.map_or(Ok(()), |path| relay.open_state(&path)) {
        tracing::error!("upgrade: the state file: {e:#}");
    }
    let restored = relay.restore().await;
    for (path, sink) in &released.sinks {
        if let Err(e) = relay.add_sink(path, sink).await {
            tracing::warn!(path, udp = ?sink.udp, tcp = ?sink.tcp, "upgrade: a sink of the old process is not added here: {e}");
        }
    }
    tracing::info!(restored, sinks = released.sinks.len(), "upgrade: this process took over (the old one drains)");
    upgrade::notify_main_pid();
    tokio::spawn(start_udp_faces(relay.clone(), released, faces.clone(), api, http.to_string()));
}

/// SRT and WebRTC, once bound: UDP ports one process at a time holds. Once stopped (shut
/// down, or handed over), a face bound late — an upgrade's new process binds them in the
/// background — is closed at once: a listener left open would hold the exit (libsrt's
/// exit handler waits for a thread blocked in its accept).
#[derive(Default, Clone)]
struct Faces(std::sync::Arc<parking_lot::Mutex<UdpFaces>>);

#[derive(Default)]
struct UdpFaces {
    srt: Option<crate::srt::Srt>,
    webrtc: Option<std::sync::Arc<crate::webrtc::WebRtc>>,
    /// A WebRTC face handed over: it serves its viewers on until the drain ends.
    draining: Option<std::sync::Arc<crate::webrtc::WebRtc>>,
    stopped: bool,
}

impl Faces {
    /// Closes both, and any bound later; the addresses they had. At a hand-over
    /// (`handing_over`) WebRTC's viewers stay (`WebRtc::hand_over`), SRT's connections end.
    fn stop(&self, relay: &relay::Relay, handing_over: bool) -> upgrade::Released {
        let (srt, webrtc, draining) = {
            let mut f = self.0.lock();
            f.stopped = true;
            let (srt, webrtc) = (f.srt.take(), f.webrtc.take());
            if handing_over {
                f.draining.clone_from(&webrtc);
            }
            (srt, webrtc, if handing_over { None } else { f.draining.take() })
        };
        if let Some(w) = draining {
            w.stop();
        }
        let srt = srt.map(|s| {
            let a = s.addr;
            s.stop();
            a
        });
        // SRT's connections end too: libsrt keeps the port while any uses it.
        for l in relay.srt_links.lock().iter() {
            l.end();
        }
        let webrtc = webrtc.map(|w| {
            if handing_over {
                w.hand_over();
            } else {
                relay.webrtc.lock().take();
                w.stop();
            }
            w.addr
        });
        upgrade::Released { srt, webrtc, sinks: Vec::new() }
    }

    fn stopped(&self) -> bool {
        self.0.lock().stopped
    }

    /// Keeps a bound SRT listener, or closes it if the faces were stopped meanwhile.
    fn keep_srt(&self, relay: &relay::Relay, s: crate::srt::Srt) -> bool {
        let mut f = self.0.lock();
        if f.stopped {
            drop(f);
            s.stop();
            return false;
        }
        *relay.srt_addr.lock() = Some(s.addr);
        f.srt = Some(s);
        true
    }

    /// Keeps a bound WebRTC face, or closes it if the faces were stopped meanwhile.
    fn keep_webrtc(&self, relay: &relay::Relay, w: std::sync::Arc<crate::webrtc::WebRtc>) -> bool {
        let mut f = self.0.lock();
        if f.stopped {
            drop(f);
            w.stop();
            return false;
        }
        *relay.webrtc.lock() = Some(w.clone());
        f.webrtc = Some(w);
        true
    }
}

/// Binds SRT and WebRTC where configured: without libsrt, or with a port taken, the rest
/// serves on. Where the configuration asks for any port (0), an upgrade's new process
/// takes the one the old process let go of, trying until it is free (libsrt frees it a
/// while after its listener closed), for up to a minute.
async fn start_udp_faces(
    relay: std::sync::Arc<relay::Relay>,
    released: upgrade::Released,
    faces: Faces,
    api: std::net::SocketAddr,
    http: String,
) {
    let reuse = |wanted: std::net::SocketAddr, old: Option<std::net::SocketAddr>| match old {
        Some(o) if wanted.port() == 0 && o.ip() == wanted.ip() => o,
        _ => wanted,
    };
    let upgrading = released.srt.is_some() || released.webrtc.is_some();
    let patience = if upgrading { 300 } else { 1 };
    if let Some(addr) = relay.cfg().webrtc.map(|a| reuse(a, released.webrtc)) {
        let gate = || crate::admit::Gate::new("WebRTC per-address cap (max_connections_per_ip)", relay.books.clone());
        let cfg = relay.cfg();
        let start =
            || crate::webrtc::WebRtc::start(addr, &cfg.webrtc_additional_hosts, gate(), cfg.webrtc_tcp, upgrading);
        if let Some((w, _)) = keep_trying(&relay, &faces, "WebRTC", addr, patience, start).await {
            let at = w.addr;
            if faces.keep_webrtc(&relay, w) {
                say!("fanout: WebRTC (WHEP) {http}://{api}/{{path}}/whep  (media on udp {at})");
            }
        }
    }
    if let Some(addr) = relay.cfg().srt.map(|a| reuse(a, released.srt)) {
        if let Some((s, attempt)) =
            keep_trying(&relay, &faces, "SRT", addr, patience, || crate::srt::serve(addr, relay.clone())).await
        {
            let (at, version) = (s.addr, s.version.clone());
            if faces.keep_srt(&relay, s) {
                say!("fanout: SRT srt://{at}?streamid=read:{{path}}  (publish one with streamid=publish:{{path}}; libsrt {version})");
                if upgrading {
                    tracing::info!("upgrade: SRT serves again after {:.1} s", f64::from(attempt - 1) * 0.2);
                }
            }
        }
    }
}

/// `bind`, tried every 200 ms up to `patience` times while this process has neither handed
/// its listeners over nor stopped; what it made, at which attempt.
async fn keep_trying<T, E: std::fmt::Display>(
    relay: &relay::Relay,
    faces: &Faces,
    what: &str,
    addr: std::net::SocketAddr,
    patience: u32,
    mut bind: impl FnMut() -> Result<T, E>,
) -> Option<(T, u32)> {
    for attempt in 1..=patience {
        if relay.handover.handed() || faces.stopped() {
            return None;
        }
        match bind() {
            Ok(t) => return Some((t, attempt)),
            Err(e) if attempt == patience => tracing::warn!("no {what} on {addr}, serving without it: {e}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
    None
}

/// Serves until SIGTERM or Ctrl-C, running the upgrades asked for (the API, SIGUSR2): once
/// a new process took over, this one drains and returns.
async fn run_until_done(
    relay: &std::sync::Arc<relay::Relay>,
    sockets: &upgrade::Sockets,
    faces: &Faces,
    mut usr2: tokio::signal::unix::Signal,
) {
    let mut requests = relay.handover.take_requests().expect("taken once");
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = usr2.recv() => {
                let r = relay.clone();
                tokio::spawn(async move {
                    match r.handover.request().await {
                        Ok(done) => tracing::info!("SIGUSR2: upgraded: {done}"),
                        Err(e) => tracing::error!("SIGUSR2: not upgraded: {e}"),
                    }
                });
            }
            Some(answer) = requests.recv() => {
                let new = match upgrade::start(sockets).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!("upgrade: {e}");
                        let _ = answer.send(Err(e));
                        continue;
                    }
                };
                // Nothing more is accepted here; then what one process at a time holds goes.
                relay.handover.hand_over();
                let mut released = faces.stop(relay, true);
                // The sinks the API added go: with the state file for the API's sessions,
                // by name for the config's.
                let kept = relay.state.get().map(|st| st.release()).unwrap_or_default();
                let mut sinks = 0;
                for k in &kept {
                    if let Ok(s) = relay.session(&k.spec.name) {
                        sinks += k.sinks.keys().filter(|id| s.remove_sink(**id)).count();
                    }
                }
                for (path, id, spec) in relay.api_sinks() {
                    if kept.iter().any(|k| k.spec.name == path) {
                        continue;
                    }
                    if relay.session(&path).is_ok_and(|s| s.remove_sink(id)) {
                        released.sinks.push((path, spec));
                        sinks += 1;
                    }
                }
                let new_pid = new.pid;
                let told = new.released(&released).await;
                let drain = relay.cfg().upgrade_drain_s;
                let open = upgrade::clients(relay).0;
                tracing::info!(new_pid, open, sinks, "upgrade: handed over; draining for up to {drain} s");
                let _ = answer.send(told.map(|()| {
                    serde_json::json!({
                        "old_pid": std::process::id(),
                        "new_pid": new_pid,
                        "clients_draining": open,
                        "sinks_moved": sinks,
                        "ended": { "srt": released.srt.is_some() },
                        "ports_moved": { "srt": released.srt.is_some(), "webrtc": released.webrtc.is_some() },
                        "upgrade_drain_s": drain,
                    })
                }));
                tokio::select! {
                    () = upgrade::drain(relay, std::time::Duration::from_secs_f64(drain)) => {}
                    () = &mut stop => {}
                }
                return;
            }
        }
    }
}

/// A listener the old process of an upgrade handed over, else a new one; kept to hand over.
async fn bind(
    inherited: &mut upgrade::Inherited,
    sockets: &upgrade::Sockets,
    name: &'static str,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpListener> {
    let l = match inherited.listener(name, addr) {
        Some(l) => l,
        None => tokio::net::TcpListener::bind(addr).await?,
    };
    sockets.keep(name, &l);
    Ok(l)
}

/// `--rtmp`, `--srt`: an address, or `off`.
#[derive(Clone)]
struct RtmpAddr(Option<std::net::SocketAddr>);

fn parse_rtmp(s: &str) -> Result<RtmpAddr, fanout_proto::Invalid> {
    match s {
        "off" => Ok(RtmpAddr(None)),
        a => {
            a.parse().map(|a| RtmpAddr(Some(a))).map_err(|e| fanout_proto::Invalid(format!("{e} (an address, or off)")))
        }
    }
}

type RtspListenerList = Vec<(tokio::net::TcpListener, Option<tokio_rustls::TlsAcceptor>)>;
type RtspListeners = (RtspListenerList, std::sync::Arc<rtsp::Rtsp>);

/// Binds plain RTSP and RTSPS. RTSP comes first: its RTP port is where every UDP sink's
/// packets come from (clients such as retina accept RTP only from the server_port SETUP
/// named), so it must be known before any session sends. A plain port taken is not fatal
/// (the API and HTTP streams still work, e.g. a second relay on one host); an RTSPS port
/// asked for and taken is.
async fn listen_rtsp(
    relay: &std::sync::Arc<relay::Relay>,
    tls: Option<&tls::Tls>,
    inherited: &mut upgrade::Inherited,
    sockets: &upgrade::Sockets,
) -> anyhow::Result<Option<RtspListeners>> {
    let mut listeners = Vec::new();
    if let Some(addr) = relay.cfg().rtsp_plain() {
        match bind(inherited, sockets, "rtsp", addr).await {
            Ok(l) => listeners.push((l, None)),
            Err(e) => tracing::warn!("cannot listen on {addr} for RTSP, serving without it: {e}"),
        }
    }
    if let (Some(addr), Some(t)) = (relay.cfg().rtsps(), tls) {
        let l = bind(inherited, sockets, "rtsps", addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for RTSPS: {e}"))?;
        listeners.push((l, Some(t.acceptor().clone())));
    }
    let Some(bound) = listeners.first().and_then(|(l, _)| l.local_addr().ok()) else { return Ok(None) };
    let multicast = relay.cfg().rtsp_multicast.as_ref().map(crate::config::RtspMulticast::groups).transpose();
    let multicast = multicast.map_err(std::io::Error::other)?;
    let state = rtsp::Rtsp::new(bound.ip(), relay.cfg().rtsp_server_users(), relay.cfg().srtp(), multicast)?;
    fanout_io::set_udp_source(std::net::SocketAddr::new(bound.ip(), state.rtp_port()));
    for (l, tls) in &listeners {
        let slot = if tls.is_some() { &relay.rtsps_addr } else { &relay.rtsp_addr };
        *slot.lock() = l.local_addr().ok();
    }
    *relay.rtsp.lock() = Some(state.clone() as _);
    Ok(Some((listeners, state)))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Every 30 s, the memory the allocator keeps freed goes back to the kernel: without it the
/// RSS climbs for the first 20 minutes of a busy relay to the high-water mark of every thread
/// arena (the soak: in use flat at 34 MB, kept-free 37 -> 66 MB in 7 minutes) and stays.
fn give_back_kept_memory() {
    let every = std::time::Duration::from_secs(30);
    let spawned = std::thread::Builder::new().name("malloc-trim".into()).spawn(move || loop {
        std::thread::sleep(every);
        fanout_io::sys::malloc_trim();
    });
    if let Err(e) = spawned {
        tracing::warn!("no thread to give kept memory back: {e}");
    }
}

/// Reloads the configuration when `file`'s contents change (looked at once a second; a
/// change must hold for 200 ms, so that a file being written is not read half done). Each
/// version is tried once: one refused is logged and waits for the next edit.
async fn watch_config(file: PathBuf, relay: std::sync::Weak<crate::relay::Relay>) {
    let read = |f: &PathBuf| std::fs::read(f).ok();
    let mut last = read(&file);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = read(&file);
        if now.is_none() || now == last {
            continue;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        if read(&file) != now {
            continue;
        }
        last = now;
        let Some(relay) = relay.upgrade() else { return };
        match crate::reload::reload(&relay).await {
            Ok(_) => tracing::info!(file = %file.display(), "the config file changed: reloaded"),
            Err(e) => tracing::error!(
                file = %file.display(),
                "the config file changed, and is refused; the running configuration stays:\n{e}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rtmp_flag_is_an_address_or_off() {
        assert_eq!(super::parse_rtmp("off").unwrap().0, None);
        assert_eq!(super::parse_rtmp("127.0.0.1:1935").unwrap().0, Some("127.0.0.1:1935".parse().unwrap()));
        let e = super::parse_rtmp("1935").err().unwrap();
        assert!(e.0.ends_with("(an address, or off)"), "{e}");
    }
}
