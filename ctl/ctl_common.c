/* ctl_common.c -- the helpers every reelctl subcommand uses (ctl.h):
 * failures reported the way reelctl always has, the size of a latent,
 * reading an input tensor, the clock and the terminal test. It calls no
 * subcommand, so the cmd_*.c files and reelctl.c's dispatch never call one
 * another in a circle. */
#include "ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "schema/msg.h"
#include "model/safetensors.h"
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

int ctl_fail_as(reel_code_t code, const char *fmt, ...) {
    char pre[REEL_ERR_MSG] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pre, sizeof pre, fmt, ap);
        va_end(ap);
    }
    const reel_err_t *e = reel_err();
    reel_code_t keep = reel_exit_status(e->code) == reel_exit_status(code) ? e->code : code;
    /* reel_fail_detail copies message and detail before it writes them */
    return reel_fail_detail(keep, e->detail, "%s%s", pre, e->msg);
}

int ctl_fail_wire(const wire_err_t *e, const char *fmt, ...) {
    char what[REEL_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    reel_code_t code = REEL_E_IO;
    if (!strcmp(e->code, WIRE_E_TIMEOUT)) code = REEL_E_TIMEOUT;
    else if (!strcmp(e->code, WIRE_E_BUSY) || !strcmp(e->code, WIRE_E_NO_WORKER) ||
             !strcmp(e->code, WIRE_E_STALE) || !strcmp(e->code, WIRE_E_WORKER_LOST))
        code = REEL_E_STATE;
    return reel_fail(code, "%s: %s: %s", what, e->code, e->message);
}

bool ctl_tty(void) { return isatty(2); }

double ctl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ctl_prompts_check(const char *prompt, const char *negative) {
    /* one rule for run, gen and the Python client: a GEN can not carry ""
     * (it reads it as no prompt), so no path takes it, and each says how
     * to ask for Wan's empty-prompt context instead */
    if (prompt && !*prompt) return reel_fail(REEL_E_INVALID, "%s", CTL_EMPTY_PROMPT);
    /* the wire's longest string: reelctl run refuses what a GEN could not carry, as gen does, here */
    const char *texts[2] = { prompt, negative }, *names[2] = { "prompt", "negative-prompt" };
    for (int i = 0; i < 2; i++)
        if (texts[i] && strlen(texts[i]) > MSG_MAX_PROMPT_BYTES)
            return reel_fail(REEL_E_INVALID, "--%s is %zu bytes: at most %d (umT5 reads 512 tokens, about 2 KiB)",
                             names[i], strlen(texts[i]), MSG_MAX_PROMPT_BYTES);
    const char *bad = prompt && !msg_text_ok(prompt) ? "prompt" : negative && !msg_text_ok(negative) ? "negative-prompt" : NULL;
    if (!bad) return 0;
    return reel_fail(REEL_E_INVALID,
                     "--%s is not UTF-8 text or holds a control character (tab, newline and CR are allowed)", bad);
}

int ctl_size_parse(const char *s, const char *what, int64_t out[3]) {
    /* what a GEN may carry (docs/PROTOCOL.md): never a 64 GiB allocation here */
    char buf[64], *part[3] = { buf };
    int64_t v[3];
    bool ok = strlen(s) < sizeof buf;
    if (ok) strcpy(buf, s);
    for (int i = 1; ok && i < 3; i++) { /* "FxHxW": a third 'x' is junk in W */
        char *x = strchr(part[i - 1], 'x');
        if ((ok = x != NULL)) *x = '\0', part[i] = x + 1;
    }
    for (int i = 0; ok && i < 3; i++) ok = reel_parse_i64(part[i], 1, MSG_MAX_DIM, what, &v[i]) == 0;
    if (!ok || v[0] * v[1] * v[2] > MSG_MAX_FHW)
        return reel_fail(REEL_E_INVALID, "%s: expected FxHxW (e.g. 2x16x16; each 1..65536, F x H x W at most 2^24), "
                         "got '%.64s'", what, s);
    memcpy(out, v, sizeof v);
    return 0;
}

int ctl_size_parse_any(const char *s, const char *what, int64_t latent[3], int64_t pixels[2]) {
    const char *star = strchr(s, '*');
    if (!star) {
        if (ctl_size_parse(s, what, latent) == 0) {
            pixels[0] = pixels[1] = 0;
            return 0;
        }
        return reel_fail(REEL_E_INVALID, "%s: '%.64s' is neither a latent FxHxW (e.g. 2x16x16; each 1..65536, "
                         "F x H x W at most 2^24) nor Wan's pixel W*H (e.g. 832*480)", what, s);
    }
    char w[32], wwhat[64], hwhat[64];
    size_t n = (size_t)(star - s);
    if (n >= sizeof w) return reel_fail(REEL_E_INVALID, "%s: '%.64s' is not W*H", what, s);
    memcpy(w, s, n);
    w[n] = 0;
    snprintf(wwhat, sizeof wwhat, "%s width", what);
    snprintf(hwhat, sizeof hwhat, "%s height", what);
    int64_t px[2];
    /* multiples of 16 from 16 (checked below) */
    if (reel_parse_i64(w, 16, 8 * 65536, wwhat, &px[0]) || reel_parse_i64(star + 1, 16, 8 * 65536, hwhat, &px[1]))
        return -1;
    if (px[0] % 16 || px[1] % 16)
        return reel_fail(REEL_E_INVALID, "%s %s: width and height must be multiples of 16 (8 for the VAE, "
                         "x2 for the DiT's patches)", what, s);
    pixels[0] = px[0];
    pixels[1] = px[1];
    return 0;
}

int ctl_size_finish(int64_t latent[3], const int64_t pixels[2], int frame_num) {
    if (!pixels[0]) {
        if (frame_num) return reel_fail(REEL_E_INVALID, "--frame_num goes with a pixel --size W*H (e.g. 832*480)");
        return 0;
    }
    int fn = frame_num ? frame_num : 81;
    if (fn < 1 || (fn - 1) % 4) return reel_fail(REEL_E_INVALID, "--frame_num %d: Wan's VAE makes 1 + 4k frames", fn);
    int64_t sz[3] = { (fn - 1) / 4 + 1, pixels[1] / 8, pixels[0] / 8 };
    if (sz[0] > MSG_MAX_DIM || sz[0] * sz[1] * sz[2] > MSG_MAX_FHW)
        return reel_fail(REEL_E_INVALID, "--size %lld*%lld --frame_num %d: a latent of %lldx%lldx%lld, past F x H x W "
                         "at most 2^24", (long long)pixels[0], (long long)pixels[1], fn, (long long)sz[0],
                         (long long)sz[1], (long long)sz[2]);
    memcpy(latent, sz, sizeof sz);
    return 0;
}

/* Reads tensor `name` of `path` as F32 of rank ndim; shape out; NULL with
 * the error value set (exit status 2) on any problem. */
float *ctl_read_tensor(const char *path, const char *name, int ndim, int64_t *shape) {
    st_file_t *f = st_open(path);
    if (!f) {
        ctl_fail_as(REEL_E_INVALID, NULL);
        return NULL;
    }
    const st_tensor_t *t = st_find(f, name);
    float *buf = NULL;
    if (!t) reel_fail(REEL_E_NOT_FOUND, "%s: no tensor named '%s'", path, name);
    else if (t->ndim != ndim)
        reel_fail(REEL_E_INVALID, "%s: tensor '%s' has %d dimensions, expected %d", path, name, t->ndim, ndim);
    else {
        int64_t n = 1;
        for (int i = 0; i < ndim; i++) { shape[i] = t->shape[i]; n *= t->shape[i]; }
        buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        /* an input too large for this machine: a limit of the input (exit 2), as always */
        if (!buf) reel_fail(REEL_E_LIMIT, "%s: out of memory", path);
        else if (st_read_f32(f, name, ndim, shape, buf) != 0) ctl_fail_as(REEL_E_INVALID, "%s: ", path);
        else if (!kern_all_finite(buf, (size_t)n, KERN_F32)) /* a model input: as a worker judges it */
            reel_fail(REEL_E_INVALID, "%s: tensor '%s' holds NaN or infinite values", path, name);
        else {
            st_close(&f);
            return buf;
        }
        free(buf);
        buf = NULL;
    }
    st_close(&f);
    return buf;
}

/* True when writing out would replace in: the same file (symbolic links
 * followed), or, for a folder in, an existing file below it with a name a
 * checkpoint, config, tokenizer or adapter has. */
static bool clobbers(const char *out, const char *in) {
    struct stat so, si;
    if (stat(out, &so) != 0 || !S_ISREG(so.st_mode) || stat(in, &si) != 0) return false;
    if (S_ISREG(si.st_mode)) return so.st_dev == si.st_dev && so.st_ino == si.st_ino;
    if (!S_ISDIR(si.st_mode)) return false;
    char ro[PATH_MAX], ri[PATH_MAX];
    if (!realpath(out, ro) || !realpath(in, ri)) return false;
    size_t n = strlen(ri);
    if (strncmp(ro, ri, n) != 0 || ro[n] != '/') return false;
    static const char *const kept[] = { ".safetensors", ".pth", ".json", ".model", ".bin", ".pt" };
    const char *ext = strrchr(ro, '.');
    for (size_t i = 0; ext && i < sizeof kept / sizeof kept[0]; i++)
        if (!strcmp(ext, kept[i])) return true;
    return false;
}

int ctl_out_spares(const char *out, ...) {
    va_list ap;
    va_start(ap, out);
    int rc = 0;
    for (const char *opt; rc == 0 && (opt = va_arg(ap, const char *));) {
        const char *in = va_arg(ap, const char *);
        if (in && out && clobbers(out, in))
            rc = reel_fail(REEL_E_INVALID, "the output %s would overwrite %s %s, an input of this command: write it elsewhere",
                           out, opt, in);
    }
    va_end(ap);
    return rc;
}

bool ctl_has_ext(const char *path, const char *ext) {
    size_t n = strlen(path), e = strlen(ext);
    return n > e && !strcmp(path + n - e, ext);
}

int ctl_out_folder(const char *out) {
    const char *slash = strrchr(out, '/');
    if (!slash || slash == out) return 0; /* the current folder, or / */
    char dir[PATH_MAX];
    if ((size_t)(slash - out) >= sizeof dir) return reel_fail(REEL_E_INVALID, "%s: path too long", out);
    memcpy(dir, out, (size_t)(slash - out));
    dir[slash - out] = '\0';
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return reel_fail(REEL_E_INVALID, "--out %s: %s is not a folder", out, dir);
    return 0;
}

int ctl_out_file(const char *path) {
    /* the rule of the latent's writer (st_writer_save): a file goes in by
     * rename, so only a regular file is replaced */
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return reel_fail(REEL_E_INVALID, "%s: exists and is not a regular file (a device, FIFO, directory or symlink is "
                         "never replaced)", path);
    return 0;
}

int ctl_write_bytes(const char *path, const void *p, size_t n) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return reel_fail(REEL_E_INVALID, "%s: path too long", path);
    if (ctl_out_file(path) != 0) return -1;
    FILE *f = fopen(tmp, "wb");
    if (!f) return reel_fail_errno(REEL_E_IO, errno, "writing %s", path); /* the path asked for, not the temporary */
    bool ok = fwrite(p, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return reel_fail_errno(REEL_E_IO, e, "writing %s", path);
    }
    return 0;
}

int ctl_write_npy_u8(const char *path, const uint8_t *data, int ndim, const int64_t *shape) {
    char dict[256];
    int at = snprintf(dict, sizeof dict, "{'descr': '|u1', 'fortran_order': False, 'shape': (");
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        at += snprintf(dict + at, sizeof dict - (size_t)at, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
        n *= (size_t)shape[i];
    }
    at += snprintf(dict + at, sizeof dict - (size_t)at, "), }");
    /* magic (6) + version (2) + header length (2) + dict, padded with spaces to 64 and ended by \n */
    size_t hl = (size_t)at + 1, total = 10 + hl;
    size_t pad = (64 - total % 64) % 64;
    hl += pad;
    unsigned char *buf = malloc(10 + hl + n);
    if (!buf) return reel_fail(REEL_E_NOMEM, "out of memory writing %s", path);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hl & 0xff);
    buf[9] = (unsigned char)(hl >> 8);
    memcpy(buf + 10, dict, (size_t)at);
    memset(buf + 10 + at, ' ', pad);
    buf[10 + hl - 1] = '\n';
    memcpy(buf + 10 + hl, data, n);
    int rc = ctl_write_bytes(path, buf, 10 + hl + n);
    free(buf);
    return rc;
}

void ctl_progress(const char *what, int64_t done, int64_t total) {
    if (!ctl_tty() || total <= 0) return;
    int w = 30, fill = (int)(done * w / total);
    fprintf(stderr, "\r[");
    for (int i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %s %lld/%lld", what, (long long)done, (long long)total);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

int ctl_config_from_json(const char *path, tdit_config_t *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return reel_fail(REEL_E_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(64 * 1024);
    if (!buf) {
        fclose(f);
        return reel_fail(REEL_E_NOMEM, "out of memory");
    }
    size_t n = fread(buf, 1, 64 * 1024, f);
    bool more = !feof(f) && fgetc(f) != EOF;
    fclose(f);
    int rc = more ? reel_fail(REEL_E_LIMIT, "%s: larger than %d bytes: not a model config", path, 64 * 1024)
                  : tdit_config_from_json(buf, n, path, c);
    free(buf);
    return rc;
}

const char *ctl_wan_t2v_fill(bool solver_given, bool sde, int *steps, double *shift, bool *have_cfg, double *cfg,
                             char *took, size_t len) {
    const char *solver = !solver_given && !sde ? CTL_WAN_T2V_SOLVER : NULL;
    size_t n = 0;
    took[0] = '\0';
    if (solver) n += (size_t)snprintf(took + n, len - n, " --solver %s", solver);
    if (*steps < 0) {
        *steps = CTL_WAN_T2V_STEPS;
        n += (size_t)snprintf(took + n, len - n, " --steps %d", *steps);
    }
    if (isnan(*shift)) {
        *shift = CTL_WAN_T2V_SHIFT;
        n += (size_t)snprintf(took + n, len - n, " --shift %g", *shift);
    }
    if (!*have_cfg) {
        *cfg = CTL_WAN_T2V_CFG;
        *have_cfg = true;
        snprintf(took + n, len - n, " --cfg %g", *cfg);
    }
    return solver;
}

void ctl_wan_defaults_note(const char *cmd, const char *took, const char *piped, const char *from) {
    bool wan = took && *took, pipe = piped && *piped && from;
    if (pipe)
        fprintf(stderr, "reelctl: %s --prompt: defaults for what was not given:%s from %s%s%s\n", cmd, piped, from,
                wan ? "; Wan2.1's text-to-video:" : "", wan ? took : "");
    else if (wan)
        fprintf(stderr, "reelctl: %s --prompt: Wan2.1's text-to-video defaults for what was not given:%s\n", cmd,
                took);
}

int ctl_base_seed(const char *v, uint64_t *seed) {
    if (!strcmp(v, "-1"))
        return reel_fail(REEL_E_INVALID, "--base_seed -1 is generate.py's random seed, which Reel does not draw: give "
                         "--seed K (or --base_seed K), K >= 0; without one the seed is 0");
    return reel_parse_u64(v, 0, UINT64_MAX, "--base_seed", seed);
}

int ctl_wan_flag_refused(const char *flag, const char *reel) {
    return reel_fail(REEL_E_INVALID, "--%s is Wan's generate.py flag, not taken here: give %s", flag, reel);
}
