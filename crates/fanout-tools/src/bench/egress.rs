//! `fanout bench egress`: five sessions behind one egress link too thin for all of them
//! (issue 17's KT_RC across sessions). Two have a reserved rate (class 1), three none
//! (classes 3, 2 and 0); each is owed `--rate-kbps` × `--subscribers`. Round `unlimited`:
//! the relay sends everything and the link's queue drops what does not fit, from every
//! session alike. Round `egress`: the relay's `egress_kbps` is the link's rate (less
//! `--headroom` for IP/UDP headers), and it shares it itself: the reservations first, then
//! the spare capacity by class. Topology ([`Topology`], namespaces this run makes and
//! deletes): the relay, a router, and one subscriber namespace behind a `tc` token bucket at
//! `--link-kbps`. Each session keeps a ring of 128 packets (1.4 s of its stream): what is held
//! back longer is skipped, as a live relay must. Writes `egress.csv` and `egress.png`.

use super::layers::Topology;
use super::{progress, run_tool, start_sub, wait, RelayProc};
use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct EgressArgs {
    /// The egress link's rate (kbit/s on the wire).
    #[arg(long, default_value_t = 30_000)]
    link_kbps: u32,
    /// The link's queue, in milliseconds at its rate.
    #[arg(long, default_value_t = 50)]
    queue_ms: u32,
    /// Each session's stream (kbit/s of 1400-byte datagrams).
    #[arg(long, default_value_t = 1000)]
    rate_kbps: u64,
    /// Subscribers per session.
    #[arg(long, default_value_t = 10)]
    subscribers: usize,
    /// The share of the link left for IP/UDP headers in the `egress` round (the relay counts
    /// datagram bytes).
    #[arg(long, default_value_t = 0.05)]
    headroom: f64,
    /// Seconds each round sends.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// A short run that checks the bench works (6 s a round, 4 subscribers a session).
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// (name, class, share of the egress reserved).
const SESSIONS: [(&str, u8, f64); 5] =
    [("reserved-30", 1, 0.30), ("reserved-20", 1, 0.20), ("class-3", 3, 0.0), ("class-2", 2, 0.0), ("class-0", 0, 0.0)];

const PAYLOAD: usize = 1400;
const RING: usize = 128;

/// What one session's subscribers got in one round.
struct Row {
    round: &'static str,
    session: &'static str,
    class: u8,
    reserve_kbps: u64,
    /// What KT_RC promises it (kbit/s of datagrams): its reservation, then spare by class.
    due_kbps: f64,
    got_kbps: f64,
    loss_pct: f64,
}

pub fn run(mut a: EgressArgs) -> anyhow::Result<()> {
    if a.quick {
        // Still five sessions owed 5/3 of the link: the same contention, smaller and shorter.
        (a.seconds, a.subscribers, a.link_kbps) = (6.0, 4, 12_000);
    }
    anyhow::ensure!(
        a.subscribers >= 1 && a.subscribers <= 200,
        "--subscribers {} is out of range 1..=200",
        a.subscribers
    );
    anyhow::ensure!((0.0..0.5).contains(&a.headroom), "--headroom {} is out of range 0..0.5", a.headroom);
    anyhow::ensure!(a.seconds >= 5.0, "--seconds {} is too short to measure (at least 5)", a.seconds);
    super::ensure_dir(&a.out)?;
    let topo = Topology::new(&[a.link_kbps], a.queue_ms).context("setting up the namespaces (needs root)")?;
    topo.enter_relay()?;
    let egress = (a.link_kbps as f64 * (1.0 - a.headroom)) as u64;
    let mut rows = Vec::new();
    let mut bar = progress(2, "egress");
    for round in ["unlimited", "egress"] {
        bar.set_message(round.to_string());
        let limit = if round == "egress" { egress } else { 0 };
        rows.extend(one_round(&a, &topo, round, limit, egress)?);
        bar.inc(1);
    }
    bar.finish_and_clear();

    let csv = a.out.join("egress.csv");
    let mut f = std::fs::File::create(&csv)?;
    writeln!(f, "round,session,class,reserve_kbps,due_kbps,got_kbps,loss_pct")?;
    for r in &rows {
        writeln!(
            f,
            "{},{},{},{},{},{:.0},{:.2}",
            r.round,
            r.session,
            r.class,
            r.reserve_kbps,
            if r.due_kbps.is_nan() { String::new() } else { format!("{:.0}", r.due_kbps) },
            r.got_kbps,
            r.loss_pct
        )?;
    }
    println!(
        "egress: link {} kbit/s, egress_kbps {egress}, {} sessions each owed {} kbit/s",
        a.link_kbps,
        SESSIONS.len(),
        a.rate_kbps * a.subscribers as u64
    );
    println!(
        "{:<10} {:<12} {:>5} {:>8} {:>8} {:>8} {:>7}",
        "round", "session", "class", "reserve", "due", "got", "loss%"
    );
    for r in &rows {
        println!(
            "{:<10} {:<12} {:>5} {:>8} {:>8.0} {:>8.0} {:>7.2}",
            r.round, r.session, r.class, r.reserve_kbps, r.due_kbps, r.got_kbps, r.loss_pct
        );
    }
    let series = |round: &str| -> Vec<(f64, f64)> {
        rows.iter().filter(|r| r.round == round).enumerate().map(|(i, r)| (i as f64, r.got_kbps)).collect()
    };
    let due: Vec<(f64, f64)> =
        rows.iter().filter(|r| r.round == "egress").enumerate().map(|(i, r)| (i as f64, r.due_kbps)).collect();
    let png = a.out.join("egress.png");
    super::plot::panels(
        &png,
        &format!("Five sessions behind one {} kbit/s link", a.link_kbps),
        "session: 0 reserved 30% (class 1), 1 reserved 20% (class 1), 2 class 3, 3 class 2, 4 class 0",
        false,
        &[super::plot::Panel {
            y_label: "delivered kbit/s (all its subscribers)",
            series: vec![
                ("unlimited: the link drops".into(), series("unlimited")),
                ("egress_kbps: the relay shares".into(), series("egress")),
                ("due: reservation, then class".into(), due),
            ],
            log_y: false,
        }],
    )?;
    println!("wrote {} and {}", csv.display(), png.display());
    Ok(())
}

/// What KT_RC promises each session of `SESSIONS` on an egress of `egress` kbit/s when each
/// is owed `owed`: its reservation (up to what it is owed), then the spare capacity to the
/// higher classes first, the reserved sessions' rest included at their class.
fn due(egress: f64, owed: f64) -> Vec<f64> {
    let mut got: Vec<f64> = SESSIONS.iter().map(|s| (s.2 * egress).min(owed)).collect();
    let mut spare = egress - got.iter().sum::<f64>();
    for class in (0..8u8).rev() {
        let members: Vec<usize> = (0..SESSIONS.len()).filter(|&i| SESSIONS[i].1 == class).collect();
        let want: f64 = members.iter().map(|&i| owed - got[i]).sum();
        if want <= 0.0 || spare <= 0.0 {
            continue;
        }
        let give = spare.min(want);
        for &i in &members {
            got[i] += give * (owed - got[i]) / want;
        }
        spare -= give;
    }
    got
}

fn one_round(
    a: &EgressArgs,
    topo: &Topology,
    round: &'static str,
    limit: u64,
    egress: u64,
) -> anyhow::Result<Vec<Row>> {
    let relay = RelayProc::start(&["--egress-kbps", &limit.to_string()])?;
    let api = relay.client();
    let tmp = std::env::temp_dir().join(format!("fanout-bench-egress-{}", std::process::id()));
    super::ensure_dir(&tmp)?;
    let mut sources = Vec::new();
    let mut subs = Vec::new();
    for (k, (name, class, share)) in SESSIONS.iter().enumerate() {
        // A ring of about a second of the stream, as a live relay keeps: a session held back
        // is lapped and skips ahead instead of delivering seconds late after the round.
        let mut body = json!({"name": name, "source": {"udp": "127.0.0.1:0"}, "priority": class, "ring": RING});
        if limit > 0 && *share > 0.0 {
            body["reserve_kbps"] = json!((share * egress as f64) as u64);
        }
        let v = api.call("POST", "/v1/sessions", Some(body))?;
        sources.push(v["source"]["addr"].as_str().context("the relay did not say its address")?.to_string());
        // The subscribers: consecutive ports in the subscriber namespace, one `sub` each.
        let port = 20_000 + 100 * k;
        let json_path = tmp.join(format!("{name}.json"));
        let args: Vec<String> = [
            "--bind",
            &format!("10.99.0.2:{port}"),
            "--udp",
            &a.subscribers.to_string(),
            "--duration",
            &(a.seconds + 30.0).to_string(),
            "--idle-exit",
            "2",
            "--record",
            &PAYLOAD.to_string(),
            "--json",
            &json_path.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        let ns = std::thread::scope(|s| {
            s.spawn(|| -> anyhow::Result<_> {
                topo.enter_sub(0)?;
                start_sub(&args, Duration::from_secs(20))
            })
            .join()
            .expect("no panic")
        })?;
        subs.push((ns, json_path));
        for i in 0..a.subscribers {
            let sink = json!({"udp": format!("10.99.0.2:{}", port + i)});
            api.call("POST", &format!("/v1/sessions/{name}/sinks"), Some(sink))?;
        }
    }
    let gen_json = tmp.join("gen.json");
    let mut gen: Vec<String> = vec!["gen".into()];
    for s in &sources {
        gen.extend(["--to".into(), s.clone()]);
    }
    gen.extend(
        [
            "--rate-kbps",
            &a.rate_kbps.to_string(),
            "--payload",
            &PAYLOAD.to_string(),
            "--duration",
            &a.seconds.to_string(),
            "--json",
            &gen_json.display().to_string(),
        ]
        .map(String::from),
    );
    run_tool(&gen, Duration::from_secs_f64(a.seconds + 30.0))?;
    // What a session held back is not delivered after the round (it would count a second of
    // late media at the link's full rate as the session's share).
    for (name, _, _) in SESSIONS {
        let _ = api.call("DELETE", &format!("/v1/sessions/{name}"), None);
    }
    let g: Value = serde_json::from_slice(&std::fs::read(&gen_json).context("reading gen's report")?)?;
    let sent = g["packets"].as_u64().unwrap_or(0) / g["streams"].as_u64().unwrap_or(1).max(1);
    let owed = a.rate_kbps as f64 * a.subscribers as f64;
    let due = if limit > 0 { due(egress as f64, owed) } else { vec![f64::NAN; SESSIONS.len()] };
    let mut rows = Vec::new();
    for (k, (mut p, path)) in subs.into_iter().enumerate() {
        wait(&mut p, Duration::from_secs(60))?;
        let r: Value = serde_json::from_slice(&std::fs::read(&path).context("reading sub's report")?)?;
        let _ = std::fs::remove_file(&path);
        let received: u64 = r["groups"].as_array().into_iter().flatten().filter_map(|g| g["received"].as_u64()).sum();
        let expected = (sent * a.subscribers as u64).max(1);
        let (name, class, share) = SESSIONS[k];
        rows.push(Row {
            round,
            session: name,
            class,
            reserve_kbps: if limit > 0 { (share * egress as f64) as u64 } else { 0 },
            due_kbps: due[k],
            got_kbps: owed * received.min(expected) as f64 / expected as f64,
            loss_pct: 100.0 * expected.saturating_sub(received) as f64 / expected as f64,
        });
    }
    let _ = std::fs::remove_file(&gen_json);
    let _ = std::fs::remove_dir(&tmp);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_promise_is_reservations_then_classes() {
        // 28.5 Mbit/s for five sessions owed 10 each: 8.55 and 5.7 reserved, 14.25 spare:
        // 10 to class 3, 4.25 to class 2, none to class 0 or the reserved sessions' rest.
        let d = due(28_500.0, 10_000.0);
        let want = [8_550.0, 5_700.0, 10_000.0, 4_250.0, 0.0];
        for (g, w) in d.iter().zip(want) {
            assert!((g - w).abs() < 1.0, "{d:?}");
        }
    }
}
