/* Echo in C over torusnet's application library.
 *
 *   echo server SOCKET NAME            echo every message and answer every request
 *   echo client SOCKET NAME COUNT      find NAME, send COUNT checked reliable messages and
 *                                      COUNT short ones, make a call; print one JSON line;
 *                                      exit 0 when every reliable echo came back intact
 *
 * Build: cc -O2 -I client/include echo.c -L target/release -ltorusnet_client
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#include "torusnet.h"

static void fill(unsigned char *b, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        b[i] = (unsigned char)x;
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int server(torus_client *c) {
    static unsigned char buf[1 << 20];
    torus_event ev;
    for (;;) {
        int r = torus_recv(c, &ev, buf, sizeof buf, 1000);
        if (r < 0 && r != TORUS_ETOOBIG) {
            fprintf(stderr, "echo server: %s\n", torus_last_error());
            return 1;
        }
        if (r != 1)
            continue;
        if (ev.kind == TORUS_EV_MESSAGE) {
            torus_dest d = {.kind = TORUS_DEST_SERVICE, .addr = ev.from};
            while (torus_send(c, &d, buf, ev.len, ev.reliable ? TORUS_RELIABLE : 0, NULL) == TORUS_EAGAIN)
                ;
        } else if (ev.kind == TORUS_EV_REQUEST) {
            while (torus_respond(c, ev.from, ev.tag, buf, ev.len) == TORUS_EAGAIN)
                ;
        }
    }
}

static int client(torus_client *c, const char *name, int count) {
    torus_addr at[8];
    int n = torus_resolve(c, name, at, 8, 2000);
    if (n <= 0) {
        fprintf(stderr, "echo client: %s not found: %s\n", name, n < 0 ? torus_last_error() : "no server");
        return 1;
    }
    torus_dest d = {.kind = TORUS_DEST_SERVICE, .addr = at[0]};
    static unsigned char out[70000], in[70000];
    torus_event ev;
    int ok = 0, bad = 0, short_back = 0;
    double t0 = now_us();
    for (int i = 0; i < count; i++) {
        size_t len = 16 + (size_t)(i * 7919) % 60000; /* 16 B .. 60 KB: many frames */
        fill(out, len, (uint64_t)i);
        memcpy(out, &i, sizeof i);
        if (torus_send(c, &d, out, len, TORUS_RELIABLE, NULL) != 0) {
            fprintf(stderr, "send: %s\n", torus_last_error());
            return 1;
        }
        for (;;) {
            int r = torus_recv(c, &ev, in, sizeof in, 3000);
            if (r == 0) { bad++; break; }
            if (r < 0) { fprintf(stderr, "recv: %s\n", torus_last_error()); return 1; }
            if (ev.kind != TORUS_EV_MESSAGE)
                continue;
            if (ev.len == len && memcmp(in, out, len) == 0) ok++;
            else bad++;
            break;
        }
    }
    double rtt = (now_us() - t0) / (count ? count : 1);
    for (int i = 0; i < count; i++) {
        fill(out, 64, (uint64_t)(1000000 + i));
        torus_send(c, &d, out, 64, 0, NULL);
        int r = torus_recv(c, &ev, in, sizeof in, 200);
        if (r == 1 && ev.kind == TORUS_EV_MESSAGE && ev.len == 64 && memcmp(in, out, 64) == 0)
            short_back++;
    }
    char resp[64];
    size_t rlen = 0;
    int call = torus_call(c, &d, "ping from C", 11, resp, sizeof resp, &rlen, 3000);
    int call_ok = call == 0 && rlen == 11 && memcmp(resp, "ping from C", 11) == 0;
    printf("{\"lang\":\"c\",\"server\":[%u,%u,%u],\"reliable_ok\":%d,\"reliable_bad\":%d,"
           "\"short_back\":%d,\"count\":%d,\"call_ok\":%s,\"rtt_us\":%.1f}\n",
           at[0].x, at[0].y, at[0].z, ok, bad, short_back, count, call_ok ? "true" : "false", rtt);
    return (ok == count && call_ok) ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s server SOCKET NAME | client SOCKET NAME COUNT\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1], *sock = argv[2], *name = argv[3];
    int is_server = strcmp(mode, "server") == 0;
    char me[300];
    snprintf(me, sizeof me, "%s-c-client-%d", name, (int)getpid());
    torus_client *c = torus_attach(sock, is_server ? name : me);
    if (!c) {
        fprintf(stderr, "attach: %s\n", torus_last_error());
        return 1;
    }
    int rc = is_server ? server(c) : client(c, name, argc > 4 ? atoi(argv[4]) : 10);
    torus_detach(c);
    return rc;
}
