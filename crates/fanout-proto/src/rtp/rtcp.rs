//! RTCP receiver and sender reports (RFC 3550 §6.4), sans-IO: what a client's reports say
//! about the stream it gets (fraction and cumulative loss, highest sequence number, jitter,
//! and the round-trip time from LSR/DLSR). Compound packets are walked whole; other packet
//! types are skipped by their length.

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RtcpError {
    #[error("shorter than an RTCP header")]
    Short,
    #[error("not RTP version 2")]
    Version,
    #[error("a length runs past the datagram")]
    Length,
    #[error("a report block count runs past its packet")]
    Count,
}

/// One reception report block: what the reporter saw of source `ssrc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportBlock {
    pub ssrc: u32,
    /// Fraction of packets lost since the previous report, in 1/256.
    pub fraction_lost: u8,
    /// Packets lost since the start (signed: duplicates can make it negative).
    pub cumulative_lost: i32,
    /// Extended highest sequence number received.
    pub highest_seq: u32,
    /// Interarrival jitter, in timestamp units.
    pub jitter: u32,
    /// Middle 32 bits of the NTP time of the last SR received from `ssrc` (0: none).
    pub lsr: u32,
    /// Delay since that SR, in 1/65536 s.
    pub dlsr: u32,
}

/// A receiver report (PT 201) or a sender report (PT 200).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub reporter: u32,
    pub sender: bool,
    /// A sender report's sender info: its wall clock against its RTP time.
    pub info: Option<SenderInfo>,
    pub blocks: Vec<ReportBlock>,
}

/// The sender info of a sender report (RFC 3550 §6.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderInfo {
    /// NTP timestamp (64 bits: seconds since 1900, fraction).
    pub ntp: u64,
    /// The same instant on the stream's RTP clock.
    pub rtp: u32,
    pub packets: u32,
    pub octets: u32,
}

impl Report {
    /// A sender report's reporter and sender info.
    pub fn sender_info(&self) -> Option<(u32, SenderInfo)> {
        self.info.map(|i| (self.reporter, i))
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The reports in a (compound) RTCP datagram.
pub fn parse_reports(mut buf: &[u8]) -> Result<Vec<Report>, RtcpError> {
    let mut out = Vec::new();
    if buf.len() < 4 {
        return Err(RtcpError::Short);
    }
    while !buf.is_empty() {
        if buf.len() < 4 {
            return Err(RtcpError::Short);
        }
        if buf[0] >> 6 != 2 {
            return Err(RtcpError::Version);
        }
        let count = usize::from(buf[0] & 0x1f);
        let pt = buf[1];
        let len = (usize::from(u16::from_be_bytes([buf[2], buf[3]])) + 1) * 4;
        if len > buf.len() {
            return Err(RtcpError::Length);
        }
        let pkt = &buf[..len];
        let fixed = match pt {
            200 => Some(28), // header, SSRC, 20 bytes of sender info
            201 => Some(8),
            _ => None,
        };
        if let Some(fixed) = fixed {
            if fixed + count * 24 > pkt.len() {
                return Err(RtcpError::Count);
            }
            let blocks = (0..count)
                .map(|i| {
                    let b = &pkt[fixed + i * 24..fixed + (i + 1) * 24];
                    // 24-bit two's complement.
                    let cum = (be32(&b[4..8]) & 0x00ff_ffff) as i32;
                    ReportBlock {
                        ssrc: be32(&b[0..4]),
                        fraction_lost: b[4],
                        cumulative_lost: (cum << 8) >> 8,
                        highest_seq: be32(&b[8..12]),
                        jitter: be32(&b[12..16]),
                        lsr: be32(&b[16..20]),
                        dlsr: be32(&b[20..24]),
                    }
                })
                .collect();
            let info = (pt == 200).then(|| SenderInfo {
                ntp: u64::from(be32(&pkt[8..12])) << 32 | u64::from(be32(&pkt[12..16])),
                rtp: be32(&pkt[16..20]),
                packets: be32(&pkt[20..24]),
                octets: be32(&pkt[24..28]),
            });
            out.push(Report { reporter: be32(&pkt[4..8]), sender: pt == 200, info, blocks });
        }
        buf = &buf[len..];
    }
    Ok(out)
}

/// The media SSRCs a (compound) RTCP packet asks keyframes of: PLI (RFC 4585 §6.3.1: PT 206,
/// FMT 1, the media source in the common part) and FIR (RFC 5104 §4.3.1: PT 206, FMT 4, an
/// SSRC per 8-byte FCI entry). A malformed packet ends the walk; what came before it stands.
pub fn keyframe_requests(mut buf: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    while buf.len() >= 4 && buf[0] >> 6 == 2 {
        let len = (usize::from(u16::from_be_bytes([buf[2], buf[3]])) + 1) * 4;
        if len > buf.len() {
            break;
        }
        let pkt = &buf[..len];
        match (pkt[1], pkt[0] & 0x1f) {
            (206, 1) if len >= 12 => out.push(be32(&pkt[8..12])),
            (206, 4) => out.extend(pkt.get(12..).unwrap_or_default().chunks_exact(8).map(be32)),
            _ => {}
        }
        buf = &buf[len..];
    }
    out
}

/// Writes a picture loss indication from `sender` about `media` (RFC 4585 §6.3.1); a
/// compound packet starts with a report before it (`write_keyframe_request`).
pub fn write_pli(out: &mut Vec<u8>, sender: u32, media: u32) {
    out.extend_from_slice(&[0x81, 206, 0, 2]);
    out.extend_from_slice(&sender.to_be_bytes());
    out.extend_from_slice(&media.to_be_bytes());
}

/// Writes a compound packet asking `media`'s sender for a keyframe: an empty receiver
/// report from `reporter`, then a PLI.
pub fn write_keyframe_request(out: &mut Vec<u8>, reporter: u32, media: u32) {
    write_empty_report(out, reporter);
    write_pli(out, reporter, media);
}

/// A receiver report with no blocks: what a compound packet starts with (RFC 3550 §6.1)
/// when there is nothing to report.
fn write_empty_report(out: &mut Vec<u8>, reporter: u32) {
    out.extend_from_slice(&[0x80, 201, 0, 1]);
    out.extend_from_slice(&reporter.to_be_bytes());
}

/// Round-trip time from a block's LSR and DLSR at `now` (the middle 32 bits of our NTP
/// clock): RFC 3550 §6.4.1. `None` if the reporter has not seen a sender report yet.
pub fn round_trip(block: &ReportBlock, now_mid32: u32) -> Option<std::time::Duration> {
    if block.lsr == 0 {
        return None;
    }
    let units = now_mid32.wrapping_sub(block.lsr).wrapping_sub(block.dlsr);
    // A negative result (clock skew) wraps to a huge value: not a round trip.
    (units < 0x8000_0000).then(|| std::time::Duration::from_nanos(u64::from(units) * 1_000_000_000 / 65_536))
}

/// Writes a sender report without report blocks: the stream's `ssrc`, the wall clock as a
/// 64-bit NTP timestamp, the RTP timestamp of that instant, and the packets and payload
/// octets sent to this receiver so far.
pub fn write_sender_report(out: &mut Vec<u8>, ssrc: u32, ntp: u64, rtp_ts: u32, packets: u32, octets: u32) {
    out.extend_from_slice(&[0x80, 200, 0, 6]);
    out.extend_from_slice(&ssrc.to_be_bytes());
    out.extend_from_slice(&ntp.to_be_bytes());
    for v in [rtp_ts, packets, octets] {
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// A Unix time as a 64-bit NTP timestamp (seconds since 1900 in the high half).
pub fn ntp_from_unix(since_epoch: std::time::Duration) -> u64 {
    const NTP_UNIX_OFFSET: u64 = 2_208_988_800;
    let secs = since_epoch.as_secs() + NTP_UNIX_OFFSET;
    let frac = (u64::from(since_epoch.subsec_nanos()) << 32) / 1_000_000_000;
    (secs << 32) | frac
}

/// A track's map from wall clock to its RTP time, one for the track's whole life, across
/// the sources that feed it in turn (publishers, upstream sessions, failovers). Each source's
/// sender reports are read against the relay's own wall clock: the first report of a source
/// fixes how its clock stands to ours (the arrival time), so a source whose clock is hours off
/// (one publisher's NTP said 12,355 s before another's) moves nothing. Sans-IO: the caller
/// passes the relay's NTP time of arrival.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClockMap {
    /// Our NTP time minus the current source's, from its first report.
    offset: Option<u64>,
    /// (our NTP time, the track's RTP time then).
    map: Option<(u64, u32)>,
}

impl ClockMap {
    /// A new source feeds the track: the map stands until its first report.
    pub fn new_source(&mut self) {
        self.offset = None;
    }

    /// A sender report: the source's NTP time `sr_ntp` was the track's RTP time `rtp`
    /// (already mapped onto the track's one timeline); it arrived at our `now_ntp`.
    pub fn report(&mut self, sr_ntp: u64, rtp: u32, now_ntp: u64) {
        let offset = *self.offset.get_or_insert(now_ntp.wrapping_sub(sr_ntp));
        self.map = Some((sr_ntp.wrapping_add(offset), rtp));
    }

    /// (our NTP time, RTP time), once a report came.
    pub fn get(&self) -> Option<(u64, u32)> {
        self.map
    }
}

/// The middle 32 bits of an NTP timestamp: what LSR carries.
pub fn ntp_mid32(ntp: u64) -> u32 {
    (ntp >> 16) as u32
}

/// Writes the end of a stream for a receiver: an empty receiver report (a compound packet
/// starts with a report, RFC 3550 §6.1) and a BYE for `ssrc` (§6.6).
pub fn write_bye(out: &mut Vec<u8>, ssrc: u32) {
    write_empty_report(out, ssrc);
    out.extend_from_slice(&[0x81, 203, 0, 1]);
    out.extend_from_slice(&ssrc.to_be_bytes());
}

/// Writes a receiver report with one block (for tests and the upstream side).
pub fn write_receiver_report(out: &mut Vec<u8>, reporter: u32, b: &ReportBlock) {
    out.extend_from_slice(&[0x81, 201, 0, 7]);
    out.extend_from_slice(&reporter.to_be_bytes());
    out.extend_from_slice(&b.ssrc.to_be_bytes());
    let cum = (b.cumulative_lost as u32) & 0x00ff_ffff;
    out.extend_from_slice(&((u32::from(b.fraction_lost) << 24) | cum).to_be_bytes());
    for v in [b.highest_seq, b.jitter, b.lsr, b.dlsr] {
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report and a PLI make one compound packet: the report parses, the PLI names its
    /// media; a FIR's entries are read too, and a truncated packet ends the walk.
    #[test]
    fn keyframe_requests_are_read_from_pli_and_fir() {
        let mut b = Vec::new();
        write_receiver_report(
            &mut b,
            7,
            &ReportBlock {
                ssrc: 0xabc,
                fraction_lost: 0,
                cumulative_lost: 0,
                highest_seq: 1,
                jitter: 0,
                lsr: 0,
                dlsr: 0,
            },
        );
        write_pli(&mut b, 7, 0xabc);
        assert_eq!(parse_reports(&b).unwrap().len(), 1);
        assert_eq!(keyframe_requests(&b), vec![0xabc]);
        // FIR with two entries (SSRC, sequence number, reserved).
        let mut fir = vec![0x84, 206, 0, 6, 0, 0, 0, 7, 0, 0, 0, 0];
        fir.extend_from_slice(&[0, 0, 0, 1, 9, 0, 0, 0, 0, 0, 0, 2, 9, 0, 0, 0]);
        b.extend_from_slice(&fir);
        assert_eq!(keyframe_requests(&b), vec![0xabc, 1, 2]);
        b.extend_from_slice(&[0x81, 206, 0, 9, 1, 2]);
        assert_eq!(keyframe_requests(&b), vec![0xabc, 1, 2], "a truncated packet adds nothing");
        let mut k = Vec::new();
        write_keyframe_request(&mut k, 7, 0xdef);
        let reports = parse_reports(&k).unwrap();
        assert!(reports.len() == 1 && reports[0].blocks.is_empty() && reports[0].reporter == 7);
        assert_eq!(keyframe_requests(&k), vec![0xdef]);
        // A generic NACK (FMT 1 of PT 205) is not a keyframe request.
        assert!(keyframe_requests(&[0x81, 205, 0, 2, 0, 0, 0, 7, 0, 0, 0, 9]).is_empty());
    }

    proptest::proptest! {
        /// Any bytes: no panic, and at most one SSRC per four bytes.
        #[test]
        fn keyframe_requests_of_any_bytes(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            proptest::prop_assert!(keyframe_requests(&b).len() <= b.len() / 4);
        }
    }

    /// A BYE parses as a compound packet of a report with no blocks, then the BYE.
    #[test]
    fn a_bye_is_a_valid_compound_packet() {
        let mut b = Vec::new();
        write_bye(&mut b, 0xfa0e);
        assert_eq!(b.len(), 16);
        let reports = parse_reports(&b).unwrap();
        assert!(
            reports.len() == 1 && !reports[0].sender && reports[0].blocks.is_empty() && reports[0].reporter == 0xfa0e
        );
        assert_eq!((b[8] & 0x1f, b[9], &b[12..]), (1, 203, &0xfa0eu32.to_be_bytes()[..]));
    }

    /// Issue 30 item 9: a second source whose clock is hours behind the first's moves the
    /// map by nothing; reports of one source keep their spacing (its own clock's rate).
    #[test]
    fn one_clock_map_across_sources() {
        let sec = 1u64 << 32;
        let ours = 4_000_000_000 * sec;
        let mut m = ClockMap::default();
        let theirs = 20_000 * sec;
        m.report(theirs, 90_000, ours);
        assert_eq!(m.get(), Some((ours, 90_000)));
        m.report(theirs + 5 * sec, 540_000, ours + 5 * sec + sec / 100);
        assert_eq!(m.get(), Some((ours + 5 * sec, 540_000)), "the source's own spacing");
        // A new publisher, its clock 12,355 s behind; the track's timeline continues (the
        // restamper joined it) at 10 s.
        m.new_source();
        assert_eq!(m.get(), Some((ours + 5 * sec, 540_000)), "kept until it reports");
        m.report(theirs + 10 * sec - 12_355 * sec, 990_000, ours + 10 * sec);
        let (ntp, rtp) = m.get().unwrap();
        assert_eq!((ntp, rtp), (ours + 10 * sec, 990_000));
        // RTP time now from the map, 1 s later: exactly one second on.
        let now = ours + 11 * sec;
        let rtp_now = rtp as u64 + (now - ntp) * 90_000 / sec;
        assert_eq!(rtp_now, 1_080_000);
    }
    use proptest::prelude::*;

    fn block() -> impl Strategy<Value = ReportBlock> {
        (any::<u32>(), any::<u8>(), -(1i32 << 23)..(1i32 << 23), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(ssrc, fraction_lost, cumulative_lost, highest_seq, jitter, lsr, dlsr)| ReportBlock {
                ssrc,
                fraction_lost,
                cumulative_lost,
                highest_seq,
                jitter,
                lsr,
                dlsr,
            })
    }

    #[test]
    fn a_compound_packet_with_sdes_after_the_report() {
        let b = ReportBlock {
            ssrc: 0x4641_4e4f,
            fraction_lost: 64,
            cumulative_lost: -3,
            highest_seq: 70_000,
            jitter: 90,
            lsr: 0x1234_5678,
            dlsr: 65_536,
        };
        let mut buf = Vec::new();
        write_receiver_report(&mut buf, 7, &b);
        // SDES with a CNAME, as ffmpeg appends: skipped by its length.
        buf.extend_from_slice(&[0x81, 202, 0, 3, 0, 0, 0, 7, 1, 2, b'h', b'i', 0, 0, 0, 0]);
        let r = parse_reports(&buf).unwrap();
        assert_eq!(r, vec![Report { reporter: 7, sender: false, info: None, blocks: vec![b] }]);
        // LSR + DLSR (1 s) + 250 ms later: a 250 ms round trip.
        let rtt = round_trip(&b, 0x1234_5678 + 65_536 + 16_384).unwrap();
        assert_eq!(rtt.as_millis(), 250);
        assert_eq!(round_trip(&ReportBlock { lsr: 0, ..b }, 5), None);
    }

    #[test]
    fn lies_about_lengths_and_counts_are_errors() {
        assert_eq!(parse_reports(&[0x81, 201]), Err(RtcpError::Short));
        assert_eq!(parse_reports(&[0x41, 201, 0, 1, 0, 0, 0, 0]), Err(RtcpError::Version));
        assert_eq!(parse_reports(&[0x81, 201, 0, 9, 0, 0, 0, 0]), Err(RtcpError::Length));
        // Claims 2 blocks, holds none.
        assert_eq!(parse_reports(&[0x82, 201, 0, 1, 0, 0, 0, 0]), Err(RtcpError::Count));
    }

    #[test]
    fn a_sender_report_parses_as_one_without_blocks_and_its_time_round_trips() {
        let ntp = ntp_from_unix(std::time::Duration::new(1_700_000_000, 500_000_000));
        assert_eq!(ntp >> 32, 1_700_000_000 + 2_208_988_800);
        assert_eq!(ntp as u32, 1 << 31, "half a second");
        let mut buf = Vec::new();
        write_sender_report(&mut buf, 5, ntp, 90_000, 10, 13_160);
        assert_eq!(buf.len(), 28);
        let info = SenderInfo { ntp, rtp: 90_000, packets: 10, octets: 13_160 };
        let parsed = parse_reports(&buf).unwrap();
        assert_eq!(parsed, vec![Report { reporter: 5, sender: true, info: Some(info), blocks: vec![] }]);
        assert_eq!(parsed[0].sender_info(), Some((5, info)), "the sender info reads back as written");
        // A receiver that got it 1 s after and answers at once: one second later, ~0 RTT.
        let b = ReportBlock {
            ssrc: 5,
            fraction_lost: 0,
            cumulative_lost: 0,
            highest_seq: 0,
            jitter: 0,
            lsr: ntp_mid32(ntp),
            dlsr: 65_536,
        };
        assert_eq!(round_trip(&b, ntp_mid32(ntp) + 65_536 + 655).unwrap().as_millis(), 9);
    }

    proptest! {
        #[test]
        fn written_reports_parse_back(reporter in any::<u32>(), b in block()) {
            let mut buf = Vec::new();
            write_receiver_report(&mut buf, reporter, &b);
            prop_assert_eq!(parse_reports(&buf).unwrap(), vec![Report { reporter, sender: false, info: None, blocks: vec![b] }]);
        }

        /// Whatever a sender report says, its sender info reads back as written.
        #[test]
        fn sender_info_round_trips(ssrc: u32, ntp: u64, rtp: u32, packets: u32, octets: u32) {
            let mut buf = Vec::new();
            write_sender_report(&mut buf, ssrc, ntp, rtp, packets, octets);
            let r = parse_reports(&buf).unwrap();
            prop_assert_eq!(r[0].sender_info(), Some((ssrc, SenderInfo { ntp, rtp, packets, octets })));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), now in any::<u32>()) {
            if let Ok(reports) = parse_reports(&bytes) {
                for b in reports.iter().flat_map(|r| &r.blocks) {
                    let _ = round_trip(b, now);
                }
            }
        }
    }
}
