/* An on-path service in C (CamCube's per-hop API): intercepts its service on its server and
 * acts on each frame passing through by what it carries: "pass:..." goes on as it was,
 * "change:..." goes on as "changed:...", "drop:..." goes no further, "get:K" is answered
 * ("answer:K" to the sender) and dropped, anything else gets no verdict (it goes on as it
 * was at the deadline).
 *
 *   on_path SOCKET NAME SECONDS     intercepts for that long, prints one JSON line
 *
 * Build: cc -O2 -I client/include on_path.c -L target/release -ltorusnet_client
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "torusnet.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int starts(const unsigned char *b, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && memcmp(b, p, k) == 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: on_path SOCKET NAME SECONDS\n");
        return 2;
    }
    torus_client *c = torus_attach(argv[1], argv[2]);
    if (!c || torus_intercept(c, 1) != 0) {
        fprintf(stderr, "on_path: %s\n", torus_last_error());
        return 1;
    }
    printf("{\"intercepting\":true}\n");
    fflush(stdout);
    static unsigned char buf[65536], out[65600];
    int passed = 0, changed = 0, dropped = 0, answered = 0, left = 0;
    double until = now_s() + atof(argv[3]);
    torus_event ev;
    while (now_s() < until) {
        int r = torus_recv(c, &ev, buf, sizeof buf, 100);
        if (r != 1 || ev.kind != TORUS_EV_INTERCEPTED)
            continue;
        if (starts(buf, ev.len, "pass:")) {
            torus_verdict(c, ev.tag, TORUS_PASS, NULL, 0);
            passed++;
        } else if (starts(buf, ev.len, "change:")) {
            size_t n = ev.len - 7;
            memcpy(out, "changed:", 8);
            memcpy(out + 8, buf + 7, n);
            torus_verdict(c, ev.tag, TORUS_CHANGE, out, 8 + n);
            changed++;
        } else if (starts(buf, ev.len, "drop:")) {
            torus_verdict(c, ev.tag, TORUS_DROP, NULL, 0);
            dropped++;
        } else if (starts(buf, ev.len, "get:")) {
            size_t n = ev.len - 4;
            memcpy(out, "answer:", 7);
            memcpy(out + 7, buf + 4, n);
            torus_dest d = {.kind = TORUS_DEST_SERVICE, .addr = ev.from};
            torus_send(c, &d, out, 7 + n, 0, NULL);
            torus_verdict(c, ev.tag, TORUS_DROP, NULL, 0);
            answered++;
        } else {
            left++;
        }
    }
    printf("{\"passed\":%d,\"changed\":%d,\"dropped\":%d,\"answered\":%d,\"left\":%d}\n", passed,
           changed, dropped, answered, left);
    torus_detach(c);
    return 0;
}
