//! Every packet of a bounded run reaches every sink, for each data path.

mod common;
use common::*;
use serde_json::json;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::time::{Duration, Instant};

const PACKETS: u64 = 100;
const LEN: usize = 500;

fn thousand_udp_and_ten_http(datapath: &str, udp_sinks: &str) {
    let relay = Relay::start(&["--no-demo"]);
    let spec =
        json!({"name":"tv1","source":{"udp":"127.0.0.1:0"},"priority":3,"datapath":datapath,"udp_sinks":udp_sinks});
    let src = create_on_free_port(&relay, spec);
    let receivers: Vec<UdpSocket> = (0..1000)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    for r in &receivers {
        relay.ok("POST", "/v1/sessions/tv1/sinks", Some(json!({"udp": r.local_addr().unwrap()})));
    }
    let mut http: Vec<_> = (0..10).map(|_| relay.http_subscribe("tv1")).collect();
    relay.wait_sinks("tv1", 1010);

    let sender = std::thread::spawn(move || send_paced(src, PACKETS, LEN, 50.0));
    // Drain every receiver until all packets arrived or time is up.
    let mut got: Vec<Vec<u64>> = vec![Vec::new(); receivers.len()];
    let mut http_bytes: Vec<Vec<u8>> = vec![Vec::new(); http.len()];
    for h in &http {
        h.set_nonblocking(true).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = [0u8; 2048];
    let want_http = PACKETS as usize * LEN;
    while Instant::now() < deadline {
        let mut idle = true;
        for (r, g) in receivers.iter().zip(got.iter_mut()) {
            while let Ok(n) = r.recv(&mut buf) {
                assert_eq!(n, LEN);
                g.push(u64::from_be_bytes(buf[..8].try_into().unwrap()));
                idle = false;
            }
        }
        for (h, b) in http.iter_mut().zip(http_bytes.iter_mut()) {
            while let Ok(n) = h.read(&mut buf) {
                if n == 0 {
                    break;
                }
                b.extend_from_slice(&buf[..n]);
                idle = false;
            }
        }
        if got.iter().all(|g| g.len() as u64 == PACKETS) && http_bytes.iter().all(|b| b.len() >= want_http) {
            break;
        }
        if idle {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    sender.join().unwrap();
    let expected: Vec<u64> = (0..PACKETS).collect();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &expected, "{datapath}: UDP sink {i} got {} of {PACKETS}", g.len());
    }
    let mut stream = Vec::new();
    for seq in 0..PACKETS {
        stream.extend_from_slice(&datagram(seq, LEN));
    }
    for (i, b) in http_bytes.iter().enumerate() {
        assert!(b == &stream, "{datapath}: HTTP sink {i} got {} of {want_http} bytes (or wrong ones)", b.len());
    }
    let st = relay.ok("GET", "/v1/sessions/tv1", None);
    assert_eq!(st["source"]["packets"], PACKETS);
    assert_eq!(st["packets_skipped"], 0);
    assert_eq!(st["packets_sent"], PACKETS * 1010);
    assert_eq!(st["datapath"], datapath);
    if datapath == "kernel" {
        assert_eq!(st["kernel"]["sinks"], 1000, "every UDP sink in the kernel: {st}");
        assert_eq!(st["kernel"]["packets"], PACKETS);
    }
}

#[test]
fn shared_delivers_everything_to_1000_udp_and_10_http_sinks() {
    thousand_udp_and_ten_http("shared", "batched");
}

#[test]
fn shared_with_connected_udp_sinks_delivers_everything_to_1000_udp_and_10_http_sinks() {
    thousand_udp_and_ten_http("shared", "connected");
}

#[test]
fn uring_delivers_everything_to_1000_udp_and_10_http_sinks() {
    thousand_udp_and_ten_http("uring", "batched");
}

/// The in-kernel path, in a network namespace of its own (root only).
#[test]
fn kernel_delivers_everything_to_1000_udp_and_10_http_sinks() {
    let _backlog = BacklogGuard::raise(20_000);
    in_private_netns("kernel_delivers_everything_to_1000_udp_and_10_http_sinks", || {
        thousand_udp_and_ten_http("kernel", "batched")
    });
}

#[test]
fn copy_delivers_everything_to_1000_udp_and_10_http_sinks() {
    thousand_udp_and_ten_http("copy", "batched");
}

#[test]
fn daemon_delivers_everything_to_1000_udp_and_10_http_sinks() {
    thousand_udp_and_ten_http("daemon", "batched");
}

/// A TCP publisher (listen and connect-out) relayed to a TCP sink arrives byte for byte.
#[test]
fn tcp_source_to_tcp_sink_is_byte_exact() {
    let relay = Relay::start(&["--no-demo"]);
    for (i, datapath) in ["shared", "copy", "daemon"].iter().enumerate() {
        let name = format!("t{i}");
        let listen =
            create_on_free_port(&relay, json!({"name":name,"source":{"tcp_listen":"127.0.0.1:0"},"datapath":datapath}));
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        relay.ok("POST", &format!("/v1/sessions/{name}/sinks"), Some(json!({"tcp": sink.local_addr().unwrap()})));
        let (mut rx, _) = sink.accept().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let mut publisher = std::net::TcpStream::connect(listen).unwrap();
        std::io::Write::write_all(&mut publisher, &data).unwrap();
        drop(publisher);
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = vec![0u8; data.len()];
        rx.read_exact(&mut got).unwrap();
        assert!(got == data, "{datapath}: stream differs");
        assert!(wait_for(Duration::from_secs(5), || relay.ok("GET", &format!("/v1/sessions/{name}"), None)["source"]
            ["state"]
            == "closed"));
    }

    // Connect-out: the relay dials the publisher.
    let publisher = TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = publisher.local_addr().unwrap();
    relay.ok("POST", "/v1/sessions", Some(json!({"name":"out","source":{"tcp_connect":paddr}})));
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    relay.ok("POST", "/v1/sessions/out/sinks", Some(json!({"tcp": sink.local_addr().unwrap()})));
    let (mut rx, _) = sink.accept().unwrap();
    let (mut tx, _) = publisher.accept().unwrap();
    std::io::Write::write_all(&mut tx, b"hello through the relay").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = [0u8; 23];
    rx.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello through the relay");
}

/// io_uring with a kernel thread polling the submission queue (SQPOLL), receiving with a
/// multishot io_uring recv, delivers everything.
#[test]
fn uring_with_sqpoll_and_uring_receive_delivers_everything() {
    let relay = Relay::start(&["--no-demo"]);
    let rx: Vec<UdpSocket> = (0..50).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let sinks: Vec<_> = rx.iter().map(|r| json!({"udp": r.local_addr().unwrap()})).collect();
    let src = create_on_free_port(
        &relay,
        json!({"name":"sq","source":{"udp":"127.0.0.1:0"},"datapath":"uring","uring_sqpoll":true,"source_recv":"uring","sinks":sinks}),
    );
    let kind = relay.ok("GET", "/v1/sessions/sq", None)["source"]["kind"].as_str().unwrap().to_string();
    assert!(kind.contains("io_uring multishot receive"), "{kind}");
    send_paced(src, 100, 200, 200.0);
    let mut buf = [0u8; 300];
    for r in &rx {
        r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for seq in 0..100u64 {
            let n = r.recv(&mut buf).unwrap();
            assert_eq!((n, u64::from_be_bytes(buf[..8].try_into().unwrap())), (200, seq));
        }
    }
}

/// Stream sinks of the sharing paths are written once per flush interval, everything pending
/// in one write: 20 packets sent over 200 ms reach an HTTP subscriber in one burst about
/// 300 ms after the first with `stream_flush_ms = 300`, and one by one at once with 0.
#[test]
fn stream_sinks_are_written_once_per_flush_interval() {
    let relay = Relay::start(&["--no-demo"]);
    for (name, flush) in [("f300", 300u64), ("f0", 0)] {
        let src =
            create_on_free_port(&relay, json!({"name":name,"source":{"udp":"127.0.0.1:0"},"stream_flush_ms":flush}));
        let mut h = relay.http_subscribe(name);
        relay.wait_sinks(name, 1);
        h.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
        let t0 = Instant::now();
        let sender = std::thread::spawn(move || send_paced(src, 20, 200, 100.0));
        let (mut total, mut arrivals) = (0, Vec::new());
        let mut buf = [0u8; 16384];
        while let Ok(n) = h.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
            arrivals.push(t0.elapsed());
        }
        sender.join().unwrap();
        assert_eq!(total, 20 * 200, "{name}: every byte");
        // A burst: reads less than 5 ms apart (the packets are sent 10 ms apart).
        let bursts = 1 + arrivals.windows(2).filter(|w| w[1] - w[0] > Duration::from_millis(5)).count();
        if flush == 300 {
            assert!(arrivals[0] >= Duration::from_millis(250), "{name}: held until the flush: {arrivals:?}");
            assert!(bursts <= 2, "{name}: {bursts} bursts: {arrivals:?}");
        } else {
            assert!(arrivals[0] < Duration::from_millis(150), "{name}: written at once: {arrivals:?}");
            assert!(bursts >= 10, "{name}: {bursts} bursts: {arrivals:?}");
        }
    }
}
