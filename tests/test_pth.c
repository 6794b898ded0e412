/* test_pth.c -- PyTorch .pth checkpoints (model/pth.h): archives laid out
 * as torch.save writes them read back exactly, and one refusal per kind of
 * bad archive, each naming its culprit.
 *
 * tests/pth_make.py builds every archive (Python's pickle with a stand-in
 * torch module writes the opcodes torch.save writes) and expect.safetensors,
 * the tensors each good archive must read as, gathered in Python by
 * explicit strided indexing: the comparison is byte for byte. The script
 * runs once, into a directory the unchecked fixture makes and removes. */
#include "model/pth.h"
#include "base/error.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/support.h"

static char dir[64];

static void make_archives(void) {
    ts_mkdtemp(dir, sizeof dir, "pth");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "python3 tests/pth_make.py '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_pth: %s failed (run from the repository root)\n", cmd);
        ts_rmtree(dir);
        exit(2);
    }
}

static void remove_archives(void) { ts_rmtree(dir); }

static const char *at(const char *name) { return ts_join(dir, name); }

#define ck_assert_error_has(sub) \
    ck_assert_msg(strstr(reel_err_text(), (sub)) != NULL, "reel_err_text() = \"%s\" lacks \"%s\"", reel_err_text(), (sub))

/* f holds exactly expect.safetensors' tensors: names, dtypes, shapes, bytes. */
static void assert_matches_expect(const st_file_t *f) {
    st_file_t *want;
    TS_NEW(want = st_open(at("expect.safetensors")));
    ck_assert_uint_eq(st_count(f), st_count(want));
    for (size_t i = 0; i < st_count(want); i++) {
        const st_tensor_t *w = st_at(want, i), *g = st_find(f, w->name);
        ck_assert_msg(g != NULL, "tensor %s missing", w->name);
        ck_assert_msg(g->dtype == w->dtype, "%s: dtype %d, expected %d", w->name, g->dtype, w->dtype);
        ck_assert_int_eq(g->ndim, w->ndim);
        for (int d = 0; d < w->ndim; d++) ck_assert_int_eq(g->shape[d], w->shape[d]);
        ck_assert_uint_eq(g->nbytes, w->nbytes);
        ck_assert_msg(w->nbytes == 0 || memcmp(g->data, w->data, w->nbytes) == 0, "%s: bytes differ", w->name);
    }
    st_close(&want);
}

static void assert_loads_as_expected(const char *name) {
    st_file_t *f;
    TS_NEW(f = pth_load(at(name)));
    assert_matches_expect(f);
    st_close(&f);
}

/* The archive is refused and the message names every culprit given. */
static void assert_refused(const char *name, const char *culprit, const char *also) {
    st_file_t *f = pth_load(at(name));
    ck_assert_msg(f == NULL, "%s loaded", name);
    const char *msg = reel_err_text();
    ck_assert_msg(strstr(msg, culprit) != NULL, "%s: \"%s\" does not name %s", name, msg, culprit);
    ck_assert_msg(!also || strstr(msg, also) != NULL, "%s: \"%s\" does not name %s", name, msg, also);
    ck_assert_msg(strstr(msg, name) != NULL, "%s: \"%s\" does not name the file", name, msg);
}

/* Storage element i of storage k, as pth_make.py writes it. */
static float storage_value(int k, int64_t i) { return (float)(((7 * i + 3 * k) % 61) - 30) / 4.0f; }

START_TEST(test_bf16_f32_f16_state_dict_reads_back_byte_for_byte) {
    assert_loads_as_expected("good.pth");
}
END_TEST

START_TEST(test_strided_view_with_offset_is_copied_out_contiguous) {
    st_file_t *f;
    TS_NEW(f = pth_load(at("good.pth")));
    float got[12];
    int64_t shape[2] = {3, 4};
    TS_OK(st_read_f32(f, "view.t", 2, shape, got));
    /* storage 3, offset 5, stride (1, 6): element (i, j) is storage[5 + i + 6 j] */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) ck_assert_float_eq(got[i * 4 + j], storage_value(3, 5 + i + 6 * j));
    float b[6];
    int64_t bshape[2] = {2, 3};
    TS_OK(st_read_f32(f, "bcast", 2, bshape, b));
    for (int j = 0; j < 3; j++) ck_assert_float_eq(b[j], b[3 + j]);
    st_close(&f);
}
END_TEST

START_TEST(test_tensors_sharing_one_storage_each_get_their_own_bytes) {
    st_file_t *f;
    TS_NEW(f = pth_load(at("good.pth")));
    const st_tensor_t *a = st_find(f, "shared.a"), *b = st_find(f, "shared.b");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_ne(a->data, b->data);
    float x[12], y[12];
    TS_OK(st_read_f32(f, "shared.a", -1, NULL, x));
    TS_OK(st_read_f32(f, "shared.b", -1, NULL, y));
    for (int i = 0; i < 12; i++) {
        ck_assert_float_eq(x[i], storage_value(4, i));
        ck_assert_float_eq(y[i], storage_value(4, 12 + i));
    }
    st_close(&f);
}
END_TEST

START_TEST(test_zip64_extra_fields_and_end_records_read_like_the_plain_archive) {
    assert_loads_as_expected("zip64.pth");
}
END_TEST

START_TEST(test_pythons_zipfile_archives_plain_and_forced_zip64_read_alike) {
    assert_loads_as_expected("pyzip.pth");
    assert_loads_as_expected("pyzip64.pth");
}
END_TEST

START_TEST(test_protocol_4_pickle_reads_alike) {
    assert_loads_as_expected("proto4.pth");
}
END_TEST

START_TEST(test_parse_over_memory_reads_what_load_reads) {
    size_t n;
    char *buf = ts_read_file(at("good.pth"), &n);
    st_file_t *f;
    TS_NEW(f = pth_parse(buf, n, "good in memory"));
    free(buf);
    assert_matches_expect(f);
    ck_assert_str_eq(st_origin(f), "good in memory");
    st_close(&f);
}
END_TEST

START_TEST(test_open_any_tells_a_zip_checkpoint_from_safetensors) {
    st_file_t *f;
    TS_NEW(f = weights_open_any(at("good.pth")));
    assert_matches_expect(f);
    st_close(&f);
    TS_NEW(f = weights_open_any(at("expect.safetensors")));
    assert_matches_expect(f);
    st_close(&f);
    ck_assert(pth_sniff("PK\3\4rest", 8));
    ck_assert(!pth_sniff("PK\3", 3));
    ck_assert(!pth_sniff("\x10\0\0\0\0\0\0\0{", 9));
}
END_TEST

/* A release's .pth (the text encoder, the VAE) cloned without git-lfs is
 * its pointer: named as one, through pth_load, pth_parse and
 * weights_open_any alike (model/stand_in.h), not as a zip without its end. */
START_TEST(test_git_lfs_pointer_in_place_of_a_pth_is_named_as_one) {
    static const char lfs[] = "version https://git-lfs.github.com/spec/v1\n"
                              "oid sha256:0000000000000000000000000000000000000000000000000000000000000000\n"
                              "size 11361920418\n";
    const char *p = at("models_t5_umt5-xxl-enc-bf16.pth");
    ts_write_file(p, lfs, sizeof lfs - 1);
    ck_assert_ptr_null(pth_load(p));
    ck_assert_error_has("models_t5_umt5-xxl-enc-bf16.pth is a Git LFS pointer, not the file (run `git lfs pull`");
    ck_assert_ptr_null(weights_open_any(p));
    ck_assert_error_has("models_t5_umt5-xxl-enc-bf16.pth is a Git LFS pointer");
    ck_assert_ptr_null(pth_parse(lfs, sizeof lfs - 1, "buf.pth"));
    ck_assert_error_has("buf.pth is a Git LFS pointer");
    static const char html[] = "<html><head><title>404</title></head></html>";
    p = at("Wan2.1_VAE.pth");
    ts_write_file(p, html, sizeof html - 1);
    ck_assert_ptr_null(weights_open_any(p));
    ck_assert_error_has("Wan2.1_VAE.pth is an HTML page, not the file");
}
END_TEST

START_TEST(test_os_system_global_is_refused_by_name) {
    assert_refused("bad_os_system.pth", "os.system", "not allowed");
}
END_TEST

START_TEST(test_builtins_eval_global_is_refused_by_name) {
    assert_refused("bad_eval.pth", "builtins.eval", NULL);
}
END_TEST

START_TEST(test_long_storage_is_refused_naming_the_storage_type) {
    assert_refused("bad_long.pth", "LongStorage", NULL);
}
END_TEST

START_TEST(test_truncated_archive_is_refused) {
    assert_refused("bad_truncated.pth", "truncated", NULL);
}
END_TEST

START_TEST(test_overlapping_entries_are_refused_naming_both) {
    assert_refused("bad_overlap.pth", "good/data/0", "good/data/1");
}
END_TEST

START_TEST(test_deflated_entry_is_refused_naming_the_method) {
    assert_refused("bad_deflate.pth", "deflate", "archive/data/0");
}
END_TEST

START_TEST(test_local_header_disagreeing_with_central_directory_is_refused) {
    assert_refused("bad_mismatch.pth", "local header", "good/data/0");
}
END_TEST

START_TEST(test_declared_size_past_the_end_of_the_file_is_refused) {
    assert_refused("bad_beyond.pth", "past the end of the file", "good/data/0");
}
END_TEST

START_TEST(test_storage_too_small_for_the_view_is_refused_naming_the_tensor) {
    assert_refused("bad_small_storage.pth", "too small", "w.small");
}
END_TEST

START_TEST(test_view_reaching_past_2_64_elements_is_refused_saying_so) {
    assert_refused("bad_overflow_view.pth", "past 2^64", "w.huge");
}
END_TEST

START_TEST(test_view_expanded_far_past_the_archive_size_is_refused) {
    assert_refused("bad_expand.pth", "w.expand", "twice the archive");
}
END_TEST

START_TEST(test_missing_storage_record_is_refused_naming_it) {
    assert_refused("bad_missing.pth", "archive/data/7", "w.ghost");
}
END_TEST

START_TEST(test_top_level_list_is_refused) {
    assert_refused("bad_list.pth", "a list, not a dict", NULL);
}
END_TEST

START_TEST(test_unknown_opcode_is_refused_naming_the_byte) {
    assert_refused("bad_opcode.pth", "0xfe", NULL);
}
END_TEST

START_TEST(test_value_that_is_not_a_tensor_is_refused_naming_the_key) {
    assert_refused("bad_not_tensor.pth", "\"n\" is an int", NULL);
}
END_TEST

START_TEST(test_empty_and_garbage_buffers_are_refused) {
    ck_assert_ptr_null(pth_parse("", 0, "empty"));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "empty"));
    ck_assert_ptr_null(pth_parse("PK\3\4garbage", 11, "garbage"));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "not a zip"));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("pth");
    TCase *tc = tcase_create("pth");
    tcase_add_unchecked_fixture(tc, make_archives, remove_archives);
    tcase_add_test(tc, test_bf16_f32_f16_state_dict_reads_back_byte_for_byte);
    tcase_add_test(tc, test_strided_view_with_offset_is_copied_out_contiguous);
    tcase_add_test(tc, test_tensors_sharing_one_storage_each_get_their_own_bytes);
    tcase_add_test(tc, test_zip64_extra_fields_and_end_records_read_like_the_plain_archive);
    tcase_add_test(tc, test_pythons_zipfile_archives_plain_and_forced_zip64_read_alike);
    tcase_add_test(tc, test_protocol_4_pickle_reads_alike);
    tcase_add_test(tc, test_parse_over_memory_reads_what_load_reads);
    tcase_add_test(tc, test_open_any_tells_a_zip_checkpoint_from_safetensors);
    tcase_add_test(tc, test_git_lfs_pointer_in_place_of_a_pth_is_named_as_one);
    tcase_add_test(tc, test_os_system_global_is_refused_by_name);
    tcase_add_test(tc, test_builtins_eval_global_is_refused_by_name);
    tcase_add_test(tc, test_long_storage_is_refused_naming_the_storage_type);
    tcase_add_test(tc, test_truncated_archive_is_refused);
    tcase_add_test(tc, test_overlapping_entries_are_refused_naming_both);
    tcase_add_test(tc, test_deflated_entry_is_refused_naming_the_method);
    tcase_add_test(tc, test_local_header_disagreeing_with_central_directory_is_refused);
    tcase_add_test(tc, test_declared_size_past_the_end_of_the_file_is_refused);
    tcase_add_test(tc, test_storage_too_small_for_the_view_is_refused_naming_the_tensor);
    tcase_add_test(tc, test_view_reaching_past_2_64_elements_is_refused_saying_so);
    tcase_add_test(tc, test_view_expanded_far_past_the_archive_size_is_refused);
    tcase_add_test(tc, test_missing_storage_record_is_refused_naming_it);
    tcase_add_test(tc, test_top_level_list_is_refused);
    tcase_add_test(tc, test_unknown_opcode_is_refused_naming_the_byte);
    tcase_add_test(tc, test_value_that_is_not_a_tensor_is_refused_naming_the_key);
    tcase_add_test(tc, test_empty_and_garbage_buffers_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
