/* brk_main.c -- reel-broker: parse the command line, open the catalog,
 * bind the two ROUTERs, run the routing loop until SIGINT/SIGTERM, then
 * answer what is pending, close the sockets and flush the catalog.
 * With --keys both sockets are CURVE servers behind a ZAP handler that
 * fails closed (brk_zap.h); without, brk_opts lets it serve loopback and
 * ipc endpoints only, unless --insecure.
 * Exit status: 0 after a clean stop, 1 when it cannot start (catalog,
 * keys, bind), 2 for a bad command line. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker/brk_ha.h"
#include "broker/brk_broker.h"
#include "broker/brk_loop.h"
#include "broker/brk_workers.h"
#include "broker/brk_metrics.h"
#include "broker/brk_requests.h"
#include "broker/brk_sync.h"
#include "broker/brk_zap.h"
#include "base/notify.h"
#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"
#include "broker/brk_upload.h"
#include "base/error.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* Whether endpoint is an ipc:// path a live process listens on. ZeroMQ
 * binds an ipc path by unlinking whatever is there: a second broker
 * started on a live one's paths would take them over without an error
 * (tcp fails with EADDRINUSE), each then holding part of the cluster.
 * A connect that succeeds means a listener; a stale file (its broker
 * gone) refuses it and is taken over, as before. Abstract names (@) and
 * other transports: false (their bind reports a clash itself). */
static bool ipc_in_use(const char *endpoint) {
    static const char pre[] = "ipc://";
    if (strncmp(endpoint, pre, sizeof pre - 1)) return false;
    const char *path = endpoint + sizeof pre - 1;
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    if (path[0] == '@' || strlen(path) >= sizeof a.sun_path) return false;
    memcpy(a.sun_path, path, strlen(path) + 1);
    /* non-blocking: a listener whose backlog is full (a stopped broker)
     * answers EAGAIN at once, and is live */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    bool live = connect(fd, (const struct sockaddr *)&a, sizeof a) == 0 || errno == EAGAIN;
    close(fd);
    return live;
}

/* A ROUTER with the wire limits, a CURVE server when b has keys, bound to
 * endpoint. NULL with a logged message. */
static void *router(brk_t *b, const char *endpoint, bool worker_side, const char *what) {
    void *s = zmq_socket(b->ctx, ZMQ_ROUTER);
    int one = 1, sndtimeo = 0;
    int hb_ivl = b->opt.heartbeat_ms, hb_timeout = b->opt.heartbeat_ms * b->opt.liveness;
    if (!s) goto err;
    /* The broker never waits on a peer. ZMQ_ROUTER_MANDATORY: a send to a
     * peer that is gone fails (EHOSTUNREACH) instead of vanishing, and
     * ZMQ_SNDTIMEO 0: a send to a peer whose queue is full fails at once
     * (EAGAIN); either is counted (STATUS_REPLY `undelivered`), and a
     * worker that cannot take a message is made unroutable.
     * No ZMQ_ROUTER_HANDOVER: with it, whoever connects under a live
     * worker's routing id takes its traffic over. A second connection
     * under a live id is ignored instead, and ZMTP heartbeats close a
     * dead connection within liveness intervals, so a restarted worker
     * gets its id back. */
    if (wire_socket_limits(s) < 0 || zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one) < 0 ||
        (worker_side && zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl) < 0) ||
        (worker_side && zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout) < 0) ||
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo) < 0)
        goto err;
    if (b->zap && brk_zap_server(b->zap, s, worker_side) < 0) {
        brk_log("%s", reel_err_text());
        zmq_close(s);
        return NULL;
    }
    if (ipc_in_use(endpoint)) {
        brk_log("cannot bind the %s endpoint %s: another process is listening on it (another broker?); "
                "ZeroMQ would take the path over and split the cluster between the two", what, endpoint);
        zmq_close(s);
        return NULL;
    }
    char ep[1024];
    if (wire_socket_endpoint(s, endpoint, ep, sizeof ep) < 0 || zmq_bind(s, ep) < 0) {
        brk_log("cannot bind the %s endpoint %s: %s", what, endpoint, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
err:
    brk_log("cannot set up the %s socket: %s", what, zmq_strerror(zmq_errno()));
    if (s) zmq_close(s);
    return NULL;
}

/* Keys and the ZAP handler, before any socket binds. -1 (logged) when
 * keys were asked for and cannot be used: the broker must not start open. */
static int start_keys(brk_t *b) {
    if (!b->opt.keys) {
        brk_log("no keys: every peer that reaches %s and %s is admitted%s", b->opt.clients, b->opt.workers,
                b->opt.insecure ? " (--insecure)" : " (loopback and ipc only)");
        return 0;
    }
    char own[4096];
    const char *key = b->opt.key;
    if (!key) {
        snprintf(own, sizeof own, "%s/broker.key", b->opt.keys);
        key = own;
    }
    if (!(b->zap = brk_zap_new(b->ctx, b->opt.keys, key, b->opt.peer != NULL))) {
        brk_log("cannot use the keys: %s", reel_err_text());
        return -1;
    }
    brk_log("keys: CURVE on both sockets, %zu peer key%s from %s (SIGHUP reloads)", brk_zap_keys(b->zap),
            brk_zap_keys(b->zap) == 1 ? "" : "s", b->opt.keys);
    return 0;
}

static void free_workers(brk_t *b) {
    for (int i = 0; i < b->n_w; i++) free(b->w[i]);
    free(b->w);
    b->w = NULL;
    b->n_w = b->cap_w = 0;
}

/* Threads started from here on (the catalog writer, ZeroMQ's I/O
 * threads) inherit a mask without SIGINT/SIGTERM, so the signal always
 * interrupts the routing thread's zmq_poll. *old gets the mask to restore:
 * with SIGHUP in it, which stays blocked in every thread (the ZAP handler
 * takes it through a signalfd to reload the keys; without keys it is
 * ignored). */
static void block_stop_signals(sigset_t *old) {
    sigset_t stop_sigs;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    sigaddset(&stop_sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop_sigs, old);
    sigaddset(old, SIGHUP);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: zmq_poll returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Held tensor frames are large (up to WIRE_MAX_FRAME) and short-lived.
 * glibc's default moves its mmap threshold and trims the heap as frames
 * come and go, so the same 16 MiB request is sometimes served from memory
 * already mapped and sometimes unmapped and faulted in again (thousands of
 * page faults, bimodal from run to run). A fixed threshold at its maximum
 * (32 MiB on 64-bit) and no trimming below max_held keep freed frames
 * mapped for the next request; larger frames are mmapped, as before. */
static void tune_malloc(uint64_t max_held) {
    int trim = max_held > INT32_MAX ? INT32_MAX : (int)max_held;
    if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) || !mallopt(M_TRIM_THRESHOLD, trim))
        brk_log("mallopt failed: held frames may be unmapped and faulted in again");
}

_Static_assert(CAT_LORA_CONFIG_MAX == MSG_LORA_CONFIG_MAX, "the catalog keeps a SYNC's lora_config whole");

/* A LoRA adapter sent by upload whose adapter_config.json the catalog did
 * not keep (recorded before migration 13): no SYNC of it can be made
 * again after a restart. */
static bool lora_unsendable(const cat_version_t *v) {
    return v->base_version && !strcmp(v->source, BRK_SOURCE_UPLOADED) && !v->lora_config[0];
}

/* Resumes the current weight versions a previous run published. A
 * version still pending was applied by nobody the previous run heard of
 * before it stopped: resuming it would send every worker a sync none took,
 * so it fails. But an ack may have been lost with that run: such versions
 * are kept as interrupted (brk_interrupted_t), and a worker that registers
 * running one makes it current again (brk_sync_joined). */
static void resume_versions(brk_t *b, cat_t *cat) {
    cat_version_t *p = calloc(BRK_MAX_INTERRUPTED, sizeof *p);
    int np = p ? cat_pending_versions(cat, p, BRK_MAX_INTERRUPTED) : 0;
    if (np < 0) brk_log("cannot read pending weight versions from the catalog: %s", reel_err_text());
    /* ... and those an earlier restart found so that nothing settled since
     * (this broker restarted again before a worker or the trainer spoke):
     * the catalog remembers them across any number of restarts. */
    int ni = p && np >= 0 ? cat_interrupted_versions(cat, p + np, BRK_MAX_INTERRUPTED - np) : 0;
    if (ni < 0) brk_log("cannot read interrupted weight versions from the catalog: %s", reel_err_text());
    else np += ni;
    for (int i = 0; i < np; i++) {
        if (p[i].cut || !p[i].source[0] || !strcmp(p[i].source, "inline") || p[i].version == 0 ||
            p[i].version > MSG_VERSION_MAX || strlen(p[i].component) >= BRK_NAME_MAX || lora_unsendable(&p[i]))
            continue;
        brk_interrupted_t *e = &b->interrupted[b->n_interrupted++];
        snprintf(e->component, sizeof e->component, "%s", p[i].component);
        e->version = p[i].version;
        snprintf(e->sha256, sizeof e->sha256, "%.64s", p[i].sha256); /* hex sha256: 64 */
        snprintf(e->source, sizeof e->source, "%s", p[i].source);
        e->base_version = p[i].base_version;
        snprintf(e->lora_config, sizeof e->lora_config, "%s", p[i].lora_config);
        brk_log("sync %s v%llu was in flight when the previous broker stopped: failed, unless a worker that "
                "registers runs it (then it is current again); a trainer's resend of it waits for the workers",
                e->component, (unsigned long long)e->version);
    }
    free(p);
    if (cat_weight_fail_pending(cat, CAT_REASON_INTERRUPTED) != 0)
        brk_log("cannot mark pending weight versions failed: %s", reel_err_text());
    cat_version_t v[BRK_MAX_COMPONENTS];
    int n = cat_current_versions(cat, v, BRK_MAX_COMPONENTS);
    if (n < 0) brk_log("cannot read weight versions from the catalog: %s", reel_err_text());
    for (int i = 0; i < n; i++) {
        if (v[i].version == 0 || v[i].version > MSG_VERSION_MAX) {
            /* A catalog written before versions were bounded. */
            brk_log("%s v%llu is out of the version range (1..2^63-1): not restored", v[i].component,
                    (unsigned long long)v[i].version);
        } else if (v[i].cut) {
            /* A path longer than any SYNC may carry now: never send
             * workers a shortened one nobody published. */
            brk_log("%s v%llu: its path is longer than %d bytes: not restored", v[i].component,
                    (unsigned long long)v[i].version, MSG_PATH_MAX - 1);
        } else if (!strcmp(v[i].source, "inline") || !v[i].source[0]) {
            brk_log("%s v%llu was synced inline: not restored (workers keep their versions until the next sync)",
                    v[i].component, (unsigned long long)v[i].version);
        } else if (lora_unsendable(&v[i])) {
            brk_log("%s v%llu is a LoRA adapter on v%llu sent by upload before the catalog kept adapters' "
                    "configs: not restored (workers keep their versions until the next sync)", v[i].component,
                    (unsigned long long)v[i].version, (unsigned long long)v[i].base_version);
        } else if (brk_sync_restore(b, v[i].component, v[i].version, v[i].sha256, v[i].source,
                                    v[i].base_version, v[i].lora_config) != 0) {
            brk_log("cannot restore %s v%llu: %s", v[i].component, (unsigned long long)v[i].version, reel_err_text());
        } else {
            if (v[i].base_version)
                brk_log("restored %s v%llu from the catalog (the LoRA adapter %s on v%llu)", v[i].component,
                        (unsigned long long)v[i].version, v[i].source, (unsigned long long)v[i].base_version);
            else
                brk_log("restored %s v%llu from the catalog (%s)", v[i].component,
                        (unsigned long long)v[i].version, v[i].source);
        }
    }
    /* The full versions current adapters are on: a worker that joins
     * below one is sent it first. */
    n = cat_current_bases(cat, v, BRK_MAX_COMPONENTS);
    if (n < 0) brk_log("cannot read the current adapters' bases from the catalog: %s", reel_err_text());
    for (int i = 0; i < n; i++) {
        if (v[i].cut || !v[i].source[0] || !strcmp(v[i].source, "inline")) continue; /* not sendable */
        if (brk_sync_restore_base(b, v[i].component, v[i].version, v[i].sha256, v[i].source) != 0)
            brk_log("cannot keep %s v%llu as the current adapter's base: %s", v[i].component,
                    (unsigned long long)v[i].version, reel_err_text());
    }
}

/* Opens the catalog (when one is named), resumes its versions and starts
 * the writer thread on it. -1 with a logged message. */
static int start_catalog(brk_t *b) {
    cat_t *cat = NULL;
    if (b->opt.catalog[0]) {
        cat = cat_open(b->opt.catalog, false);
        if (!cat) {
            brk_log("cannot open the catalog %s: %s", b->opt.catalog, reel_err_text());
            return -1;
        }
        resume_versions(b, cat);
    }
    b->cat = brk_catq_new(&cat, (size_t)b->opt.catalog_queue);
    if (!b->cat) {
        brk_log("cannot start the catalog writer");
        return -1;
    }
    if (b->opt.catalog[0] && (b->opt.catalog_retain_days > 0 || b->opt.catalog_max_rows > 0)) {
        brk_catq_retain(b->cat, b->opt.catalog_retain_days * 86400.0, b->opt.catalog_max_rows);
        char age[64] = "", cap[64] = "";
        if (b->opt.catalog_retain_days > 0) snprintf(age, sizeof age, "older than %g days", b->opt.catalog_retain_days);
        if (b->opt.catalog_max_rows > 0)
            snprintf(cap, sizeof cap, "past the newest %lld per table", (long long)b->opt.catalog_max_rows);
        brk_log("catalog retention: raw rows %s%s%s are pruned (summaries, versions and the audit trail are kept)",
                age, age[0] && cap[0] ? " or " : "", cap);
    }
    return 0;
}

/* The queue, the context and both ROUTERs. -1 with a logged message. */
static int start_sockets(brk_t *b) {
    if (brk_queue_init(&b->queue, (size_t)b->opt.queue_max) < 0) {
        brk_log("out of memory");
        return -1;
    }
    b->ctx = zmq_ctx_new();
    if (!b->ctx) {
        brk_log("cannot create a ZeroMQ context: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    if (start_keys(b) != 0) return -1;
    b->clients = router(b, b->opt.clients, false, "client");
    if (!b->clients) return -1;
    b->workers = router(b, b->opt.workers, true, "worker");
    if (!b->workers) return -1;
    return 0;
}

/* Reads and drops what reaches the ROUTERs for CLOSE_DRAIN_MS before they
 * close. libzmq 4.3.4 can lose a message that is still arriving when its
 * socket closes (an UPLOAD's 4 MiB chunk at a SIGTERM), and with it the
 * I/O thread's receive buffer that its first frame points into: 18,160
 * bytes LeakSanitizer reports at exit (make asan-cli, cli_upload). A
 * stand-alone CURVE ROUTER closing under such a stream leaked in 13 of
 * 23 runs as it was, in 7 of 10 after reading only what had come, and in
 * none of 30 after reading what came for 50 ms. The broker is stopping
 * and has said so: what it reads now is dropped, as closing would. */
#define CLOSE_DRAIN_MS 50
static void drain_before_close(brk_t *b) {
    zmq_pollitem_t items[2] = { { b->clients, 0, ZMQ_POLLIN, 0 }, { b->workers, 0, ZMQ_POLLIN, 0 } };
    const int64_t until = brk_now_ms() + CLOSE_DRAIN_MS;
    for (;;) {
        bool read = false;
        for (int i = 0; i < 2; i++) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (items[i].socket && zmq_msg_recv(&m, items[i].socket, ZMQ_DONTWAIT) >= 0) read = true;
            zmq_msg_close(&m);
        }
        const int64_t left = until - brk_now_ms();
        if (left <= 0) return;
        if (!read && zmq_poll(items, items[1].socket ? 2 : 1, (long)left) < 0 && zmq_errno() != EINTR) return;
    }
}

/* Closes what start_catalog and start_sockets opened (any of it). */
static void stop_all(brk_t *b) {
    free_workers(b);
    /* their handshake monitors stopped before brk_zap_destroy closes the
     * readers (an event sent to a closed reader blocks libzmq's IO thread) */
    if (b->zap && b->clients) (void)zmq_socket_monitor(b->clients, NULL, 0);
    if (b->zap && b->workers) (void)zmq_socket_monitor(b->workers, NULL, 0);
    if (b->clients) drain_before_close(b);
    if (b->clients) {
        int linger = 200; /* let the shutdown ERRORs reach their clients */
        zmq_setsockopt(b->clients, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(b->clients);
    }
    if (b->workers) zmq_close(b->workers);
    brk_ha_stop(b);
    brk_zap_destroy(&b->zap); /* its socket too, before the context ends */
    if (b->ctx) zmq_ctx_term(b->ctx);
    brk_queue_free(&b->queue);
    brk_catq_destroy(&b->cat); /* writes what is still queued */
}

int main(int argc, char **argv) {
    brk_t b;
    memset(&b, 0, sizeof b);
    int prc = brk_opts_parse(&b.opt, argc, argv);
    if (prc == 1) {
        fputs(brk_usage(), stdout);
        return 0;
    }
    if (prc) {
        fprintf(stderr, "reel-broker: %s\n", reel_err_text());
        return reel_exit_status(reel_err_code());
    }
    tune_malloc(b.opt.max_held_bytes);
    cat_process_setup(); /* before the catalog and the threads */
    sigset_t old;
    block_stop_signals(&old);
    /* Ids unique across restarts (ms since the epoch, 4096 per ms): a
     * worker's answer to a SYNC the broker before this one sent is never
     * taken for the answer to one of ours (brk_sync_ack). */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    b.next_id = ((uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000) << 12 | 1;
    b.boot = b.next_id; /* as unique across restarts */
    b.started_ms = b.active_ms = brk_now_ms();
    /* The endpoints first: a broker that cannot have them (another one
     * listens there) stops before it touches the catalog or the uploads
     * (it would fail the other's pending syncs and remove its partial
     * uploads). */
    int rc = 1;
    if (start_sockets(&b) != 0) goto out;
    if (start_catalog(&b) != 0) goto out;
    brk_upload_start(&b);
    if (brk_ha_start(&b) != 0) { /* one of a standby pair: after the sockets, PEER goes out at once */
        brk_log("%s", reel_err_text());
        goto out;
    }
    if (brk_metrics_start(&b) != 0) {
        brk_log("%s", reel_err_text());
        goto out;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    char ce[256] = "", we[256] = "";
    size_t cl = sizeof ce, wl = sizeof we;
    zmq_getsockopt(b.clients, ZMQ_LAST_ENDPOINT, ce, &cl);
    zmq_getsockopt(b.workers, ZMQ_LAST_ENDPOINT, we, &wl);
    brk_log("ready clients=%s workers=%s", ce, we);
    reel_notify("READY=1\nSTATUS=serving");

    rc = brk_run(&b, &g_stop) < 0 ? 1 : 0;
    reel_notify("STOPPING=1");
    brk_log("shutting down (%d worker%s, %zu queued)", b.n_w, b.n_w == 1 ? "" : "s",
            brk_queue_len(&b.queue));
    brk_req_shutdown(&b);
    brk_sync_shutdown(&b);
    brk_deliver_stop(&b); /* (their shutdown ERRORs are the last things sent) */
    brk_msg_pool_free(&b);
    brk_workers_free_events(&b);
out:
    brk_metrics_stop(&b);
    brk_upload_stop(&b);
    stop_all(&b);
    if (rc == 0) brk_log("stopped");
    return rc;
}
