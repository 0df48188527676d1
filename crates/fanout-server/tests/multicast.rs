//! A multicast UDP source, inside a network namespace this test makes itself (root only).

mod common;
use common::*;
use serde_json::json;
use std::net::{Ipv4Addr, UdpSocket};
use std::process::Command;
use std::time::Duration;

/// Moves this thread into a new network namespace with a multicast-capable loopback.
/// Returns why it cannot, if it cannot.
fn private_netns() -> Result<(), String> {
    // SAFETY: unshare affects only the calling thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error()));
    }
    for args in [&["link", "set", "lo", "up", "multicast", "on"][..], &["route", "add", "224.0.0.0/4", "dev", "lo"]] {
        let st = Command::new("ip").args(args).status().map_err(|e| format!("ip: {e}"))?;
        if !st.success() {
            return Err(format!("ip {args:?} failed"));
        }
    }
    Ok(())
}

#[test]
fn multicast_source_is_joined_and_relayed() {
    // The namespace dies with the thread that made it: nothing is left behind.
    std::thread::spawn(|| {
        if let Err(why) = private_netns() {
            if std::env::var_os("CI").is_some() && unsafe { libc::geteuid() } == 0 {
                panic!("root but cannot make a network namespace: {why}");
            }
            eprintln!("\n*** SKIPPED multicast_source_is_joined_and_relayed: needs root for a network namespace ({why}) ***\n");
            return;
        }
        let relay = Relay::start(&["--no-demo"]);
        let group = "239.1.2.3:5004";
        relay.ok("POST", "/v1/sessions", Some(json!({"name":"mc","source":{"udp":group,"interface":"127.0.0.1"}})));
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        relay.ok("POST", "/v1/sessions/mc/sinks", Some(json!({"udp": rx.local_addr().unwrap()})));
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.set_multicast_loop_v4(true).unwrap();
        socket2::SockRef::from(&tx).set_multicast_if_v4(&Ipv4Addr::LOCALHOST).unwrap();
        let mut buf = [0u8; 64];
        for seq in 0..10u64 {
            tx.send_to(&datagram(seq, 32), group).unwrap();
            let n = rx.recv(&mut buf).expect("relayed multicast datagram");
            assert_eq!(&buf[..n], &datagram(seq, 32)[..]);
        }
        assert_eq!(relay.ok("GET", "/v1/sessions/mc", None)["source"]["packets"], 10);
    })
    .join()
    .unwrap();
}
