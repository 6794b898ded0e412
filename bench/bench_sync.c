/* bench_sync.c -- weights by value (docs/PROTOCOL.md, "Weights by value"),
 * against its floor, measured side by side in one run on loopback TCP.
 *
 * Reel: a reel-broker with --weights-dir and two reel-workers (the small
 * config, 100 MB of F32 weights; each worker's weights directory holds only
 * its starting file), and a trainer here that publishes a new version by
 * value: reel_publish (reelctl sync --upload: the SYNC goes with the first
 * chunk, the workers fetch while the rest still comes). Timed from the
 * trainer's first byte to SYNC_DONE, which the broker sends once both
 * workers fetched the file, checked its sha256, loaded it and acked. For
 * the small config each rep also times the stages one after the other
 * (reel_upload, then reel_sync), as before reel_publish.
 * The floor: the same file's bytes copied once over loopback by a plain
 * ZeroMQ DEALER to a ROUTER (4 MiB messages, the receiver acking the
 * last), read from the file as the trainer reads it. Each rep times both,
 * alternating which goes first; the summary is the median of the reps.
 * Usage: bench_sync [BUILD_DIR [REPS [CONFIG]]]  (finds reel-broker,
 * reel-worker, reelctl in BUILD_DIR; CONFIG small by default,
 * wan2.1-1.3b (a 5.7 GB F32 file, each worker holding the model and,
 * while it fetches, the file: needs about 23 GB of memory and 7 x the file
 * on disk; the worker copies are hard links), or a JSON config file as
 * `reelctl weights init --config` takes (e.g. wan2.1-1.3b's widths with
 * 6 layers: a 1.2 GB file). Each version's file is written just before
 * its sync and removed after it. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "base/error.h"
#include "clients/c/client.h"
#include "base/sha256.h"
#include "bench/bench.h"
#include "bench/bench_proc.h"

#define DIE(...) do { fprintf(stderr, "bench_sync: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define REPS_MAX 9
#define WARMUP 4   /* syncs before the timed ones (a trainer's steady state: with --weights-keep 2
                      * the 4th upload is the first to write over a removed one) */
#define CHUNK ((size_t)4 << 20)


/* CPU seconds (user + system) a process used so far, from /proc; or
 * its main thread's (the broker's routing thread) with thread set. */
static double cpu_of(pid_t pid, bool thread) {
    char path[64], buf[1024];
    if (thread) snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, (int)pid);
    else snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double cpu_s(pid_t pid) { return cpu_of(pid, false); }

/* ---- the floor: one copy over loopback ------------------------------------------ */

typedef struct {
    void *ctx;
    char ep[64];
    size_t size;
} floor_arg_t;

static void *floor_receiver(void *arg) {
    floor_arg_t *a = arg;
    void *r = zmq_socket(a->ctx, ZMQ_ROUTER);
    int lin = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &lin, sizeof lin);
    zmq_bind(r, a->ep);
    size_t got = 0;
    while (got < a->size) {
        zmq_msg_t id, m;
        zmq_msg_init(&id);
        zmq_msg_init(&m);
        if (zmq_msg_recv(&id, r, 0) < 0 || zmq_msg_recv(&m, r, 0) < 0) break;
        got += zmq_msg_size(&m);
        if (got >= a->size) {
            zmq_msg_send(&id, r, ZMQ_SNDMORE);
            zmq_send(r, "done", 4, 0);
        } else {
            zmq_msg_close(&id);
        }
        zmq_msg_close(&m);
    }
    zmq_close(r);
    return NULL;
}

/* Lets the machine settle before a timed part: the dirty pages a sync
 * left (the broker's stored file) are written back now, not during the
 * next measurement (on this project's VMs that writeback slowed the floor
 * copy after it 5x), and not for free after the by-value timing either. */
static void settle(void) {
    sync();
    usleep(200000);
}

/* Seconds to copy the file at path once over loopback, read as the trainer
 * reads it; *cpu (if not NULL) the CPU seconds the copy took, both ends
 * and their ZeroMQ threads (all in this process). */
static double floor_copy(void *ctx, const char *path, int port, double *cpu) {
    settle();
    double c0 = cpu_s(getpid());
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fstat(fd, &st) != 0) DIE("%s: cannot read", path);
    floor_arg_t a = { ctx, "", (size_t)st.st_size };
    snprintf(a.ep, sizeof a.ep, "tcp://127.0.0.1:%d", port);
    pthread_t th;
    pthread_create(&th, NULL, floor_receiver, &a);
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int lin = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &lin, sizeof lin);
    zmq_connect(d, a.ep);
    usleep(100000);
    char *buf = malloc(CHUNK);
    double t0 = bench_now();
    for (size_t off = 0; off < a.size; off += CHUNK) {
        size_t n = a.size - off < CHUNK ? a.size - off : CHUNK;
        if (pread(fd, buf, n, (off_t)off) != (ssize_t)n) DIE("read");
        zmq_send(d, buf, n, 0);
    }
    char ack[8];
    zmq_recv(d, ack, sizeof ack, 0);
    double t = bench_now() - t0;
    pthread_join(th, NULL);
    if (cpu) *cpu = cpu_s(getpid()) - c0;
    zmq_close(d);
    free(buf);
    close(fd);
    return t;
}

/* ---- Reel: upload, sync by value, both workers ack --------------------------------- */

/* The trainer's file of version v: DIR/tr/vV.safetensors (seed v). */
static void make_version(const char *ctl, const char *config, const char *dir, int v) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s weights init --config %s --seed %d --out %s/tr/v%d.safetensors 2>/dev/null", ctl,
             config, v, dir, v);
    if (system(cmd) != 0) DIE("weights init");
}

static void drop_version(const char *dir, int v) {
    char path[400];
    snprintf(path, sizeof path, "%s/tr/v%d.safetensors", dir, v);
    unlink(path);
}

typedef struct {
    double t0, done;
} clock_t_;


static void upload_done(void *user, uint64_t done, uint64_t size) {
    clock_t_ *k = user;
    if (done == size && k->done < 0) k->done = bench_now();
}

/* Seconds from the first byte to SYNC_DONE; *up the upload's part.
 * overlap: reel_publish (the SYNC goes with the first chunk and workers
 * fetch while the rest comes, as reelctl sync --upload does); else
 * reel_upload, then reel_sync (stages one after the other). */
static double by_value(reel_client_t *c, const char *path, uint64_t version, bool overlap, double *up,
                       double *hash_s) {
    char hex[65];
    double h0 = bench_now();
    if (reel_sha256_file(path, hex) != 0) DIE("%s", reel_err_text());
    if (hash_s) *hash_s = bench_now() - h0;
    wire_err_t err;
    reel_sync_result_t r;
    settle();
    clock_t_ k = { bench_now(), -1 };
    int rc;
    if (overlap) {
        rc = reel_publish(c, "transformer", version, hex, path, 600000, upload_done, &k, &r, 600000, &err);
    } else {
        if (reel_upload(c, "transformer", version, hex, path, upload_done, &k, 600000, &err) != 0)
            DIE("upload v%llu: %s: %s", (unsigned long long)version, err.code, err.message);
        rc = reel_sync(c, "transformer", version, hex, NULL, 600000, &r, 600000, &err);
    }
    if (rc != 0 || !r.complete)
        DIE("sync v%llu: %s %s (applied %s, failed %s)", (unsigned long long)version, err.code, err.message, r.applied,
            r.failed);
    *up = k.done - k.t0;
    return bench_now() - k.t0;
}


int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    const char *config = argc > 3 ? argv[3] : "small";
    if (reps < 1 || reps > REPS_MAX) DIE("reps must be 1..%d", REPS_MAX);
    /* The malloc settings Reel's daemons run with, here too: the floor's
     * 4 MiB messages otherwise come from fresh mmaps until glibc raises its
     * threshold by itself, and the floor moved 5x (0.2-1.1 s at 1.2 GB)
     * with it: an unfair floor. */
    wire_tune_malloc();
    bool seq = !strcmp(config, "small"); /* also the stages one after the other (disk: not at 1.3b) */
    char dir[] = "/tmp/reel-bench-sync.XXXXXX", cmd[1024], broker[300], worker[300], ctl[300];
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(broker, sizeof broker, "%s/reel-broker", build);
    snprintf(worker, sizeof worker, "%s/reel-worker", build);
    snprintf(ctl, sizeof ctl, "%s/reelctl", build);
    if (access(broker, X_OK) || access(worker, X_OK) || access(ctl, X_OK)) DIE("build %s first", build);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/store %s/w1 %s/w2 %s/tr", dir, dir, dir, dir);
    if (system(cmd) != 0) DIE("mkdir");
    make_version(ctl, config, dir, 1);
    snprintf(cmd, sizeof cmd, "ln %s/tr/v1.safetensors %s/w1/ && ln %s/tr/v1.safetensors %s/w2/", dir, dir, dir, dir);
    if (system(cmd) != 0) DIE("ln");
    int port = 31000 + getpid() % 20000;
    char cep[64], wep[64], db[300], store[300], log[300];
    snprintf(cep, sizeof cep, "tcp://127.0.0.1:%d", port);
    snprintf(wep, sizeof wep, "tcp://127.0.0.1:%d", port + 1);
    snprintf(db, sizeof db, "%s/reel.db", dir);
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(log, sizeof log, "%s/broker.log", dir);
    char *bargv[] = { broker, "--clients", cep, "--workers", wep, "--catalog", db, "--weights-dir", store, NULL };
    pid_t pids[3];
    pids[0] = bench_spawn(bargv, log);
    for (int i = 0; i < 2; i++) {
        char name[16], wts[300], wdir[300], wlog[300];
        snprintf(name, sizeof name, "w%d", i + 1);
        snprintf(wts, sizeof wts, "%s/w%d/v1.safetensors", dir, i + 1);
        snprintf(wdir, sizeof wdir, "%s/w%d", dir, i + 1);
        snprintf(wlog, sizeof wlog, "%s/w%d.log", dir, i + 1);
        char *wargv[] = { worker, "--broker", wep, "--name", name, "--weights", wts, "--weights-dir", wdir,
                          "--streams", "1", NULL };
        pids[1 + i] = bench_spawn(wargv, wlog);
    }
    reel_client_t *c = reel_client_new(cep);
    if (!c) DIE("%s", reel_err_text());
    bench_wait_workers(c, 2, "bench_sync");
    void *ctx = zmq_ctx_new();
    struct stat st;
    char path[400];
    snprintf(path, sizeof path, "%s/tr/v1.safetensors", dir);
    stat(path, &st);
    printf("bench_sync: a %.1f MB %s-config file by value to 2 workers vs one plain loopback copy, %d reps\n",
           (double)st.st_size / 1e6, config, reps);
    double tv[REPS_MAX], tu[REPS_MAX], tf[REPS_MAX], q[REPS_MAX], ts[REPS_MAX], tsu[REPS_MAX], qs[REPS_MAX];
    double cpu[4][REPS_MAX], cpus[4][REPS_MAX]; /* CPU seconds of a by-value sync: broker, w1, w2, trainer */
    double route[REPS_MAX];                     /* ... of it the broker's routing thread */
    double th[REPS_MAX], fc[REPS_MAX];          /* the trainer's sha256 of the file; the floor copy's CPU s */
    uint64_t version = 1;
    /* The first syncs of fresh processes pay once for memory they touch
     * for the first time (the workers' fetch buffers, the broker's first
     * files: its later uploads write over removed ones); shown, not
     * counted. */
    for (int k = 0; k < WARMUP; k++) {
        make_version(ctl, config, dir, (int)version + 1);
        snprintf(path, sizeof path, "%s/tr/v%d.safetensors", dir, (int)version + 1);
        if (k == WARMUP - 1) printf("warm-up floor (not counted): %.3f s\n", floor_copy(ctx, path, port + 40, NULL));
        double up, t = by_value(c, path, ++version, true, &up, NULL);
        drop_version(dir, (int)version);
        printf("warm-up %d (not counted): by value %.3f s (upload done at %.3f s)\n", k + 1, t, up);
        fflush(stdout);
    }
    for (int k = 0; k < reps; k++) {
        make_version(ctl, config, dir, (int)version + 1);
        snprintf(path, sizeof path, "%s/tr/v%d.safetensors", dir, (int)version + 1);
        if (k % 2) tf[k] = floor_copy(ctx, path, port + 2 + k, &fc[k]);
        double c0[4] = { cpu_s(pids[0]), cpu_s(pids[1]), cpu_s(pids[2]), cpu_s(getpid()) };
        double r0 = cpu_of(pids[0], true);
        tv[k] = by_value(c, path, ++version, true, &tu[k], &th[k]);
        for (int i = 0; i < 4; i++) cpu[i][k] = cpu_s(i < 3 ? pids[i] : getpid()) - c0[i];
        route[k] = cpu_of(pids[0], true) - r0;
        if (!(k % 2)) tf[k] = floor_copy(ctx, path, port + 2 + k, &fc[k]);
        q[k] = tv[k] / tf[k];
        printf("rep %d: by value %.3f s (upload done at %.3f s), floor %.3f s: %.2fx", k + 1, tv[k], tu[k], tf[k], q[k]);
        drop_version(dir, (int)version);
        if (seq) {
            make_version(ctl, config, dir, (int)version + 1);
            snprintf(path, sizeof path, "%s/tr/v%d.safetensors", dir, (int)version + 1);
            double s0[4] = { cpu_s(pids[0]), cpu_s(pids[1]), cpu_s(pids[2]), cpu_s(getpid()) };
            ts[k] = by_value(c, path, ++version, false, &tsu[k], NULL);
            drop_version(dir, (int)version);
            for (int i = 0; i < 4; i++) cpus[i][k] = cpu_s(i < 3 ? pids[i] : getpid()) - s0[i];
            qs[k] = ts[k] / tf[k];
            printf("; stages in turn %.3f s (upload %.3f s): %.2fx", ts[k], tsu[k], qs[k]);
        }
        printf("\n");
        fflush(stdout);
    }
    double mv = bench_median(tv, reps), mu = bench_median(tu, reps), mf = bench_median(tf, reps), mq = bench_median(q, reps);
    printf("\nmedians of %d reps: by value %.3f s (upload done at %.3f s), floor %.3f s (%.0f MB/s); "
           "by value / floor %.2fx (goal <= 2x)\n", reps, mv, mu, mf, (double)st.st_size / 1e6 / mf, mq);
    printf("CPU seconds of a by-value sync (medians): broker %.3f (its routing thread %.3f), worker 1 %.3f, "
           "worker 2 %.3f, trainer %.3f (its sha256 of the file before the first byte, and a sync(), included)\n",
           bench_median(cpu[0], reps), bench_median(route, reps), bench_median(cpu[1], reps),
           bench_median(cpu[2], reps), bench_median(cpu[3], reps));
    /* What this machine allows, from the same run: a sync by value hashes
     * the file three times (the broker, each worker: end to end) and moves
     * its bytes three times (trainer to broker, broker to each worker),
     * each move about as dear as the floor's one; the processes share
     * the machine's cores, and a worker's sha256 is one sequential pass. */
    double mh = bench_median(th, reps), mfc = bench_median(fc, reps);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double work = 3 * mh + 3 * mfc, least = work / (double)(cores > 0 ? cores : 1);
    if (least < mh) least = mh;
    printf("what bounds it here (medians): sha256 of the file %.3f s (%.0f MB/s); the floor copy used %.3f CPU-s "
           "in %.3f s; three sha256 passes and three such copies are about %.2f CPU-s, on %ld cores at least "
           "%.3f s: about %.2fx the floor is the least this machine allows; with a core per process, one "
           "worker's sequential sha256 alone is %.2fx the floor\n",
           mh, (double)st.st_size / 1e6 / mh, mfc, mf, work, cores, least, least / mf, mh / mf);
    if (seq) {
        printf("stages in turn (reel_upload, then reel_sync): %.3f s (upload %.3f s), %.2fx the floor; "
               "overlapped / in turn %.2fx\n", bench_median(ts, reps), bench_median(tsu, reps), bench_median(qs, reps),
               mv / bench_median(ts, reps));
        printf("CPU seconds of a sync with the stages in turn (medians): broker %.3f, worker 1 %.3f, worker 2 %.3f, "
               "trainer %.3f\n", bench_median(cpus[0], reps), bench_median(cpus[1], reps), bench_median(cpus[2], reps),
               bench_median(cpus[3], reps));
    }
    /* Where a worker's part went (its log: fetch + hash, NaN check, drain, reload), per sync. */
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "grep -o 'applied transformer v[0-9]* .*' %s/w%d.log | sed 's/^/  w%d /'", dir, i + 1,
                 i + 1);
        if (system(cmd) != 0) printf("  (no sync lines in w%d's log)\n", i + 1);
    }
    reel_client_destroy(&c);
    zmq_ctx_term(ctx);
    for (int i = 0; i < 3; i++) kill(pids[i], SIGTERM);
    for (int i = 0; i < 3; i++) waitpid(pids[i], NULL, 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return 0;
}
