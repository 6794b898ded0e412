/* bench_catalog.c -- the catalog after a busy day (issue 13 part 5): a
 * catalog of 2M requests, ~200k captures and ~200k evictions (64 workers
 * at 50 requests/s for 11 hours, a weight sync every 5 minutes that evicts
 * and recaptures every worker's 24 keys), and one a tenth of its size (the
 * first 66 minutes of the same day), both written through the catalog
 * writer's own path (cat_begin, cat_<kind>, cat_commit in batches of
 * 4096: the summaries are maintained as the broker maintains them). Then
 * every reelctl report run as a process (its wall time, process start
 * included) and a /metrics scrape of a broker serving each catalog, the
 * two sizes in turn, REPS times (median and fastest); the goal: each under
 * 100 ms at full size (median) and no slower than at a tenth (fastest). For scale, one scan of the raw
 * requests (what a report reading raw rows pays at least) is timed too.
 *
 * usage: bench_catalog [BUILD] [DIR]  (DIR: where the catalogs go; default
 * a new directory under /tmp, removed at the end). */
#include "bench/bench.h"
#include "bench/bench_proc.h"
#include "base/error.h"
#include "catalog/catalog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKERS 64
#define KEYS_PER_WORKER 24
#define RATE 50.0            /* requests per second, the whole cluster */
#define SYNC_EVERY 300.0     /* seconds between weight syncs */
#define STEPS 8
#define FULL_REQUESTS 2000000
#define T0 1.75e9            /* the day starts here (UNIX seconds) */
#define REPS 25

static uint64_t rng = 88172645463325252ULL;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void die(const char *what) {
    fprintf(stderr, "bench_catalog: %s: %s\n", what, reel_err_text());
    exit(1);
}

/* Writes the first n requests of the day (with their captures, replays,
 * evictions and syncs) into a new catalog at path. Returns records/s. */
static double build(const char *path, long n, long *captures, long *evictions, int *syncs) {
    rng = 88172645463325252ULL; /* the same day at every size */
    unlink(path);
    cat_t *c = cat_open(path, false);
    if (!c) die("open");
    char worker[WORKERS][16], key[WORKERS * KEYS_PER_WORKER][17], text[64];
    for (int w = 0; w < WORKERS; w++) snprintf(worker[w], sizeof worker[w], "gpu-%02d", w);
    for (int k = 0; k < WORKERS * KEYS_PER_WORKER; k++) snprintf(key[k], sizeof key[k], "%016llx", 0xa000000ULL + (unsigned long long)k);
    static bool captured[WORKERS * KEYS_PER_WORKER];
    memset(captured, 0, sizeof captured);
    uint64_t version = 1;
    double next_sync = T0 + SYNC_EVERY, t = T0;
    long records = 0, in_batch = 0;
    *captures = *evictions = 0;
    *syncs = 0;
    double start = bench_now();
    if (cat_begin(c) != 0) die("begin");
    for (int w = 0; w < WORKERS; w++) {
        if (cat_worker_seen(c, worker[w], "H200", "sm_90", 1, 100ULL << 30, NULL, t) != 0) die("worker");
        if (cat_worker_version(c, worker[w], "transformer", version, true, NULL, t) != 0) die("worker version");
    }
    if (cat_weight_version(c, "transformer", version, "00", "uploaded", t) != 0 ||
        cat_weight_state(c, "transformer", version, "current", NULL) != 0)
        die("version");
    for (long i = 0; i < n; i++) {
        t += 1.0 / RATE;
        if (t >= next_sync) { /* a sync: every graph evicted, every worker applies it */
            version++;
            (*syncs)++;
            if (cat_weight_version(c, "transformer", version, "00", "uploaded", t) != 0) die("sync");
            for (int k = 0; k < WORKERS * KEYS_PER_WORKER; k++) {
                if (!captured[k]) continue;
                int w = k / KEYS_PER_WORKER;
                snprintf(text, sizeof text, "dit step 16x32x32 w%d k%d", w, k);
                if (cat_eviction(c, worker[w], text, key[k], 0, "weight_sync", "transformer", version - 1, version,
                                 version, t) != 0)
                    die("eviction");
                captured[k] = false;
                (*evictions)++;
                records++;
            }
            for (int w = 0; w < WORKERS; w++)
                if (cat_worker_version(c, worker[w], "transformer", version, true, NULL, t + 0.5) != 0) die("applied");
            if (cat_weight_state(c, "transformer", version, "current", NULL) != 0) die("state");
            next_sync += SYNC_EVERY;
        }
        int k = (int)(next_rand() % (WORKERS * KEYS_PER_WORKER)), w = k / KEYS_PER_WORKER;
        int cap = !captured[k];
        if (cap) {
            snprintf(text, sizeof text, "dit step 16x32x32 w%d k%d", w, k);
            if (cat_capture(c, worker[w], text, key[k], 0, 1 << 20, 420, 0.8, version, NULL, t) != 0) die("capture");
            captured[k] = true;
            (*captures)++;
            records++;
        }
        if (cat_replays(c, worker[w], key[k], 0, (uint64_t)(STEPS - cap), version, t) != 0) die("replays");
        double secs = 0.5 + (double)(next_rand() % 1000) / 1000.0 + cap * 0.8;
        bool ok = next_rand() % 1000 != 0;
        if (cat_request(c, (uint64_t)i + 1, worker[w], key[k], version, STEPS, cap, STEPS - cap, 0, secs,
                        ok ? "ok" : "deadline", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, t) != 0)
            die("request");
        records += 2;
        if ((in_batch += 2) >= 4096) { /* the broker's largest batch */
            if (cat_commit(c) != 0 || cat_begin(c) != 0) die("commit");
            in_batch = 0;
        }
    }
    if (cat_commit(c) != 0) die("commit");
    double secs = bench_now() - start;
    cat_close(&c);
    return (double)records / secs;
}

/* The wall time of running argv once (stdout and stderr to /dev/null), in
 * ms; exits the bench when it fails. */
static double run_once(char *const argv[]) {
    double t = bench_now();
    pid_t p = fork();
    if (p == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    waitpid(p, &st, 0);
    double ms = (bench_now() - t) * 1e3;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_catalog: %s %s failed (status %d)\n", argv[0], argv[1], st);
        exit(1);
    }
    return ms;
}

/* GET path from 127.0.0.1:port; the body's length, -1 on failure. */
static long http_get(int port, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    long total = 0;
    char buf[65536];
    ssize_t got;
    bool ok = false;
    while ((got = read(fd, buf, sizeof buf)) > 0) {
        if (!total && got > 12 && !strncmp(buf, "HTTP/1.1 200", 12)) ok = true;
        total += got;
    }
    close(fd);
    return ok ? total : -1;
}

static int rm_entry(const char *p, const struct stat *s, int f, struct FTW *w) {
    (void)s, (void)f, (void)w;
    remove(p);
    return 0;
}

/* A broker serving catalog `path` with /metrics on `port`; its pid. */
static pid_t start_broker(const char *broker, const char *dir, int s, const char *path, int port) {
    char clients[600], workers[600], metrics[64], log[600];
    snprintf(clients, sizeof clients, "ipc://%s/c%d", dir, s);
    snprintf(workers, sizeof workers, "ipc://%s/w%d", dir, s);
    snprintf(metrics, sizeof metrics, "127.0.0.1:%d", port);
    snprintf(log, sizeof log, "%s/broker-%d.log", dir, s);
    char *av[] = { (char *)broker, "--clients", clients, "--workers", workers, "--catalog", (char *)path,
                   "--metrics", metrics, NULL };
    return bench_spawn(av, log);
}

int main(int argc, char **argv) {
    const char *build_dir = argc > 1 ? argv[1] : "build";
    char dir[256];
    bool own_dir = argc <= 2;
    if (own_dir) {
        snprintf(dir, sizeof dir, "/tmp/reel-bench-catalog-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            return 1;
        }
    } else {
        snprintf(dir, sizeof dir, "%s", argv[2]);
    }
    char reelctl[512], broker[512];
    snprintf(reelctl, sizeof reelctl, "%s/reelctl", build_dir);
    snprintf(broker, sizeof broker, "%s/reel-broker", build_dir);

    printf("catalog after a busy day: %d workers, %.0f requests/s, a sync every %.0f s (every graph evicted\n"
           "and recaptured), %d keys; every reelctl report run as a process, a tenth and the full size in\n"
           "turn, %d times each (ms)\n",
           WORKERS, RATE, SYNC_EVERY, WORKERS * KEYS_PER_WORKER, REPS);
    long reqs[2] = { FULL_REQUESTS / 10, FULL_REQUESTS };
    char path[2][512], html[2][512], cat_arg[2][600];
    double size_mb[2];
    for (int s = 0; s < 2; s++) {
        snprintf(path[s], sizeof path[s], "%s/catalog-%ld.db", dir, reqs[s]);
        snprintf(html[s], sizeof html[s], "%s/report-%ld.html", dir, reqs[s]);
        snprintf(cat_arg[s], sizeof cat_arg[s], "--catalog=%s", path[s]);
        long caps, evs;
        int syncs;
        double rps = build(path[s], reqs[s], &caps, &evs, &syncs);
        struct stat sb;
        stat(path[s], &sb);
        size_mb[s] = (double)sb.st_size / 1e6;
        printf("%s size: %ld requests, %ld captures, %ld evictions, %d syncs: %.0f MB, written at %.0f records/s\n",
               s ? "full" : "a tenth", reqs[s], caps, evs, syncs, size_mb[s], rps);
        fflush(stdout);
    }

    static const char *const reports[] = { "stats", "keys", "evictions", "versions", "workers", "requests", "metrics" };
    enum { NREP = sizeof reports / sizeof *reports, NROW = NREP + 3 };
    const char *names[NROW];
    double v[NROW][2][REPS];
    for (int i = 0; i < NREP; i++) names[i] = reports[i];
    names[NREP] = "artifacts report";
    names[NREP + 1] = "report --html";
    names[NREP + 2] = "/metrics scrape";
    for (int r = 0; r < REPS; r++)
        for (int s = 0; s < 2; s++) {
            for (int i = 0; i < NREP; i++) {
                char *av[] = { reelctl, (char *)reports[i], cat_arg[s], NULL };
                v[i][s][r] = run_once(av);
            }
            char *av[] = { reelctl, "artifacts", "report", "--catalog", path[s], NULL };
            v[NREP][s][r] = run_once(av);
            char *hv[] = { reelctl, "report", "--html", html[s], "--catalog", path[s], NULL };
            v[NREP + 1][s][r] = run_once(hv);
        }
    /* A broker on each catalog: its start, then /metrics, in turn. */
    double start_ms[2];
    pid_t pid[2];
    int port[2];
    for (int s = 0; s < 2; s++) {
        port[s] = 19400 + (int)(getpid() % 500) * 2 + s;
        double t = bench_now();
        pid[s] = start_broker(broker, dir, s, path[s], port[s]);
        while (http_get(port[s], "/healthz") < 0 && bench_now() - t < 60) usleep(1000);
        start_ms[s] = (bench_now() - t) * 1e3;
    }
    for (int r = 0; r < REPS; r++)
        for (int s = 0; s < 2; s++) {
            double t = bench_now();
            if (http_get(port[s], "/metrics") < 0) {
                fprintf(stderr, "bench_catalog: /metrics of the broker on %s failed\n", path[s]);
                kill(pid[0], SIGKILL);
                kill(pid[1], SIGKILL);
                return 1;
            }
            v[NREP + 2][s][r] = (bench_now() - t) * 1e3;
        }
    for (int s = 0; s < 2; s++) {
        kill(pid[s], SIGTERM);
        waitpid(pid[s], NULL, 0);
    }
    /* One scan of the raw requests, for scale. */
    double scan[2];
    for (int s = 0; s < 2; s++) {
        sqlite3 *db = NULL;
        double w[REPS];
        sqlite3_open_v2(path[s], &db, SQLITE_OPEN_READONLY, NULL);
        for (int r = 0; r < REPS; r++) {
            double t = bench_now();
            sqlite3_exec(db, "SELECT count(*), sum(steps), sum(replayed) FROM requests", NULL, NULL, NULL);
            w[r] = (bench_now() - t) * 1e3;
        }
        sqlite3_close(db);
        scan[s] = bench_median(w, REPS);
    }

    /* The median says what an operator waits; the fastest of the runs is
     * the work itself (this VM's noise only adds), so "no slower" compares
     * the fastest: within 10%, or 2 ms for what takes a few ms. */
    printf("\n%-18s %22s %22s %14s  %s\n", "report", "a tenth: median (min)", "full: median (min)", "ratio (min)",
           "goal: < 100 ms, no slower");
    int missed = 0;
    for (int i = 0; i < NROW; i++) {
        double a = bench_median(v[i][0], REPS), b = bench_median(v[i][1], REPS); /* sorts: [0] is the min */
        double amin = v[i][0][0], bmin = v[i][1][0];
        bool ok = b < 100 && (bmin <= 1.10 * amin || bmin - amin < 2.0);
        missed += !ok;
        printf("%-18s %11.1f (%5.1f) ms %11.1f (%5.1f) ms %6.2fx (%4.2fx)  %s\n", names[i], a, amin, b, bmin, b / a,
               bmin / amin, ok ? "met" : "MISSED");
    }
    printf("%-18s %9.1f ms %9.1f ms %7.2fx  (one scan of the raw requests, for scale)\n", "raw requests scan",
           scan[0], scan[1], scan[1] / scan[0]);
    printf("%-18s %9.1f ms %9.1f ms %7.2fx  (until /healthz answers)\n", "broker start", start_ms[0], start_ms[1],
           start_ms[1] / start_ms[0]);
    printf("catalog files: %.0f MB and %.0f MB; goal %s\n", size_mb[0], size_mb[1],
           missed ? "MISSED by some report" : "met by every report");
    if (own_dir) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
