//! A generated slate: a still picture (colour bars over a "NO SIGNAL" band) as one H.264
//! IDR picture, for a path that must stay available while no one publishes and has no
//! picture of its own to hold (`fallback = "slate"`).
//!
//! The encoder paints in macroblocks: every 16×16 block is one flat colour, so each is coded
//! as Intra 16×16 with one DC coefficient per plane and no other residual. Prediction comes
//! from the block to the left (or above, or the mid grey where there is neither); at the
//! quantisers chosen here (luma 28, chroma 22) a DC level of `n` adds exactly `n` to every
//! sample, so the decoded picture is exactly the painted one. Constrained Baseline, CAVLC,
//! no deblocking: any H.264 decoder plays it, and a 1280×720 picture is a few kilobytes.

/// A Y′CbCr colour (BT.601, limited range).
pub type Yuv = [u8; 3];

/// 75% colour bars (ITU-R BT.801), left to right.
pub const BARS: [Yuv; 7] = [
    [180, 128, 128], // white
    [162, 44, 142],  // yellow
    [131, 156, 44],  // cyan
    [112, 72, 58],   // green
    [84, 184, 198],  // magenta
    [65, 100, 212],  // red
    [35, 212, 114],  // blue
];
/// The band under the bars, and its text.
pub const BAND: Yuv = [16, 128, 128];
pub const TEXT: Yuv = [235, 128, 128];

/// The luma quantiser (at 28 a luma DC level is one sample step).
const QP: i32 = 28;
/// Chroma's quantiser below luma's (22: a chroma DC level is one sample step).
const CHROMA_QP_OFFSET: i32 = -6;
/// The largest picture (a level 5.1 frame: 36,864 macroblocks), and the smallest.
pub const MAX_MACROBLOCKS: usize = 36_864;
pub const MIN_SIDE: u16 = 16;

/// One picture's parameter sets and IDR slice, each a NAL unit (no start code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picture {
    pub sps: Vec<u8>,
    pub pps: Vec<u8>,
    pub idr: Vec<u8>,
}

impl Picture {
    /// The three NAL units, in decoding order.
    pub fn nal_units(&self) -> [&[u8]; 3] {
        [&self.sps, &self.pps, &self.idr]
    }
}

/// The slate at `width`×`height` (rounded up to even): bars over the upper two thirds, a
/// black band with "NO SIGNAL" where the picture is wide enough for it. `None` for a size
/// outside [`MIN_SIDE`] and [`MAX_MACROBLOCKS`].
pub fn slate(width: u16, height: u16) -> Option<Picture> {
    let (mbs_x, mbs_y) = (usize::from(width.div_ceil(16)), usize::from(height.div_ceil(16)));
    let bars_end = (usize::from(height) * 2 / 3 / 16).max(1);
    let text = Text::centred("NO SIGNAL", mbs_x, bars_end, mbs_y);
    encode(width, height, |x, y| {
        if y < bars_end {
            BARS[x * BARS.len() / mbs_x]
        } else if text.as_ref().is_some_and(|t| t.lit(x, y)) {
            TEXT
        } else {
            BAND
        }
    })
}

/// Encodes a picture whose macroblock at column `x`, row `y` is `paint(x, y)` throughout.
/// `None` for a size outside [`MIN_SIDE`] and [`MAX_MACROBLOCKS`].
pub fn encode(width: u16, height: u16, paint: impl Fn(usize, usize) -> Yuv) -> Option<Picture> {
    let (width, height) = (width.next_multiple_of(2), height.next_multiple_of(2));
    let (mbs_x, mbs_y) = (usize::from(width.div_ceil(16)), usize::from(height.div_ceil(16)));
    if width < MIN_SIDE || height < MIN_SIDE || mbs_x * mbs_y > MAX_MACROBLOCKS {
        return None;
    }
    let level = match mbs_x * mbs_y {
        0..=1_620 => 30,
        1_621..=3_600 => 31,
        3_601..=8_192 => 40,
        _ => 51,
    };
    let mut sps = Writer::nal(0x67);
    sps.bits(66, 8); // profile_idc: Baseline
    sps.bits(0xc0, 8); // constraint_set0 and 1: Constrained Baseline
    sps.bits(level, 8);
    sps.ue(0); // seq_parameter_set_id
    sps.ue(0); // log2_max_frame_num_minus4 (IDR pictures only: frame_num stays 0)
    sps.ue(2); // pic_order_cnt_type 2: output in decoding order
    sps.ue(1); // max_num_ref_frames
    sps.bit(false); // gaps_in_frame_num_value_allowed_flag
    sps.ue(mbs_x as u32 - 1);
    sps.ue(mbs_y as u32 - 1);
    sps.bit(true); // frame_mbs_only_flag
    sps.bit(true); // direct_8x8_inference_flag
    let (crop_x, crop_y) = (mbs_x * 16 - usize::from(width), mbs_y * 16 - usize::from(height));
    sps.bit(crop_x + crop_y > 0);
    if crop_x + crop_y > 0 {
        // Left, right, top, bottom, in 4:2:0's units of two samples.
        for offset in [0, crop_x / 2, 0, crop_y / 2] {
            sps.ue(offset as u32);
        }
    }
    sps.bit(false); // vui_parameters_present_flag

    let mut pps = Writer::nal(0x68);
    pps.ue(0); // pic_parameter_set_id
    pps.ue(0); // seq_parameter_set_id
    pps.bit(false); // entropy_coding_mode_flag: CAVLC
    pps.bit(false); // bottom_field_pic_order_in_frame_present_flag
    pps.ue(0); // num_slice_groups_minus1
    pps.ue(0); // num_ref_idx_l0_default_active_minus1
    pps.ue(0); // num_ref_idx_l1_default_active_minus1
    pps.bit(false); // weighted_pred_flag
    pps.bits(0, 2); // weighted_bipred_idc
    pps.se(QP - 26); // pic_init_qp_minus26
    pps.se(0); // pic_init_qs_minus26
    pps.se(CHROMA_QP_OFFSET);
    pps.bit(true); // deblocking_filter_control_present_flag
    pps.bit(false); // constrained_intra_pred_flag
    pps.bit(false); // redundant_pic_cnt_present_flag

    let mut idr = Writer::nal(0x65);
    idr.ue(0); // first_mb_in_slice
    idr.ue(7); // slice_type: I, as every slice of the picture
    idr.ue(0); // pic_parameter_set_id
    idr.bits(0, 4); // frame_num
    idr.ue(0); // idr_pic_id
    idr.bit(false); // no_output_of_prior_pics_flag
    idr.bit(false); // long_term_reference_flag
    idr.se(0); // slice_qp_delta
    idr.ue(1); // disable_deblocking_filter_idc: off, so the blocks stay sharp
    for y in 0..mbs_y {
        for x in 0..mbs_x {
            // Horizontal prediction from the left, else vertical from above, else DC (the
            // mid grey): a flat neighbour predicts a flat block of its colour.
            let (from, luma_mode, chroma_mode) = match (x, y) {
                (0, 0) => ([128; 3], 2, 0),
                (0, _) => (paint(0, y - 1), 0, 2),
                _ => (paint(x - 1, y), 1, 1),
            };
            let level = |plane: usize| i32::from(paint(x, y)[plane]) - i32::from(from[plane]);
            let chroma_coded = level(1) != 0 || level(2) != 0;
            // I_16x16 with this prediction, no luma AC, chroma DC only where it differs.
            idr.ue(1 + luma_mode + if chroma_coded { 4 } else { 0 });
            idr.ue(chroma_mode);
            idr.se(0); // mb_qp_delta
            idr.dc_level(level(0), Block::LumaDc);
            if chroma_coded {
                idr.dc_level(level(1), Block::ChromaDc);
                idr.dc_level(level(2), Block::ChromaDc);
            }
        }
    }
    Some(Picture { sps: sps.finish(), pps: pps.finish(), idr: idr.finish() })
}

/// Which coefficient block a DC level is coded in (its CAVLC tables).
#[derive(Clone, Copy)]
enum Block {
    /// Intra16x16DCLevel: nC is 0 here, as no block around has AC coefficients.
    LumaDc,
    /// ChromaDCLevel (4:2:0): nC is −1.
    ChromaDc,
}

/// An RBSP written most significant bit first, then made a NAL unit.
struct Writer {
    bytes: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Writer {
    fn nal(header: u8) -> Self {
        Self { bytes: vec![header], acc: 0, n: 0 }
    }

    fn bits(&mut self, value: u32, count: u32) {
        debug_assert!(count <= 32 && (count == 32 || value >> count == 0));
        self.acc = (self.acc << count) | u64::from(value);
        self.n += count;
        while self.n >= 8 {
            self.n -= 8;
            self.bytes.push((self.acc >> self.n) as u8);
        }
    }

    fn bit(&mut self, on: bool) {
        self.bits(u32::from(on), 1);
    }

    /// Exp-Golomb, unsigned.
    fn ue(&mut self, v: u32) {
        let code = u64::from(v) + 1;
        let len = 64 - code.leading_zeros();
        self.bits(0, len - 1);
        self.bits(code as u32, len);
    }

    /// Exp-Golomb, signed (positive values first).
    fn se(&mut self, v: i32) {
        self.ue(if v > 0 { 2 * v as u32 - 1 } else { 2 * v.unsigned_abs() });
    }

    /// A residual block whose only coefficient is its first, `level` (CAVLC, 9.2).
    fn dc_level(&mut self, level: i32, block: Block) {
        // coeff_token for no coefficients, one trailing ±1, one other (Table 9-5).
        let (none, one_trailing, one_other) = match block {
            Block::LumaDc => ((1, 1), (1, 2), (0b101, 6)),
            Block::ChromaDc => ((1, 2), (1, 1), (0b111, 6)),
        };
        let token = |w: &mut Self, (code, len): (u32, u32)| w.bits(code, len);
        match level {
            0 => return token(self, none),
            1 | -1 => {
                token(self, one_trailing);
                self.bit(level < 0); // trailing_ones_sign_flag
            }
            _ => {
                token(self, one_other);
                // levelCode, less the 2 a first level after fewer than three trailing
                // ones is known not to need; suffixLength 0.
                let code = if level > 0 { 2 * level - 2 } else { -2 * level - 1 } as u32 - 2;
                match code {
                    ..14 => self.bits(1, code + 1),
                    14..30 => {
                        self.bits(1, 15);
                        self.bits(code - 14, 4);
                    }
                    _ => {
                        self.bits(1, 16);
                        self.bits(code - 30, 12);
                    }
                }
            }
        }
        self.bit(true); // total_zeros 0 (the level is the block's first coefficient)
    }

    /// The RBSP's stop bit and alignment, then emulation prevention.
    fn finish(mut self) -> Vec<u8> {
        self.bit(true);
        if self.n > 0 {
            self.bits(0, 8 - self.n);
        }
        let mut out = Vec::with_capacity(self.bytes.len() + 16);
        let mut zeros = 0;
        for b in self.bytes {
            if zeros >= 2 && b <= 3 {
                out.push(3);
                zeros = 0;
            }
            zeros = if b == 0 { zeros + 1 } else { 0 };
            out.push(b);
        }
        out
    }
}

/// Text in a 5×7 dot font, a macroblock a dot.
struct Text {
    rows: [u64; 7],
    left: usize,
    top: usize,
    width: usize,
}

impl Text {
    /// `s` centred in the macroblock rows `top..bottom` of a picture `mbs_x` wide; `None`
    /// where it does not fit.
    fn centred(s: &str, mbs_x: usize, top: usize, bottom: usize) -> Option<Self> {
        let width = s.chars().count() * 6 - 1;
        if width + 2 > mbs_x || width > 64 || bottom.saturating_sub(top) < 9 {
            return None;
        }
        let mut rows = [0u64; 7];
        for (i, c) in s.chars().enumerate() {
            let glyph = glyph(c);
            for (row, bits) in rows.iter_mut().zip(glyph) {
                *row |= u64::from(bits) << (width - 5 - i * 6);
            }
        }
        Some(Self { rows, left: (mbs_x - width) / 2, top: top + (bottom - top - 7) / 2, width })
    }

    fn lit(&self, x: usize, y: usize) -> bool {
        let (Some(col), Some(row)) = (x.checked_sub(self.left), y.checked_sub(self.top)) else { return false };
        col < self.width && row < 7 && self.rows[row] >> (self.width - 1 - col) & 1 == 1
    }
}

/// A letter's seven rows of five dots (the slate's letters; anything else is blank).
fn glyph(c: char) -> [u8; 7] {
    match c {
        'A' => [0b01110, 0b10001, 0b10001, 0b11111, 0b10001, 0b10001, 0b10001],
        'G' => [0b01110, 0b10001, 0b10000, 0b10111, 0b10001, 0b10001, 0b01111],
        'I' => [0b01110, 0b00100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110],
        'L' => [0b10000, 0b10000, 0b10000, 0b10000, 0b10000, 0b10000, 0b11111],
        'N' => [0b10001, 0b11001, 0b10101, 0b10011, 0b10001, 0b10001, 0b10001],
        'O' => [0b01110, 0b10001, 0b10001, 0b10001, 0b10001, 0b10001, 0b01110],
        'S' => [0b01111, 0b10000, 0b10000, 0b01110, 0b00001, 0b00001, 0b11110],
        _ => [0; 7],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The parameter sets as h264-reader reads them.
    fn parsed(p: &Picture) -> (h264_reader::nal::sps::SeqParameterSet, h264_reader::nal::pps::PicParameterSet) {
        use h264_reader::rbsp::{decode_nal, BitReader};
        let sps =
            h264_reader::nal::sps::SeqParameterSet::from_bits(BitReader::new(&*decode_nal(&p.sps).unwrap())).unwrap();
        let mut ctx = h264_reader::Context::default();
        ctx.put_seq_param_set(sps.clone());
        let pps =
            h264_reader::nal::pps::PicParameterSet::from_bits(&ctx, BitReader::new(&*decode_nal(&p.pps).unwrap()))
                .unwrap();
        (sps, pps)
    }

    proptest! {
        /// Any size within the limits: another H.264 parser reads its parameter sets as a
        /// Constrained Baseline CAVLC picture of that size (rounded up to even) at the
        /// quantisers the exact DC levels need.
        #[test]
        fn any_size_is_described_as_painted(w in MIN_SIDE..1200, h in MIN_SIDE..1200) {
            let p = slate(w, h).unwrap();
            let (sps, pps) = parsed(&p);
            let size = sps.pixel_dimensions().unwrap();
            prop_assert_eq!(size, (u32::from(w.next_multiple_of(2)), u32::from(h.next_multiple_of(2))));
            prop_assert_eq!((u8::from(sps.profile_idc), sps.constraint_flags.flag1()), (66, true));
            prop_assert!(!pps.entropy_coding_mode_flag && pps.deblocking_filter_control_present_flag);
            prop_assert_eq!((pps.pic_init_qp_minus26, pps.chroma_qp_index_offset), (QP - 26, CHROMA_QP_OFFSET));
            prop_assert_eq!((p.idr[0], p.sps[0], p.pps[0]), (0x65, 0x67, 0x68));
        }

        /// Any painting: no NAL unit holds a start code or an unescaped `00 00 0x`.
        #[test]
        fn any_painting_is_escaped(colours in proptest::collection::vec(any::<[u8; 3]>(), 1..64), w in 1u16..8, h in 1u16..8) {
            let p = encode(w * 16, h * 16, |x, y| colours[(x * 7 + y) % colours.len()]).unwrap();
            for nal in p.nal_units() {
                prop_assert!(nal.windows(3).all(|t| !(t[0] == 0 && t[1] == 0 && t[2] <= 3)), "{:02x?}", nal);
            }
        }
    }

    /// Sizes past the largest level's frame, or under a macroblock (after rounding up to
    /// even), are refused.
    #[test]
    fn sizes_out_of_range_are_refused() {
        assert!(slate(4096, 2304).is_some());
        assert!(slate(4096, 2320).is_none());
        assert!(slate(14, 100).is_none() && slate(100, 0).is_none() && slate(15, 100).is_some());
    }

    /// The bits of single-coefficient blocks, as the standard's tables spell them: none ("1"
    /// for luma, "01" for chroma), ±1 as a trailing one with its sign, then levels through
    /// each prefix range, each closed by total_zeros 0 ("1").
    #[test]
    fn dc_levels_are_coded_as_the_tables_say() {
        let bits = |level: i32, block: Block| {
            let mut w = Writer { bytes: Vec::new(), acc: 0, n: 0 };
            w.dc_level(level, block);
            let (n, acc) = (w.n, w.acc);
            let mut s: String = w.bytes.iter().map(|b| format!("{b:08b}")).collect();
            s += &format!("{:032b}", acc & ((1u64 << n) - 1))[32 - n as usize..];
            s
        };
        assert_eq!(bits(0, Block::LumaDc), "1");
        assert_eq!(bits(0, Block::ChromaDc), "01");
        assert_eq!(bits(1, Block::LumaDc), "01".to_owned() + "0" + "1");
        assert_eq!(bits(-1, Block::ChromaDc), "1".to_owned() + "1" + "1");
        // 2: levelCode 2, less 2: prefix 0 ("1").
        assert_eq!(bits(2, Block::LumaDc), "000101".to_owned() + "1" + "1");
        // −8: levelCode 15, less 2 = 13: thirteen zeros and a one.
        assert_eq!(bits(-8, Block::ChromaDc), "000111".to_owned() + &"0".repeat(13) + "1" + "1");
        // 9: levelCode 16, less 2 = 14: prefix 14, suffix 0 in four bits.
        assert_eq!(bits(9, Block::LumaDc), "000101".to_owned() + &"0".repeat(14) + "1" + "0000" + "1");
        // −255: levelCode 509, less 2 = 507: prefix 15, suffix 477 in twelve bits.
        assert_eq!(bits(-255, Block::LumaDc), "000101".to_owned() + &"0".repeat(15) + "1" + "000111011101" + "1");
    }

    /// The slate's layout: bars across the top two thirds, the text lit in the band only
    /// where it fits, centred.
    #[test]
    fn the_text_is_centred_in_the_band_where_it_fits() {
        let t = Text::centred("NO SIGNAL", 80, 30, 45).unwrap();
        assert_eq!((t.left, t.top, t.width), (13, 34, 53));
        // N's first column is lit on every row; the gap after "NO" is dark.
        assert!((34..41).all(|y| t.lit(13, y)) && !(34..41).any(|y| t.lit(13 + 12, y)));
        assert!(!t.lit(12, 34) && !t.lit(13, 33) && !t.lit(13, 41));
        assert!(Text::centred("NO SIGNAL", 30, 11, 17).is_none(), "480×270 has no room");
    }
}
