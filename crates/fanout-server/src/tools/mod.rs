//! The traffic tools: `gen` (media server emulator) and `sub` (media client emulator).

pub mod gen;
pub mod sub;

/// Nanoseconds on the system-wide monotonic clock: comparable between processes on one host.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// RTP timestamps of `gen`'s streams: a 90 kHz clock, as video uses.
pub const RTP_HZ: u64 = 90_000;

pub fn rtp_ts(ns: u64) -> u32 {
    (ns as u128 * RTP_HZ as u128 / 1_000_000_000) as u32
}
