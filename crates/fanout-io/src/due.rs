//! What each sink of a group is due in one run, decided without I/O: time comes in as an
//! argument, packets as the run's snapshot of the ring, sinks as their [`Due`] state and what
//! their sockets said (ready, mid-write). The group's task ([`crate::group`]) takes the
//! readiness and errors, calls these in order, and hands the [`Offer`]s to its sender:
//!
//! 1. [`catch_up`]: a sink the ring lapped jumps to the oldest packet held (slowest-sink-drop)
//!    and, in a stream with keyframes, waits for the next one;
//! 2. [`skip_to_awaited`]: a sink waiting for its first packet (a keyframe, or the RTP number
//!    where the kernel stopped serving it) passes over what comes before it;
//! 3. [`stream_flush`]: whether the group's byte-stream sinks are written this run;
//! 4. [`offer`]: how many packets each sink may take now (its virtual clock, the group's
//!    shared link, the egress the sessions share) and in which order the sinks are served.

use crate::engine::EgressSeat;
use crate::packet::Packet;
use fanout_core::{Cursor, Pace, VirtualClock};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a sink that was lapped waits for a keyframe before it is sent whatever comes.
pub(crate) const RESYNC_WAIT: Duration = Duration::from_secs(5);
/// Packets held for a stream sink that force a write before the flush interval is up.
const HOLD_MAX: u64 = 32;

/// A new sink's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Await {
    /// A video keyframe (a cold start): what comes before it is withheld.
    Keyframe,
    /// A video keyframe after the ring lapped the sink: what comes before it is skipped.
    KeyframeAfterLap,
    /// The packet with this RTP sequence number: where the kernel program stopped serving it.
    RtpSeq(u16),
}

/// A sink's bookkeeping: its place in the ring, what it waits for, its pacing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Due {
    pub cursor: Cursor,
    /// What it waits for before it is sent anything, and until when at most.
    pub awaiting: Option<(Await, Instant)>,
    /// Its virtual clock (used when the session paces).
    pub clock: VirtualClock,
}

/// A sink as the run's decisions see it.
pub(crate) trait Seat {
    fn due(&self) -> &Due;
    fn due_mut(&mut self) -> &mut Due;
    /// Its socket (or queue) can take more now.
    fn ready(&self) -> bool;
    /// It has started to write a packet whose rest is pending.
    fn mid_write(&self) -> bool;
    /// A byte stream, written once per flush interval.
    fn is_stream(&self) -> bool;
    /// Its datagrams can carry departure times (`SO_TXTIME`): it is sent from the group's
    /// socket.
    fn stamps(&self) -> bool;
}

/// One sink's share of a run: `count` packets from its cursor on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    /// Its index in the group's sinks.
    pub sink: usize,
    pub count: usize,
    /// Where its packets' departure times start in the run's (when the session stamps them).
    pub departs: Option<usize>,
}

/// How far ahead of its departure time a stamped packet may be handed to the kernel: fq
/// holds a socket's packets for at most 10 s (its default horizon) and 100 a destination
/// (its default flow limit); a quarter of a second, and at most [`STAMP_PACKETS`] full
/// packets at the sink's rate, stays well inside both. It is also the most a sink joining
/// behind a shared link waits for the windows of those that joined with it.
pub(crate) const STAMP_AHEAD: Duration = Duration::from_millis(250);
const STAMP_PACKETS: u64 = 48;

/// A sink's stamping window at `pace`, in nanoseconds, with `room` bytes of the socket its
/// share: what the socket cannot hold is held back here, or it would refuse the send.
fn stamp_ahead(pace: &Pace, room: u64) -> u64 {
    let bytes = (STAMP_PACKETS * 1500).min(room);
    let span = (bytes as u128 * 1_000_000_000 / pace.rate() as u128) as u64;
    span.min(STAMP_AHEAD.as_nanos() as u64)
}

/// A sink's share of a run: the packets of `lens`, in order, while its clock and, behind a
/// shared link, the link's both let them leave by `t + ahead` (0: now). Each leaves when both
/// let it; when stamping (`departs`), the times go there.
/// `next_at`: when the first one held back would be taken.
fn take(
    clock: &mut VirtualClock,
    pace: &Pace,
    mut link: Option<(&mut VirtualClock, &Pace)>,
    t: u64,
    ahead: u64,
    lens: impl Iterator<Item = usize>,
    mut departs: Option<&mut Vec<u64>>,
) -> fanout_core::Allowed {
    let mut count = 0;
    for len in lens {
        let own = clock.departure(pace, t, len);
        let on_link = link.as_ref().map(|(l, lp)| l.departure(lp, t, len));
        let at = own.max(on_link.unwrap_or(0));
        if at > t + ahead {
            return fanout_core::Allowed { count, next_at: Some(at - ahead) };
        }
        clock.depart(pace, at, len);
        // The link is charged where it would place the packet, not where the sink's own
        // clock holds it: the gaps between one sink's packets are the others' to fill.
        if let (Some((l, lp)), Some(on_link)) = (&mut link, on_link) {
            l.depart(lp, on_link, len);
        }
        if let Some(d) = departs.as_deref_mut() {
            d.push(at);
        }
        count += 1;
    }
    fanout_core::Allowed { count, next_at: None }
}

/// Where the run's snapshot of the ring starts: the next packet of the furthest-behind sink
/// that can take anything, but not before the oldest the ring holds.
pub(crate) fn snapshot_start<S: Seat>(sinks: &[S], head: u64, oldest: u64) -> u64 {
    let min = sinks.iter().filter(|k| k.ready()).map(|k| k.due().cursor.next()).min();
    min.unwrap_or(head).max(oldest)
}

/// Slowest-sink-drop: sinks the ring lapped jump to its oldest packet; in a stream with
/// keyframes (`keyed`) they then wait for one, so a decoder resumes at a picture it can start
/// from, not mid-GOP.
pub(crate) fn catch_up<S: Seat>(sinks: &mut [S], oldest: u64, keyed: Option<Duration>, now: Instant) {
    for k in sinks.iter_mut() {
        let d = k.due_mut();
        if d.cursor.catch_up(oldest) > 0 && d.awaiting.is_none() {
            if let Some(wait) = keyed {
                d.awaiting = Some((Await::KeyframeAfterLap, now + wait));
            }
        }
    }
}

/// Sinks waiting for their first packet pass over what comes before it in the snapshot
/// (`snapshot[0]` is ring entry `start`).
pub(crate) fn skip_to_awaited<S: Seat>(sinks: &mut [S], snapshot: &[Arc<Packet>], start: u64, now: Instant) {
    for k in sinks.iter_mut() {
        let ready = k.ready();
        let d = k.due_mut();
        let Some((what, until)) = d.awaiting else { continue };
        // A sink that cannot take anything now (not in the snapshot) looks when it can, and
        // its wait starts over then: a player stalled for longer than the wait must still
        // resume at a keyframe, not at whatever comes when it reads again.
        if !ready || d.cursor.next() < start {
            d.awaiting = Some((what, until.max(now + RESYNC_WAIT)));
            continue;
        }
        let pending = &snapshot[(d.cursor.next() - start) as usize..];
        let first = match what {
            Await::Keyframe | Await::KeyframeAfterLap => {
                pending.iter().position(|p| p.is_keyframe()).map(|i| access_unit_start(pending, i))
            }
            Await::RtpSeq(n) => pending.iter().position(|p| p.is_rtp() && p.data()[2..4] == n.to_be_bytes()),
        };
        let n = match (first, what) {
            (Some(i), _) => i,
            // The unfinished access unit at the end may still turn out to be a keyframe (its
            // delimiter came, its parameter sets have not): it waits in the ring.
            (None, Await::Keyframe | Await::KeyframeAfterLap) => match pending.last() {
                Some(p) if !p.ends_access_unit() => access_unit_start(pending, pending.len() - 1),
                _ => pending.len(),
            },
            (None, Await::RtpSeq(_)) => pending.len(),
        } as u64;
        match what {
            Await::Keyframe => d.cursor.withhold(n),
            Await::KeyframeAfterLap => d.cursor.skip(n),
            Await::RtpSeq(_) => d.cursor.pass(n), // the kernel sent those
        }
        if first.is_some() || now >= until {
            d.awaiting = None;
        }
    }
}

/// The first packet of the access unit `pending[i]` belongs to (a keyframe is marked at its
/// parameter sets, which may follow a delimiter): a sink that starts there gets the picture
/// whole, and a player's parser never takes it for the rest of an earlier one.
fn access_unit_start(pending: &[Arc<Packet>], mut i: usize) -> usize {
    while i > 0 && pending[i - 1].same_access_unit(&pending[i]) {
        i -= 1;
    }
    i
}

/// Whether a group's byte-stream sinks are written this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    /// Write them now.
    Now,
    /// Hold them; if set, wake the group at this time to write them.
    Hold(Option<Instant>),
}

/// Stream sinks are written once per `every`, so each write carries every packet that came
/// meanwhile: fewer, larger writes (and TCP segments) for a bounded delay. `waiting`: the
/// most packets any ready stream sink has not been handed; `due`: when the held ones are
/// written (kept between runs, updated here). Flushes fall on a grid of `every` from
/// `epoch` (one for the process): the groups of a client's tracks (an RTSP client's video
/// and audio, each its own session) flush together, so its writer wakes once per interval.
pub(crate) fn stream_flush(
    waiting: u64,
    due: &mut Option<Instant>,
    every: Duration,
    now: Instant,
    epoch: Instant,
) -> Flush {
    match *due {
        _ if waiting == 0 => Flush::Now,
        Some(at) if now >= at => {
            *due = None;
            Flush::Now
        }
        _ if waiting >= HOLD_MAX => {
            *due = None;
            Flush::Now
        }
        Some(_) => Flush::Hold(None),
        None => {
            let into = now.saturating_duration_since(epoch).as_nanos() % every.as_nanos().max(1);
            *due = Some(now + every - Duration::from_nanos(into as u64));
            Flush::Hold(*due)
        }
    }
}

/// What a run knows besides its sinks.
pub(crate) struct Run<'a> {
    /// The ring entry `snapshot[0]` is, and the ring's head and capacity.
    pub start: u64,
    pub head: u64,
    pub ring: usize,
    /// Whether stream sinks are written this run ([`stream_flush`]).
    pub write_streams: bool,
    /// The session's pace and the clocks' epoch, if it paces; whether its sinks share a link.
    pub pace: Option<(Pace, Instant)>,
    pub shared_link: bool,
    /// Its paced datagrams are handed to the kernel early, stamped with their departure times
    /// (`SO_TXTIME`), not held back here; the bytes the group's socket holds for them.
    pub stamp: Option<u64>,
    /// Its place on the egress the sessions share, if that is limited.
    pub egress: Option<&'a EgressSeat>,
    /// The sink served first ([`fanout_core::rotation`]: it changes each run, so no sink is
    /// always last).
    pub turn: usize,
    pub now: Instant,
}

/// This run's offers into `offers`, in serving order; returns when the first packet a clock
/// held back may leave (or, stamping, when the sink's window has half emptied).
/// A sink more than half a ring behind is sent all it can take: pacing must never be what
/// gets a sink lapped.
/// With `shared_link`, the group's sinks also share one clock (`group_clock`) at the sum of
/// the rates of those with something to send (and one sink's burst): together they never send
/// faster than that, as if behind one link, and each packet's copies leave spread over its
/// interval.
/// With `egress`, what each sink may take is then what is left of the session's place on the
/// egress the sessions share (its reservation, then spare capacity by class).
/// With `stamp`, a paced sink that [stamps](Seat::stamps) takes up to [`stamp_ahead`] more,
/// each packet's departure time (ns from the clocks' epoch; the later of its own clock's and
/// the link's) in `departs`.
pub(crate) fn offer<S: Seat>(
    sinks: &mut [S],
    snapshot: &[Arc<Packet>],
    group_clock: &mut VirtualClock,
    run: &Run,
    offers: &mut Vec<Offer>,
    departs: &mut Vec<u64>,
) -> Option<Instant> {
    offers.clear();
    departs.clear();
    let n = sinks.len();
    if n == 0 {
        return None;
    }
    let (head, now, pace) = (run.head, run.now, run.pace.as_ref());
    // The link's rate: the sum of the rates of the sinks that have something to send (the
    // others, caught up, leave the link to them); stamping, those whose stamped packets are
    // still to leave too.
    let group_pace = pace.filter(|_| run.shared_link).and_then(|(p, epoch)| {
        let t = now.saturating_duration_since(*epoch).as_nanos() as u64;
        let sending =
            |k: &S| k.due().cursor.next() < head || (run.stamp.is_some() && k.stamps() && k.due().clock.ahead(t) > 0);
        let active = sinks.iter().filter(|k| k.ready() && sending(k)).count().max(1);
        Pace::new(p.rate().saturating_mul(active as u64), p.burst(), 0).ok()
    });
    // The socket's room for stamped datagrams, shared by the sinks that have some to send.
    let room = run.stamp.filter(|_| pace.is_some()).map(|room| {
        let stamping = sinks.iter().filter(|k| k.stamps() && k.ready() && k.due().cursor.next() < head).count();
        room / stamping.max(1) as u64
    });
    let mut wake: Option<Instant> = None;
    let mut wake_at = |at: Instant| wake = Some(wake.map_or(at, |w| w.min(at)));
    let mut egress = run.egress.map(|seat| {
        let t = now.saturating_duration_since(seat.egress.epoch).as_nanos() as u64;
        (seat.egress.link.lock(), seat, t)
    });
    let turn = run.turn.min(n - 1);
    for i in (turn..n).chain(0..turn) {
        let k = &mut sinks[i];
        let (ready, mid_write, stream, stamps) = (k.ready(), k.mid_write(), k.is_stream(), k.stamps());
        let d = k.due_mut();
        if !ready || (d.cursor.next() >= head && !mid_write) {
            continue;
        }
        if stream && !run.write_streams && !mid_write {
            continue; // held for the next flush
        }
        // A sink still waiting for a keyframe has nothing to send yet (but the rest of a
        // partial write).
        let pending = match d.awaiting {
            Some(_) => &[][..],
            None => &snapshot[(d.cursor.next() - run.start) as usize..],
        };
        let clocks = (d.clock, *group_clock);
        let mark = departs.len();
        let ahead = pace.zip(room).filter(|_| stamps).map(|((p, _), room)| stamp_ahead(p, room));
        let mut count = match pace {
            Some(_) if pending.len() > run.ring / 2 => pending.len(),
            None => pending.len(),
            Some((pace, epoch)) => {
                let t = now.saturating_duration_since(*epoch).as_nanos() as u64;
                let lens = pending.iter().map(|p| p.len());
                let link = group_pace.as_ref().map(|gp| (&mut *group_clock, gp));
                let stamped = ahead.is_some().then_some(&mut *departs);
                let a = take(&mut d.clock, pace, link, t, ahead.unwrap_or(0), lens, stamped);
                if let Some(at) = a.next_at {
                    // Stamping, it comes back when half its window has gone.
                    wake_at(*epoch + Duration::from_nanos(at + ahead.unwrap_or(0) / 2));
                }
                a.count
            }
        };
        if let Some((link, seat, t)) = egress.as_mut().filter(|_| count > 0) {
            let a = link.admit(seat.slot, *t, pending[..count].iter().map(|p| p.len()));
            if a.count < count {
                count = a.count;
                if let Some((pace, epoch)) = pace {
                    // The clocks count only what leaves (the departure times of a prefix stay).
                    let t = now.saturating_duration_since(*epoch).as_nanos() as u64;
                    (d.clock, *group_clock) = clocks;
                    let lens = pending[..count].iter().map(|p| p.len());
                    let link = group_pace.as_ref().map(|gp| (&mut *group_clock, gp));
                    take(&mut d.clock, pace, link, t, ahead.unwrap_or(0), lens, None);
                }
                if let Some(at) = a.next_at {
                    wake_at(seat.egress.epoch + Duration::from_nanos(at));
                }
            }
        }
        // Sent all it was owed at once (far behind, or unpaced): nothing to stamp.
        let stamped = ahead.is_some() && departs.len() > mark;
        departs.truncate(mark + if stamped { count } else { 0 });
        if count > 0 || mid_write {
            offers.push(Offer { sink: i, count, departs: stamped.then_some(mark) });
        }
    }
    wake
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink with no socket: what it could take is said by the test.
    #[derive(Default)]
    struct TestSink {
        due: Due,
        blocked: bool,
        mid_write: bool,
        stream: bool,
        stamps: bool,
    }

    fn offer_of(sink: usize, count: usize) -> Offer {
        Offer { sink, count, departs: None }
    }

    impl Seat for TestSink {
        fn due(&self) -> &Due {
            &self.due
        }
        fn due_mut(&mut self) -> &mut Due {
            &mut self.due
        }
        fn ready(&self) -> bool {
            !self.blocked
        }
        fn mid_write(&self) -> bool {
            self.mid_write
        }
        fn is_stream(&self) -> bool {
            self.stream
        }
        fn stamps(&self) -> bool {
            self.stamps
        }
    }

    fn at(next: u64) -> TestSink {
        let mut ring = fanout_core::SessionRing::<()>::with_capacity(1 << 20);
        for _ in 0..next {
            ring.publish(());
        }
        TestSink { due: Due { cursor: Cursor::at_head(&ring), ..Due::default() }, ..TestSink::default() }
    }

    /// An RTP packet of `len` bytes: `ts` its timestamp, `marker` ends its access unit,
    /// `key` marks it as starting a keyframe (its parameter sets).
    fn rtp(seq: u16, ts: u32, marker: bool, key: bool, len: usize) -> Arc<Packet> {
        let mut p = Packet::with_capacity(len.max(13));
        let b = p.buf_mut();
        b[0] = 0x80;
        b[1] = 96 | if marker { 0x80 } else { 0 };
        b[2..4].copy_from_slice(&seq.to_be_bytes());
        b[4..8].copy_from_slice(&ts.to_be_bytes());
        b[8..12].copy_from_slice(&7u32.to_be_bytes());
        p.set_len(len.max(13), 12);
        if key {
            p.mark_keyframe();
        }
        Arc::new(p)
    }

    /// Pictures of `per` packets each, from sequence number 0; picture `k` is a keyframe.
    fn pictures(n: u32, per: u16, keys: &[u32]) -> Vec<Arc<Packet>> {
        let mut v = Vec::new();
        for pic in 0..n {
            for i in 0..per {
                // The keyframe mark falls on its second packet (after a delimiter).
                let key = keys.contains(&pic) && i == 1.min(per - 1);
                v.push(rtp((pic * per as u32 + i as u32) as u16, pic * 3600, i == per - 1, key, 200));
            }
        }
        v
    }

    fn run(start: u64, head: u64, now: Instant) -> Run<'static> {
        Run {
            start,
            head,
            ring: 1024,
            write_streams: true,
            pace: None,
            shared_link: false,
            stamp: None,
            egress: None,
            turn: 0,
            now,
        }
    }

    #[test]
    fn a_lapped_sink_jumps_to_the_oldest_and_waits_for_a_keyframe_where_there_are_keyframes() {
        let now = Instant::now();
        let mut sinks = [at(3), at(10), at(12)];
        catch_up(&mut sinks, 10, Some(RESYNC_WAIT), now);
        assert_eq!(sinks[0].due.cursor.next(), 10);
        assert_eq!(sinks[0].due.cursor.skipped, 7);
        assert_eq!(sinks[0].due.awaiting, Some((Await::KeyframeAfterLap, now + RESYNC_WAIT)));
        // Not lapped: untouched.
        assert_eq!((sinks[1].due.cursor.skipped, sinks[1].due.awaiting), (0, None));
        assert_eq!((sinks[2].due.cursor.next(), sinks[2].due.awaiting), (12, None));
        // Without keyframes (audio, TS without video) it goes on from the oldest at once.
        let mut sinks = [at(3)];
        catch_up(&mut sinks, 10, None, now);
        assert_eq!((sinks[0].due.cursor.next(), sinks[0].due.awaiting), (10, None));
    }

    #[test]
    fn the_snapshot_starts_at_the_furthest_behind_ready_sink_but_never_before_the_ring() {
        let mut blocked = at(2);
        blocked.blocked = true;
        assert_eq!(snapshot_start(&[at(5), at(8), blocked], 20, 4), 5);
        assert_eq!(snapshot_start(&[at(1)], 20, 4), 4);
        assert_eq!(snapshot_start::<TestSink>(&[], 20, 4), 20);
    }

    #[test]
    fn a_new_sink_withholds_until_the_keyframe_access_unit_starts() {
        let now = Instant::now();
        let snap = pictures(4, 3, &[2]); // the keyframe is marked at entry 7, its picture starts at 6
        let mut sinks = [at(0)];
        sinks[0].due.awaiting = Some((Await::Keyframe, now + RESYNC_WAIT));
        skip_to_awaited(&mut sinks, &snap, 0, now);
        let d = &sinks[0].due;
        assert_eq!((d.cursor.next(), d.cursor.withheld, d.cursor.skipped, d.awaiting), (6, 6, 0, None));
    }

    #[test]
    fn a_lapped_sink_skips_to_the_keyframe_and_counts_what_it_lost() {
        let now = Instant::now();
        let snap = pictures(4, 3, &[1]);
        let mut sinks = [at(0)];
        sinks[0].due.awaiting = Some((Await::KeyframeAfterLap, now + RESYNC_WAIT));
        skip_to_awaited(&mut sinks, &snap, 0, now);
        let d = &sinks[0].due;
        assert_eq!((d.cursor.next(), d.cursor.skipped, d.cursor.withheld, d.awaiting), (3, 3, 0, None));
    }

    #[test]
    fn an_unfinished_picture_at_the_end_waits_in_the_ring_it_may_be_the_keyframe() {
        let now = Instant::now();
        let mut snap = pictures(2, 3, &[]);
        snap.push(rtp(6, 3 * 3600, false, false, 200)); // a delimiter; its picture goes on
        let mut sinks = [at(0)];
        sinks[0].due.awaiting = Some((Await::Keyframe, now + RESYNC_WAIT));
        skip_to_awaited(&mut sinks, &snap, 0, now);
        assert_eq!(sinks[0].due.cursor.next(), 6, "passes the two whole pictures, keeps the third");
        assert!(sinks[0].due.awaiting.is_some());
        // Once the wait is over, it is sent what comes.
        skip_to_awaited(&mut sinks, &snap, 0, now + RESYNC_WAIT);
        assert_eq!(sinks[0].due.awaiting, None);
    }

    #[test]
    fn a_sink_the_kernel_served_passes_what_it_already_got() {
        let now = Instant::now();
        let snap = pictures(3, 2, &[]);
        let mut sinks = [at(0)];
        sinks[0].due.awaiting = Some((Await::RtpSeq(4), now + Duration::from_secs(1)));
        skip_to_awaited(&mut sinks, &snap, 0, now);
        let c = sinks[0].due.cursor;
        // Moved past, neither sent by user space nor lost.
        assert_eq!((c.next(), c.received, c.skipped, c.withheld), (4, 0, 0, 0));
        assert_eq!(sinks[0].due.awaiting, None);
    }

    #[test]
    fn a_blocked_waiting_sink_starts_its_wait_over_when_it_can_read_again() {
        let now = Instant::now();
        let snap = pictures(2, 2, &[]);
        let mut sinks = [at(0)];
        sinks[0].blocked = true;
        sinks[0].due.awaiting = Some((Await::KeyframeAfterLap, now));
        let later = now + Duration::from_secs(30);
        skip_to_awaited(&mut sinks, &snap, 0, later);
        assert_eq!(sinks[0].due.awaiting, Some((Await::KeyframeAfterLap, later + RESYNC_WAIT)));
        assert_eq!(sinks[0].due.cursor.next(), 0);
    }

    #[test]
    fn unpaced_sinks_get_all_they_lack_from_a_turn_that_changes() {
        let now = Instant::now();
        let snap = pictures(5, 2, &[]);
        let mut sinks = [at(0), at(4), at(10), at(7)];
        let mut offers = Vec::new();
        let mut r = run(0, 10, now);
        r.turn = 2;
        let wake = offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
        assert_eq!(wake, None);
        // From sink 2 on; sink 2 is caught up, so it has no offer.
        assert_eq!(offers, [offer_of(3, 3), offer_of(0, 10), offer_of(1, 6)]);
    }

    #[test]
    fn stream_sinks_wait_for_the_flush_but_finish_a_packet_they_started() {
        let now = Instant::now();
        let snap = pictures(2, 2, &[]);
        let mut sinks = [at(0), at(0), at(0)];
        sinks[0].stream = true;
        sinks[1].stream = true;
        sinks[1].mid_write = true;
        let mut offers = Vec::new();
        let mut r = run(0, 4, now);
        r.write_streams = false;
        offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
        assert_eq!(offers, [offer_of(1, 4), offer_of(2, 4)]);
        // A sink waiting for a keyframe is offered only the rest of its write.
        sinks[1].due.awaiting = Some((Await::Keyframe, now));
        r.write_streams = true;
        offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
        assert_eq!(offers[1], offer_of(1, 0));
    }

    #[test]
    fn a_paced_sink_gets_its_burst_and_a_time_to_come_back_unless_half_a_ring_behind() {
        let now = Instant::now();
        let snap: Vec<_> = (0..20).map(|i| rtp(i, 0, true, false, 1000)).collect();
        let pace = Pace::new(100_000, 3000, 1000).unwrap(); // 3 packets back to back, then 1 per 10 ms
        let mut r = run(0, 20, now);
        r.pace = Some((pace, now));
        let mut sinks = [at(0)];
        let mut offers = Vec::new();
        let wake = offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new())
            .expect("a wake-up");
        assert_eq!(offers, [offer_of(0, 3)]);
        let after = wake.duration_since(now);
        assert!(after > Duration::ZERO && after <= Duration::from_millis(10), "{after:?}");
        // With a ring of 32, 20 pending is more than half: all of it, no wake-up.
        r.ring = 32;
        let mut sinks = [at(0)];
        let wake = offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
        assert_eq!((offers[0].count, wake), (20, None));
    }

    #[test]
    fn sinks_behind_a_shared_link_share_its_clock() {
        let now = Instant::now();
        let snap: Vec<_> = (0..10).map(|i| rtp(i, 0, true, false, 1000)).collect();
        let pace = Pace::new(100_000, 3000, 1000).unwrap();
        let mut r = run(0, 10, now);
        r.pace = Some((pace, now));
        let alone: usize = {
            let mut sinks = [at(0), at(0)];
            let mut offers = Vec::new();
            offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
            offers.iter().map(|o| o.count).sum()
        };
        assert_eq!(alone, 6, "each its own burst");
        r.shared_link = true;
        let mut sinks = [at(0), at(0)];
        let mut offers = Vec::new();
        let wake = offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
        let shared: usize = offers.iter().map(|o| o.count).sum();
        assert_eq!(shared, 3, "one link's burst between them: {offers:?}");
        assert!(wake.is_some());
    }

    /// Stamping, a sink takes its burst now and up to a window more with the times they may
    /// leave, and is woken when half of the window has gone; behind a shared link each packet
    /// departs when both clocks let it; a sink that cannot stamp is held as before.
    #[test]
    fn stamping_sinks_take_a_window_ahead_with_departure_times() {
        let now = Instant::now();
        let snap: Vec<_> = (0..400).map(|i| rtp(i, 0, true, false, 1000)).collect();
        // 3 packets back to back, then one per 10 ms: a window of 250 ms (48 × 1500 B would
        // be 720).
        let pace = Pace::new(100_000, 3000, 1000).unwrap();
        assert_eq!(stamp_ahead(&pace, 1 << 20), 250_000_000);
        assert_eq!(stamp_ahead(&pace, 10_000), 100_000_000, "what the socket holds");
        let mut r = run(0, 400, now);
        r.pace = Some((pace, now));
        r.stamp = Some(1 << 20);
        let mut sinks = [at(0), at(0)];
        sinks[0].stamps = true;
        let (mut offers, mut departs) = (Vec::new(), Vec::new());
        let wake = offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut departs);
        assert_eq!(offers, [Offer { sink: 0, count: 28, departs: Some(0) }, offer_of(1, 3)]);
        let ms = |k: u64| k * 1_000_000;
        let want: Vec<u64> = [0, 0, 0].into_iter().chain((1..=25).map(|k| ms(10 * k))).collect();
        assert_eq!(departs, want);
        // The unstamped sink wakes the group in 10 ms; alone, the stamping one at 135 ms
        // (the next fits its window at 10 ms, and half the window more).
        assert_eq!(wake, Some(now + Duration::from_millis(10)));
        let mut alone = [at(0)];
        alone[0].stamps = true;
        let wake = offer(&mut alone, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut departs);
        assert_eq!(wake, Some(now + Duration::from_millis(135)));
        // Two stamping sinks share a socket that holds 40 kB: 200 ms ahead each.
        r.stamp = Some(40_000);
        let mut two = [at(0), at(0)];
        two.iter_mut().for_each(|k| k.stamps = true);
        offer(&mut two, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut departs);
        assert_eq!((offers[0].count, offers[1].count), (23, 23));
        r.stamp = Some(1 << 20);

        // Two behind one link: together at the sum of their rates, one burst between them.
        r.shared_link = true;
        let mut sinks = [at(0), at(0)];
        sinks.iter_mut().for_each(|k| k.stamps = true);
        let mut link = VirtualClock::default();
        offer(&mut sinks, &snap, &mut link, &r, &mut offers, &mut departs);
        let (a, b) = (offers[0], offers[1]);
        assert_eq!(a.departs, Some(0));
        let first = &departs[..a.count];
        let second = &departs[b.departs.unwrap()..b.departs.unwrap() + b.count];
        let mut all: Vec<u64> = first.iter().chain(second).copied().collect();
        all.sort();
        // The link's clock: 3 at once, then one per 5 ms (twice the rate) for all of them.
        for (k, t) in all.iter().enumerate().skip(3) {
            assert!(*t >= ms(5 * (k as u64 - 2)), "packet {k} of the link departs at {t}: {all:?}");
        }
        // And each sink's own never faster than its own pace (3 kB, then 100 kB/s): the link
        // holding some back does not bunch the rest onto the sink's own link.
        for d in [first, second] {
            assert!(d.windows(2).all(|w| w[0] <= w[1]));
            for i in 0..d.len() {
                for j in i..d.len() {
                    let bytes = 1000 * (j - i + 1) as u64;
                    assert!(bytes <= 3000 + (d[j] - d[i]) / 10_000, "{d:?}");
                }
            }
        }

        // Unpaced: nothing is stamped.
        r.pace = None;
        offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut departs);
        assert!(offers.iter().all(|o| o.departs.is_none() && o.count == 400) && departs.is_empty());
    }

    #[test]
    fn streams_are_written_per_interval_or_when_enough_is_held() {
        let now = Instant::now();
        let every = Duration::from_millis(40);
        let mut due = None;
        assert_eq!(stream_flush(0, &mut due, every, now, now), Flush::Now, "nothing held: nothing to wait for");
        assert_eq!(
            stream_flush(3, &mut due, every, now, now),
            Flush::Hold(Some(now + every)),
            "the first held arms a timer"
        );
        assert_eq!(stream_flush(5, &mut due, every, now + every / 2, now), Flush::Hold(None), "armed once");
        assert_eq!(stream_flush(5, &mut due, every, now + every, now), Flush::Now);
        assert_eq!(due, None);
        stream_flush(1, &mut due, every, now, now);
        assert_eq!(stream_flush(HOLD_MAX, &mut due, every, now, now), Flush::Now, "too many held");
        assert_eq!(due, None);
        // On the process's grid: a group whose first packet waits a quarter into an interval
        // flushes at its end, with every other group.
        let later = now + every * 7 + every / 4;
        assert_eq!(stream_flush(2, &mut due, every, later, now), Flush::Hold(Some(now + every * 8)));
    }

    proptest::proptest! {
        /// Unpaced, every ready sink with something pending is offered all of it, once, in
        /// the order that starts at the run's turn; the others are not offered anything.
        #[test]
        fn unpaced_offers_are_whole_and_once(
            behind in proptest::collection::vec((0u64..40, proptest::bool::ANY), 1..12),
            turn in 0usize..12,
        ) {
            let head = 40;
            let snap: Vec<_> = (0..head as u16).map(|i| rtp(i, 0, true, false, 100)).collect();
            let mut sinks: Vec<TestSink> = behind.iter().map(|&(b, blocked)| TestSink { blocked, ..at(head - b) }).collect();
            let mut offers = Vec::new();
            let mut r = run(0, head, Instant::now());
            r.turn = turn;
            offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
            // In serving order: from the turn on, round.
            let (n, t) = (sinks.len(), turn.min(sinks.len() - 1));
            let want: Vec<usize> = (t..n).chain(0..t).filter(|&i| !behind[i].1 && behind[i].0 > 0).collect();
            let got: Vec<usize> = offers.iter().map(|o| o.sink).collect();
            proptest::prop_assert_eq!(got, want);
            for o in &offers {
                proptest::prop_assert_eq!(o.count as u64, behind[o.sink].0);
            }
        }

        /// Paced, however the runs fall in time, a sink is never offered more than its burst
        /// and its rate allow since the start.
        #[test]
        fn paced_offers_keep_to_the_rate(gaps in proptest::collection::vec(0u64..30_000_000, 1..40), len in 100usize..1500) {
            let epoch = Instant::now();
            let pace = Pace::new(200_000, 4 * 1500, 1500).unwrap();
            let snap: Vec<_> = (0..400u16).map(|i| rtp(i, 0, true, false, len)).collect();
            let mut sinks = [at(0)];
            let (mut t, mut sent) = (0u64, 0u64);
            let mut offers = Vec::new();
            for gap in gaps {
                t += gap;
                let mut r = run(0, 400, epoch + Duration::from_nanos(t));
                r.pace = Some((pace, epoch));
                offer(&mut sinks, &snap, &mut VirtualClock::default(), &r, &mut offers, &mut Vec::new());
                let n = offers.first().map_or(0, |o| o.count);
                sinks[0].due.cursor.advance(n as u64);
                sent += (n * len) as u64;
                let allowed = pace.burst() + pace.rate() * t / 1_000_000_000 + len as u64;
                proptest::prop_assert!(sent <= allowed, "{} bytes by {} ns, allowed {}", sent, t, allowed);
            }
        }
    }
}
