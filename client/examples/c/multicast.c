/* Multicast between applications in C over torusnet's application library.
 *
 *   multicast send SOCKET SERVICE FILE [x,y,z ...]   members: the servers listed (none: all)
 *   multicast receive SOCKET SERVICE OUTFILE          writes the first transfer to OUTFILE
 *
 * The sender copies FILE into a region of its pool, multicasts it to the applications
 * attached as SERVICE on the members, and prints one JSON line from the report; a receiver
 * writes the bytes where they belong as they arrive and prints one JSON line when the
 * transfer ended. Exit 0 when every member has every byte (sender) or every byte came
 * (receiver).
 *
 * Build: cc -O2 -I client/include multicast.c -L target/release -ltorusnet_client
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

static int send_file(const char *socket, const char *service, const char *path, int n,
                     char **members) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail("open the file");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (len <= 0)
        return fail("an empty file");
    torus_client *c = torus_attach_pool(socket, "multicast-c-sender", (uint64_t)len + (1 << 20));
    if (!c)
        return fail("attach");
    torus_region r;
    if (torus_register_region(c, (uint64_t)len, TORUS_READ, &r) != 0)
        return fail("register");
    static char piece[1 << 20];
    uint64_t at = 0;
    size_t got;
    while ((got = fread(piece, 1, sizeof piece, f)) > 0) {
        if (torus_region_write(c, &r, at, piece, got) != 0)
            return fail("copy into the region");
        at += got;
    }
    fclose(f);
    torus_addr group[64];
    if (n > 64)
        return fail("at most 64 members in this example");
    for (int i = 0; i < n; i++) {
        unsigned x, y, z;
        if (sscanf(members[i], "%u,%u,%u", &x, &y, &z) != 3)
            return fail("a member is x,y,z");
        group[i] = (torus_addr){(uint16_t)x, (uint16_t)y, (uint16_t)z, 0};
    }
    uint64_t tag;
    if (torus_multicast(c, group, (size_t)n, service, &r, 0, (uint64_t)len, 0, 120, &tag) != 0)
        return fail("multicast");
    static char report[1 << 16];
    torus_event ev;
    for (;;) {
        int rc = torus_recv(c, &ev, report, sizeof report - 1, 180000);
        if (rc == TORUS_ETOOBIG)
            return fail("a report larger than 64 KiB");
        if (rc != 1)
            return fail("no report");
        if (ev.kind == TORUS_EV_MCAST_REPORT && ev.tag == tag)
            break;
    }
    report[ev.len] = 0;
    printf("{\"ok\":%s,\"completed\":%llu,\"report\":%s}\n", ev.reason == 0 ? "true" : "false",
           (unsigned long long)ev.count, report);
    torus_detach(c);
    return ev.reason == 0 ? 0 : 1;
}

static int receive(const char *socket, const char *service, const char *path) {
    torus_client *c = torus_attach(socket, service);
    if (!c)
        return fail("attach");
    FILE *f = fopen(path, "wb");
    if (!f)
        return fail("create the file");
    printf("{\"attached\":true}\n");
    fflush(stdout);
    static char buf[1 << 20];
    torus_event ev;
    uint64_t received = 0;
    for (;;) {
        int rc = torus_recv(c, &ev, buf, sizeof buf, 180000);
        if (rc != 1)
            return fail("no multicast");
        if (ev.kind == TORUS_EV_MCAST_DATA) {
            /* ev.key: where these bytes go; ev.count: the transfer's size. */
            if (fseek(f, (long)ev.key, SEEK_SET) != 0 || fwrite(buf, 1, ev.len, f) != ev.len)
                return fail("write the file");
            received += ev.len;
        } else if (ev.kind == TORUS_EV_MCAST_END) {
            fclose(f);
            int ok = ev.reason == 0 && received == ev.count;
            printf("{\"ok\":%s,\"size\":%llu,\"received\":%llu,\"root\":[%u,%u,%u]}\n",
                   ok ? "true" : "false", (unsigned long long)ev.count,
                   (unsigned long long)received, ev.from.x, ev.from.y, ev.from.z);
            torus_detach(c);
            return ok ? 0 : 1;
        }
    }
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "send") == 0)
        return send_file(argv[2], argv[3], argv[4], argc - 5, argv + 5);
    if (argc == 5 && strcmp(argv[1], "receive") == 0)
        return receive(argv[2], argv[3], argv[4]);
    fprintf(stderr, "usage: multicast send SOCKET SERVICE FILE [x,y,z ...] | "
                    "multicast receive SOCKET SERVICE OUTFILE\n");
    return 2;
}
