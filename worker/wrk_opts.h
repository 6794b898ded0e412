/* wrk_opts.h -- reel-worker's command line: parsed and checked in one place
 * so main() only sees valid values. Pure (no sockets, no threads): the unit
 * tests call it directly. */
#ifndef REEL_WORKER_WRK_OPTS_H
#define REEL_WORKER_WRK_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "capture_cache/cache.h"
#include "kernels/artifacts.h"
#include "kernels/backend.h"

#define WRK_NAME_MAX 64              /* bytes incl. NUL; also the routing id */
#define WRK_MAX_STREAMS 64
/* A sample's tokens a worker takes by default: twice wan2.1-1.3b's 32,760
 * (81 frames at 480x832). Attention costs the square of it per step and
 * a step cannot be stopped half-way, so a legal but huge latent (the
 * protocol allows F x H x W up to 2^24) would hold a worker for hours. */
#define WRK_MAX_TOKENS 65536

typedef struct {
    const char *broker;              /* endpoint, default tcp://127.0.0.1:5556 */
    const char *name;                /* required; [A-Za-z0-9_.:+-]{1,63}, the broker's alphabet */
    const char *weights;             /* required; a safetensors file */
    uint64_t weights_version;        /* >= 1, default 1 */
    kern_backend_kind_t backend;     /* default cpu */
    int device;                      /* CUDA ordinal, default 0 */
    int streams;                     /* 1..WRK_MAX_STREAMS, default 2 */
    size_t budget;                   /* bytes; 0 = unlimited */
    int64_t max_tokens;              /* --max-tokens: a sample's tokens (F x H/p x W/p) at most;
                                      * 0 = unlimited; default WRK_MAX_TOKENS */
    int max_inflight;                /* default streams * max(4, max_batch) */
    int64_t max_held_mb;             /* --max-held-mb: MiB of tensors the REQUESTs held keep, all
                                      * together; 0 = no bound; -1 (default): the worker's, from its
                                      * model (wrk.h WRK_HELD_BYTES_PER_INFLIGHT) */
    int threads;                     /* --threads: the CPU backend's pool, shared by the streams; 0
                                      * (default): REEL_THREADS, else the cores this process may use */
    int blas_threads;                /* --blas-threads (deprecated): N > 0 is --threads N; -1 is
                                      * --threads max(1, cores / streams); 0 (default): unset */
    bool batch_always;               /* --batching always: batch whenever two requests can share a
                                      * step; auto (default): only while it costs a request less */
    int max_batch;                   /* --max-batch: requests in one mixed step (1: off); default
                                      * 8 with --backend cuda, 1 on the CPU */
    bool batch_exact;                /* --batch-sizes exact: a batch of n runs as n rows; ladder
                                      * (default): the next power of two, padded */
    int prewarm;                     /* --prewarm K: at start, capture the K keys hot lately that this
                                      * worker will own (the broker names them); 0: off; default 8 */
    cap_policy_t policy;             /* default evict */
    bool bf16;                       /* --dtype bf16 (CUDA only) */
    bool no_fallback;                /* --no-fallback: an unusable CUDA device is an error */
    bool sync_drain;                 /* --sync-mode drain: a sync waits until no request
                                      * is mid-way, so each runs on one version */
    int warmup;                      /* 0..1000, default 2 */
    int audit_every;                 /* audit 1 replay in N per graph; 0 = off; default 256 */
    int heartbeat_ms;                /* default 1000 */
    int liveness;                    /* default 3 */
    int events_ms;                   /* default 200 */
    const char *metrics;             /* ADDR:PORT of /metrics, /healthz, /readyz; NULL = off */
    const char *weights_dirs[8];     /* --weights-dir, repeatable: where SYNC paths may lead;
                                      * none: the directory of --weights */
    int n_weights_dirs;
    const char *key;                 /* --key NAME.key (else $REEL_KEY): CURVE */
    const char *broker_key;          /* --broker-key broker.pub (else $REEL_BROKER_KEY) */
    const char *artifacts;           /* --artifacts DIR: kernel bundles (docs/ARTIFACTS.md) */
    const char *t5;                  /* --t5 FILE: the text encoder (.pth or safetensors); else the
                                      * release folder's, when --weights is one */
    const char *tokenizer;           /* --tokenizer PATH: spiece.model or its folder (likewise) */
    const char *vae;                 /* --vae FILE: the VAE (likewise) */
    size_t text_cache;               /* --text-cache BYTES: encoded prompts kept (64 MiB) */
    bool lora;                       /* --lora: take LoRA syncs, keeping the base weights (model/lora.h) */
    const char *attention;           /* --attention auto|fused|decomposed (NULL: $REEL_ATTN, else auto) */
    const char *artifacts_enable;    /* --artifacts-enable ID,ID: the allowlist (NULL: all verified) */
    kern_art_timing_t artifact_timing; /* --artifact-timing off|sync|shadow (off) */
    bool help;                       /* --help was given: print usage, exit 0 */
} wrk_opts_t;

/* Parses argv into *o (defaults first). Returns 0, or -1 with a
 * REEL_E_INVALID error (base/error.h), one line (unknown flag, bad value,
 * missing --name/--weights); the caller prints it and the usage and exits
 * 2. Can't fail otherwise; prints nothing; keeps pointers into argv. */
int wrk_opts_parse(int argc, char **argv, wrk_opts_t *o);

/* The usage text (for --help and after a usage error). */
const char *wrk_usage(void);

#endif
