/* torusnet.h: the C interface of torusnet's application library (libtorusnet_client).
 *
 * An application attaches to the torusd of its server under a service name, then sends
 * and receives messages through a shared-memory channel: no system call per message
 * unless one side sleeps. Link with -ltorusnet_client (target/release of the workspace).
 *
 *   torus_client *c = torus_attach("/run/torusnet/n0-apps.sock", "echo");
 *   torus_event ev; char buf[65536];
 *   while (torus_recv(c, &ev, buf, sizeof buf, -1) == 1)
 *       if (ev.kind == TORUS_EV_MESSAGE) {
 *           torus_dest d = { .kind = TORUS_DEST_SERVICE, .addr = ev.from };
 *           torus_send(c, &d, buf, ev.len, TORUS_RELIABLE, NULL);
 *       }
 *
 * Every function returns 0 (or a count) on success and a negative TORUS_E* code on
 * failure; torus_last_error() then describes it (per thread). A client may be used from
 * several threads.
 */
#ifndef TORUSNET_H
#define TORUSNET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors. */
#define TORUS_EAGAIN     (-1) /* the channel is full: receive, then try again */
#define TORUS_ETIMEDOUT  (-2) /* nothing in time */
#define TORUS_EREFUSED   (-3) /* torusd refused: see torus_last_error() */
#define TORUS_ETOOBIG    (-4) /* the buffer is too small: ev->len (or *resp_len) says how big */
#define TORUS_ENOTFOUND  (-5) /* no server hosts the name */
#define TORUS_ECLOSED    (-6) /* torusd closed the channel */
#define TORUS_EINVAL     (-7) /* a bad argument */
#define TORUS_EIO        (-8) /* an I/O error */

/* A service on a server. */
typedef struct {
    uint16_t x, y, z;  /* the server */
    uint16_t service;  /* the service id there */
} torus_addr;

/* Where a message goes. */
#define TORUS_DEST_SERVICE 0 /* addr */
#define TORUS_DEST_KEY     1 /* the root of a routing key, service key_service there */
#define TORUS_DEST_NAME    2 /* a service by name, resolved across the torus */
typedef struct {
    int kind;
    torus_addr addr;
    uint64_t key;
    uint16_t key_service;
    const char *name;
} torus_dest;

/* Send flags. */
#define TORUS_RELIABLE  1u /* exactly once, any size, reported; else short and best effort */
#define TORUS_BWD_FENCE 2u /* after every earlier message to that server */
#define TORUS_FWD_FENCE 4u /* before every later one */
#define TORUS_ON_PATH  16u /* services intercepting it on the path see it (short, to a key) */
/* Sent as one of the names this application added (torus_add_name's id), not its attach
 * name: or it into the flags. */
#define TORUS_FROM(service) ((unsigned)(uint16_t)(service) << 16)

/* Events. */
#define TORUS_EV_MESSAGE        1  /* from, reliable, keyed/key, len bytes in the buffer */
#define TORUS_EV_REQUEST        2  /* a request: answer with torus_respond(from, tag) */
#define TORUS_EV_ACKED          3  /* count messages to from.x/y/z acknowledged, last tag */
#define TORUS_EV_FAILED         4  /* message tag to from.x/y/z failed: reason */
#define TORUS_EV_PEER_RESET     5  /* server from.x/y/z restarted (reason 1) or reset (2) */
#define TORUS_EV_UNREACHABLE    6  /* server from.x/y/z became unreachable */
#define TORUS_EV_REACHABLE      7  /* ... reachable again */
#define TORUS_EV_BUFFER_FILLED  8  /* return buffer tag holds len bytes from `from` */
#define TORUS_EV_BUFFER_MISSED  9  /* message tag found no return buffer at from.x/y/z */
#define TORUS_EV_OVERFLOW       10 /* count incoming messages dropped (not read in time) */
#define TORUS_EV_REMOTE_DONE    11 /* remote-memory operation tag ended: reason = status, count = bytes */
#define TORUS_EV_TRIPWIRE       12 /* a remote write touched tripwire tag: key = region, count = offset, len */
#define TORUS_EV_WRITTEN        13 /* a notifying remote write landed: key = region, count = offset, len */
#define TORUS_EV_LONG_OFFER     14 /* a long message offered: from, tag = offer id, count = its length;
                                      the offer's len bytes in the buffer (for torus_pull/decline) */
#define TORUS_EV_LONG_DONE      15 /* a long send of ours ended: tag = offer id, reason = TORUS_LONG_* */
#define TORUS_EV_INTERCEPTED    16 /* a frame of our service passing through, held for torus_verdict:
                                      tag = its id, from, keyed/key, its payload in the buffer */
#define TORUS_EV_MCAST_DATA     17 /* bytes of a multicast to us, in order: from = root, tag = transfer,
                                      key = their offset, count = its size, to = our service */
#define TORUS_EV_MCAST_END      18 /* a multicast to us ended: from = root, tag = transfer, count = size,
                                      reason 0 every byte delivered, 1 it ended short */
#define TORUS_EV_MCAST_REPORT   19 /* a multicast of ours ended: tag = its tag, reason 0 all members
                                      complete, 1 not, count = members complete; JSON report in buffer */

/* How a long send ended. */
#define TORUS_LONG_PULLED   1
#define TORUS_LONG_DECLINED 2
#define TORUS_LONG_FAILED   3 /* the receiver's reads failed */
#define TORUS_LONG_EXPIRED  4 /* nobody pulled it in time */

/* Failure reasons. */
#define TORUS_PEER_RESTARTED 1
#define TORUS_PEER_RESET     2
#define TORUS_SILENT         3
#define TORUS_UNREACHABLE    4
#define TORUS_REFUSED        5
#define TORUS_NO_SERVICE     6  /* no application at the peer takes it (not attached) */
#define TORUS_RECEIVER_FULL  7  /* the application it was for fell behind: not delivered */

typedef struct {
    int kind;
    torus_addr from;
    uint64_t tag;
    uint64_t count;
    uint64_t key;
    int keyed;
    int reliable;
    int reason;
    uint16_t to;  /* a message's or request's destination: which of this application's
                     services (the attach name's id, or an added name's) */
    size_t len;
} torus_event;

/* A posted return buffer's descriptor (send it to the peer that should fill it). */
typedef struct {
    torus_addr owner;
    uint32_t id;
    uint32_t len;
    uint64_t cookie;
} torus_buffer;

typedef struct torus_client torus_client;

/* The last error's message on this thread (never NULL). */
const char *torus_last_error(void);

/* Attaches to torusd's application socket as service `name`; NULL on error. */
torus_client *torus_attach(const char *socket, const char *name);
/* The same with a pool of `pool` bytes (16 MiB by default): return buffers, remote-memory
 * regions and long sends live there; torusd caps it at its [apps] max_pool_mib. */
torus_client *torus_attach_pool(const char *socket, const char *name, uint64_t pool);
/* Detaches (the service is unregistered) and frees the client. */
void torus_detach(torus_client *c);
/* This application's address: its server and service id. */
torus_addr torus_address(const torus_client *c);

/* Sends len bytes to d; the message's tag goes to *tag if not NULL. */
int torus_send(torus_client *c, const torus_dest *d, const void *data, size_t len,
               unsigned flags, uint64_t *tag);
/* Receives the next event: 1 (filled; a message's bytes in buf), 0 (nothing within
 * timeout_ms; 0 = do not wait, negative = no limit) or an error. TORUS_ETOOBIG keeps the
 * event: call again with ev->len bytes. */
int torus_recv(torus_client *c, torus_event *ev, void *buf, size_t cap, int timeout_ms);

/* The servers hosting service `name`: up to max addresses, returns how many. */
int torus_resolve(torus_client *c, const char *name, torus_addr *out, size_t max,
                  int timeout_ms);
/* Adds service name `name` to this application (at most 16): messages and requests to it
 * arrive here too (ev->to says which name), others resolve it, TORUS_FROM(id) sends as it.
 * Its id goes to *service. The name goes when the application detaches. */
int torus_add_name(torus_client *c, const char *name, uint16_t *service);
/* On the path (CamCube's per-hop services): frames of this application's service sent with
 * TORUS_ON_PATH that pass through this server are held and shown to it
 * (TORUS_EV_INTERCEPTED); torus_verdict lets each go on (as it was, or with a new payload)
 * or drops it. A frame without a verdict in 20 ms goes on as it was. To answer a frame,
 * send the answer and drop it. */
#define TORUS_PASS   0
#define TORUS_CHANGE 1
#define TORUS_DROP   2
int torus_intercept(torus_client *c, int on);
int torus_verdict(torus_client *c, uint64_t id, int verdict, const void *data, size_t len);

/* Forgets what torus_resolve (or a send to a name) cached for `name`. A failure that says
 * the service is gone from a server (no service, unreachable, restarted) forgets it too. */
int torus_forget(torus_client *c, const char *name);

/* Request/response: sends req, waits for the reply (copied into resp, length in
 * *resp_len). */
int torus_call(torus_client *c, const torus_dest *d, const void *req, size_t len,
               void *resp, size_t cap, size_t *resp_len, int timeout_ms);
/* Answers a TORUS_EV_REQUEST (its from and tag). */
int torus_respond(torus_client *c, torus_addr to, uint64_t call, const void *data,
                  size_t len);

/* Asks for (or stops) TORUS_EV_ACKED reports. */
int torus_notify_acks(torus_client *c, int on);

/* Asks for fair-queuing weight `weight` (this application's share of links it shares); the
 * weight torusd granted, at most its node file's [apps] max_weight, goes to *granted.
 * Refused (TORUS_EREFUSED) when the node file sets this application's weight itself. */
int torus_request_weight(torus_client *c, uint32_t weight, uint32_t *granted);

/* Posts a return buffer of len bytes in this application's memory. */
int torus_post_buffer(torus_client *c, uint32_t len, torus_buffer *out);
/* Sends into another application's posted buffer (its descriptor came in a message). */
int torus_send_to_buffer(torus_client *c, const torus_buffer *b, const void *data,
                         size_t len, unsigned flags, uint64_t *tag);
/* Copies a filled buffer (len from its TORUS_EV_BUFFER_FILLED) out and frees it; returns
 * the bytes copied. */
int torus_read_buffer(torus_client *c, uint32_t id, void *out, size_t len);

/* Remote memory: an application registers regions of its memory, hands out capabilities
 * (40 plain bytes: send them in any message), and reads and writes other applications'
 * regions without their taking part. Every operation ends in one TORUS_EV_REMOTE_DONE
 * (reason = a TORUS_RM_* status, count = bytes) by torusd's deadline, or is waited for
 * with torus_wait_remote. */
#define TORUS_READ   1u /* rights */
#define TORUS_WRITE  2u
#define TORUS_NOTIFY 8u /* remote flag (with TORUS_BWD_FENCE, TORUS_FWD_FENCE): tell the
                           region's owner (TORUS_EV_WRITTEN) when the write has landed */

#define TORUS_RM_OK          0
#define TORUS_RM_BAD_COOKIE  1 /* no such capability at the target */
#define TORUS_RM_REVOKED     2
#define TORUS_RM_EXPIRED     3
#define TORUS_RM_OUT_OF_RANGE 4
#define TORUS_RM_NO_RIGHT    5
#define TORUS_RM_NO_REGION   6 /* deregistered, or its owner exited */
#define TORUS_RM_PEER_FAILED 7
#define TORUS_RM_TIMEOUT     8
#define TORUS_RM_INVALID     9

#define TORUS_CAP_LEN 40
typedef struct {
    uint8_t bytes[TORUS_CAP_LEN];
} torus_cap;

/* A region of this application's memory. The client checks one handed back against what it
 * registered: an altered copy is refused (TORUS_EINVAL / TORUS_EREFUSED). */
typedef struct {
    uint32_t id;
    uint64_t pool_offset;
    uint64_t len;
    torus_cap cap; /* for all of it: narrow it before handing it out */
} torus_region;

/* Registers len bytes of this application's memory, accessible with `rights`. */
int torus_register_region(torus_client *c, uint64_t len, unsigned rights, torus_region *out);
/* Deregisters it: every capability for it dies. */
int torus_deregister_region(torus_client *c, const torus_region *r);
/* A capability for len bytes at offset of cap with at most `rights`, valid for ttl_s seconds
 * (0: until revoked). Only the region's owner may narrow. */
int torus_narrow(torus_client *c, const torus_cap *cap, uint64_t offset, uint64_t len,
                 unsigned rights, uint32_t ttl_s, torus_cap *out);
/* Revokes cap and every capability narrowed from it. */
int torus_revoke(torus_client *c, const torus_cap *cap);
/* Arms a tripwire on len bytes at offset of r: a remote write touching them raises
 * TORUS_EV_TRIPWIRE with tag = *id. */
int torus_arm_tripwire(torus_client *c, const torus_region *r, uint64_t offset, uint64_t len,
                       uint64_t *id);
int torus_disarm_tripwire(torus_client *c, const torus_region *r, uint64_t id);
/* Writes len bytes at offset of what cap grants; the operation's handle goes to *op. */
int torus_remote_write(torus_client *c, const torus_cap *cap, uint64_t offset,
                       const void *data, size_t len, unsigned flags, uint64_t *op);
/* Reads len bytes at offset of what cap grants into this application's region `into` at
 * `at`. */
int torus_remote_read(torus_client *c, const torus_cap *cap, uint64_t offset, uint64_t len,
                      const torus_region *into, uint64_t at, unsigned flags, uint64_t *op);
/* Waits for operation op to end (timeout_ms negative: its own deadline): 0 with its
 * TORUS_RM_* status in *status and the bytes moved in *moved, or TORUS_ETIMEDOUT. Other
 * events meanwhile are kept for torus_recv. */
int torus_wait_remote(torus_client *c, uint64_t op, int timeout_ms, int *status,
                      uint64_t *moved);
/* A TORUS_RM_* status's name ("ok", "revoked", ...). */
const char *torus_rm_status_name(int status);
/* Copies bytes into (out of) this application's own region r at offset. */
int torus_region_write(torus_client *c, const torus_region *r, uint64_t offset,
                       const void *data, size_t len);
int torus_region_read(torus_client *c, const torus_region *r, uint64_t offset, void *out,
                      size_t len);

/* Long send (libRIPC): the sender offers len bytes at offset of its region r; the receiver
 * pulls them with remote reads into a region of its own when it wants; the sender's
 * application does nothing while they move and learns (TORUS_EV_LONG_DONE) when it may
 * reuse the bytes. ttl_s: seconds the receiver has (0: 30); the offer id goes to *offer. */
int torus_send_long(torus_client *c, const torus_dest *d, const torus_region *r,
                    uint64_t offset, uint64_t len, uint32_t ttl_s, uint64_t *offer);
/* Pulls an offer (a TORUS_EV_LONG_OFFER's bytes) into region `into` at `at`, then tells
 * the sender; waits at most timeout_ms. */
int torus_pull(torus_client *c, const void *offer, size_t offer_len, const torus_region *into,
               uint64_t at, int timeout_ms);
/* Declines an offer: its sender may reuse the bytes. */
int torus_decline(torus_client *c, const void *offer, size_t offer_len);

/* Multicast: len bytes at offset of our region r to the applications hosting `service` on
 * the n servers of group (n 0: every other server; the addresses' service is ignored), in
 * chunks of `chunk` bytes (0: torusd's), within timeout_s seconds (0: 600). Members receive
 * TORUS_EV_MCAST_DATA in order, then TORUS_EV_MCAST_END; we get TORUS_EV_MCAST_REPORT with
 * *tag, and keep the bytes unchanged until then. */
int torus_multicast(torus_client *c, const torus_addr *group, size_t n, const char *service,
                    const torus_region *r, uint64_t offset, uint64_t len, uint32_t chunk,
                    uint32_t timeout_s, uint64_t *tag);

/* CLAN's message queue on remote memory: the receiver's ring of `slots` slots of `slot`
 * bytes (4 of them the length), filled by the sender's one-sided writes. Each end attaches a
 * client of its own (a queue takes its client's events while it waits) and detaches it
 * when freed. Receiver: its ring's capability goes to *ring, for the sender; the sender's
 * read-index capability (*read) goes back to torus_queue_connect. */
typedef struct torus_queue_rx torus_queue_rx;
typedef struct torus_queue_tx torus_queue_tx;
torus_queue_rx *torus_queue_receiver(const char *socket, const char *name, uint64_t slots,
                                     uint64_t slot, torus_cap *ring);
int torus_queue_connect(torus_queue_rx *q, const torus_cap *read);
/* 1 with a message (length in *len), 0 when none came within timeout_ms, TORUS_ETOOBIG
 * (kept; *len says how big) or an error. */
int torus_queue_recv(torus_queue_rx *q, void *buf, size_t cap, size_t *len, int timeout_ms);
void torus_queue_receiver_free(torus_queue_rx *q);
torus_queue_tx *torus_queue_sender(const char *socket, const char *name, const torus_cap *ring,
                                   uint64_t slots, uint64_t slot, torus_cap *read);
/* push: into the next slot, not yet announced; publish: announce what was pushed; send:
 * both; flush: wait until every write completed. */
int torus_queue_push(torus_queue_tx *q, const void *data, size_t len, int timeout_ms);
int torus_queue_publish(torus_queue_tx *q);
int torus_queue_send(torus_queue_tx *q, const void *data, size_t len, int timeout_ms);
int torus_queue_flush(torus_queue_tx *q, int timeout_ms);
void torus_queue_sender_free(torus_queue_tx *q);

#ifdef __cplusplus
}
#endif
#endif
