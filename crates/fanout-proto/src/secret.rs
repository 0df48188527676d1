//! Comparing secrets (tokens, passwords, Digest responses) in time that does not depend on
//! where they first differ, so a network peer cannot find one byte at a time.

/// Whether `a == b`, looking at every byte of both (only the lengths can leak).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    // `black_box` keeps the compiler from turning the fold into an early-exit comparison.
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn agrees_with_eq(a in proptest::collection::vec(any::<u8>(), 0..40), b in proptest::collection::vec(any::<u8>(), 0..40)) {
            prop_assert_eq!(ct_eq(&a, &b), a == b);
            prop_assert!(ct_eq(&a, &a));
        }
    }
}
