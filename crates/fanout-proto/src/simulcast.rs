//! Simulcast (RFC 8853): a WHIP publisher sends its video as several encodings of the same
//! pictures, each an RTP stream of its own named by a RID. The relay ranks them — the largest
//! picture first, by the size a keyframe gives (H.264's SPS, VP8's key frame header), the
//! higher rate first where no size is known — feeds the best one to the path (what RTSP, HLS
//! and every other face get), keeps the others beside it, and gives each WebRTC viewer the
//! one its bandwidth estimate fits ([`pick`]). Bytes and milliseconds in, decisions out.

use crate::rtsp::sdp::Sdp;

/// At most this many encodings are taken from a publisher (browsers send three at most);
/// each is a session with a ring of its own, so an offer of a hundred must not make a
/// hundred. Packets of the others are dropped.
pub const MAX_ENCODINGS: usize = 4;

/// The encodings a WHIP publisher's `answer` receives: the `a=rid:ID recv` lines of its
/// first video section that has any, in their order, the first [`MAX_ENCODINGS`]. Fewer than
/// two: no simulcast.
pub fn rids(answer: &Sdp) -> Vec<String> {
    let received = |m: &crate::rtsp::sdp::Media| -> Vec<String> {
        m.lines
            .iter()
            .filter(|(k, _)| *k == 'a')
            .filter_map(|(_, l)| l.strip_prefix("rid:"))
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                let (id, dir) = (words.next()?, words.next()?);
                (dir == "recv" && !id.is_empty()).then(|| id.to_string())
            })
            .take(MAX_ENCODINGS)
            .collect()
    };
    answer.media.iter().filter(|m| m.kind == "video").map(received).find(|r| !r.is_empty()).unwrap_or_default()
}

/// How long after an encoding's first packet the ranking waits for every encoding's
/// picture size (a publisher starts its higher encodings once its own estimate allows).
pub const DECIDE_MS: u64 = 3000;
/// The rates are measured over windows this long.
const RATE_WINDOW_MS: u64 = 1000;

/// A publisher's encodings: their picture sizes, rates and rank.
#[derive(Debug, Clone)]
pub struct Ranking {
    rids: Vec<String>,
    sizes: Vec<Option<(u16, u16)>>,
    /// Bytes of each encoding in the current rate window, and since its first packet.
    window: Vec<u64>,
    total: Vec<u64>,
    window_start: Option<u64>,
    bps: Vec<f64>,
    first_ms: Option<u64>,
    order: Option<Vec<usize>>,
}

impl Ranking {
    pub fn new(rids: Vec<String>) -> Self {
        let n = rids.len();
        Self {
            rids,
            sizes: vec![None; n],
            window: vec![0; n],
            total: vec![0; n],
            window_start: None,
            bps: vec![0.0; n],
            first_ms: None,
            order: None,
        }
    }

    pub fn rids(&self) -> &[String] {
        &self.rids
    }

    /// The encoding named `rid`.
    pub fn index(&self, rid: &str) -> Option<usize> {
        self.rids.iter().position(|r| r == rid)
    }

    /// An RTP payload of encoding `i`, in `codec` (`H264`, `VP8`, ...), at `now_ms`: whether
    /// the ranking was decided by it.
    pub fn packet(&mut self, i: usize, codec: &str, payload: &[u8], now_ms: u64) -> bool {
        if i >= self.rids.len() {
            return false;
        }
        self.window[i] += payload.len() as u64;
        self.total[i] += payload.len() as u64;
        let start = *self.window_start.get_or_insert(now_ms);
        if now_ms.saturating_sub(start) >= RATE_WINDOW_MS {
            let secs = (now_ms - start) as f64 / 1000.0;
            for (bps, bytes) in self.bps.iter_mut().zip(&mut self.window) {
                let now = *bytes as f64 * 8.0 / secs;
                // Smoothed, as a viewer's estimate is: one window does not move a viewer.
                *bps = if *bps == 0.0 { now } else { 0.5 * *bps + 0.5 * now };
                *bytes = 0;
            }
            self.window_start = Some(now_ms);
        }
        if self.sizes[i].is_none() {
            self.sizes[i] = picture_size(codec, payload);
        }
        if self.order.is_some() {
            return false;
        }
        let first = *self.first_ms.get_or_insert(now_ms);
        if self.sizes.iter().all(Option::is_some) || now_ms.saturating_sub(first) >= DECIDE_MS {
            let mut order: Vec<usize> = (0..self.rids.len()).filter(|&k| self.total[k] > 0).collect();
            let pixels = |k: usize| self.sizes[k].map_or(0, |(w, h)| u32::from(w) * u32::from(h));
            order.sort_by(|&a, &b| pixels(b).cmp(&pixels(a)).then(self.total[b].cmp(&self.total[a])));
            self.order = Some(order);
            return true;
        }
        false
    }

    /// The encodings, best first, once decided (those that sent nothing by then are left out).
    pub fn order(&self) -> Option<&[usize]> {
        self.order.as_deref()
    }

    /// Encoding `i`'s picture size, once a keyframe gave it.
    pub fn size(&self, i: usize) -> Option<(u16, u16)> {
        self.sizes.get(i).copied().flatten()
    }

    /// Encoding `i`'s rate (bits per second), smoothed over the last windows.
    pub fn bps(&self, i: usize) -> f64 {
        self.bps.get(i).copied().unwrap_or(0.0)
    }
}

/// The picture size a keyframe's first RTP payload in `codec` gives: H.264's SPS (alone or
/// in a STAP-A), VP8's key frame header.
pub fn picture_size(codec: &str, payload: &[u8]) -> Option<(u16, u16)> {
    match codec {
        "H264" => crate::whep::nal_units(payload)
            .find(|n| n.first().is_some_and(|b| b & 0x1f == 7))
            .and_then(crate::codec::annexb::sps_dimensions),
        "VP8" => crate::codec::vpx::vp8_keyframe_size(payload),
        _ => None,
    }
}

/// The share of a viewer's estimate its video may take (audio, headers and the estimate's
/// own error take the rest).
const FITS: f64 = 0.85;

/// Which encoding a viewer gets: `bps`, the encodings' rates best first; `estimate`, its
/// bandwidth estimate; `current`, the one it gets now. Up to the best one that fits in
/// [`FITS`] of the estimate; down only when the current one exceeds the whole estimate, so an
/// estimate around a rate does not switch it back and forth. The last one when none fits.
pub fn pick(bps: &[f64], estimate: f64, current: usize) -> usize {
    let Some(last) = bps.len().checked_sub(1) else { return 0 };
    let fits = bps.iter().position(|&r| r <= FITS * estimate).unwrap_or(last);
    let current = current.min(last);
    if fits < current || bps[current] > estimate {
        fits
    } else {
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// str0m's answer to Chromium's offer of two encodings (`h` and `l`) on one transceiver.
    const ANSWER: &str = "v=0\r\no=- 1 2 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n\
        m=video 9 UDP/TLS/RTP/SAVPF 102\r\na=mid:0\r\na=recvonly\r\n\
        a=rtpmap:102 H264/90000\r\na=rid:h recv\r\na=rid:l recv\r\na=simulcast:recv h;l\r\n\
        m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:1\r\na=recvonly\r\na=rtpmap:111 opus/48000/2\r\n";

    #[test]
    fn the_answers_received_rids_in_order() {
        assert_eq!(rids(&Sdp::parse(ANSWER).unwrap()), ["h", "l"]);
        let plain = ANSWER.replace("a=rid:h recv\r\na=rid:l recv\r\n", "");
        assert!(rids(&Sdp::parse(&plain).unwrap()).is_empty());
        // Sent rids are not ours to receive.
        let sent = ANSWER.replace(" recv\r\n", " send\r\n");
        assert!(rids(&Sdp::parse(&sent).unwrap()).is_empty());
        // A hundred offered: the first few taken.
        let many: String = (0..100).map(|k| format!("a=rid:r{k} recv\r\n")).collect();
        let answer = ANSWER.replace("a=rid:h recv\r\na=rid:l recv\r\n", &many);
        assert_eq!(rids(&Sdp::parse(&answer).unwrap()), ["r0", "r1", "r2", "r3"]);
    }

    /// H.264 SPSs of 640×360 and 320×180 (Constrained Baseline, from ffmpeg's libx264:
    /// `-f lavfi -i testsrc=size=640x360 -pix_fmt yuv420p -profile:v baseline`), in STAP-As
    /// with a PPS.
    fn stap(sps: &[u8]) -> Vec<u8> {
        let pps = [0x68, 0xce, 0x3c, 0x80];
        let mut p = vec![0x18];
        for n in [sps, &pps[..]] {
            p.extend_from_slice(&(n.len() as u16).to_be_bytes());
            p.extend_from_slice(n);
        }
        p
    }
    const SPS_640X360: [u8; 25] = [
        0x67, 0x42, 0xc0, 0x1e, 0xd9, 0x00, 0xa0, 0x2f, 0xf9, 0x70, 0x11, 0x00, 0x00, 0x03, 0x00, 0x01, 0x00, 0x00,
        0x03, 0x00, 0x32, 0x0f, 0x16, 0x2e, 0x48,
    ];
    const SPS_320X180: [u8; 25] = [
        0x67, 0x42, 0xc0, 0x0c, 0xd9, 0x01, 0x41, 0x9f, 0x9f, 0x01, 0x10, 0x00, 0x00, 0x03, 0x00, 0x10, 0x00, 0x00,
        0x03, 0x03, 0x20, 0xf1, 0x42, 0xa4, 0x80,
    ];

    #[test]
    fn sps_sizes_come_from_a_stap_a() {
        assert_eq!(picture_size("H264", &stap(&SPS_640X360)), Some((640, 360)));
        assert_eq!(picture_size("H264", &stap(&SPS_320X180)), Some((320, 180)));
        assert_eq!(picture_size("H264", &[0x41, 0x9a, 0x00]), None);
        assert_eq!(picture_size("AV1", &stap(&SPS_640X360)), None);
    }

    #[test]
    fn the_largest_picture_ranks_first_once_every_size_is_known() {
        let mut r = Ranking::new(vec!["l".into(), "h".into()]);
        assert!(!r.packet(0, "H264", &stap(&SPS_320X180), 0));
        assert_eq!(r.order(), None);
        // The larger one sends less, here: size decides, not rate.
        assert!(r.packet(1, "H264", &stap(&SPS_640X360), 10));
        assert_eq!(r.order(), Some(&[1, 0][..]));
        assert_eq!(r.size(1), Some((640, 360)));
        assert!(!r.packet(0, "H264", &[0x41; 500], 20), "decided once");
    }

    #[test]
    fn without_sizes_the_ranking_waits_then_goes_by_rate_and_leaves_out_the_silent() {
        let mut r = Ranking::new(vec!["a".into(), "b".into(), "c".into()]);
        for t in 0..30 {
            r.packet(0, "AV1", &[0; 100], t * 100);
            assert!(!r.packet(1, "AV1", &[0; 300], t * 100), "decided at {t}");
        }
        assert!(r.packet(1, "AV1", &[0; 300], DECIDE_MS));
        assert_eq!(r.order(), Some(&[1, 0][..]));
        // Rates: 1,000 bytes a second and 3,000 (8 and 24 kbit/s).
        assert!((r.bps(1) / r.bps(0) - 3.0).abs() < 0.5, "{} {}", r.bps(0), r.bps(1));
        assert!(r.bps(1) > 20_000.0 && r.bps(1) < 30_000.0, "{}", r.bps(1));
    }

    #[test]
    fn a_viewer_gets_the_best_that_fits_and_is_not_switched_back_and_forth() {
        let bps = [1_000_000.0, 300_000.0, 100_000.0];
        assert_eq!(pick(&bps, 5_000_000.0, 2), 0);
        assert_eq!(pick(&bps, 400_000.0, 0), 1);
        assert_eq!(pick(&bps, 50_000.0, 0), 2, "the last when none fits");
        // Within [rate, rate / FITS] of the current: it stays.
        assert_eq!(pick(&bps, 1_100_000.0, 0), 0);
        assert_eq!(pick(&bps, 1_100_000.0, 1), 1);
        assert_eq!(pick(&[], 1e6, 3), 0);
    }

    proptest! {
        /// Any rates and estimates: a valid index, and what it picks fits unless it is the last.
        #[test]
        fn pick_is_an_index_that_fits(bps in proptest::collection::vec(0.0f64..1e7, 1..5), est in 0.0f64..2e7, cur in 0usize..6) {
            let mut bps = bps;
            bps.sort_by(|a, b| b.total_cmp(a));
            let k = pick(&bps, est, cur);
            prop_assert!(k < bps.len());
            prop_assert!(bps[k] <= est || k == bps.len() - 1);
            // Picking again with the estimate unchanged keeps it.
            prop_assert_eq!(pick(&bps, est, k), k);
        }

        /// Any payloads in any order: no panic; once decided, the order names each sending
        /// encoding once.
        #[test]
        fn any_packets_rank_consistently(packets in proptest::collection::vec((0usize..4, proptest::collection::vec(any::<u8>(), 0..40)), 0..60)) {
            let mut r = Ranking::new(vec!["a".into(), "b".into(), "c".into()]);
            for (t, (i, p)) in packets.iter().enumerate() {
                r.packet(*i, if t % 2 == 0 { "H264" } else { "VP8" }, p, t as u64 * 100);
            }
            if let Some(o) = r.order() {
                let mut seen = o.to_vec();
                seen.sort_unstable();
                seen.dedup();
                prop_assert_eq!(seen.len(), o.len());
                prop_assert!(o.iter().all(|&k| k < 3));
            }
        }
    }
}
