//! Strict-priority class queues (OMSS's class queues): one FIFO per class, the highest
//! non-empty class is always served first.

use crate::{Priority, CLASSES};
use std::collections::VecDeque;

#[derive(Debug)]
pub struct ClassQueues<T> {
    queues: [VecDeque<T>; CLASSES],
    len: usize,
}

impl<T> Default for ClassQueues<T> {
    fn default() -> Self {
        Self { queues: std::array::from_fn(|_| VecDeque::new()), len: 0 }
    }
}

impl<T> ClassQueues<T> {
    pub fn push(&mut self, class: Priority, item: T) {
        self.queues[usize::from(class.get())].push_back(item);
        self.len += 1;
    }

    /// The oldest item of the highest non-empty class.
    pub fn pop(&mut self) -> Option<T> {
        let item = self.queues.iter_mut().rev().find_map(|q| q.pop_front())?;
        self.len -= 1;
        Some(item)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The classes with items queued, lowest first.
    pub fn waiting(&self) -> impl Iterator<Item = Priority> + '_ {
        self.queues.iter().enumerate().filter(|(_, q)| !q.is_empty()).filter_map(|(c, _)| Priority::new(c as i64).ok())
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn highest_class_first_fifo_within() {
        let mut q = ClassQueues::default();
        for (c, v) in [(1, "a"), (3, "b"), (1, "c"), (7, "d"), (3, "e")] {
            q.push(Priority::new(c).unwrap(), v);
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["d", "b", "e", "a", "c"]);
        assert!(q.is_empty());
    }

    #[test]
    fn priority_range() {
        assert!(Priority::new(8).is_err());
        assert!(Priority::new(-1).is_err());
        assert_eq!(Priority::new(7).unwrap(), Priority::MAX);
    }

    proptest! {
        #[test]
        fn pops_are_sorted_by_class_then_arrival(items in proptest::collection::vec(0i64..8, 0..64)) {
            let mut q = ClassQueues::default();
            for (i, &c) in items.iter().enumerate() {
                q.push(Priority::new(c).unwrap(), (c, i));
            }
            let popped: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
            let mut expected: Vec<_> = items.iter().copied().enumerate().map(|(i, c)| (c, i)).collect();
            expected.sort_by_key(|&(c, i)| (std::cmp::Reverse(c), i));
            prop_assert_eq!(popped, expected);
        }
    }
}
