//! Paths by pattern (issue 34): a name no session has, asked for by a reader, is made by the
//! first `[[pattern]]` it matches; its `run_on_demand` command (a real ffmpeg here) publishes
//! to it and the reader that asked plays; nobody reading for `linger_s`, the path and its
//! command end.

mod common;
use common::*;
use std::time::Duration;

/// The command writes its process id to `pid` (and then becomes ffmpeg).
fn config(pid: &std::path::Path) -> String {
    let pid = pid.display();
    format!(
        "[[pattern]]\nmatch = \"~^cam[0-9]+$\"\nsource = {{ publish = true }}\nlinger_s = 2\n\
         run_on_demand = \"echo $$ > {pid}; exec ffmpeg -nostdin -loglevel error -re -stream_loop -1 -i {DEMO_TS} -c copy -f flv \\\"$FANOUT_RTMP_URL\\\"\"\n\n\
         [[pattern]]\nmatch = \"~^test-\"\nsource = {{ demo = true }}\nlinger_s = 1\n"
    )
}

#[test]
fn a_pattern_makes_the_path_its_command_publishes_and_it_ends_unwatched() {
    if !have_ffmpeg() {
        return;
    }
    let pid_file = std::env::temp_dir().join(format!("fanout-ondemand-{}.pid", std::process::id()));
    let relay = Relay::with_config(&config(&pid_file), &["--no-demo"]);
    let rtsp = rtsp_addr(&relay);
    assert_eq!(relay.call("GET", "/v1/sessions/cam7", None).0, 404, "made before anyone asked");

    // The reader that asks gets the stream the command publishes.
    let (ok, log) = ffmpeg_decode(&format!("rtsp://{rtsp}/cam7"), &[], 3);
    assert!(ok, "{log}\n{}", relay.stderr());
    assert!(decoded_frames(&log) >= 50, "{log}");
    let p = relay.ok("GET", "/v1/sessions/cam7", None);
    assert_eq!(p["publisher"]["state"], "publishing", "{p}");
    // Nobody reads: after linger_s (2 s) the path and the command end.
    assert!(
        wait_for(Duration::from_secs(10), || relay.call("GET", "/v1/sessions/cam7", None).0 == 404),
        "the on-demand path stayed"
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_string();
    assert!(
        wait_for(Duration::from_secs(5), || !std::path::Path::new(&format!("/proc/{pid}")).exists()),
        "the command (pid {pid}) still runs (or was not reaped)"
    );
    // Asked again: made again.
    let (ok, log) = ffmpeg_decode(&format!("rtsp://{rtsp}/cam7"), &[], 1);
    assert!(ok, "{log}");

    // A name no pattern matches is still 404.
    let (ok, _) = ffmpeg_decode(&format!("rtsp://{rtsp}/cam7x"), &[], 1);
    assert!(!ok);
    assert_eq!(relay.call("GET", "/v1/sessions/cam7x", None).0, 404);

    // Another pattern, over HTTP: the demo under any `test-` name, gone a second after.
    let sub = relay.http_subscribe("test-a");
    assert_eq!(relay.ok("GET", "/v1/sessions/test-a", None)["name"], "test-a");
    drop(sub);
    assert!(
        wait_for(Duration::from_secs(10), || relay.call("GET", "/v1/sessions/test-a", None).0 == 404),
        "the on-demand demo stayed"
    );
    let _ = std::fs::remove_file(&pid_file);
}

/// Only a client that authenticates makes a pattern's path (and starts its command): an RTSP
/// DESCRIBE without the stream user's credentials is 401 and makes nothing.
#[test]
fn only_an_authenticated_reader_makes_a_pattern_path() {
    let cfg = "[[rtsp_user]]\nname = \"u\"\npassword = \"p\"\n\n\
               [[pattern]]\nmatch = \"~^test-\"\nsource = { demo = true }\nlinger_s = 1\n";
    let relay = Relay::with_config(cfg, &["--no-demo"]);
    let rtsp = rtsp_addr(&relay);
    let describe = |auth: &str| {
        use std::io::Write as _;
        let mut c = std::net::TcpStream::connect(rtsp).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(c, "DESCRIBE rtsp://{rtsp}/test-a RTSP/1.0\r\nCSeq: 1\r\n{auth}\r\n").unwrap();
        read_head(&mut c)
    };
    assert!(describe("").starts_with("RTSP/1.0 401"));
    assert_eq!(relay.call("GET", "/v1/sessions/test-a", None).0, 404, "an unauthenticated DESCRIBE made the path");
    // u:p
    assert!(describe("Authorization: Basic dTpw\r\n").starts_with("RTSP/1.0 200"));
    assert_eq!(relay.call("GET", "/v1/sessions/test-a", None).0, 200);
}

/// A pattern keeps at most `max_paths` paths: a reader asking for one more name is refused
/// (503, and nothing is made) until one of them ends.
#[test]
fn a_pattern_makes_at_most_max_paths_paths() {
    let cfg = "[[pattern]]\nmatch = \"~^test-\"\nsource = { demo = true }\nlinger_s = 1\nmax_paths = 2\n";
    let relay = Relay::with_config(cfg, &["--no-demo"]);
    let ask = |name: &str| {
        use std::io::Write as _;
        let mut c = std::net::TcpStream::connect(relay.api).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(c, "GET /v1/sessions/{name}/stream HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        (read_head(&mut c), c)
    };
    let (a, _a) = ask("test-a");
    let (b, b_conn) = ask("test-b");
    assert!(a.starts_with("HTTP/1.1 200") && b.starts_with("HTTP/1.1 200"), "{a}\n{b}");
    let (c, _) = ask("test-c");
    assert!(c.starts_with("HTTP/1.1 503"), "{c}");
    assert_eq!(relay.call("GET", "/v1/sessions/test-c", None).0, 404, "made beyond max_paths");
    // One ends (its reader gone, past linger_s): a new name can be made.
    drop(b_conn);
    assert!(
        wait_for(Duration::from_secs(10), || relay.call("GET", "/v1/sessions/test-b", None).0 == 404),
        "test-b stayed"
    );
    let mut held = Vec::new();
    assert!(
        wait_for(Duration::from_secs(5), || {
            let (c, conn) = ask("test-c");
            held.push(conn);
            c.starts_with("HTTP/1.1 200")
        }),
        "test-c is still refused"
    );
}

/// The hooks of a path's life, with real processes: `run_on_ready` runs while a publisher
/// (ffmpeg over RTMP) sends and is stopped when it leaves, `run_on_not_ready` runs then,
/// `run_on_read` runs while an RTSP reader plays, `run_on_record_segment_complete` runs for
/// each recording file with its name and length. The API cannot set them.
#[test]
fn hooks_run_as_the_path_gets_its_stream_readers_and_files() {
    if !have_ffmpeg() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("fanout-hooks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (log, d) = (dir.join("log"), dir.display());
    let l = log.display();
    let cfg = format!(
        "publisher_grace_s = 0\nrecord_path = \"{d}/%path/%Y-%m-%d_%H-%M-%S-%f\"\n\n\
         [[session]]\nname = \"live\"\nsource = {{ publish = true }}\nrecord = {{ segment_s = 1 }}\n\
         run_on_ready = \"echo $$ > {d}/ready.pid; echo ready $FANOUT_PATH >> {l}; exec sleep 600\"\n\
         run_on_not_ready = \"echo not-ready $FANOUT_PATH >> {l}\"\n\
         run_on_read = \"echo $$ > {d}/read.pid; echo read >> {l}; exec sleep 600\"\n\
         run_on_record_segment_complete = \"echo segment $FANOUT_SEGMENT_PATH $FANOUT_SEGMENT_DURATION >> {l}\"\n"
    );
    let relay = Relay::with_config(&cfg, &["--no-demo"]);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let alive = |pid_file: &str| {
        std::fs::read_to_string(dir.join(pid_file))
            .is_ok_and(|p| std::path::Path::new(&format!("/proc/{}", p.trim())).exists())
    };
    assert!(!said().contains("ready"), "ready before anything was published");

    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let mut publisher = std::process::Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", DEMO_TS, "-t", "7"])
        .args(["-c", "copy", "-f", "flv", &format!("rtmp://{rtmp}/live")])
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || said().contains("ready live") && alive("ready.pid")),
        "run_on_ready did not run: {}\n{}",
        said(),
        relay.stderr()
    );
    assert!(!said().contains("read\n"), "run_on_read ran with nobody reading");
    let (ok, out) = ffmpeg_decode(&format!("rtsp://{}/live", rtsp_addr(&relay)), &[], 2);
    assert!(ok, "{out}");
    assert!(said().contains("read\n"), "run_on_read did not run: {}", said());
    assert!(wait_for(Duration::from_secs(5), || !alive("read.pid")), "run_on_read still runs with nobody reading");

    assert!(publisher.wait().unwrap().success());
    assert!(
        wait_for(Duration::from_secs(10), || said().contains("not-ready live") && !alive("ready.pid")),
        "the stream went, but: {}",
        said()
    );
    // Each completed file: its name and length.
    let segments: Vec<String> = said().lines().filter(|l| l.starts_with("segment ")).map(String::from).collect();
    assert!(!segments.is_empty(), "{}", said());
    for s in &segments {
        let mut p = s.split(' ').skip(1);
        let (file, secs) = (p.next().unwrap(), p.next().unwrap().parse::<f64>().unwrap());
        assert!(std::path::Path::new(file).exists() && secs > 0.5, "{s}");
    }

    // Only the config file runs commands.
    let spec = serde_json::json!({"name": "x", "source": {"publish": true}, "run_on_ready": "touch /tmp/pwned"});
    let (code, body) = relay.call("POST", "/v1/sessions", Some(spec));
    assert_eq!(code, 403, "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pattern whose source is `publish = true` takes any name it matches from a publisher
/// (RTMP and RTSP here): the path is made at the publish, stays while it is published
/// (nobody reading), plays to a reader, and goes once the publisher left; a name the
/// pattern does not match is refused.
#[test]
fn a_publisher_makes_a_pattern_path_that_lasts_while_it_publishes() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::with_config(
        "[[pattern]]\nmatch = \"~^live-\"\nsource = { publish = true }\nlinger_s = 1\n",
        &["--no-demo"],
    );
    let rtsp = rtsp_addr(&relay);
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let publishing = |name: &str| {
        let (code, s) = relay.call("GET", &format!("/v1/sessions/{name}"), None);
        code == 200 && s["publisher"]["state"] == "publishing"
    };
    let rtmp_pub = ffmpeg_publish("flv", &format!("rtmp://{rtmp}/live/live-a"));
    // (Video only: ffmpeg's RTSP muxer takes no ADTS audio.)
    let rtsp_pub = Kill(
        std::process::Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", DEMO_TS, "-t", "30", "-an"])
            .args(["-c", "copy", "-f", "rtsp", "-rtsp_transport", "tcp", &format!("rtsp://{rtsp}/live-b")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(10), || publishing("live-a")), "RTMP: {}", relay.stderr());
    assert!(wait_for(Duration::from_secs(10), || publishing("live-b")), "RTSP: {}", relay.stderr());
    // Nobody reads, well past linger_s: published, it stays.
    std::thread::sleep(Duration::from_secs(3));
    assert!(publishing("live-a") && publishing("live-b"), "a published pattern path ended unread");
    let (ok, log) = ffmpeg_decode(&format!("rtsp://{rtsp}/live-a"), &[], 2);
    assert!(ok && decoded_frames(&log) >= 25, "{log}");
    // A name the pattern does not match takes no publisher.
    let (ok, _) = ffmpeg_try_publish("flv", &format!("rtmp://{rtmp}/live/other"));
    assert!(!ok, "a publisher made a path no pattern allows");
    assert_eq!(relay.call("GET", "/v1/sessions/other", None).0, 404);
    // The publisher gone (then publisher_grace_s and linger_s), its path goes.
    drop(rtmp_pub);
    assert!(
        wait_for(Duration::from_secs(15), || relay.call("GET", "/v1/sessions/live-a", None).0 == 404),
        "the publisher's path stayed after it left"
    );
    assert!(publishing("live-b"));
    drop(rtsp_pub);
}
