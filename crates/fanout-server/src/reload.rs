//! Reloading the configuration without dropping anyone (issue 34): `SIGHUP` and
//! `POST /v1/reload` load the config file again, with the same flags over it. A config
//! with errors is refused whole and the running one stays. Otherwise the difference is
//! applied: credentials, tokens, `[auth]` and limits at once; the config's sessions added, removed,
//! or changed, where an RTSP source that only moved to another URL switches under the
//! same tracks (its readers stay, the clock map is kept) and any other change makes that
//! session again. Sessions whose settings did not change, and those made through the API,
//! are not touched. Settings read only at the start (listeners, threads, the engine, TLS
//! settings other than the certificate files) are reported and wait for a restart.
//!
//! [`plan`] decides (configs in, decisions out); [`reload`] carries it out on the relay.

use crate::config::Config;
use crate::relay::Relay;
use crate::spec::{SessionSpec, SourceSpec};
use std::sync::Arc;

/// What a reload changes.
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub struct Plan {
    /// Settings that changed and hold from now on.
    pub applied: Vec<&'static str>,
    /// Settings that changed but are read at the start only: the running values stay.
    pub at_restart: Vec<&'static str>,
    pub sessions: Sessions,
}

/// The config's sessions, by what happens to them.
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub struct Sessions {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Their RTSP source moves to another URL under the same tracks.
    pub switched: Vec<String>,
    /// Made again: their readers are ended and reconnect.
    pub restarted: Vec<String>,
    /// Those that could not be made; a later reload tries them again.
    pub failed: Vec<Failed>,
}

#[derive(Debug, PartialEq, serde::Serialize)]
pub struct Failed {
    pub name: String,
    pub error: String,
}

/// The differences between the config as loaded before and as loaded now.
pub fn plan(old: &Config, new: &Config) -> Plan {
    let (applied, at_restart) = differences(old, new);
    let mut s = Sessions::default();
    for n in &new.sessions {
        match old.sessions.iter().find(|o| o.name == n.name) {
            None => s.added.push(n.name.clone()),
            Some(o) if o == n => {}
            Some(o) if switchable(o, n) => s.switched.push(n.name.clone()),
            Some(_) => s.restarted.push(n.name.clone()),
        }
    }
    s.removed = old
        .sessions
        .iter()
        .filter(|o| !new.sessions.iter().any(|n| n.name == o.name))
        .map(|o| o.name.clone())
        .collect();
    Plan { applied, at_restart, sessions: s }
}

/// Whether `new` differs from `old` only in its RTSP source's URL (same scheme, so the same
/// TLS settings hold): the upstream can move there in place.
fn switchable(old: &SessionSpec, new: &SessionSpec) -> bool {
    let (SourceSpec::Rtsp(o), SourceSpec::Rtsp(n)) = (&old.source, &new.source) else { return false };
    let tls = |u: &str| u.get(..8).is_some_and(|p| p.eq_ignore_ascii_case("rtsps://"));
    let mut moved = old.clone();
    if let SourceSpec::Rtsp(m) = &mut moved.source {
        m.url = n.url.clone();
    }
    moved == *new && tls(&o.url) == tls(&n.url)
}

/// The settings that changed: those a reload applies, and those that wait for a restart.
/// Every field is named here (the pattern has no `..`): a new one must be sorted into one
/// of the two.
fn differences(old: &Config, new: &Config) -> (Vec<&'static str>, Vec<&'static str>) {
    let Config {
        api,
        rtsp,
        rtmp,
        srt,
        srt_passphrase,
        srt_pbkeylen,
        rtsp_multicast,
        srt_latency_ms,
        webrtc,
        webrtc_additional_hosts,
        webrtc_ice_servers,
        webrtc_tcp,
        rtsp_users,
        users,
        rtsp_max_connections,
        rtsp_idle_s,
        request_timeout_s,
        api_max_connections,
        max_connections_per_ip,
        max_failed_logins,
        on_connect,
        on_disconnect,
        rtsp_require_token,
        allow_unauthenticated,
        token,
        workers,
        worker_priority,
        shed_after_ms,
        egress_kbps,
        ring,
        max_datagram,
        sinks_per_group,
        stream_flush_ms,
        kernel_sinks,
        datapath,
        demo,
        max_body,
        publisher_grace_s,
        upgrade_drain_s,
        file_roots,
        state_file,
        record_path,
        watch_config,
        sessions: _,
        tls,
        cluster,
        auth,
        patterns,
    } = old;
    let (mut live, mut restart) = (Vec::new(), Vec::new());
    macro_rules! changed {
        ($to:ident: $($field:ident $key:literal),* $(,)?) => {
            $( if *$field != new.$field { $to.push($key); } )*
        };
    }
    changed!(live:
        webrtc_ice_servers "webrtc_ice_server", rtsp_users "rtsp_user", users "user", max_connections_per_ip "max_connections_per_ip",
        max_failed_logins "max_failed_logins", on_connect "on_connect", on_disconnect "on_disconnect",
        rtsp_require_token "rtsp_require_token", allow_unauthenticated "allow_unauthenticated", token "token",
        ring "ring", max_datagram "max_datagram", sinks_per_group "sinks_per_group",
        stream_flush_ms "stream_flush_ms", datapath "datapath", publisher_grace_s "publisher_grace_s",
        upgrade_drain_s "upgrade_drain_s",
        file_roots "file_roots", auth "auth", patterns "pattern",
    );
    changed!(restart:
        api "api", rtsp "rtsp", rtmp "rtmp", srt "srt", srt_passphrase "srt_passphrase", srt_pbkeylen "srt_pbkeylen", rtsp_multicast "rtsp_multicast",
        srt_latency_ms "srt_latency_ms", webrtc "webrtc", webrtc_additional_hosts "webrtc_additional_hosts",
        webrtc_tcp "webrtc_tcp", rtsp_max_connections "rtsp_max_connections", rtsp_idle_s "rtsp_idle_s",
        request_timeout_s "request_timeout_s", api_max_connections "api_max_connections", workers "workers",
        worker_priority "worker_priority", shed_after_ms "shed_after_ms", egress_kbps "egress_kbps",
        kernel_sinks "kernel_sinks", demo "demo", max_body "max_body", state_file "state_file", tls "tls",
        cluster "cluster", record_path "record_path", watch_config "watch_config",
    );
    (live, restart)
}

/// The running configuration after a reload: the new one's live settings over the running
/// one (whose start-only settings, such as the ports bound, stay).
fn running(old: &Config, new: &Config) -> Config {
    let mut r = old.clone();
    r.webrtc_ice_servers = new.webrtc_ice_servers.clone();
    r.rtsp_users = new.rtsp_users.clone();
    r.users = new.users.clone();
    r.max_connections_per_ip = new.max_connections_per_ip;
    r.max_failed_logins = new.max_failed_logins;
    r.on_connect = new.on_connect.clone();
    r.on_disconnect = new.on_disconnect.clone();
    r.rtsp_require_token = new.rtsp_require_token;
    r.allow_unauthenticated = new.allow_unauthenticated;
    r.token = new.token.clone();
    r.ring = new.ring;
    r.max_datagram = new.max_datagram;
    r.sinks_per_group = new.sinks_per_group;
    r.stream_flush_ms = new.stream_flush_ms;
    r.datapath = new.datapath;
    r.publisher_grace_s = new.publisher_grace_s;
    r.upgrade_drain_s = new.upgrade_drain_s;
    r.file_roots = new.file_roots.clone();
    r.auth = new.auth.clone();
    r.patterns = new.patterns.clone();
    r.sessions = new.sessions.clone();
    r
}

/// `POST /v1/reload`, merged into the API's router by `serve`.
pub fn routes() -> axum::Router<Arc<Relay>> {
    axum::Router::new().route("/v1/reload", axum::routing::post(reload_call))
}

/// Loads the config file again and applies the difference: what changed, or 400 with every
/// problem where it is refused (and nothing changed).
async fn reload_call(
    axum::extract::State(relay): axum::extract::State<Arc<Relay>>,
) -> Result<axum::Json<Plan>, crate::error::ApiError> {
    let refused = |e: Refused| crate::error::ApiError(axum::http::StatusCode::BAD_REQUEST, e.0);
    reload(&relay).await.map(axum::Json).map_err(refused)
}

/// Why a reload changed nothing: the file's problems, one per line, or that there is no file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Loads the config again and applies it (one reload at a time). `Err`: it was refused
/// (every problem, one per line) and nothing changed.
pub async fn reload(relay: &Arc<Relay>) -> Result<Plan, Refused> {
    let mut guard = relay.loader.lock().await;
    let Some(loader) = guard.as_mut() else {
        return Err(Refused("this relay was not started from `fanout serve`: nothing to load again".into()));
    };
    let new = (loader.load)().map_err(|e| Refused(format!("{e:#}")))?;
    for w in new.exposure().map_err(|e| Refused(e.0))? {
        tracing::warn!("{w}");
    }
    let mut plan = plan(&loader.loaded, &new);
    let cfg = running(&relay.cfg(), &new);
    relay.books.set_cap(cfg.max_connections_per_ip);
    relay.books.set_failed_login_limit(cfg.max_failed_logins);
    relay.books.set_conn_hooks(cfg.on_connect.clone(), cfg.on_disconnect.clone());
    if plan.applied.contains(&"auth") {
        relay.auth.clear();
    }
    let users = cfg.rtsp_server_users();
    relay.set_cfg(cfg);
    if let Some(r) = relay.rtsp.lock().clone() {
        r.set_users(users);
    }
    let old_spec = |name: &str| loader.loaded.sessions.iter().find(|s| s.name == name).cloned();
    let new_spec = |name: &str| new.sessions.iter().find(|s| s.name == name).cloned().expect("planned from it");
    // Only a path the config made (its spec is still the config's) is the config's to end.
    let ours = |name: &str| relay.path(name).filter(|p| Some(p.spec()) == old_spec(name));
    let s = &mut plan.sessions;
    for name in s.removed.iter().chain(&s.restarted) {
        if ours(name).is_some() {
            let _ = relay.delete(name).await;
        }
    }
    for name in &s.switched {
        let spec = new_spec(name);
        let SourceSpec::Rtsp(src) = &spec.source else { continue };
        let (Some(path), Ok(url)) = (ours(name), src.parsed_url()) else { continue };
        if let Some(up) = path.upstream() {
            path.session.set_source_kind(format!("rtsp {}", url.request_url()));
            up.switch_url(url);
            path.set_spec(spec);
        }
    }
    let mut failed = Vec::new();
    for name in s.restarted.iter().chain(&s.added) {
        if let Err(e) = relay.create(new_spec(name)).await {
            tracing::warn!(session = name, "reload: the session could not be made: {e}");
            failed.push(Failed { name: name.clone(), error: e.to_string() });
        }
    }
    // What failed is not kept as loaded, so that the next reload tries it again.
    let mut loaded = new;
    loaded.sessions.retain(|s| !failed.iter().any(|f| f.name == s.name));
    s.failed = failed;
    loader.loaded = loaded;
    tracing::info!(
        applied = ?plan.applied,
        at_restart = ?plan.at_restart,
        sessions = ?plan.sessions,
        "configuration reloaded"
    );
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::parse(text).unwrap()
    }

    const CAM: &str = "[[session]]\nname = \"cam\"\nsource = { rtsp = \"rtsp://10.0.0.5/a\" }\n";

    #[test]
    fn the_config_s_sessions_are_added_removed_switched_or_made_again() {
        let old = cfg(&format!(
            "{CAM}[[session]]\nname = \"gone\"\nsource = {{ demo = true }}\n\
             [[session]]\nname = \"same\"\nsource = {{ demo = true }}\n\
             [[session]]\nname = \"prio\"\nsource = {{ demo = true }}\n"
        ));
        let new = cfg("[[session]]\nname = \"cam\"\nsource = { rtsp = \"rtsp://10.0.0.6/b\" }\n\
             [[session]]\nname = \"same\"\nsource = { demo = true }\n\
             [[session]]\nname = \"prio\"\nsource = { demo = true }\npriority = 2\n\
             [[session]]\nname = \"new\"\nsource = { demo = true }\n");
        let p = plan(&old, &new);
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(p.sessions.added, s(&["new"]));
        assert_eq!(p.sessions.removed, s(&["gone"]));
        assert_eq!(p.sessions.switched, s(&["cam"]));
        assert_eq!(p.sessions.restarted, s(&["prio"]));
        assert!(p.applied.is_empty() && p.at_restart.is_empty(), "{p:?}");
        assert_eq!(plan(&new, &new), Plan::default());
    }

    #[test]
    fn only_a_moved_url_switches_in_place() {
        let old = cfg(CAM);
        let moved = |to: &str| plan(&old, &cfg(&CAM.replace("rtsp://10.0.0.5/a", to))).sessions;
        assert_eq!(moved("rtsp://10.0.0.5:8554/b").switched, vec!["cam".to_string()]);
        // Another scheme brings other TLS settings: made again.
        assert_eq!(moved("rtsps://10.0.0.5/a").restarted, vec!["cam".to_string()]);
        let other = cfg(&CAM.replace(" }", ", rtsp_transport = \"tcp\" }"));
        assert_eq!(plan(&old, &other).sessions.restarted, vec!["cam".to_string()]);
        let demo = cfg(&CAM.replace("rtsp = \"rtsp://10.0.0.5/a\"", "demo = true"));
        assert_eq!(plan(&old, &demo).sessions.restarted, vec!["cam".to_string()]);
    }

    #[test]
    fn settings_are_applied_or_wait_for_a_restart() {
        let old = cfg("token = \"a\"\nworkers = 1\n");
        let new = cfg(
            "token = \"b\"\nworkers = 2\nmax_connections_per_ip = 3\n[[rtsp_user]]\nname = \"u\"\npassword = \"p\"\n",
        );
        let p = plan(&old, &new);
        assert_eq!(p.applied, vec!["rtsp_user", "max_connections_per_ip", "token"]);
        assert_eq!(p.at_restart, vec!["workers"]);
        // The running config takes the live ones and keeps what the start settled.
        let mut started = old.clone();
        started.api = "127.0.0.1:41234".parse().unwrap();
        let r = running(&started, &new);
        assert_eq!((r.token.as_deref(), r.workers, r.max_connections_per_ip), (Some("b"), 1, 3));
        assert_eq!(r.api, started.api);
        assert_eq!(r.rtsp_users, new.rtsp_users);
        assert_eq!(r.users, new.users);
    }

    /// `running` copies every setting `differences` calls live: after it, none differs.
    #[test]
    fn every_live_setting_is_carried_over() {
        let old = cfg("");
        let new = cfg("token = \"b\"\nmax_connections_per_ip = 3\nrtsp_require_token = true\n\
             allow_unauthenticated = true\nring = 64\nmax_datagram = 1400\nsinks_per_group = 8\n\
             stream_flush_ms = 20\ndatapath = \"copy\"\npublisher_grace_s = 3\nfile_roots = [\"/srv\"]\n\
             [[rtsp_user]]\nname = \"u\"\npassword = \"p\"\n\
             [[user]]\nname = \"v\"\npassword = \"q\"\npermissions = [{ action = \"read\" }]\n\
             [[webrtc_ice_server]]\nurl = \"stun:stun.example.org:3478\"\n\
             [[pattern]]\nmatch = \"~^cam\"\nsource = { rtsp = \"rtsp://10.0.0.5/{name}\" }\n\
             [auth]\nmethod = \"http\"\nhttp_url = \"http://127.0.0.1:9/auth\"\n");
        let (live, _) = differences(&old, &new);
        assert_eq!(live.len(), 16, "{live:?}");
        assert_eq!(differences(&running(&old, &new), &new), (vec![], vec![]));
    }
}
