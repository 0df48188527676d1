//! What an HEVC sequence parameter set (ITU-T H.265 §7.3.2.2) says that an MP4 sample entry
//! needs: the general profile, tier and level bytes as they stand, the number of temporal
//! layers, the chroma format, the bit depths and the picture size. Bytes in, fields out.

use super::bits::Bits;

/// The fields of an SPS that `hvcC` and the `hvc1` sample entry carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpsInfo {
    /// general_profile_space, tier, profile_idc; compatibility flags; constraint flags;
    /// level_idc: the 12 bytes of the general profile_tier_level, as they stand.
    pub general: [u8; 12],
    pub max_sub_layers: u8,
    pub temporal_id_nested: bool,
    pub chroma_format_idc: u8,
    pub bit_depth_luma: u8,
    pub bit_depth_chroma: u8,
    /// The picture size after the conformance window.
    pub width: u16,
    pub height: u16,
}

/// The RBSP of a NAL unit: its 2-byte header dropped, emulation prevention bytes removed.
fn rbsp(nal: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(nal.len());
    let mut zeros = 0;
    for &b in nal.iter().skip(2) {
        if zeros >= 2 && b == 3 {
            zeros = 0;
            continue;
        }
        zeros = if b == 0 { zeros + 1 } else { 0 };
        out.push(b);
    }
    out
}

/// Reads an SPS NAL unit (with its 2-byte header, without a start code).
pub fn parse_sps(nal: &[u8]) -> Option<SpsInfo> {
    if nal.len() < 2 || (nal[0] >> 1) & 0x3f != 33 {
        return None;
    }
    let data = rbsp(nal);
    let mut r = Bits::new(&data);
    r.skip(4)?; // sps_video_parameter_set_id
    let max_sub_layers_minus1 = r.bits(3)? as u8;
    let temporal_id_nested = r.bit()? == 1;
    let general: [u8; 12] = data.get(1..13)?.try_into().ok()?;
    r.skip(96)?;
    // Sub-layer profile and level presence, padded to 8 entries, then what they announce.
    let mut present = Vec::new();
    for _ in 0..max_sub_layers_minus1 {
        present.push((r.bit()?, r.bit()?));
    }
    if max_sub_layers_minus1 > 0 {
        r.skip(2 * (8 - usize::from(max_sub_layers_minus1)))?;
    }
    for (profile, level) in present {
        r.skip(88 * profile as usize + 8 * level as usize)?;
    }
    r.ue()?; // sps_seq_parameter_set_id
    let chroma_format_idc = r.ue()?;
    if chroma_format_idc > 3 {
        return None;
    }
    if chroma_format_idc == 3 {
        r.skip(1)?; // separate_colour_plane_flag
    }
    let (w, h) = (r.ue()?, r.ue()?);
    let (mut crop_w, mut crop_h) = (0, 0);
    if r.bit()? == 1 {
        let (left, right, top, bottom) = (r.ue()?, r.ue()?, r.ue()?, r.ue()?);
        // Crop units: SubWidthC and SubHeightC of the chroma format.
        let (sw, sh) = match chroma_format_idc {
            1 => (2, 2),
            2 => (2, 1),
            _ => (1, 1),
        };
        crop_w = left.checked_add(right)?.checked_mul(sw)?;
        crop_h = top.checked_add(bottom)?.checked_mul(sh)?;
    }
    let bit_depth_luma = r.ue()?.checked_add(8)?;
    let bit_depth_chroma = r.ue()?.checked_add(8)?;
    if bit_depth_luma > 16 || bit_depth_chroma > 16 {
        return None;
    }
    Some(SpsInfo {
        general,
        max_sub_layers: max_sub_layers_minus1 + 1,
        temporal_id_nested,
        chroma_format_idc: chroma_format_idc as u8,
        bit_depth_luma: bit_depth_luma as u8,
        bit_depth_chroma: bit_depth_chroma as u8,
        width: u16::try_from(w.checked_sub(crop_w)?).ok()?,
        height: u16::try_from(h.checked_sub(crop_h)?).ok()?,
    })
}

impl SpsInfo {
    /// The RFC 6381 codec string (ISO/IEC 14496-15 Annex E): `hvc1.1.6.L93.B0`.
    pub fn codec(&self) -> String {
        let g = &self.general;
        let space = ["", "A", "B", "C"][usize::from(g[0] >> 6)];
        let tier = if g[0] & 0x20 != 0 { 'H' } else { 'L' };
        let compat = u32::from_be_bytes([g[1], g[2], g[3], g[4]]).reverse_bits();
        let mut s = format!("hvc1.{space}{}.{compat:X}.{tier}{}", g[0] & 0x1f, g[11]);
        // The constraint bytes, trailing zero bytes left out.
        let constraints = &g[5..11];
        let keep = constraints.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        for b in &constraints[..keep] {
            s.push_str(&format!(".{b:X}"));
        }
        s
    }

    /// The `hvcC` box body (ISO/IEC 14496-15 §8.3.3.1) with these parameter sets.
    pub fn hvcc(&self, vps: &[u8], sps: &[u8], pps: &[u8]) -> Vec<u8> {
        let mut o = vec![1];
        o.extend_from_slice(&self.general[..1]);
        o.extend_from_slice(&self.general[1..5]); // compatibility flags
        o.extend_from_slice(&self.general[5..11]); // constraint flags
        o.push(self.general[11]); // level
        o.extend_from_slice(&[0xf0, 0x00]); // min_spatial_segmentation_idc 0
        o.push(0xfc); // parallelismType 0
        o.push(0xfc | self.chroma_format_idc);
        o.push(0xf8 | (self.bit_depth_luma - 8));
        o.push(0xf8 | (self.bit_depth_chroma - 8));
        o.extend_from_slice(&[0, 0]); // avgFrameRate unknown
                                      // constantFrameRate 0, numTemporalLayers, temporalIdNested, 4-byte NAL lengths.
        o.push(((self.max_sub_layers & 7) << 3) | (u8::from(self.temporal_id_nested) << 2) | 3);
        o.push(3);
        for (kind, nal) in [(32u8, vps), (33, sps), (34, pps)] {
            o.push(0x80 | kind); // complete: the samples carry no parameter sets
            o.extend_from_slice(&1u16.to_be_bytes());
            o.extend_from_slice(&(nal.len() as u16).to_be_bytes());
            o.extend_from_slice(nal);
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The SPS of the repo's HEVC test clip (x265, 320×192, Main, temporal layers).
    fn clip_sps() -> Vec<u8> {
        let clip = include_bytes!("../../../../testdata/video/hevc/x265_temporal_320x192.265");
        crate::codec::annexb::nal_units(clip).find(|n| n.len() > 2 && (n[0] >> 1) & 0x3f == 33).unwrap().to_vec()
    }

    #[test]
    fn the_clips_sps_reads() {
        let info = parse_sps(&clip_sps()).unwrap();
        assert_eq!((info.width, info.height), (320, 192));
        assert_eq!((info.chroma_format_idc, info.bit_depth_luma, info.bit_depth_chroma), (1, 8, 8));
        assert_eq!(info.general[0] & 0x1f, 1, "Main profile");
        assert!(info.max_sub_layers > 1, "temporal layers: {}", info.max_sub_layers);
        assert!(info.codec().starts_with("hvc1.1.6.L"), "{}", info.codec());
    }

    #[test]
    fn hvcc_carries_the_parameter_sets_whole() {
        let sps = clip_sps();
        let info = parse_sps(&sps).unwrap();
        let c = info.hvcc(&[0x40, 1, 9], &sps, &[0x44, 1, 7]);
        assert_eq!((c[0], c[1], c[12]), (1, info.general[0], info.general[11]));
        assert_eq!(c[22], 3, "three arrays");
        assert_eq!(&c[23..26], &[0x80 | 32, 0, 1]);
        assert!(c.windows(sps.len()).any(|w| w == sps.as_slice()));
        assert_eq!(c.len(), 23 + 3 * 5 + 3 + sps.len() + 3);
    }

    #[test]
    fn not_an_sps_is_none() {
        assert_eq!(parse_sps(&[]), None);
        assert_eq!(parse_sps(&[0x40, 1, 0, 0]), None, "a VPS");
        let mut cut = clip_sps();
        cut.truncate(8);
        assert_eq!(parse_sps(&cut), None);
    }

    /// Found by fuzzing: a conformance window so large that its crop overflowed, and a bit
    /// depth that overflowed.
    #[test]
    fn overflowing_fields_are_refused() {
        for hex in [
            "422686817a7e1600dadad5bebebebabebebebe2bbebebeae25ff000000000000000201000000568141c9\
             02aa51555500aaaa553daa8181000001000000000000040a81812081",
            "422686817a7e1600dadad502aa51555500aaaa553daa818100000000ffffffffffffffffff70ffffffff\
             ffffffffffffffffffffff0000000000810a81812081",
        ] {
            let hex: String = hex.split_whitespace().collect();
            let nal: Vec<u8> =
                (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            assert_eq!(parse_sps(&nal), None, "{hex}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut nal = vec![0x42, 0x01];
            nal.extend(data);
            let _ = parse_sps(&nal);
        }
    }
}
