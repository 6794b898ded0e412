/* gemm_merge.c -- may a batch's token GEMMs run as one (tinydit.h,
 * tdit_gemm_merge_ok)?
 *
 * A batch's sample b must be bitwise the request alone, whose GEMM has n
 * rows. A BLAS may sum a row differently depending on the call's shape
 * (OpenBLAS on x86 takes its small-matrix kernels below a size; cuBLAS
 * picks its algorithm by M), so the merged GEMM is a grouped one
 * (kern_gemm_grouped): one launch over the B·n rows whose CPU tiles cut
 * every sample's n rows exactly as its GEMM alone, each call the very call
 * the sample makes alone, the B samples' tiles sharing the pool. That
 * holds by construction as long as OpenBLAS's result depends only on a
 * call's operands and shape; whether it does is a property of the
 * library and the machine, so it is still asked once per shape: both ways
 * on the same random operands, three times with other values, compared
 * bit for bit. Only where every comparison holds does the step merge.
 * CUDA and BF16 never merge (cuBLAS gives no such promise). */
#include "tinydit.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "kernels/ops.h"

typedef struct {
    int64_t n, B, K, N;
    bool gelu, ok;
} verdict_t;

#define VERDICTS 256
static verdict_t verdicts[VERDICTS];
static int nverdicts;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int policy = TDIT_MERGE_AUTO;
static bool policy_read;

/* Values of several magnitudes and both signs, from seed. */
static void fill(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(seed >> 33);
        float v = (float)(r & 0xffffu) / 32768.0f - 1.0f;
        x[i] = v * (float)(1u << ((r >> 16) % 5)) / 4.0f;
    }
}

/* One comparison with operands from seed: 1 equal, 0 not, -1 error. */
static int compare(kern_backend_t *b, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu, uint64_t seed) {
    kern_stream_t *s = kern_stream_new(b);
    kern_tensor_t x = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ B * n, K });
    kern_tensor_t w = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ N, K });
    kern_tensor_t bias = kern_tensor_alloc(b, KERN_F32, 1, (const int64_t[]){ N });
    kern_tensor_t y1 = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ B * n, N });
    kern_tensor_t y2 = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ B * n, N });
    size_t nx = (size_t)(B * n * K), nw = (size_t)(N * K), ny = (size_t)(B * n * N);
    float *h = malloc((nx + nw + (size_t)N + 2 * ny) * sizeof *h);
    int rc = -1;
    if (!s || !x.data || !w.data || !bias.data || !y1.data || !y2.data || !h) goto out;
    float *hx = h, *hw = hx + nx, *hb = hw + nw, *r1 = hb + N, *r2 = r1 + ny;
    fill(hx, nx, seed);
    fill(hw, nw, seed + 1);
    fill(hb, (size_t)N, seed + 2);
    if (kern_copy_h2d(s, kern_tensor_ptr(&x), hx, nx * 4) || kern_copy_h2d(s, kern_tensor_ptr(&w), hw, nw * 4) ||
        kern_copy_h2d(s, kern_tensor_ptr(&bias), hb, (size_t)N * 4))
        goto out;
    if (kern_gemm_grouped(s, &x, &w, &bias, &y1, n, gelu)) goto out;
    for (int64_t i = 0; i < B; i++) {
        kern_tensor_t xb = kern_tensor_make(x.data, KERN_F32, x.device, 2, (const int64_t[]){ n, K });
        kern_tensor_t yb = kern_tensor_make(y2.data, KERN_F32, y2.device, 2, (const int64_t[]){ n, N });
        xb.offset = x.offset + (size_t)(i * n * K) * 4;
        yb.offset = y2.offset + (size_t)(i * n * N) * 4;
        if (gelu ? kern_gemm_gelu(s, &xb, &w, &bias, &yb) : kern_gemm(s, &xb, &w, &bias, &yb)) goto out;
    }
    if (kern_copy_d2h(s, r1, kern_tensor_ptr(&y1), ny * 4) || kern_copy_d2h(s, r2, kern_tensor_ptr(&y2), ny * 4) ||
        kern_stream_sync(s))
        goto out;
    rc = !memcmp(r1, r2, ny * 4);
out:
    free(h);
    kern_free(b, x.data);
    kern_free(b, w.data);
    kern_free(b, bias.data);
    kern_free(b, y1.data);
    kern_free(b, y2.data);
    kern_stream_destroy(&s);
    return rc;
}

/* The kept verdict for a shape, or NULL. The caller holds mu. */
static const verdict_t *find(int64_t n, int64_t B, int64_t K, int64_t N, bool gelu) {
    for (int i = 0; i < nverdicts; i++) {
        const verdict_t *v = &verdicts[i];
        if (v->n == n && v->B == B && v->K == K && v->N == N && v->gelu == gelu) return v;
    }
    return NULL;
}

void tdit_gemm_merge_set_policy(int p) {
    pthread_mutex_lock(&mu);
    policy = p;
    policy_read = true;
    pthread_mutex_unlock(&mu);
}

/* 1: merging is bitwise for this shape; 0: it is not; -1: could not ask
 * (out of memory, or this thread captures: nothing may be allocated). */
static int probe(kern_backend_t *b, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu) {
    if (kern_backend_kind(b) != KERN_BACKEND_CPU || n < 1 || B < 2 || K < 1 || N < 1) return 0;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        int r = compare(b, n, B, K, N, gelu, seed * 0x9e3779b97f4a7c15ull);
        if (r != 1) return r;
    }
    return 1;
}

bool tdit_gemm_merge_probe(kern_backend_t *b, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu) {
    return probe(b, n, B, K, N, gelu) == 1;
}

bool tdit_gemm_merge_ok(kern_backend_t *b, kern_dtype_t dt, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu) {
    if (B < 2 || dt != KERN_F32 || kern_backend_kind(b) != KERN_BACKEND_CPU) return false;
    pthread_mutex_lock(&mu);
    if (!policy_read) { /* REEL_GEMM_MERGE=0: never (for side-by-side measurements) */
        const char *env = getenv("REEL_GEMM_MERGE");
        if (env && !strcmp(env, "0")) policy = TDIT_MERGE_NEVER;
        policy_read = true;
    }
    if (policy == TDIT_MERGE_NEVER) {
        pthread_mutex_unlock(&mu);
        return false;
    }
    const verdict_t *known = find(n, B, K, N, gelu);
    if (known) {
        bool ok = known->ok;
        pthread_mutex_unlock(&mu);
        return ok;
    }
    pthread_mutex_unlock(&mu);
    /* Asked outside the lock (a probe runs GEMMs); two threads may ask
     * the same shape at once and get the same answer. A full table
     * answers no: never merge on a guess. */
    int r = probe(b, n, B, K, N, gelu);
    if (r < 0) return false; /* not asked: no verdict kept, asked again next time */
    bool ok = r == 1;
    pthread_mutex_lock(&mu);
    if ((known = find(n, B, K, N, gelu))) ok = known->ok; /* another thread asked first */
    else if (nverdicts < VERDICTS) verdicts[nverdicts++] = (verdict_t){ n, B, K, N, gelu, ok };
    else ok = false;
    pthread_mutex_unlock(&mu);
    return ok;
}
