/* wan_ckpt.c -- Wan2.1 checkpoints read as Reel files (see wan_ckpt.h).
 *
 * In stages, so nothing is read before it is judged: find the files
 * (a file, an index, a folder, a pipeline root) and read every file's
 * header through its digest; judge the config (the file's own, config.json
 * or the one expected) and the headers against it (total size, every
 * tensor's name and shape, the index's word for every tensor:
 * wan_names.c); then read every file's data once into one buffer, still
 * through its digest, and give the buffer a Reel header (st_adopt: no
 * copy). */
#include "model/wan_ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/sha256.h"

#define WAN_MAX_SHARDS 1024
#define WAN_MAX_INDEX ((size_t)16 << 20)   /* the 14B release's index is 100 KB */
#define WAN_MAX_JSON ((size_t)1 << 20)     /* config.json, model_index.json */

/* ---- files --------------------------------------------------------------------------- */

/* One safetensors file of the checkpoint, hashed as it is read. */
typedef struct {
    char name[NAME_MAX + 1];  /* in the checkpoint's folder */
    char shown[PATH_MAX];     /* in messages */
    int fd;
    st_header_t *hdr;
    reel_sha256_hook_t hook;
    uint64_t size, base;      /* the file's size; where its data goes in the buffer */
} part_t;

typedef struct {
    wan_opts_t o;
    const char *shown;            /* the path as given */
    char where[PATH_MAX];         /* the checkpoint's folder, as shown */
    char prefix[16];              /* "transformer/" in a pipeline */
    bool given_file;              /* a file (or index) was named, not a folder */
    bool pipeline;
    int dir;                      /* the checkpoint's folder */
    char single[NAME_MAX + 1];    /* its one file, or "" */
    char index_name[NAME_MAX + 1]; /* its index, or "" */
    int pre_fd;                   /* the file named, opened already; -1 */
    part_t *parts;
    size_t n_parts;
    /* judged */
    json_t *index;                /* the index's JSON; NULL without one */
    unsigned char *index_bytes;   /* and its bytes (hashed into the identity) */
    size_t index_len;
    bool reel;                    /* one file with Reel's metadata */
    const char *at;               /* what messages about the whole name */
    item_t *items;                /* every tensor of every file */
    size_t n_items;
    const char **part_names;      /* parts[i].shown */
    match_t m;
    uint64_t data_total, tensor_bytes, total; /* the files' data; their tensors; the buffer */
    unsigned char *data;          /* the buffer (NULL with no_data) */
} ctx_t;

struct wan_ckpt {
    wan_layout_t layout;
    tdit_config_t cfg;
    st_file_t *file;
    char identity[65];
    wan_file_t *files;
    size_t n_files;
    wan_file_t index;
    bool has_index;
    wan_summary_t sum;
};

static void shown_in(const ctx_t *x, const char *name, char *out, size_t len) {
    if (x->given_file && !strcmp(name, x->single[0] ? x->single : x->index_name)) snprintf(out, len, "%s", x->shown);
    else if (snprintf(out, len, "%s/%s", x->where, name) >= (int)len) out[len - 1] = '\0'; /* shown only */
}

/* openat under the checkpoint's rules; -1 with a message, -2 (no message)
 * when missing_ok and it is not there. */
static int open_in(ctx_t *x, int dir, const char *name, int flags, bool missing_ok) {
    int fd = openat(dir, name, flags | O_CLOEXEC | O_NOCTTY | (x->o.nofollow ? O_NOFOLLOW : 0));
    if (fd >= 0) return fd;
    int e = errno;
    if (missing_ok && e == ENOENT) return -2;
    char s[PATH_MAX];
    shown_in(x, name, s, sizeof s);
    reel_fail(wan_errno_code(e), "%s: cannot open: %s%s", s, strerror(e),
              x->o.nofollow && (e == ELOOP || e == ENOTDIR) ? " (symlinks are not followed)" : "");
    return -1;
}

/* A small JSON file of the folder (config.json, an index), at most max
 * bytes, as bytes (*buf, malloc'd; may be NULL) and parsed. fd: opened
 * already, or -1. NULL with *absent when missing_ok and not there. */
static json_t *read_json(ctx_t *x, int fd, const char *name, size_t max, bool missing_ok, bool *absent,
                         unsigned char **buf, size_t *len) {
    char s[PATH_MAX];
    shown_in(x, name, s, sizeof s);
    if (absent) *absent = false;
    if (buf) *buf = NULL;
    if (fd < 0 && (fd = open_in(x, x->dir, name, O_RDONLY | O_NONBLOCK, missing_ok)) < 0) {
        if (fd == -2 && absent) *absent = true;
        return NULL;
    }
    struct stat sb;
    unsigned char *b = NULL;
    json_t *j = NULL;
    size_t n = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        reel_fail(REEL_E_INVALID, "%s: not a regular file", s);
        goto out;
    }
    if ((uint64_t)sb.st_size > max) {
        reel_fail(REEL_E_LIMIT, "%s: %lld bytes, more than the %zu a %s may have", s, (long long)sb.st_size, max,
                  max == WAN_MAX_INDEX ? "index" : "config");
        goto out;
    }
    if (!(b = malloc((size_t)sb.st_size + 1))) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory", s);
        goto out;
    }
    while (n < (size_t)sb.st_size) {
        ssize_t r = pread(fd, b + n, (size_t)sb.st_size - n, (off_t)n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            reel_fail(REEL_E_IO, "%s: read failed: %s", s, r < 0 ? strerror(errno) : "file shrank");
            goto out;
        }
        n += (size_t)r;
    }
    json_error_t je;
    if (!(j = json_loadb((const char *)b, n, JSON_REJECT_DUPLICATES, &je)))
        reel_fail(REEL_E_INVALID, "%s: not valid JSON: %s (line %d, column %d)", s, je.text, je.line, je.column);
    else if (!json_is_object(j)) {
        reel_fail(REEL_E_INVALID, "%s: not a JSON object", s);
        json_decref(j);
        j = NULL;
    }
out:
    close(fd);
    if (j && buf) {
        *buf = b;
        *len = n;
    } else {
        free(b);
    }
    return j;
}

/* ---- locating the files ------------------------------------------------------------- */

typedef struct {
    bool model_index, transformer, st_default, idx_default;
    char st_one[NAME_MAX + 1], idx_one[NAME_MAX + 1], pth_one[NAME_MAX + 1];
    int n_st, n_idx;
    char seen[512];           /* a few names, for the message */
} listing_t;

static int list_folder(ctx_t *x, listing_t *l) {
    memset(l, 0, sizeof *l);
    int fd = fcntl(x->dir, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0) close(fd);
        return reel_fail(wan_errno_code(e), "%s: cannot list: %s", x->where, strerror(e));
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (n[0] == '.') continue;
        if (!strcmp(n, "model_index.json")) l->model_index = true;
        else if (!strcmp(n, "transformer")) l->transformer = true;
        else if (wan_ends_with(n, ".safetensors.index.json")) {
            if (!strcmp(n, "diffusion_pytorch_model.safetensors.index.json")) l->idx_default = true;
            snprintf(l->idx_one, sizeof l->idx_one, "%s", n);
            l->n_idx++;
        } else if (wan_ends_with(n, ".safetensors")) {
            if (!strcmp(n, "diffusion_pytorch_model.safetensors")) l->st_default = true;
            snprintf(l->st_one, sizeof l->st_one, "%s", n);
            l->n_st++;
        } else {
            if (!l->pth_one[0] && (wan_ends_with(n, ".pth") || wan_ends_with(n, ".pt") || wan_ends_with(n, ".bin")))
                snprintf(l->pth_one, sizeof l->pth_one, "%s", n); /* named if nothing else is here */
            continue;
        }
        if (strlen(l->seen) + strlen(n) + 3 < sizeof l->seen)
            snprintf(l->seen + strlen(l->seen), sizeof l->seen - strlen(l->seen), "%s%s", l->seen[0] ? ", " : "", n);
    }
    closedir(d);
    return 0;
}

/* The checkpoint in folder x->dir: a pipeline root (once), an index or a
 * file. */
static int in_folder(ctx_t *x) {
    listing_t l;
    if (list_folder(x, &l) != 0) return -1;
    bool weights_here = l.n_st || l.n_idx;
    if (!x->pipeline && (l.model_index || (!weights_here && l.transformer))) {
        if (l.model_index) {
            json_t *mi = read_json(x, -1, "model_index.json", WAN_MAX_JSON, false, NULL, NULL, NULL);
            if (!mi) return -1;
            const char *cls = json_string_value(json_object_get(mi, "_class_name"));
            const json_t *t2 = json_object_get(mi, "transformer_2");
            int rc = 0;
            if (cls && strcmp(cls, "WanPipeline") && strcmp(cls, "WanVideoToVideoPipeline"))
                rc = reel_fail(REEL_E_UNSUPPORTED,
                               "%s/model_index.json: pipeline '%.64s' is not a Wan text-to-video "
                               "pipeline (WanPipeline)",
                               x->where, cls);
            else if (t2 && json_is_array(t2) && json_array_size(t2) && !json_is_null(json_array_get(t2, 0)))
                rc = reel_fail(REEL_E_UNSUPPORTED,
                               "%s/model_index.json: two transformers (transformer_2): a two-expert "
                               "pipeline; name one expert's folder",
                               x->where);
            json_decref(mi);
            if (rc) return -1;
            if (!l.transformer)
                return reel_fail(REEL_E_NOT_FOUND, "%s: a pipeline root without transformer/", x->where);
        }
        int sub = open_in(x, x->dir, "transformer", O_RDONLY | O_DIRECTORY, false);
        if (sub < 0) return -1;
        close(x->dir);
        x->dir = sub;
        x->pipeline = true;
        snprintf(x->prefix, sizeof x->prefix, "transformer/");
        size_t n = strlen(x->where);
        snprintf(x->where + n, sizeof x->where - n, "/transformer");
        return in_folder(x);
    }
    if (l.st_default) snprintf(x->single, sizeof x->single, "diffusion_pytorch_model.safetensors");
    else if (l.idx_default) snprintf(x->index_name, sizeof x->index_name, "diffusion_pytorch_model.safetensors.index.json");
    else if (l.n_idx == 1) snprintf(x->index_name, sizeof x->index_name, "%s", l.idx_one);
    else if (l.n_idx == 0 && l.n_st == 1) snprintf(x->single, sizeof x->single, "%s", l.st_one);
    else if (weights_here)
        return reel_fail(REEL_E_INVALID, "%s: several checkpoints (%s): name the file or the index", x->where, l.seen);
    else
        return reel_fail(REEL_E_NOT_FOUND, "%s: no safetensors file or index (*.safetensors.index.json) in this "
                         "folder%s%s%s", x->where, l.pth_one[0] ? " (only PyTorch checkpoints such as " : "", l.pth_one,
                         l.pth_one[0] ? ": a DiT is read from safetensors, as Wan2.1 ships it)" : "");
    return 0;
}

static int locate(ctx_t *x, int dirfd, const char *name) {
    if (!name || !*name) {
        if ((x->dir = fcntl(dirfd, F_DUPFD_CLOEXEC, 0)) < 0)
            return reel_fail(REEL_E_IO, "%s: %s", x->shown, strerror(errno));
        return in_folder(x);
    }
    if (!wan_plain_name(name)) return reel_fail(REEL_E_INVALID, "%s: not one plain file name", name);
    int fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | (x->o.nofollow ? O_NOFOLLOW : 0));
    if (fd < 0) {
        int e = errno;
        return reel_fail(wan_errno_code(e), "%s: cannot open: %s%s", x->shown, strerror(e),
                         x->o.nofollow && (e == ELOOP || e == ENOTDIR) ? " (symlinks are not followed)" : "");
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return reel_fail(REEL_E_IO, "%s: cannot stat: %s", x->shown, strerror(errno));
    }
    if (S_ISDIR(sb.st_mode)) {
        x->dir = fd;
        return in_folder(x);
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return reel_fail(REEL_E_INVALID, "%s: not a regular file", x->shown);
    }
    if ((x->dir = fcntl(dirfd, F_DUPFD_CLOEXEC, 0)) < 0) {
        close(fd);
        return reel_fail(REEL_E_IO, "%s: %s", x->shown, strerror(errno));
    }
    x->given_file = true;
    x->pre_fd = fd;
    /* where: the folder the path names the file in */
    const char *slash = strrchr(x->shown, '/');
    if (!slash) snprintf(x->where, sizeof x->where, ".");
    else snprintf(x->where, sizeof x->where, "%.*s", (int)(slash == x->shown ? 1 : slash - x->shown), x->shown);
    if (wan_ends_with(name, ".json")) {
        if (!wan_ends_with(name, ".index.json"))
            return reel_fail(REEL_E_INVALID,
                             "%s: a JSON file but no safetensors index (*.safetensors.index.json): "
                             "name the folder, the index or the weights",
                             x->shown);
        snprintf(x->index_name, sizeof x->index_name, "%s", name);
    } else {
        snprintf(x->single, sizeof x->single, "%s", name);
    }
    return 0;
}

/* ---- reading ------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The shards an index names, checked and sorted into x->parts. */
static int index_parts(ctx_t *x, const json_t *idx) {
    char s[PATH_MAX];
    shown_in(x, x->index_name, s, sizeof s);
    const json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm)) return reel_fail(REEL_E_INVALID, "%s: no \"weight_map\" object", s);
    size_t n = json_object_size(wm);
    if (n == 0) return reel_fail(REEL_E_INVALID, "%s: an empty weight_map", s);
    const char **names = malloc(n * sizeof *names);
    if (!names) return reel_fail(REEL_E_NOMEM, "%s: out of memory", s);
    size_t k = 0;
    const char *t;
    const json_t *v;
    int rc = 0;
    json_object_foreach((json_t *)wm, t, v) {
        const char *f = json_string_value(v);
        if (!f) {
            rc = reel_fail(REEL_E_INVALID, "%s: weight_map[\"%.96s\"] is not a file name", s, t);
            break;
        }
        if (!wan_plain_name(f)) {
            rc = reel_fail(REEL_E_INVALID, "%s: weight_map puts '%.96s' in '%.128s': not a file in the index's folder",
                           s, t, f);
            break;
        }
        names[k++] = f;
    }
    if (rc == 0) {
        qsort(names, k, sizeof *names, cmp_str);
        size_t u = 0;
        for (size_t i = 0; i < k; i++)
            if (!u || strcmp(names[u - 1], names[i])) names[u++] = names[i];
        if (u > WAN_MAX_SHARDS)
            rc = reel_fail(REEL_E_LIMIT, "%s: %zu shards, more than %d", s, u, WAN_MAX_SHARDS);
        else if (!(x->parts = calloc(u, sizeof *x->parts)))
            rc = reel_fail(REEL_E_NOMEM, "%s: out of memory", s);
        else {
            for (size_t i = 0; i < u; i++) {
                snprintf(x->parts[i].name, sizeof x->parts[i].name, "%s", names[i]);
                x->parts[i].fd = -1;
            }
            x->n_parts = u;
        }
    }
    free(names);
    return rc;
}

/* Opens every part and reads its header through its digest. */
static int read_headers(ctx_t *x) {
    for (size_t i = 0; i < x->n_parts; i++) {
        part_t *p = &x->parts[i];
        shown_in(x, p->name, p->shown, sizeof p->shown);
        if (!(p->hook.h = reel_sha256_new())) return reel_fail(REEL_E_NOMEM, "out of memory");
        p->hook.stop = x->o.stop;
        if (x->pre_fd >= 0 && x->single[0] && !strcmp(p->name, x->single)) {
            p->fd = x->pre_fd;
            x->pre_fd = -1;
        } else if ((p->fd = open_in(x, x->dir, p->name, O_RDONLY | O_NONBLOCK, false)) < 0) {
            return -1;
        }
        struct stat sb;
        if (fstat(p->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
            return reel_fail(REEL_E_INVALID, "%s: not a regular file", p->shown);
        p->size = (uint64_t)sb.st_size;
        if (!(p->hdr = st_header_read(p->fd, p->shown, reel_sha256_hook, &p->hook)))
            return wan_file_problem(p->hook.stopped);
    }
    return 0;
}

static void ctx_free(ctx_t *x) {
    for (size_t i = 0; i < x->n_parts; i++) {
        part_t *p = &x->parts[i];
        if (p->fd >= 0) close(p->fd);
        st_header_free(&p->hdr);
        reel_sha256_free(&p->hook.h);
    }
    free(x->parts);
    if (x->pre_fd >= 0) close(x->pre_fd);
    if (x->dir >= 0) close(x->dir);
    json_decref(x->index);
    free(x->index_bytes);
    free(x->items);
    free(x->part_names);
    wan_match_free(&x->m);
    free(x->data);
}

/* Is a header Reel's own (its config in __metadata__)? */
static bool reel_meta(const st_header_t *h) { return st_header_meta(h, "config") || st_header_meta(h, "dim"); }

/* Too much data for the model (max; 0: no bound), or, for a peer's file
 * (max_data given), too few tensor bytes to hold it. */
static int judge_size(ctx_t *x, uint64_t max) {
    if (max && x->data_total > max)
        return reel_fail(REEL_E_UNSUPPORTED, "%s: %llu data bytes, more than the model's %llu", x->at,
                         (unsigned long long)x->data_total, (unsigned long long)max);
    if (x->o.max_data && x->tensor_bytes < x->o.max_data / 2)
        return reel_fail(REEL_E_UNSUPPORTED,
                         "%s: %zu tensors of %llu bytes cannot hold the model (%llu bytes in F32)",
                         x->at, x->n_items, (unsigned long long)x->tensor_bytes, (unsigned long long)x->o.max_data);
    return 0;
}

static void fill_file(wan_file_t *f, const ctx_t *x, const char *name, uint64_t bytes, const char *hex) {
    if (x->given_file) snprintf(f->name, sizeof f->name, "%s", name);
    else snprintf(f->name, sizeof f->name, "%s%s", x->prefix, name);
    f->bytes = bytes;
    snprintf(f->sha256, sizeof f->sha256, "%s", hex);
}

/* Stage 1: the files, each header read through its digest. */
static int find_files(ctx_t *x, int dirfd, const char *name) {
    if (locate(x, dirfd, name) != 0) return -1;
    if (x->index_name[0]) {
        int fd = x->pre_fd;
        x->pre_fd = -1;
        if (!(x->index = read_json(x, fd, x->index_name, WAN_MAX_INDEX, false, NULL, &x->index_bytes, &x->index_len)) ||
            index_parts(x, x->index) != 0)
            return -1;
    } else {
        if (!(x->parts = calloc(1, sizeof *x->parts))) return reel_fail(REEL_E_NOMEM, "out of memory");
        snprintf(x->parts[0].name, sizeof x->parts[0].name, "%s", x->single);
        x->parts[0].fd = -1;
        x->n_parts = 1;
    }
    if (read_headers(x) != 0) return -1;
    x->reel = !x->index_name[0] && reel_meta(x->parts[0].hdr);
    x->at = x->given_file && !x->index_name[0] ? x->parts[0].shown : x->shown;
    return 0;
}

/* Stage 2: the config -- a Reel file's own, config.json beside the files,
 * or the one expected -- and, with an expectation, the same network. */
static int judge_config(ctx_t *x, tdit_config_t *c) {
    if (x->reel) {
        if (tdit_config_from_header(x->parts[0].hdr, c) != 0)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: %s", x->parts[0].shown, reel_err_text());
    } else {
        bool absent, diffusers;
        char where[PATH_MAX];
        if (snprintf(where, sizeof where, "%s/config.json", x->where) >= (int)sizeof where) where[sizeof where - 1] = '\0';
        json_t *j = read_json(x, -1, "config.json", WAN_MAX_JSON, true, &absent, NULL, NULL);
        int rc = j ? wan_json_config(j, where, c, &diffusers) : 0;
        json_decref(j);
        if (rc != 0 || (!j && !absent)) return -1;
        if (!j && !x->o.expect)
            return reel_fail(REEL_E_INVALID,
                             "%s: no Reel metadata and no config.json beside it: its config is unknown",
                             x->at);
        if (!j) *c = *x->o.expect;
    }
    if (x->o.expect && !tdit_config_same_network(c, x->o.expect))
        return reel_fail(REEL_E_UNSUPPORTED,
                         "%s: config %s (dim %" PRId64 ", %" PRId64 " layers) does not match the "
                         "resident %s (dim %" PRId64 ", %" PRId64 " layers)",
                         x->at, c->name, c->dim, c->layers, x->o.expect->name, x->o.expect->dim, x->o.expect->layers);
    return 0;
}

/* The index's word on tensor e of part i: it must put it there. */
static int index_says(ctx_t *x, size_t i, const char *tensor) {
    const json_t *wm = json_object_get(x->index, "weight_map");
    const char *said = json_string_value(json_object_get(wm, tensor));
    if (!said) {
        char s[PATH_MAX];
        shown_in(x, x->index_name, s, sizeof s);
        return reel_fail(REEL_E_UNSUPPORTED, "%s: tensor '%s' is not in the index %s", x->parts[i].shown, tensor, s);
    }
    if (strcmp(said, x->parts[i].name))
        return reel_fail(REEL_E_UNSUPPORTED, "%s: tensor '%s' is here, but the index puts it in %s", x->parts[i].shown,
                         tensor, said);
    return 0;
}

/* Stage 3: the headers against the config: the size of it all (a peer's
 * files first, as a file read by path always was; the operator's after
 * the names, which say more), every tensor the model's, once, of its
 * shape, where the index says, none missing. Still no data read. */
static int judge_tensors(ctx_t *x, wan_ckpt_t *c) {
    size_t n = 0;
    for (size_t i = 0; i < x->n_parts; i++) {
        const st_header_t *h = x->parts[i].hdr;
        x->data_total += st_header_data_len(h);
        n += st_header_count(h);
        x->parts[i].base = x->total;
        /* each file's data 64-byte aligned in the one buffer (a Reel file: as it is) */
        x->total += x->reel ? st_header_data_len(h) : (st_header_data_len(h) + 63) & ~(uint64_t)63;
    }
    x->items = calloc(n ? n : 1, sizeof *x->items);
    x->part_names = calloc(x->n_parts, sizeof *x->part_names);
    if (!x->items || !x->part_names) return reel_fail(REEL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < x->n_parts; i++) {
        const st_header_t *h = x->parts[i].hdr;
        x->part_names[i] = x->parts[i].shown;
        for (size_t k = 0; k < st_header_count(h); k++) {
            const st_entry_t *e = st_header_at(h, k);
            item_t *it = &x->items[x->n_items++];
            *it = (item_t){ e->name, e->dtype, e->ndim, { 0 }, x->parts[i].base + e->begin, e->nbytes, i };
            memcpy(it->shape, e->shape, sizeof it->shape);
            x->tensor_bytes += e->nbytes;
        }
    }
    uint64_t max = x->o.max_data ? x->o.max_data
                 : x->reel ? 0 : (uint64_t)tdit_config_params(&c->cfg) * sizeof(float);
    if (x->o.max_data && judge_size(x, max) != 0) return -1;

    if (wan_match_init(&x->m, &c->cfg, x->reel) != 0) return wan_file_problem(false);
    for (size_t k = 0; k < x->n_items; k++) {
        const item_t *it = &x->items[k];
        if (wan_match_add(&x->m, it, x->parts[it->part].shown, x->part_names) != 0) return -1;
        if (x->index && index_says(x, it->part, it->name) != 0) return -1;
    }
    const json_t *wm = x->index ? json_object_get(x->index, "weight_map") : NULL;
    if (wm && json_object_size(wm) != x->n_items) { /* an entry of the index no shard holds */
        const char *t;
        const json_t *v;
        json_object_foreach((json_t *)wm, t, v) {
            bool held = false;
            for (size_t k = 0; k < x->n_items && !held; k++) held = !strcmp(x->items[k].name, t);
            if (!held) {
                char s[PATH_MAX];
                shown_in(x, x->index_name, s, sizeof s);
                return reel_fail(REEL_E_UNSUPPORTED, "%s: the index puts tensor '%s' in %s, which does not hold it", s,
                                 t, json_string_value(v));
            }
        }
    }
    if (wan_match_missing(&x->m, x->index ? x->shown : x->at) != 0) return -1;
    if (!x->o.max_data && judge_size(x, max) != 0) return -1;
    c->layout = x->reel ? WAN_LAYOUT_REEL : wan_layout_by_names(x->m.names, x->index != NULL, x->pipeline);
    return 0;
}

/* Stage 4: every file's data, once, into the one buffer (or only through
 * its digest with no_data). */
static int read_data(ctx_t *x) {
    if (!x->o.no_data) {
        if (x->total > SIZE_MAX || !(x->data = malloc(x->total ? (size_t)x->total : 1)))
            return reel_fail(REEL_E_NOMEM, "%s: out of memory for %llu bytes of weights", x->shown,
                             (unsigned long long)x->total);
        if (x->total > x->data_total) memset(x->data, 0, (size_t)x->total); /* alignment gaps: no stale heap */
    }
    for (size_t i = 0; i < x->n_parts; i++) {
        part_t *p = &x->parts[i];
        if (st_header_read_data(p->hdr, p->fd, p->shown, x->data ? x->data + p->base : NULL, reel_sha256_hook, &p->hook) != 0)
            return wan_file_problem(p->hook.stopped);
    }
    return 0;
}

/* Stage 5: what was read (files, digests, the identity, the summary) and
 * the Reel file over the buffer. */
static int finish(ctx_t *x, wan_ckpt_t *c) {
    unsigned char (*digest)[32] = malloc(x->n_parts * 32);
    if (!digest || !(c->files = calloc(x->n_parts, sizeof *c->files))) {
        free(digest);
        return reel_fail(REEL_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < x->n_parts; i++) {
        char hex[65];
        reel_sha256_final(&x->parts[i].hook.h, hex);
        for (int b = 0; b < 32; b++) {
            unsigned v;
            sscanf(hex + 2 * b, "%2x", &v);
            digest[i][b] = (unsigned char)v;
        }
        fill_file(&c->files[i], x, x->parts[i].name, x->parts[i].size, hex);
        c->sum.file_bytes += x->parts[i].size;
    }
    c->n_files = x->n_parts;
    if (x->index) {
        /* the index's bytes, then each shard's digest in name order */
        const void *part[2] = { x->index_bytes, digest };
        size_t len[2] = { x->index_len, x->n_parts * 32 };
        reel_sha256_parts(part, len, 2, c->identity);
        char ih[65];
        reel_sha256_buf(x->index_bytes, x->index_len, ih);
        fill_file(&c->index, x, x->index_name, x->index_len, ih);
        c->has_index = true;
    } else {
        snprintf(c->identity, sizeof c->identity, "%s", c->files[0].sha256);
    }
    free(digest);
    c->sum.parameters = tdit_config_params(&c->cfg);
    for (size_t k = 0; k < x->n_items; k++) {
        c->sum.tensors++;
        c->sum.dtype_count[x->items[k].dtype]++;
        c->sum.tensor_bytes += x->items[k].nbytes;
    }
    if (!x->data) return 0;
    unsigned char *data = x->data;
    x->data = NULL; /* the file's, or freed by st_adopt */
    size_t hlen;
    if (x->reel) {
        const char *text = st_header_text(x->parts[0].hdr, &hlen);
        c->file = st_adopt(x->parts[0].shown, text, hlen, data, (size_t)x->total);
    } else {
        char *text = wan_reel_header(&x->m, &c->cfg, c->layout, &hlen);
        if (!text) free(data);
        else c->file = st_adopt(x->shown, text, hlen, data, (size_t)x->total);
        free(text);
    }
    return c->file ? 0 : wan_file_problem(false);
}

wan_ckpt_t *wan_ckpt_openat(int dirfd, const char *name, const char *shown, const wan_opts_t *o) {
    ctx_t x;
    memset(&x, 0, sizeof x);
    x.o = o ? *o : (wan_opts_t){ 0 };
    x.shown = shown ? shown : (name ? name : ".");
    snprintf(x.where, sizeof x.where, "%s", x.shown);
    x.dir = -1;
    x.pre_fd = -1;
    wan_ckpt_t *c = calloc(1, sizeof *c);
    int rc = c ? 0 : reel_fail(REEL_E_NOMEM, "out of memory");
    if (rc == 0) rc = find_files(&x, dirfd, name);
    if (rc == 0) rc = judge_config(&x, &c->cfg);
    if (rc == 0) rc = judge_tensors(&x, c);
    if (rc == 0) rc = read_data(&x);
    if (rc == 0) rc = finish(&x, c);
    if (rc != 0) wan_ckpt_destroy(&c);
    ctx_free(&x);
    return c;
}

wan_ckpt_t *wan_ckpt_open(const char *path, const wan_opts_t *o) {
    if (!path || !*path) {
        reel_fail(REEL_E_INVALID, "no checkpoint path");
        return NULL;
    }
    /* the parent folder and the last component, so siblings are read relative to it */
    char dir[PATH_MAX], last[NAME_MAX + 1];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* "folder/" names the folder */
    if (n >= sizeof dir) {
        reel_fail(REEL_E_LIMIT, "%.64s...: path too long", path);
        return NULL;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : dir;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        /* "/", ".", "..": the folder itself */
        int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
            reel_fail(wan_errno_code(errno), "%s: cannot open: %s", path, strerror(errno));
            return NULL;
        }
        wan_ckpt_t *c = wan_ckpt_openat(fd, NULL, path, o);
        close(fd);
        return c;
    }
    if (strlen(base) > NAME_MAX) {
        reel_fail(REEL_E_LIMIT, "%s: a name longer than %d bytes", path, NAME_MAX);
        return NULL;
    }
    memcpy(last, base, strlen(base) + 1);
    if (slash == dir) dir[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        reel_fail(wan_errno_code(errno), "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char shown[PATH_MAX];
    snprintf(shown, sizeof shown, "%.*s", (int)n, path);
    wan_ckpt_t *c = wan_ckpt_openat(fd, last, shown, o);
    close(fd);
    return c;
}

void wan_ckpt_destroy(wan_ckpt_t **cp) {
    if (!cp || !*cp) return;
    wan_ckpt_t *c = *cp;
    st_close(&c->file);
    free(c->files);
    free(c);
    *cp = NULL;
}

const st_file_t *wan_ckpt_file(const wan_ckpt_t *c) { return c->file; }

st_file_t *wan_ckpt_take(wan_ckpt_t *c) {
    st_file_t *f = c->file;
    c->file = NULL;
    return f;
}

const tdit_config_t *wan_ckpt_config(const wan_ckpt_t *c) { return &c->cfg; }
wan_layout_t wan_ckpt_layout(const wan_ckpt_t *c) { return c->layout; }
const char *wan_ckpt_identity(const wan_ckpt_t *c) { return c->identity; }
size_t wan_ckpt_n_files(const wan_ckpt_t *c) { return c->n_files; }

const wan_file_t *wan_ckpt_file_at(const wan_ckpt_t *c, size_t i) { return i < c->n_files ? &c->files[i] : NULL; }

const wan_file_t *wan_ckpt_index(const wan_ckpt_t *c) { return c->has_index ? &c->index : NULL; }

void wan_ckpt_summary(const wan_ckpt_t *c, wan_summary_t *out) { *out = c->sum; }

st_file_t *wan_ckpt_load(const char *path) {
    wan_ckpt_t *c = wan_ckpt_open(path, NULL);
    st_file_t *f = c ? wan_ckpt_take(c) : NULL;
    wan_ckpt_destroy(&c);
    return f;
}

/* ---- a file in memory ------------------------------------------------------------------ */

int wan_ckpt_adopt(st_file_t **fp, const tdit_config_t *cfg) {
    st_file_t *f = *fp;
    if (st_meta(f, "config") || st_meta(f, "dim")) return 0;
    size_t n = st_count(f);
    item_t *items = calloc(n ? n : 1, sizeof *items);
    const char *origin = st_origin(f);
    const char *names[1] = { origin };
    match_t m;
    memset(&m, 0, sizeof m);
    char *text = NULL, *org = strdup(origin);
    int rc = -1;
    if (!items || !org) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
        goto out;
    }
    if (!cfg) {
        reel_fail(REEL_E_INVALID, "%s: no Reel metadata and no config to judge it by", origin);
        goto out;
    }
    if (wan_match_init(&m, cfg, false) != 0) {
        wan_file_problem(false);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = st_at(f, i);
        items[i] = (item_t){ t->name, t->dtype, t->ndim, { 0 }, st_offset(f, t), t->nbytes, 0 };
        memcpy(items[i].shape, t->shape, sizeof items[i].shape);
        if (wan_match_add(&m, &items[i], origin, names) != 0) goto out;
    }
    if (wan_match_missing(&m, origin) != 0) goto out;
    size_t hlen;
    tdit_config_t c = *cfg;
    if (!(text = wan_reel_header(&m, &c, wan_layout_by_names(m.names, false, false), &hlen))) goto out;
    size_t dlen = st_data_len(f);
    unsigned char *data = st_take_data(f);
    st_close(fp);
    if (!(*fp = st_adopt(org, text, hlen, data, dlen))) {
        wan_file_problem(false);
        goto out;
    }
    rc = 0;
out:
    if (rc != 0) st_close(fp);
    wan_match_free(&m);
    free(items);
    free(text);
    free(org);
    return rc;
}

/* ---- packing and syncs -------------------------------------------------------------------- */

int wan_ckpt_pack(const char *path, const char *out_path) {
    wan_ckpt_t *c = wan_ckpt_open(path, NULL);
    if (!c) return -1;
    int rc = st_save(wan_ckpt_file(c), out_path);
    wan_ckpt_destroy(&c);
    return rc;
}

int wan_sync_source(const char *path, bool upload, wan_sync_source_t *out) {
    memset(out, 0, sizeof *out);
    char real[PATH_MAX];
    if (!realpath(path, real)) return reel_fail(REEL_E_IO, "%s: %s", path, strerror(errno));
    wan_opts_t o = { .no_data = true };
    wan_ckpt_t *c = wan_ckpt_open(real, &o);
    if (!c) {
        /* One safetensors file whose config this side cannot know (no Reel
         * metadata, no config.json: a raw release file, a trainer's dump)
         * goes as it is: each worker judges it against the model it runs. */
        reel_err_t verdict = *reel_err(); /* stands unless the file goes as it is */
        struct stat sb;
        char cfg[PATH_MAX + 16];
        const char *slash = strrchr(real, '/');
        snprintf(cfg, sizeof cfg, "%.*s/config.json", slash ? (int)(slash - real) : 0, real);
        bool lone = stat(cfg, &sb) != 0; /* a config.json beside it was judged: its verdict stands */
        int fd = lone && stat(real, &sb) == 0 && S_ISREG(sb.st_mode) ? open(real, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
        st_probe_t pr;
        bool raw = fd >= 0 && st_probe_fd(fd, real, &pr) == 0;
        if (fd >= 0) close(fd);
        if (!raw) return reel_fail_detail(verdict.code, verdict.detail, "%s", verdict.msg);
        snprintf(out->path, sizeof out->path, "%s", real);
        return reel_sha256_file(real, out->sha256);
    }
    int rc = 0;
    if (!upload) {
        snprintf(out->path, sizeof out->path, "%s", real);
        snprintf(out->sha256, sizeof out->sha256, "%s", wan_ckpt_identity(c));
    } else if (!wan_ckpt_index(c)) {
        struct stat sb;
        if (stat(real, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            if (snprintf(out->path, sizeof out->path, "%s/%s", real, wan_ckpt_file_at(c, 0)->name) >=
                (int)sizeof out->path)
                rc = reel_fail(REEL_E_LIMIT, "%s: path too long", real);
        } else {
            snprintf(out->path, sizeof out->path, "%s", real);
        }
        snprintf(out->sha256, sizeof out->sha256, "%s", wan_ckpt_identity(c));
    } else {
        snprintf(out->tmpdir, sizeof out->tmpdir, "/tmp/reel-pack-XXXXXX");
        if (!mkdtemp(out->tmpdir)) {
            rc = reel_fail(REEL_E_IO, "cannot create a temporary folder: %s", strerror(errno));
            out->tmpdir[0] = '\0';
        } else {
            if (snprintf(out->path, sizeof out->path, "%s/transformer.safetensors", out->tmpdir) >=
                (int)sizeof out->path)
                rc = reel_fail(REEL_E_LIMIT, "%s: path too long", out->tmpdir);
            if (rc == 0) rc = wan_ckpt_pack(real, out->path);
            if (rc == 0) rc = reel_sha256_file(out->path, out->sha256);
            if (rc != 0) wan_sync_source_done(out); /* can't fail: the error stays the packing's */
        }
    }
    wan_ckpt_destroy(&c);
    return rc;
}

void wan_sync_source_done(wan_sync_source_t *s) {
    if (!s || !s->tmpdir[0]) return;
    unlink(s->path);
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->path);
    unlink(tmp);
    rmdir(s->tmpdir);
    s->tmpdir[0] = '\0';
}
