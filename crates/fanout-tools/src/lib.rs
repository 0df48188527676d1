//! The traffic tools, apart from the relay they measure: `gen` (a media server emulator),
//! `sub` (a media client emulator), `bench` (the scenarios that run the relay, `gen` and
//! `sub` as separate processes and write CSV + PNG), and the API client they and `fanout
//! ctl` share. The `fanout` binary carries them as subcommands; nothing of the relay's
//! own code is in here.

pub mod bench;
pub mod client;
pub mod gen;
pub mod sub;
mod tls;

/// Nanoseconds on the system-wide monotonic clock: comparable between processes on one host.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU seconds the calling thread has used (precise, including softirq work the kernel did
/// on its time, e.g. the in-kernel fan-out of a datagram it sent over loopback).
pub fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// RTP timestamps of `gen`'s streams: a 90 kHz clock, as video uses.
pub const RTP_HZ: u64 = 90_000;

pub fn rtp_ts(ns: u64) -> u32 {
    (ns as u128 * RTP_HZ as u128 / 1_000_000_000) as u32
}
