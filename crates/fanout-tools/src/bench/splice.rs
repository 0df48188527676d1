//! `fanout bench splice`: the two ways to copy one TCP stream to N TCP sockets, side by
//! side on the same connections: read the source into a buffer and write it to each sink
//! (what the relay's TCP path does, one vectored write per flush), or keep the bytes in the
//! kernel: `splice` the source into a pipe, `tee` it into one pipe per sink and `splice`
//! each pipe into its socket (the OMSS `sendpage` payload sharing, as user space can have
//! it). The forwarding thread's CPU (its clock includes the loopback delivery it causes) is
//! the cost; receivers drain on another thread.

use super::thread_cpu_s;
use anyhow::{bail, Context};
use clap::Args;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SpliceArgs {
    /// TCP sinks.
    #[arg(long, default_value_t = 500)]
    sinks: usize,
    /// Stream rates to compare, kbit/s.
    #[arg(long, value_delimiter = ',', default_value = "256,2000,8000")]
    rate_kbps: Vec<f64>,
    /// Bytes forwarded per round (one flush of the relay's stream sinks).
    #[arg(long, value_delimiter = ',', default_value = "3200")]
    chunk: Vec<usize>,
    /// Seconds per method and setting.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// A short run (50 sinks, one rate, 2 s) that checks the bench works; CI runs it.
    #[arg(long)]
    quick: bool,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/splice")]
    out: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    Write,
    Splice,
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn check(n: isize) -> std::io::Result<usize> {
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> std::io::Result<usize> {
    // SAFETY: plain descriptors; no user memory is passed.
    check(unsafe { libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, libc::SPLICE_F_MOVE) })
}

fn tee(from: RawFd, to: RawFd, len: usize) -> std::io::Result<usize> {
    // SAFETY: plain descriptors.
    check(unsafe { libc::tee(from, to, len, 0) })
}

/// Connected pairs: (the relay's end, the receiver's end).
fn pairs(n: usize) -> anyhow::Result<Vec<(TcpStream, TcpStream)>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    (0..n)
        .map(|_| {
            let c = TcpStream::connect(l.local_addr()?)?;
            let (s, _) = l.accept()?;
            c.set_nodelay(true)?;
            s.set_nodelay(true)?;
            Ok((s, c))
        })
        .collect()
}

/// Forwards `total` bytes from `src` to every sink in chunks; returns the thread's CPU s.
fn forward(
    method: Method,
    src: &mut TcpStream,
    sinks: &[TcpStream],
    chunk: usize,
    total: usize,
) -> anyhow::Result<f64> {
    let cpu0 = thread_cpu_s();
    let mut buf = vec![0u8; chunk];
    let (pr, pw) = pipe()?;
    let per_sink: Vec<(OwnedFd, OwnedFd)> = match method {
        Method::Splice => (0..sinks.len()).map(|_| pipe()).collect::<Result<_, _>>()?,
        Method::Write => Vec::new(),
    };
    let devnull = std::fs::File::options().write(true).open("/dev/null")?;
    let mut done = 0;
    while done < total {
        let want = chunk.min(total - done);
        match method {
            Method::Write => {
                src.read_exact(&mut buf[..want])?;
                for s in sinks {
                    (&*s).write_all(&buf[..want])?;
                }
            }
            Method::Splice => {
                let mut got = 0;
                while got < want {
                    got += splice(src.as_raw_fd(), pw.as_raw_fd(), want - got)?;
                }
                for (s, (r, w)) in sinks.iter().zip(&per_sink) {
                    let mut t = 0;
                    while t < want {
                        t += tee(pr.as_raw_fd(), w.as_raw_fd(), want - t)?;
                    }
                    let mut o = 0;
                    while o < want {
                        o += splice(r.as_raw_fd(), s.as_raw_fd(), want - o)?;
                    }
                }
                // Drop the source pipe's own reference to the pages.
                let mut d = 0;
                while d < want {
                    d += splice(pr.as_raw_fd(), devnull.as_raw_fd(), want - d)?;
                }
            }
        }
        done += want;
    }
    Ok(thread_cpu_s() - cpu0)
}

pub fn run(mut a: SpliceArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.sinks, a.rate_kbps, a.seconds) = (50, vec![2000.0], 2.0);
    }
    // (method, rate) → µs per sink and chunk, for the plot.
    let mut points: Vec<(Method, f64, f64)> = Vec::new();
    let nofile = fanout_io::sys::raise_nofile_limit(1 << 20);
    if (nofile as usize) < a.sinks * 4 + 64 {
        bail!("{} sinks need {} open files; the limit is {nofile}", a.sinks, a.sinks * 4 + 64);
    }
    super::ensure_dir(&a.out)?;
    let csv_path = a.out.join("splice.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(csv, "method,sinks,rate_kbps,chunk,bytes_per_sink,forward_cpu_s,us_per_sink_chunk,ns_per_sink_byte")?;
    println!("{:>7} {:>9} {:>6} {:>22} {:>9}", "method", "kbit/s", "chunk", "µs per sink and chunk", "vs write");
    for &rate in &a.rate_kbps {
        for &chunk in &a.chunk {
            let mut write_cost = None;
            for method in [Method::Write, Method::Splice] {
                let relay_side = pairs(a.sinks)?;
                let (sinks, receivers): (Vec<_>, Vec<_>) = relay_side.into_iter().unzip();
                let (mut src_rx, mut src_tx) = {
                    let mut p = pairs(1)?;
                    p.pop().context("a source pair")?
                };
                let total = ((rate * 1000.0 / 8.0 * a.seconds) as usize / chunk).max(1) * chunk;
                // The source: paced writes of `chunk` bytes.
                let source = std::thread::spawn(move || -> std::io::Result<()> {
                    let data = vec![0x47u8; chunk];
                    let interval = Duration::from_secs_f64(chunk as f64 * 8.0 / (rate * 1000.0));
                    let start = Instant::now();
                    for k in 0..total / chunk {
                        if let Some(d) = (start + interval * k as u32).checked_duration_since(Instant::now()) {
                            std::thread::sleep(d);
                        }
                        src_tx.write_all(&data)?;
                    }
                    Ok(())
                });
                let stop = Arc::new(AtomicBool::new(false));
                let drained = Arc::new(AtomicU64::new(0));
                let drain = {
                    let (stop, drained) = (stop.clone(), drained.clone());
                    std::thread::spawn(move || {
                        for r in &receivers {
                            let _ = r.set_nonblocking(true);
                        }
                        let mut buf = vec![0u8; 1 << 16];
                        while !stop.load(Ordering::Relaxed) {
                            let mut got = 0;
                            for mut r in &receivers {
                                while let Ok(n) = r.read(&mut buf) {
                                    if n == 0 {
                                        break;
                                    }
                                    got += n as u64;
                                }
                            }
                            drained.fetch_add(got, Ordering::Relaxed);
                            if got == 0 {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                    })
                };
                let cpu = forward(method, &mut src_rx, &sinks, chunk, total)?;
                source.join().map_err(|_| anyhow::anyhow!("source thread panicked"))??;
                let want = (total * a.sinks) as u64;
                let t = Instant::now();
                while drained.load(Ordering::Relaxed) < want && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                stop.store(true, Ordering::Relaxed);
                let _ = drain.join();
                if drained.load(Ordering::Relaxed) != want {
                    bail!("{method:?}: the receivers got {} of {want} bytes", drained.load(Ordering::Relaxed));
                }
                let rounds = (total / chunk * a.sinks) as f64;
                let per = cpu * 1e6 / rounds;
                let per_byte = cpu * 1e9 / (total * a.sinks) as f64;
                let base = *write_cost.get_or_insert(per);
                points.push((method, rate, per));
                writeln!(
                    csv,
                    "{},{},{rate},{chunk},{total},{cpu:.3},{per:.3},{per_byte:.3}",
                    format!("{method:?}").to_lowercase(),
                    a.sinks
                )?;
                println!(
                    "{:>7} {rate:>9} {chunk:>6} {per:>22.3} {:>8.2}x",
                    format!("{method:?}").to_lowercase(),
                    per / base
                );
            }
        }
    }
    let series = [Method::Write, Method::Splice]
        .iter()
        .map(|m| {
            let name = format!("{m:?}").to_lowercase();
            (name, points.iter().filter(|p| p.0 == *m).map(|p| (p.1, p.2)).collect())
        })
        .collect();
    let png = a.out.join("splice.png");
    super::plot::panels(
        &png,
        &format!("TCP fan-out to {} sinks: read + write against splice/tee", a.sinks),
        "stream kbit/s",
        a.rate_kbps.len() > 1,
        &[super::plot::Panel { y_label: "µs per sink and chunk", series, log_y: false }],
    )?;
    println!("\nCSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}
