//! The RTSP proxy between real third-party programs: MediaMTX (pinned, built by
//! scripts/install-peers) as the upstream, fed by ffmpeg; ffmpeg as the clients.

mod common;
use common::*;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the child when dropped.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// MediaMTX on free loopback ports, with a looped clip published into path `live`.
struct Mediamtx {
    rtsp: SocketAddr,
    /// RTSPS (with SRTP over UDP) where started with [`Mediamtx::start_encrypted`].
    rtsps: Option<SocketAddr>,
    api: SocketAddr,
    _server: Proc,
    _publisher: Proc,
    dir: PathBuf,
}

impl Drop for Mediamtx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Mediamtx {
    fn start(bin: &std::path::Path) -> Mediamtx {
        Self::start_with(bin, false)
    }

    /// With RTSPS beside plain RTSP (`rtspEncryption: optional`): TLS on its own port, SRTP
    /// over UDP, keys by MIKEY, under a certificate for 127.0.0.1 in `dir/server.crt`.
    fn start_encrypted(bin: &std::path::Path) -> Mediamtx {
        Self::start_with(bin, true)
    }

    /// Retried with fresh ports: a port found free may be taken by another test's socket
    /// before MediaMTX binds it, and a clip or publisher may fail under a loaded machine; each
    /// failed attempt prints MediaMTX's and the publisher's own words.
    fn start_with(bin: &std::path::Path, encrypted: bool) -> Mediamtx {
        let mut why = String::new();
        for attempt in 1..=3 {
            match Self::try_start(bin, encrypted) {
                Ok(m) => return m,
                Err(e) => {
                    eprintln!("rtsp_interop: MediaMTX attempt {attempt} failed: {e}");
                    why = e;
                }
            }
        }
        panic!("MediaMTX with a publisher did not start in three attempts; the last: {why}");
    }

    fn try_start(bin: &std::path::Path, encrypted: bool) -> Result<Mediamtx, String> {
        // A directory of this attempt alone: the clip in it is read by this publisher only.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fanout-mtx-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (rtsp, api) = (free_tcp_port(), free_tcp_port());
        let pair = unephemeral_udp_port(true).port();
        // A second publisher of a path is refused, not let in over the first (MediaMTX's
        // default): a stray client can then never end this server's stream mid-test.
        let mut cfg = format!(
            "logLevel: warn\napi: yes\napiAddress: 127.0.0.1:{api}\nrtspAddress: 127.0.0.1:{rtsp}\n\
             rtspTransports: [udp, tcp]\nrtpAddress: 127.0.0.1:{pair}\nrtcpAddress: 127.0.0.1:{}\n\
             rtmp: no\nhls: no\nwebrtc: no\nsrt: no\nmetrics: no\npprof: no\nplayback: no\n\
             pathDefaults:\n  overridePublisher: no\npaths:\n  all_others:\n",
            pair + 1
        );
        let rtsps = encrypted.then(|| {
            let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
            std::fs::write(dir.join("server.crt"), ck.cert.pem()).unwrap();
            std::fs::write(dir.join("server.key"), ck.signing_key.serialize_pem()).unwrap();
            let (port, srtp) = (free_tcp_port(), unephemeral_udp_port(true).port());
            cfg += &format!(
                "rtspEncryption: optional\nrtspsAddress: 127.0.0.1:{port}\nsrtpAddress: 127.0.0.1:{srtp}\n\
                 srtcpAddress: 127.0.0.1:{}\nrtspServerKey: {}\nrtspServerCert: {}\n",
                srtp + 1,
                dir.join("server.key").display(),
                dir.join("server.crt").display()
            );
            SocketAddr::from(([127, 0, 0, 1], port))
        });
        std::fs::write(dir.join("mediamtx.yml"), cfg).unwrap();
        let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
        let mut server = Proc(
            Command::new(bin)
                .arg(dir.join("mediamtx.yml"))
                .stdout(log("mediamtx.log"))
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        let rtsp = SocketAddr::from(([127, 0, 0, 1], rtsp));
        let api = SocketAddr::from(([127, 0, 0, 1], api));
        let words = |dir: &std::path::Path| {
            ["mediamtx.log", "publisher.log"]
                .map(|f| format!("{f}: {}", std::fs::read_to_string(dir.join(f)).unwrap_or_default().trim()))
                .join("; ")
        };
        let fail = |dir: PathBuf, what: &str| {
            let e = format!("{what} ({})", words(&dir));
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        };
        // Up when its API answers and it still runs: MediaMTX binds every listener before it
        // serves, and exits if one is taken, so then the RTSP port is its own.
        let up = wait_for(Duration::from_secs(10), || {
            ureq::get(&format!("http://{api}/v3/paths/list")).call().is_ok()
                && std::net::TcpStream::connect(rtsp).is_ok()
        });
        if !up || server.0.try_wait().unwrap().is_some() {
            drop(server);
            return fail(dir, "MediaMTX did not start");
        }
        // The demo clip as MP4 (ffmpeg cannot publish ADTS AAC over RTSP), looped live.
        let clip = dir.join("clip.mp4");
        let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/demo.ts");
        let ok = Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-y", "-i"])
            .arg(&demo)
            .args(["-c", "copy", "-bsf:a", "aac_adtstoasc"])
            .arg(&clip)
            .stderr(log("publisher.log"))
            .status()
            .unwrap();
        if !ok.success() {
            drop(server);
            return fail(dir, "the clip was not made");
        }
        let publisher = Proc(
            Command::new("ffmpeg")
                .args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i"])
                .arg(&clip)
                // Bounded: it stops by itself after two minutes.
                .args(["-t", "120", "-c", "copy", "-f", "rtsp", "-rtsp_transport", "tcp"])
                .arg(format!("rtsp://{rtsp}/live"))
                .stdout(Stdio::null())
                .stderr(log("publisher.log"))
                .spawn()
                .unwrap(),
        );
        let m = Mediamtx { rtsp, rtsps, api, _server: server, _publisher: publisher, dir };
        if !wait_for(Duration::from_secs(10), || m.api("/v3/paths/get/live")["ready"] == true) {
            let e = format!("the publisher did not reach MediaMTX ({})", words(&m.dir));
            return Err(e);
        }
        Ok(m)
    }

    /// Publishes `input` (ffmpeg input and codec options, 30 s at most) to `path`.
    fn publish(&self, path: &str, input: &[&str]) -> Proc {
        let p = Proc(
            Command::new("ffmpeg")
                .args(["-nostdin", "-loglevel", "error", "-re"])
                .args(input)
                .args(["-t", "30", "-f", "rtsp", "-rtsp_transport", "tcp"])
                .arg(format!("rtsp://{}/{path}", self.rtsp))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(self.dir.join(format!("{path}.log"))).unwrap())
                .spawn()
                .unwrap(),
        );
        assert!(
            wait_for(Duration::from_secs(10), || self.api(&format!("/v3/paths/get/{path}"))["ready"] == true),
            "the publisher of {path} did not reach MediaMTX: {}",
            std::fs::read_to_string(self.dir.join(format!("{path}.log"))).unwrap_or_default()
        );
        p
    }

    fn api(&self, path: &str) -> Value {
        match ureq::get(&format!("http://{}{path}", self.api)).call() {
            Ok(r) => r.into_json().unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }

    /// MediaMTX's RTSP sessions that read (not the publisher).
    fn readers(&self) -> Vec<Value> {
        self.readers_of("rtspsessions")
    }

    /// Its RTSPS sessions that read.
    fn secure_readers(&self) -> Vec<Value> {
        self.readers_of("rtspssessions")
    }

    fn readers_of(&self, kind: &str) -> Vec<Value> {
        let list = self.api(&format!("/v3/{kind}/list"));
        list["items"].as_array().into_iter().flatten().filter(|s| s["state"] == "read").cloned().collect()
    }
}

/// The frames ffmpeg decoded, as `framemd5` lines: (pts, md5).
fn frames(stdout: &[u8]) -> Vec<(i64, String)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            Some((f.get(2)?.parse().ok()?, f.get(5)?.to_string()))
        })
        .collect()
}

/// Decodes `limit` of the video (`-frames:v 170`: that many pictures, each whole).
fn decode(url: &str, limit: [&str; 2], transport: &str) -> Child {
    // RTSP over UDP or TCP; anything else (`http`) has no transport option.
    let rtsp = if transport == "http" { vec![] } else { vec!["-rtsp_transport", transport] };
    Command::new("timeout")
        .args(["40", "ffmpeg", "-nostdin", "-loglevel", "error"])
        .args(rtsp)
        .args(["-i", url])
        .args(limit)
        .args(["-map", "0:v", "-f", "framemd5", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A reference client of the upstream and `n` clients of the relay, decoding at once.
struct Clients {
    reference: Child,
    clients: Vec<Child>,
}

fn start_clients(upstream: &str, relayed: &str, n: usize) -> Clients {
    // Half of the clients take RTP over UDP, half interleaved on their RTSP connection.
    start_clients_over(upstream, relayed, n, |i| if i.is_multiple_of(2) { "udp" } else { "tcp" })
}

fn start_clients_over(upstream: &str, relayed: &str, n: usize, transport: impl Fn(usize) -> &'static str) -> Clients {
    // The reference reads the upstream from a second earlier and for longer, so its frames
    // span every client's window (a client starts at the relay's first keyframe, which the
    // reference must have seen too). It counts pictures, not seconds: a time limit counts
    // from the stream's start, and where the reference joined mid-GOP (up to 1 s before a
    // keyframe) it would decode too few (CI: 299 in 13 s).
    let reference = decode(upstream, ["-frames:v", "350"], "tcp");
    std::thread::sleep(Duration::from_secs(1));
    Clients { reference, clients: (0..n).map(|i| decode(relayed, ["-frames:v", "170"], transport(i))).collect() }
}

impl Clients {
    /// Every client decoded 170 pictures without a gap, a run of the reference's.
    fn check(self) {
        let reference = self.reference.wait_with_output().unwrap();
        let want: Vec<String> = frames(&reference.stdout).into_iter().map(|f| f.1).collect();
        assert_eq!(
            want.len(),
            350,
            "the reference decoded {} frames ({}): {}",
            want.len(),
            reference.status,
            String::from_utf8_lossy(&reference.stderr)
        );
        for (i, c) in self.clients.into_iter().enumerate() {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "client {i}: {}", String::from_utf8_lossy(&out.stderr));
            let got = frames(&out.stdout);
            assert_eq!(got.len(), 170, "client {i}");
            // No frame missing: the timestamps step evenly to the last (past the first two
            // frames, where a decoder starting at a keyframe may skip one it cannot show)...
            let diffs: Vec<i64> = got.windows(2).map(|w| w[1].0 - w[0].0).collect();
            let step = *diffs.iter().max_by_key(|d| diffs.iter().filter(|x| x == d).count()).unwrap();
            let gaps: Vec<_> =
                got[2..].windows(2).filter(|w| w[1].0 - w[0].0 != step).map(|w| (w[0].0, w[1].0)).collect();
            assert!(gaps.is_empty(), "client {i}: timestamp gaps {gaps:?}");
            // ...and the pictures are the upstream's, in order: a run of the reference's frames.
            let md5: Vec<String> = got.into_iter().map(|f| f.1).collect();
            let first = want.iter().position(|w| *w == md5[0]);
            let differ = first.map(|f| md5.iter().zip(&want[f..]).position(|(a, b)| a != b));
            assert!(
                want.windows(md5.len()).any(|w| w == md5.as_slice()),
                "client {i}: {} frames differ from the reference's {}: first at {first:?}, then the first difference at {differ:?}",
                md5.len(),
                want.len()
            );
        }
    }
}

/// The live555 proxy (liblivemedia from PyPI) in front of MediaMTX as the relay's upstream:
/// its description, RTP and RTCP work for the relay, and five ffmpeg clients decode every
/// frame through both proxies.
#[test]
fn live555_proxy_as_the_upstream() {
    let (Some(bin), Some(venv)) = (peer("mediamtx"), peer("live555")) else { return };
    if !have_ffmpeg() {
        return;
    }
    let mtx = Mediamtx::start(&bin);
    let port = free_tcp_port();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/live555-proxy.py");
    let _live555 = Proc(
        Command::new(venv.join("bin/python"))
            .arg(script)
            .args([&port.to_string(), &format!("rtsp://{}/live", mtx.rtsp), "60"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()));
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let spec = json!({ "name": "cam", "source": { "rtsp": format!("rtsp://127.0.0.1:{port}/cam"), "linger_s": 2 } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    start_clients(&format!("rtsp://{}/live", mtx.rtsp), &url, 5).check();
    let up = relay.ok("GET", "/v1/sessions/cam", None)["upstream"].clone();
    assert_eq!((up["connects"].as_u64(), up["tracks"].as_array().map(Vec::len)), (Some(1), Some(2)), "{up}");
}

/// Twenty ffmpeg clients (ten over UDP, ten over TCP) of one MediaMTX stream through
/// `fanout`: each decodes 170 pictures without a gap, the same pictures as a
/// client of MediaMTX itself; MediaMTX sees one
/// reader (fanout), whose receiver reports it accepts; when the last client leaves, the
/// upstream session goes a linger later.
#[test]
fn twenty_ffmpeg_clients_share_one_mediamtx_session() {
    let Some(bin) = peer("mediamtx") else { return };
    if !have_ffmpeg() {
        return;
    }
    let mtx = Mediamtx::start(&bin);
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let spec = json!({ "name": "cam", "source": {
        "rtsp": format!("rtsp://{}/live", mtx.rtsp), "rtsp_transport": "udp", "linger_s": 2 } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));

    let clients = start_clients(&format!("rtsp://{}/live", mtx.rtsp), &url, 20);
    // While they play: one reader at MediaMTX (the relay), over UDP, with our RTCP accepted.
    std::thread::sleep(Duration::from_secs(7));
    let readers = mtx.readers();
    let ours: Vec<&Value> = readers.iter().filter(|r| r["path"] == "live").collect();
    assert_eq!(ours.len(), 2, "the relay and the reference client, nothing else: {readers:?}");
    let relay_reader = ours.iter().find(|r| r["transport"] == "UDP" && r["rtcpPacketsReceived"].as_u64() > Some(0));
    assert!(relay_reader.is_some(), "the relay's session reads over UDP and sends receiver reports: {readers:?}");
    assert!(ours.iter().all(|r| r["rtcpPacketsInError"] == 0), "{readers:?}");
    clients.check();
    let status = relay.ok("GET", "/v1/sessions/cam", None);
    assert_eq!(status["upstream"]["connects"], 1, "{status}");

    // Everyone left (ffmpeg sends TEARDOWN): the upstream session goes after the linger.
    assert!(
        wait_for(Duration::from_secs(15), || mtx.readers().is_empty()),
        "MediaMTX still has readers: {:?}",
        mtx.readers()
    );
    assert_eq!(relay.ok("GET", "/v1/sessions/cam", None)["upstream"]["state"], "idle");
}

/// MediaMTX serving RTSPS with SRTP (keys by MIKEY) as the upstream, its certificate checked
/// against its CA: one relay session pulls SRTP over UDP, one SRTP interleaved in the TLS
/// connection. Each is decrypted once, and ffmpeg clients decode every picture, the same as
/// a plain client of MediaMTX. MediaMTX takes our key (`KeyMgmt` in SETUP) and reads our
/// receiver reports, SRTCP under it, without an error.
#[test]
fn mediamtx_over_rtsps_with_srtp_is_proxied_and_decoded() {
    let Some(bin) = peer("mediamtx") else { return };
    if !have_ffmpeg() {
        return;
    }
    let mtx = Mediamtx::start_encrypted(&bin);
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let upstream = format!("rtsps://{}/live", mtx.rtsps.unwrap());
    let ca = mtx.dir.join("server.crt");
    for transport in ["udp", "tcp"] {
        let spec = json!({ "name": transport, "source": {
            "rtsp": upstream, "rtsp_transport": transport, "tls_ca": ca, "linger_s": 2 } });
        relay.ok("POST", "/v1/sessions", Some(spec));
    }
    let base = format!("rtsp://{}", rtsp_addr(&relay));
    let reference = format!("rtsp://{}/live", mtx.rtsp);
    let udp = start_clients_over(&reference, &format!("{base}/udp"), 2, |_| "udp");
    let tcp = start_clients_over(&reference, &format!("{base}/tcp"), 2, |_| "tcp");
    // While they play: MediaMTX has our two sessions over SAVP, with our SRTCP read (a
    // report goes out on start and every few seconds after).
    std::thread::sleep(Duration::from_secs(7));
    let readers = mtx.secure_readers();
    let mut seen: Vec<(String, String)> =
        readers.iter().map(|r| (r["transport"].to_string(), r["profile"].to_string())).collect();
    seen.sort();
    assert_eq!(seen, [("\"TCP\"".into(), "\"SAVP\"".into()), ("\"UDP\"".into(), "\"SAVP\"".into())], "{readers:?}");
    assert!(readers.iter().all(|r| r["rtcpPacketsReceived"].as_u64() > Some(0)), "{readers:?}");
    assert!(readers.iter().all(|r| r["rtcpPacketsInError"] == 0), "{readers:?}");
    udp.check();
    tcp.check();
    for name in ["udp", "tcp"] {
        let up = relay.ok("GET", &format!("/v1/sessions/{name}"), None)["upstream"].clone();
        assert_eq!((up["tls"].as_bool(), up["transport"].as_str()), (Some(true), Some(name)), "{up}");
        assert_eq!((up["connects"].as_u64(), up["srtp_dropped"].as_u64()), (Some(1), Some(0)), "{up}");
    }
}

/// Deleting a session ends its upstream session with a TEARDOWN: MediaMTX stops sending
/// to our UDP ports at once, not at its own timeout (10 s) after the connection closed.
#[test]
fn deleting_a_session_tears_its_upstream_down_at_once() {
    let Some(bin) = peer("mediamtx") else { return };
    if !have_ffmpeg() {
        return;
    }
    let mtx = Mediamtx::start(&bin);
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let spec = json!({ "name": "cam", "source": {
        "rtsp": format!("rtsp://{}/live", mtx.rtsp), "rtsp_transport": "udp", "on_demand": false } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    assert!(
        wait_for(Duration::from_secs(10), || relay.ok("GET", "/v1/sessions/cam", None)["upstream"]["state"]
            == "playing"),
        "the upstream did not play"
    );
    assert!(wait_for(Duration::from_secs(5), || mtx.readers().len() == 1), "{:?}", mtx.readers());
    let t = std::time::Instant::now();
    relay.ok("DELETE", "/v1/sessions/cam", None);
    assert!(wait_for(Duration::from_secs(2), || mtx.readers().is_empty()), "still read: {:?}", mtx.readers());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// A camera (MediaMTX, H.264 + AAC over RTSP) proxied by `fanout` plays over HTTP: as HLS,
/// and as MPEG-TS from the session's stream URL, where three ffmpeg clients decode 170
/// pictures each, the same pictures as a client of MediaMTX itself, through one
/// repackaging that goes a linger after the last of them.
#[test]
fn a_proxied_camera_plays_over_http_as_mpegts() {
    let Some(bin) = peer("mediamtx") else { return };
    if !have_ffmpeg() {
        return;
    }
    let mtx = Mediamtx::start(&bin);
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let spec = json!({ "name": "cam", "source": { "rtsp": format!("rtsp://{}/live", mtx.rtsp), "linger_s": 2 } });
    let created = relay.ok("POST", "/v1/sessions", Some(spec));
    assert!(created["stream_format"].as_str().unwrap().starts_with("mpegts (repackaged"), "{created}");
    let url = created["stream_url"].as_str().unwrap().to_string();

    let probe = Command::new("timeout")
        .args([
            "20",
            "ffprobe",
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name,width,sample_rate",
            "-of",
            "csv=p=0",
        ])
        .arg(&url)
        .output()
        .unwrap();
    let streams = String::from_utf8_lossy(&probe.stdout).to_string();
    assert!(streams.contains("h264,480") && streams.contains("aac,48000"), "{streams}{probe:?}");

    // HLS of it too, from the same repackaging: 4 s, audio and video, no decoder complaint.
    let hls = Command::new("timeout")
        .args(["30", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-stats", "-i"])
        .arg(relay.url("/v1/sessions/cam/hls/index.m3u8"))
        .args(["-t", "4", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&hls.stderr);
    assert!(hls.status.success() && decoded_frames(&log) >= 95, "{log}");
    assert!(!log.lines().any(|l| l.starts_with('[')), "{log}");

    let clients = start_clients_over(&format!("rtsp://{}/live", mtx.rtsp), &url, 3, |_| "http");
    std::thread::sleep(Duration::from_secs(4));
    let status = relay.ok("GET", "/v1/sessions/cam", None);
    let repack = &status["repackaging"];
    assert_eq!((repack["from"].as_str(), repack["ts"]["sinks"].as_u64()), (Some("H.264 + AAC"), Some(3)), "{status}");
    // One subscriber per track upstream of it, however many HTTP clients.
    let tracks = status["rtsp_tracks"].as_array().unwrap();
    assert!(tracks.iter().all(|t| t["sinks"] == 1), "{status}");
    clients.check();

    // Everyone left: the repackaging stops a linger later, and with it its subscriptions.
    assert!(
        wait_for(Duration::from_secs(10), || relay.ok("GET", "/v1/sessions/cam", None)["repackaging"].is_null()),
        "the repackaging outlived its subscribers"
    );
    let status = relay.ok("GET", "/v1/sessions/cam", None);
    assert!(status["rtsp_tracks"].as_array().unwrap().iter().all(|t| t["sinks"] == 0), "{status}");
}

/// A session whose tracks MPEG-TS cannot carry (VP9 here; G.711 and Opus would become AAC)
/// answers its stream URL with 415 and why, instead of bytes no player reads; RTSP still
/// plays it.
#[test]
fn a_stream_that_cannot_be_mpegts_says_why() {
    let Some(bin) = peer("mediamtx") else { return };
    if !have_ffmpeg() {
        return;
    }
    let mtx = Mediamtx::start(&bin);
    let vp9 = ["-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25", "-c:v", "libvpx-vp9", "-deadline", "realtime"];
    let _vp9 = mtx.publish("vp9", &[&vp9[..], &["-cpu-used", "8", "-strict", "experimental"]].concat());
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let spec = json!({ "name": "phone", "source": { "rtsp": format!("rtsp://{}/vp9", mtx.rtsp), "linger_s": 1 } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    let (status, body) = relay.call("GET", "/v1/sessions/phone/stream", None);
    assert_eq!(status, 415, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("VP9") && e.contains("RTSP")), "{body}");
    let probe = Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(format!("rtsp://{}/phone", rtsp_addr(&relay)))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "vp9", "{probe:?}");
}
