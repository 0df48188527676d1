//! A most-significant-bit-first reader of codec headers.

pub(crate) struct Bits<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Bits<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Self { b, at: 0 }
    }
    pub(crate) fn bit(&mut self) -> Option<u32> {
        let byte = *self.b.get(self.at / 8)?;
        let v = (byte >> (7 - self.at % 8)) & 1;
        self.at += 1;
        Some(u32::from(v))
    }
    pub(crate) fn bits(&mut self, n: u32) -> Option<u32> {
        (0..n).try_fold(0u32, |v, _| Some((v << 1) | self.bit()?))
    }
    pub(crate) fn skip(&mut self, n: usize) -> Option<()> {
        self.at += n;
        (self.at <= self.b.len() * 8).then_some(())
    }
    /// Exp-Golomb, unsigned (at most 31 leading zeros).
    pub(crate) fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        Some((1u32 << zeros) - 1 + self.bits(zeros)?)
    }
}
