/* test_cublas_lazy.c -- cuBLAS, opened on first use
 * (kernels/cuda/lazy/cublas_lazy.c): this binary is linked as reelctl,
 * reel-worker and every test are (the shim, no -lcublas), so cuBLAS is not mapped when it starts; the
 * shim then opens it and resolves every function the CUDA backend calls
 * (no GPU needed: only the libraries). Without CUDA in the build it says
 * so and checks nothing. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/support.h"

#ifdef HAVE_CUDA
int reel_cublas_lazy_check(const char **reason);

/* Whether a mapping of this process names `lib`. */
static int mapped(const char *lib) {
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, lib)) found = 1;
    fclose(f);
    return found;
}

START_TEST(test_cublas_is_not_loaded_at_start_and_every_function_resolves_on_first_use) {
    ck_assert_msg(!mapped("libcublasLt.so"), "libcublasLt is mapped before any cuBLAS call");
    ck_assert_msg(!mapped("libcublas.so"), "libcublas is mapped before any cuBLAS call");
    const char *why = NULL;
    ck_assert_msg(reel_cublas_lazy_check(&why) == 0, "%s", why ? why : "?");
    ck_assert(mapped("libcublasLt.so"));
    ck_assert(mapped("libcublas.so"));
}
END_TEST
#endif

int main(void) {
#ifndef HAVE_CUDA
    printf("test_cublas_lazy: SKIP: built without CUDA (no nvcc): nothing is loaded lazily\n");
    return 0;
#else
    Suite *s = suite_create("cublas_lazy");
    TCase *tc = tcase_create("lazy");
    /* mapping libcublasLt (hundreds of MB) from a cold page cache on a busy
     * machine took past Check's 4 s default in a fresh-clone make test */
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cublas_is_not_loaded_at_start_and_every_function_resolves_on_first_use);
    suite_add_tcase(s, tc);
    return ts_run(s);
#endif
}
