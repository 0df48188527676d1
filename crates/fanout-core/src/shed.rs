//! Overload shedding: which classes to stop serving when the relay cannot serve them all.
//!
//! Strict priority alone does not protect the top class on a crowded host. A worker that
//! took a low-class sink group sends its whole backlog before it looks at the queues again,
//! and the scheduler may take the CPU away from it in the middle; every class then waits
//! alike and is lapped alike. The [`Shedder`] watches how long the tasks of the classes
//! still served wait for a worker. When they keep waiting longer than `high`, the lowest
//! class still served is shed: its sources read and drop what arrives, so its work never
//! reaches the workers. After `recover` with every wait short again, the highest shed class
//! is served again; if that brings the overload back at once, the next try waits twice as
//! long. Only a class below a late one is shed: a class that waits behind higher classes is
//! not helped by dropping its own work. The top class with work is never shed. Sans-IO:
//! waits and times in, a level out.

use crate::{Priority, CLASSES};

/// A class counts as present while it had work this recently.
const ACTIVE_NS: u64 = 2_000_000_000;
/// Late waits less than this apart belong to one spell of lateness ...
const SPELL_GAP_NS: u64 = 100_000_000;
/// ... which is overload once it holds this many late tasks (one is not overload) ...
const LATE_IN_SPELL: u32 = 2;
/// ... and has lasted this long: a stall of a few tens of ms, a busy neighbour's burst, is
/// not overload either (shedding would cost the class a second or more). A task that
/// waited long was late for all of its wait past `high`: under starvation, when tasks are
/// run seldom, one late task shows a long spell at once.
const SPELL_NS: u64 = 300_000_000;
/// A class shed after this short a try is tried again only after twice the time, up to
/// this many doublings.
const MAX_BACKOFF: u32 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShedConfig {
    /// A served task waiting longer than this is late.
    pub high_ns: u64,
    /// Waits below this are calm.
    pub low_ns: u64,
    /// After shedding a class, time to see its effect before shedding another.
    pub hold_ns: u64,
    /// Calm time before a shed class is served again (doubled after a failed try).
    pub recover_ns: u64,
}

impl ShedConfig {
    /// Shedding after waits of `high_ms` (the others scale with it).
    pub fn after_ms(high_ms: u64) -> Self {
        let high_ns = high_ms * 1_000_000;
        // The hold is at most a quarter second: a starved relay that must shed two classes
        // loses the top class's media while it waits to shed the second.
        let hold_ns = (high_ns * 12).clamp(100_000_000, 250_000_000);
        Self { high_ns, low_ns: high_ns / 4, hold_ns, recover_ns: 1_000_000_000 }
    }
}

#[derive(Debug, Clone, Copy)]
struct Spell {
    since: u64,
    last: u64,
    count: u32,
    class: u8,
}

#[derive(Debug)]
pub struct Shedder {
    cfg: ShedConfig,
    /// Classes below this are shed (0: none).
    level: u8,
    /// When the level last changed.
    changed_ns: Option<u64>,
    /// When each class last had a task, +1 (0: never).
    seen: [u64; CLASSES],
    /// The spell of lateness now: since when, the last late wait, how many, the highest
    /// class late in it.
    spell: Option<Spell>,
    /// Since when every served wait was calm.
    calm_since: Option<u64>,
    /// Doublings of `recover` (a served-again class that had to be shed again at once).
    backoff: u32,
    /// When a class was last served again, until the next shed.
    restored_ns: Option<u64>,
}

impl Shedder {
    pub fn new(cfg: ShedConfig) -> Self {
        Self {
            cfg,
            level: 0,
            changed_ns: None,
            seen: [0; CLASSES],
            spell: None,
            calm_since: None,
            backoff: 0,
            restored_ns: None,
        }
    }

    /// Whether work of `class` is shed now.
    pub fn is_shed(&self, class: Priority) -> bool {
        class.get() < self.level
    }

    /// Classes below this are shed (0: none).
    pub fn level(&self) -> u8 {
        self.level
    }

    fn active(&self, now: u64) -> impl Iterator<Item = u8> + '_ {
        (0..CLASSES as u8).filter(move |&c| {
            let s = self.seen[usize::from(c)];
            s != 0 && now.saturating_sub(s - 1) <= ACTIVE_NS
        })
    }

    /// `class` has work queued at `now`: it is present even while higher classes starve it
    /// of workers (its waits are then never observed). A starved class is shed like a
    /// served one, so its sources drop what arrives instead of queueing seconds of media.
    pub fn waiting(&mut self, class: Priority, now: u64) {
        self.seen[usize::from(class.get())] = now + 1;
    }

    /// A task of `class` waited `wait_ns` for a worker; returns the level after it.
    pub fn observe(&mut self, class: Priority, wait_ns: u64, now: u64) -> u8 {
        self.seen[usize::from(class.get())] = now + 1;
        let top = self.active(now).max().unwrap_or(0);
        // Classes that went away are not kept shed.
        self.level = self.level.min(top);
        if self.is_shed(class) {
            return self.level;
        }
        if wait_ns > self.cfg.high_ns {
            let late_from = now.saturating_sub(wait_ns - self.cfg.high_ns);
            let sp = match self.spell.take() {
                // Judged by when this task's lateness began, not when it was seen: workers
                // that get the CPU every 150 ms see each task late for most of the gap, and
                // those lates join into one spell though the sightings are far apart.
                Some(sp) if late_from.saturating_sub(sp.last) <= SPELL_GAP_NS => sp,
                _ => Spell { since: late_from, last: now, count: 0, class: 0 },
            };
            self.spell = Some(Spell {
                since: sp.since.min(late_from),
                last: now,
                count: sp.count + 1,
                class: sp.class.max(class.get()),
            });
        }
        if wait_ns > self.cfg.low_ns {
            self.calm_since = None;
        } else if self.calm_since.is_none() {
            self.calm_since = Some(now);
        }
        let since_change = self.changed_ns.map_or(u64::MAX, |c| now.saturating_sub(c));
        // A class just served again is shed again at the first two late tasks; after a shed,
        // its effect is awaited before the next class goes.
        let trying = self.restored_ns.is_some_and(|t| now.saturating_sub(t) < 2 * self.recover_ns());
        let (hold, spell_ns) = if trying { (0, 0) } else { (self.cfg.hold_ns, SPELL_NS) };
        let overload = self.spell.filter(|sp| {
            sp.count >= LATE_IN_SPELL && now.saturating_sub(sp.last) <= SPELL_GAP_NS && sp.last - sp.since >= spell_ns
        });
        if let Some(sp) = overload.filter(|_| since_change >= hold) {
            // Shed the lowest class still served below the late one: a class waiting behind
            // higher ones is not helped by shedding itself.
            let late = sp.class;
            if let Some(c) = self.active(now).filter(|&c| c >= self.level && c < late.min(top)).min() {
                if let Some(t) = self.restored_ns.take() {
                    // Back so soon: wait longer before the next try; a try that held a
                    // while brings the next one sooner.
                    self.backoff = if now.saturating_sub(t) < 2 * self.recover_ns() {
                        (self.backoff + 1).min(MAX_BACKOFF)
                    } else {
                        self.backoff.saturating_sub(1)
                    };
                }
                self.set(c + 1, now);
            }
        } else if self.level > 0
            && since_change >= self.recover_ns()
            && self.calm_since.is_some_and(|t| now.saturating_sub(t) >= self.recover_ns())
        {
            // Serve the highest shed class again.
            let below = self.level;
            let next = self.active(now).filter(|&c| c < below).max().unwrap_or(0);
            self.restored_ns = Some(now);
            self.set(next, now);
        }
        self.level
    }

    fn recover_ns(&self) -> u64 {
        self.cfg.recover_ns << self.backoff
    }

    fn set(&mut self, level: u8, now: u64) {
        self.level = level;
        self.changed_ns = Some(now);
        self.spell = None;
        self.calm_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn p(c: u8) -> Priority {
        Priority::new(c.into()).unwrap()
    }

    /// Tasks of classes 1, 2 and 3 every millisecond, each waiting `wait(now)`.
    fn drive(s: &mut Shedder, from: u64, to: u64, wait: impl Fn(u64, u8) -> u64) -> Vec<u8> {
        let mut levels = Vec::new();
        let mut t = from;
        while t < to {
            for c in 1..=3 {
                levels.push(s.observe(p(c), wait(t, c), t));
            }
            t += MS;
        }
        levels
    }

    #[test]
    fn calm_work_sheds_nothing() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        let levels = drive(&mut s, 0, 5_000 * MS, |_, _| 2 * MS);
        assert!(levels.iter().all(|&l| l == 0));
    }

    #[test]
    fn one_late_task_is_not_overload() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        let levels = drive(&mut s, 0, 3_000 * MS, |t, c| if t == 1_000 * MS && c == 3 { 80 * MS } else { MS });
        assert!(levels.iter().all(|&l| l == 0));
    }

    #[test]
    fn a_short_stall_is_not_overload() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        let stall = |t: u64, _| if (1_000 * MS..1_150 * MS).contains(&t) { 80 * MS } else { MS };
        let levels = drive(&mut s, 0, 3_000 * MS, stall);
        assert!(levels.iter().all(|&l| l == 0));
    }

    /// Workers that rarely get the CPU pop seldom, but each task they pop waited long: that
    /// is a long spell of lateness at once.
    #[test]
    fn starved_workers_shed_at_the_first_late_tasks() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        for c in 1..=3 {
            s.observe(p(c), MS, 0);
        }
        for c in 1..=3 {
            s.observe(p(c), 400 * MS, 400 * MS);
        }
        assert_eq!(s.level(), 2);
    }

    /// Workers that get the CPU every 120–300 ms (a crowded host's scheduler) see each task
    /// late for most of the gap: those lates are one spell, though each run sees them apart.
    #[test]
    fn workers_run_seldom_shed_though_their_runs_are_far_apart() {
        for gap in [120, 150, 200, 300] {
            let mut s = Shedder::new(ShedConfig::after_ms(20));
            let mut t = 0;
            while t < 1_000 * MS {
                for c in [3, 2, 1] {
                    s.observe(p(c), gap * MS, t + u64::from(3 - c) * MS / 10);
                }
                t += gap * MS;
            }
            assert!(s.is_shed(p(1)) && !s.is_shed(p(3)), "runs every {gap} ms: level {}", s.level());
        }
    }

    /// Late tasks far apart, each late only briefly, are not one spell.
    #[test]
    fn brief_lates_far_apart_are_not_overload() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        let levels = drive(&mut s, 0, 5_000 * MS, |t, _| if t % (200 * MS) == 0 { 60 * MS } else { MS });
        assert!(levels.iter().all(|&l| l == 0));
    }

    /// Classes 1 and 2 wait behind a late class 3 and are never served: they are present,
    /// and shed in order, lowest first.
    #[test]
    fn starved_classes_are_shed_lowest_first() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        let mut t = 0;
        while t < 3_000 * MS {
            s.waiting(p(1), t);
            s.waiting(p(2), t);
            s.observe(p(3), 50 * MS, t);
            if s.level() == 2 {
                assert!(s.is_shed(p(1)) && !s.is_shed(p(2)), "class 1 before class 2");
            }
            t += MS;
        }
        assert_eq!(s.level(), 3, "both starved classes shed, the top class served");
    }

    #[test]
    fn overload_sheds_the_lowest_class_first_and_never_the_top() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        // Late whatever is shed: the level climbs one class at a time and stops below the top.
        drive(&mut s, 0, 400 * MS, |_, _| 50 * MS);
        assert_eq!(s.level(), 2, "class 1 shed first");
        assert!(s.is_shed(p(1)) && !s.is_shed(p(2)));
        drive(&mut s, 400 * MS, 2_000 * MS, |_, _| 50 * MS);
        assert_eq!(s.level(), 3, "then class 2, never class 3");
        assert!(!s.is_shed(p(3)));
    }

    #[test]
    fn shed_classes_come_back_when_calm_and_back_off_when_it_fails() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        // Overloaded while class 1 is served; calm once it is shed.
        let wait = |s: &Shedder| if s.is_shed(p(1)) { MS } else { 50 * MS };
        let mut t = 0;
        let mut restores = Vec::new();
        let mut last = 0;
        while t < 30_000 * MS {
            for c in 1..=3 {
                let w = wait(&s);
                let l = s.observe(p(c), w, t);
                if l < last {
                    restores.push(t);
                }
                last = l;
            }
            t += MS;
        }
        assert!(restores.len() >= 3, "tries to serve class 1 again: {restores:?}");
        let gaps: Vec<u64> = restores.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "tries come no sooner: {gaps:?}");
        assert!(gaps.last().unwrap() > &(4_000 * MS), "backed off: {gaps:?}");
        assert_eq!(s.level(), 2, "class 2 was never shed: class 1's shedding was enough");
    }

    /// Class 1 waiting behind classes 2 and 3 is strict priority at work, not overload:
    /// shedding class 1 would help nobody.
    #[test]
    fn the_lowest_class_late_alone_is_not_shed() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        let levels = drive(&mut s, 0, 3_000 * MS, |_, c| if c == 1 { 80 * MS } else { MS });
        assert!(levels.iter().all(|&l| l == 0));
        // Class 2 late: class 1 goes, class 2 stays.
        drive(&mut s, 3_000 * MS, 6_000 * MS, |_, c| if c == 2 { 80 * MS } else { MS });
        assert_eq!(s.level(), 2);
    }

    #[test]
    fn a_class_that_leaves_is_not_kept_shed() {
        let mut s = Shedder::new(ShedConfig::after_ms(20));
        drive(&mut s, 0, 500 * MS, |_, _| 50 * MS);
        assert!(s.level() > 0);
        // Only class 1 has work from now on: it is the top class and is served.
        let mut t = 500 * MS;
        while t < 3_000 * MS {
            s.observe(p(1), 50 * MS, t);
            t += MS;
        }
        assert!(!s.is_shed(p(1)));
    }

    proptest! {
        /// Whatever the waits, the top class with work is never shed, and the level moves
        /// one present class at a time.
        #[test]
        fn the_top_class_is_never_shed(events in proptest::collection::vec((0u8..8, 0u64..100, 0u64..20), 1..400)) {
            let mut s = Shedder::new(ShedConfig::after_ms(20));
            let mut t = 0;
            for (c, wait_ms, step_ms) in events {
                t += step_ms * MS;
                s.observe(p(c), wait_ms * MS, t);
                let top = s.active(t).max().unwrap();
                prop_assert!(!s.is_shed(p(top)));
            }
        }
    }
}
