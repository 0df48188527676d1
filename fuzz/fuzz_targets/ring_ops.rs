//! Arbitrary sequences of publishes and reads keep the ring's accounting exact.
#![no_main]
use arbitrary::Arbitrary;
use fanout_core::{Cursor, SessionRing};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Publish(u8),
    Read { sink: u8, max: u8 },
}

fuzz_target!(|input: (u8, Vec<Op>)| {
    let (cap, ops) = input;
    let mut ring = SessionRing::with_capacity(usize::from(cap % 64) + 1);
    let mut cursors = [Cursor::at_head(&ring); 4];
    let mut published = 0u64;
    for op in ops {
        match op {
            Op::Publish(n) => {
                for _ in 0..n % 8 {
                    ring.publish(published);
                    published += 1;
                }
            }
            Op::Read { sink, max } => {
                let c = &mut cursors[usize::from(sink % 4)];
                c.catch_up(ring.oldest());
                let n = c.lag(ring.head()).min(u64::from(max));
                for k in 0..n {
                    assert_eq!(ring.get(c.next() + k), Some(&(c.next() + k)));
                }
                c.advance(n);
            }
        }
        for c in &cursors {
            assert_eq!(c.received + c.skipped + c.lag(ring.head()), published);
        }
    }
});
