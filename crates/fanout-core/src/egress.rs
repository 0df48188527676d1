//! One egress link shared by sessions (Yau & Lam's Algorithm KT_RC across streams): each
//! session may have a reserved rate, and under contention the link's capacity goes first to
//! the reservations, then to the classes in order.
//!
//! KT_RC sends, from one queue, the packet with the smallest virtual finish time at its
//! stream's reserved rate. The relay's sessions are sent by parallel workers, not one queue,
//! so the same shares are kept by two kinds of virtual clock ([`VirtualClock`]):
//! - a session's own clock at its reserved rate: a packet within it always leaves (the
//!   reservations together never exceed the link: [`Egress::join`] refuses the one that would);
//! - the link's clock at the link's rate, which every packet moves: a packet beyond its
//!   session's reservation takes spare capacity, and leaves only if the link's clock has room
//!   and no higher class was refused spare capacity within the last [`CLASS_HOLD`] (strict
//!   priority for what is left over).
//!
//! Times are nanoseconds on any monotonic clock the caller chooses; nothing here reads it.

use crate::pace::{Allowed, BadPace, Pace, VirtualClock};
use crate::{Priority, CLASSES};
use thiserror::Error;

/// How long a class refused spare capacity keeps the lower classes from it, in nanoseconds:
/// long enough to span its sinks' paced catch-up between refusals (with 20 ms, a lower
/// class took visibly more of a higher one's share in `bench egress`), short enough that the spare goes
/// back to the lower classes soon after the higher one has caught up.
pub const CLASS_HOLD: u64 = 100_000_000;

/// A session's place on the egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error(
    "a reserved rate of {asked} bytes/s does not fit the egress: {free} of its {link} bytes/s are not reserved yet"
)]
pub struct Overbooked {
    pub asked: u64,
    pub free: u64,
    pub link: u64,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    class: usize,
    /// The reserved rate and the clock that spends it (`None`: no reservation).
    reserve: Option<(Pace, VirtualClock)>,
}

#[derive(Debug, Clone)]
pub struct Egress {
    link: Pace,
    clock: VirtualClock,
    members: Vec<Option<Member>>,
    /// When each class was last refused spare capacity, + 1 (0: never).
    wanted: [u64; CLASSES],
}

impl Egress {
    /// A link of `rate` bytes per second that takes `burst` bytes back to back.
    pub fn new(rate: u64, burst: u64) -> Result<Self, BadPace> {
        Ok(Self {
            link: Pace::new(rate, burst, 0)?,
            clock: VirtualClock::default(),
            members: Vec::new(),
            wanted: [0; CLASSES],
        })
    }

    pub fn rate(&self) -> u64 {
        self.link.rate()
    }

    /// Bytes per second reserved by the sessions on it.
    pub fn reserved(&self) -> u64 {
        self.members.iter().flatten().filter_map(|m| m.reserve.map(|(p, _)| p.rate())).sum()
    }

    /// A session of `class` joins, with `reserve` bytes per second (0: none) and `burst`
    /// bytes of it back to back; refused if the reservations would exceed the link.
    pub fn join(&mut self, class: Priority, reserve: u64, burst: u64) -> Result<Slot, Overbooked> {
        let free = self.link.rate().saturating_sub(self.reserved());
        if reserve > free {
            return Err(Overbooked { asked: reserve, free, link: self.link.rate() });
        }
        // A rate above zero and a burst of at least one byte: `Pace::new` cannot refuse it.
        let reserve =
            (reserve > 0).then(|| (Pace::new(reserve, burst.max(1), 0).expect("valid"), VirtualClock::default()));
        let m = Member { class: usize::from(class.get()), reserve };
        let i = match self.members.iter().position(Option::is_none) {
            Some(i) => {
                self.members[i] = Some(m);
                i
            }
            None => {
                self.members.push(Some(m));
                self.members.len() - 1
            }
        };
        Ok(Slot(i))
    }

    /// The session leaves; its reservation is free again.
    pub fn leave(&mut self, slot: Slot) {
        if let Some(m) = self.members.get_mut(slot.0) {
            *m = None;
        }
    }

    /// How many of the packets of `lens` (a prefix) the session at `slot` may send at
    /// `now`, and when the first one held back may go.
    pub fn admit(&mut self, slot: Slot, now: u64, lens: impl IntoIterator<Item = usize>) -> Allowed {
        let Some(Some(m)) = self.members.get_mut(slot.0) else {
            return Allowed { count: 0, next_at: None };
        };
        let class = m.class;
        let mut count = 0;
        for len in lens {
            if let Some((pace, clock)) = &mut m.reserve {
                if clock.admit(pace, now, [len]).count == 1 {
                    self.clock.charge(&self.link, now, len);
                    count += 1;
                    continue;
                }
            }
            // Spare capacity, the higher classes first.
            if let Some(held) =
                (class + 1..CLASSES).map(|c| self.wanted[c]).filter(|&w| w > 0 && w - 1 + CLASS_HOLD > now).max()
            {
                return Allowed { count, next_at: Some(held - 1 + CLASS_HOLD) };
            }
            let a = self.clock.admit(&self.link, now, [len]);
            if a.count == 0 {
                self.wanted[class] = now + 1;
                return Allowed { count, next_at: a.next_at };
            }
            count += 1;
        }
        Allowed { count, next_at: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn class(c: i64) -> Priority {
        Priority::new(c).unwrap()
    }

    /// Sends `want` bytes per second from each session for `secs`, in 1000-byte packets
    /// every millisecond or so, and returns the bytes each got out.
    fn run(e: &mut Egress, sessions: &[(Slot, u64)], secs: u64) -> Vec<u64> {
        let mut owed = vec![0u64; sessions.len()];
        let mut sent = vec![0u64; sessions.len()];
        for ms in 0..secs * 1000 {
            let now = ms * MS;
            for (i, &(slot, want)) in sessions.iter().enumerate() {
                owed[i] += want / 1000;
                let n = (owed[i] / 1000) as usize;
                let a = e.admit(slot, now, std::iter::repeat_n(1000, n));
                owed[i] -= a.count as u64 * 1000;
                // A live relay drops what it could not send for long (the ring laps it).
                owed[i] = owed[i].min((want / 10).max(1000));
                sent[i] += a.count as u64 * 1000;
            }
        }
        sent
    }

    #[test]
    fn reservations_are_kept_and_the_spare_goes_to_the_higher_class() {
        // A 1 MB/s link; each session wants 600 kB/s.
        let mut e = Egress::new(1_000_000, 10_000).unwrap();
        let a = e.join(class(1), 300_000, 10_000).unwrap();
        let b = e.join(class(1), 200_000, 10_000).unwrap();
        let hi = e.join(class(3), 0, 0).unwrap();
        let lo = e.join(class(2), 0, 0).unwrap();
        let sent = run(&mut e, &[(a, 600_000), (b, 600_000), (hi, 600_000), (lo, 600_000)], 10);
        let rate: Vec<u64> = sent.iter().map(|s| s / 10).collect();
        // The link is used whole (within a packet a millisecond).
        let total: u64 = rate.iter().sum();
        assert!((990_000..=1_011_000).contains(&total), "{rate:?}");
        // Each reservation is met; the spare (500 kB/s) goes to class 3 first.
        assert!(rate[0] >= 300_000 && rate[1] >= 200_000, "{rate:?}");
        assert!(rate[2] >= 450_000, "class 3 takes the spare: {rate:?}");
        assert!(rate[3] < 50_000, "class 2 gets what is left: {rate:?}");
    }

    #[test]
    fn without_contention_everyone_sends_all() {
        let mut e = Egress::new(1_000_000, 10_000).unwrap();
        let a = e.join(class(1), 300_000, 10_000).unwrap();
        let lo = e.join(class(0), 0, 0).unwrap();
        let sent = run(&mut e, &[(a, 200_000), (lo, 500_000)], 5);
        assert!(sent[0] >= 995_000 && sent[1] >= 2_495_000, "{sent:?}");
    }

    #[test]
    fn reservations_beyond_the_link_are_refused_and_freed_on_leaving() {
        let mut e = Egress::new(1_000_000, 10_000).unwrap();
        let a = e.join(class(1), 700_000, 10_000).unwrap();
        assert_eq!(
            e.join(class(7), 400_000, 10_000),
            Err(Overbooked { asked: 400_000, free: 300_000, link: 1_000_000 })
        );
        e.leave(a);
        assert_eq!(e.reserved(), 0);
        assert!(e.join(class(7), 400_000, 10_000).is_ok());
    }

    proptest! {
        /// Whatever the sessions ask, the link never sends more than its rate and burst
        /// beyond what the reservations allow, and every reservation asked in full is met.
        #[test]
        fn the_link_is_never_oversent(wants in proptest::collection::vec((0u64..4, 0u64..3, 0u64..800_000), 1..6)) {
            let mut e = Egress::new(1_000_000, 10_000).unwrap();
            let mut sessions = Vec::new();
            for (c, r, want) in &wants {
                let reserve = r * 100_000;
                let slot = e.join(class(*c as i64), reserve, 10_000).unwrap_or_else(|_| e.join(class(*c as i64), 0, 0).unwrap());
                sessions.push((slot, *want));
            }
            let sent = run(&mut e, &sessions, 2);
            let total: u64 = sent.iter().sum();
            // Each reservation has a burst of its own (10 kB) beside the link's: reservations
            // that fill the link may each use theirs once (five of 200 kB/s sent 1 kB over
            // the link's own burst).
            let reserved_bursts = 10_000 * sessions.iter().filter(|(slot, _)| e.members[slot.0].unwrap().reserve.is_some()).count() as u64;
            prop_assert!(total <= 2 * 1_000_000 + 10_000 + reserved_bursts + 1000 * sessions.len() as u64, "{sent:?}");
            for (i, (slot, want)) in sessions.iter().enumerate() {
                let m = e.members[slot.0].unwrap();
                if let Some((p, _)) = m.reserve {
                    let due = p.rate().min(*want) * 2;
                    prop_assert!(sent[i] + 2000 >= due * 99 / 100, "session {i}: {sent:?} of {due}");
                }
            }
        }
    }
}
