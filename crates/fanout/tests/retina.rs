//! The Rust `retina` RTSP client plays the demo through the relay, over TCP (interleaved,
//! retina's default) and UDP: it depacketizes the demo's H.264 (RFC 6184) into whole frames,
//! the first of them a keyframe (a new client starts at one), in timestamp order.

mod common;
use common::*;
use futures::StreamExt;
use retina::client::{PlayOptions, Session, SessionOptions, SetupOptions, Transport};
use retina::codec::CodecItem;
use std::time::Duration;

async fn play(url: &str, transport: Transport) -> Result<(usize, bool), String> {
    let url = url::Url::parse(url).map_err(|e| e.to_string())?;
    let mut session = Session::describe(url, SessionOptions::default()).await.map_err(|e| e.to_string())?;
    let video = session
        .streams()
        .iter()
        .position(|s| s.media() == "video" && s.encoding_name() == "h264")
        .ok_or("no H.264 video in the description")?;
    session.setup(video, SetupOptions::default().transport(transport)).await.map_err(|e| e.to_string())?;
    let mut frames =
        session.play(PlayOptions::default()).await.map_err(|e| e.to_string())?.demuxed().map_err(|e| e.to_string())?;
    let (mut n, mut first_key, mut last_ts) = (0usize, false, i64::MIN);
    while n < 50 {
        match frames.next().await {
            Some(Ok(CodecItem::VideoFrame(f))) => {
                if n == 0 {
                    first_key = f.is_random_access_point();
                }
                let ts = f.timestamp().elapsed();
                if ts < last_ts {
                    return Err(format!("frame {n}: timestamp went back from {last_ts} to {ts}"));
                }
                last_ts = ts;
                n += 1;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("after {n} frames: {e}")),
            None => break,
        }
    }
    Ok((n, first_key))
}

#[test]
fn retina_plays_the_demo_over_tcp_and_udp() {
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let url = format!("rtsp://{}/demo", rtsp_addr(&relay));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    for transport in [Transport::Tcp(Default::default()), Transport::Udp(Default::default())] {
        let name = transport.to_string();
        let got = rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), play(&url, transport)).await });
        let (frames, first_key) =
            got.unwrap_or_else(|_| panic!("{name}: timed out")).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(frames, 50, "{name}");
        assert!(first_key, "{name}: the first frame should be a keyframe");
    }
}
