//! A multicast UDP source, inside a network namespace this test makes itself (root only).

mod common;
use common::*;
use serde_json::json;
use std::net::{Ipv4Addr, UdpSocket};
use std::process::Command;
use std::time::Duration;

#[test]
fn multicast_source_is_joined_and_relayed() {
    // The namespace dies with the thread that made it: nothing is left behind.
    in_private_netns("multicast_source_is_joined_and_relayed", || {
        for args in [&["link", "set", "lo", "multicast", "on"][..], &["route", "add", "224.0.0.0/4", "dev", "lo"]] {
            assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
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
    });
}
