// SPDX-License-Identifier: MIT OR GPL-2.0
// The torusnet XDP program: steers torus data frames into the link's AF_XDP sockets.
//
// Data frames (EtherType 0x88B5) go to the XSKMAP slot of the RX queue they arrived on;
// control frames (0x88B6) and all other traffic go up to the kernel, where the control
// process reads them with AF_PACKET. Torus frames too short to hold the torus header are
// dropped here so userspace never sees them. One instance is loaded per link, so its maps
// (sockets, counters, fault injection) are that link's.
//
// Self-contained on purpose: no kernel or libbpf headers, so the build needs only clang.
// Built twice by dataplane/build.rs: section "xdp" and, with -DTORUS_FRAGS, "xdp.frags"
// (the only kind a veth with a jumbo peer MTU accepts).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

struct xdp_md {
    __u32 data;
    __u32 data_end;
    __u32 data_meta;
    __u32 ingress_ifindex;
    __u32 rx_queue_index;
    __u32 egress_ifindex;
};

enum { XDP_ABORTED = 0, XDP_DROP = 1, XDP_PASS = 2, XDP_TX = 3, XDP_REDIRECT = 4 };
enum { BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_PERCPU_ARRAY = 6, BPF_MAP_TYPE_XSKMAP = 17 };

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;

#define ETH_LEN 14
#define TORUS_LEN 64
#define ETHERTYPE_DATA 0x88B5
#define ETHERTYPE_CONTROL 0x88B6

// Counter slots; keep in sync with dataplane/src/xdp.rs (XdpCounter).
enum {
    CNT_REDIRECTED = 0,   // data frames handed to an AF_XDP socket
    CNT_PASSED = 1,       // control and non-torus frames passed to the kernel
    CNT_MALFORMED = 2,    // torus frames too short for the torus header
    CNT_FAULT_DROP = 3,   // data frames dropped by fault injection
    CNT_NO_SOCKET = 4,    // data frames for a queue with no socket bound (passed up)
    CNT_CONTROL = 5,      // control frames (also counted in CNT_PASSED)
    CNT_MAX = 8,
};

// RX queue index -> AF_XDP socket.
struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, 64);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

// Per-CPU frame counters, indexed by the CNT_* slots.
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, CNT_MAX);
    __type(key, __u32);
    __type(value, __u64);
} counters SEC(".maps");

// Slot 0: drop threshold for data frames, out of 2^32 (0 = off). Written by tests.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} fault SEC(".maps");

static __attribute__((always_inline)) void count(__u32 slot)
{
    __u64 *c = bpf_map_lookup_elem(&counters, &slot);
    if (c)
        *c += 1;
}

#ifdef TORUS_FRAGS
SEC("xdp.frags")
#else
SEC("xdp")
#endif
int torus_xdp(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    __u8 *eth = data;

    if ((void *)(eth + ETH_LEN) > data_end) {
        count(CNT_PASSED);
        return XDP_PASS;
    }
    __u16 ethertype = (__u16)(eth[12] << 8 | eth[13]);
    if (ethertype == ETHERTYPE_CONTROL) {
        count(CNT_CONTROL);
        count(CNT_PASSED);
        return XDP_PASS;
    }
    if (ethertype != ETHERTYPE_DATA) {
        count(CNT_PASSED);
        return XDP_PASS;
    }
    if ((void *)(eth + ETH_LEN + TORUS_LEN) > data_end) {
        count(CNT_MALFORMED);
        return XDP_DROP;
    }
    __u32 zero = 0;
    __u32 *threshold = bpf_map_lookup_elem(&fault, &zero);
    if (threshold && *threshold && bpf_get_prandom_u32() < *threshold) {
        count(CNT_FAULT_DROP);
        return XDP_DROP;
    }
    long action = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
    if (action == XDP_REDIRECT)
        count(CNT_REDIRECTED);
    else
        count(CNT_NO_SOCKET);
    return (int)action;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
