//! HTTP players counted by what they ask for. An HLS player holds no connection: it asks for
//! a playlist now and then and for each segment or part. The relay names each new player
//! (an id in the media playlist's URL it hands out) and counts an id as a player while its
//! requests keep coming. Sans-IO: ids and times in, counts out.

use std::collections::HashMap;

/// The longest id kept (longer ones are refused by the caller, not cut).
pub const MAX_ID: usize = 64;

/// Whether `id` may name a player: 1 to [`MAX_ID`] letters, digits, `-` or `_` (it goes
/// back into URLs unescaped).
pub fn valid_id(id: &str) -> bool {
    (1..=MAX_ID).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The players of one stream.
#[derive(Debug)]
pub struct Players {
    /// When each id last asked for something (ms).
    last: HashMap<String, u64>,
    /// An id silent this long has stopped playing.
    window_ms: u64,
    /// At most this many ids are kept: past it, a new id is not counted until others expire
    /// (a client inventing ids cannot grow the relay's memory).
    max: usize,
    /// When expired ids were last dropped: a full set is swept at most once a second, not
    /// per request.
    swept_ms: Option<u64>,
}

impl Players {
    pub fn new(window_ms: u64, max: usize) -> Self {
        Self { last: HashMap::new(), window_ms, max, swept_ms: None }
    }

    /// A request from `id` at `now_ms`; whether it is counted (a known id, or a new one
    /// with room).
    pub fn seen(&mut self, id: &str, now_ms: u64) -> bool {
        if let Some(t) = self.last.get_mut(id) {
            *t = (*t).max(now_ms);
            return true;
        }
        if self.last.len() >= self.max {
            if self.swept_ms.is_some_and(|t| now_ms.saturating_sub(t) < 1_000) {
                return false;
            }
            self.expire(now_ms);
            if self.last.len() >= self.max {
                return false;
            }
        }
        self.last.insert(id.to_string(), now_ms);
        true
    }

    /// Whether `id` asked for something within the window of `now_ms`.
    pub fn is_active(&self, id: &str, now_ms: u64) -> bool {
        self.last.get(id).is_some_and(|t| now_ms.saturating_sub(*t) < self.window_ms)
    }

    /// The players whose last request is within the window of `now_ms`.
    pub fn active(&mut self, now_ms: u64) -> usize {
        self.expire(now_ms);
        self.last.len()
    }

    fn expire(&mut self, now_ms: u64) {
        self.swept_ms = Some(now_ms);
        let window = self.window_ms;
        self.last.retain(|_, t| now_ms.saturating_sub(*t) < window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_player_counts_while_it_asks() {
        let mut p = Players::new(10_000, 100);
        assert!(p.seen("a", 0) && p.seen("b", 1_000) && p.seen("a", 8_000));
        assert_eq!(p.active(9_000), 2);
        // b has been silent for 10 s: it stopped; a asked 2 s ago.
        assert!(p.is_active("a", 11_000) && !p.is_active("b", 11_000) && !p.is_active("z", 0));
        assert_eq!(p.active(11_000), 1);
        assert_eq!(p.active(18_000), 0);
        // A late request (out of order) does not move a player's time back.
        assert!(p.seen("c", 20_000) && p.seen("c", 19_000));
        assert_eq!(p.active(29_500), 1);
    }

    #[test]
    fn invented_ids_cannot_grow_it_past_its_bound() {
        let mut p = Players::new(10_000, 3);
        for (k, id) in ["a", "b", "c"].iter().enumerate() {
            assert!(p.seen(id, k as u64));
        }
        assert!(!p.seen("d", 100), "full");
        assert!(p.seen("a", 200), "a known id still counts");
        // Once b and c expire, there is room again.
        assert!(p.seen("d", 10_150));
        assert_eq!(p.active(10_150), 2);
        // Full again: a sweep finds nothing expired, and the next new id within a second
        // is refused without another.
        assert!(p.seen("e", 10_160));
        assert!(!p.seen("f", 10_170) && !p.seen("g", 11_000));
        assert!(p.seen("h", 20_300), "the last sweep is seconds old, and a, d and e have expired");
    }

    #[test]
    fn ids_are_what_urls_carry_unescaped() {
        assert!(valid_id("3f9a-01_x") && valid_id(&"a".repeat(MAX_ID)));
        for bad in ["", "a b", "a&b", "a=b", "é", "../x", &"a".repeat(MAX_ID + 1)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    proptest! {
        /// Never more players than ids kept, nor than distinct ids seen within the window.
        #[test]
        fn counts_stay_within_what_was_seen(reqs in proptest::collection::vec((0u8..20, 0u64..60_000), 0..200)) {
            let mut p = Players::new(10_000, 8);
            let mut reqs = reqs;
            reqs.sort_by_key(|r| r.1);
            for &(id, t) in &reqs {
                p.seen(&id.to_string(), t);
                let n = p.active(t);
                let recent: std::collections::HashSet<u8> =
                    reqs.iter().filter(|r| r.1 <= t && t - r.1 < 10_000).map(|r| r.0).collect();
                prop_assert!(n <= 8 && n <= recent.len());
            }
        }
    }
}
