// pion-peer is a second WebRTC stack for fanout's tests: pion (Go), independent of the relay's
// str0m, playing a path over WHEP and publishing one over WHIP.
//
//	pion-peer whep URL [-seconds N] [-drop P] [-h264 FILE] [-pli MS] [-kbps K]
//	    Plays URL for N seconds (or until the relay ends the stream). Drops a fraction P of
//	    the incoming video packets before pion's NACK generator sees them, as a lossy link
//	    would, so repairs come from the relay. Writes the complete frames as Annex B H.264
//	    (or H.265, if that is what the relay sends) to FILE (for a decoder to count) and a JSON report to stdout. With -pli it asks for a
//	    keyframe (PLI) every MS milliseconds, as a player that keeps losing pictures would.
//	    With -kbps it is behind a link of K kbit/s: what arrives is queued (at most
//	    -queue-ms) and let through at that rate, the rest dropped, before pion's transport-wide
//	    congestion feedback (which it sends) sees it.
//	pion-peer whip URL -h264 FILE [-fps F] [-seconds N]
//	    Publishes the Annex B H.264 FILE, looped, at F frames a second for N seconds, then
//	    ends with DELETE; a JSON report to stdout.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/rtp/codecs"
	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"
	"github.com/pion/webrtc/v4/pkg/media/h264reader"
)

func main() {
	if len(os.Args) < 3 {
		fail("usage: pion-peer whep|whip URL [flags]")
	}
	mode, target := os.Args[1], os.Args[2]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	seconds := fs.Float64("seconds", 10, "how long to play or publish")
	drop := fs.Float64("drop", 0, "fraction of incoming video packets to drop (whep)")
	h264 := fs.String("h264", "", "Annex B H.264: written (whep) or sent (whip)")
	fps := fs.Float64("fps", 25, "frames a second (whip)")
	pli := fs.Int("pli", 0, "ask for a keyframe every this many ms (whep; 0: never)")
	kbps := fs.Float64("kbps", 0, "the link's rate in kbit/s (whep; 0: unlimited)")
	queueMs := fs.Int("queue-ms", 100, "the link's queue in ms of its rate (whep, with -kbps)")
	_ = fs.Parse(os.Args[3:])
	d := time.Duration(*seconds * float64(time.Second))
	var report any
	switch mode {
	case "whep":
		link := &shaper{bps: *kbps * 1000, limit: time.Duration(*queueMs) * time.Millisecond, start: time.Now(), half: d / 2}
		report = play(target, d, *drop, *h264, time.Duration(*pli)*time.Millisecond, link)
	case "whip":
		if *h264 == "" {
			fail("whip needs -h264 FILE")
		}
		report = publish(target, d, *h264, *fps)
	default:
		fail("unknown mode " + mode)
	}
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
}

func fail(why string) {
	fmt.Fprintln(os.Stderr, "pion-peer: "+why)
	os.Exit(2)
}

// newPeer is a peer connection with these codecs and interceptors.
func newPeer(m *webrtc.MediaEngine, ir *interceptor.Registry) *webrtc.PeerConnection {
	api := webrtc.NewAPI(webrtc.WithMediaEngine(m), webrtc.WithInterceptorRegistry(ir))
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		fail(err.Error())
	}
	return pc
}

// signal POSTs the offer and sets the answer; it returns the resource URL.
func signal(pc *webrtc.PeerConnection, target string) string {
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		fail("offer: " + err.Error())
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		fail("local description: " + err.Error())
	}
	<-gathered
	resp, err := http.Post(target, "application/sdp", strings.NewReader(pc.LocalDescription().SDP))
	if err != nil {
		fail("POST: " + err.Error())
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		fail(fmt.Sprintf("POST answered %d: %s", resp.StatusCode, body))
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(body)}); err != nil {
		fail("answer: " + err.Error())
	}
	base, _ := url.Parse(target)
	loc, err := base.Parse(resp.Header.Get("Location"))
	if err != nil {
		fail("Location: " + err.Error())
	}
	return loc.String()
}

func hangUp(resource string) {
	req, _ := http.NewRequest(http.MethodDelete, resource, nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// lossy drops a fraction of incoming video packets (the main stream and its repairs) next
// to the network, and counts the NACKs written.
type lossy struct {
	interceptor.NoOp
	p       float64
	mu      sync.Mutex
	dropped int
	nacks   int
}

func (l *lossy) NewInterceptor(string) (interceptor.Interceptor, error) { return l, nil }

func (l *lossy) BindRemoteStream(info *interceptor.StreamInfo, r interceptor.RTPReader) interceptor.RTPReader {
	if l.p <= 0 || !strings.HasPrefix(strings.ToLower(info.MimeType), "video/") {
		return r
	}
	return interceptor.RTPReaderFunc(func(b []byte, a interceptor.Attributes) (int, interceptor.Attributes, error) {
		for {
			n, a2, err := r.Read(b, a)
			if err != nil || rand.Float64() >= l.p {
				return n, a2, err
			}
			l.mu.Lock()
			l.dropped++
			l.mu.Unlock()
		}
	})
}

func (l *lossy) BindRTCPWriter(w interceptor.RTCPWriter) interceptor.RTCPWriter {
	return interceptor.RTCPWriterFunc(func(pkts []rtcp.Packet, a interceptor.Attributes) (int, error) {
		for _, p := range pkts {
			if _, ok := p.(*rtcp.TransportLayerNack); ok {
				l.mu.Lock()
				l.nacks++
				l.mu.Unlock()
			}
		}
		return w.Write(pkts, a)
	})
}

// shaper is a link of a fixed rate with a drop-tail queue, next to the network: every
// incoming packet (video, audio, repairs, padding) leaves the queue at the rate, and one
// that would wait longer than limit is dropped. A goroutine per stream takes packets as
// they come, so the wait is the queue's, not the reader's.
type shaper struct {
	interceptor.NoOp
	bps   float64
	limit time.Duration
	start time.Time
	half  time.Duration // drops after this count as late: the link's loss once adapted
	mu    sync.Mutex
	free  time.Time // when the link is next free
	// Packets and bytes let through, those dropped, and those dropped in the second half.
	passed, dropped, droppedLate int
	bytes, bytesLate             int
}

func (s *shaper) NewInterceptor(string) (interceptor.Interceptor, error) { return s, nil }

type queued struct {
	b   []byte
	a   interceptor.Attributes
	at  time.Time
	err error
}

func (s *shaper) BindRemoteStream(_ *interceptor.StreamInfo, r interceptor.RTPReader) interceptor.RTPReader {
	if s.bps <= 0 {
		return r
	}
	q := make(chan queued, 8192)
	go func() {
		for {
			buf := make([]byte, 1500)
			n, a, err := r.Read(buf, nil)
			if err != nil {
				q <- queued{err: err}
				return
			}
			now := time.Now()
			s.mu.Lock()
			from := s.free
			if from.Before(now) {
				from = now
			}
			late := now.Sub(s.start) > s.half
			if from.Sub(now) > s.limit {
				s.dropped++
				if late {
					s.droppedLate++
				}
				s.mu.Unlock()
				continue
			}
			s.free = from.Add(time.Duration(float64(n*8) / s.bps * float64(time.Second)))
			s.passed++
			s.bytes += n
			if late {
				s.bytesLate += n
			}
			at := s.free
			s.mu.Unlock()
			q <- queued{b: buf[:n], a: a, at: at}
		}
	}()
	return interceptor.RTPReaderFunc(func(b []byte, _ interceptor.Attributes) (int, interceptor.Attributes, error) {
		p := <-q
		if p.err != nil {
			return 0, nil, p.err
		}
		time.Sleep(time.Until(p.at))
		return copy(b, p.b), p.a, nil
	})
}

// linkReport is what the shaper saw.
type linkReport struct {
	Kbps        float64 `json:"kbps"`
	Passed      int     `json:"passed"`
	Dropped     int     `json:"dropped"`
	DroppedLate int     `json:"dropped_second_half"`
	// What got through in the second half, in kbit/s.
	KbpsLate float64 `json:"kbps_second_half"`
}

type playReport struct {
	Connected      bool `json:"connected"`
	VideoPackets   int  `json:"video_packets"`
	AudioPackets   int  `json:"audio_packets"`
	Dropped        int  `json:"dropped"`
	NacksSent      int  `json:"nacks_sent"`
	FramesExpected int  `json:"frames_expected"`
	FramesComplete int  `json:"frames_complete"`
	FramesLost     int  `json:"frames_lost"`
	// Of those lost, the ones the sender left out: no packet of theirs and no sequence
	// number missing where they would be (a layer dropped on purpose, renumbered).
	FramesSkipped int         `json:"frames_skipped"`
	LostFraction  float64     `json:"lost_fraction"`
	FirstKeyframe bool        `json:"starts_with_keyframe"`
	PlisSent      int         `json:"plis_sent"`
	Ended         string      `json:"ended"`
	Codec         string      `json:"codec"`
	Link          *linkReport `json:"link,omitempty"`
}

func play(target string, d time.Duration, drop float64, out string, pli time.Duration, link *shaper) playReport {
	m := &webrtc.MediaEngine{}
	if err := m.RegisterDefaultCodecs(); err != nil {
		fail(err.Error())
	}
	ir := &interceptor.Registry{}
	loss := &lossy{p: drop}
	ir.Add(link) // first: the network
	ir.Add(loss) // then: between the network and the NACK generator
	if err := webrtc.ConfigureNack(m, ir); err != nil {
		fail(err.Error())
	}
	if err := webrtc.ConfigureRTCPReports(ir); err != nil {
		fail(err.Error())
	}
	if err := webrtc.ConfigureTWCCSender(m, ir); err != nil {
		fail(err.Error())
	}
	pc := newPeer(m, ir)
	defer pc.Close()
	for _, k := range []webrtc.RTPCodecType{webrtc.RTPCodecTypeVideo, webrtc.RTPCodecTypeAudio} {
		if _, err := pc.AddTransceiverFromKind(k, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionRecvonly}); err != nil {
			fail(err.Error())
		}
	}
	var mu sync.Mutex
	video := map[uint64]*rtp.Packet{}
	var newest uint64 // the newest video packet's extended sequence number
	rep := playReport{}
	done := make(chan string, 4)
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		switch s {
		case webrtc.PeerConnectionStateConnected:
			mu.Lock()
			rep.Connected = true
			mu.Unlock()
		case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateClosed, webrtc.PeerConnectionStateDisconnected:
			done <- "connection " + s.String()
		}
	})
	pc.OnTrack(func(t *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		isVideo := t.Kind() == webrtc.RTPCodecTypeVideo
		if isVideo {
			mu.Lock()
			rep.Codec = t.Codec().MimeType
			mu.Unlock()
		}
		if isVideo && pli > 0 {
			go func() {
				for range time.Tick(pli) {
					if pc.WriteRTCP([]rtcp.Packet{&rtcp.PictureLossIndication{MediaSSRC: uint32(t.SSRC())}}) != nil {
						return
					}
					mu.Lock()
					rep.PlisSent++
					mu.Unlock()
				}
			}()
		}
		var ext uint64
		var have bool
		for {
			p, _, err := t.ReadRTP()
			if err != nil {
				done <- "track: " + err.Error()
				return
			}
			mu.Lock()
			if !isVideo {
				rep.AudioPackets++
				mu.Unlock()
				continue
			}
			rep.VideoPackets++
			// Extends the 16-bit sequence number around the newest one seen.
			if !have {
				ext, have = uint64(p.SequenceNumber)+1<<20, true
			} else {
				delta := int16(p.SequenceNumber - uint16(ext))
				ext = uint64(int64(ext) + int64(delta))
			}
			if _, dup := video[ext]; !dup {
				video[ext] = p
			}
			if ext > newest {
				newest = ext
			}
			mu.Unlock()
		}
	})
	resource := signal(pc, target)
	select {
	case why := <-done:
		rep.Ended = why
	case <-time.After(d):
		rep.Ended = "time"
	}
	// What was on its way then gets a second to be repaired; later frames do not count.
	mu.Lock()
	last := newest
	mu.Unlock()
	if rep.Ended == "time" {
		time.Sleep(time.Second)
	}
	hangUp(resource)
	mu.Lock()
	defer mu.Unlock()
	for s, p := range video {
		if s > last && (video[last] == nil || p.Timestamp != video[last].Timestamp) {
			delete(video, s)
		}
	}
	loss.mu.Lock()
	rep.Dropped, rep.NacksSent = loss.dropped, loss.nacks
	loss.mu.Unlock()
	if link.bps > 0 {
		link.mu.Lock()
		rep.Link = &linkReport{
			Kbps: link.bps / 1000, Passed: link.passed, Dropped: link.dropped, DroppedLate: link.droppedLate,
			KbpsLate: float64(link.bytesLate*8) / (d - link.half).Seconds() / 1000,
		}
		link.mu.Unlock()
	}
	frames(video, &rep, out)
	return rep
}

// frames counts the frames in what arrived: expected from the RTP times (a constant frame
// rate), complete where every packet from the one after the previous frame's marker to this
// frame's marker is there. The complete ones go to out as Annex B.
func frames(video map[uint64]*rtp.Packet, rep *playReport, out string) {
	if len(video) == 0 {
		return
	}
	seqs := make([]uint64, 0, len(video))
	for s := range video {
		seqs = append(seqs, s)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	// Frames by RTP time, in order of their first packet.
	type frame struct {
		ts       uint32
		min, max uint64
	}
	var order []*frame
	byTS := map[uint32]*frame{}
	for _, s := range seqs {
		p := video[s]
		f := byTS[p.Timestamp]
		if f == nil {
			f = &frame{ts: p.Timestamp, min: s, max: s}
			byTS[p.Timestamp] = f
			order = append(order, f)
		}
		f.max = s
	}
	// The frame step: the smallest advance of RTP time between frames.
	step := uint32(0)
	for i := 1; i < len(order); i++ {
		if d := order[i].ts - order[i-1].ts; d > 0 && d < 1<<31 && (step == 0 || d < step) {
			step = d
		}
	}
	if step > 0 {
		rep.FramesExpected = int((order[len(order)-1].ts-order[0].ts)/step) + 1
	} else {
		rep.FramesExpected = len(order)
	}
	var annexB bytes.Buffer
	for i, f := range order {
		complete := video[f.max].Marker
		for s := f.min; complete && s <= f.max; s++ {
			complete = video[s] != nil
		}
		// Its first packet follows the previous frame's last (the first frame excepted).
		if i > 0 {
			prev := video[f.min-1]
			complete = complete && prev != nil && prev.Marker
		}
		if !complete {
			if os.Getenv("PION_PEER_DEBUG") != "" {
				fmt.Fprintf(os.Stderr, "frame %d of %d incomplete (seq %d..%d)\n", i, len(order), f.min, f.max)
			}
			continue
		}
		rep.FramesComplete++
		hevc := strings.EqualFold(rep.Codec, webrtc.MimeTypeH265)
		var h codecs.H264Packet
		for s := f.min; s <= f.max; s++ {
			if hevc {
				annexB.Write(h265AnnexB(video[s].Payload))
			} else if nal, err := h.Unmarshal(video[s].Payload); err == nil {
				annexB.Write(nal)
			}
		}
		if i == 0 {
			rep.FirstKeyframe = startsWithKeyframe(annexB.Bytes(), hevc)
		}
	}
	rep.FramesLost = rep.FramesExpected - rep.FramesComplete
	for i := 1; step > 0 && i < len(order); i++ {
		d := order[i].ts - order[i-1].ts
		if d > step && d < 1<<31 && order[i].min == order[i-1].max+1 {
			rep.FramesSkipped += int(d/step) - 1
		}
	}
	if rep.FramesExpected > 0 {
		rep.LostFraction = float64(rep.FramesLost) / float64(rep.FramesExpected)
	}
	if out != "" {
		if err := os.WriteFile(out, annexB.Bytes(), 0o644); err != nil {
			fail(err.Error())
		}
	}
}

// startsWithKeyframe: the Annex B bytes' first NAL units hold parameter sets or an IDR
// (H.265: IRAP) slice before any other slice.
func startsWithKeyframe(b []byte, hevc bool) bool {
	for _, nal := range bytes.Split(b, []byte{0, 0, 1}) {
		if len(nal) == 0 || hevc && len(nal) < 2 { // (a 4-byte start code's first zero)
			continue
		}
		if hevc {
			switch t := (nal[0] >> 1) & 0x3f; {
			case t >= 16 && t <= 21, t >= 32 && t <= 34:
				return true
			case t < 16:
				return false
			}
			continue
		}
		switch nal[0] & 0x1f {
		case 5, 7:
			return true
		case 1:
			return false
		}
	}
	return false
}

// h265AnnexB is one RTP payload of H.265 (RFC 7798, no DONL) as Annex B: a NAL unit with its
// start code, an aggregation packet's units each with one, a fragment's bytes (the first with
// the start code and the NAL unit header it rebuilds).
func h265AnnexB(p []byte) []byte {
	if len(p) < 3 {
		return nil
	}
	start := []byte{0, 0, 0, 1}
	switch (p[0] >> 1) & 0x3f {
	case 48: // aggregation packet: 2-byte sizes
		var out []byte
		for rest := p[2:]; len(rest) >= 2; {
			n := int(rest[0])<<8 | int(rest[1])
			if n == 0 || len(rest) < 2+n {
				break
			}
			out = append(append(out, start...), rest[2:2+n]...)
			rest = rest[2+n:]
		}
		return out
	case 49: // fragmentation unit
		if p[2]&0x80 != 0 {
			header := []byte{p[0]&0x81 | (p[2]&0x3f)<<1, p[1]}
			return append(append(append([]byte{}, start...), header...), p[3:]...)
		}
		return append([]byte{}, p[3:]...)
	default:
		return append(append([]byte{}, start...), p...)
	}
}

type publishReport struct {
	Connected  bool   `json:"connected"`
	FramesSent int    `json:"frames_sent"`
	Plis       int    `json:"plis"`
	Ended      string `json:"ended"`
}

func publish(target string, d time.Duration, file string, fps float64) publishReport {
	units := accessUnits(file)
	if len(units) == 0 {
		fail("no access units in " + file)
	}
	m := &webrtc.MediaEngine{}
	if err := m.RegisterDefaultCodecs(); err != nil {
		fail(err.Error())
	}
	ir := &interceptor.Registry{}
	if err := webrtc.RegisterDefaultInterceptors(m, ir); err != nil {
		fail(err.Error())
	}
	pc := newPeer(m, ir)
	defer pc.Close()
	track, err := webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{
		MimeType: webrtc.MimeTypeH264, ClockRate: 90000,
		SDPFmtpLine: "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=64001f",
	}, "video", "pion-peer")
	if err != nil {
		fail(err.Error())
	}
	sender, err := pc.AddTransceiverFromTrack(track, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendonly})
	if err != nil {
		fail(err.Error())
	}
	rep := publishReport{}
	var mu sync.Mutex
	go func() {
		for {
			pkts, _, err := sender.Sender().ReadRTCP()
			if err != nil {
				return
			}
			for _, p := range pkts {
				if _, ok := p.(*rtcp.PictureLossIndication); ok {
					mu.Lock()
					rep.Plis++
					mu.Unlock()
				}
			}
		}
	}()
	connected := make(chan struct{})
	var once sync.Once
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		if s == webrtc.PeerConnectionStateConnected {
			once.Do(func() { close(connected) })
		}
	})
	resource := signal(pc, target)
	select {
	case <-connected:
		rep.Connected = true
	case <-time.After(15 * time.Second):
		rep.Ended = "not connected in 15 s"
		return rep
	}
	frame := time.Duration(float64(time.Second) / fps)
	tick := time.NewTicker(frame)
	defer tick.Stop()
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		if err := track.WriteSample(media.Sample{Data: units[i%len(units)], Duration: frame}); err != nil {
			rep.Ended = "write: " + err.Error()
			break
		}
		mu.Lock()
		rep.FramesSent++
		mu.Unlock()
		<-tick.C
	}
	if rep.Ended == "" {
		rep.Ended = "time"
	}
	hangUp(resource)
	mu.Lock()
	defer mu.Unlock()
	return rep
}

// accessUnits splits an Annex B file into access units (a new one starts at an access unit
// delimiter, SPS, PPS or SEI, or at a slice whose first_mb_in_slice is 0, once the current
// one holds a slice); each unit is Annex B again.
func accessUnits(file string) [][]byte {
	f, err := os.Open(file)
	if err != nil {
		fail(err.Error())
	}
	defer f.Close()
	r, err := h264reader.NewReader(f)
	if err != nil {
		fail(err.Error())
	}
	var units [][]byte
	var cur []byte
	hasSlice := false
	for {
		nal, err := r.NextNAL()
		if err != nil {
			break
		}
		t := nal.Data[0] & 0x1f
		starts := t == 9 || t == 7 || t == 8 || t == 6 || ((t == 1 || t == 5) && len(nal.Data) > 1 && nal.Data[1]&0x80 != 0)
		if starts && hasSlice {
			units = append(units, cur)
			cur, hasSlice = nil, false
		}
		if t == 9 {
			continue
		}
		cur = append(cur, 0, 0, 0, 1)
		cur = append(cur, nal.Data...)
		hasSlice = hasSlice || t == 1 || t == 5
	}
	if hasSlice {
		units = append(units, cur)
	}
	return units
}
