/* Remote memory in C over torusnet's application library: two applications, the owner
 * attached to one torusd and the writer to another, in one process.
 *
 *   rmem OWNER_SOCKET WRITER_SOCKET [BYTES]
 *
 * The owner registers a region, arms a tripwire on its first 8 bytes and sends the writer a
 * capability in a message; the writer writes BYTES (default 1 MiB) into it with notification
 * and reads them back into a region of its own; then a read-only narrowed capability is
 * refused a write, a revoked one refused a read, an altered region refused locally. Prints
 * one JSON line; exits 0 when every step went as described.
 *
 * Build: cc -O2 -I client/include rmem.c -L target/release -ltorusnet_client
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torusnet.h"

static int fail(const char *what) {
    printf("{\"ok\":false,\"step\":\"%s\",\"error\":\"%s\"}\n", what, torus_last_error());
    return 1;
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + (i >> 9)); }

/* Waits up to 10 s for the owner's tripwire `wire` and its notification of n bytes. */
static void wait_owner(torus_client *c, uint64_t wire, size_t n, int *tripped, int *written) {
    static unsigned char buf[1 << 16];
    torus_event ev;
    for (int i = 0; i < 100 && !(*tripped && *written); i++) {
        if (torus_recv(c, &ev, buf, sizeof buf, 100) != 1)
            continue;
        if (ev.kind == TORUS_EV_TRIPWIRE && ev.tag == wire)
            *tripped = 1;
        if (ev.kind == TORUS_EV_WRITTEN && ev.len == n)
            *written = 1;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: rmem OWNER_SOCKET WRITER_SOCKET [BYTES]\n");
        return 2;
    }
    size_t n = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : (1u << 20);
    torus_client *owner = torus_attach(argv[1], "rmem-c-owner");
    if (!owner)
        return fail("attach owner");
    torus_client *writer = torus_attach(argv[2], "rmem-c-writer");
    if (!writer)
        return fail("attach writer");

    torus_region region, mine;
    if (torus_register_region(owner, n, TORUS_READ | TORUS_WRITE, &region) != 0)
        return fail("register");
    uint64_t wire;
    if (torus_arm_tripwire(owner, &region, 0, 8, &wire) != 0)
        return fail("arm tripwire");

    /* The capability travels in a message, as between any two applications. */
    torus_addr w = torus_address(writer);
    torus_dest d = {.kind = TORUS_DEST_SERVICE, .addr = w};
    if (torus_send(owner, &d, region.cap.bytes, TORUS_CAP_LEN, TORUS_RELIABLE, NULL) != 0)
        return fail("send capability");
    torus_event ev;
    static unsigned char msg[1 << 16];
    int got_cap = 0;
    for (int i = 0; i < 100 && !got_cap; i++) {
        int r = torus_recv(writer, &ev, msg, sizeof msg, 100);
        got_cap = r == 1 && ev.kind == TORUS_EV_MESSAGE && ev.len == TORUS_CAP_LEN;
    }
    if (!got_cap)
        return fail("receive capability");
    torus_cap cap;
    memcpy(cap.bytes, msg, TORUS_CAP_LEN);

    unsigned char *data = malloc(n), *back = malloc(n);
    if (!data || !back)
        return 2;
    for (size_t i = 0; i < n; i++)
        data[i] = pattern(i);
    uint64_t op, moved;
    int status;
    if (torus_remote_write(writer, &cap, 0, data, n, TORUS_NOTIFY, &op) != 0)
        return fail("remote write");
    if (torus_wait_remote(writer, op, -1, &status, &moved) != 0 || status != TORUS_RM_OK)
        return fail("remote write's end");
    int tripped = 0, written = 0;
    wait_owner(owner, wire, n, &tripped, &written);
    if (torus_region_read(owner, &region, 0, back, n) != 0)
        return fail("region read");
    int landed = memcmp(back, data, n) == 0;

    /* Read it back into a region of the writer's own. */
    if (torus_register_region(writer, n, TORUS_READ | TORUS_WRITE, &mine) != 0)
        return fail("register writer's region");
    if (torus_remote_read(writer, &cap, 0, n, &mine, 0, 0, &op) != 0)
        return fail("remote read");
    if (torus_wait_remote(writer, op, -1, &status, &moved) != 0 || status != TORUS_RM_OK)
        return fail("remote read's end");
    memset(back, 0, n);
    if (torus_region_read(writer, &mine, 0, back, n) != 0)
        return fail("region read (writer)");
    int read_back = memcmp(back, data, n) == 0 && moved == n;

    /* A read-only window is refused a write; once revoked, refused a read. */
    torus_cap ro;
    if (torus_narrow(owner, &region.cap, 4096, 4096, TORUS_READ, 0, &ro) != 0)
        return fail("narrow");
    int no_right = -1, revoked = -1;
    if (torus_remote_write(writer, &ro, 0, data, 64, 0, &op) != 0 ||
        torus_wait_remote(writer, op, -1, &no_right, &moved) != 0)
        return fail("write with a read-only capability");
    if (torus_revoke(owner, &ro) != 0)
        return fail("revoke");
    if (torus_remote_read(writer, &ro, 0, 64, &mine, 0, 0, &op) != 0 ||
        torus_wait_remote(writer, op, -1, &revoked, &moved) != 0)
        return fail("read with a revoked capability");

    /* A region struct altered by the application is not its region. */
    torus_region forged = mine;
    forged.pool_offset += 64;
    int forged_refused = torus_region_write(writer, &forged, 0, data, 8) == TORUS_EINVAL;

    int ok = tripped && written && landed && read_back && no_right == TORUS_RM_NO_RIGHT &&
             (revoked == TORUS_RM_REVOKED || revoked == TORUS_RM_BAD_COOKIE) && forged_refused;
    printf("{\"ok\":%s,\"bytes\":%zu,\"tripwire\":%d,\"written\":%d,\"landed\":%d,"
           "\"read_back\":%d,\"read_only_write\":\"%s\",\"revoked_read\":\"%s\","
           "\"forged_region_refused\":%d}\n",
           ok ? "true" : "false", n, tripped, written, landed, read_back,
           torus_rm_status_name(no_right), torus_rm_status_name(revoked), forged_refused);
    torus_deregister_region(writer, &mine);
    torus_deregister_region(owner, &region);
    torus_detach(writer);
    torus_detach(owner);
    free(data);
    free(back);
    return ok ? 0 : 1;
}
