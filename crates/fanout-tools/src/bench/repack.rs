//! `fanout bench repack`: what repackaging for HTTP players costs, per RTP packet of the
//! session, stage by stage: depacketizing into access units (`proto::repack`), then MPEG-TS
//! (`TsPackager`), then HLS segments (`hls::Segmenter`, fMP4). In process, on the demo clip's
//! RTP (H.264 + AAC), lap after lap, the stages in alternating rounds; the thread's CPU time.
//! The work is once per session: a subscriber's share is this divided by the subscribers.

use super::{plot, thread_cpu_s};
use anyhow::Context;
use clap::Args;
use fanout_proto::container::hls::Segmenter;
use fanout_proto::container::repack::{Repackager, TrackInfo, TsPackager};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct RepackArgs {
    /// Rounds per stage (alternating).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// CPU seconds per stage and round, at least.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// A short run that checks the bench works; CI runs it.
    #[arg(long)]
    quick: bool,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/repack")]
    out: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Depacketize,
    Ts,
    TsAndHls,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Depacketize => "depacketize",
            Stage::Ts => "depacketize+ts",
            Stage::TsAndHls => "depacketize+ts+hls",
        }
    }
}

pub fn run(a: RepackArgs) -> anyhow::Result<()> {
    let (rounds, seconds) = if a.quick { (1, 0.05) } else { (a.rounds, a.seconds) };
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let clip = fanout_io::DemoClip::new(fanout_io::DEMO_TS).map_err(|e| anyhow::anyhow!("demo clip: {e}"))?;
    let (tracks, _) = clip.rtp_tracks();
    let sdp = format!("v=0\r\ns=x\r\nt=0 0\r\n{}", tracks.iter().map(|t| t.media.as_str()).collect::<String>());
    let sdp = fanout_proto::rtsp::sdp::Sdp::parse(&sdp).map_err(|e| anyhow::anyhow!("demo SDP: {e}"))?;
    let infos: Vec<Option<TrackInfo>> = sdp.media.iter().map(|m| TrackInfo::from_sdp(m).ok()).collect();
    // One lap of both tracks in arrival order: (due 90 kHz, track, packet).
    let mut lap: Vec<(u64, usize, Vec<u8>)> = tracks
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.rtp_packets(0x1234_5678 + i as u32).into_iter().map(move |(due, p)| (due, i, p)))
        .collect();
    lap.sort_by_key(|p| p.0);
    let lap_90k = tracks.first().map_or(90_000, |t| t.lap_90k());
    let lap_s = lap_90k as f64 / 90_000.0;
    let pps = lap.len() as f64 / lap_s;
    let csv_path = a.out.join("repack.csv");
    let mut csv = std::fs::File::create(&csv_path).with_context(|| format!("creating {}", csv_path.display()))?;
    writeln!(csv, "round,stage,packets,cpu_s,ns_per_packet,core_pct_at_demo_rate")?;
    let stages = [Stage::Depacketize, Stage::Ts, Stage::TsAndHls];
    let mut series: Vec<(String, Vec<(f64, f64)>)> =
        stages.iter().map(|s| (s.name().to_string(), Vec::new())).collect();
    let mut bar = super::progress((rounds * stages.len()) as u64, "repack");
    // HLS: how long each access unit waits, from its arrival to the publication of its
    // segment and of its Low-Latency part (the latency the segmenting adds before any
    // player's buffer), over the first laps of the first round.
    let mut waits = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    for round in 1..=rounds {
        for (k, &stage) in stages.iter().enumerate() {
            let mut r = Repackager::new(infos.clone());
            let mut ts = TsPackager::new(r.streams());
            // As the relay cuts them (fanout-server's HLS_TARGET_MS and HLS_PART_MS).
            let mut seg = Segmenter::with_parts(r.streams(), 2000, 500, 1).context("the demo has H.264 and AAC")?;
            let (mut units, mut bytes) = (Vec::new(), Vec::new());
            let (t0, mut packets, mut laps) = (thread_cpu_s(), 0u64, 0u64);
            while thread_cpu_s() - t0 < seconds {
                // Each lap continues the last one's RTP times and arrival clock.
                let shift = laps * lap_90k;
                for (due, track, pkt) in &lap {
                    let mut p = pkt.clone();
                    let clock = if *track == 0 { 90_000 } else { tracks[*track].clock };
                    let ts0 = u32::from_be_bytes(p[4..8].try_into().expect("an RTP header"));
                    let ts1 = ts0.wrapping_add((shift * u64::from(clock) / 90_000) as u32);
                    p[4..8].copy_from_slice(&ts1.to_be_bytes());
                    r.push_rtp(*track, &p, (due + shift) / 90, &mut units);
                    for u in units.drain(..) {
                        if stage != Stage::Depacketize {
                            ts.write(&u, &mut bytes);
                            bytes.clear();
                        }
                        let measure = stage == Stage::TsAndHls && round == 1 && laps < 4;
                        let before = seg.progress().last;
                        if stage == Stage::TsAndHls && seg.push(&u) && measure {
                            // A part is out, and maybe a segment: what waited for it waited this long.
                            let now = due + shift;
                            let segment = seg.progress().last != before;
                            for (k, (delays, waiting)) in waits.iter_mut().enumerate() {
                                if k == 1 || segment {
                                    delays.extend(waiting.drain(..).map(|at: u64| (now - at) as f64 / 90.0));
                                }
                            }
                        }
                        if measure {
                            waits.iter_mut().for_each(|w| w.1.push(due + shift));
                        }
                    }
                    packets += 1;
                }
                laps += 1;
            }
            let cpu = thread_cpu_s() - t0;
            let ns = cpu * 1e9 / packets as f64;
            let core_pct = ns * 1e-9 * pps * 100.0;
            writeln!(csv, "{round},{},{packets},{cpu:.4},{ns:.1},{core_pct:.4}", stage.name())?;
            series[k].1.push((round as f64, ns));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let png = a.out.join("repack.png");
    plot::panels(
        &png,
        &format!("Repackaging RTP ({pps:.0} pkt/s): CPU per packet"),
        "round",
        false,
        &[plot::Panel { y_label: "ns per RTP packet", series: series.clone(), log_y: false }],
    )?;
    let mut wait_csv = String::from("published,units,mean_ms,median_ms,max_ms\n");
    for ((delays, _), what) in waits.iter_mut().zip(["2 s segment", "0.5 s part"]) {
        if delays.is_empty() {
            continue;
        }
        delays.sort_by(f64::total_cmp);
        let mean = delays.iter().sum::<f64>() / delays.len() as f64;
        let (p50, max) = (delays[delays.len() / 2], delays[delays.len() - 1]);
        wait_csv.push_str(&format!("{what},{},{mean:.0},{p50:.0},{max:.0}\n", delays.len()));
        println!(
            "HLS: an access unit waits {mean:.0} ms on average (median {p50:.0}, at most {max:.0}) for its {what}"
        );
    }
    std::fs::write(a.out.join("repack-hls-wait.csv"), wait_csv)?;
    for (name, pts) in &series {
        let mean = pts.iter().map(|p| p.1).sum::<f64>() / pts.len().max(1) as f64;
        println!(
            "{name:>20}: {mean:8.0} ns per packet, {:.4}% of a core at the demo's {pps:.0} packets/s",
            mean * 1e-9 * pps * 100.0
        );
    }
    println!("wrote {} and {}", csv_path.display(), png.display());
    Ok(())
}
