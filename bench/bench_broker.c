/* bench_broker.c -- what the broker costs over the fair floor, measured side
 * by side in one run on loopback TCP.
 *
 * The floor is a bare forwarder (a child process): a ROUTER for clients and
 * a ROUTER for workers in one zmq_poll loop that moves frames and nothing
 * else (client -> worker: the worker's identity is put in front; worker ->
 * client: it is taken off). It is what any broker must at least do: two
 * hops, no decoding, no routing, no catalog. The same echo worker (a thread
 * here, decoding each REQUEST through schema/msg.h and answering RESULT at
 * once, the latent shared back when the request carried one) serves both,
 * and the same client sends both the same GEN (a 5x32 F32 context; the
 * reply's latent is 4x2x8x8 F32, or the 16 MiB latent sent with it).
 *
 * Each rep measures both, alternating which goes first: latency one
 * request at a time (p50, p99, and so requests per second at window 1),
 * requests per second with 8 and 32 in flight, and a 16 MiB latent both
 * ways (p50, and the minor page faults of the broker's or the forwarder's
 * process per request). The summary is the median of the reps for each
 * side and the median of the reps' ratios Reel / forwarder. Then Reel
 * alone under a stream of catalog events, and how many of the events
 * reached SQLite.
 * Usage: bench_broker [BUILD_DIR [REPS]]  (finds BUILD_DIR/reel-broker) */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "schema/msg.h"
#include "bench/bench.h"

#define DIE(...) do { fprintf(stderr, "bench_broker: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define REPS_MAX 9
#define N_LAT 3000
#define N_TPUT 20000
#define N_BIG 30

static void *ctx;
static volatile int stop_flag;
static volatile int event_rate; /* EVENTS messages per 10 ms from Reel's worker */
static volatile long events_sent;

/* ---- the echo worker ---------------------------------------------------------- */

typedef struct {
    char ep[64];
    bool enveloped; /* behind the forwarder: each message starts with the client's identity */
    bool events;    /* may flood EVENTS (Reel's) */
} worker_arg_t;

static void send_ready(void *s) {
    static const char models[1][MSG_NAME_MAX] = { "tiny" };
    msg_ready_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "fw");
    snprintf(r.device, sizeof r.device, "fake");
    snprintf(r.arch, sizeof r.arch, "none");
    r.streams = 1;
    r.max_inflight = 256;
    r.models = models;
    r.n_models = 1;
    r.versions.n = 1;
    snprintf(r.versions.e[0].name, sizeof r.versions.e[0].name, "transformer");
    r.versions.e[0].n = 1;
    msg_ready_send(s, NULL, 0, &r);
}

static void send_events(void *s) {
    static msg_event_t ev[16];
    for (int j = 0; j < 16; j++) {
        memset(&ev[j], 0, sizeof ev[j]);
        snprintf(ev[j].kind, sizeof ev[j].kind, "decline");
        snprintf(ev[j].reason, sizeof ev[j].reason, "warming_up");
        ev[j].key = "reel-key/1 bench";
        ev[j].key_hash = 0xaa;
        ev[j].count = 1;
    }
    msg_events_t e = { ev, 16, 0 };
    msg_events_send(s, NULL, 0, &e);
    events_sent += 16;
}

/* RESULT for a REQUEST (or, behind the forwarder, the client's GEN as is). */
static void echo(void *s, wire_msg_t *m, bool enveloped, const float *zeros) {
    msg_type_t type = msg_type(m);
    msg_gen_t g;
    wire_err_t err;
    if ((type != MSG_REQUEST && type != MSG_GEN) || msg_decode(m, type, &g, &err) != 0) return;
    msg_result_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.worker, sizeof r.worker, "fw");
    r.version = r.first_version = 1;
    r.stats.replayed = 1;
    wire_tensor_t t;
    memset(&t, 0, sizeof t);
    if (g.latent) {
        r.latent = g.latent; /* shared back, as a worker's own frame would be */
    } else {
        snprintf(t.name, sizeof t.name, "latent");
        t.dtype = KERN_F32;
        t.ndim = 4;
        t.bytes = 4;
        for (int d = 0; d < 4; d++) {
            t.shape[d] = g.latent_shape[d];
            t.bytes *= (size_t)g.latent_shape[d];
        }
        t.data = zeros;
        r.latent = &t;
    }
    msg_result_forward(s, enveloped ? &m->identity : NULL, m->id, &r, m);
}

static void *echo_worker(void *arg) {
    const worker_arg_t *a = arg;
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    wire_socket_limits(s);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, "fw", 2);
    zmq_connect(s, a->ep);
    send_ready(s);
    double last_hb = bench_now(), last_ev = bench_now();
    float *zeros = calloc(1 << 22, sizeof(float));
    wire_msg_t *m = malloc(sizeof *m);
    while (!stop_flag) {
        zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
        zmq_poll(&it, 1, 5);
        if (bench_now() - last_hb > 0.5) {
            msg_send(s, NULL, MSG_HEARTBEAT, 0, NULL, NULL);
            last_hb = bench_now();
        }
        if (a->events && event_rate && bench_now() - last_ev > 0.01) {
            for (int k = 0; k < event_rate; k++) send_events(s);
            last_ev = bench_now();
        }
        for (;;) {
            wire_err_t err;
            int rc = msg_recv(s, a->enveloped, ZMQ_DONTWAIT, m, &err);
            if (rc < 0) break;
            if (rc == 0) echo(s, m, a->enveloped, zeros);
            wire_msg_close(m);
        }
    }
    free(m);
    free(zeros);
    zmq_close(s);
    return NULL;
}

/* ---- the floor: a bare two-hop forwarder (its own process) ------------------------ */

/* Moves the rest of a multipart message from `from` to `to`. */
static void copy_rest(void *from, void *to) {
    int more = 1;
    while (more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, from, 0) < 0) {
            zmq_msg_close(&f);
            return;
        }
        more = zmq_msg_more(&f);
        if (zmq_msg_send(&f, to, more ? ZMQ_SNDMORE : 0) < 0) zmq_msg_close(&f);
    }
}

static void forwarder(const char *cep, const char *wep) {
    void *fctx = zmq_ctx_new();
    void *c = zmq_socket(fctx, ZMQ_ROUTER), *w = zmq_socket(fctx, ZMQ_ROUTER);
    wire_socket_limits(c);
    wire_socket_limits(w);
    if (zmq_bind(c, cep) || zmq_bind(w, wep)) _exit(1);
    zmq_msg_t wid; /* the worker's identity, from its last message */
    zmq_msg_init(&wid);
    for (;;) {
        zmq_pollitem_t it[2] = { { c, 0, ZMQ_POLLIN, 0 }, { w, 0, ZMQ_POLLIN, 0 } };
        if (zmq_poll(it, 2, -1) < 0) continue;
        for (int k = 0; k < 256 && (it[1].revents & ZMQ_POLLIN); k++) {
            zmq_msg_t id;
            zmq_msg_init(&id);
            if (zmq_msg_recv(&id, w, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&id);
                break;
            }
            zmq_msg_close(&wid);
            zmq_msg_init(&wid);
            zmq_msg_move(&wid, &id);
            copy_rest(w, c); /* [client identity, header, tensors]; READY and HEARTBEAT fall on no client */
        }
        for (int k = 0; k < 256 && (it[0].revents & ZMQ_POLLIN); k++) {
            zmq_msg_t id, to;
            zmq_msg_init(&id);
            if (zmq_msg_recv(&id, c, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&id);
                break;
            }
            zmq_msg_init(&to);
            zmq_msg_copy(&to, &wid);
            zmq_msg_send(&to, w, ZMQ_SNDMORE);
            zmq_msg_send(&id, w, ZMQ_SNDMORE);
            copy_rest(c, w);
        }
    }
}

/* ---- the client --------------------------------------------------------------------- */

typedef struct {
    const char *name;
    pid_t pid;     /* the broker's or forwarder's process */
    void *sock;    /* the client's DEALER to it */
} target_t;

static const float ctxv[160];

static void send_gen(void *s, uint64_t id, const int64_t ls[4], const float *lat) {
    wire_tensor_t t[2];
    memset(t, 0, sizeof t);
    snprintf(t[0].name, sizeof t[0].name, "context");
    t[0].dtype = KERN_F32;
    t[0].ndim = 2;
    t[0].shape[0] = 5;
    t[0].shape[1] = 32;
    t[0].data = ctxv;
    t[0].bytes = sizeof ctxv;
    msg_gen_t g;
    memset(&g, 0, sizeof g);
    snprintf(g.model, sizeof g.model, "tiny");
    g.steps = 1;
    g.shift = g.cfg = 1;
    g.seed = id;
    memcpy(g.latent_shape, ls, sizeof g.latent_shape);
    g.context = &t[0];
    if (lat) {
        snprintf(t[1].name, sizeof t[1].name, "latent");
        t[1].dtype = KERN_F32;
        t[1].ndim = 4;
        memcpy(t[1].shape, ls, 4 * sizeof *ls);
        t[1].data = lat;
        t[1].bytes = (size_t)(ls[0] * ls[1] * ls[2] * ls[3]) * 4;
        g.latent = &t[1];
    }
    if (msg_gen_send(s, NULL, id, &g) != 0) DIE("send failed");
}

/* Waits for the answer to id (answers to others are skipped). */
static void await(void *s, uint64_t id) {
    static wire_msg_t m;
    for (;;) {
        wire_err_t err;
        int rc = msg_recv(s, false, 0, &m, &err);
        if (rc != 0) DIE("recv failed (%d %s)", rc, rc == 1 ? err.message : "");
        bool mine = m.id == id, result = msg_type(&m) == MSG_RESULT;
        wire_msg_close(&m);
        if (mine && !result) DIE("answer to %llu is not a RESULT", (unsigned long long)id);
        if (mine) return;
    }
}

/* Minor page faults of process pid so far. */
static long minflt(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    long v = -1;
    /* after "(comm)": state ppid pgrp session tty tpgid flags minflt */
    if (p && sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %ld", &v) != 1) v = -1;
    return v;
}

typedef struct {
    double p50, p99, rate; /* window 1 */
} lat_t;

/* n round trips one at a time; faults (when not NULL) gets each one's
 * minor page faults in the target's process. */
static lat_t latency(const target_t *x, int n, const int64_t ls[4], const float *lat, double *faults) {
    double *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < 10; i++) {
        send_gen(x->sock, 1000000 + (uint64_t)i, ls, lat);
        await(x->sock, 1000000 + (uint64_t)i);
    }
    double t0 = bench_now();
    for (int i = 0; i < n; i++) {
        long f0 = faults ? minflt(x->pid) : 0;
        double s = bench_now();
        send_gen(x->sock, (uint64_t)i + 1, ls, lat);
        await(x->sock, (uint64_t)i + 1);
        t[i] = bench_now() - s;
        if (faults) faults[i] = (double)(minflt(x->pid) - f0);
    }
    lat_t r = { 0, 0, n / (bench_now() - t0) };
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    r.p50 = t[n / 2];
    r.p99 = t[n * 99 / 100];
    free(t);
    return r;
}

/* CPU seconds the threads of process pid used so far (schedstat, ns), in
 * all and by thread name (comm: the broker's main thread, its catalog
 * writer, ZeroMQ's I/O thread, ...), up to CPU_NAMES names. */
#define CPU_NAMES 6
typedef struct {
    double total;
    int n;
    char name[CPU_NAMES][20];
    double s[CPU_NAMES];
} cpu_t;

static cpu_t cpu_seconds(pid_t pid) {
    cpu_t c;
    memset(&c, 0, sizeof c);
    char path[300];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) return c;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/%d/task/%.64s/schedstat", (int)pid, e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long ns;
        if (!f || fscanf(f, "%llu", &ns) != 1) {
            if (f) fclose(f);
            continue;
        }
        fclose(f);
        c.total += (double)ns * 1e-9;
        char comm[20] = "?";
        snprintf(path, sizeof path, "/proc/%d/task/%.64s/comm", (int)pid, e->d_name);
        if ((f = fopen(path, "r"))) {
            if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
            fclose(f);
        }
        int k = 0;
        while (k < c.n && strcmp(c.name[k], comm)) k++;
        if (k == c.n && c.n < CPU_NAMES) snprintf(c.name[c.n++], sizeof c.name[0], "%s", comm);
        if (k < c.n) c.s[k] += (double)ns * 1e-9;
    }
    closedir(d);
    return c;
}

/* after - before per request, by name, into out ("" when pid had one thread). */
static void cpu_split(const cpu_t *before, const cpu_t *after, int n, char *out, size_t cap) {
    out[0] = 0;
    if (after->n < 2) return;
    size_t at = 0;
    for (int k = 0; k < after->n && at < cap; k++) {
        double was = 0;
        for (int j = 0; j < before->n; j++)
            if (!strcmp(before->name[j], after->name[k])) was = before->s[j];
        at += (size_t)snprintf(out + at, cap - at, "%s%s %.1f", k ? ", " : "", after->name[k],
                               (after->s[k] - was) / n * 1e6);
    }
}

/* Requests per second with `window` requests in flight; *cpu (when not
 * NULL) gets the target process's CPU time per request. */
static double throughput(const target_t *x, int n, int window, const int64_t ls[4], double *cpu, char *split,
                         size_t split_cap) {
    static wire_msg_t m;
    int sent = 0, got = 0;
    cpu_t c0 = cpu ? cpu_seconds(x->pid) : (cpu_t){ 0 };
    double t0 = bench_now();
    while (got < n) {
        while (sent < n && sent - got < window) send_gen(x->sock, 5000000 + (uint64_t)sent++, ls, NULL);
        wire_err_t err;
        if (msg_recv(x->sock, false, 0, &m, &err) == 0) {
            if (msg_type(&m) != MSG_RESULT) DIE("%s: answer %s in the window-%d run", x->name, m.type, window);
            got++;
        }
        wire_msg_close(&m);
    }
    double rate = n / (bench_now() - t0);
    if (cpu) {
        cpu_t c1 = cpu_seconds(x->pid);
        *cpu = (c1.total - c0.total) / n;
        if (split) cpu_split(&c0, &c1, n, split, split_cap);
    }
    return rate;
}

/* One rep's numbers for one target. */
typedef struct {
    double p50, p99, w1, w8, w32, cpu32, big, big_faults, big_faults_max;
    char cpu32_split[160]; /* cpu32 by thread name, us */
} rep_t;

static const int64_t SMALL[4] = { 4, 2, 8, 8 }, BIG[4] = { 16, 16, 128, 128 }; /* 16 MiB */

static rep_t measure(const target_t *x, const float *lat) {
    rep_t r;
    lat_t l = latency(x, N_LAT, SMALL, NULL, NULL);
    r.p50 = l.p50;
    r.p99 = l.p99;
    r.w1 = l.rate;
    r.w8 = throughput(x, N_TPUT, 8, SMALL, NULL, NULL, 0);
    r.w32 = throughput(x, N_TPUT, 32, SMALL, &r.cpu32, r.cpu32_split, sizeof r.cpu32_split);
    double faults[N_BIG];
    r.big = latency(x, N_BIG, BIG, lat, faults).p50;
    r.big_faults = bench_median(faults, N_BIG);
    r.big_faults_max = faults[N_BIG - 1]; /* sorted by bench_median() */
    printf("  %-9s p50 %7.1f us  p99 %7.1f us  w1 %6.0f  w8 %6.0f  w32 %6.0f req/s (%.1f us CPU/req)  16 MiB %6.2f ms"
           " (faults/req median %.0f, max %.0f)\n",
           x->name, r.p50 * 1e6, r.p99 * 1e6, r.w1, r.w8, r.w32, r.cpu32 * 1e6, r.big * 1e3, r.big_faults, r.big_faults_max);
    if (r.cpu32_split[0]) printf("            CPU/req at window 32 by thread (us): %s\n", r.cpu32_split);
    fflush(stdout);
    return r;
}

/* ---- main ---------------------------------------------------------------------------- */

/* The median of each side over the reps, and the median of the per-rep
 * ratios: a rep measures both sides back to back, so its ratio is paired
 * and a machine busy with other work for a while moves both sides of it
 * together. */
static void summary(rep_t reel[], rep_t fwd[], int reps) {
    static const struct { const char *what, *unit; size_t off; double scale; bool ratio, rate; } rows[] = {
        { "p50, one at a time", "us", offsetof(rep_t, p50), 1e6, true, false },
        { "p99, one at a time", "us", offsetof(rep_t, p99), 1e6, true, false },
        { "throughput, window 1", "req/s", offsetof(rep_t, w1), 1, true, true },
        { "throughput, window 8", "req/s", offsetof(rep_t, w8), 1, true, true },
        { "throughput, window 32", "req/s", offsetof(rep_t, w32), 1, true, true },
        { "16 MiB latent both ways, p50", "ms", offsetof(rep_t, big), 1e3, true, false },
        { "CPU per request at window 32", "us", offsetof(rep_t, cpu32), 1e6, true, false },
        { "16 MiB: page faults per request, median", "", offsetof(rep_t, big_faults), 1, false, false },
        { "16 MiB: page faults per request, max", "", offsetof(rep_t, big_faults_max), 1, false, false },
    };
    printf("\nmedians of %d reps                    %12s %12s   Reel/forwarder (median of the reps' ratios)\n",
           reps, "Reel", "forwarder");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double a[REPS_MAX], b[REPS_MAX], q[REPS_MAX];
        for (int k = 0; k < reps; k++) {
            a[k] = *(double *)((char *)&reel[k] + rows[i].off) * rows[i].scale;
            b[k] = *(double *)((char *)&fwd[k] + rows[i].off) * rows[i].scale;
            q[k] = b[k] > 0 ? a[k] / b[k] : 0;
        }
        printf("%-40s %9.1f %-5s %9.1f %-5s", rows[i].what, bench_median(a, reps), rows[i].unit, bench_median(b, reps),
               rows[i].unit);
        if (rows[i].ratio) printf("  %.2fx%s", bench_median(q, reps), rows[i].rate ? " (higher is better)" : "");
        printf("\n");
    }
}

/* Reel alone: p50 with and without a stream of EVENTS for the catalog. */
static void event_load(const target_t *reel) {
    double quiet = latency(reel, 1000, SMALL, NULL, NULL).p50;
    event_rate = 10; /* 10 x 16 events per 10 ms */
    long e0 = events_sent;
    double t0 = bench_now();
    double loaded = latency(reel, 1000, SMALL, NULL, NULL).p50;
    double te = bench_now() - t0;
    event_rate = 0;
    printf("\n%-40s %.0f events/s offered; p50 %.1f us vs %.1f us quiet (%.2fx)\n", "catalog event load",
           (events_sent - e0) / te, loaded * 1e6, quiet * 1e6, loaded / quiet);
}

static long catalog_events(const char *db) {
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
    return rows;
}

static void *client_socket(const char *ep) {
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    wire_socket_limits(s);
    zmq_connect(s, ep);
    return s;
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (reps < 1 || reps > REPS_MAX) DIE("reps must be 1..%d", REPS_MAX);
    char broker[256], dir[] = "/tmp/reel-bench-brk.XXXXXX", db[300];
    char cep[64], wep[64], fcep[64], fwep[64];
    snprintf(broker, sizeof broker, "%s/reel-broker", build);
    if (access(broker, X_OK) != 0) DIE("%s not built", broker);
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(db, sizeof db, "%s/bench.db", dir);
    int port = 30000 + getpid() % 20000;
    snprintf(cep, sizeof cep, "tcp://127.0.0.1:%d", port);
    snprintf(wep, sizeof wep, "tcp://127.0.0.1:%d", port + 1);
    snprintf(fcep, sizeof fcep, "tcp://127.0.0.1:%d", port + 2);
    snprintf(fwep, sizeof fwep, "tcp://127.0.0.1:%d", port + 3);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(127);
        execl(broker, broker, "--clients", cep, "--workers", wep, "--catalog", db, "--queue-max", "1024",
              (char *)NULL);
        _exit(127);
    }
    pid_t fpid = fork();
    if (fpid == 0) {
        forwarder(fcep, fwep);
        _exit(0);
    }
    ctx = zmq_ctx_new();
    usleep(300000);
    worker_arg_t wa[2] = { { "", false, true }, { "", true, false } };
    snprintf(wa[0].ep, sizeof wa[0].ep, "%s", wep);
    snprintf(wa[1].ep, sizeof wa[1].ep, "%s", fwep);
    pthread_t fw[2];
    for (int i = 0; i < 2; i++) pthread_create(&fw[i], NULL, echo_worker, &wa[i]);
    usleep(500000);
    target_t reel = { "Reel", pid, client_socket(cep) }, fwd = { "forwarder", fpid, client_socket(fcep) };
    float *lat = calloc((size_t)(16 * 16 * 128 * 128), sizeof(float));
    rep_t r[REPS_MAX], f[REPS_MAX];
    printf("bench_broker: %s vs a bare two-hop forwarder, %d reps (each alternates which goes first)\n", broker,
           reps);
    for (int k = 0; k < reps; k++) {
        printf("rep %d\n", k + 1);
        if (k % 2 == 0) {
            r[k] = measure(&reel, lat);
            f[k] = measure(&fwd, lat);
        } else {
            f[k] = measure(&fwd, lat);
            r[k] = measure(&reel, lat);
        }
    }
    summary(r, f, reps);
    event_load(&reel);
    stop_flag = 1;
    for (int i = 0; i < 2; i++) pthread_join(fw[i], NULL);
    zmq_close(reel.sock);
    zmq_close(fwd.sock);
    kill(fpid, SIGKILL);
    kill(pid, SIGTERM);
    int st;
    waitpid(fpid, &st, 0);
    waitpid(pid, &st, 0);
    printf("%-40s %ld of %ld events offered reached the catalog\n", "catalog after shutdown", catalog_events(db),
           (long)events_sent);
    zmq_ctx_term(ctx);
    free(lat);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) != 0;
}
