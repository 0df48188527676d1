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

/// RTSP players asking for multicast (ffmpeg's `udp_multicast`) share one stream per track:
/// two play the demo at once, each decodes 100 pictures, and the relay sends each track once
/// (one sink, to its group) until the last leaves.
#[test]
fn rtsp_multicast_players_share_one_stream_per_track() {
    if !have_ffmpeg() {
        return;
    }
    in_private_netns("rtsp_multicast_players_share_one_stream_per_track", || {
        for args in [&["link", "set", "lo", "multicast", "on"][..], &["route", "add", "224.0.0.0/4", "dev", "lo"]] {
            assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
        }
        let relay = Relay::with_config(
            "rtsp_multicast = { ips = \"239.255.7.0/28\", rtp_port = 8002, rtcp_port = 8003 }\n\
             [[session]]\nname = \"cam\"\nsource = { demo = true }\n",
            &["--no-demo"],
        );
        let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
        let players: Vec<_> = (0..2)
            .map(|_| {
                Command::new("timeout")
                    .args(["20", "ffmpeg", "-hide_banner", "-nostdin", "-rtsp_transport", "udp_multicast", "-i", &url])
                    .args(["-map", "0:v", "-frames:v", "100", "-f", "null", "-"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let sinks = || {
            let s = relay.ok("GET", "/v1/sessions/cam", None);
            let tracks: Vec<u64> =
                s["rtsp_tracks"].as_array().unwrap().iter().map(|t| t["sinks"].as_u64().unwrap()).collect();
            (s["readers"].as_u64().unwrap(), tracks)
        };
        assert!(wait_for(Duration::from_secs(10), || sinks().0 == 2), "two players: {:?}", sinks());
        assert_eq!(sinks(), (2, vec![1, 1]), "two players, one stream per track");
        for p in players {
            let out = p.wait_with_output().unwrap();
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{log}");
            assert_eq!(decoded_frames(&log), 100, "{log}");
            assert!(!log.to_ascii_lowercase().contains("error"), "{log}");
        }
        assert!(wait_for(Duration::from_secs(10), || sinks() == (0, vec![0, 0])), "the stream stays: {:?}", sinks());
    });
}
