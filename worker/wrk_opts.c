/* wrk_opts.c -- reel-worker's command line (see wrk_opts.h). Every value is
 * range-checked here; a bad one is a usage error (exit 2), never a clamp. */
#include "worker/wrk_opts.h"
#include "kernels/ops.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "base/opts.h"
#include "base/parse.h"
#include "model/tinydit.h"
#include "schema/msg.h"

/* The next four fail through their rows' expect (base/opts.h). */
static int set_backend(void *dst, const char *v) {
    return kern_backend_kind_parse(v, &((wrk_opts_t *)dst)->backend) != 0 ? -1 : 0;
}
static int set_policy(void *dst, const char *v) {
    return cap_policy_parse(v, &((wrk_opts_t *)dst)->policy) != 0 ? -1 : 0;
}
static int set_timing(void *dst, const char *v) {
    return kern_art_timing_parse(v, &((wrk_opts_t *)dst)->artifact_timing) ? -1 : 0;
}
static int set_budget(void *dst, const char *v) {
    uint64_t b;
    if (reel_parse_bytes(v, SIZE_MAX, "--budget", &b) != 0) return -1;
    ((wrk_opts_t *)dst)->budget = (size_t)b;
    return 0;
}
static int set_attention(void *dst, const char *v) {
    kern_attn_mode_t m;
    if (kern_attention_mode_parse(v, &m) != 0) return -1;
    ((wrk_opts_t *)dst)->attention = v;
    return 0;
}

static int set_text_cache(void *dst, const char *v) {
    uint64_t b;
    if (reel_parse_bytes(v, SIZE_MAX, "--text-cache", &b) != 0) return -1;
    ((wrk_opts_t *)dst)->text_cache = (size_t)b;
    return 0;
}
/* Repeatable: at most 8, each absolute. -1 with its own message. */
static int set_weights_dir(void *dst, const char *v) {
    wrk_opts_t *o = dst;
    int max = (int)(sizeof o->weights_dirs / sizeof o->weights_dirs[0]);
    if (o->n_weights_dirs >= max) return reel_fail(REEL_E_INVALID, "--weights-dir: at most %d directories", max);
    if (v[0] != '/') return reel_fail(REEL_E_INVALID, "--weights-dir: '%s' must be an absolute path", v);
    o->weights_dirs[o->n_weights_dirs++] = v;
    return 0;
}

static const char *const dtypes[] = { "f32", "bf16", NULL };   /* bf16: true */
static const char *const sync_modes[] = { "steps", "drain", NULL }; /* drain: true */
static const char *const batch_sizes[] = { "ladder", "exact", NULL }; /* exact: true */
static const char *const batchings[] = { "auto", "always", NULL };     /* always: true */

#define O(f) offsetof(wrk_opts_t, f)
/* Every option: its kind, where it goes, its range and its usage line. */
static const reel_opt_t rows[] = {
    { .name = "broker", .kind = REEL_OPT_STRING, .off = O(broker), .arg = "ENDPOINT",
      .help = "broker worker endpoint (tcp://127.0.0.1:5556); A,B: the two\n"
              "of a standby pair (docs/OPERATIONS.md \"Two brokers\")" },
    { .name = "name", .kind = REEL_OPT_STRING, .off = O(name), .arg = "NAME",
      .help = "worker name and ZeroMQ routing id ([A-Za-z0-9_.:+-], <= 63)" },
    { .name = "weights", .kind = REEL_OPT_STRING, .off = O(weights), .arg = "FILE",
      .help = "transformer weights: a Reel .safetensors or a Wan2.1 release\n"
              "folder, sharded index or diffusers folder (docs/MODEL.md)" },
    { .name = "weights-version", .kind = REEL_OPT_U64, .off = O(weights_version), .ulo = 1, .uhi = INT64_MAX,
      .expect = "an integer >= 1", .arg = "V", .help = "version of those weights (1)" },
    { .name = "backend", .kind = REEL_OPT_SET, .set = set_backend, .expect = "cpu or cuda", .arg = "cpu|cuda",
      .help = "(cpu; an unusable CUDA device falls back to the CPU)" },
    { .name = "no-fallback", .kind = REEL_OPT_FLAG, .off = O(no_fallback),
      .help = "with --backend cuda: an unusable CUDA device is an error (exit 1)" },
    { .name = "device", .kind = REEL_OPT_INT, .off = O(device), .lo = 0, .hi = 1023, .arg = "N",
      .help = "CUDA device ordinal (0)" },
    { .name = "dtype", .kind = REEL_OPT_BOOL_CHOICE, .off = O(bf16), .choices = dtypes, .arg = "f32|bf16",
      .help = "storage of weights and activations (f32; bf16 on CUDA only)" },
    { .name = "streams", .kind = REEL_OPT_INT, .off = O(streams), .lo = 1, .hi = WRK_MAX_STREAMS, .arg = "S",
      .help = "stream threads (2)" },
    { .name = "budget", .kind = REEL_OPT_SET, .set = set_budget, .expect = "bytes with an optional K/M/G suffix",
      .arg = "BYTES", .help = "graph + workspace budget, K/M/G suffixes (0 = unlimited)" },
    { .name = "max-tokens", .kind = REEL_OPT_I64, .off = O(max_tokens), .lo = 0, .hi = (long long)1 << 24,
      .arg = "N",
      .help = "refuse (too_large) a request whose sample has more than N\n"
              "tokens, F x H/2 x W/2 (65536; 0 = no limit): a step cannot\n"
              "be stopped half-way, and attention costs N^2; batched samples\n"
              "share a step only within N tokens together" },
    { .name = "max-inflight", .kind = REEL_OPT_INT, .off = O(max_inflight), .lo = 1, .hi = 4096, .arg = "K",
      .help = "requests the broker may route here at once (S x max(4, N));\n"
              "the worker holds at most 4 x K, queued or running, and\n"
              "answers one past that busy" },
    { .name = "max-held-mb", .kind = REEL_OPT_I64, .off = O(max_held_mb), .lo = 0, .hi = (long long)1 << 24,
      .arg = "MB",
      .help = "MiB of tensors the REQUESTs held keep, all together: one\n"
              "past it is answered busy before its tensors are copied (0 =\n"
              "no bound). Default 2 x K x the most one request of the model\n"
              "keeps (a GEN's 256 MiB, contexts padded to text_len): the K a\n"
              "broker may send at their largest, and as many again ending" },
    { .name = "threads", .kind = REEL_OPT_INT, .off = O(threads), .lo = 0, .hi = 256, .arg = "N",
      .help = "the CPU backend's thread pool, shared by every stream's\n"
              "GEMMs and attention (0: REEL_THREADS, else the cores this\n"
              "process may run on)" },
    { .name = "blas-threads", .kind = REEL_OPT_INT, .off = O(blas_threads), .lo = -1, .hi = 1024, .arg = "N",
      .help = "deprecated: N is --threads N; -1 is --threads cores / streams" },
    { .name = "max-batch", .kind = REEL_OPT_INT, .off = O(max_batch), .lo = 1, .hi = TDIT_MAX_BATCH, .arg = "N",
      .help = "requests a stream steps together as one batch when they\n"
              "share a model, shape and loop kind (cuda 8, cpu 1: each alone)" },
    { .name = "batching", .kind = REEL_OPT_BOOL_CHOICE, .off = O(batch_always), .choices = batchings,
      .arg = "auto|always",
      .help = "batch requests while a batched step costs each of them\n"
              "less than stepping alone, measured as it runs (auto), or\n"
              "whenever two can share a step (always)" },
    { .name = "batch-sizes", .kind = REEL_OPT_BOOL_CHOICE, .off = O(batch_exact), .choices = batch_sizes,
      .arg = "ladder|exact",
      .help = "a batch of n runs padded to the next power of two (ladder:\n"
              "fewer graphs) or as n rows (exact: no padding)" },
    { .name = "prewarm", .kind = REEL_OPT_INT, .off = O(prewarm), .lo = 0, .hi = MSG_MAX_PREWARM, .arg = "K",
      .help = "at start, capture the K keys the broker saw hot lately\n"
              "that this worker will own, in the background while it\n"
              "serves (8; 0: off)" },
    { .name = "policy", .kind = REEL_OPT_SET, .set = set_policy, .expect = "evict or inplace",
      .arg = "evict|inplace", .help = "weight sync policy for captured graphs (evict)" },
    { .name = "sync-mode", .kind = REEL_OPT_BOOL_CHOICE, .off = O(sync_drain), .choices = sync_modes,
      .arg = "steps|drain",
      .help = "apply a sync between any two steps (steps), or only\n"
              "once no request is mid-way, holding new ones (drain:\n"
              "every request runs on one weight version)" },
    { .name = "warmup", .kind = REEL_OPT_INT, .off = O(warmup), .lo = 0, .hi = 1000, .arg = "W",
      .help = "eager calls before a key is captured (2)" },
    { .name = "audit-every", .kind = REEL_OPT_INT, .off = O(audit_every), .lo = 0, .hi = 1000000000, .arg = "N",
      .help = "also run eager on 1 replay in N per graph and compare\n"
              "bitwise; a mismatch evicts the graph (256; 0 = off)" },
    { .name = "heartbeat-ms", .kind = REEL_OPT_INT, .off = O(heartbeat_ms), .lo = 10, .hi = 3600000, .arg = "MS",
      .help = "heartbeat interval (1000)" },
    { .name = "liveness", .kind = REEL_OPT_INT, .off = O(liveness), .lo = 1, .hi = 1000, .arg = "N",
      .help = "silent intervals before reconnecting (3)" },
    { .name = "events-ms", .kind = REEL_OPT_INT, .off = O(events_ms), .lo = 10, .hi = 3600000, .arg = "MS",
      .help = "EVENTS batching interval (200)" },
    { .name = "metrics", .kind = REEL_OPT_STRING, .off = O(metrics), .arg = "ADDR:PORT",
      .help = "serve /metrics (Prometheus), /healthz and /readyz over HTTP\n"
              "there (off by default; e.g. 127.0.0.1:9465)" },
    { .name = "weights-dir", .kind = REEL_OPT_SET, .set = set_weights_dir, .arg = "DIR",
      .help = "a directory a SYNC's weights may be read from (repeat for\n"
              "more, at most 8; default: the directory of --weights).\n"
              "Paths must lie below one, reached without symlinks or '..'" },
    { .name = "key", .kind = REEL_OPT_STRING, .off = O(key), .arg = "FILE",
      .help = "this worker's CURVE key pair, NAME.key (else $REEL_KEY)" },
    { .name = "broker-key", .kind = REEL_OPT_STRING, .off = O(broker_key), .arg = "FILE",
      .help = "the broker's public key, broker.pub (else $REEL_BROKER_KEY)" },
    { .name = "artifacts", .kind = REEL_OPT_STRING, .off = O(artifacts), .arg = "DIR",
      .help = "kernel bundles: each verified (a corrupt one is reported and\n"
              "never loaded), enabled ones promoted per kernel key only\n"
              "after a parity gate on live inputs (docs/ARTIFACTS.md)" },
    { .name = "artifacts-enable", .kind = REEL_OPT_STRING, .off = O(artifacts_enable), .arg = "ID,ID",
      .help = "the allowlist (default: every verified bundle); an id\n"
              "no verified bundle provides stops the start" },
    { .name = "artifact-timing", .kind = REEL_OPT_SET, .set = set_timing, .expect = "off, sync or shadow",
      .arg = "off|sync|shadow", .help = "measure artifacts against native (off)" },
    { .name = "t5", .kind = REEL_OPT_STRING, .off = O(t5), .arg = "FILE",
      .help = "the text encoder (Wan's models_t5_umt5-xxl-enc-bf16.pth,\n"
              "or a safetensors copy): GENs may carry a prompt (with\n"
              "--tokenizer; both default to a release folder's)" },
    { .name = "tokenizer", .kind = REEL_OPT_STRING, .off = O(tokenizer), .arg = "PATH",
      .help = "its tokenizer: spiece.model or the folder holding it" },
    { .name = "vae", .kind = REEL_OPT_STRING, .off = O(vae), .arg = "FILE",
      .help = "the VAE (Wan2.1_VAE.pth or a safetensors copy): GENs may\n"
              "ask for output frames or video" },
    { .name = "text-cache", .kind = REEL_OPT_SET, .set = set_text_cache, .expect = "bytes with an optional K/M/G suffix",
      .arg = "BYTES", .help = "encoded prompts kept, LRU (64M); counts against --budget" },
    { .name = "attention", .kind = REEL_OPT_SET, .set = set_attention, .expect = "auto, fused or decomposed",
      .arg = "auto|fused|decomposed",
      .help = "attention: on CUDA in BF16 cuDNN's fused SDPA where it loads\n"
              "(auto, fused) or the decomposition; decomposed is the reference\n"
              "path on the CPU too (default: $REEL_ATTN, else auto)" },
    { .name = "lora", .kind = REEL_OPT_FLAG, .off = O(lora),
      .help = "take LoRA syncs (SYNC with base_version): keeps a host\n"
              "copy of the base weights, counted against --budget" },
    { .name = "help", .short_name = 'h', .kind = REEL_OPT_FLAG, .off = O(help) }, /* not listed */
};
#undef O

#define NROWS (sizeof rows / sizeof rows[0])

const char *wrk_usage(void) {
    static char text[8192];
    if (!text[0]) {
        char buf[sizeof text] = "usage: reel-worker --name NAME --weights W.safetensors [options]\n";
        reel_opts_usage(rows, NROWS, 24, buf, sizeof buf);
        memcpy(text, buf, sizeof text);
    }
    return text;
}

int wrk_opts_parse(int argc, char **argv, wrk_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->broker = "tcp://127.0.0.1:5556";
    o->weights_version = 1;
    o->backend = KERN_BACKEND_CPU;
    o->streams = 2;
    o->max_tokens = WRK_MAX_TOKENS;
    o->max_inflight = -1;
    o->max_held_mb = -1;
    o->max_batch = 0; /* the backend's: below */
    o->blas_threads = 0;
    o->threads = 0;
    o->prewarm = 8;
    o->policy = CAP_POLICY_EVICT;
    o->warmup = 2;
    o->audit_every = 256;
    o->heartbeat_ms = 1000;
    o->liveness = 3;
    o->events_ms = 200;
    o->text_cache = (size_t)64 << 20;
    int rest = argc;
    if (reel_opts_parse(rows, NROWS, o, argc, argv, &rest) != 0) return -1;
    if (o->help) return 0;
    if (rest < argc) return reel_fail(REEL_E_INVALID, "unexpected argument '%s'", argv[rest]);
    if (!o->name) return reel_fail(REEL_E_INVALID, "--name NAME is required");
    if (!reel_name_valid(o->name, WRK_NAME_MAX))
        return reel_fail(REEL_E_INVALID, "--name: '%s' must be 1..%d characters of [A-Za-z0-9_.:+-]", o->name,
                         WRK_NAME_MAX - 1);
    if (!o->weights) return reel_fail(REEL_E_INVALID, "--weights W.safetensors is required");
    if (o->artifacts_enable && !o->artifacts)
        return reel_fail(REEL_E_INVALID, "--artifacts-enable needs --artifacts DIR");
    if (o->no_fallback && o->backend != KERN_BACKEND_CUDA)
        return reel_fail(REEL_E_INVALID, "--no-fallback is for --backend cuda");
    /* Batching pays where a step costs more than its arithmetic (CUDA:
     * launches, small GEMMs); on the CPU a batch costs its requests about
     * what they cost alone (docs/BENCH.md), so it is asked for there. */
    if (!o->max_batch) o->max_batch = o->backend == KERN_BACKEND_CUDA ? 8 : 1;
    if (o->max_inflight < 0) o->max_inflight = o->streams * (o->max_batch > 4 ? o->max_batch : 4);
    return 0;
}
