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
#define MAX_CHUNKS 64 /* chunks per session: 16384 sinks */
#define MAX_SESSIONS 256
#define RESOLVE_NS 1000000000ull /* a remote sink's route and neighbour are re-read each second */

/* Sink states (written by user space except RESOLVED/FALLBACK, written here). */
#define SINK_EMPTY 0
#define SINK_LOCAL 1      /* a local address: clone through lo */
#define SINK_REMOTE 2     /* resolve through the FIB, then clone to its egress */
#define SINK_RESOLVED 3   /* remote, resolved: ifindex and MACs valid */
#define SINK_FALLBACK 4   /* the kernel cannot reach it: user space sends to it */

#define REASON_LOOPBACK_FROM_AFAR 100

/* Set on the original while it is cloned, so clones that loop back through lo's ingress
 * skip the session lookup; the original gets its own mark back. */
#define CLONE_MARK 0xfa40u

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
	__u16 pad;
	__u64 resolved_ns;
	__u64 packets;
	__u64 bytes;
	__u64 errors;  /* clones the stack refused (e.g. a full backlog) */
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

struct fan_ctx {
	struct __sk_buff *skb;
	struct session_stats *stats;
	__u64 now;
	__u32 base;       /* session index * MAX_CHUNKS */
	__u32 len;
	__u32 relay_addr; /* the clones' source: the relay's address */
	__u16 relay_port;
	__u16 tot_len;    /* host order, for the FIB's MTU check */
	__u32 from_lo;
	__u32 cur_saddr;  /* what the packet's headers hold now */
	__u32 cur_daddr;
	__u16 cur_dport;
	__u16 cur_sport;
	__u8 cur_l2[12];
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
	return set_addr(c, IP_DST_OFF, &c->cur_daddr, daddr);
}

static __always_inline int set_saddr(struct fan_ctx *c, __u32 saddr)
{
	return set_addr(c, IP_SRC_OFF, &c->cur_saddr, saddr);
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
	return set_port(c, UDP_DPORT_OFF, &c->cur_dport, dport);
}

static __always_inline int set_sport(struct fan_ctx *c, __u16 sport)
{
	return set_port(c, UDP_SPORT_OFF, &c->cur_sport, sport);
}

static __always_inline int set_l2(struct fan_ctx *c, const __u8 *l2)
{
	int same = 1;
#pragma unroll
	for (int i = 0; i < 12; i++)
		same &= l2[i] == c->cur_l2[i];
	if (same)
		return 0;
	if (bpf_skb_store_bytes(c->skb, L2_OFF, l2, 12, 0))
		return -1;
	__builtin_memcpy(c->cur_l2, l2, 12);
	return 0;
}

static __always_inline void fall_back(struct fan_ctx *c, struct sink *s, int reason)
{
	s->reason = reason;
	s->state = SINK_FALLBACK;
	__sync_fetch_and_add(&c->stats->fallbacks, 1);
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

static long fan_one(__u32 i, void *data)
{
	struct fan_ctx *c = data;
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
	__u32 saddr = s->saddr ? s->saddr : c->relay_addr;
	__u16 sport = s->sport ? s->sport : c->relay_port;
	if (set_l2(c, s->l2) || set_saddr(c, saddr) || set_daddr(c, s->daddr) || set_dport(c, s->dport) ||
	    set_sport(c, sport)) {
		__sync_fetch_and_add(&s->errors, 1);
		return 0;
	}
	if (bpf_clone_redirect(c->skb, s->ifindex, s->redirect_flags) == 0) {
		__sync_fetch_and_add(&s->packets, 1);
		__sync_fetch_and_add(&s->bytes, c->len);
	} else {
		__sync_fetch_and_add(&s->errors, 1);
	}
	return 0;
}

SEC("classifier")
int fanout_fwd(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (skb->mark == CLONE_MARK)
		return TC_ACT_OK;
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
			return TC_ACT_OK;
	}
	__u32 sidx = *idx;
	struct session_stats *stats = bpf_map_lookup_elem(&STATS, &sidx);
	__u32 *nsinks = bpf_map_lookup_elem(&NSINKS, &sidx);
	if (!stats || !nsinks || sidx >= MAX_SESSIONS)
		return TC_ACT_OK;
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
		.from_lo = skb->ingress_ifindex == 1,
		.cur_saddr = ip->daddr, /* after the rewrite below */
		.cur_daddr = ip->daddr,
		.cur_dport = udp->dest,
		.cur_sport = udp->dest, /* after the rewrite below */
	};
	__u32 orig_saddr = ip->saddr;
	__u16 orig_sport = udp->source;
	__builtin_memcpy(c.cur_l2, eth, 12);
	__u8 orig_l2[12];
	__builtin_memcpy(orig_l2, eth, 12);

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

	__u32 orig_mark = skb->mark;
	skb->mark = CLONE_MARK;
	bpf_loop(*nsinks, fan_one, &c, 0);
	skb->mark = orig_mark;
	__sync_fetch_and_add(&stats->packets, 1);
	__sync_fetch_and_add(&stats->bytes, c.len);

	/* Restore the original for the relay's socket. */
	if (set_l2(&c, orig_l2) || set_daddr(&c, relay) || set_dport(&c, relay_port) || set_saddr(&c, orig_saddr) ||
	    set_sport(&c, orig_sport))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
