//! External authentication (issue 34): an HTTP auth service and a JWKS server, both started
//! here, decide for each face (API, RTSP, HTTP streams, HLS, RTMP, WebRTC) and each action;
//! a service that hangs or fails refuses within its timeout; answers are cached. Local
//! users with permissions per action and path (issue 53) decide alike on every face.

mod common;
use base64::Engine as _;
use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A small HTTP server on a thread: each request's body goes to `answer`, which gives the
/// status and body to send back (or sleeps: a service that hangs).
struct Service {
    addr: SocketAddr,
    asked: Arc<Mutex<Vec<Value>>>,
}

impl Service {
    fn start(answer: impl Fn(&str, &Value) -> (u16, String) + Send + Sync + 'static) -> Service {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (log, answer) = (asked.clone(), Arc::new(answer));
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let (log, answer) = (log.clone(), answer.clone());
                std::thread::spawn(move || serve_one(c, &log, &*answer));
            }
        });
        Service { addr, asked }
    }

    fn asked(&self) -> Vec<Value> {
        self.asked.lock().unwrap().clone()
    }
}

fn serve_one(mut c: TcpStream, log: &Mutex<Vec<Value>>, answer: &dyn Fn(&str, &Value) -> (u16, String)) {
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if c.read_exact(&mut b).is_err() {
            return;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-length:").map(|n| n.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    if c.read_exact(&mut body).is_err() {
        return;
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !v.is_null() {
        log.lock().unwrap().push(v.clone());
    }
    let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (status, text) = answer(&target, &v);
    let _ = write!(
        c,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// The operator's rules: `admin` may call the API, `alice` read `demo`, `bob` publish to
/// `pub`, the password `good` for each; the token `hls-ok` reads anything.
fn rules(_target: &str, q: &Value) -> (u16, String) {
    let (user, pass, action, path) = (&q["user"], &q["password"], &q["action"], &q["path"]);
    let ok = pass == "good"
        && ((user == "admin" && action == "api")
            || (user == "alice" && action == "read" && path == "demo")
            || (user == "bob" && action == "publish" && path == "pub"))
        || (q["token"] == "hls-ok" && action == "read");
    (if ok { 200 } else { 403 }, String::new())
}

fn basic(user: &str, pass: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
}

/// The first line of the answer to one RTSP request.
fn rtsp_status(rtsp: SocketAddr, request: &str) -> String {
    let mut c = TcpStream::connect(rtsp).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    read_head(&mut c)
}

fn describe(rtsp: SocketAddr, path: &str, auth: Option<&str>) -> String {
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    rtsp_status(rtsp, &format!("DESCRIBE rtsp://{rtsp}/{path} RTSP/1.0\r\nCSeq: 1\r\n{auth}\r\n"))
}

/// Whether ffmpeg here speaks `srt://`.
fn ffmpeg_has_srt() -> bool {
    let protocols = std::process::Command::new("ffmpeg").args(["-hide_banner", "-protocols"]).output().unwrap();
    String::from_utf8_lossy(&protocols.stdout).lines().any(|l| l.trim() == "srt")
}

/// The first line of the answer to an ANNOUNCE of one H.264 track to `path` as `who`.
fn announce(rtsp: SocketAddr, path: &str, who: &str) -> String {
    let sdp = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n";
    rtsp_status(
        rtsp,
        &format!(
            "ANNOUNCE rtsp://{rtsp}/{path} RTSP/1.0\r\nCSeq: 1\r\nAuthorization: {who}\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
            sdp.len()
        ),
    )
}

/// The status of an HTTP GET with these headers.
fn http_status(relay: &Relay, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut c = TcpStream::connect(relay.api).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").unwrap();
    let head = read_head(&mut c);
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A WHEP offer that is no SDP: 401 where refused, else the relay reads it (400).
fn whep_status(relay: &Relay, auth: &str) -> u16 {
    let r = ureq::post(&relay.url("/v1/sessions/demo/whep"))
        .set("Content-Type", "application/sdp")
        .set("Authorization", auth)
        .send_string("not an offer");
    match r {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{e}"),
    }
}

/// Where RTSP listens, asked with these credentials.
fn rtsp_addr_as(relay: &Relay, auth: &str) -> SocketAddr {
    let engine: Value =
        ureq::get(&relay.url("/v1/engine")).set("Authorization", auth).call().unwrap().into_json().unwrap();
    engine["rtsp"].as_str().unwrap().parse().unwrap()
}

fn config(auth: &str) -> String {
    format!("[[session]]\nname = \"pub\"\nsource = {{ publish = true }}\n\n[auth]\n{auth}")
}

/// An HTTP auth service decides for every face: the API, RTSP reading and publishing, HTTP
/// streams, HLS (a token in the URL), RTMP, SRT and WebRTC; it gets who, from where, what and
/// over which protocol. Answers are cached for `cache_s`. A service that hangs or fails
/// refuses within the timeout.
#[test]
fn an_http_auth_service_decides_for_every_face() {
    let service = Service::start(rules);
    let file = std::env::temp_dir().join(format!("fanout-auth-{}.toml", std::process::id()));
    let http =
        |url: &str, extra: &str| config(&format!("method = \"http\"\nhttp_url = \"{url}\"\ntimeout_s = 1\n{extra}"));
    let url = format!("http://{}/auth", service.addr);
    std::fs::write(&file, http(&url, "cache_s = 0\n")).unwrap();
    let relay = Relay::start(&["--config", file.to_str().unwrap(), "--rtsp", "127.0.0.1:0"]);
    let rtsp = rtsp_addr_as(&relay, &basic("admin", "good"));

    // The API: the admin, not a reader, not nobody.
    assert_eq!(http_status(&relay, "/v1/sessions", &[("Authorization", &basic("admin", "good"))]), 200);
    assert_eq!(http_status(&relay, "/v1/sessions", &[("Authorization", &basic("alice", "good"))]), 401);
    assert_eq!(http_status(&relay, "/v1/sessions", &[]), 401);

    // RTSP: alice reads demo, with the right password only; she may not read pub.
    assert!(describe(rtsp, "demo", Some(&basic("alice", "good"))).starts_with("RTSP/1.0 200"));
    let refused = describe(rtsp, "demo", Some(&basic("alice", "bad")));
    assert!(refused.starts_with("RTSP/1.0 401") && refused.contains("WWW-Authenticate: Basic"), "{refused}");
    assert!(describe(rtsp, "demo", None).starts_with("RTSP/1.0 401"));
    // RTSP publishing: bob announces to pub; alice may not.
    let announce = |who: &str| announce(rtsp, "pub", who);
    assert!(announce(&basic("bob", "good")).starts_with("RTSP/1.0 200"));
    assert!(announce(&basic("alice", "good")).starts_with("RTSP/1.0 401"));

    // HTTP TS and HLS.
    assert_eq!(http_status(&relay, "/v1/sessions/demo/stream", &[("Authorization", &basic("alice", "good"))]), 200);
    assert_eq!(http_status(&relay, "/v1/sessions/demo/stream", &[("Authorization", &basic("bob", "good"))]), 401);
    assert_eq!(http_status(&relay, "/v1/sessions/demo/hls/index.m3u8?token=hls-ok", &[]), 200);
    assert_eq!(http_status(&relay, "/v1/sessions/demo/hls/index.m3u8?token=nope", &[]), 401);
    // WebRTC: a refused viewer is 401; an allowed one gets as far as its (bad) offer.
    assert_eq!(whep_status(&relay, &basic("alice", "good")), 400);
    assert_eq!(whep_status(&relay, &basic("alice", "bad")), 401);
    // RTMP publishing (ffmpeg), where there is ffmpeg.
    if have_ffmpeg() {
        let engine: Value = ureq::get(&relay.url("/v1/engine"))
            .set("Authorization", &basic("admin", "good"))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        let rtmp = engine["rtmp"].as_str().unwrap().to_string();
        let (ok, log) = ffmpeg_try_publish("flv", &format!("rtmp://{rtmp}/live/pub?user=bob&pass=good"));
        assert!(ok, "{log}");
        let (ok, _) = ffmpeg_try_publish("flv", &format!("rtmp://{rtmp}/live/pub?user=bob&pass=bad"));
        assert!(!ok, "a wrong RTMP password published");
        // SRT, where the relay has libsrt and ffmpeg speaks srt://: asked after the handshake.
        if let (true, Some(srt)) = (ffmpeg_has_srt(), engine["srt"].as_str()) {
            let (ok, log) = ffmpeg_try_publish("mpegts", &format!("srt://{srt}?streamid=publish:pub:bob:good"));
            assert!(ok, "{log}");
            let (ok, _) = ffmpeg_try_publish("mpegts", &format!("srt://{srt}?streamid=publish:pub:bob:bad"));
            assert!(!ok, "a wrong SRT password published");
            assert!(service.asked().iter().any(|q| q["protocol"] == "srt" && q["action"] == "publish"));
        } else {
            eprintln!("\n*** SKIPPED the SRT part: no libsrt in the relay or no srt:// in ffmpeg ***\n");
            assert!(std::env::var("CI").is_err(), "CI must have SRT (scripts/test installs it)");
        }
    }

    // What the service was told: who, from where, what, over which protocol; no token
    // in the query it is shown.
    let asked = service.asked();
    let seen = |action: &str, protocol: &str| {
        asked.iter().any(|q| q["action"] == action && q["protocol"] == protocol && q["ip"] == "127.0.0.1")
    };
    for (action, protocol) in
        [("api", "api"), ("read", "rtsp"), ("publish", "rtsp"), ("read", "http"), ("read", "hls"), ("read", "webrtc")]
    {
        assert!(seen(action, protocol), "no {action} over {protocol} asked: {asked:#?}");
    }
    if have_ffmpeg() {
        assert!(seen("publish", "rtmp"), "{asked:#?}");
    }
    let hls = asked.iter().find(|q| q["protocol"] == "hls").unwrap();
    assert_eq!((&hls["token"], &hls["query"], &hls["path"]), (&json!("hls-ok"), &json!(""), &json!("demo")));
    let rtsp_q = asked.iter().find(|q| q["protocol"] == "rtsp").unwrap();
    assert_eq!((&rtsp_q["user"], &rtsp_q["path"]), (&json!("alice"), &json!("demo")), "{rtsp_q}");
    // Refusals are logged without the password.
    assert!(relay.stderr().contains("refused by [auth]") && !relay.stderr().contains("good\""), "{}", relay.stderr());

    // Cached: with cache_s, the second DESCRIBE is not asked again.
    let (code, p) = reload_with(&relay, &file, &http(&url, "cache_s = 30\n"), &basic("admin", "good"));
    assert_eq!(code, 200, "{p}");
    let n = service.asked().len();
    assert!(describe(rtsp, "demo", Some(&basic("alice", "good"))).starts_with("RTSP/1.0 200"));
    assert!(describe(rtsp, "demo", Some(&basic("alice", "good"))).starts_with("RTSP/1.0 200"));
    assert_eq!(service.asked().len(), n + 1, "the second DESCRIBE asked again");

    // A service that hangs, and one that fails: refused within the timeout (1 s).
    let hangs = Service::start(|_, _| {
        std::thread::sleep(Duration::from_secs(20));
        (200, String::new())
    });
    let fails = Service::start(|_, _| (500, "broken".into()));
    for (what, s) in [("hangs", &hangs), ("fails", &fails)] {
        let cfg = http(&format!("http://{}/auth", s.addr), "cache_s = 0\n");
        let (code, p) = reload_with(&relay, &file, &cfg, &basic("admin", "good"));
        // (The reload itself was allowed before the new settings held.)
        assert_eq!(code, 200, "{what}: {p}");
        let t = Instant::now();
        assert!(describe(rtsp, "demo", Some(&basic("alice", "good"))).starts_with("RTSP/1.0 401"), "{what}");
        assert!(t.elapsed() < Duration::from_millis(1800), "{what}: refused after {:?}", t.elapsed());
        // Back to the good service, through the config (the API is refused meanwhile).
        std::fs::write(&file, http(&url, "cache_s = 0\n")).unwrap();
        assert_eq!(unsafe { libc::kill(relay.pid(), libc::SIGHUP) }, 0);
        assert!(
            wait_for(Duration::from_secs(10), || describe(rtsp, "demo", Some(&basic("alice", "good")))
                .starts_with("RTSP/1.0 200")),
            "{what}: SIGHUP did not bring the good service back"
        );
    }
    assert!(relay.stderr().contains("did not answer within"), "{}", relay.stderr());
    assert!(relay.stderr().contains("answered 500"), "{}", relay.stderr());
    let _ = std::fs::remove_file(&file);
}

/// `[[user]]`s (issue 53 item 6): a viewer allowed to read cam1 reads it on every face
/// (RTSP, HTTP TS, HLS, WebRTC, RTMP) and cannot read cam2 or publish; a camera account
/// (an Argon2 password, allowed from loopback) publishes over RTSP, RTMP and SRT; an admin
/// (a plain password) has the API and the metrics, which the others do not; a user allowed
/// only from elsewhere is refused here. Passwords are kept as SHA-256 and Argon2 hashes.
#[test]
fn users_may_do_what_their_permissions_say_on_every_face() {
    let config = r#"
[[session]]
name = "cam1"
source = { demo = true }
[[session]]
name = "cam2"
source = { demo = true }
[[session]]
name = "pub"
source = { publish = true }

[[user]]
name = "viewer"
password = "sha256:gJLYL0pY5pCbcEkqiifY/3VpJ2xxoZdrWxHuFRkO+/s="
permissions = [{ action = "read", path = "cam1" }]
[[user]]
name = "cams"
password = "argon2:$argon2id$v=19$m=4096,t=3,p=1$ZmFub3V0LXRlc3Q$Hs0R0F7xsWvEh2CnGwX460iWBnCH7zkYRLyDeFtOfj0"
ips = ["127.0.0.0/8"]
permissions = [{ action = "publish", path = "~^pub$" }]
[[user]]
name = "admin"
password = "a-pass"
permissions = [{ action = "api" }]
[[user]]
name = "faraway"
password = "f-pass"
ips = ["192.0.2.0/24"]
permissions = [{ action = "read" }]
"#;
    let relay = Relay::with_config(config, &["--no-demo"]);
    let (viewer, cams, admin) = (basic("viewer", "v-pass"), basic("cams", "c-pass"), basic("admin", "a-pass"));
    let rtsp = rtsp_addr_as(&relay, &admin);

    // The API and the metrics: the admin only.
    for path in ["/v1/sessions", "/metrics"] {
        assert_eq!(http_status(&relay, path, &[("Authorization", &admin)]), 200, "{path}");
        assert_eq!(http_status(&relay, path, &[("Authorization", &viewer)]), 401, "{path}");
        assert_eq!(http_status(&relay, path, &[]), 401, "{path}");
    }
    // RTSP: the viewer reads cam1, not cam2, not with a wrong password; the one allowed only
    // from elsewhere is refused here; publishing is the camera account's.
    assert!(describe(rtsp, "cam1", Some(&viewer)).starts_with("RTSP/1.0 200"));
    let refused = describe(rtsp, "cam2", Some(&viewer));
    assert!(refused.starts_with("RTSP/1.0 401") && refused.contains("WWW-Authenticate: Basic"), "{refused}");
    assert!(describe(rtsp, "cam1", Some(&basic("viewer", "nope"))).starts_with("RTSP/1.0 401"));
    assert!(describe(rtsp, "cam1", None).starts_with("RTSP/1.0 401"));
    assert!(describe(rtsp, "cam1", Some(&basic("faraway", "f-pass"))).starts_with("RTSP/1.0 401"));
    let announce = |who: &str| announce(rtsp, "pub", who);
    assert!(announce(&viewer).starts_with("RTSP/1.0 401"));
    assert!(announce(&cams).starts_with("RTSP/1.0 200"));
    // HTTP TS and HLS, with Basic or the user in the URL.
    assert_eq!(http_status(&relay, "/v1/sessions/cam1/stream", &[("Authorization", &viewer)]), 200);
    assert_eq!(http_status(&relay, "/v1/sessions/cam2/stream", &[("Authorization", &viewer)]), 401);
    assert_eq!(http_status(&relay, "/v1/sessions/cam1/stream", &[("Authorization", &admin)]), 401);
    assert_eq!(http_status(&relay, "/v1/sessions/cam1/hls/index.m3u8?user=viewer&pass=v-pass", &[]), 200);
    assert_eq!(http_status(&relay, "/v1/sessions/cam2/hls/index.m3u8?user=viewer&pass=v-pass", &[]), 401);
    // Players follow the playlists with the user in every URL; RTSP plays through SETUP
    // and PLAY with Basic.
    if have_ffmpeg() {
        let creds = "user=viewer&pass=v-pass";
        for url in [
            relay.url(&format!("/v1/sessions/cam1/hls/index.m3u8?{creds}")),
            format!("rtsp://viewer:v-pass@{rtsp}/cam1"),
        ] {
            let out = std::process::Command::new("timeout")
                .args(["30", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-stats", "-i", &url])
                .args(["-t", "2", "-f", "null", "-"])
                .output()
                .unwrap();
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && decoded_frames(&log) >= 45, "{url}: {log}");
        }
    }
    // WebRTC: refused is 401; allowed gets as far as its (bad) offer.
    let whep = |path: &str, auth: &str| match ureq::post(&relay.url(&format!("/{path}/whep")))
        .set("Content-Type", "application/sdp")
        .set("Authorization", auth)
        .send_string("not an offer")
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(whep("cam1", &viewer), 400);
    assert_eq!(whep("cam2", &viewer), 401);
    // RTMP and SRT, with ffmpeg.
    if have_ffmpeg() {
        let engine: Value =
            ureq::get(&relay.url("/v1/engine")).set("Authorization", &admin).call().unwrap().into_json().unwrap();
        let rtmp = engine["rtmp"].as_str().unwrap().to_string();
        let (ok, log) = ffmpeg_try_publish("flv", &format!("rtmp://{rtmp}/pub?user=cams&pass=c-pass"));
        assert!(ok, "{log}");
        let (ok, _) = ffmpeg_try_publish("flv", &format!("rtmp://{rtmp}/pub?user=viewer&pass=v-pass"));
        assert!(!ok, "the viewer published over RTMP");
        let probe = |url: &str| {
            std::process::Command::new("timeout")
                .args(["20", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0", url])
                .output()
                .unwrap()
        };
        let read = probe(&format!("rtmp://{rtmp}/cam1?user=viewer&pass=v-pass"));
        assert!(String::from_utf8_lossy(&read.stdout).contains("h264"), "{read:?}");
        let read = probe(&format!("rtmp://{rtmp}/cam2?user=viewer&pass=v-pass"));
        assert!(!String::from_utf8_lossy(&read.stdout).contains("h264"), "the viewer read cam2 over RTMP");
        if let (true, Some(srt)) = (ffmpeg_has_srt(), engine["srt"].as_str()) {
            let (ok, log) = ffmpeg_try_publish("mpegts", &format!("srt://{srt}?streamid=publish:pub:cams:c-pass"));
            assert!(ok, "{log}");
            let (ok, _) = ffmpeg_try_publish("mpegts", &format!("srt://{srt}?streamid=publish:pub:viewer:v-pass"));
            assert!(!ok, "the viewer published over SRT");
        } else {
            eprintln!("\n*** SKIPPED the SRT part: no libsrt in the relay or no srt:// in ffmpeg ***\n");
            assert!(std::env::var("CI").is_err(), "CI must have SRT (scripts/test installs it)");
        }
    }
    // A refusal of a known user names it, never its password.
    let log = relay.stderr();
    assert!(log.contains("the user may not do that") && log.contains("user=\"viewer\""), "{log}");
    assert!(!log.contains("v-pass") && !log.contains("c-pass"), "{log}");
}

fn reload_with(relay: &Relay, file: &std::path::Path, text: &str, auth: &str) -> (u16, Value) {
    std::fs::write(file, text).unwrap();
    let r = ureq::post(&relay.url("/v1/reload")).set("Authorization", auth).call();
    match r {
        Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("{e}"),
    }
}

/// Keys for JWTs: RS256 (the committed test key), ES256 and EdDSA (made now); the JWKS of
/// their public halves, and a signer for each.
mod keys {
    use base64::Engine as _;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use serde_json::{json, Value};

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    pub struct Keys {
        pub jwks: Value,
        signers: Vec<(Algorithm, &'static str, EncodingKey)>,
    }

    impl Keys {
        pub fn new() -> Keys {
            let rng = ring::rand::SystemRandom::new();
            let pem = include_str!("data/jwt-rs256.pem");
            let der: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
            let der = base64::engine::general_purpose::STANDARD.decode(der).unwrap();
            let rsa = RsaKeyPair::from_pkcs8(&der).unwrap();
            let public: ring::rsa::PublicKeyComponents<Vec<u8>> = rsa.public_key().into();
            let (n, e) = (&public.n, &public.e);
            let ec = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let point = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, ec.as_ref(), &rng)
                .unwrap()
                .public_key()
                .as_ref()
                .to_vec();
            let ed = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
            let ed_x = Ed25519KeyPair::from_pkcs8(ed.as_ref()).unwrap().public_key().as_ref().to_vec();
            let jwks = json!({ "keys": [
                { "kty": "RSA", "kid": "rs", "alg": "RS256", "n": b64(n), "e": b64(e) },
                { "kty": "EC", "crv": "P-256", "kid": "ec", "alg": "ES256", "x": b64(&point[1..33]), "y": b64(&point[33..]) },
                { "kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "EdDSA", "x": b64(&ed_x) },
            ]});
            let signers = vec![
                (Algorithm::RS256, "rs", EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap()),
                (Algorithm::ES256, "ec", EncodingKey::from_ec_der(ec.as_ref())),
                (Algorithm::EdDSA, "ed", EncodingKey::from_ed_der(ed.as_ref())),
            ];
            Keys { jwks, signers }
        }

        /// A token signed with each key, with these permissions, expiring in `ttl` s.
        pub fn tokens(&self, perms: Value, ttl: i64) -> Vec<(String, String)> {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
            self.signers
                .iter()
                .map(|(alg, kid, key)| {
                    let mut h = Header::new(*alg);
                    h.kid = Some(kid.to_string());
                    let claims = json!({ "exp": now + ttl, "fanout_permissions": perms });
                    (format!("{alg:?}"), jsonwebtoken::encode(&h, &claims, key).unwrap())
                })
                .collect()
        }
    }
}

/// JWTs signed with RS256, ES256 and EdDSA, checked against a JWKS the relay fetches: each
/// allows what its claim lists (the API; reading paths that match a pattern) and nothing
/// else; expired and foreign tokens are refused.
#[test]
fn jwts_allow_what_their_claims_list() {
    let keys = keys::Keys::new();
    let jwks = keys.jwks.to_string();
    let server = Service::start(move |_, _| (200, jwks.clone()));
    let file = std::env::temp_dir().join(format!("fanout-jwt-{}.toml", std::process::id()));
    let cfg = config(&format!("method = \"jwt\"\njwks_url = \"http://{}/jwks.json\"\n", server.addr));
    std::fs::write(&file, cfg).unwrap();
    let relay = Relay::start(&["--config", file.to_str().unwrap(), "--rtsp", "127.0.0.1:0"]);
    let readers = keys.tokens(json!([{ "action": "read", "path": "~^de.o$" }, { "action": "api" }]), 300);
    let rtsp = rtsp_addr_as(&relay, &format!("Bearer {}", readers[0].1));
    for (alg, t) in &readers {
        let bearer = format!("Bearer {t}");
        assert_eq!(http_status(&relay, "/v1/sessions", &[("Authorization", &bearer)]), 200, "{alg}: the API");
        assert_eq!(http_status(&relay, &format!("/v1/sessions/demo/stream?token={t}"), &[]), 200, "{alg}: HTTP");
        // RTSP: the JWT as the password.
        assert!(describe(rtsp, "demo", Some(&basic("any", t))).starts_with("RTSP/1.0 200"), "{alg}: RTSP");
        // Not a path its pattern matches; not an action it lists.
        assert_eq!(http_status(&relay, &format!("/v1/sessions/pub/stream?token={t}"), &[]), 401, "{alg}");
        assert_eq!(whep_status(&relay, &bearer), 400, "{alg}: WebRTC read");
    }
    // Expired (past the 30 s leeway), and signed by a key the JWKS does not have.
    for (alg, t) in keys.tokens(json!([{ "action": "read" }]), -60) {
        assert!(describe(rtsp, "demo", Some(&basic("any", &t))).starts_with("RTSP/1.0 401"), "{alg}: expired");
    }
    for (alg, t) in keys::Keys::new().tokens(json!([{ "action": "read" }]), 300).into_iter().skip(1) {
        assert!(describe(rtsp, "demo", Some(&basic("any", &t))).starts_with("RTSP/1.0 401"), "{alg}: foreign");
    }
    // Publishing takes a token that lists it.
    let (_, reader) = &readers[0];
    let announce = |t: &str| {
        rtsp_status(
            rtsp,
            &format!(
                "ANNOUNCE rtsp://{rtsp}/pub RTSP/1.0\r\nCSeq: 1\r\nAuthorization: {}\r\nContent-Length: 0\r\n\r\n",
                basic("x", t)
            ),
        )
    };
    assert!(announce(reader).starts_with("RTSP/1.0 401"));
    let (_, publisher) = &keys.tokens(json!([{ "action": "publish", "path": "pub" }]), 300)[1];
    assert!(!announce(publisher).starts_with("RTSP/1.0 401"), "{}", announce(publisher));
    assert!(relay.stderr().contains("JWT: expired"), "{}", relay.stderr());
    let _ = std::fs::remove_file(&file);
}
