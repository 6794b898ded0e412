/* bench_broker.c -- the serving fabric's overhead, from one run on loopback:
 * round-trip latency p50/p99 of a small request through a real reel-broker
 * (to an in-process worker that answers at once) vs a direct DEALER/ROUTER
 * echo (the floor); requests per second for both; a 16 MiB latent through
 * the broker vs a direct send; routing latency with and without a stream of
 * catalog events, and the events per second the catalog absorbed.
 * Usage: bench_broker [BUILD_DIR]  (finds BUILD_DIR/reel-broker) */
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "schema/wire.h"

#define DIE(...) do { fprintf(stderr, "bench_broker: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *ctx;
static char wep[64], cep[64], echo_ep[64];
static volatile int stop_flag;
static volatile int event_rate; /* EVENTS messages per 10 ms from the fake worker */
static volatile long events_sent;

/* A worker that answers every REQUEST at once, echoing the latent (or a
 * zero latent of latent_shape), and optionally floods EVENTS. */
static void *fake_worker(void *arg) {
    (void)arg;
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    wire_socket_limits(s);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, "fw", 2);
    zmq_connect(s, wep);
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *vers = wv_map();
    wv_push(models, wv_str("tiny"));
    wv_set(vers, "transformer", wv_u64(1));
    wv_set(h, "name", wv_str("fw"));
    wv_set(h, "device", wv_str("fake"));
    wv_set(h, "arch", wv_str("none"));
    wv_set(h, "streams", wv_u64(1));
    wv_set(h, "budget", wv_u64(0));
    wv_set(h, "max_inflight", wv_u64(256));
    wv_set(h, "models", models);
    wv_set(h, "versions", vers);
    wire_send(s, NULL, h, NULL, 0);
    wv_free(&h);
    double last_hb = now(), last_ev = now();
    float *zeros = calloc(1 << 22, sizeof(float));
    while (!stop_flag) {
        zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
        zmq_poll(&it, 1, 5);
        if (now() - last_hb > 0.5) {
            wire_val_t *hb = wire_hdr("HEARTBEAT", 0);
            wire_send(s, NULL, hb, NULL, 0);
            wv_free(&hb);
            last_hb = now();
        }
        if (event_rate && now() - last_ev > 0.01) {
            for (int k = 0; k < event_rate; k++) {
                wire_val_t *e = wire_hdr("EVENTS", 0), *arr = wv_arr();
                for (int j = 0; j < 16; j++) {
                    wire_val_t *ev = wv_map();
                    wv_set(ev, "kind", wv_str("decline"));
                    wv_set(ev, "reason", wv_str("warming_up"));
                    wv_set(ev, "key", wv_str("reel-key/1 bench"));
                    wv_set(ev, "key_hash", wv_str("00000000000000aa"));
                    wv_set(ev, "stream", wv_u64(0));
                    wv_set(ev, "count", wv_u64(1));
                    wv_push(arr, ev);
                }
                wv_set(e, "events", arr);
                wire_send(s, NULL, e, NULL, 0);
                wv_free(&e);
                events_sent += 16;
            }
            last_ev = now();
        }
        if (!(it.revents & ZMQ_POLLIN)) continue;
        wire_msg_t m;
        wire_err_t err;
        int rc = wire_recv(s, false, ZMQ_DONTWAIT, &m, &err);
        if (rc != 0) {
            if (rc == 1) wire_msg_close(&m);
            continue;
        }
        if (!strcmp(m.type, "REQUEST")) {
            wire_val_t *r = wire_hdr("RESULT", m.id), *st = wv_map();
            wv_set(r, "worker", wv_str("fw"));
            wv_set(r, "version", wv_u64(1));
            wv_set(st, "captured", wv_u64(0));
            wv_set(st, "replayed", wv_u64(1));
            wv_set(st, "eager", wv_u64(0));
            wv_set(st, "seconds", wv_f64(0));
            wv_set(r, "stats", st);
            wv_set(r, "key_hash", wv_str("0"));
            wire_tensor_t t;
            const wire_tensor_t *in = wire_msg_tensor(&m, "latent");
            memset(&t, 0, sizeof t);
            snprintf(t.name, sizeof t.name, "latent");
            t.dtype = KERN_F32;
            t.ndim = 4;
            const wire_val_t *ls = wv_get(m.hdr, "latent_shape");
            size_t n = 1;
            for (int d = 0; d < 4; d++) {
                uint64_t x = 1;
                wv_as_u64(wv_at(ls, (size_t)d), &x);
                t.shape[d] = (int64_t)x;
                n *= x;
            }
            t.data = in ? in->data : zeros;
            t.bytes = n * 4;
            wire_send(s, NULL, r, &t, 1);
            wv_free(&r);
        }
        wire_msg_close(&m);
    }
    free(zeros);
    zmq_close(s);
    return NULL;
}

/* The floor: a ROUTER that echoes whole messages back. */
static void *echo_server(void *arg) {
    (void)arg;
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    wire_socket_limits(s);
    zmq_bind(s, echo_ep);
    while (!stop_flag) {
        zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&it, 1, 20) <= 0) continue;
        int more = 1;
        while (more) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, s, 0) < 0) { zmq_msg_close(&f); break; }
            more = zmq_msg_more(&f);
            zmq_msg_send(&f, s, more ? ZMQ_SNDMORE : 0);
        }
    }
    zmq_close(s);
    return NULL;
}

static wire_val_t *gen_hdr(uint64_t id, const int64_t ls[4]) {
    wire_val_t *h = wire_hdr("GEN", id), *a = wv_arr();
    for (int i = 0; i < 4; i++) wv_push(a, wv_u64((uint64_t)ls[i]));
    wv_set(h, "model", wv_str("tiny"));
    wv_set(h, "version", wv_u64(0));
    wv_set(h, "steps", wv_u64(1));
    wv_set(h, "shift", wv_f64(1));
    wv_set(h, "cfg", wv_f64(1));
    wv_set(h, "sde", wv_bool(false));
    wv_set(h, "eta", wv_f64(0));
    wv_set(h, "seed", wv_u64(id));
    wv_set(h, "latent_shape", a);
    wv_set(h, "progress", wv_bool(false));
    wv_set(h, "deadline_ms", wv_u64(0));
    return h;
}

/* Sends one GEN (or an echo of the same frames) and waits for the answer. */
static double roundtrip(void *s, uint64_t id, const int64_t ls[4], const float *ctxv, const float *lat) {
    wire_val_t *h = gen_hdr(id, ls);
    wire_tensor_t t[2];
    memset(t, 0, sizeof t);
    snprintf(t[0].name, sizeof t[0].name, "context");
    t[0].dtype = KERN_F32;
    t[0].ndim = 2;
    t[0].shape[0] = 5;
    t[0].shape[1] = 32;
    t[0].data = ctxv;
    t[0].bytes = 5 * 32 * 4;
    int n = 1;
    if (lat) {
        snprintf(t[1].name, sizeof t[1].name, "latent");
        t[1].dtype = KERN_F32;
        t[1].ndim = 4;
        memcpy(t[1].shape, ls, 4 * sizeof *ls);
        t[1].data = lat;
        t[1].bytes = (size_t)(ls[0] * ls[1] * ls[2] * ls[3]) * 4;
        n = 2;
    }
    double t0 = now();
    if (wire_send(s, NULL, h, t, n) != 0) DIE("send failed");
    wv_free(&h);
    for (;;) {
        wire_msg_t m;
        wire_err_t err;
        int rc = wire_recv(s, false, 0, &m, &err);
        if (rc != 0) DIE("recv failed (%d %s)", rc, rc == 1 ? err.message : "");
        int mine = m.id == id;
        if (mine && strcmp(m.type, "RESULT") && strcmp(m.type, "GEN")) DIE("answer %s", m.type);
        wire_msg_close(&m);
        if (mine) break;
    }
    return now() - t0;
}

static void latency(const char *what, void *s, int n, const int64_t ls[4], const float *c, const float *lat,
                    double *p50_out) {
    double *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < 20; i++) roundtrip(s, 1000000 + (uint64_t)i, ls, c, lat);
    double t0 = now();
    for (int i = 0; i < n; i++) t[i] = roundtrip(s, (uint64_t)i + 1, ls, c, lat);
    double total = now() - t0;
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    printf("%-44s p50 %8.1f us  p99 %8.1f us  %8.0f req/s (one at a time)\n", what, t[n / 2] * 1e6,
           t[n * 99 / 100] * 1e6, n / total);
    if (p50_out) *p50_out = t[n / 2];
    free(t);
}

/* Pipelined throughput: keep `window` requests outstanding. */
static void throughput(const char *what, void *s, int n, int window, const int64_t ls[4], const float *c) {
    int sent = 0, got = 0;
    double t0 = now();
    while (got < n) {
        while (sent < n && sent - got < window) {
            wire_val_t *h = gen_hdr((uint64_t)sent + 5000000, ls);
            wire_tensor_t t;
            memset(&t, 0, sizeof t);
            snprintf(t.name, sizeof t.name, "context");
            t.dtype = KERN_F32;
            t.ndim = 2;
            t.shape[0] = 5;
            t.shape[1] = 32;
            t.data = c;
            t.bytes = 640;
            wire_send(s, NULL, h, &t, 1);
            wv_free(&h);
            sent++;
        }
        wire_msg_t m;
        wire_err_t err;
        if (wire_recv(s, false, 0, &m, &err) == 0) got++;
        wire_msg_close(&m);
    }
    printf("%-44s %8.0f req/s (window %d)\n", what, n / (now() - t0), window);
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    char broker[256], dir[] = "/tmp/reel-bench-brk.XXXXXX", db[300];
    snprintf(broker, sizeof broker, "%s/reel-broker", build);
    if (access(broker, X_OK) != 0) DIE("%s not built", broker);
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(db, sizeof db, "%s/bench.db", dir);
    int port = 30000 + getpid() % 20000;
    snprintf(cep, sizeof cep, "tcp://127.0.0.1:%d", port);
    snprintf(wep, sizeof wep, "tcp://127.0.0.1:%d", port + 1);
    snprintf(echo_ep, sizeof echo_ep, "tcp://127.0.0.1:%d", port + 2);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        execl(broker, broker, "--clients", cep, "--workers", wep, "--catalog", db, "--queue-max", "1024",
              (char *)NULL);
        _exit(127);
    }
    ctx = zmq_ctx_new();
    pthread_t fw, es;
    pthread_create(&es, NULL, echo_server, NULL);
    usleep(300000);
    pthread_create(&fw, NULL, fake_worker, NULL);
    usleep(500000);
    void *cb = zmq_socket(ctx, ZMQ_DEALER), *ce = zmq_socket(ctx, ZMQ_DEALER);
    wire_socket_limits(cb);
    wire_socket_limits(ce);
    zmq_connect(cb, cep);
    zmq_connect(ce, echo_ep);
    float c[160] = { 0 };
    const int64_t small[4] = { 4, 2, 8, 8 }, big[4] = { 16, 16, 128, 128 }; /* 16 MiB */
    float *lat = calloc((size_t)(16 * 16 * 128 * 128), sizeof(float));
    double p_brk, p_echo, p_quiet, p_loaded;
    latency("small request via broker", cb, 2000, small, c, NULL, &p_brk);
    latency("small request, direct DEALER/ROUTER echo", ce, 2000, small, c, NULL, &p_echo);
    printf("%-44s %.2fx the direct echo\n", "broker p50 latency", p_brk / p_echo);
    throughput("throughput via broker", cb, 5000, 32, small, c);
    throughput("throughput, direct echo", ce, 5000, 32, small, c);
    latency("16 MiB latent via broker (both ways)", cb, 40, big, c, lat, &p_brk);
    latency("16 MiB latent, direct echo (both ways)", ce, 40, big, c, lat, &p_echo);
    printf("%-44s %.2fx the direct send\n", "16 MiB through the broker", p_brk / p_echo);
    latency("small via broker, no event load", cb, 1000, small, c, NULL, &p_quiet);
    event_rate = 10; /* 10 x 16 events per 10 ms */
    long e0 = events_sent;
    double t0 = now();
    latency("small via broker, under event load", cb, 1000, small, c, NULL, &p_loaded);
    double te = now() - t0;
    event_rate = 0;
    long sent = events_sent - e0;
    printf("%-44s %.0f events/s offered; p50 %.2fx the quiet p50\n", "catalog event load", sent / te,
           p_loaded / p_quiet);
    stop_flag = 1;
    pthread_join(fw, NULL);
    pthread_join(es, NULL);
    zmq_close(cb);
    zmq_close(ce);
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    sqlite3 *sq;
    long rows = -1;
    if (sqlite3_open_v2(db, &sq, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_stmt *q;
        if (sqlite3_prepare_v2(sq, "select coalesce(sum(count),0) from declines", -1, &q, NULL) == SQLITE_OK &&
            sqlite3_step(q) == SQLITE_ROW)
            rows = sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
        sqlite3_close(sq);
    }
    printf("%-44s %ld of %ld events offered reached the catalog\n", "catalog after shutdown", rows,
           (long)events_sent);
    zmq_ctx_term(ctx);
    free(lat);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) != 0;
}
