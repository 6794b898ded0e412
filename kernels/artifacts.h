/* artifacts.h -- optimised kernels shipped as verified bundles, enabled by
 * an allowlist, promoted per kernel key only after a parity gate, and timed
 * honestly against the native kernels they replace (docs/ARTIFACTS.md).
 *
 * Lifecycle of a set:
 *   kern_artifacts_scan(root)      every bundle under root is verified (its
 *                                  manifest schema-checked, the sha256 of
 *                                  every file compared, the ABI checked);
 *                                  a corrupt bundle is reported, never loaded
 *   kern_artifacts_enable(ids)     the allowlist narrows the verified
 *                                  bundles; an id no verified bundle
 *                                  provides is an error
 *   kern_artifacts_install(timing) dlopens the enabled bundles (re-hashing
 *                                  the object through the descriptor it
 *                                  loads) and routes kern_dispatch through
 *                                  the set
 *   kern_artifacts_destroy         uninstalls and frees
 *
 * Dispatch. A launch of an op some enabled artifact replaces, at sizes its
 * manifest accepts, on a backend arch it names, goes through the artifact's
 * state at that *kernel key* (artifact, the capture key the launch runs
 * under (kern_artifacts_set_scope), op, dtype, arch and every size of the
 * argument block: each capture key is judged on its own):
 *   undecided  the next eager launch runs in shadow: the artifact into a
 *              shadow buffer, the native kernel into the real output, both
 *              on the same live inputs; the manifest's parity rule compares
 *              them. Pass: promoted. Fail: demoted (reason artifact_parity).
 *              Either way the call serves the native result. While a
 *              stream captures, an undecided key runs (is captured) native.
 *   promoted   the artifact runs, eager or captured into a graph like any
 *              kernel; a failure at run time (eager or in a replay) falls
 *              back to the native kernel on the same block and is counted;
 *              it never demotes the artifact.
 *   demoted    native from then on, counted; the next enabled artifact for
 *              the op (manifest id order) gets its own chance.
 *   failed     three runtime failures in a row before any parity result:
 *              native from then on (reason runtime_failure).
 *   ineligible the artifact's workspace contract asks more scratch than the
 *              native kernel's at the same block (a step workspace is sized
 *              from native contracts): native from then on.
 * Timing (kern_art_timing_t): OFF costs one branch per launch; SYNC
 * synchronizes the stream around every eager artifact launch and times it;
 * SHADOW runs every eager launch of a promoted artifact in shadow (both
 * kernels, synchronized and timed, compared by the parity rule: a failure
 * demotes and serves native) and serves the artifact's result. Replays of a
 * graph are not seen by the dispatcher, but on the CPU backend the graph's
 * trampoline runs on the replaying thread and applies SYNC and SHADOW to
 * every replay too (a shadow failure there demotes the key: its later
 * replays run native). On CUDA replays are timed as whole steps by the
 * capture cache.
 *
 * Threads: any stream thread may dispatch through an installed set (its
 * tables are guarded by one mutex, never held while a kernel runs: debug
 * builds check it, artifact_impl.h).
 * Install, uninstall and destroy run when no stream dispatches. A graph
 * captured while a set was installed holds the set's kernels: destroy the
 * graph before the set. A loaded object stays mapped for the life of the
 * process (a graph may hold its code's addresses), so nothing dlcloses it.
 *
 * Convention: 0 / -1 with a message in reel_err_text(), NULL constructors. */
#ifndef REEL_KERNELS_ARTIFACTS_H
#define REEL_KERNELS_ARTIFACTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "backend.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_ART_ID_MAX 64       /* bytes incl. NUL: id, region */
#define KERN_ART_VERSION_MAX 32
#define KERN_ART_FILE_MAX 128    /* a file name inside a bundle */
#define KERN_ART_MAX_FILES 16
#define KERN_ART_MAX_ARCH 8
#define KERN_ART_ARCH_MAX 32
#define KERN_ART_MAX_DIMS 6      /* sizes of one argument block */
#define KERN_ART_MANIFEST_MAX (64 * 1024)
#define KERN_ART_MAX_BUNDLES 64
#define KERN_ART_KEY_MAX 160     /* the key text, e.g. "gemm_gelu F32 cpu-avx2 M=32 N=128 K=64 bias=1" */

typedef enum { KERN_PARITY_BYTE_EQUAL = 0, KERN_PARITY_MAX_REL } kern_parity_kind_t;

typedef struct {
    char name[16];               /* a size of the op's argument block: "M", "nk", ... */
    int64_t min, max;            /* inclusive */
} kern_art_range_t;

typedef struct {
    char name[KERN_ART_FILE_MAX];
    char sha256[65];             /* lowercase hex */
} kern_art_file_t;

/* manifest.json, parsed and schema-checked (docs/ARTIFACTS.md). */
typedef struct {
    char id[KERN_ART_ID_MAX];
    char version[KERN_ART_VERSION_MAX];
    char region[KERN_ART_ID_MAX];   /* where the op must sit (KERN_ART_REGIONS, "ffn"); "" = anywhere */
    kern_op_t op;                   /* the registry op it replaces */
    kern_backend_kind_t backend;
    char arch[KERN_ART_MAX_ARCH][KERN_ART_ARCH_MAX]; /* "any", "cpu-avx2", "sm_90" ... */
    int n_arch;
    unsigned dtypes;                /* bit (1 << kern_dtype_t) per dtype */
    kern_art_range_t shapes[KERN_ART_MAX_DIMS];
    int n_shapes;
    kern_parity_kind_t parity;
    double max_rel;                 /* KERN_PARITY_MAX_REL: 0 < max_rel <= 1 */
    uint32_t abi;
    char object[KERN_ART_FILE_MAX]; /* the shared object, one of files */
    kern_art_file_t files[KERN_ART_MAX_FILES]; /* every file but manifest.json */
    int n_files;
} kern_art_manifest_t;

/* Parses and schema-checks a manifest of len bytes (not NUL-terminated).
 * Unknown keys, duplicate keys, wrong types, out-of-range values, an op no
 * artifact may replace, a size the op does not have, a file name with a
 * slash or a leading dot, a malformed digest: each is -1 with a message
 * naming the field; *out is then unspecified. Never loads anything. */
int kern_art_manifest_parse(const char *text, size_t len, kern_art_manifest_t *out);
/* True when the op can be replaced by an artifact (it writes one output
 * buffer that no argument of its block must alias for the shadow run). */
bool kern_art_op_supported(kern_op_t op);
/* Parses "byte_equal" / "max_rel=1e-5". -1 with a message. */
int kern_art_parity_parse(const char *s, kern_parity_kind_t *kind, double *max_rel);

typedef enum {
    KERN_ART_TIMING_OFF = 0,
    KERN_ART_TIMING_SYNC,
    KERN_ART_TIMING_SHADOW,
} kern_art_timing_t;
/* "off", "sync", "shadow"; parse returns -1 with a message otherwise. */
const char *kern_art_timing_name(kern_art_timing_t t);
int kern_art_timing_parse(const char *s, kern_art_timing_t *out);

typedef struct kern_artifacts kern_artifacts_t;

/* What the scan found in one bundle. */
typedef struct {
    const char *bundle;             /* directory name under the root */
    const char *path;               /* root/bundle */
    bool parsed;                    /* manifest read: m is valid */
    bool verified;                  /* manifest, hashes and ABI all good */
    bool enabled, loaded;
    const char *error;              /* why it is refused or failed to load; "" if fine */
    const kern_art_manifest_t *m;
} kern_art_bundle_t;

/* Scans every directory under root (sorted by name; hidden ones skipped)
 * as a bundle and verifies it. Never loads anything. Bad bundles are not a
 * failure: each is reported in its kern_art_bundle_t (error names the
 * bundle and the cause) and stays unusable. Two bundles with one id are
 * both refused. NULL with a message only when root cannot be read, holds
 * more than KERN_ART_MAX_BUNDLES bundles, or memory runs out. */
kern_artifacts_t *kern_artifacts_scan(const char *root);
/* Uninstalls (if installed) and frees; NULL-safe; sets *set = NULL. */
void kern_artifacts_destroy(kern_artifacts_t **set);

size_t kern_artifacts_count(const kern_artifacts_t *set);
/* Bundle i (0 <= i < count), valid until destroy. */
kern_art_bundle_t kern_artifacts_bundle(const kern_artifacts_t *set, size_t i);
/* Bundles refused by the scan. */
size_t kern_artifacts_refused(const kern_artifacts_t *set);

/* The allowlist: enables exactly the bundles named in ids (n of them), or
 * every verified bundle when ids is NULL. An id that no bundle provides, or
 * one whose bundle failed verification, is -1 with a message naming it
 * (and nothing is enabled): an artifact asked for and silently absent would
 * read as "changes nothing". Before install only. */
int kern_artifacts_enable(kern_artifacts_t *set, const char *const *ids, size_t n);
/* The same from "ID,ID,..." (empty items refused). */
int kern_artifacts_enable_list(kern_artifacts_t *set, const char *csv);

/* Loads every enabled bundle and routes kern_dispatch through the set. A
 * bundle that fails to load (dlopen, symbols, the object's ABI, its
 * registrations, its object changed since the scan) is reported in its
 * bundle entry and left out; that is -1 (and nothing installed) only when
 * it was named in the allowlist. -1 too when another set is installed. */
int kern_artifacts_install(kern_artifacts_t *set, kern_art_timing_t timing);
/* Stops routing; keys and their statistics stay. Can't fail. */
void kern_artifacts_uninstall(kern_artifacts_t *set);
/* The installed set, or NULL. */
kern_artifacts_t *kern_artifacts_installed(void);

/* Events, for logs and the catalog. Called on the dispatching thread with
 * no artifact lock held (debug builds check it), so the listener may call
 * into the set; key and reason valid during the call only. */
typedef enum {
    KERN_ART_EV_PROMOTED,           /* parity passed at a key */
    KERN_ART_EV_DEMOTED,            /* parity failed (reason artifact_parity) */
    KERN_ART_EV_FAILED,             /* runtime failures before any parity result */
    KERN_ART_EV_INELIGIBLE,         /* its scratch exceeds the native contract */
} kern_art_event_kind_t;
typedef struct {
    kern_art_event_kind_t kind;
    const char *id, *key, *reason;
} kern_art_event_t;
typedef void (*kern_art_event_fn)(void *user, const kern_art_event_t *ev);
void kern_artifacts_on_event(kern_artifacts_t *set, kern_art_event_fn fn, void *user);

/* One kernel key's state and counters. */
typedef enum {
    KERN_ART_UNDECIDED = 0, KERN_ART_PROMOTED, KERN_ART_DEMOTED, KERN_ART_FAILED,
    KERN_ART_INELIGIBLE,
} kern_art_state_t;
const char *kern_art_state_name(kern_art_state_t s);

typedef struct {
    uint64_t calls;          /* launches of the artifact, eager or captured */
    uint64_t native_calls;   /* launches at its keys that ran native instead */
    uint64_t parity_pass, parity_fail;
    uint64_t fallbacks;      /* runtime failures that ran the native kernel instead */
    uint64_t timed;          /* calls timed against native (shadow, and the parity run) */
    double native_s, artifact_s; /* summed over the timed calls */
    uint64_t sync_timed;     /* SYNC: artifact launches timed alone */
    double sync_s;
    /* native/artifact per timed call: mean, standard deviation, extremes */
    double speedup_mean, speedup_sd, speedup_min, speedup_max;
    double max_rel_seen;     /* largest relative difference a comparison saw */
} kern_art_counts_t;

typedef struct {
    char id[KERN_ART_ID_MAX];
    char key[KERN_ART_KEY_MAX];
    kern_art_state_t state;
    char reason[192];        /* why demoted / failed / ineligible; "" otherwise */
    kern_art_counts_t n;
} kern_art_key_stats_t;

/* Copies up to max keys (all artifacts, in creation order) into out;
 * returns how many exist. */
size_t kern_artifacts_keys(kern_artifacts_t *set, kern_art_key_stats_t *out, size_t max);
/* The counters of artifact `id` summed over its keys, the speedup fields
 * pooled over every timed call of every key; *promoted and *demoted (may
 * be NULL) count its keys in those states. -1 with a message if no bundle
 * has that id. */
int kern_artifacts_totals(kern_artifacts_t *set, const char *id, kern_art_counts_t *out,
                          int *promoted, int *demoted);

/* Writes the bundles (list), or with keys the per-artifact report (calls,
 * parity passes and failures, fallbacks, speedup with spread) and every
 * key, as text or JSON. 0, or -1 on a write error. */
int kern_artifacts_print(kern_artifacts_t *set, FILE *out, bool keys, bool json);

/* Regions: where in the network a launch sits. The model names them as it
 * runs (kern_artifacts_set_region: a static string, thread-local; returns
 * the previous one, to restore), and a manifest's "region" narrows its
 * artifact to launches there. The names (KERN_ART_REGIONS):
 *   embed.time, embed.text, embed.patch       (under "embed")
 *   block.self_attn, block.cross_attn, block.ffn (under "block")
 *   head
 *   attention = block.self_attn and block.cross_attn; ffn = block.ffn
 * A manifest region matches a launch region equal to it or below it
 * ("block" matches block.ffn), and the two groups theirs; no region in the
 * manifest matches every launch, one outside every region too. */
#define KERN_ART_REGIONS                                                                             \
    "embed", "embed.time", "embed.text", "embed.patch", "block", "block.self_attn", "block.cross_attn", \
        "block.ffn", "head", "attention", "ffn"
const char *kern_artifacts_set_region(const char *region);
/* Whether a manifest's region (`want`, "" = anywhere) matches a launch in
 * region `at` (NULL or "" = outside every region). */
bool kern_art_region_matches(const char *want, const char *at);

/* The capture key the calling thread's launches belong to, by its hash
 * (the capture cache sets it around each call, cap_dispatch); 0 = none.
 * Returns the previous one, to restore. Keys are per capture key: each
 * capture key's launches get their own shadow run and verdict at each
 * kernel key (a kernel key's text then ends " @HASH", HASH the capture
 * key's 16 hex digits as in the catalog). Can't fail. */
uint64_t kern_artifacts_set_scope(uint64_t capture_key_hash);

/* Parity decisions (promotions, demotions) made on the calling thread so
 * far: the capture cache compares them before and after a call to learn
 * that a gate decided during it. Can't fail. */
void kern_artifacts_thread_decisions(uint64_t *promoted, uint64_t *demoted);

#ifdef __cplusplus
}
#endif
#endif
