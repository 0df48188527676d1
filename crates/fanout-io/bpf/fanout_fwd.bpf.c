// SPDX-License-Identifier: GPL-2.0 OR MIT
// fanout's in-kernel data path: a TC ingress program that clones each source datagram of a
// session to every one of its UDP sinks, rewriting the IP/UDP (and Ethernet) headers with
// checksums updated incrementally, and redirects each clone to the sink's interface. The
// original goes on, headers restored, to the relay's own socket (accounting, TCP/HTTP sinks,
// and the sinks the kernel cannot reach). User space owns the maps' layout: see kernel.rs.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define CHUNK_SHIFT 8
#define CHUNK_SINKS (1u << CHUNK_SHIFT)
#define MAX_CHUNKS 1024 /* chunks per session: 262144 sinks, four default pools */
#define MAX_SESSIONS 256
#define RESOLVE_NS 1000000000ull /* a remote sink's route and neighbour are re-read each second */

/* Sink states (written by user space except RESOLVED/FALLBACK, written here). */
#define SINK_EMPTY 0
#define SINK_LOCAL 1      /* a local address: clone through lo */
#define SINK_REMOTE 2     /* resolve through the FIB, then clone to its egress */
#define SINK_RESOLVED 3   /* remote, resolved: ifindex and MACs valid */
#define SINK_FALLBACK 4   /* the kernel cannot reach it: user space sends to it */

#define REASON_LOOPBACK_FROM_AFAR 100
/* A capped sink met an aggregation packet, which a clone cannot shorten: user space takes the
 * sink over from this packet on (its RTP number in `handoff_seq`) and rebuilds aggregates. */
#define REASON_AGGREGATE 101

/* Set on the original while it is cloned, so clones that loop back through lo's ingress
 * skip the session lookup; the original gets its own mark back. */
#define CLONE_MARK 0xfa40u

/* A copy for another CPU's shard: SHARD_MARK | SHARD_FROM_LO (the original came through lo)
 * | the shard. */
#define SHARD_MARK 0xfa500000u
#define SHARD_MARK_MASK 0xffff0000u
#define SHARD_FROM_LO 0x100u
#define MAX_SPREAD 64

#define L2_OFF 0
#define IP_OFF ETH_HLEN
#define IP_CSUM_OFF (IP_OFF + offsetof(struct iphdr, check))
#define IP_SRC_OFF (IP_OFF + offsetof(struct iphdr, saddr))
#define IP_DST_OFF (IP_OFF + offsetof(struct iphdr, daddr))
#define UDP_OFF (IP_OFF + sizeof(struct iphdr))
#define UDP_CSUM_OFF (UDP_OFF + offsetof(struct udphdr, check))
#define UDP_SPORT_OFF (UDP_OFF + offsetof(struct udphdr, source))
#define UDP_DPORT_OFF (UDP_OFF + offsetof(struct udphdr, dest))

struct session_key {
	__u32 addr; /* network order; 0 = any local address */
	__u16 port; /* network order */
	__u16 pad;
};

struct sink {
	__u32 daddr;   /* network order */
	__u16 dport;   /* network order */
	__u16 state;
	__u32 ifindex;
	__u32 redirect_flags;
	__u8 l2[12];   /* destination then source MAC */
	__s32 reason;  /* bpf_fib_lookup's answer when state = FALLBACK */
	__u32 saddr;   /* the clones' source for a remote sink (0: the relay's address) */
	__u16 sport;   /* network order; the clones' source port (0: the relay's port) */
	__u16 handoff_seq; /* network order; with REASON_AGGREGATE, the first packet not sent */
	__u32 allow;   /* the highest layer it gets (packed, see LAYER_VALID; 0: all); ours */
	__u16 seq_delta; /* packets dropped on purpose, mod 2^16: its RTP numbers go back by it */
	__u16 pad2;
	__u64 resolved_ns;
	__u64 packets;
	__u64 bytes;
	__u64 errors;  /* clones the stack refused (e.g. a full backlog) */
	__u64 dropped; /* packets its layer allowance kept from it */
};

struct session_stats {
	__u64 packets;
	__u64 bytes;
	__u64 unhandled;   /* datagrams of the session the program could not fan out */
	__u64 fallbacks;   /* bumped whenever a sink turns FALLBACK: user space rescans */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SESSIONS);
	__type(key, struct session_key);
	__type(value, __u32); /* session index */
} SESSIONS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SESSIONS);
	__type(key, __u32);
	__type(value, __u32);
} NSINKS SEC(".maps");

/* session index * MAX_CHUNKS + n -> the n-th chunk of sink slots of that session */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SESSIONS * MAX_CHUNKS);
	__type(key, __u32);
	__type(value, __u32);
} CHUNKS SEC(".maps");

/* max_entries is set by the loader (a multiple of CHUNK_SINKS) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CHUNK_SINKS);
	__type(key, __u32);
	__type(value, struct sink);
} SINKS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SESSIONS);
	__type(key, __u32);
	__type(value, struct session_stats);
} STATS SEC(".maps");

/* Spreading a session's fan-out over CPUs (issue 14). Its sinks are split into as many
 * shards as lo's RPS map has CPUs (CPUs 0..n-1, checked by user space). The CPU a datagram
 * arrives on sends each other shard one copy through lo's ingress, its hash chosen so RPS
 * queues it on that shard's CPU, and fans out its own shard; each copy's run fans out its
 * shard there and is dropped. Per session: the CPUs (0 or 1: one CPU does all). A copy
 * lost the sender's route on the way, so its clones to local sinks are routed afresh, which
 * lo allows only with accept_local and route_localnet (user space requires both). Sessions
 * with a video codec are not spread: their layer judgement keeps state per packet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SESSIONS);
	__type(key, __u32);
	__type(value, __u32);
} SPREAD SEC(".maps");

/* Layer adaptation (issue 6). A layer is packed as LAYER_VALID | did << 16 | qid << 8 | tid,
 * so that comparing packed layers compares (did, qid, tid) in that order. */
#define LAYER_VALID (1u << 31)
#define LAYER_ALL (LAYER_VALID | 7u << 16 | 15u << 8 | 7u)
#define PREFIX_IDR (1u << 30)
/* In a sink's `allow`: a new sink of video with no keyframe at hand gets no media until an
 * IDR (of temporal layer 0) lets its allowance rise to what user space asks. */
#define LAYER_HOLD (1u << 29)
/* In LAYER_REQ: take the wanted allowance at once, not at a switch point (user space lifts a
 * hold that waited too long for an IDR this way). */
#define LAYER_FORCE (1u << 28)
#define CODEC_H264 1
#define CODEC_H265 2
#define MAX_AGGREGATED 32 /* NAL units judged per aggregation packet; more: unknown */

enum kind { KIND_NONE, KIND_NOT_LAYERED, KIND_MEDIA, KIND_UNKNOWN };

struct judgement {
	__u32 kind;
	__u32 layer;
	__u32 idr;
	__u32 agg;   /* a STAP-A or AP: NAL units of several layers may share it */
};

/* A session's video: its codec (0: none, nothing is judged) and the parser's state, as
 * fanout_proto::layers::LayerParser keeps it. */
struct video {
	__u32 codec;
	__u32 prefix;       /* the last H.264 SVC prefix NAL unit (packed | PREFIX_IDR), 0: none */
	struct judgement fu; /* the fragmented NAL unit in progress (kind NONE: none) */
	__u64 unknown;      /* packets that could not be judged: forwarded to every sink */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SESSIONS);
	__type(key, __u32);
	__type(value, struct video);
} VIDEO SEC(".maps");

/* Pacing for sinks behind one link (pace_link = "shared"; issue 35). Per session, written by
 * user space: the rate each sink is paced at (bytes/s; 0: no pacing) and the burst the link
 * may take back to back. The sinks of a run share one virtual clock at the sum of their rates
 * (as user space's group clock, fanout_core::pace): each clone gets the time it may leave
 * as its EDT departure time (skb->tstamp, monotonic), which the fq qdisc on the egress
 * interface holds it to. Without fq the stamps are ignored and the clones leave at once. */
struct pace {
	__u64 rate;
	__u64 burst;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SESSIONS);
	__type(key, __u32);
	__type(value, struct pace);
} PACE SEC(".maps");

/* Per session and shard (session index * MAX_SPREAD + shard): the clock's virtual finish
 * time of the last clone, ns. A shard runs on one CPU; two CPUs serving one session's
 * packets at once would only blur the clock a little. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SESSIONS * MAX_SPREAD);
	__type(key, __u32);
	__type(value, __u64);
} PACE_CLOCK SEC(".maps");

/* A clone is never stamped later than this after its packet came: a pace below the
 * stream's real rate (a wrong rate_kbps) bunches clones up rather than delaying them ever
 * more (fq drops what lies beyond its horizon). */
#define PACE_MAX_AHEAD_NS 100000000ull

/* Per sink slot, written by user space only: the layer cap its selector wants (packed; 0:
 * none). Lowering it acts at the next packet; raising it waits for a switch point. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CHUNK_SINKS); /* set by the loader, as SINKS */
	__type(key, __u32);
	__type(value, __u32);
} LAYER_REQ SEC(".maps");

/* What the packet's headers hold now, and the pacing clock, as the clones are made: kept in
 * a per-CPU scratch map, not on the stack, so the verifier does not follow their values from
 * one bpf_loop iteration to the next (newer kernels verify a callback until its entry state
 * converges; values it tracks on the stack kept it from converging: a million instructions). */
struct cur {
	__u32 saddr;
	__u32 daddr;
	__u16 dport;
	__u16 sport;
	__u8 l2[12];
	__u16 seq;
	__u16 pad;
	__u32 pad2;
	__u64 finish;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cur);
} CUR SEC(".maps");

struct fan_ctx {
	struct __sk_buff *skb;
	struct cur *cur;
	struct session_stats *stats;
	__u64 now;
	__u32 base;       /* session index * MAX_CHUNKS */
	__u32 len;
	__u32 relay_addr; /* the clones' source: the relay's address */
	__u16 relay_port;
	__u16 tot_len;    /* host order, for the FIB's MTU check */
	__u32 from_lo;    /* the datagram came through lo */
	__u16 rtp;        /* 1: an RTP packet, whose sequence number sinks may rewrite */
	__u16 orig_seq;   /* network order */
	__u32 first;      /* the sinks this run serves: first .. first + nsinks */
	__u32 nsinks;
	__u32 turn;       /* the sink served first: a hash of the packet count (fanout_core::rotation) */
	struct judgement j; /* the packet's layer */
	/* Pacing (PACE): each clone's share of the link and the burst, ns at the run's rate
	 * (step 0: not paced), and the run's clock (its finish time). */
	__u64 step;
	__u64 burst_ns;
};

/* Rewrites the IPv4 address at `off` from *cur to addr, with both checksums. */
static __always_inline int set_addr(struct fan_ctx *c, __u32 off, __u32 *cur, __u32 addr)
{
	struct __sk_buff *skb = c->skb;
	if (addr == *cur)
		return 0;
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, *cur, addr, 4) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, *cur, addr, BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4) ||
	    bpf_skb_store_bytes(skb, off, &addr, 4, 0))
		return -1;
	*cur = addr;
	return 0;
}

static __always_inline int set_daddr(struct fan_ctx *c, __u32 daddr)
{
	return set_addr(c, IP_DST_OFF, &c->cur->daddr, daddr);
}

static __always_inline int set_saddr(struct fan_ctx *c, __u32 saddr)
{
	return set_addr(c, IP_SRC_OFF, &c->cur->saddr, saddr);
}

/* Rewrites the UDP port at `off` from *cur to port, with the checksum. */
static __always_inline int set_port(struct fan_ctx *c, __u32 off, __u16 *cur, __u16 port)
{
	struct __sk_buff *skb = c->skb;
	if (port == *cur)
		return 0;
	if (bpf_l4_csum_replace(skb, UDP_CSUM_OFF, *cur, port, BPF_F_MARK_MANGLED_0 | 2) ||
	    bpf_skb_store_bytes(skb, off, &port, 2, 0))
		return -1;
	*cur = port;
	return 0;
}

static __always_inline int set_dport(struct fan_ctx *c, __u16 dport)
{
	return set_port(c, UDP_DPORT_OFF, &c->cur->dport, dport);
}

static __always_inline int set_sport(struct fan_ctx *c, __u16 sport)
{
	return set_port(c, UDP_SPORT_OFF, &c->cur->sport, sport);
}

/* Rewrites the RTP sequence number, with the UDP checksum. */
static __always_inline int set_seq(struct fan_ctx *c, __u16 seq)
{
	return set_port(c, UDP_OFF + sizeof(struct udphdr) + 2, &c->cur->seq, seq);
}

static __always_inline __u32 did_of(__u32 l) { return (l >> 16) & 0xff; }
static __always_inline __u32 qid_of(__u32 l) { return (l >> 8) & 0xff; }
static __always_inline __u32 tid_of(__u32 l) { return l & 0xff; }

/* Whether layer l is part of operating point m. */
static __always_inline int within(__u32 l, __u32 m)
{
	return did_of(l) <= did_of(m) && qid_of(l) <= qid_of(m) && tid_of(l) <= tid_of(m);
}

static __always_inline void fall_back(struct fan_ctx *c, struct sink *s, int reason)
{
	s->reason = reason;
	s->state = SINK_FALLBACK;
	__sync_fetch_and_add(&c->stats->fallbacks, 1);
}

/* Applies the sink's requested cap, then decides: 1 to send this packet to it. A rise waits
 * for a packet the decoder can follow (adapt::LayerSelector::forward): an IDR for a higher
 * dependency or quality layer, a temporal-id-0 picture for a higher temporal layer. */
static __always_inline int layer_allows(struct fan_ctx *c, struct sink *s, __u32 slot)
{
	if (c->j.kind != KIND_MEDIA && !c->j.agg)
		return 1;
	__u32 *req = bpf_map_lookup_elem(&LAYER_REQ, &slot);
	__u32 want = req && *req ? *req : LAYER_ALL;
	__u32 force = want & LAYER_FORCE;
	want &= ~LAYER_FORCE;
	__u32 allow = s->allow ? s->allow : LAYER_ALL;
	if (c->j.agg) {
		int held = (allow & LAYER_HOLD) != 0;
		/* A capped sink and an aggregate: hand the sink to user space here. */
		if (c->rtp && (want != LAYER_ALL || (allow != LAYER_ALL && !held))) {
			s->handoff_seq = c->orig_seq;
			fall_back(c, s, REASON_AGGREGATE);
			return 0;
		}
		if (c->j.kind != KIND_MEDIA) {
			/* Parameter sets in an aggregate (with the IDR after them): a start. */
			if (held)
				s->allow = 0;
			return 1;
		}
	}
	if (want != allow) {
		int spatial_ok = (did_of(want) <= did_of(allow) && qid_of(want) <= qid_of(allow)) || c->j.idr;
		int temporal_ok = tid_of(want) <= tid_of(allow) || tid_of(c->j.layer) == 0;
		if (force || within(want, allow) || (spatial_ok && temporal_ok)) {
			allow = want;
			s->allow = want == LAYER_ALL ? 0 : want;
		}
	}
	if (!(allow & LAYER_HOLD) && within(c->j.layer, allow))
		return 1;
	s->seq_delta++;
	__sync_fetch_and_add(&s->dropped, 1);
	return 0;
}

static __always_inline int set_l2(struct fan_ctx *c, const __u8 *l2)
{
	int same = 1;
#pragma unroll
	for (int i = 0; i < 12; i++)
		same &= l2[i] == c->cur->l2[i];
	if (same)
		return 0;
	if (bpf_skb_store_bytes(c->skb, L2_OFF, l2, 12, 0))
		return -1;
	__builtin_memcpy(c->cur->l2, l2, 12);
	return 0;
}


static __always_inline int is_loopback(__u32 addr)
{
	return (addr & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
}

/* BPF_FIB_LOOKUP_SRC (Linux 6.7): fill in the route's preferred source address. */
#define FIB_LOOKUP_SRC (1U << 4)

/* A remote sink's egress interface and MACs, from the kernel's FIB and neighbour table. */
static __always_inline int resolve(struct fan_ctx *c, struct sink *s)
{
	struct bpf_fib_lookup p = {};
	p.family = 2; /* AF_INET */
	p.l4_protocol = IPPROTO_UDP;
	p.sport = c->relay_port;
	p.dport = s->dport;
	p.tot_len = c->tot_len;
	p.ifindex = c->skb->ingress_ifindex;
	p.ipv4_dst = s->daddr;
	/* A loopback relay address cannot leave the machine: take the route's preferred source
	 * (as a socket bound to the wildcard would). */
	__u32 flags = 0;
	if (is_loopback(c->relay_addr))
		flags = FIB_LOOKUP_SRC;
	else
		p.ipv4_src = c->relay_addr;
	long rc = bpf_fib_lookup(c->skb, &p, sizeof(p), flags);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
		fall_back(c, s, (int)rc);
		return -1;
	}
	s->ifindex = p.ifindex;
	s->redirect_flags = 0;
	s->saddr = flags ? p.ipv4_src : 0;
	__builtin_memcpy(s->l2, p.dmac, 6);
	__builtin_memcpy(s->l2 + 6, p.smac, 6);
	s->resolved_ns = c->now;
	s->state = SINK_RESOLVED;
	return 0;
}

/* The next clone's departure on the run's clock: the link's burst leaves at once, the rest
 * one step apart (Yau & Lam's virtual clock, as fanout_core::pace::VirtualClock::admit). */
static __always_inline void stamp(struct fan_ctx *c)
{
	__u64 finish = (c->cur->finish > c->now ? c->cur->finish : c->now) + c->step;
	if (finish > c->now + c->burst_ns + PACE_MAX_AHEAD_NS)
		finish = c->now + c->burst_ns + PACE_MAX_AHEAD_NS;
	c->cur->finish = finish;
	if (finish > c->now + c->burst_ns)
		bpf_skb_set_tstamp(c->skb, finish - c->burst_ns, BPF_SKB_TSTAMP_DELIVERY_MONO);
	else
		bpf_skb_set_tstamp(c->skb, 0, BPF_SKB_TSTAMP_UNSPEC);
}

static long fan_one(__u32 k, void *data)
{
	struct fan_ctx *c = data;
	/* Rotate the order (as the Oslo proxy rotated its receivers): no sink is always last. */
	__u32 i = k + c->turn;
	if (i >= c->nsinks)
		i -= c->nsinks;
	i += c->first;
	__u32 ci = c->base + (i >> CHUNK_SHIFT);
	__u32 *chunk = bpf_map_lookup_elem(&CHUNKS, &ci);
	if (!chunk)
		return 1;
	__u32 slot = (*chunk << CHUNK_SHIFT) | (i & (CHUNK_SINKS - 1));
	struct sink *s = bpf_map_lookup_elem(&SINKS, &slot);
	if (!s)
		return 0;
	switch (s->state) {
	case SINK_LOCAL:
		/* A clone keeps the original's route only if that came through lo; without it a
		 * 127/8 destination is a martian (unless route_localnet). */
		if (c->from_lo || !is_loopback(s->daddr))
			break;
		fall_back(c, s, REASON_LOOPBACK_FROM_AFAR);
		return 0;
	case SINK_REMOTE:
		if (resolve(c, s))
			return 0;
		break;
	case SINK_RESOLVED:
		if (c->now - s->resolved_ns > RESOLVE_NS && resolve(c, s))
			return 0;
		break;
	default:
		return 0;
	}
	if (!layer_allows(c, s, slot))
		return 0;
	__u32 saddr = s->saddr ? s->saddr : c->relay_addr;
	__u16 sport = s->sport ? s->sport : c->relay_port;
	__u16 seq = c->orig_seq;
	if (c->rtp && s->seq_delta)
		seq = bpf_htons(bpf_ntohs(seq) - s->seq_delta);
	if (set_l2(c, s->l2) || set_saddr(c, saddr) || set_daddr(c, s->daddr) || set_dport(c, s->dport) ||
	    set_sport(c, sport) || (c->rtp && set_seq(c, seq))) {
		__sync_fetch_and_add(&s->errors, 1);
		return 0;
	}
	if (c->step)
		stamp(c);
	if (bpf_clone_redirect(c->skb, s->ifindex, s->redirect_flags) == 0) {
		__sync_fetch_and_add(&s->packets, 1);
		__sync_fetch_and_add(&s->bytes, c->len);
	} else {
		__sync_fetch_and_add(&s->errors, 1);
	}
	return 0;
}

/* ---- The layer of an RTP payload: fanout_proto::layers, in the kernel. ---- */

#define RTP_OFF (UDP_OFF + sizeof(struct udphdr))

static __always_inline void judge_media(struct judgement *j, __u32 layer, __u32 idr)
{
	j->kind = KIND_MEDIA;
	j->layer = layer;
	j->idr = idr;
}

/* One H.264 NAL unit from its first n (<= 4) bytes, given the last prefix NAL unit. */
static __always_inline void h264_nal(struct video *v, const __u8 *b, __u32 n, struct judgement *j)
{
	j->kind = KIND_NOT_LAYERED;
	if (n < 1) {
		j->kind = KIND_UNKNOWN;
		return;
	}
	__u8 t = b[0] & 0x1f;
	if (t == 14 || t == 20 || t == 30) {
		if (n < 4) {
			j->kind = KIND_UNKNOWN;
			return;
		}
		if (!(b[1] & 0x80))
			return; /* MVC, not SVC */
		__u32 l = LAYER_VALID | (__u32)((b[2] >> 4) & 7) << 16 | (__u32)(b[2] & 0x0f) << 8 | (b[3] >> 5);
		__u32 idr = (b[1] & 0x40) != 0;
		if (t == 14)
			v->prefix = l | (idr ? PREFIX_IDR : 0);
		judge_media(j, l, idr);
	} else if (t == 1 || t == 5) {
		__u32 p = v->prefix;
		v->prefix = 0;
		judge_media(j, p ? p & ~PREFIX_IDR : LAYER_VALID, (p & PREFIX_IDR) != 0 || t == 5);
	}
}

/* From an HEVC NAL unit header (or an FU's payload header with the FU's type). */
static __always_inline void h265_header(__u8 b0, __u8 b1, __u8 typ, struct judgement *j)
{
	__u8 tid_plus1 = b1 & 7;
	if (tid_plus1 == 0) {
		j->kind = KIND_UNKNOWN;
		return;
	}
	if (typ >= 32) {
		j->kind = KIND_NOT_LAYERED;
		return;
	}
	judge_media(j, LAYER_VALID | (__u32)(((b0 & 1) << 5) | (b1 >> 3)) << 16 | (tid_plus1 - 1),
		    typ >= 16 && typ <= 21);
}

/* The lowest of two judgements: media below media, and anything everyone needs wins. */
static __always_inline void lowest(struct judgement *acc, const struct judgement *b)
{
	if (acc->kind == KIND_NONE) {
		*acc = *b;
	} else if (acc->kind == KIND_UNKNOWN || b->kind == KIND_UNKNOWN) {
		acc->kind = KIND_UNKNOWN;
	} else if (acc->kind == KIND_NOT_LAYERED || b->kind == KIND_NOT_LAYERED) {
		acc->kind = KIND_NOT_LAYERED;
	} else {
		if (b->layer < acc->layer)
			acc->layer = b->layer;
		acc->idr |= b->idr;
	}
}

/* What the walk of an aggregation packet has found so far: per-CPU scratch, as `struct cur`,
 * so that the verifier does not follow it from one bpf_loop iteration to the next. */
struct agg_state {
	__u32 off;  /* the next unit's size field */
	__u32 done;
	struct judgement acc;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct agg_state);
} AGG SEC(".maps");

struct agg_ctx {
	struct __sk_buff *skb;
	struct video *v;
	struct agg_state *st;
	__u32 end;
	__u32 skip; /* per-unit bytes between size and NAL unit (MTAP) */
	__u32 codec;
};

/* One NAL unit of an aggregation packet (bpf_loop callback). */
static long agg_one(__u32 i, void *data)
{
	struct agg_ctx *a = data;
	struct agg_state *st = a->st;
	if (st->off >= a->end) {
		st->done = 1;
		return 1;
	}
	__u8 sz[2];
	__u8 b[4] = {};
	struct judgement j = {};
	if (st->off + 2 > a->end || bpf_skb_load_bytes(a->skb, st->off, sz, 2)) {
		st->acc.kind = KIND_UNKNOWN;
		st->done = 1;
		return 1;
	}
	__u32 n = (__u32)sz[0] << 8 | sz[1];
	__u32 nal = st->off + 2 + a->skip;
	if (nal + n > a->end) {
		st->acc.kind = KIND_UNKNOWN;
		st->done = 1;
		return 1;
	}
	__u32 have = n < 4 ? n : 4;
	if (have == 4)
		bpf_skb_load_bytes(a->skb, nal, b, 4);
	else if (have >= 2)
		bpf_skb_load_bytes(a->skb, nal, b, 2);
	else if (have == 1)
		bpf_skb_load_bytes(a->skb, nal, b, 1);
	if (a->codec == CODEC_H265) {
		if (have < 2)
			j.kind = KIND_UNKNOWN;
		else
			h265_header(b[0], b[1], (b[0] >> 1) & 0x3f, &j);
	} else {
		h264_nal(a->v, b, have, &j);
		if (have >= 1 && (b[0] & 0x1f) == 30) {
			/* A PACSI labels the whole aggregate. */
			st->acc = j;
			st->done = 1;
			return 1;
		}
	}
	lowest(&st->acc, &j);
	st->off = nal + n;
	return 0;
}

static __always_inline void judge_aggregate(struct __sk_buff *skb, struct video *v, __u32 codec, __u32 off,
					    __u32 skip, struct judgement *j)
{
	__u32 zero = 0;
	struct agg_state *st = bpf_map_lookup_elem(&AGG, &zero);
	if (!st) {
		j->kind = KIND_UNKNOWN;
		return;
	}
	st->off = off;
	st->done = 0;
	__builtin_memset(&st->acc, 0, sizeof(st->acc));
	struct agg_ctx a = { .skb = skb, .v = v, .st = st, .end = skb->len, .skip = skip, .codec = codec };
	bpf_loop(MAX_AGGREGATED, agg_one, &a, 0);
	if (!st->done || st->acc.kind == KIND_NONE)
		st->acc.kind = KIND_UNKNOWN;
	*j = st->acc;
}

/* The packet's RTP header and the layer of its payload. */
static __always_inline void judge(struct __sk_buff *skb, struct fan_ctx *c, struct video *v)
{
	struct judgement *j = &c->j;
	j->kind = KIND_NOT_LAYERED;
	__u8 h[4];
	if (bpf_skb_load_bytes(skb, RTP_OFF, h, 4) || (h[0] >> 6) != 2)
		return;
	__u32 off = RTP_OFF + 12 + 4 * (h[0] & 0x0f);
	if (h[0] & 0x10) {
		__u8 x[4];
		if (bpf_skb_load_bytes(skb, off, x, 4))
			return;
		off += 4 + 4 * ((__u32)x[2] << 8 | x[3]);
	}
	if (off > skb->len)
		return;
	c->rtp = 1;
	__builtin_memcpy(&c->orig_seq, h + 2, 2);
	c->cur->seq = c->orig_seq;
	if (!v || !v->codec)
		return;
	/* The payload's first bytes (as many as there are, up to 7). */
	__u8 p[8] = {};
	__u32 have = skb->len - off;
	if (have >= 7) {
		bpf_skb_load_bytes(skb, off, p, 7);
	} else {
		for (int i = 0; i < 6; i++)
			if ((__u32)i < have)
				bpf_skb_load_bytes(skb, off + i, p + i, 1);
	}
	if (have == 0) {
		j->kind = KIND_UNKNOWN;
	} else if (v->codec == CODEC_H265) {
		__u8 t = (p[0] >> 1) & 0x3f;
		if (have < 2)
			j->kind = KIND_UNKNOWN;
		else if (t == 48) {
			judge_aggregate(skb, v, CODEC_H265, off + 2, 0, j);
			j->agg = 1;
		}
		else if (t == 49)
			if (have < 3)
				j->kind = KIND_UNKNOWN;
			else
				h265_header(p[0], p[1], p[2] & 0x3f, j);
		else if (t == 50)
			j->kind = KIND_NOT_LAYERED;
		else
			h265_header(p[0], p[1], t, j);
	} else {
		__u8 t = p[0] & 0x1f;
		if (t == 24) {
			judge_aggregate(skb, v, CODEC_H264, off + 1, 0, j);
			j->agg = 1;
		}
		else if (t == 25 || t == 26 || t == 27)
			judge_aggregate(skb, v, CODEC_H264, off + 3, t == 25 ? 0 : t == 26 ? 3 : 4, j);
		else if (t == 28 || t == 29) {
			if (have < 2) {
				j->kind = KIND_UNKNOWN;
			} else if (!(p[1] & 0x80)) {
				/* Not a start: the start's judgement, if it was seen. */
				*j = v->fu;
				if (j->kind == KIND_NONE)
					j->kind = KIND_UNKNOWN;
				if (p[1] & 0x40)
					v->fu.kind = KIND_NONE;
			} else {
				/* The NAL unit's own header, then the start of its body (the SVC header). */
				__u32 body = t == 28 ? 2 : 4;
				__u32 n = have > body ? have - body : 0;
				if (n > 3)
					n = 3;
				__u8 b[4] = { (p[0] & 0xe0) | (p[1] & 0x1f), p[2], p[3], p[4] };
				if (t == 29) {
					b[1] = p[4];
					b[2] = p[5];
					b[3] = p[6];
				}
				if (have < body)
					j->kind = KIND_UNKNOWN;
				else
					h264_nal(v, b, 1 + n, j);
				if (p[1] & 0x40)
					v->fu.kind = KIND_NONE;
				else
					v->fu = *j;
			}
		} else {
			__u32 n = have < 4 ? have : 4;
			h264_nal(v, p, n, j);
		}
	}
	if (j->kind == KIND_UNKNOWN)
		__sync_fetch_and_add(&v->unknown, 1);
}

/* The hash RPS maps to the `shard`th of `cpus` CPUs (reciprocal_scale: hash * cpus >> 32). */
static __always_inline __u32 shard_hash(__u32 shard, __u32 cpus)
{
	return (__u32)((((__u64)shard * 2 + 1) << 32) / ((__u64)cpus * 2));
}

struct spread_ctx {
	struct __sk_buff *skb;
	struct session_stats *stats;
	__u32 cpus;
	__u32 me;
	__u32 from_lo;
};

/* One copy of the datagram for shard k's CPU (bpf_loop callback). */
static long send_copy(__u32 k, void *data)
{
	struct spread_ctx *sc = data;
	if (k == sc->me)
		return 0;
	sc->skb->mark = SHARD_MARK | (sc->from_lo ? SHARD_FROM_LO : 0) | k;
	bpf_set_hash(sc->skb, shard_hash(k, sc->cpus));
	if (bpf_clone_redirect(sc->skb, 1 /* lo */, BPF_F_INGRESS))
		__sync_fetch_and_add(&sc->stats->unhandled, 1);
	return 0;
}

SEC("classifier")
int fanout_fwd(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u32 orig_mark = skb->mark;
	if (orig_mark == CLONE_MARK)
		return TC_ACT_OK;
	int copy = (orig_mark & SHARD_MARK_MASK) == SHARD_MARK;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + IP_OFF;
	struct udphdr *udp = data + UDP_OFF;
	if ((void *)(udp + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->protocol != IPPROTO_UDP)
		return TC_ACT_OK;
	struct session_key key = { .addr = ip->daddr, .port = udp->dest };
	__u32 *idx = bpf_map_lookup_elem(&SESSIONS, &key);
	if (!idx) {
		key.addr = 0;
		idx = bpf_map_lookup_elem(&SESSIONS, &key);
		if (!idx)
			return copy ? TC_ACT_SHOT : TC_ACT_OK;
	}
	__u32 sidx = *idx;
	struct session_stats *stats = bpf_map_lookup_elem(&STATS, &sidx);
	__u32 *nsinks = bpf_map_lookup_elem(&NSINKS, &sidx);
	if (!stats || !nsinks || sidx >= MAX_SESSIONS)
		return copy ? TC_ACT_SHOT : TC_ACT_OK;
	/* IP options, fragments and GSO bundles go to user space whole, which serves them to
	 * nobody the kernel owns: counted so the loss is visible. */
	if (ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)) || skb->gso_segs > 1) {
		__sync_fetch_and_add(&stats->unhandled, 1);
		return TC_ACT_OK;
	}

	struct fan_ctx c = {
		.skb = skb,
		.stats = stats,
		.now = bpf_ktime_get_ns(),
		.base = sidx * MAX_CHUNKS,
		.len = skb->len - UDP_OFF - sizeof(struct udphdr),
		.relay_addr = ip->daddr,
		.relay_port = udp->dest,
		.tot_len = bpf_ntohs(ip->tot_len),
		.from_lo = copy ? !!(orig_mark & SHARD_FROM_LO) : skb->ingress_ifindex == 1,
	};
	__u32 zero = 0;
	c.cur = bpf_map_lookup_elem(&CUR, &zero);
	if (!c.cur) {
		__sync_fetch_and_add(&stats->unhandled, 1);
		return TC_ACT_OK;
	}
	c.cur->saddr = ip->daddr; /* after the rewrite below */
	c.cur->daddr = ip->daddr;
	c.cur->dport = udp->dest;
	c.cur->sport = udp->dest; /* after the rewrite below */
	c.cur->finish = 0;
	/* Read before any helper that may move the packet (the copies below). */
	__u64 orig_tstamp = skb->tstamp; /* its receive time, for the relay's socket */
	__u32 orig_saddr = ip->saddr;
	__u16 orig_sport = udp->source;
	__builtin_memcpy(c.cur->l2, eth, 12);
	__u8 orig_l2[12];
	__builtin_memcpy(orig_l2, eth, 12);

	/* Which part of the sinks this run serves: shard `shard` of `cpus`. */
	__u32 *spread = bpf_map_lookup_elem(&SPREAD, &sidx);
	struct video *v = bpf_map_lookup_elem(&VIDEO, &sidx);
	__u32 cpus = spread && !(v && v->codec) ? *spread : 1;
	if (cpus > MAX_SPREAD)
		cpus = MAX_SPREAD;
	__u32 total = *nsinks, shard = 0;
	if (copy) {
		shard = orig_mark & 0xff;
		if (cpus < 2 || shard >= cpus)
			return TC_ACT_SHOT; /* spreading was turned off meanwhile */
	} else if (cpus >= 2 && total >= cpus) {
		/* The copies leave before any rewrite: their runs find the session as this one did. */
		struct spread_ctx sc = { .skb = skb, .stats = stats, .cpus = cpus, .from_lo = c.from_lo };
		sc.me = bpf_get_smp_processor_id();
		bpf_loop(cpus, send_copy, &sc, 0);
		skb->mark = orig_mark;
		/* This CPU's shard, if it has one; its clones' hash keeps them here. */
		shard = sc.me;
		if (shard < cpus)
			bpf_set_hash(skb, shard_hash(shard, cpus));
	} else {
		cpus = 1;
	}
	c.first = shard < cpus ? (__u32)((__u64)total * shard / cpus) : total;
	__u32 last = shard < cpus ? (__u32)((__u64)total * (shard + 1) / cpus) : total;

	/* The clones come from the relay's address and port, as the user-space paths' do. */
	__u32 relay = c.relay_addr;
	__u16 relay_port = c.relay_port;
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, orig_saddr, relay, 4) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, orig_saddr, relay, BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4) ||
	    bpf_skb_store_bytes(skb, IP_SRC_OFF, &relay, 4, 0) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, orig_sport, relay_port, BPF_F_MARK_MANGLED_0 | 2) ||
	    bpf_skb_store_bytes(skb, UDP_SPORT_OFF, &relay_port, 2, 0)) {
		__sync_fetch_and_add(&stats->unhandled, 1);
		return TC_ACT_SHOT;
	}

	/* Its layer, judged once for every sink (sessions with a video codec). */
	judge(skb, &c, v);

	skb->mark = CLONE_MARK;
	c.nsinks = last - c.first;
	c.turn = c.nsinks ? (__u32)(((stats->packets * 0x9E3779B97F4A7C15ULL) >> 32) % c.nsinks) : 0;
	struct pace *pace = bpf_map_lookup_elem(&PACE, &sidx);
	__u32 ck = sidx * MAX_SPREAD + (shard < MAX_SPREAD ? shard : 0);
	__u64 *clock = bpf_map_lookup_elem(&PACE_CLOCK, &ck);
	if (pace && clock && pace->rate && c.nsinks) {
		/* In the units user space measures the stream in: datagram payload bytes. */
		__u64 rate = pace->rate * c.nsinks;
		c.step = (__u64)c.len * 1000000000ull / rate;
		c.burst_ns = pace->burst * 1000000000ull / rate;
		c.cur->finish = *clock;
		/* Unless its CPU is chosen by that hash (spreading), each clone's own, so fq
		 * queues each sink's clones as their own flow. */
		if (cpus < 2)
			bpf_set_hash_invalid(skb);
	}
	bpf_loop(c.nsinks, fan_one, &c, 0);
	if (c.step) {
		*clock = c.cur->finish;
		skb->tstamp = orig_tstamp; /* at ingress this also drops the delivery-time flag */
	}
	if (copy)
		return TC_ACT_SHOT;
	skb->mark = orig_mark;
	__sync_fetch_and_add(&stats->packets, 1);
	__sync_fetch_and_add(&stats->bytes, c.len);

	/* Restore the original for the relay's socket. */
	if (set_l2(&c, orig_l2) || set_daddr(&c, relay) || set_dport(&c, relay_port) || set_saddr(&c, orig_saddr) ||
	    set_sport(&c, orig_sport) || (c.rtp && set_seq(&c, c.orig_seq)))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
