//! `fanout`: a live media relay. One binary, several subcommands: the relay
//! (`fanout_server`), its control client, and the traffic tools and benches
//! (`fanout_tools`), which the relay itself does not depend on.

mod ctl;

use clap::{Parser, Subcommand};
use fanout_server::serve::{serve, ServeArgs};
use fanout_tools::{bench, gen, sub};

#[derive(Parser)]
#[command(name = "fanout", version, about = "Live media relay: receive a stream once, deliver it to many subscribers.")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the relay: control API, HTTP streams, and the built-in `demo` session.
    ///
    /// With no config it listens on 127.0.0.1:7070 and plays a test pattern at
    /// http://127.0.0.1:7070/v1/sessions/demo/stream (try ffplay on it).
    Serve(ServeArgs),
    /// Talk to a running relay's control API.
    Ctl(ctl::CtlArgs),
    /// Media server emulator: K paced RTP streams, or a TS/H.264/HEVC file, to a relay.
    Gen(gen::GenArgs),
    /// Media client emulator: many subscribers in one process, with loss, latency, jitter.
    Sub(sub::SubArgs),
    /// Measure the relay: the OMSS evaluation (bulk, payload, overload) and data-path
    /// comparisons, each writing CSV + PNG.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Serve(a) => serve(a),
        Cmd::Ctl(a) => ctl::run(a),
        Cmd::Gen(a) => gen::run(a),
        Cmd::Sub(a) => sub::run(a),
        Cmd::Bench(c) => bench::run(c),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fanout: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
