//! `fanout bench transcode`: what a path's audio transcoded for its readers costs, both ways:
//! the demo clip's AAC RTP depacketized, decoded, resampled where needed and encoded to Opus
//! (for WebRTC viewers), that Opus decoded and encoded to AAC (a WHIP publisher's, for FLV,
//! MPEG-TS and SRT players), and a camera's G.711 (µ-law, 20 ms packets of a two-tone mix)
//! raised to 48 kHz and encoded to AAC, lap after lap, in process; the thread's CPU time per
//! second of audio. The work is once per path, whatever its readers.

use super::{plot, thread_cpu_s};
use anyhow::Context;
use clap::Args;
use fanout_proto::container::repack::{Repackager, TrackCodec, TrackInfo};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct TranscodeArgs {
    /// Rounds.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// CPU seconds per round, at least.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// A short run that checks the bench works.
    #[arg(long)]
    quick: bool,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/transcode")]
    out: PathBuf,
}

pub fn run(a: TranscodeArgs) -> anyhow::Result<()> {
    let (rounds, seconds) = if a.quick { (1, 0.05) } else { (a.rounds, a.seconds) };
    fanout_media::opus::available().map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let clip = fanout_io::DemoClip::new(fanout_io::DEMO_TS).map_err(|e| anyhow::anyhow!("demo clip: {e}"))?;
    let (tracks, _) = clip.rtp_tracks();
    let audio = tracks.iter().find(|t| t.media.starts_with("m=audio")).context("the demo has AAC")?;
    let sdp = fanout_proto::rtsp::sdp::Sdp::parse(&format!("v=0\r\ns=x\r\nt=0 0\r\n{}", audio.media))
        .map_err(|e| anyhow::anyhow!("demo SDP: {e}"))?;
    let info = TrackInfo::from_sdp(&sdp.media[0]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let TrackCodec::Aac { config, .. } = &info.codec else { anyhow::bail!("the demo's audio is not AAC") };
    let lap = audio.rtp_packets(0x1234_5678);
    let lap_90k = audio.lap_90k();
    // One lap of the clip as Opus (what a WHIP publisher sends), for the other direction.
    let opus_lap: Vec<(Vec<u8>, i64)> = {
        let mut r = Repackager::new(vec![Some(info.clone())]);
        let mut coder = fanout_media::AacToOpus::new(config).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (mut units, mut packets) = (Vec::new(), Vec::new());
        for (due, pkt) in &lap {
            r.push_rtp(0, pkt, due / 90, &mut units);
            for u in units.drain(..) {
                coder.push(&u.data, u.time * 48_000 / 90_000, &mut packets);
            }
        }
        packets
    };
    // The same length of G.711 µ-law, each sample the code that expands nearest to it.
    let g711_lap: Vec<(Vec<u8>, i64)> = {
        let samples = (lap_90k * 8000 / 90_000) as usize;
        let code = |x: f64| (0..=255u8).min_by_key(|&b| (i32::from(fanout_media::g711::ulaw(b)) - x as i32).abs());
        let tone = |k: usize, hz: f64| (2.0 * std::f64::consts::PI * hz * k as f64 / 8000.0).sin();
        let bytes: Vec<u8> =
            (0..samples).filter_map(|k| code(8000.0 * tone(k, 440.0) + 4000.0 * tone(k, 1300.0))).collect();
        bytes.chunks(160).enumerate().map(|(k, p)| (p.to_vec(), k as i64 * 960)).collect()
    };
    let channels = fanout_media::AacToOpus::new(config).map_err(|e| anyhow::anyhow!("{e}"))?.channels();
    let csv_path = a.out.join("transcode.csv");
    let mut csv = std::fs::File::create(&csv_path).with_context(|| format!("creating {}", csv_path.display()))?;
    writeln!(csv, "round,direction,audio_s,cpu_s,core_pct_per_path,units_made")?;
    let mut series: Vec<(String, Vec<(f64, f64)>)> =
        ["AAC to Opus", "Opus to AAC", "G.711 to AAC"].iter().map(|n| (n.to_string(), Vec::new())).collect();
    let mut bar = super::progress(series.len() as u64 * rounds as u64, "transcode");
    for round in 1..=rounds {
        for (k, (name, points)) in series.iter_mut().enumerate() {
            // Laps of the clip through this direction until `seconds` of CPU are spent.
            let (t0, mut laps, mut made) = (thread_cpu_s(), 0u64, 0u64);
            let failed = |e: fanout_media::MediaError| anyhow::anyhow!("{e}");
            let mut to_opus = if k == 0 { Some(fanout_media::AacToOpus::new(config).map_err(failed)?) } else { None };
            let mut to_aac = match k {
                1 => Some((fanout_media::ToAac::of_opus(channels).map_err(failed)?, &opus_lap)),
                2 => Some((fanout_media::ToAac::of_g711(true), &g711_lap)),
                _ => None,
            };
            let mut r = Repackager::new(vec![Some(info.clone())]);
            let (mut units, mut out) = (Vec::new(), Vec::new());
            while thread_cpu_s() - t0 < seconds {
                let shift = laps * lap_90k;
                if let Some(coder) = to_opus.as_mut() {
                    for (due, pkt) in &lap {
                        let mut p = pkt.clone();
                        let ts0 = u32::from_be_bytes(p[4..8].try_into().expect("an RTP header"));
                        let ts = ts0.wrapping_add((shift * u64::from(audio.clock) / 90_000) as u32);
                        p[4..8].copy_from_slice(&ts.to_be_bytes());
                        r.push_rtp(0, &p, (due + shift) / 90, &mut units);
                        for u in units.drain(..) {
                            coder.push(&u.data, u.time * 48_000 / 90_000, &mut out);
                        }
                    }
                }
                if let Some((coder, input)) = to_aac.as_mut() {
                    for (packet, time) in input.iter() {
                        coder.push(packet, time + (shift * 48_000 / 90_000) as i64, &mut out);
                    }
                }
                made += out.len() as u64;
                out.clear();
                laps += 1;
            }
            let cpu = thread_cpu_s() - t0;
            let audio_s = (laps * lap_90k) as f64 / 90_000.0;
            let pct = cpu / audio_s * 100.0;
            writeln!(csv, "{round},{name},{audio_s:.1},{cpu:.4},{pct:.4},{made}")?;
            points.push((round as f64, pct));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let png = a.out.join("transcode.png");
    plot::panels(
        &png,
        "A path's audio transcoded once for its readers: CPU per second of audio",
        "round",
        false,
        &[plot::Panel { y_label: "% of a core per path", series: series.clone(), log_y: false }],
    )?;
    for (name, points) in &series {
        let mean = points.iter().map(|p| p.1).sum::<f64>() / points.len().max(1) as f64;
        println!("{name}: {mean:.3}% of a core per transcoded path ({:.0} paths a core)", 100.0 / mean);
    }
    println!("wrote {} and {}", csv_path.display(), png.display());
    Ok(())
}
