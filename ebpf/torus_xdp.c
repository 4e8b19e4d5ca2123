// SPDX-License-Identifier: MIT OR GPL-2.0
// The torusnet XDP program: steers torus data frames into the links' AF_XDP sockets, and
// forwards frames that only pass through this server to their next link by itself.
//
// Data frames (EtherType 0x88B5) that pass through (addressed to another server, by
// next hops or by a source route) leave on their next link through a device map, their
// Ethernet addresses, TTL, hop count and route index rewritten as the engine would
// (transit, below). Every other data frame goes to the AF_XDP socket of the link it
// arrived on, where the poller judges it. Control frames (0x88B6) and all other traffic go
// up to the kernel, where the control process reads them with AF_PACKET. Torus frames too
// short to hold the torus header are dropped here so userspace never sees them.
//
// One instance per torusd, attached to every link: its maps (sockets, devices, routes,
// counters, fault injection) are indexed by the link's direction (0 +x .. 5 -z).
//
// The transit decision is written twice, here and in Rust (proto/src/routing/transit.rs):
// the engine's tests prove the Rust never forwards a frame the engine would not forward
// the same way, and the dataplane's tests run this program (BPF_PROG_TEST_RUN) against
// the Rust on the same frames and maps. Change both, or neither.
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
#define INLINE static __attribute__((always_inline)) inline

struct xdp_md {
    __u32 data;
    __u32 data_end;
    __u32 data_meta;
    __u32 ingress_ifindex;
    __u32 rx_queue_index;
    __u32 egress_ifindex;
};

enum { XDP_ABORTED = 0, XDP_DROP = 1, XDP_PASS = 2, XDP_TX = 3, XDP_REDIRECT = 4 };
enum {
    BPF_MAP_TYPE_HASH = 1,
    BPF_MAP_TYPE_ARRAY = 2,
    BPF_MAP_TYPE_PERCPU_ARRAY = 6,
    BPF_MAP_TYPE_DEVMAP = 14,
    BPF_MAP_TYPE_XSKMAP = 17,
};

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;
#ifdef TORUS_FRAGS
static __u64 (*bpf_xdp_get_buff_len)(struct xdp_md *ctx) = (void *)188;
#endif

#define ETH_LEN 14
#define TORUS_LEN 66
#define HEADERS_LEN (ETH_LEN + TORUS_LEN)
#define ETHERTYPE_DATA 0x88B5
#define ETHERTYPE_CONTROL 0x88B6
#define MAX_ROUTE_HOPS 32
#define LINKS 6
#define NO_LINK 6 // counter row of frames from an interface that is no link

// Header offsets from the start of the Ethernet frame (proto/src/wire.rs, offset).
#define OFF_VERSION (ETH_LEN + 0)
#define OFF_KIND (ETH_LEN + 1)
#define OFF_FLAGS (ETH_LEN + 2)
#define OFF_TTL (ETH_LEN + 4)
#define OFF_HOPS (ETH_LEN + 5)
#define OFF_SRC (ETH_LEN + 8)
#define OFF_PAYLOAD_LEN (ETH_LEN + 14)
#define OFF_DST (ETH_LEN + 16)
#define OFF_CONN (ETH_LEN + 24)
#define OFF_ROUTE_LEN (ETH_LEN + 60)
#define OFF_ROUTE_NEXT (ETH_LEN + 61)
#define OFF_CONG (ETH_LEN + 64)

#define VERSION 1
#define KIND_CONTROL 3
#define KIND_PROBE 5
#define KIND_MAX 5
#define FLAG_KEY_ROUTED (1 << 3)
#define FLAG_INTERCEPT (1 << 9)
#define FLAG_SOURCE_ROUTED (1 << 11)
#define FLAGS_KNOWN ((1 << 13) - 1) // wire::flags::KNOWN

// Counter slots of one link; keep in sync with dataplane/src/loader.rs (XdpCounters).
enum {
    CNT_REDIRECTED = 0,     // data frames handed to the link's AF_XDP socket (up)
    CNT_PASSED = 1,         // control and non-torus frames passed to the kernel
    CNT_MALFORMED = 2,      // torus frames too short for the torus header
    CNT_FAULT_DROP = 3,     // data frames dropped by fault injection
    CNT_NO_SOCKET = 4,      // data frames for a queue with no socket bound (passed up)
    CNT_CONTROL = 5,        // control frames (also counted in CNT_PASSED)
    CNT_TRANSIT_IN = 6,     // frames that arrived here and were forwarded in XDP
    CNT_TRANSIT_IN_BYTES = 7,
    CNT_TRANSIT_OUT = 8,    // frames forwarded in XDP that left by this link
    CNT_TRANSIT_OUT_BYTES = 9,
    CNT_UP = 10,            // CNT_UP + reason: why a data frame went up to the poller
    CNT_MAX = 32,           // a power of two: a slot masked with CNT_MAX - 1 is in bounds
};

// Why a data frame goes up to the poller instead of on (proto's transit::Up, same order).
enum {
    UP_OFF = 0,       // transit in XDP is switched off
    UP_LOCAL = 1,     // for this server (or at the end of its source route)
    UP_KEY = 2,       // key-routed: the key's root is the engine's to find
    UP_INTERCEPT = 3, // services on the path asked to see it
    UP_PROBE = 4,     // a path probe: it collects the links' figures
    UP_NO_ROUTE = 5,  // no next hop towards its destination
    UP_LINK_DOWN = 6, // every next link is down, faulty or not this program's
    UP_CHECK = 7,     // fails a check the engine makes (it refuses and counts it there)
    UP_HEADERS = 8,   // its headers do not lie in the part of the frame XDP can read
};

struct counters {
    __u64 c[CNT_MAX];
};

// Our MAC and the neighbour's on one link, and its load.
struct link {
    __u8 local_mac[6];
    __u8 neighbor_mac[6];
    __u8 neighbor_known;
    __u8 level; // its transmit load, hundredths of its capacity (queue included)
    __u16 pad;
};

// What transit needs besides the routes; written by torusd whenever one of them changes.
struct transit {
    __u16 dims[3];
    __u16 local[3];
    __u8 on;
    __u8 usable;    // links a frame may leave by (live, carrier, known neighbour, no fault)
    __u8 congested; // links torusd found loaded: skipped while another next hop is free
    __u8 pad;
};

// Link direction -> AF_XDP socket (of the link's RX queue 0).
struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, LINKS);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

// The kernel's struct bpf_devmap_val: an interface and no program of its own.
struct devmap_val {
    __u32 ifindex;
    __u32 prog;
};

// Link direction -> its interface, for redirects.
struct {
    __uint(type, BPF_MAP_TYPE_DEVMAP);
    __uint(max_entries, LINKS);
    __type(key, __u32);
    __type(value, struct devmap_val);
} egress SEC(".maps");

// Interface index -> link direction.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16);
    __type(key, __u32);
    __type(value, __u32);
} ports SEC(".maps");

// Link direction -> its MAC addresses.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, LINKS);
    __type(key, __u32);
    __type(value, struct link);
} links SEC(".maps");

// Slot 0: the transit settings.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct transit);
} transit SEC(".maps");

// Destination server (dense index: (z * Y + y) * X + x) -> next-hop links, one bit per
// direction: the engine's route table. torusd sizes it to the torus at load.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u8);
} routes SEC(".maps");

// Per-CPU counters, one row per link direction (and NO_LINK).
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, LINKS + 1);
    __type(key, __u32);
    __type(value, struct counters);
} counters SEC(".maps");

// Per link direction: drop threshold for data frames, out of 2^32 (0 = off). For tests.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, LINKS);
    __type(key, __u32);
    __type(value, __u32);
} fault SEC(".maps");

INLINE void count(__u32 row, __u32 slot, __u64 n)
{
    struct counters *c = bpf_map_lookup_elem(&counters, &row);
    if (c)
        c->c[slot & (CNT_MAX - 1)] += n;
}

INLINE __u16 be16(const __u8 *p)
{
    return (__u16)(p[0] << 8 | p[1]);
}

INLINE __u32 be32(const __u8 *p)
{
    return (__u32)p[0] << 24 | (__u32)p[1] << 16 | (__u32)p[2] << 8 | (__u32)p[3];
}

// proto's transit::mix: a 32-bit finaliser (murmur3's constants).
INLINE __u32 mix(__u32 h)
{
    h ^= h >> 16;
    h *= 0x85ebca6b;
    h ^= h >> 13;
    h *= 0xc2b2ae35;
    h ^= h >> 16;
    return h;
}

// proto's transit::flow_hash: one connection's frames take one of equal next hops.
INLINE __u32 flow_hash(__u32 src, __u32 dst, __u32 conn)
{
    return mix(src * 0x9e3779b1 ^ mix(dst ^ mix(conn)));
}

// The one frame's total length: with frags, the linear part is only its first buffer.
INLINE __u32 frame_len(struct xdp_md *ctx, __u32 linear)
{
#ifdef TORUS_FRAGS
    return (__u32)bpf_xdp_get_buff_len(ctx);
#else
    return linear;
#endif
}

INLINE void copy_mac(__u8 *to, const __u8 *from)
{
    for (int i = 0; i < 6; i++)
        to[i] = from[i];
}

// The frame leaves by link `dir`: hop count and TTL as the engine's forward_hop writes
// them, the link's Ethernet addresses as the poller's transmit path writes them, and its
// load into the frame's telemetry when it is the most loaded so far (wire::raise_cong).
INLINE void rewrite(__u8 *eth, struct link *l)
{
    eth[OFF_TTL] -= 1;
    if (eth[OFF_HOPS] != 0xff)
        eth[OFF_HOPS] += 1;
    if (l->level > eth[OFF_CONG])
        eth[OFF_CONG] = l->level;
    copy_mac(eth, l->neighbor_mac);
    copy_mac(eth + 6, l->local_mac);
}

INLINE int in_torus(const __u16 *dims, __u16 x, __u16 y, __u16 z)
{
    return x < dims[0] && y < dims[1] && z < dims[2];
}

// Decides whether the data frame `eth` (at least HEADERS_LEN bytes present) arrived on
// link `in` passes on by itself: the link it leaves by (0..5, the frame rewritten), or
// -1 - the reason it goes up.
INLINE int decide(struct xdp_md *ctx, __u8 *eth, void *data_end, __u32 in)
{
    __u32 zero = 0;
    struct transit *t = bpf_map_lookup_elem(&transit, &zero);
    if (!t || !t->on)
        return -1 - UP_OFF;
    struct link *lin = bpf_map_lookup_elem(&links, &in);
    if (!lin)
        return -1 - UP_CHECK;
    if (lin->neighbor_known) {
        for (int i = 0; i < 6; i++)
            if (eth[6 + i] != lin->neighbor_mac[i])
                return -1 - UP_CHECK;
    }
    __u8 kind = eth[OFF_KIND];
    __u16 flags = be16(eth + OFF_FLAGS);
    if (eth[OFF_VERSION] != VERSION || kind > KIND_MAX || (flags & ~FLAGS_KNOWN))
        return -1 - UP_CHECK;
    __u32 route_len = eth[OFF_ROUTE_LEN];
    __u32 route_next = eth[OFF_ROUTE_NEXT];
    __u32 linear = (__u32)((long)data_end - (long)eth);
    if (!(flags & FLAG_SOURCE_ROUTED)) {
        if (route_len != 0 || route_next != 0)
            return -1 - UP_CHECK;
    } else {
        if (route_len == 0 || route_len > MAX_ROUTE_HOPS || route_next > route_len)
            return -1 - UP_CHECK;
        if (HEADERS_LEN + route_len > linear)
            return -1 - UP_HEADERS;
        for (__u32 i = 0; i < MAX_ROUTE_HOPS; i++) {
            __u8 *hop = eth + HEADERS_LEN + i;
            if (i >= route_len)
                break;
            if ((void *)(hop + 1) > data_end)
                return -1 - UP_HEADERS;
            if (*hop >= LINKS)
                return -1 - UP_CHECK;
        }
    }
    __u32 total = frame_len(ctx, linear);
    if (be16(eth + OFF_PAYLOAD_LEN) + HEADERS_LEN + route_len > total)
        return -1 - UP_CHECK;
    if (kind == KIND_PROBE)
        return -1 - UP_PROBE;
    if (kind == KIND_CONTROL)
        return -1 - UP_CHECK;
    if (flags & FLAG_KEY_ROUTED)
        return -1 - UP_KEY;
    __u16 sx = be16(eth + OFF_SRC), sy = be16(eth + OFF_SRC + 2), sz = be16(eth + OFF_SRC + 4);
    __u16 dx = be16(eth + OFF_DST), dy = be16(eth + OFF_DST + 2), dz = be16(eth + OFF_DST + 4);
    if (!in_torus(t->dims, sx, sy, sz) || be16(eth + OFF_DST + 6) != 0 ||
        !in_torus(t->dims, dx, dy, dz))
        return -1 - UP_CHECK;
    if (sx == t->local[0] && sy == t->local[1] && sz == t->local[2])
        return -1 - UP_CHECK;
    if (flags & FLAG_SOURCE_ROUTED) {
        if (route_next == route_len)
            return -1 - UP_LOCAL;
        __u8 *hop = eth + HEADERS_LEN + (route_next & (MAX_ROUTE_HOPS - 1));
        if ((void *)(hop + 1) > data_end)
            return -1 - UP_HEADERS;
        __u32 dir = *hop;
        if (dir >= LINKS || !(t->usable & (1 << dir)))
            return -1 - UP_LINK_DOWN;
        if (eth[OFF_TTL] == 0)
            return -1 - UP_CHECK;
        struct link *out = bpf_map_lookup_elem(&links, &dir);
        if (!out)
            return -1 - UP_LINK_DOWN;
        eth[OFF_ROUTE_NEXT] = (__u8)(route_next + 1);
        rewrite(eth, out);
        return (int)dir;
    }
    if (dx == t->local[0] && dy == t->local[1] && dz == t->local[2])
        return -1 - UP_LOCAL;
    if (flags & FLAG_INTERCEPT)
        return -1 - UP_INTERCEPT;
    __u32 src = ((__u32)sz * t->dims[1] + sy) * t->dims[0] + sx;
    __u32 dst = ((__u32)dz * t->dims[1] + dy) * t->dims[0] + dx;
    __u8 *hops = bpf_map_lookup_elem(&routes, &dst);
    if (!hops || *hops == 0)
        return -1 - UP_NO_ROUTE;
    __u32 cand = *hops & t->usable;
    if (cand == 0)
        return -1 - UP_LINK_DOWN;
    __u32 free = cand & ~(__u32)t->congested;
    if (free)
        cand = free;
    if (eth[OFF_TTL] == 0)
        return -1 - UP_CHECK;
    __u32 n = 0;
    for (int d = 0; d < LINKS; d++)
        n += (cand >> d) & 1;
    __u32 k = flow_hash(src, dst, be32(eth + OFF_CONN)) % n;
    __u32 dir = LINKS;
    for (__u32 d = 0; d < LINKS; d++) {
        if (!((cand >> d) & 1))
            continue;
        if (k == 0) {
            dir = d;
            break;
        }
        k--;
    }
    struct link *out = bpf_map_lookup_elem(&links, &dir);
    if (!out)
        return -1 - UP_LINK_DOWN;
    rewrite(eth, out);
    return (int)dir;
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

    __u32 ifindex = ctx->ingress_ifindex;
    __u32 *found = bpf_map_lookup_elem(&ports, &ifindex);
    __u32 in = found && *found < LINKS ? *found : NO_LINK;

    if ((void *)(eth + ETH_LEN) > data_end) {
        count(in, CNT_PASSED, 1);
        return XDP_PASS;
    }
    __u16 ethertype = be16(eth + 12);
    if (ethertype == ETHERTYPE_CONTROL) {
        count(in, CNT_CONTROL, 1);
        count(in, CNT_PASSED, 1);
        return XDP_PASS;
    }
    if (ethertype != ETHERTYPE_DATA) {
        count(in, CNT_PASSED, 1);
        return XDP_PASS;
    }
    if ((void *)(eth + HEADERS_LEN) > data_end) {
        count(in, CNT_MALFORMED, 1);
        return XDP_DROP;
    }
    if (in == NO_LINK || ctx->rx_queue_index != 0) {
        count(in, CNT_NO_SOCKET, 1);
        return XDP_PASS;
    }
    __u32 *threshold = bpf_map_lookup_elem(&fault, &in);
    if (threshold && *threshold && bpf_get_prandom_u32() < *threshold) {
        count(in, CNT_FAULT_DROP, 1);
        return XDP_DROP;
    }
    int out = decide(ctx, eth, data_end, in);
    if (out >= 0) {
        __u64 bytes = frame_len(ctx, (__u32)((long)data_end - (long)data));
        __u32 o = (__u32)out;
        struct counters *ci = bpf_map_lookup_elem(&counters, &in);
        if (ci) {
            ci->c[CNT_TRANSIT_IN] += 1;
            ci->c[CNT_TRANSIT_IN_BYTES] += bytes;
        }
        struct counters *co = bpf_map_lookup_elem(&counters, &o);
        if (co) {
            co->c[CNT_TRANSIT_OUT] += 1;
            co->c[CNT_TRANSIT_OUT_BYTES] += bytes;
        }
        return (int)bpf_redirect_map(&egress, o, 0);
    }
    count(in, CNT_UP + (__u32)(-1 - out), 1);
    long action = bpf_redirect_map(&xsks, in, XDP_PASS);
    if (action == XDP_REDIRECT)
        count(in, CNT_REDIRECTED, 1);
    else
        count(in, CNT_NO_SOCKET, 1);
    return (int)action;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
