/* cmd_tensor.c -- `reelctl tensor rand|info|diff`: make input files and
 * inspect results without Python. */
#include "ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "model/loop.h"
#include "model/safetensors.h"
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "16,256" into shape: the count (0 for ""), or -1 with an invalid error. */
static int parse_shape(const char *s, int64_t shape[KERN_MAX_DIMS]) {
    char buf[KERN_MAX_DIMS * 10 + 1];
    int nd = 0;
    bool ok = strlen(s) < sizeof buf;
    if (ok) strcpy(buf, s);
    for (char *p = buf; ok && *s && p; nd++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        ok = nd < KERN_MAX_DIMS && reel_parse_i64(p, 1, 1 << 24, "--shape", &shape[nd]) == 0;
        p = comma ? comma + 1 : NULL;
    }
    if (!ok)
        return reel_fail(REEL_E_INVALID, "--shape: expected up to %d positive integers like 16,256, got '%s'",
                         KERN_MAX_DIMS, s);
    return nd;
}

static int tensor_rand(int argc, char **argv) {
    static const struct option opts[] = {
        { "name", required_argument, 0, 'n' }, { "shape", required_argument, 0, 'S' },
        { "seed", required_argument, 0, 's' }, { "out", required_argument, 0, 'o' }, { 0, 0, 0, 0 },
    };
    const char *name = NULL, *out = NULL, *shape_s = NULL;
    uint64_t seed = 0;
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n': name = optarg; break;
        case 'o': out = optarg; break;
        case 'S': shape_s = optarg; break;
        case 's':
            if (reel_parse_u64(optarg, 0, UINT64_MAX, "--seed", &seed)) return -1;
            break;
        default:
            return ctl_fail_usage("tensor rand", "tensor rand: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (!name || !out || !shape_s) return reel_fail(REEL_E_INVALID, "tensor rand needs --name, --shape A,B,.. and --out");
    int64_t shape[KERN_MAX_DIMS];
    int nd = parse_shape(shape_s, shape);
    if (nd < 0) return -1;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    if (nd == 0 || n > ((int64_t)1 << 28))
        return reel_fail(nd ? REEL_E_LIMIT : REEL_E_INVALID, "--shape: empty or too large");
    float *x = malloc((size_t)n * sizeof *x);
    if (!x) return reel_fail(REEL_E_NOMEM, "out of memory");
    tdit_initial_latent(seed, x, (size_t)n);
    st_writer_t *w = st_writer_new();
    int rc = w ? st_writer_add_f32(w, name, nd, shape, x) : -1;
    if (rc == 0) rc = st_writer_save(w, out);
    st_writer_destroy(&w);
    free(x);
    if (rc) return ctl_fail_as(REEL_E_IO, NULL);
    return 0;
}

static int tensor_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (argv[i][0] == '-' && argv[i][1])
            return ctl_fail_usage("tensor info", "tensor info: unknown option '%s'", argv[i]);
    if (argc != 2) return reel_fail(REEL_E_INVALID, "usage: reelctl tensor info FILE.safetensors");
    st_file_t *f = st_open(argv[1]);
    if (!f) return ctl_fail_as(REEL_E_INVALID, NULL);
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
        if (!x || st_read_f32(f, t->name, -1, NULL, x) != 0) {
            int rc = x ? ctl_fail_as(REEL_E_IO, NULL) : reel_fail(REEL_E_NOMEM, "out of memory");
            free(x);
            st_close(&f);
            return rc;
        }
        double sum = 0, sq = 0, mn = INFINITY, mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            sum += x[j]; sq += (double)x[j] * x[j];
            if (x[j] < mn) mn = x[j];
            if (x[j] > mx) mx = x[j];
        }
        char d[96];
        kern_tensor_t k = kern_tensor_make(NULL, t->dtype, KERN_DEVICE_HOST, t->ndim, t->shape);
        double mean = n ? sum / n : 0;
        printf("%-32s %-20s mean %+.5f std %.5f min %+.4f max %+.4f\n", t->name,
               kern_tensor_describe(&k, d, sizeof d), mean, n ? sqrt(fmax(sq / n - mean * mean, 0)) : 0, mn, mx);
        free(x);
    }
    st_close(&f);
    return 0;
}

/* Compares tensor `latent` (or --name) of two files bitwise: 0 when
 * equal, CTL_NO when not (printing the largest difference), -1 when they
 * cannot be compared. */
static int tensor_diff(int argc, char **argv) {
    const char *name = "latent";
    for (int i = 1; i < argc; i++)
        if (argv[i][0] == '-' && argv[i][1] && !(i == 3 && !strcmp(argv[i], "--name")))
            return ctl_fail_usage("tensor diff", "tensor diff: unknown option '%s'", argv[i]);
    if (argc == 5 && !strcmp(argv[3], "--name")) name = argv[4];
    else if (argc != 3) return reel_fail(REEL_E_INVALID, "usage: reelctl tensor diff A.safetensors B.safetensors [--name N]");
    st_file_t *a = st_open(argv[1]), *b = a ? st_open(argv[2]) : NULL;
    if (!a || !b) {
        st_close(&a);
        return ctl_fail_as(REEL_E_INVALID, NULL);
    }
    const st_tensor_t *ta = st_find(a, name), *tb = st_find(b, name);
    int code = -1;
    if (!ta || !tb) reel_fail(REEL_E_NOT_FOUND, "tensor '%s' missing in %s", name, ta ? argv[2] : argv[1]);
    else if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof ta->shape[0] * (size_t)ta->ndim))
        reel_fail(REEL_E_INVALID, "tensor '%s' has different shapes", name);
    else {
        int64_t n = 1;
        for (int d = 0; d < ta->ndim; d++) n *= ta->shape[d];
        float *x = malloc((size_t)(n ? n : 1) * 4), *y = malloc((size_t)(n ? n : 1) * 4);
        if (x && y && !st_read_f32(a, name, -1, NULL, x) && !st_read_f32(b, name, -1, NULL, y)) {
            double mx = 0;
            int64_t differ = 0;
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&x[i], &y[i], 4)) {
                    differ++;
                    if (fabs((double)x[i] - y[i]) > mx) mx = fabs((double)x[i] - y[i]);
                }
            printf("%s: %lld of %lld values differ, max |a-b| %.6g\n", name, (long long)differ, (long long)n, mx);
            code = differ ? CTL_NO : 0;
        } else if (x && y) {
            ctl_fail_as(REEL_E_IO, NULL);
        } else {
            reel_fail(REEL_E_NOMEM, "out of memory");
        }
        free(x);
        free(y);
    }
    st_close(&a);
    st_close(&b);
    return code;
}

int cmd_tensor(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "diff")) return tensor_diff(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "rand")) return tensor_rand(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "info")) return tensor_info(argc - 1, argv + 1);
    if (argc < 2) return ctl_fail_usage("tensor", "tensor: which one? (rand, info or diff)");
    return ctl_fail_usage("tensor", "tensor: unknown subcommand '%s' (rand, info or diff)", argv[1]);
}
