// SPDX-License-Identifier: GPL-2.0 OR MIT
// `bench bulk --sinks wire`: the subscribers at the far end of a veth, counted where the
// datagrams arrive (TC ingress) and dropped there. Every UDP destination is a sink; none has
// a socket, so the load tool costs the machine almost nothing beside the relay. A sink's
// index is its address and port (see wire.rs): (daddr - BASE_ADDR) * PORTS + dport - BASE_PORT.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define BASE_ADDR 0x0a4d0002u /* 10.77.0.2 */
#define BASE_PORT 10000
#define PORTS 50000
#define RTP_HLEN 12
#define PROBE_MAGIC 0x464f5554u /* "FOUT": fanout_proto::probe */
#define HIST_BUCKETS 4096
#define HIST_NS 100000 /* 100 µs per latency bucket; the last one holds everything later */

struct count {
	__u64 packets;
	__u64 highest;   /* the highest probe sequence number seen, plus one (0: none yet) */
	__u64 reordered; /* arrived below the highest */
};

struct probe {
	__u32 magic;
	__u32 stream;
	__u64 seq;
	__u64 sent_ns;
};

/* max_entries is set by the loader: the number of sinks. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct count);
} COUNTS SEC(".maps");

/* One-way latency (sender's CLOCK_MONOTONIC to arrival), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HIST_BUCKETS);
	__type(key, __u32);
	__type(value, __u64);
} LATENCY SEC(".maps");

/* 0: UDP datagrams to no sink (or without a probe); 1: anything else (IPv6 neighbour
 * discovery and the like). Per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} STRAY SEC(".maps");

static __always_inline int stray(__u32 why)
{
	__u64 *n = bpf_map_lookup_elem(&STRAY, &why);
	if (n)
		*n += 1;
	return TC_ACT_SHOT;
}

SEC("classifier")
int wire_sink(struct __sk_buff *skb)
{
	struct iphdr ip;
	struct udphdr udp;
	struct probe p;
	if (skb->protocol != bpf_htons(ETH_P_IP) || bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) ||
	    ip.protocol != IPPROTO_UDP || ip.ihl != 5)
		return stray(1);
	if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip), &udp, sizeof(udp)) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip) + sizeof(udp) + RTP_HLEN, &p, sizeof(p)) ||
	    p.magic != bpf_htonl(PROBE_MAGIC))
		return stray(0);
	__u32 host = bpf_ntohl(ip.daddr) - BASE_ADDR;
	__u32 port = bpf_ntohs(udp.dest) - BASE_PORT;
	if (host > 1 || port >= PORTS)
		return stray(0);
	__u32 k = host * PORTS + port;
	struct count *c = bpf_map_lookup_elem(&COUNTS, &k);
	if (!c)
		return stray(0);
	__u64 seq = bpf_be64_to_cpu(p.seq) + 1;
	__sync_fetch_and_add(&c->packets, 1);
	if (seq < c->highest)
		__sync_fetch_and_add(&c->reordered, 1);
	else
		c->highest = seq;
	__u64 lat = bpf_ktime_get_ns() - bpf_be64_to_cpu(p.sent_ns);
	__u32 b = lat / HIST_NS;
	if (b >= HIST_BUCKETS) /* also a clock gone backwards */
		b = HIST_BUCKETS - 1;
	__u64 *h = bpf_map_lookup_elem(&LATENCY, &b);
	if (h)
		*h += 1;
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
