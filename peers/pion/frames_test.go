package main

import (
	"testing"

	"github.com/pion/rtp"
)

// Frames of one packet each, 10 RTP ticks apart: ts of the ones that arrive, their sequence
// numbers consecutive unless gap says where one is missing.
func arrived(ts []uint32, gapAfter int) map[uint64]*rtp.Packet {
	v := map[uint64]*rtp.Packet{}
	seq := uint64(100)
	for i, t := range ts {
		v[seq] = &rtp.Packet{Header: rtp.Header{Timestamp: t, Marker: true, SequenceNumber: uint16(seq)}}
		seq++
		if i == gapAfter {
			seq++
		}
	}
	return v
}

func TestALeftOutFrameIsSkippedAndAMissingOneIsNot(t *testing.T) {
	// The frame at 30 never came, and no sequence number is missing: the sender left it out.
	rep := playReport{}
	frames(arrived([]uint32{0, 10, 20, 40, 50}, -1), &rep, "")
	if rep.FramesExpected != 6 || rep.FramesLost != 1 || rep.FramesSkipped != 1 {
		t.Fatalf("%+v", rep)
	}
	// Its packet is missing (a sequence number left free): lost, not skipped; the next frame
	// is whole but does not follow a marker, so it counts as lost too.
	rep = playReport{}
	frames(arrived([]uint32{0, 10, 20, 40, 50}, 2), &rep, "")
	if rep.FramesExpected != 6 || rep.FramesLost != 2 || rep.FramesSkipped != 0 {
		t.Fatalf("%+v", rep)
	}
}
