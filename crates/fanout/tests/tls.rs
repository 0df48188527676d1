//! TLS (issue 15): HTTPS for the API, HTTP streams and HLS; RTSPS with media interleaved on
//! the TLS connection; the refusals of plaintext on TLS ports and of TLS on plain ones; a
//! bad pair at start; SIGHUP swapping the certificate without dropping connections. Real
//! clients (curl, ffmpeg) verify the certificate the test made.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// A self-signed certificate for 127.0.0.1, written as PEM files; the DER for comparing.
struct Pair {
    cert: PathBuf,
    key: PathBuf,
    der: Vec<u8>,
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn make_pair(dir: &Path, name: &str) -> Pair {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    Pair { cert, key, der: ck.cert.der().to_vec() }
}

fn tls_config(p: &Pair, extra: &str) -> String {
    format!("[tls]\ncert = {:?}\nkey = {:?}\nrtsps = \"127.0.0.1:0\"\nrtmps = \"127.0.0.1:0\"\n{extra}", p.cert, p.key)
}

fn curl(args: &[&str]) -> (i32, String) {
    let out = Command::new("curl").args(["-sS", "--max-time", "10"]).args(args).output().expect("curl");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// GET over HTTPS trusting `p`; the JSON body.
fn get(relay: &Relay, p: &Pair, path: &str) -> serde_json::Value {
    let (rc, body) = curl(&["--cacert", p.cert.to_str().unwrap(), &format!("https://{}{path}", relay.api)]);
    assert_eq!(rc, 0, "curl {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// ffmpeg decodes `frames` pictures from `url` without a decoder complaint; over HTTPS it
/// verifies the server against `ca` (its RTSP client has no such option).
fn decodes(url: &str, ca: &Path, frames: u32) {
    let mut cmd = Command::new("timeout");
    cmd.args(["30", "ffmpeg", "-nostdin", "-v", "error"]);
    if url.starts_with("https://") {
        cmd.args(["-tls_verify", "1", "-ca_file"]).arg(ca);
    }
    let out =
        cmd.args(["-i", url, "-map", "0:v", "-frames:v", &frames.to_string(), "-f", "framecrc", "-"]).output().unwrap();
    let crcs = String::from_utf8_lossy(&out.stdout);
    let got = crcs.lines().filter(|l| !l.starts_with('#')).count() as u32;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && got == frames, "{url}: {got} of {frames} pictures; ffmpeg: {err}");
    assert!(err.trim().is_empty(), "{url}: decoder complaints: {err}");
}

fn rustls_client(roots: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(rustls::pki_types::CertificateDer::from(r.to_vec())).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    Arc::new(cfg)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to `addr`, its handshake done.
fn connect(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Tls {
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    s
}

fn peer_cert(s: &Tls) -> Vec<u8> {
    s.conn.peer_certificates().unwrap()[0].to_vec()
}

/// One RTSP request on `s`; the response head.
fn rtsp_request(s: &mut impl ReadWrite, req: &str) -> String {
    rtsp_exchange(s, req).0
}

/// One RTSP request on `s`; the response head and body.
fn rtsp_exchange(s: &mut impl ReadWrite, req: &str) -> (String, String) {
    s.write_all(req.as_bytes()).unwrap();
    s.flush().unwrap();
    let head = read_head(s);
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// After a refusal, the server's side ends cleanly (EOF, not a reset) with nothing sent.
fn closed_cleanly(mut s: TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => {}
        other => panic!("{what}: expected a clean close, got {other:?}"),
    }
}

fn wait_for_log(relay: &Relay, line: &str) {
    let t0 = std::time::Instant::now();
    while !relay.stderr().contains(line) {
        assert!(t0.elapsed() < Duration::from_secs(5), "no log line {line:?}: {}", relay.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn https_serves_the_api_streams_and_hls_to_clients_that_trust_the_certificate() {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir("https");
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, ""), &[]);
    let base = format!("https://{}", relay.api);
    let s = get(&relay, &pair, "/v1/sessions/demo");
    assert_eq!(s["stream_url"], format!("{base}/v1/sessions/demo/stream"), "{s}");
    // Without the certificate, curl's verification fails (60); plain HTTP is told to use https.
    assert_eq!(curl(&[&format!("{base}/v1/sessions")]).0, 60);
    let (rc, body) = curl(&[&format!("http://{}/v1/sessions", relay.api)]);
    assert!(rc == 0 && body.contains("use https://"), "{rc} {body}");
    wait_for_log(&relay, "plain HTTP on the HTTPS port");
    // `fanout ctl` over HTTPS: it trusts the file it is given, and only then.
    let ctl = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["ctl", "--api", &base])
            .args(extra)
            .arg("sessions")
            .env_remove("FANOUT_CACERT")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = ctl(&["--cacert", pair.cert.to_str().unwrap()]);
    assert!(ok && out.contains("demo"), "{out}");
    let (ok, out) = ctl(&[]);
    // Without the CA it says what is wrong (not that the relay is down: issue 30 item 16).
    assert!(!ok && out.contains("does not trust") && out.contains("--cacert"), "{out}");
    // A stream over HTTPS, with curl, decodes; so do the stream and HLS in ffmpeg.
    let file = dir.join("demo.ts");
    let (rc, _) = curl(&[
        "--cacert",
        pair.cert.to_str().unwrap(),
        "--max-time",
        "3",
        "-o",
        file.to_str().unwrap(),
        &format!("{base}/v1/sessions/demo/stream"),
    ]);
    assert_eq!(rc, 28, "curl stops the live stream at its time limit");
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(&file)
        .output()
        .unwrap();
    let codecs: std::collections::BTreeSet<String> =
        String::from_utf8_lossy(&probe.stdout).split_whitespace().map(String::from).collect();
    assert_eq!(codecs, ["aac".to_string(), "h264".to_string()].into(), "what curl saved");
    decodes(&format!("{base}/v1/sessions/demo/stream"), &pair.cert, 60);
    decodes(&format!("{base}/v1/sessions/demo/hls/index.m3u8"), &pair.cert, 60);
    // Every HTTPS subscriber left: their sinks are gone.
    let t0 = std::time::Instant::now();
    while get(&relay, &pair, "/v1/sessions/demo")["sinks"] != 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "HTTPS sinks stay after their clients left");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rtsps_plays_over_tls_and_refusals_are_clean() {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir("rtsps");
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, ""), &[]);
    let s = get(&relay, &pair, "/v1/sessions/demo");
    let url = s["rtsps_url"].as_str().unwrap().to_string();
    let rtsps: SocketAddr = url.trim_start_matches("rtsps://").trim_end_matches("/demo").parse().unwrap();
    let plain: SocketAddr =
        s["rtsp_url"].as_str().unwrap().trim_start_matches("rtsp://").trim_end_matches("/demo").parse().unwrap();
    decodes(&url, &pair.cert, 60);
    // Plain RTSP on the RTSPS port: closed, nothing sent.
    let mut c = TcpStream::connect(rtsps).unwrap();
    c.write_all(b"OPTIONS rtsp://127.0.0.1/demo RTSP/1.0\r\nCSeq: 1\r\n\r\n").unwrap();
    closed_cleanly(c, "plain RTSP on the RTSPS port");
    wait_for_log(&relay, "plaintext RTSP on the RTSPS port");
    // A TLS client on the plain port: its handshake fails, the port closes cleanly.
    let client = rustls_client(&[&pair.der]);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut conn = rustls::ClientConnection::new(client.clone(), name).unwrap();
    let mut c = TcpStream::connect(plain).unwrap();
    conn.write_tls(&mut c).unwrap();
    closed_cleanly(c, "TLS on the plain RTSP port");
    wait_for_log(&relay, "a TLS client on the plain RTSP port");
    // Over TLS, plain RTP over UDP would leave the encryption: 461; interleaved is served.
    let mut t = connect(rtsps, &client);
    let track = format!("{url}/trackID=0");
    let udp = format!("SETUP {track} RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP;unicast;client_port=5000-5001\r\n\r\n");
    assert!(rtsp_request(&mut t, &udp).starts_with("RTSP/1.0 461"));
    let tcp = format!("SETUP {track} RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n");
    let head = rtsp_request(&mut t, &tcp);
    assert!(head.starts_with("RTSP/1.0 200"), "{head}");
    // Nothing else was disturbed: a plain client over UDP and an RTSPS one still play.
    let out = Command::new("timeout")
        .args(["30", "ffmpeg", "-nostdin", "-v", "error", "-rtsp_transport", "udp", "-i"])
        .arg(s["rtsp_url"].as_str().unwrap())
        .args(["-frames:v", "30", "-f", "null", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "plain RTSP over UDP: {}", String::from_utf8_lossy(&out.stderr));
    decodes(&url, &pair.cert, 30);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_or_mismatched_pair_stops_the_start_naming_the_files() {
    let dir = temp_dir("bad");
    let (a, b) = (make_pair(&dir, "a"), make_pair(&dir, "b"));
    let start = |cert: &Path, key: &Path| {
        let cfg = dir.join("fanout.toml");
        std::fs::write(&cfg, format!("[tls]\ncert = {cert:?}\nkey = {key:?}\nrtsps = \"127.0.0.1:0\"\n")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["serve", "--api", "127.0.0.1:0", "--rtsp", "127.0.0.1:0", "--config"])
            .env("FANOUT_RTMP", "off")
            .env("FANOUT_SRT", "off")
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(!out.status.success(), "started with {cert:?} and {key:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = start(&a.cert, &b.key);
    assert!(e.contains("do not make a pair") && e.contains("a.crt") && e.contains("b.key"), "{e}");
    let e = start(&dir.join("missing.crt"), &a.key);
    assert!(e.contains("missing.crt"), "{e}");
    let junk = dir.join("junk.crt");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let e = start(&junk, &a.key);
    assert!(e.contains("junk.crt") && e.contains("no CERTIFICATE"), "{e}");
    let e = start(&a.key, &a.key);
    assert!(e.contains("no CERTIFICATE"), "a key given as the certificate: {e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGHUP: new connections get the new certificate, an open stream keeps flowing; a pair
/// that does not load leaves the served one in place.
#[test]
fn sighup_swaps_the_certificate_without_dropping_connections() {
    let dir = temp_dir("hup");
    let (a, b) = (make_pair(&dir, "a"), make_pair(&dir, "b"));
    let served = make_pair(&dir, "served");
    std::fs::copy(&a.cert, &served.cert).unwrap();
    std::fs::copy(&a.key, &served.key).unwrap();
    let relay = Relay::with_config(&tls_config(&served, ""), &[]);
    let client = rustls_client(&[&a.der, &b.der]);
    let mut stream = connect(relay.api, &client);
    assert_eq!(peer_cert(&stream), a.der);
    stream.write_all(b"GET /v1/sessions/demo/stream HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let read_some = |s: &mut Tls, buf: &mut [u8]| {
        let mut got = 0;
        while got < 20_000 {
            let n = s.read(buf).unwrap();
            assert!(n > 0, "the stream ended");
            got += n;
        }
    };
    read_some(&mut stream, &mut buf);
    std::fs::copy(&b.cert, &served.cert).unwrap();
    std::fs::copy(&b.key, &served.key).unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    let hup = || assert_eq!(unsafe { libc::kill(relay.pid(), libc::SIGHUP) }, 0);
    hup();
    let t0 = std::time::Instant::now();
    while peer_cert(&connect(relay.api, &client)) != b.der {
        assert!(t0.elapsed() < Duration::from_secs(5), "new connections still get the old certificate");
        std::thread::sleep(Duration::from_millis(20));
    }
    read_some(&mut stream, &mut buf);
    // A broken key: the reload fails, loudly, and B stays.
    std::fs::write(&served.key, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    hup();
    wait_for_log(&relay, "TLS reload failed");
    assert_eq!(peer_cert(&connect(relay.api, &client)), b.der);
    read_some(&mut stream, &mut buf);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn strict_encryption_serves_rtsps_only() {
    let dir = temp_dir("strict");
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, "encryption = \"strict\"\n"), &[]);
    let s = get(&relay, &pair, "/v1/sessions/demo");
    assert!(s.get("rtsp_url").is_none(), "no plain RTSP: {s}");
    assert!(s["rtsps_url"].as_str().unwrap().starts_with("rtsps://127.0.0.1:"), "{s}");
    let e = get(&relay, &pair, "/v1/engine");
    assert!(e["rtsp"].is_null() && e["rtsps"].is_string(), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// SRTP: ffmpeg decodes SRTP over UDP with the key the RTSPS description gave (SDES); two
/// UDP clients of one epoch get the very same ciphertext (encrypted once), which decrypts
/// with that key to the track's RTP; and with `srtp = false` RTSPS clients get plain RTP
/// in the TLS.
#[test]
fn srtp_over_udp_is_encrypted_once_and_decodes_with_the_described_key() {
    srtp_over_udp(false);
}

/// The same on the kernel path: the epoch's packets are encrypted before its session gets
/// them, and the program clones the ciphertext to the clients.
#[test]
fn srtp_over_udp_on_the_kernel_path_clones_the_ciphertext() {
    in_private_netns("srtp_over_udp_on_the_kernel_path_clones_the_ciphertext", || srtp_over_udp(true));
}

fn srtp_over_udp(kernel: bool) {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir(if kernel { "srtp-kernel" } else { "srtp" });
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, ""), &[]);
    // The kernel path takes UDP and RTSP sources: a proxy of the relay's own plain demo.
    let name = if kernel {
        let spec = serde_json::json!({ "name": "cam", "datapath": "kernel",
            "source": { "rtsp": format!("rtsp://{}/demo", rtsp_addr_tls(&relay, &pair)), "rtsp_transport": "udp", "on_demand": false } });
        let (rc, body) = curl(&[
            "--cacert",
            pair.cert.to_str().unwrap(),
            "-H",
            "content-type: application/json",
            "-d",
            &spec.to_string(),
            &format!("https://{}/v1/sessions", relay.api),
        ]);
        assert_eq!(rc, 0, "{body}");
        assert!(
            wait_for(Duration::from_secs(10), || get(&relay, &pair, "/v1/sessions/cam")["upstream"]["state"]
                == "playing"),
            "the proxy did not start playing"
        );
        "cam"
    } else {
        "demo"
    };
    let s = get(&relay, &pair, &format!("/v1/sessions/{name}"));
    let url = s["rtsps_url"].as_str().unwrap().to_string();
    let rtsps: SocketAddr = url.trim_start_matches("rtsps://").trim_end_matches(&format!("/{name}")).parse().unwrap();
    let client = rustls_client(&[&pair.der]);
    // Joiners in the last JOIN_MARGIN packets before the track's numbers wrap each get an
    // epoch of their own (srtp_out.rs): with a random start that is 6% of the time, and then
    // two clients share no ciphertext. Wait until two DESCRIBEs name one key: at most the
    // margin's 4096 packets, which the demo's video (about 29 packets a second, a STAP-A
    // for its small NAL units) takes 143 s to send. Slowly: each lone epoch lingers 10 s,
    // and they are bounded.
    let key_of = || {
        let mut c = connect(rtsps, &client);
        let (head, sdp) = rtsp_exchange(&mut c, &format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
        assert!(head.starts_with("RTSP/1.0 200"), "{head}");
        sdp.split("inline:").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
    };
    let shared = wait_for(Duration::from_secs(170), || {
        std::thread::sleep(Duration::from_millis(1000));
        key_of() == key_of()
    });
    assert!(shared, "joiners never shared an epoch");
    let mut t = connect(rtsps, &client);
    let (head, sdp) = rtsp_exchange(&mut t, &format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
    assert!(head.starts_with("RTSP/1.0 200"), "{head}");
    assert!(
        sdp.contains("m=video 0 RTP/SAVP 96") && sdp.contains("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:"),
        "{sdp}"
    );
    let video = &sdp[sdp.find("m=video").unwrap()..sdp.find("m=audio").unwrap_or(sdp.len())];
    let inline = video.split("inline:").nth(1).unwrap().split_whitespace().next().unwrap();
    let key =
        fanout_proto::rtp::srtp::Crypto::parse(&format!("1 AES_CM_128_HMAC_SHA1_80 inline:{inline}")).unwrap().key;
    // Plain RTP over UDP is refused on RTSPS; SRTP over UDP is taken.
    let track = format!("{url}/trackID=0");
    let plain =
        format!("SETUP {track} RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP;unicast;client_port=5000-5001\r\n\r\n");
    assert!(rtsp_request(&mut t, &plain).starts_with("RTSP/1.0 461"));
    // Two raw clients on one connection's session, and ffmpeg on a third port pair.
    let raw: Vec<std::net::UdpSocket> = (0..2).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let ffmpeg_port = free_port_pair();
    let mut sessions = Vec::new();
    for (i, port) in raw.iter().map(|r| r.local_addr().unwrap().port()).chain([ffmpeg_port]).enumerate() {
        let mut c = connect(rtsps, &client);
        let (h, _) = rtsp_exchange(&mut c, &format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
        assert!(h.starts_with("RTSP/1.0 200"));
        let setup = format!(
            "SETUP {track} RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/SAVP;unicast;client_port={port}-{}\r\n\r\n",
            port + 1
        );
        let h = rtsp_request(&mut c, &setup);
        assert!(h.starts_with("RTSP/1.0 200") && h.contains("Transport: RTP/SAVP;unicast;"), "client {i}: {h}");
        let id = h.lines().find_map(|l| l.strip_prefix("Session: ")).unwrap().split(';').next().unwrap().to_string();
        if i == 2 {
            // ffmpeg listens before the PLAY: its description is the track's, with our port.
            let file = dir.join("srtp.sdp");
            let media = video.replacen("m=video 0 ", &format!("m=video {ffmpeg_port} "), 1);
            std::fs::write(
                &file,
                format!("v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=x\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n{media}"),
            )
            .unwrap();
            sessions.push((c, id, Some(file)));
        } else {
            sessions.push((c, id, None));
        }
    }
    let mut ffmpeg = None;
    for (c, id, file) in &mut sessions {
        if let Some(file) = file {
            ffmpeg = Some(
                Command::new("timeout")
                    .args(["30", "ffmpeg", "-nostdin", "-v", "error", "-protocol_whitelist", "file,udp,rtp", "-i"])
                    .arg(&*file)
                    .args(["-frames:v", "60", "-f", "framecrc", "-"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let h = rtsp_request(c, &format!("PLAY {url} RTSP/1.0\r\nCSeq: 3\r\nSession: {id}\r\n\r\n"));
        assert!(h.starts_with("RTSP/1.0 200"), "{h}");
    }
    // The raw clients: the same bytes for the same sequence number, which decrypt to RTP.
    let mut got: Vec<std::collections::HashMap<u16, Vec<u8>>> = vec![Default::default(); 2];
    let mut buf = [0u8; 2048];
    for (r, g) in raw.iter().zip(got.iter_mut()) {
        r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        while g.len() < 100 {
            let n = r.recv(&mut buf).unwrap();
            g.insert(u16::from_be_bytes([buf[2], buf[3]]), buf[..n].to_vec());
        }
    }
    let common: Vec<u16> = got[0].keys().filter(|k| got[1].contains_key(k)).copied().collect();
    assert!(common.len() > 50, "the two clients overlap in {} packets", common.len());
    for seq in &common {
        assert_eq!(got[0][seq], got[1][seq], "packet {seq}: one ciphertext for both");
    }
    let mut rx = fanout_proto::rtp::srtp::Context::new(fanout_proto::rtp::srtp::Suite::AesCm128HmacSha1_80, &key);
    let mut seqs: Vec<u16> = got[0].keys().copied().collect();
    seqs.sort();
    for seq in seqs.iter().take(20) {
        let mut p = got[0][seq].clone();
        rx.unprotect_rtp(&mut p).unwrap_or_else(|e| panic!("packet {seq}: {e}"));
        assert_eq!(p[1] & 0x7f, 96, "decrypted to the H.264 track's RTP");
    }
    let out = ffmpeg.unwrap().wait_with_output().unwrap();
    let frames = String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with('#')).count();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && frames == 60, "ffmpeg over SRTP: {frames} pictures; {err}");
    let clients = get(&relay, &pair, "/v1/rtsp");
    let srtp = clients["clients"].as_array().unwrap().iter().filter(|c| c["srtp"] == true).count();
    assert_eq!(srtp, 3, "{clients}");
    // Where the epoch's clients were served from.
    let paths: Vec<&str> = clients["clients"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["srtp"] == true)
        .flat_map(|c| c["sinks"].as_array().unwrap())
        .map(|k| k["path"].as_str().unwrap_or("?"))
        .collect();
    let want = if kernel { "kernel" } else { "user" };
    assert!(paths.len() == 3 && paths.iter().all(|p| *p == want), "{clients}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 30 item 8: a client that joins a relay that has run a while is told in `RTP-Info`
/// exactly the sequence number and timestamp its first packet carries: over RTSPS with SRTP
/// (interleaved in the TLS) and over plain RTSP, on each track.
#[test]
fn late_joiners_are_told_what_their_first_packet_carries() {
    let dir = temp_dir("late");
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, ""), &[]);
    let url = get(&relay, &pair, "/v1/sessions/demo")["rtsps_url"].as_str().unwrap().to_string();
    let plain = format!("rtsp://{}/demo", rtsp_addr_tls(&relay, &pair));
    std::thread::sleep(Duration::from_secs(6));
    let cfg = rustls_client(&[&pair.der]);
    let mut firsts = Vec::new();
    for (url, secure) in [(url.as_str(), true), (plain.as_str(), false)] {
        for track in 0..2 {
            let addr: SocketAddr = url.split("://").nth(1).unwrap().trim_end_matches("/demo").parse().unwrap();
            let mut s: Box<dyn ReadWrite> =
                if secure { Box::new(connect(addr, &cfg)) } else { Box::new(TcpStream::connect(addr).unwrap()) };
            let (_, sdp) = rtsp_exchange(&mut s, &format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
            assert_eq!(sdp.contains("a=crypto"), secure, "{sdp}");
            let setup = format!(
                "SETUP {url}/trackID={track} RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP/TCP;interleaved=0-1\r\n\r\n"
            );
            let head = rtsp_request(&mut s, &setup);
            let session = head.lines().find_map(|l| l.strip_prefix("Session: ")).unwrap().split(';').next().unwrap();
            let head = rtsp_request(&mut s, &format!("PLAY {url} RTSP/1.0\r\nCSeq: 3\r\nSession: {session}\r\n\r\n"));
            let info = head.lines().find_map(|l| l.strip_prefix("RTP-Info: ")).unwrap_or_else(|| panic!("{head}"));
            let field = |k: &str| -> u64 { info.split(';').find_map(|f| f.strip_prefix(k)).unwrap().parse().unwrap() };
            let (seq, ts) = (field("seq="), field("rtptime="));
            // The first RTP frame on channel 0 (RTCP may come on 1).
            let first = loop {
                let mut h = [0u8; 4];
                s.read_exact(&mut h).unwrap();
                assert_eq!(h[0], b'$', "{url}: not a frame");
                let mut p = vec![0u8; usize::from(u16::from_be_bytes([h[2], h[3]]))];
                s.read_exact(&mut p).unwrap();
                if h[1] == 0 {
                    break p;
                }
            };
            let got_seq = u64::from(u16::from_be_bytes([first[2], first[3]]));
            let got_ts = u64::from(u32::from_be_bytes(first[4..8].try_into().unwrap()));
            assert_eq!((got_seq, got_ts), (seq, ts), "{url} track {track}: RTP-Info {info}");
            firsts.push(got_seq);
        }
    }
    // An SRTP key epoch keeps the track's numbers: the secure client, begun a moment before
    // the plain one, starts near the same packet (an epoch numbered from its own start would
    // be some 500 packets of the 6 s behind).
    for track in 0..2 {
        let (secure, plain) = (firsts[track], firsts[2 + track]);
        assert!(plain.abs_diff(secure) < 200, "track {track}: SRTP from {secure}, plain RTP from {plain}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The relay's plain RTSP address, from its engine status over HTTPS.
fn rtsp_addr_tls(relay: &Relay, p: &Pair) -> SocketAddr {
    get(relay, p, "/v1/engine")["rtsp"].as_str().expect("plain RTSP too").parse().unwrap()
}

/// A free even/odd UDP port pair on loopback (released for the client to bind).
fn free_port_pair() -> u16 {
    loop {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p.is_multiple_of(2) && p < 65534 && std::net::UdpSocket::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

#[test]
fn without_srtp_rtsps_clients_take_plain_rtp_in_the_tls() {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir("nosrtp");
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, "srtp = false\n"), &[]);
    let s = get(&relay, &pair, "/v1/sessions/demo");
    let url = s["rtsps_url"].as_str().unwrap().to_string();
    let rtsps: SocketAddr = url.trim_start_matches("rtsps://").trim_end_matches("/demo").parse().unwrap();
    let mut t = connect(rtsps, &rustls_client(&[&pair.der]));
    let (_, sdp) = rtsp_exchange(&mut t, &format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
    assert!(sdp.contains("RTP/AVP") && !sdp.contains("crypto"), "{sdp}");
    let savp = format!(
        "SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/SAVP;unicast;client_port=5000-5001\r\n\r\n"
    );
    assert!(rtsp_request(&mut t, &savp).starts_with("RTSP/1.0 461"), "no keys were given");
    decodes(&url, &pair.cert, 60);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that only DESCRIBEs makes a key epoch each time where none can be shared
/// (per-client keys here, near a wrap with shared ones): a flood of them is bounded per
/// track, its own oldest epochs giving way, and an honest client still plays.
#[test]
fn a_describe_flood_cannot_fill_the_relay_with_key_epochs() {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir("flood");
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, "srtp_keys = \"per-client\"\n"), &[]);
    let url = get(&relay, &pair, "/v1/sessions/demo")["rtsps_url"].as_str().unwrap().to_string();
    let rtsps: SocketAddr = url.trim_start_matches("rtsps://").trim_end_matches("/demo").parse().unwrap();
    let client = rustls_client(&[&pair.der]);
    let mut keys = std::collections::HashSet::new();
    for _ in 0..150 {
        let mut c = connect(rtsps, &client);
        let (head, sdp) = rtsp_exchange(&mut c, &format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
        assert!(head.starts_with("RTSP/1.0 200"), "{head}");
        keys.insert(sdp.split("inline:").nth(1).unwrap().split_whitespace().next().unwrap().to_string());
    }
    assert_eq!(keys.len(), 150, "per-client keys: every DESCRIBE its own");
    let epochs = get(&relay, &pair, "/v1/rtsp")["srtp_epochs"].clone();
    let list = epochs.as_array().unwrap();
    for track in ["demo/video", "demo/audio"] {
        let n = list.iter().filter(|e| e["track"] == track).count();
        assert_eq!(n, 64, "epochs of {track}: {epochs}");
    }
    wait_for_log(&relay, "SRTP key epochs without a client: the oldest ends");
    decodes(&url, &pair.cert, 60);
    let _ = std::fs::remove_dir_all(&dir);
}

/// RTMPS: ffmpeg publishes over RTMP in TLS with the relay's certificate and plays it back
/// over RTMPS, picture for picture; plain RTMP on the RTMPS port gets nowhere.
#[test]
fn ffmpeg_publishes_and_plays_over_rtmps() {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir("rtmps");
    let pair = make_pair(&dir, "server");
    let config = format!("{}\n[[session]]\nname = \"cam\"\nsource = {{ publish = true }}\n", tls_config(&pair, ""));
    let relay = Relay::with_config(&config, &["--no-demo"]);
    let rtmps = get(&relay, &pair, "/v1/engine")["rtmps"].as_str().unwrap().to_string();
    let s = get(&relay, &pair, "/v1/sessions/cam");
    assert_eq!(s["rtmps_publish_url"], format!("rtmps://{rtmps}/cam"), "{s}");
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");
    let _publisher = Kill(
        Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", demo, "-t", "30"])
            .args(["-c", "copy", "-f", "flv", &format!("rtmps://{rtmps}/live/cam")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let publishing = || get(&relay, &pair, "/v1/sessions/cam")["publisher"]["state"] == "publishing";
    assert!(wait_for(Duration::from_secs(10), publishing), "{}", get(&relay, &pair, "/v1/sessions/cam"));
    let clip = pictures(&["-i", demo]);
    let looped: Vec<String> = clip.iter().chain(&clip).cloned().collect();
    let got = pictures(&["-i", &format!("rtmps://{rtmps}/cam"), "-frames:v", "50"]);
    assert_eq!(got.len(), 50);
    assert!(
        looped.windows(50).any(|w| w == got.as_slice()),
        "the pictures played over RTMPS are not a run of the clip's"
    );
    let (ok, _) = ffmpeg_decode(&format!("rtmp://{rtmps}/cam"), &[], 1);
    assert!(!ok, "plain RTMP played on the RTMPS port");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `forward` and an `rtmp` source over RTMPS: a relay pushes the demo to another's RTMPS
/// port with the server checked against its CA, and a third pulls it from there the same
/// way; a forward that pins another certificate is refused by the TLS handshake and says so.
#[test]
fn a_path_is_forwarded_and_pulled_over_rtmps_with_the_server_checked() {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir("rtmps-forward");
    let pair = make_pair(&dir, "server");
    let config = format!(
        "{}\n[[session]]\nname = \"cam\"\nsource = {{ publish = true }}\n\
         [[session]]\nname = \"cam2\"\nsource = {{ publish = true }}\n",
        tls_config(&pair, "")
    );
    let far = Relay::with_config(&config, &["--no-demo"]);
    let engine = get(&far, &pair, "/v1/engine");
    let (rtmps, rtsps) = (engine["rtmps"].as_str().unwrap(), engine["rtsps"].as_str().unwrap());
    let pin = vec!["AB"; 32].join(":");
    // Over RTMPS and RTSPS, each checking the far relay against its CA; and one pinned to
    // another certificate.
    let near = Relay::with_config(
        &format!(
            "[[session]]\nname = \"cam\"\nsource = {{ demo = true }}\nforward = [\n  \
             {{ url = \"rtmps://{rtmps}/cam\", tls_ca = {:?} }},\n  \
             {{ url = \"rtmps://{rtmps}/other\", tls_fingerprint = \"{pin}\" }},\n  \
             {{ url = \"rtsps://{rtsps}/cam2\", tls_ca = {:?} }},\n]\n",
            pair.cert, pair.cert
        ),
        &["--no-demo"],
    );
    let publishing = |path: &str| {
        get(&far, &pair, &format!("/v1/sessions/{path}"))["publisher"]["tracks"]
            .as_array()
            .is_some_and(|t| t.len() == 2)
    };
    assert!(wait_for(Duration::from_secs(15), || publishing("cam")), "{}", near.ok("GET", "/v1/sessions/cam", None));
    assert!(wait_for(Duration::from_secs(15), || publishing("cam2")), "{}", near.ok("GET", "/v1/sessions/cam", None));
    let refused = || near.ok("GET", "/v1/sessions/cam", None)["forward"][1]["last_error"].as_str().map(str::to_string);
    assert!(wait_for(Duration::from_secs(10), || refused().is_some()), "{:?}", refused());
    assert!(refused().unwrap().contains("fingerprint"), "{:?}", refused());
    let puller = Relay::with_config(
        &format!(
            "[[session]]\nname = \"cam\"\nsource = {{ rtmp = \"rtmps://{rtmps}/cam\", tls_ca = {:?} }}\n",
            pair.cert
        ),
        &["--no-demo"],
    );
    let pulled = || puller.ok("GET", "/v1/sessions/cam", None)["publisher"]["state"] == "publishing";
    assert!(wait_for(Duration::from_secs(15), pulled), "{}", puller.ok("GET", "/v1/sessions/cam", None));
    let rtsp = rtsp_addr(&puller);
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &format!("rtsp://{rtsp}/cam"), "-frames:v", "50"]);
    assert_eq!(got.len(), 50, "pictures through two RTMPS hops");
    // Every picture is one of the clip's, whole (a broken one would decode to another), in
    // the clip's order. (Twice in about twenty runs, both the first after a build, these 50
    // were not one run of the clip's; not reproduced since. A gap is told and one small one
    // let pass; a picture not of the clip is not.)
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");
    let clip = pictures(&["-i", demo]);
    let at: Vec<usize> = got
        .iter()
        .map(|g| clip.iter().position(|c| c == g).unwrap_or_else(|| panic!("a picture not of the clip: {got:?}")))
        .collect();
    let gaps: Vec<(usize, usize)> =
        at.windows(2).filter(|w| w[1] != (w[0] + 1) % clip.len()).map(|w| (w[0], w[1])).collect();
    if !gaps.is_empty() {
        eprintln!("rtmps forward and pull: pictures skipped between {gaps:?} (of {at:?})");
    }
    let small = |(a, b): &(usize, usize)| (b + clip.len() - a) % clip.len() <= 3;
    assert!(gaps.len() <= 1 && gaps.iter().all(small), "{gaps:?} in {at:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn make_expired_pair(dir: &Path) -> Pair {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.join("expired.crt"), dir.join("expired.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    Pair { cert: c, key: k, der: cert.der().to_vec() }
}

/// An always-on session of `edge` pulling `url` with `extra` source keys; its upstream
/// status once it plays or has failed (`want_playing`), within 10 s.
fn pull(edge: &Relay, name: &str, url: &str, extra: serde_json::Value, want_playing: bool) -> serde_json::Value {
    let mut source = serde_json::json!({ "rtsp": url, "on_demand": false });
    source.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    edge.ok("POST", "/v1/sessions", Some(serde_json::json!({ "name": name, "source": source })));
    let t0 = std::time::Instant::now();
    loop {
        let up = edge.ok("GET", &format!("/v1/sessions/{name}"), None)["upstream"].clone();
        let done = if want_playing { up["state"] == "playing" } else { up["last_error"].is_string() };
        if done {
            return up;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{name}: {up}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Relay to relay over RTSPS: an edge pulls an origin's `rtsps://` stream, checking its
/// certificate by CA file or pinned fingerprint (or, said loudly, not at all), decrypts the
/// origin's SRTP once (over UDP and inside the TLS), and ffmpeg decodes what the edge
/// serves. A wrong CA, a wrong pin and an expired certificate are refused with the reason
/// in the status; bad TLS keys in a spec are 400.
#[test]
fn an_rtsps_upstream_is_checked_and_its_srtp_decrypted_once() {
    if !have_ffmpeg() {
        return;
    }
    let dir = temp_dir("upstream");
    let (pair, other) = (make_pair(&dir, "origin"), make_pair(&dir, "other"));
    let origin = Relay::with_config(&tls_config(&pair, ""), &[]);
    let url = get(&origin, &pair, "/v1/sessions/demo")["rtsps_url"].as_str().unwrap().to_string();
    let edge = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let ca = serde_json::json!({ "tls_ca": pair.cert });
    for (name, transport) in [("udp", "udp"), ("tcp", "tcp")] {
        let mut extra = ca.clone();
        extra["rtsp_transport"] = serde_json::json!(transport);
        let up = pull(&edge, name, &url, extra, true);
        assert_eq!(
            (up["tls"].clone(), up["transport"].clone()),
            (serde_json::json!(true), serde_json::json!(transport)),
            "{up}"
        );
        let s = edge.ok("GET", &format!("/v1/sessions/{name}"), None);
        decodes(s["rtsp_url"].as_str().unwrap(), &pair.cert, 60);
        let up = &edge.ok("GET", &format!("/v1/sessions/{name}"), None)["upstream"];
        assert_eq!(up["srtp_dropped"], 0, "{up}");
        assert!(up["tracks"][0]["packets"].as_u64().unwrap() > 60, "{up}");
    }
    let sha256 = |der: &[u8]| ring::digest::digest(&ring::digest::SHA256, der).as_ref().to_vec();
    let fp: String = sha256(&pair.der).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":");
    pull(&edge, "pinned", &url, serde_json::json!({ "tls_fingerprint": fp }), true);
    pull(&edge, "unchecked", &url, serde_json::json!({ "tls_verify": false, "rtsp_transport": "tcp" }), true);
    let up = pull(&edge, "wrong-ca", &url, serde_json::json!({ "tls_ca": other.cert }), false);
    assert!(up["last_error"].as_str().unwrap().contains("certificate"), "{up}");
    assert_eq!(up["last_error_origin"], "tls", "{up}");
    let wrong: String = sha256(&other.der).iter().map(|b| format!("{b:02x}")).collect();
    let up = pull(&edge, "wrong-pin", &url, serde_json::json!({ "tls_fingerprint": wrong }), false);
    assert!(up["last_error"].as_str().unwrap().contains("not the pinned one"), "{up}");
    let expired = make_expired_pair(&dir);
    // (Its API plain: curl would refuse the expired certificate too.)
    let old = Relay::with_config(&tls_config(&expired, "https = false\n"), &[]);
    let old_url = old.ok("GET", "/v1/sessions/demo", None)["rtsps_url"].as_str().unwrap().to_string();
    let up = pull(&edge, "expired", &old_url, serde_json::json!({ "tls_ca": expired.cert }), false);
    assert!(up["last_error"].as_str().unwrap().to_lowercase().contains("expired"), "{up}");
    // Bad TLS keys in a spec: 400, naming the key.
    for (source, key) in [
        (serde_json::json!({ "rtsp": "rtsp://127.0.0.1:1/x", "tls_verify": false }), "rtsps://"),
        (serde_json::json!({ "rtsp": url, "tls_fingerprint": "AB:CD" }), "tls_fingerprint"),
        (serde_json::json!({ "rtsp": url, "tls_ca": dir.join("none.pem") }), "none.pem"),
        (serde_json::json!({ "rtsp": url, "tls_ca": pair.cert, "tls_verify": false }), "at most one"),
    ] {
        let (code, body) =
            edge.call("POST", "/v1/sessions", Some(serde_json::json!({ "name": "bad", "source": source })));
        assert!(code == 400 && body["error"].as_str().unwrap().contains(key), "{code} {body}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// GStreamer's rtspsrc takes the key by MIKEY (`a=key-mgmt`) and decodes the demo's video
/// over RTSPS with SRTP, over UDP and interleaved.
#[test]
fn gstreamer_plays_srtp_keyed_by_mikey() {
    if !have_gstreamer() {
        return;
    }
    let srtp = Command::new("gst-inspect-1.0").args(["srtpdec"]).output().is_ok_and(|o| o.status.success())
        && Command::new("gst-inspect-1.0").args(["openh264dec"]).output().is_ok_and(|o| o.status.success());
    if !srtp {
        assert!(
            std::env::var_os("CI").is_none(),
            "scripts/test installs gstreamer1.0-plugins-bad (srtpdec, openh264dec)"
        );
        eprintln!("\n*** SKIPPED gstreamer_plays_srtp_keyed_by_mikey: no srtpdec/openh264dec (gstreamer1.0-plugins-bad) ***\n");
        return;
    }
    let dir = temp_dir("gst");
    let pair = make_pair(&dir, "server");
    let relay = Relay::with_config(&tls_config(&pair, ""), &[]);
    let url = get(&relay, &pair, "/v1/sessions/demo")["rtsps_url"].as_str().unwrap().to_string();
    // Late joiners (issue 30 item 8): the tracks have numbered packets for a while, so an
    // RTP-Info that named the track's numbers instead of the epoch's would make rtspsrc's
    // jitterbuffer drop every packet as "before seqnum-base" (no pictures below).
    std::thread::sleep(Duration::from_secs(8));
    for transport in ["udp", "tcp"] {
        let mut gst = Command::new("timeout");
        gst.args(["-s", "INT", "9", "gst-launch-1.0", "-v"]).args(
            format!(
                "rtspsrc location={url} protocols={transport} tls-validation-flags=0 name=s \
                 s. ! rtph264depay ! h264parse ! openh264dec ! fakesink silent=false name=v s. ! fakesink"
            )
            .split_whitespace(),
        );
        let gst = Gst::spawn(gst);
        // While it plays: GStreamer gave its own key in SETUP (KeyMgmt), and its receiver
        // reports, SRTCP under that key, are read (their loss figures show), none dropped.
        let keyed = wait_for(Duration::from_secs(8), || {
            let clients = get(&relay, &pair, "/v1/rtsp")["clients"].clone();
            clients.as_array().is_some_and(|c| {
                c.iter().any(|c| c["srtcp_keyed"] == true && c["fraction_lost"].is_number() && c["srtcp_dropped"] == 0)
            })
        });
        let clients = get(&relay, &pair, "/v1/rtsp");
        let log = gst.log();
        assert!(keyed, "GStreamer over {transport}: its SRTCP was not read: {clients}");
        // Decoded pictures reached the video sink; nothing failed (a key it could not use
        // would show as no pictures: srtpdec drops what fails its check).
        let pictures = log.lines().filter(|l| l.contains("(v:sink)") && l.contains("chain")).count();
        assert!(pictures > 30, "GStreamer over {transport}: {pictures} pictures: {log}");
        let errors = gst_errors_while_playing(&log);
        assert!(errors.is_empty(), "GStreamer over {transport}: {errors:#?}\n{log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
