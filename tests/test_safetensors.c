/* test_safetensors.c -- safetensors reader/writer: round trips, exact
 * widening, and one rejection per kind of malformed file.
 *
 * Bad files are assembled by hand (length field + header JSON + data) and
 * written under a mkdtemp() directory that the unchecked fixture removes in
 * the parent process, so it goes even when a test fails. */
#include "model/safetensors.h"
#include "base/error.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/support.h"

static char tmpdir[] = "/tmp/reel_test_st_XXXXXX";
static char pathbuf[PATH_MAX];

static void make_tmpdir(void) {
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        exit(2);
    }
}

static void remove_tmpdir(void) {
    DIR *d = opendir(tmpdir);
    if (!d) return;
    struct dirent *de;
    char p[PATH_MAX];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

/* Path of `name` inside the test directory (static buffer). */
static const char *tmp_path(const char *name) {
    snprintf(pathbuf, sizeof pathbuf, "%s/%s", tmpdir, name);
    return pathbuf;
}

/* Little-endian length field + header text + data, malloc'd. */
static unsigned char *assemble(const char *json, const void *data, size_t dlen,
                               size_t *len) {
    size_t hl = strlen(json);
    unsigned char *b = malloc(8 + hl + dlen + 1);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    *len = 8 + hl + dlen;
    return b;
}

static const char *put_file(const char *name, const void *bytes, size_t len) {
    const char *p = tmp_path(name);
    FILE *fp = fopen(p, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(bytes, 1, len, fp), len);
    ck_assert_int_eq(fclose(fp), 0);
    return p;
}

/* Writes a hand-built file and opens it with st_open. */
static st_file_t *open_built(const char *json, const void *data, size_t dlen) {
    size_t len;
    unsigned char *b = assemble(json, data, dlen, &len);
    const char *p = put_file("built.safetensors", b, len);
    free(b);
    reel_err_clear();
    return st_open(p);
}

#define ck_assert_error_has(sub)                                              \
    ck_assert_msg(strstr(reel_err_text(), (sub)) != NULL,                        \
                  "reel_err_text() = \"%s\" lacks \"%s\"", reel_err_text(), (sub))

/* The hand-built file must be refused, with every listed substring in the
 * message (and the path, since st_open names it). */
#define expect_rejected(json, data, dlen, ...)                                \
    do {                                                                      \
        st_file_t *f_ = open_built((json), (data), (dlen));                   \
        ck_assert_ptr_null(f_);                                               \
        ck_assert_error_has("built.safetensors");                             \
        const char *subs_[] = {__VA_ARGS__};                                  \
        for (size_t i_ = 0; i_ < sizeof subs_ / sizeof subs_[0]; i_++)        \
            ck_assert_error_has(subs_[i_]);                                   \
    } while (0)

static unsigned char zeros[64];

/* ---- round trips ----------------------------------------------------- */

START_TEST(test_round_trip_preserves_names_dtypes_shapes_bytes_and_metadata) {
    float a[6] = {1, -2, 3.5f, 1e-30f, 1e30f, -0.0f};
    uint16_t b[3] = {0x3f80, 0xc020, 0x0001};       /* odd count: misaligns c */
    uint16_t h[4] = {0x3c00, 0x7bff, 0x8000, 0x0001};
    float s = 42.0f, c[2] = {7, 8};
    int64_t sa[2] = {2, 3}, sb[1] = {3}, sh[2] = {2, 2}, se[2] = {0, 4},
            sc[1] = {2};

    st_writer_t *w = st_writer_new();
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(st_writer_add_f32(w, "blocks.0.attn.w", 2, sa, a), 0);
    ck_assert_int_eq(st_writer_add(w, "b", KERN_BF16, 1, sb, b), 0);
    ck_assert_int_eq(st_writer_add_f32(w, "c", 1, sc, c), 0);
    ck_assert_int_eq(st_writer_add(w, "half", KERN_F16, 2, sh, h), 0);
    ck_assert_int_eq(st_writer_add_f32(w, "scalar", 0, NULL, &s), 0);
    ck_assert_int_eq(st_writer_add_f32(w, "empty", 2, se, NULL), 0);
    ck_assert_int_eq(st_writer_meta(w, "format", "pt"), 0);
    ck_assert_int_eq(st_writer_meta(w, "note", "first"), 0);
    ck_assert_int_eq(st_writer_meta(w, "note", "ünïcode"), 0);
    ck_assert_int_eq(st_writer_save(w, tmp_path("rt.safetensors")), 0);
    st_writer_destroy(&w);
    ck_assert_ptr_null(w);

    st_file_t *f = st_open(tmp_path("rt.safetensors"));
    TS_NEW(f);
    ck_assert_uint_eq(st_count(f), 6);

    struct { const char *name; kern_dtype_t dt; int ndim; const int64_t *shape;
             const void *data; size_t nbytes; } want[] = {
        {"blocks.0.attn.w", KERN_F32, 2, sa, a, sizeof a},
        {"b", KERN_BF16, 1, sb, b, sizeof b},
        {"c", KERN_F32, 1, sc, c, sizeof c},
        {"half", KERN_F16, 2, sh, h, sizeof h},
        {"scalar", KERN_F32, 0, NULL, &s, sizeof s},
        {"empty", KERN_F32, 2, se, NULL, 0},
    };
    for (size_t i = 0; i < 6; i++) {
        /* The writer lays data out in insertion order and st_at() lists
         * by data offset, so the two orders agree. */
        const st_tensor_t *t = st_at(f, i);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_eq(st_find(f, want[i].name), t);
        ck_assert_str_eq(t->name, want[i].name);
        ck_assert_int_eq(t->dtype, want[i].dt);
        ck_assert_int_eq(t->ndim, want[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            ck_assert_int_eq(t->shape[d], want[i].shape[d]);
        ck_assert_uint_eq(t->nbytes, want[i].nbytes);
        if (t->nbytes) ck_assert_mem_eq(t->data, want[i].data, t->nbytes);
    }
    ck_assert_ptr_null(st_at(f, 6));
    ck_assert_ptr_null(st_find(f, "absent"));
    ck_assert_str_eq(st_meta(f, "format"), "pt");
    ck_assert_str_eq(st_meta(f, "note"), "ünïcode");
    ck_assert_ptr_null(st_meta(f, "absent"));

    float back[6];
    ck_assert_int_eq(st_read_f32(f, "blocks.0.attn.w", 2, sa, back), 0);
    ck_assert_mem_eq(back, a, sizeof a);
    /* "c" sits at an offset that is not a multiple of 4: read must cope. */
    ck_assert_int_eq(st_read_f32(f, "c", 1, sc, back), 0);
    ck_assert(back[0] == 7 && back[1] == 8);
    ck_assert_int_eq(st_read_f32(f, "scalar", 0, NULL, back), 0);
    ck_assert(back[0] == 42.0f);
    st_close(&f);
    ck_assert_ptr_null(f);
}
END_TEST

/* A save goes in by rename, so only a regular file at the path may be
 * replaced: a FIFO, a directory, a symlink (and so a device: /dev/null
 * run over as root) are refused and left as they were; a symlink at the
 * temporary name is never followed. */
START_TEST(test_save_replaces_only_a_regular_file) {
    float v[4] = { 1, 2, 3, 4 };
    int64_t shp[1] = { 4 };
    st_writer_t *w = st_writer_new();
    ck_assert_int_eq(st_writer_add(w, "a", KERN_F32, 1, shp, v), 0);
    char fifo[4200], dir[4200], link[4200], target[4200], out[4200];
    snprintf(fifo, sizeof fifo, "%s", tmp_path("fifo.safetensors"));
    snprintf(dir, sizeof dir, "%s", tmp_path("dir.safetensors"));
    snprintf(link, sizeof link, "%s", tmp_path("link.safetensors"));
    snprintf(target, sizeof target, "%s", tmp_path("target"));
    snprintf(out, sizeof out, "%s", tmp_path("out.safetensors"));
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    FILE *f = fopen(target, "w");
    fputs("keep", f);
    fclose(f);
    ck_assert_int_eq(symlink(target, link), 0);
    const char *bad[] = { fifo, dir, link };
    struct stat st;
    for (int i = 0; i < 3; i++) {
        reel_err_clear();
        ck_assert_int_eq(st_writer_save(w, bad[i]), -1);
        ck_assert_msg(strstr(reel_err_text(), "not a regular file"), "%s", reel_err_text());
        ck_assert_int_eq(lstat(bad[i], &st), 0);
        ck_assert(i == 0 ? S_ISFIFO(st.st_mode) : i == 1 ? S_ISDIR(st.st_mode) : S_ISLNK(st.st_mode));
    }
    char tmp[4210];
    snprintf(tmp, sizeof tmp, "%s.tmp", out); /* a symlink planted at the temporary name */
    ck_assert_int_eq(symlink(target, tmp), 0);
    ck_assert_int_eq(st_writer_save(w, out), -1);
    ck_assert_int_eq(stat(target, &st), 0);
    ck_assert_int_eq((int)st.st_size, 4); /* not truncated through it */
    ck_assert_int_eq(unlink(tmp), 0);
    ck_assert_int_eq(st_writer_save(w, out), 0);
    ck_assert_int_eq(st_writer_save(w, out), 0); /* a regular file: replaced */
    st_writer_destroy(&w);
}
END_TEST

START_TEST(test_saved_header_is_space_padded_so_data_starts_8_byte_aligned) {
    int64_t sh[1] = {1};
    float v = 1;
    st_writer_t *w = st_writer_new();
    /* Names of lengths 1..8 make sure some header length needs padding. */
    const char *names[] = {"a", "bb", "ccc", "dddd", "eeeee", "ffffff",
                           "ggggggg", "hhhhhhhh"};
    for (int n = 0; n < 8; n++) {
        ck_assert_int_eq(st_writer_add_f32(w, names[n], 1, sh, &v), 0);
        ck_assert_int_eq(st_writer_save(w, tmp_path("pad.safetensors")), 0);
        FILE *fp = fopen(tmp_path("pad.safetensors"), "rb");
        unsigned char buf[1024];
        size_t len = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
        ck_assert_uint_eq(hl % 8, 0);
        ck_assert_uint_eq(len, 8 + hl + 4 * (uint64_t)(n + 1));
        ck_assert_int_eq(buf[8], '{');
        size_t end = 8 + hl;
        while (buf[end - 1] == ' ') end--;
        ck_assert_int_eq(buf[end - 1], '}');
        ck_assert_int_eq(access(tmp_path("pad.safetensors.tmp"), F_OK), -1);
    }
    st_writer_destroy(&w);
}
END_TEST

START_TEST(test_bf16_and_f16_widen_exactly_to_f32) {
    /* bits in, float32 bits out: normals, max finite, subnormals, -0. */
    static const uint16_t bf[] = {0x3f80, 0xc020, 0x3e20, 0x7f7f, 0x0001, 0x8000};
    static const uint32_t bf_want[] = {0x3f800000, 0xc0200000, 0x3e200000,
                                       0x7f7f0000, 0x00010000, 0x80000000};
    static const uint16_t hf[] = {0x3c00, 0xc100, 0x3100, 0x7bff, 0x0001, 0x8000};
    /* 1, -2.5, 0.15625, 65504, 2^-24, -0 */
    static const uint32_t hf_want[] = {0x3f800000, 0xc0200000, 0x3e200000,
                                       0x477fe000, 0x33800000, 0x80000000};
    int64_t sh[2] = {2, 3};
    st_writer_t *w = st_writer_new();
    ck_assert_int_eq(st_writer_add(w, "bf", KERN_BF16, 2, sh, bf), 0);
    ck_assert_int_eq(st_writer_add(w, "hf", KERN_F16, 2, sh, hf), 0);
    ck_assert_int_eq(st_writer_save(w, tmp_path("widen.safetensors")), 0);
    st_writer_destroy(&w);

    st_file_t *f = st_open(tmp_path("widen.safetensors"));
    TS_NEW(f);
    float out[6];
    uint32_t bits[6];
    ck_assert_int_eq(st_read_f32(f, "bf", 2, sh, out), 0);
    memcpy(bits, out, sizeof bits);
    for (int i = 0; i < 6; i++) ck_assert_uint_eq(bits[i], bf_want[i]);
    ck_assert_int_eq(st_read_f32(f, "hf", -1, NULL, out), 0);
    memcpy(bits, out, sizeof bits);
    for (int i = 0; i < 6; i++) ck_assert_uint_eq(bits[i], hf_want[i]);
    st_close(&f);
}
END_TEST

START_TEST(test_hand_built_file_with_metadata_and_gaps_opens) {
    /* Metadata in the middle, entries out of data order, a 4-byte gap. */
    float d[4] = {1, 2, 0, 3};
    st_file_t *f = open_built(
        "{\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]},"
        "\"__metadata__\":{\"k\":\"v\"},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}   ",
        d, sizeof d);
    TS_NEW(f);
    ck_assert_uint_eq(st_count(f), 2);
    ck_assert_str_eq(st_at(f, 0)->name, "a");   /* data order */
    ck_assert_str_eq(st_at(f, 1)->name, "z");
    ck_assert_str_eq(st_meta(f, "k"), "v");
    float out[2];
    int64_t s1 = 1;
    ck_assert_int_eq(st_read_f32(f, "z", 1, &s1, out), 0);
    ck_assert(out[0] == 3);
    st_close(&f);
}
END_TEST

START_TEST(test_parse_copies_the_buffer_so_the_caller_may_free_it) {
    float d[2] = {5, 6};
    size_t len;
    unsigned char *b = assemble(
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d,
        sizeof d, &len);
    st_file_t *f = st_parse(b, len);
    TS_NEW(f);
    memset(b, 0xff, len);
    free(b);
    float out[2];
    ck_assert_int_eq(st_read_f32(f, "t", -1, NULL, out), 0);
    ck_assert(out[0] == 5 && out[1] == 6);
    ck_assert_str_eq(st_find(f, "t")->name, "t");
    st_close(&f);
}
END_TEST

/* st_adopt: a file already in memory (header and data apart, as a worker
 * fetches it) is checked like any file, keeps the data buffer without a
 * copy, and frees it when the header is refused (ASan: no leak). */
START_TEST(test_adopt_owns_the_data_buffer_and_checks_the_header) {
    const char *hdr = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"__metadata__\":{\"k\":\"v\"}}";
    unsigned char *data = malloc(8);
    const float d[2] = { 7, 8 };
    memcpy(data, d, sizeof d);
    st_file_t *f = st_adopt("fetched v2", hdr, strlen(hdr), data, 8);
    TS_NEW(f);
    ck_assert_ptr_eq(st_find(f, "t")->data, data); /* no copy */
    float out[2];
    ck_assert_int_eq(st_read_f32(f, "t", -1, NULL, out), 0);
    ck_assert(out[0] == 7 && out[1] == 8);
    ck_assert_str_eq(st_meta(f, "k"), "v");
    st_close(&f);
    /* an entry past the data: refused, naming the origin; the buffer freed */
    const char *bad = "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    data = malloc(8);
    ck_assert_ptr_null(st_adopt("fetched v3", bad, strlen(bad), data, 8));
    ck_assert_msg(strstr(reel_err_text(), "fetched v3"), "%s", reel_err_text());
    /* not JSON */
    data = malloc(8);
    ck_assert_ptr_null(st_adopt("fetched v4", "{oops", 5, data, 8));
}
END_TEST

START_TEST(test_empty_tensors_overlap_nothing) {
    float d[2] = {1, 2};
    st_file_t *f = open_built(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[4,4]}}",
        d, sizeof d);
    TS_NEW(f);
    ck_assert_uint_eq(st_find(f, "e")->nbytes, 0);
    st_close(&f);
}
END_TEST

START_TEST(test_close_and_destroy_are_null_safe_and_idempotent) {
    st_close(NULL);
    st_file_t *f = NULL;
    st_close(&f);
    st_writer_destroy(NULL);
    st_writer_t *w = st_writer_new();
    st_writer_destroy(&w);
    st_writer_destroy(&w);
    ck_assert_ptr_null(w);
}
END_TEST

/* ---- malformed files ------------------------------------------------- */

START_TEST(test_open_of_missing_file_fails_naming_the_path) {
    reel_err_clear();
    ck_assert_ptr_null(st_open(tmp_path("nope.safetensors")));
    ck_assert_error_has("nope.safetensors");
    ck_assert_error_has("cannot open");
}
END_TEST

START_TEST(test_file_shorter_than_8_bytes_is_rejected) {
    const char *p = put_file("short.safetensors", "\x02\0\0\0\0", 5);
    ck_assert_ptr_null(st_open(p));
    ck_assert_error_has("short.safetensors");
    ck_assert_error_has("shorter than the 8-byte");
    ck_assert_ptr_null(st_parse("", 0));
    ck_assert_error_has("shorter than the 8-byte");
}
END_TEST

START_TEST(test_header_length_longer_than_the_file_is_rejected) {
    unsigned char b[8 + 4] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    const char *p = put_file("trunc.safetensors", b, sizeof b);
    ck_assert_ptr_null(st_open(p));
    ck_assert_error_has("trunc.safetensors");
    ck_assert_error_has("runs past the end of the file");
    ck_assert_ptr_null(st_parse(b, sizeof b));
    ck_assert_error_has("runs past the end of the file");
}
END_TEST

START_TEST(test_absurd_header_length_is_rejected) {
    unsigned char b[16] = {0, 0, 0, 0, 0, 1, 0, 0, '{', '}'};  /* 2^40 */
    ck_assert_ptr_null(st_parse(b, sizeof b));
    ck_assert_error_has("absurd");
    b[7] = 0xff;   /* would overflow 8 + N if added carelessly */
    ck_assert_ptr_null(st_parse(b, sizeof b));
    ck_assert_error_has("absurd");
}
END_TEST

/* What `git clone` without git-lfs leaves in place of a checkpoint, and a
 * web page saved under its name, are named as what they are, with what to
 * do, by st_open, st_header_read and st_parse alike (model/stand_in.h). */
START_TEST(test_git_lfs_pointer_and_html_page_are_named_not_called_absurd) {
    static const char lfs[] = "version https://git-lfs.github.com/spec/v1\n"
                              "oid sha256:4c2e0bb1b0ba4f3bd0b1c3b7cf4d5e3d7e0b6d25c2b1f0a8a9c6b8f2a1d0e9c7\n"
                              "size 5678000000\n";
    const char *p = put_file("diffusion_pytorch_model.safetensors", lfs, sizeof lfs - 1);
    ck_assert_ptr_null(st_open(p));
    ck_assert_error_has("diffusion_pytorch_model.safetensors is a Git LFS pointer, not the file");
    ck_assert_error_has("run `git lfs pull` in its repository; the file is 5678000000 bytes");
    int fd = open(p, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_ptr_null(st_header_read(fd, p, NULL, NULL));
    close(fd);
    ck_assert_error_has("is a Git LFS pointer, not the file");
    ck_assert_ptr_null(st_parse(lfs, sizeof lfs - 1));
    ck_assert_error_has("is a Git LFS pointer, not the file");
    static const char html[] = "\xef\xbb\xbf\n  <!DOCTYPE html><html><body>Sign in to Hugging Face</body></html>\n";
    p = put_file("model.safetensors", html, sizeof html - 1);
    ck_assert_ptr_null(st_open(p));
    ck_assert_error_has("model.safetensors is an HTML page, not the file");
    /* a real file whose header merely starts oddly is still judged as safetensors */
    unsigned char junk[16] = {'v', 'e', 'r', 's', 'i', 'o', 'n', ' ', '{', '}'};
    ck_assert_ptr_null(st_parse(junk, sizeof junk));
    ck_assert_error_has("absurd");
}
END_TEST

/* A PyTorch checkpoint handed to the safetensors reader (a .pth DiT, or
 * a release's VAE or text encoder in the DiT's place) is named as one:
 * torch.save's zip ("PK\3\4") and its older pickle (0x80 0x02). */
START_TEST(test_pytorch_checkpoint_is_named_as_one_not_as_corrupt) {
    unsigned char zip[32] = {'P', 'K', 3, 4, 20, 0, 0, 8, 0, 0, 0, 0};
    const char *p = put_file("diffusion_pytorch_model.pth", zip, sizeof zip);
    ck_assert_ptr_null(st_open(p));
    ck_assert_error_has("diffusion_pytorch_model.pth");
    ck_assert_error_has("a PyTorch checkpoint (torch.save), not safetensors");
    unsigned char pickle[32] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8};
    p = put_file("old.pth", pickle, sizeof pickle);
    ck_assert_ptr_null(st_open(p));
    ck_assert_error_has("a PyTorch checkpoint (torch.save), not safetensors");
    /* a merely absurd length is still called absurd */
    unsigned char junk[16] = {0x81, 0x02, 0, 0, 0, 1, 0, 0};
    ck_assert_ptr_null(st_parse(junk, sizeof junk));
    ck_assert_error_has("absurd");
}
END_TEST

START_TEST(test_every_truncation_of_a_valid_file_fails_cleanly) {
    int64_t sh[2] = {3, 5};
    float v[15] = {0};
    st_writer_t *w = st_writer_new();
    ck_assert_int_eq(st_writer_add_f32(w, "w", 2, sh, v), 0);
    ck_assert_int_eq(st_writer_meta(w, "k", "v"), 0);
    ck_assert_int_eq(st_writer_save(w, tmp_path("full.safetensors")), 0);
    st_writer_destroy(&w);
    FILE *fp = fopen(tmp_path("full.safetensors"), "rb");
    unsigned char buf[512];
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    st_file_t *f = st_parse(buf, len);
    TS_NEW(f);
    st_close(&f);
    for (size_t n = 0; n < len; n++) {
        /* Exact-size heap copies so ASan catches any read past the end. */
        unsigned char *c = malloc(n ? n : 1);
        memcpy(c, buf, n);
        reel_err_clear();
        ck_assert_msg(st_parse(c, n) == NULL, "truncated to %zu accepted", n);
        ck_assert_msg(reel_err_text()[0] != '\0', "no message at %zu", n);
        free(c);
    }
}
END_TEST

START_TEST(test_invalid_json_header_is_rejected) {
    expect_rejected("{\"a\": {\"dtype\": ", NULL, 0, "not valid JSON");
    expect_rejected("\xff\xfe", NULL, 0, "not valid JSON");
}
END_TEST

START_TEST(test_header_that_is_not_a_json_object_is_rejected) {
    expect_rejected("[1, 2]", NULL, 0, "not a JSON object");
    expect_rejected("{\"__metadata__\": [\"x\"]}", NULL, 0, "__metadata__",
                    "not a JSON object");
}
END_TEST

START_TEST(test_entry_missing_dtype_shape_or_offsets_is_rejected_naming_it) {
    expect_rejected("{\"enc.w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4,
                    "enc.w", "missing \"dtype\"");
    expect_rejected("{\"enc.w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", zeros, 4,
                    "enc.w", "missing \"shape\"");
    expect_rejected("{\"enc.w\":{\"dtype\":\"F32\",\"shape\":[1]}}", zeros, 4,
                    "enc.w", "missing \"data_offsets\"");
}
END_TEST

START_TEST(test_entry_fields_of_the_wrong_json_type_are_rejected_naming_it) {
    expect_rejected("{\"t1\":\"F32\"}", NULL, 0, "t1", "not a JSON object");
    expect_rejected("{\"t2\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}",
                    zeros, 4, "t2", "\"dtype\" is not a string");
    expect_rejected("{\"t3\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}",
                    zeros, 4, "t3", "\"shape\" is not an array");
    expect_rejected("{\"t4\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"b\":0}}}",
                    zeros, 4, "t4", "data_offsets");
    expect_rejected("{\"t5\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
                    zeros, 4, "t5", "data_offsets");
    expect_rejected("{\"t6\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}",
                    zeros, 4, "t6", "data_offsets");
    expect_rejected("{\"t7\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
                    zeros, 4, "t7", "data_offsets");
}
END_TEST

START_TEST(test_unknown_dtype_is_rejected_naming_the_tensor) {
    expect_rejected("{\"vae.conv\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                    zeros, 4, "vae.conv", "unknown dtype \"F17\"");
}
END_TEST

START_TEST(test_valid_but_unsupported_dtype_is_rejected_naming_the_tensor) {
    expect_rejected("{\"pos_ids\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
                    zeros, 8, "pos_ids", "unsupported dtype I64");
}
END_TEST

START_TEST(test_more_dims_than_kern_max_dims_is_rejected_naming_the_tensor) {
    expect_rejected("{\"deep\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1],"
                    "\"data_offsets\":[0,4]}}", zeros, 4, "deep", "6 dims");
}
END_TEST

START_TEST(test_negative_or_non_integer_dims_are_rejected_naming_the_tensor) {
    expect_rejected("{\"neg\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}",
                    NULL, 0, "neg", "shape[0] is not a non-negative integer");
    expect_rejected("{\"frac\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}",
                    zeros, 8, "frac", "shape[1] is not a non-negative integer");
    expect_rejected("{\"str\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}",
                    zeros, 8, "str", "shape[0]");
}
END_TEST

START_TEST(test_shape_whose_byte_count_overflows_is_rejected_naming_the_tensor) {
    /* numel fits, numel * 4 does not. */
    expect_rejected("{\"big\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                    "\"data_offsets\":[0,0]}}", NULL, 0, "big", "overflows");
    /* numel itself overflows. */
    expect_rejected("{\"bigger\":{\"dtype\":\"F16\",\"shape\":[4294967296,4294967296],"
                    "\"data_offsets\":[0,0]}}", NULL, 0, "bigger", "overflows");
}
END_TEST

START_TEST(test_data_offsets_that_end_before_they_begin_are_rejected) {
    expect_rejected("{\"rev\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}",
                    zeros, 8, "rev", "[8,4] end before they begin");
}
END_TEST

START_TEST(test_data_offsets_beyond_the_data_buffer_are_rejected) {
    expect_rejected("{\"oob\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                    zeros, 8, "oob", "run past the 8-byte data buffer");
    /* An end that would wrap a size_t sum must not slip through either. */
    expect_rejected("{\"huge\":{\"dtype\":\"F32\",\"shape\":[1],"
                    "\"data_offsets\":[9223372036854775804,9223372036854775807]}}",
                    zeros, 8, "huge", "run past");
}
END_TEST

START_TEST(test_byte_length_not_matching_dtype_and_shape_is_rejected) {
    expect_rejected("{\"short\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,6]}}",
                    zeros, 8, "short", "span 6 bytes", "needs 8");
    expect_rejected("{\"bf\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
                    zeros, 16, "bf", "span 16 bytes", "needs 8");
}
END_TEST

START_TEST(test_overlapping_tensors_are_rejected_naming_both) {
    /* Listed out of data order, so the check must sort before comparing. */
    expect_rejected("{\"second\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                    "\"first\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                    zeros, 12, "\"first\"", "\"second\"", "overlap");
    /* A long tensor covering a later, non-adjacent one. */
    expect_rejected("{\"outer\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                    "\"mid\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                    "\"inner\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
                    zeros, 16, "outer", "overlap");
    expect_rejected("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"y\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                    zeros, 4, "\"x\"", "\"y\"", "overlap");
}
END_TEST

START_TEST(test_non_string_metadata_value_is_rejected_naming_the_key) {
    expect_rejected("{\"__metadata__\":{\"ok\":\"yes\",\"steps\":30}}", NULL, 0,
                    "__metadata__", "\"steps\" is not a string");
}
END_TEST

START_TEST(test_duplicate_tensor_names_are_rejected) {
    expect_rejected("{\"dup.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"dup.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                    zeros, 8, "duplicate", "dup.w");
}
END_TEST

/* More tensors than a model file holds (empty ones cost nothing but their
 * entries: a million of them took seconds and gigabytes: helper-75) are
 * refused with the count, by the file reader and the header reader. */
START_TEST(test_too_many_tensors_are_refused_with_the_count) {
    size_t n = ST_MAX_TENSORS + 1, cap = n * 64 + 16, at = 0;
    char *json = malloc(cap);
    ck_assert_ptr_nonnull(json);
    json[at++] = '{';
    for (size_t i = 0; i < n; i++)
        at += (size_t)snprintf(json + at, cap - at, "%s\"t%zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                               i ? "," : "", i);
    json[at++] = '}';
    json[at] = '\0';
    expect_rejected(json, NULL, 0, "131073 tensors (at most 131072)");
    free(json);
}
END_TEST

/* ---- st_read_f32 ----------------------------------------------------- */

static st_file_t *one_tensor_file(void) {
    int64_t sh[2] = {3, 4};
    float v[12] = {0};
    st_writer_t *w = st_writer_new();
    ck_assert_int_eq(st_writer_add_f32(w, "blocks.0.ffn.0.weight", 2, sh, v), 0);
    ck_assert_int_eq(st_writer_save(w, tmp_path("one.safetensors")), 0);
    st_writer_destroy(&w);
    st_file_t *f = st_open(tmp_path("one.safetensors"));
    TS_NEW(f);
    return f;
}

START_TEST(test_read_f32_rejects_wrong_shape_naming_the_tensor) {
    st_file_t *f = one_tensor_file();
    int64_t want[2] = {128, 64};
    float dst[1] = {-1};
    ck_assert_int_eq(st_read_f32(f, "blocks.0.ffn.0.weight", 2, want, dst), -1);
    ck_assert_error_has("blocks.0.ffn.0.weight: shape [3,4], expected [128,64]");
    ck_assert(dst[0] == -1);   /* untouched */
    st_close(&f);
}
END_TEST

START_TEST(test_read_f32_rejects_wrong_rank_naming_the_tensor) {
    st_file_t *f = one_tensor_file();
    int64_t want[3] = {3, 4, 1};
    float dst[12];
    ck_assert_int_eq(st_read_f32(f, "blocks.0.ffn.0.weight", 3, want, dst), -1);
    ck_assert_error_has("blocks.0.ffn.0.weight: shape [3,4], expected [3,4,1]");
    ck_assert_int_eq(st_read_f32(f, "blocks.0.ffn.0.weight", 0, NULL, dst), -1);
    ck_assert_error_has("expected []");
    st_close(&f);
}
END_TEST

START_TEST(test_read_f32_rejects_missing_tensor_naming_it) {
    st_file_t *f = one_tensor_file();
    float dst[12];
    ck_assert_int_eq(st_read_f32(f, "blocks.9.ffn.0.weight", -1, NULL, dst), -1);
    ck_assert_error_has("blocks.9.ffn.0.weight");
    ck_assert_error_has("no such tensor");
    ck_assert_error_has("one.safetensors");
    st_close(&f);
}
END_TEST

/* ---- writer errors --------------------------------------------------- */

START_TEST(test_writer_rejects_duplicate_names_and_bad_shapes_leaving_itself_unchanged) {
    st_writer_t *w = st_writer_new();
    int64_t ok[1] = {1}, neg[2] = {2, -1}, big[2] = {INT64_MAX, 2};
    int64_t six[6] = {1, 1, 1, 1, 1, 1};
    float v[1] = {9};
    ck_assert_int_eq(st_writer_add_f32(w, "w", 1, ok, v), 0);
    ck_assert_int_eq(st_writer_add_f32(w, "w", 1, ok, v), -1);
    ck_assert_error_has("w: duplicate tensor name");
    ck_assert_int_eq(st_writer_add_f32(w, "six", 6, six, v), -1);
    ck_assert_error_has("six: 6 dims");
    ck_assert_int_eq(st_writer_add_f32(w, "minus", -1, ok, v), -1);
    ck_assert_error_has("minus");
    ck_assert_int_eq(st_writer_add_f32(w, "neg", 2, neg, v), -1);
    ck_assert_error_has("neg: shape[1] = -1 is negative");
    ck_assert_int_eq(st_writer_add_f32(w, "big", 2, big, v), -1);
    ck_assert_error_has("big: shape");
    ck_assert_int_eq(st_writer_add_f32(w, "__metadata__", 1, ok, v), -1);
    ck_assert_error_has("__metadata__");
    ck_assert_int_eq(st_writer_add_f32(w, "bad\xff", 1, ok, v), -1);
    ck_assert_int_eq(st_writer_add(w, "dt", (kern_dtype_t)7, 1, ok, v), -1);
    ck_assert_error_has("dt: dtype 7");
    ck_assert_int_eq(st_writer_meta(w, "k", "\xc3"), -1);
    ck_assert_error_has("\"k\"");

    ck_assert_int_eq(st_writer_save(w, tmp_path("unchanged.safetensors")), 0);
    st_writer_destroy(&w);
    st_file_t *f = st_open(tmp_path("unchanged.safetensors"));
    TS_NEW(f);
    ck_assert_uint_eq(st_count(f), 1);
    ck_assert_ptr_null(st_meta(f, "k"));
    st_close(&f);
}
END_TEST

START_TEST(test_save_into_missing_directory_fails_naming_the_path) {
    st_writer_t *w = st_writer_new();
    ck_assert_int_eq(st_writer_save(w, tmp_path("no_such_dir/x.safetensors")), -1);
    ck_assert_error_has("no_such_dir/x.safetensors");
    st_writer_destroy(&w);
}
END_TEST

START_TEST(test_save_replaces_an_existing_file_whole) {
    const char *p = put_file("replace.safetensors", "junk that is not safetensors", 28);
    float v[2] = {1, 2};
    int64_t sh[1] = {2};
    st_writer_t *w = st_writer_new();
    ck_assert_int_eq(st_writer_add_f32(w, "v", 1, sh, v), 0);
    ck_assert_int_eq(st_writer_save(w, p), 0);
    st_writer_destroy(&w);
    st_file_t *f = st_open(tmp_path("replace.safetensors"));
    TS_NEW(f);
    ck_assert_uint_eq(st_count(f), 1);
    st_close(&f);
    ck_assert_int_eq(access(tmp_path("replace.safetensors.tmp"), F_OK), -1);
}
END_TEST

/* ---- headers without their data, and st_save -------------------------- */

typedef struct {
    unsigned char buf[512];
    size_t n;
    int stop_after;          /* calls before saying stop; 0: never */
    int calls;
} sink_t;

static int sink(void *user, const void *p, size_t n) {
    sink_t *k = user;
    if (k->stop_after && ++k->calls > k->stop_after) return -1;
    ck_assert_uint_le(k->n + n, sizeof k->buf);
    memcpy(k->buf + k->n, p, n);
    k->n += n;
    return 0;
}

/* A header is judged without its data, and the data read after it, into
 * any buffer, hands the hook the file's bytes exactly once, in order. */
START_TEST(test_header_then_data_read_every_byte_once_in_order) {
    float d[3] = { 1, 2, 3 };
    size_t len;
    unsigned char *b = assemble("{\"__metadata__\":{\"k\":\"v\"},\"b\":{\"dtype\":\"F32\",\"shape\":[1],"
                                "\"data_offsets\":[8,12]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                                d, sizeof d, &len);
    const char *p = put_file("h.safetensors", b, len);
    FILE *fp = fopen(p, "rb");
    int fd = fileno(fp);
    sink_t k = { .n = 0 };
    st_header_t *h = st_header_read(fd, p, sink, &k);
    TS_NEW(h);
    ck_assert_uint_eq(st_header_count(h), 2);
    ck_assert_str_eq(st_header_at(h, 0)->name, "a"); /* data order */
    ck_assert_uint_eq(st_header_at(h, 1)->begin, 8);
    ck_assert_uint_eq(st_header_at(h, 1)->nbytes, 4);
    ck_assert_ptr_null(st_header_at(h, 2));
    ck_assert_str_eq(st_header_meta(h, "k"), "v");
    ck_assert_ptr_null(st_header_meta(h, "x"));
    ck_assert_uint_eq(st_header_data_len(h), sizeof d);
    size_t hlen;
    ck_assert_ptr_nonnull(st_header_text(h, &hlen));
    ck_assert_uint_eq(8 + hlen + sizeof d, len);
    float got[3];
    ck_assert_int_eq(st_header_read_data(h, fd, p, got, sink, &k), 0);
    ck_assert_int_eq(memcmp(got, d, sizeof d), 0);
    ck_assert_uint_eq(k.n, len);
    ck_assert_int_eq(memcmp(k.buf, b, len), 0);
    /* without a buffer: the hook alone sees the data */
    k.n = 0;
    st_header_free(&h);
    h = st_header_read(fd, p, sink, &k);
    ck_assert_int_eq(st_header_read_data(h, fd, p, NULL, sink, &k), 0);
    ck_assert_int_eq(memcmp(k.buf, b, len), 0);
    /* a file that grew since its header was read is refused */
    FILE *ap = fopen(p, "ab");
    fputc(0, ap);
    fclose(ap);
    ck_assert_int_eq(st_header_read_data(h, fd, p, got, NULL, NULL), -1);
    ck_assert_error_has("changed size");
    st_header_free(&h);
    st_header_free(&h);
    st_header_free(NULL);
    /* a hook that says stop */
    k = (sink_t){ .stop_after = 1 };
    ck_assert_ptr_null(st_header_read(fd, p, sink, &k));
    ck_assert_error_has("reading stopped");
    fclose(fp);
    free(b);
}
END_TEST

START_TEST(test_header_read_refuses_what_open_refuses) {
    size_t len;
    unsigned char *b = assemble("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", zeros, 8, &len);
    const char *p = put_file("o.safetensors", b, len);
    FILE *fp = fopen(p, "rb");
    ck_assert_ptr_null(st_header_read(fileno(fp), p, NULL, NULL));
    ck_assert_error_has("overlap");
    st_probe_t pr;
    ck_assert_int_eq(st_probe_fd(fileno(fp), p, &pr), -1); /* the probe too, now */
    fclose(fp);
    free(b);
}
END_TEST

/* st_save writes a file from memory as it is: metadata, names, dtypes,
 * bytes; the offsets packed back to back. */
START_TEST(test_save_writes_an_open_file_back_whole) {
    uint16_t h[3] = { 0x3f80, 0x4000, 0x4040 };
    float d[2] = { 5, 6 };
    unsigned char data[16] = { 0 };
    memcpy(data, d, 8);
    memcpy(data + 10, h, 6); /* a gap of 2 bytes before the BF16 tensor */
    size_t len;
    unsigned char *b = assemble("{\"__metadata__\":{\"config\":\"tiny\"},\"f\":{\"dtype\":\"F32\",\"shape\":[2],"
                                "\"data_offsets\":[0,8]},\"h\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[10,16]}}",
                                data, sizeof data, &len);
    st_file_t *f = st_parse(b, len);
    TS_NEW(f);
    ck_assert_uint_eq(st_data_len(f), 16);
    ck_assert_uint_eq(st_offset(f, st_find(f, "h")), 10);
    ck_assert_str_eq(st_origin(f), "safetensors buffer");
    ck_assert_int_eq(st_save(f, tmp_path("saved.safetensors")), 0);
    st_file_t *g = st_open(tmp_path("saved.safetensors"));
    TS_NEW(g);
    ck_assert_str_eq(st_meta(g, "config"), "tiny");
    ck_assert_uint_eq(st_data_len(g), 14); /* no gap */
    ck_assert_int_eq(st_find(g, "h")->dtype, KERN_BF16);
    ck_assert_int_eq(memcmp(st_find(g, "h")->data, h, 6), 0);
    ck_assert_int_eq(memcmp(st_find(g, "f")->data, d, 8), 0);
    st_close(&g);
    ck_assert_int_eq(st_save(f, "/nonexistent-dir/x.safetensors"), -1);
    st_close(&f);
    free(b);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    /* Unchecked: runs in the parent, so the directory goes even when a
     * forked test dies. */
    tcase_add_unchecked_fixture(tc, make_tmpdir, remove_tmpdir);
    tcase_add_test(tc, test_round_trip_preserves_names_dtypes_shapes_bytes_and_metadata);
    tcase_add_test(tc, test_save_replaces_only_a_regular_file);
    tcase_add_test(tc, test_saved_header_is_space_padded_so_data_starts_8_byte_aligned);
    tcase_add_test(tc, test_bf16_and_f16_widen_exactly_to_f32);
    tcase_add_test(tc, test_hand_built_file_with_metadata_and_gaps_opens);
    tcase_add_test(tc, test_parse_copies_the_buffer_so_the_caller_may_free_it);
    tcase_add_test(tc, test_empty_tensors_overlap_nothing);
    tcase_add_test(tc, test_close_and_destroy_are_null_safe_and_idempotent);
    tcase_add_test(tc, test_open_of_missing_file_fails_naming_the_path);
    tcase_add_test(tc, test_file_shorter_than_8_bytes_is_rejected);
    tcase_add_test(tc, test_header_length_longer_than_the_file_is_rejected);
    tcase_add_test(tc, test_absurd_header_length_is_rejected);
    tcase_add_test(tc, test_pytorch_checkpoint_is_named_as_one_not_as_corrupt);
    tcase_add_test(tc, test_git_lfs_pointer_and_html_page_are_named_not_called_absurd);
    tcase_add_test(tc, test_every_truncation_of_a_valid_file_fails_cleanly);
    tcase_add_test(tc, test_invalid_json_header_is_rejected);
    tcase_add_test(tc, test_header_that_is_not_a_json_object_is_rejected);
    tcase_add_test(tc, test_entry_missing_dtype_shape_or_offsets_is_rejected_naming_it);
    tcase_add_test(tc, test_entry_fields_of_the_wrong_json_type_are_rejected_naming_it);
    tcase_add_test(tc, test_unknown_dtype_is_rejected_naming_the_tensor);
    tcase_add_test(tc, test_valid_but_unsupported_dtype_is_rejected_naming_the_tensor);
    tcase_add_test(tc, test_more_dims_than_kern_max_dims_is_rejected_naming_the_tensor);
    tcase_add_test(tc, test_negative_or_non_integer_dims_are_rejected_naming_the_tensor);
    tcase_add_test(tc, test_shape_whose_byte_count_overflows_is_rejected_naming_the_tensor);
    tcase_add_test(tc, test_data_offsets_that_end_before_they_begin_are_rejected);
    tcase_add_test(tc, test_data_offsets_beyond_the_data_buffer_are_rejected);
    tcase_add_test(tc, test_byte_length_not_matching_dtype_and_shape_is_rejected);
    tcase_add_test(tc, test_overlapping_tensors_are_rejected_naming_both);
    tcase_add_test(tc, test_non_string_metadata_value_is_rejected_naming_the_key);
    tcase_add_test(tc, test_duplicate_tensor_names_are_rejected);
    tcase_add_test(tc, test_too_many_tensors_are_refused_with_the_count);
    tcase_add_test(tc, test_read_f32_rejects_wrong_shape_naming_the_tensor);
    tcase_add_test(tc, test_read_f32_rejects_wrong_rank_naming_the_tensor);
    tcase_add_test(tc, test_read_f32_rejects_missing_tensor_naming_it);
    tcase_add_test(tc, test_writer_rejects_duplicate_names_and_bad_shapes_leaving_itself_unchanged);
    tcase_add_test(tc, test_save_into_missing_directory_fails_naming_the_path);
    tcase_add_test(tc, test_save_replaces_an_existing_file_whole);
    tcase_add_test(tc, test_adopt_owns_the_data_buffer_and_checks_the_header);
    tcase_add_test(tc, test_header_then_data_read_every_byte_once_in_order);
    tcase_add_test(tc, test_header_read_refuses_what_open_refuses);
    tcase_add_test(tc, test_save_writes_an_open_file_back_whole);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return ts_run(suite());
}
