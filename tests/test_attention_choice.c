/* test_attention_choice.c -- which attention AUTO takes (kernels/ops.h,
 * kern_attention_choose): cuDNN's fused SDPA on CUDA in BF16 where it is
 * ready and the head fits, the decomposition's pick rule everywhere else;
 * REEL_ATTN and the worker's --attention choose the mode; the plan a
 * workspace is sized by follows the choice; the line a worker logs names
 * the path and why. All on the CPU: the CUDA plans need no device, and the
 * CUDA backend's readiness is what kern_attention_set_sdpa_ready is told.
 * Cases that read $REEL_ATTN run in a child process (it is read once). */
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "base/error.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/support.h"

static bool have_sdpa(void) { return kern_registry_lookup(KERN_OP_ATTENTION_SDPA, KERN_BACKEND_CUDA, KERN_BF16) != NULL; }

START_TEST(test_auto_takes_the_fused_sdpa_on_cuda_bf16_only_once_it_is_ready) {
    kern_attention_set_mode(KERN_ATTN_MODE_AUTO);
    kern_attention_set_sdpa_ready(false, "cuDNN could not be loaded (the fused attention is off): test");
    const char *why = NULL;
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, 32760, 32760, 128, &why), KERN_ATTN_DECOMPOSED);
    ck_assert_str_eq(why, have_sdpa() ? "cuDNN could not be loaded (the fused attention is off): test"
                                      : "this build has no cuDNN SDPA kernel");
    kern_attention_set_sdpa_ready(true, NULL);
    kern_attn_path_t p = kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, 32760, 32760, 128, &why);
    if (have_sdpa()) {
        ck_assert_int_eq(p, KERN_ATTN_SDPA);
        ck_assert_str_eq(why, "cuDNN's fused SDPA");
        kern_attn_plan_t plan;
        TS_OK(kern_attention_plan(KERN_BACKEND_CUDA, KERN_BF16, 32760, 32760, 12, 128, NULL, &plan));
        ck_assert_int_eq(plan.path, KERN_ATTN_SDPA); /* the workspace is sized for what runs */
        /* small ones too: one launch either way, and cuDNN's is the tested fused one */
        ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, 16, 16, 64, NULL), KERN_ATTN_SDPA);
    } else {
        ck_assert_int_eq(p, KERN_ATTN_DECOMPOSED);
        ck_assert_str_eq(why, "this build has no cuDNN SDPA kernel");
    }
    /* everything else keeps the pick rule */
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_F32, 32760, 32760, 128, &why), KERN_ATTN_DECOMPOSED);
    ck_assert_str_eq(why, "not CUDA in BF16: the pick rule");
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CPU, KERN_BF16, 16, 16, 64, NULL), KERN_ATTN_FUSED);
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, 32760, 32760, 256, &why), KERN_ATTN_DECOMPOSED);
    ck_assert_ptr_nonnull(strstr(why, "head is wider"));
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, 64, 64, 100, &why), KERN_ATTN_FUSED);
    ck_assert_ptr_nonnull(strstr(why, "multiple of 8"));
    kern_attention_set_sdpa_ready(false, "no CUDA backend has come up in this process");
}
END_TEST

START_TEST(test_decomposed_mode_keeps_the_pick_rule_even_when_the_fused_path_is_ready) {
    kern_attention_set_sdpa_ready(true, NULL);
    kern_attention_set_mode(KERN_ATTN_MODE_DECOMPOSED);
    const char *why = NULL;
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, 32760, 32760, 128, &why), KERN_ATTN_DECOMPOSED);
    ck_assert_str_eq(why, "REEL_ATTN=decomposed");
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, 16, 16, 64, NULL), KERN_ATTN_FUSED);
    char line[320];
    kern_attention_describe(KERN_BACKEND_CUDA, KERN_BF16, line, sizeof line);
    ck_assert_str_eq(line, "attention decomposed (mode decomposed): REEL_ATTN=decomposed");
    kern_attention_set_mode(KERN_ATTN_MODE_FUSED);
    kern_attention_set_sdpa_ready(false, "cuDNN has no cudnnBackendExecute (libcudnn.so.9 is too old: the fused "
                                         "attention is off)");
    kern_attention_describe(KERN_BACKEND_CUDA, KERN_BF16, line, sizeof line);
    ck_assert_msg(strstr(line, "attention decomposed (mode fused): ") == line, "%s", line);
    ck_assert_msg(strstr(line, "(WARNING: fused was asked for)") != NULL, "%s", line);
    kern_attention_set_mode(KERN_ATTN_MODE_AUTO);
    kern_attention_set_sdpa_ready(false, "no CUDA backend has come up in this process");
}
END_TEST

/* On the CPU in F32 AUTO takes the CPU's own kernel at every size: whole
 * rows below 2^20 scores per head, flash-style beyond (kernels/cpu/
 * cpu_attn.h), whose scratch is bounded whatever the sequence, for heads
 * of any width; decomposed mode keeps the pick rule there too, and the
 * worker's line says which. A dtype with no CPU kernel keeps the rule. */
START_TEST(test_auto_on_the_cpu_takes_its_own_kernel_at_every_size_unless_decomposed_is_asked) {
    static const int64_t sizes[][3] = { { 32760, 32760, 128 }, { 32760, 512, 128 }, { 1, (int64_t)1 << 24, 16 },
                                        { 4, 4, 512 }, { 16, 16, 64 }, { 1024, 1024, 64 } };
    const char *why = NULL;
    kern_attention_set_mode(KERN_ATTN_MODE_AUTO);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CPU, KERN_F32, sizes[i][0], sizes[i][1], sizes[i][2], &why),
                         KERN_ATTN_FUSED);
        ck_assert_ptr_nonnull(strstr(why, "flash-style"));
        kern_attn_plan_t plan;
        TS_OK(kern_attention_plan(KERN_BACKEND_CPU, KERN_F32, sizes[i][0], sizes[i][1], 2, sizes[i][2], NULL, &plan));
        ck_assert_int_eq(plan.path, KERN_ATTN_FUSED);
        ck_assert_msg(plan.scratch_bytes <= ((size_t)16 << 20), "%lld x %lld: %zu bytes of scratch",
                      (long long)sizes[i][0], (long long)sizes[i][1], plan.scratch_bytes);
    }
    char line[320];
    kern_attention_describe(KERN_BACKEND_CPU, KERN_F32, line, sizeof line);
    ck_assert_msg(strstr(line, "attention fused (mode auto): the CPU's attention kernel") == line, "%s", line);
    kern_attention_set_mode(KERN_ATTN_MODE_DECOMPOSED);
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CPU, KERN_F32, 32760, 32760, 128, &why), KERN_ATTN_DECOMPOSED);
    ck_assert_str_eq(why, "REEL_ATTN=decomposed");
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CPU, KERN_F32, 16, 16, 64, NULL), KERN_ATTN_FUSED);
    kern_attention_describe(KERN_BACKEND_CPU, KERN_F32, line, sizeof line);
    ck_assert_str_eq(line, "attention decomposed (mode decomposed): REEL_ATTN=decomposed");
    kern_attention_set_mode(KERN_ATTN_MODE_AUTO);
    ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CPU, KERN_BF16, 32760, 32760, 128, &why), KERN_ATTN_DECOMPOSED);
    ck_assert_str_eq(why, "not CUDA in BF16: the pick rule");
}
END_TEST

START_TEST(test_modes_parse_by_name_and_nothing_else) {
    kern_attn_mode_t m;
    TS_OK(kern_attention_mode_parse("fused", &m));
    ck_assert_int_eq(m, KERN_ATTN_MODE_FUSED);
    TS_OK(kern_attention_mode_parse("decomposed", &m));
    ck_assert_int_eq(m, KERN_ATTN_MODE_DECOMPOSED);
    TS_OK(kern_attention_mode_parse("auto", &m));
    ck_assert_int_eq(m, KERN_ATTN_MODE_AUTO);
    ck_assert_int_eq(kern_attention_mode_parse("flash", &m), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "auto, fused or decomposed"));
}
END_TEST

/* In a child: $REEL_ATTN = value, then the mode and the describe line. */
static int env_child(const char *value, kern_attn_mode_t want, const char *line_has) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        setenv("REEL_ATTN", value, 1);
        kern_attention_mode_reload(); /* the parent (one process for every case, CK_FORK=no) may have set it */
        char line[320];
        kern_attention_describe(KERN_BACKEND_CUDA, KERN_BF16, line, sizeof line);
        int ok = kern_attention_mode() == want && strstr(line, line_has) != NULL;
        if (!ok) printf("  REEL_ATTN=%s: mode %s, line '%s'\n", value, kern_attention_mode_name(kern_attention_mode()), line);
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

START_TEST(test_reel_attn_sets_the_mode_and_a_value_not_understood_is_auto_and_said) {
    ck_assert_int_eq(env_child("decomposed", KERN_ATTN_MODE_DECOMPOSED, "(mode decomposed)"), 0);
    ck_assert_int_eq(env_child("fused", KERN_ATTN_MODE_FUSED, "(mode fused"), 0);
    ck_assert_int_eq(env_child("flash", KERN_ATTN_MODE_AUTO, "(mode auto, REEL_ATTN not understood)"), 0);
    ck_assert_int_eq(env_child("", KERN_ATTN_MODE_AUTO, "(mode auto)"), 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("attention_choice");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_auto_takes_the_fused_sdpa_on_cuda_bf16_only_once_it_is_ready);
    tcase_add_test(tc, test_decomposed_mode_keeps_the_pick_rule_even_when_the_fused_path_is_ready);
    tcase_add_test(tc, test_auto_on_the_cpu_takes_its_own_kernel_at_every_size_unless_decomposed_is_asked);
    tcase_add_test(tc, test_modes_parse_by_name_and_nothing_else);
    tcase_add_test(tc, test_reel_attn_sets_the_mode_and_a_value_not_understood_is_auto_and_said);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
