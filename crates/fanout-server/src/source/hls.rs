//! `hls`: the relay reads another server's HLS (MediaMTX, SRS, nginx, a CDN, another
//! fanout): a multivariant playlist (the variant it carries with the most bandwidth, and its
//! audio rendition where that is a playlist of its own) or a media playlist; live or
//! Low-Latency (read by whole segments); MPEG-TS or fMP4 segments. The units are paced at
//! their own rate, muxed into one MPEG-TS and read as an SRT publisher's stream is, so the
//! path's tracks, clock map and restamping are the same as for every other publisher. On a
//! blocking thread (HTTP with `ureq`); again with backoff when the far side goes, and on
//! demand like the other pulls.

use super::{Ctx, Feeder, Started};
use crate::error::RelayError;
use crate::publish::Publisher;
use fanout_proto::container::hlsin::{self, Follower, Merge, Playlist, Unit, START_BEHIND};
use fanout_proto::container::tsingest::TsIngest;
use fanout_proto::container::tsmux::{AccessUnit, StreamKind, TsMuxer};
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Connection ids of HLS pulls, apart from every other publisher's.
const CONN_BASE: u64 = 7 << 60;
const PLAYLIST_MAX: u64 = 1 << 20;
const SEGMENT_MAX: u64 = 64 << 20;
/// A playlist or segment request: answered and read within this.
const FETCH: Duration = Duration::from_secs(10);
/// How far (90 kHz) the variant may run ahead of a silent audio rendition.
const PATIENCE_90K: u64 = 3 * 90_000;
/// Behind its time by more than this, the stream goes on from where it is (no burst).
const STALL: Duration = Duration::from_secs(2);

pub fn start(src: &crate::spec::PullSource, cx: &Ctx) -> Result<Started, RelayError> {
    let bad = |e: String| RelayError::BadRequest(format!("source \"hls\": {e}"));
    let tls = crate::spec::hls_url(&src.url).map_err(bad)?;
    let verify = crate::tls::verify_of(&src.tls_ca, &src.tls_fingerprint, src.tls_verify).map_err(|e| bad(e.0))?;
    let mut agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(5))
        .timeout(FETCH)
        .user_agent(concat!("fanout/", env!("CARGO_PKG_VERSION")));
    if tls {
        agent = agent.tls_config(crate::tls::client_config(&verify).map_err(|e| bad(format!("{e:#}")))?);
    }
    let agent = agent.build();
    let on_demand = src.on_demand == Some(true);
    let p = if on_demand { Publisher::pulled_on_demand } else { Publisher::pulled };
    let p = Arc::new(p(cx.name, cx.session.clone()).map_err(|e| RelayError::Internal(format!("hls source: {e}")))?);
    let shown = crate::spec::hls_shown(&src.url);
    cx.session.set_source_kind(format!("hls pull of {shown}"));
    let linger = Duration::from_secs_f64(src.linger_s.unwrap_or(10.0));
    let (p2, host, url) = (p.clone(), cx.host.clone(), src.url.clone());
    let task = tokio::spawn(async move {
        super::pull_loop(&p2, "HLS", &shown.clone(), CONN_BASE, |conn, label| {
            let (agent, url, p, host) = (agent.clone(), url.clone(), p2.clone(), host.clone());
            let p3 = p2.clone();
            async move {
                super::on_blocking_thread(&p3, linger, move |stop| {
                    let mut fed = false;
                    let why = match read(&agent, &url, &p, &host, (conn, &label), &stop, &mut fed) {
                        Ok(why) | Err(why) => why,
                    };
                    (why, fed)
                })
                .await
            }
        })
        .await
    });
    Ok(Started { feeder: Feeder::Publisher(p), tasks: vec![task.abort_handle()] })
}

/// The body at `url`, at most `max` bytes; `Err` says why not, without the URL's secrets.
fn get(agent: &ureq::Agent, url: &str, max: u64) -> Result<Vec<u8>, String> {
    let shown = crate::spec::hls_shown(url);
    match agent.get(url).call() {
        Ok(r) => {
            let mut body = Vec::new();
            r.into_reader().take(max + 1).read_to_end(&mut body).map_err(|e| format!("{shown}: {e}"))?;
            if body.len() as u64 > max {
                return Err(format!("{shown} is larger than {} KiB", max >> 10));
            }
            Ok(body)
        }
        Err(ureq::Error::Status(code, _)) => Err(format!("{shown}: the server answered {code}")),
        Err(ureq::Error::Transport(t)) => {
            Err(format!("{shown}: {}{}", t.kind(), t.message().map(|m| format!(" ({m})")).unwrap_or_default()))
        }
    }
}

fn playlist(agent: &ureq::Agent, url: &str) -> Result<Playlist, String> {
    let body = get(agent, url, PLAYLIST_MAX)?;
    let text = String::from_utf8_lossy(&body);
    hlsin::parse(&text).map_err(|e| format!("{}: {e}", crate::spec::hls_shown(url)))
}

/// One media playlist being read: the variant's, or its audio rendition's.
struct Stream {
    url: String,
    follower: Follower,
    /// The initialization section in use (fMP4): its URL and what it says.
    init: Option<(String, hlsin::Init)>,
    /// When the playlist is read again.
    due: Instant,
    target: Duration,
    ended: bool,
}

/// The units, paced, as the path's tracks: one MPEG-TS (fixed at the first unit with the
/// kinds then known) read as an SRT publisher's.
struct Out {
    mux: Option<(TsMuxer, Vec<StreamKind>)>,
    ingest: TsIngest,
    ts: Vec<u8>,
    packets: Vec<fanout_proto::rtp::tracks::RtpPacket>,
    started: bool,
    since: Instant,
    /// Units of a kind the stream did not start with.
    dropped: u64,
}

/// One reading of the playlist at `url` into the publisher, until it ends, fails or `stop`
/// is set; why it ended. `fed`: set once the tracks started.
fn read(
    agent: &ureq::Agent,
    url: &str,
    p: &Publisher,
    host: &Weak<dyn crate::upstream::Host>,
    (conn, label): (u64, &str),
    stop: &AtomicBool,
    fed: &mut bool,
) -> Result<String, String> {
    let shown = crate::spec::hls_shown(url);
    let urls = match playlist(agent, url)? {
        Playlist::Media(_) => vec![url.to_string()],
        Playlist::Multivariant(mv) => {
            let (v, audio) = mv.choose().ok_or("a multivariant playlist without variants")?;
            let mut urls = vec![hlsin::resolve(url, &v.uri)];
            urls.extend(audio.map(|a| hlsin::resolve(url, a)));
            urls
        }
    };
    p.set_pull_error(None);
    tracing::info!(url = %shown, playlists = urls.len(), "HLS source reading");
    let now = Instant::now();
    let mut streams: Vec<Stream> = urls
        .into_iter()
        .map(|url| Stream { url, follower: Follower::default(), init: None, due: now, target: FETCH, ended: false })
        .collect();
    let mut merge = Merge::new(streams.len(), PATIENCE_90K);
    let mut out = Out {
        mux: None,
        ingest: TsIngest::default(),
        ts: Vec::new(),
        packets: Vec::new(),
        started: false,
        since: now,
        dropped: 0,
    };
    let (mut pace, mut held, mut moved, mut segments) = (None::<(Instant, u64)>, None::<Unit>, now, 0u64);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok("stopped".into());
        }
        let now = Instant::now();
        for (i, s) in streams.iter_mut().enumerate() {
            if s.ended || now < s.due {
                continue;
            }
            let m = match playlist(agent, &s.url)? {
                Playlist::Media(m) => m,
                Playlist::Multivariant(_) => {
                    return Err(format!(
                        "{}: a multivariant playlist where a media one was",
                        crate::spec::hls_shown(&s.url)
                    ))
                }
            };
            s.target = Duration::from_secs_f64(m.target_duration.clamp(0.1, 60.0));
            s.due = now + s.target / 2;
            for seg in s.follower.due(&m) {
                if stop.load(Ordering::Relaxed) {
                    return Ok("stopped".into());
                }
                let seg_url = hlsin::resolve(&s.url, &seg.uri);
                let bytes = get(agent, &seg_url, SEGMENT_MAX)?;
                let units = match &seg.map {
                    Some(map) => {
                        let map_url = hlsin::resolve(&s.url, map);
                        if s.init.as_ref().is_none_or(|(u, _)| *u != map_url) {
                            let init = hlsin::init(&get(agent, &map_url, PLAYLIST_MAX)?)
                                .map_err(|e| format!("{}: {e}", crate::spec::hls_shown(&map_url)))?;
                            s.init = Some((map_url, init));
                        }
                        let init = &s.init.as_ref().expect("read above").1;
                        hlsin::fmp4_units(init, &bytes)
                            .map_err(|e| format!("{}: {e}", crate::spec::hls_shown(&seg_url)))?
                    }
                    None => {
                        let (units, errors) = hlsin::ts_units(&bytes);
                        if errors > 0 {
                            tracing::debug!(url = %crate::spec::hls_shown(&seg_url), errors, "HLS source: TS errors");
                        }
                        units
                    }
                };
                merge.push(i, units);
                moved = now;
                segments += 1;
            }
            s.ended = m.ended;
        }
        if segments > 2 * START_BEHIND as u64 && !out.started {
            return Err(format!("{segments} segments and no H.264, H.265 or AAC in them"));
        }
        if streams.iter().all(|s| s.ended) && merge.queued() == 0 && held.is_none() {
            return Ok("the playlist ended".into());
        }
        let idle = 3 * streams.iter().map(|s| s.target).max().unwrap_or(FETCH) + Duration::from_secs(5);
        if !streams.iter().all(|s| s.ended) && moved.elapsed() > idle {
            return Err(format!("no new segment for {idle:?}"));
        }
        // What is due goes; the next waits for its time.
        let wait = loop {
            let Some(u) = held.take().or_else(|| merge.pop()) else { break Duration::from_millis(100) };
            let now = Instant::now();
            let (w0, d0) = *pace.get_or_insert((now, u.dts));
            let due = w0 + Duration::from_micros(u.dts.saturating_sub(d0) * 100 / 9);
            if due > now {
                held = Some(u);
                break due - now;
            }
            if now - due > STALL {
                pace = Some((now, u.dts));
            }
            emit(&mut out, &merge, u, p, host, (conn, label))?;
            *fed |= out.started;
        };
        let refresh =
            streams.iter().filter(|s| !s.ended).map(|s| s.due.saturating_duration_since(Instant::now())).min();
        std::thread::sleep(wait.min(refresh.unwrap_or(wait)).min(Duration::from_millis(100)));
    }
}

/// One unit into the path's tracks (the tracks start with the first).
fn emit(
    out: &mut Out,
    merge: &Merge,
    u: Unit,
    p: &Publisher,
    host: &Weak<dyn crate::upstream::Host>,
    (conn, label): (u64, &str),
) -> Result<(), String> {
    let (mux, kinds) = out.mux.get_or_insert_with(|| {
        let mut kinds = vec![u.kind];
        kinds.extend(
            merge.kinds().into_iter().filter(|k| (*k == StreamKind::AacAdts) != (u.kind == StreamKind::AacAdts)),
        );
        kinds.sort_by_key(|k| *k == StreamKind::AacAdts);
        (TsMuxer::new(&kinds), kinds)
    });
    let Some(stream) = kinds.iter().position(|k| *k == u.kind) else {
        out.dropped += 1;
        if out.dropped == 1 {
            tracing::warn!(kind = ?u.kind, "HLS source: a stream that came after the tracks were fixed is left out");
        }
        return Ok(());
    };
    out.ts.clear();
    mux.push(&AccessUnit { stream, pts: u.pts, dts: u.dts, key: u.key, data: &u.data }, &mut out.ts);
    out.ingest.push(&out.ts, out.since.elapsed().as_millis() as u64, &mut out.packets);
    if !out.started {
        let Some(sdp) = out.ingest.sdp() else {
            out.packets.clear();
            return Ok(());
        };
        let host = host.upgrade().ok_or("the relay is shutting down")?;
        let sdp = fanout_proto::rtsp::sdp::Sdp::parse(&sdp).map_err(|e| format!("its description: {e}"))?;
        let peer = std::net::IpAddr::from([0, 0, 0, 0]);
        p.start_stream(crate::publish::Ingest::Hls, label.to_string(), conn, peer, sdp, host.engine())
            .map_err(|e| format!("its tracks could not start: {e}"))?;
        out.started = true;
    }
    for mut pkt in out.packets.drain(..) {
        p.feed_rtp(conn, pkt.track, &mut pkt.data, pkt.waited_ms);
    }
    Ok(())
}
