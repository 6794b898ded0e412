/* test_cudnn_lazy.c -- cuDNN opened on first use (kernels/cuda/
 * cudnn_lazy.c): no binary links it, so a machine without cuDNN (or with
 * one too old) runs everything but the fused attention. Each case runs in
 * a child process of its own (the library is opened once per process),
 * with REEL_CUDNN_LIB naming what to open: nothing at all, a fake library
 * built here that lacks a function, or the real one where it is
 * installed. No GPU needed. Without cuDNN in the build it says so. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/support.h"

#ifdef HAVE_CUDNN
#include <cudnn.h>
int reel_cudnn_lazy_check(const char **reason);

static char dir[64];

static int mapped(const char *lib) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, lib)) found = 1;
    fclose(f);
    return found;
}

/* Runs fn in a child with REEL_CUDNN_LIB=lib; its exit status (0: the
 * checks in it held; it prints what did not). */
static int in_child(const char *lib, int (*fn)(void)) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        setenv("REEL_CUDNN_LIB", lib, 1);
        int rc = fn();
        fflush(stdout);
        _exit(rc);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#define WANT(cond, ...) do { if (!(cond)) { printf("  want " #cond ": " __VA_ARGS__); printf("\n"); return 1; } } while (0)

static int missing_library(void) {
    WANT(mapped("libcudnn") == 0, "libcudnn mapped before any cuDNN call");
    cudnnHandle_t h = NULL;
    cudnnStatus_t st = cudnnCreate(&h);
    WANT(st == CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate gave %d", (int)st);
    const char *why = cudnnGetErrorString(st);
    WANT(strstr(why, "cuDNN could not be loaded (the fused attention is off)") != NULL, "why: %s", why);
    char last[256];
    cudnnGetLastErrorString(last, sizeof last);
    WANT(strstr(last, "could not be loaded") != NULL, "last: %s", last);
    const char *r = NULL;
    WANT(reel_cudnn_lazy_check(&r) == -1 && r && strstr(r, "could not be loaded"), "check: %s", r ? r : "?");
    return 0;
}

static int fake_without_execute(void) {
    cudnnHandle_t h = NULL;
    WANT(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS && h == (cudnnHandle_t)0x1234, "the fake's cudnnCreate not called");
    WANT(mapped("libfakecudnn") == 1, "the fake is not mapped after the first call");
    WANT(!strcmp(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM), "fake: bad param"), "%s",
         cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM));
    cudnnStatus_t st = cudnnBackendExecute(h, NULL, NULL);
    WANT(st == CUDNN_STATUS_NOT_INITIALIZED, "execute gave %d", (int)st);
    const char *r = NULL;
    WANT(reel_cudnn_lazy_check(&r) == -1 && r && strstr(r, "has no cudnnBackendExecute"), "check: %s", r ? r : "?");
    return 0;
}

static int real_library(void) {
    const char *r = NULL;
    WANT(mapped("libcudnn") == 0, "libcudnn mapped at start");
    WANT(reel_cudnn_lazy_check(&r) == 0, "%s", r ? r : "?");
    WANT(mapped("libcudnn") == 1, "libcudnn not mapped after the check");
    return 0;
}

START_TEST(test_a_missing_cudnn_fails_each_call_saying_why_and_nothing_else) {
    ck_assert_int_eq(in_child("/nonexistent/libcudnn.so.9", missing_library), 0);
}
END_TEST

START_TEST(test_a_cudnn_without_a_function_forwards_the_rest_and_names_the_missing_one) {
    char src[128], so[128], cmd[512];
    snprintf(src, sizeof src, "%s/fake.c", dir);
    snprintf(so, sizeof so, "%s/libfakecudnn.so", dir);
    FILE *f = fopen(src, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "int cudnnCreate(void **h) { *h = (void *)0x1234; return 0; }\n"
            "const char *cudnnGetErrorString(int s) { return s == %d ? \"fake: bad param\" : \"fake\"; }\n"
            "void cudnnGetLastErrorString(char *m, unsigned long n) { if (n) m[0] = 0; }\n",
            (int)CUDNN_STATUS_BAD_PARAM);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o %s %s", so, src);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(in_child(so, fake_without_execute), 0);
}
END_TEST

START_TEST(test_the_installed_cudnn_resolves_every_function_on_first_use) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* cuDNN's own initialisation is not the code under test, and the
     * sanitizers' runtime would be loading a 1 GB library set: the plain
     * build runs this case. */
    printf("test_cudnn_lazy: sanitizer build: the installed library's case runs in the plain build\n");
    return;
#endif
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls /usr/local/cuda/lib64/libcudnn.so.%d* >/dev/null 2>&1 || "
                              "ldconfig -p | grep -q 'libcudnn.so.%d '", CUDNN_MAJOR, CUDNN_MAJOR);
    if (system(cmd) != 0) {
        printf("test_cudnn_lazy: no libcudnn.so.%d installed here: the real library's case is not run\n", CUDNN_MAJOR);
        return;
    }
    char lib[128];
    snprintf(lib, sizeof lib, "libcudnn.so.%d", CUDNN_MAJOR);
    ck_assert_int_eq(in_child(lib, real_library), 0);
}
END_TEST

static void setup(void) { ts_mkdtemp(dir, sizeof dir, "cudnnlazy"); }
static void teardown(void) { ts_rmtree(dir); }
#endif

int main(void) {
#ifndef HAVE_CUDNN
    printf("test_cudnn_lazy: SKIP: built without cuDNN (no cudnn.h beside the toolkit): nothing to load\n");
    return 0;
#else
    Suite *s = suite_create("cudnn_lazy");
    TCase *tc = tcase_create("lazy");
    tcase_set_timeout(tc, 120); /* libcudnn from a cold cache on a busy machine (test_cublas_lazy's 4 s miss) */
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_a_missing_cudnn_fails_each_call_saying_why_and_nothing_else);
    tcase_add_test(tc, test_a_cudnn_without_a_function_forwards_the_rest_and_names_the_missing_one);
    tcase_add_test(tc, test_the_installed_cudnn_resolves_every_function_on_first_use);
    suite_add_tcase(s, tc);
    return ts_run(s);
#endif
}
