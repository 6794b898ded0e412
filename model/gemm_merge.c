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
 * On CUDA a grouped GEMM is one strided-batched cuBLASLt matmul, and
 * cuBLAS promises nothing about its bits against the per-group calls
 * (its heuristic may pick another kernel for a batch), so the same
 * question is asked on the device, in the model's dtype (F32 or BF16):
 * a yes merges a batch's GEMMs into one launch, a no keeps the calls
 * sample by sample. The CPU runs F32 only. */
#include "tinydit.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "kernels/ops.h"

typedef struct {
    kern_backend_kind_t kind;
    int device; /* cuBLASLt's choice is the GPU's: a verdict is one device's */
    kern_dtype_t dt;
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

/* n host floats into the device tensor t of dtype dt (BF16: rounded). */
static int upload(kern_stream_t *s, kern_tensor_t *t, const float *h, size_t n, kern_dtype_t dt) {
    if (dt == KERN_F32) return kern_copy_h2d(s, kern_tensor_ptr(t), h, n * 4);
    uint16_t *b = malloc(n * 2);
    if (!b) return reel_fail(REEL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) b[i] = kern_f32_to_bf16(h[i]);
    int rc = kern_copy_h2d(s, kern_tensor_ptr(t), b, n * 2);
    if (rc == 0) rc = kern_stream_sync(s); /* b is freed next */
    free(b);
    return rc;
}

/* One comparison on s with operands from seed: 1 equal, 0 not (or the
 * grouped GEMM cannot run for this shape), -1 could not ask (no memory,
 * the thread captures, or the device failed). Each group alone runs as a
 * lone request's GEMM does: from its own buffers at the allocator's
 * alignment (a GPU library picks its kernel by the pointers' alignment). */
static int compare(kern_backend_t *b, kern_stream_t *s, kern_dtype_t dt, int64_t n, int64_t B, int64_t K, int64_t N,
                   bool gelu, uint64_t seed) {
    kern_tensor_t x = kern_tensor_alloc(b, dt, 2, (const int64_t[]){ B * n, K });
    kern_tensor_t w = kern_tensor_alloc(b, dt, 2, (const int64_t[]){ N, K });
    kern_tensor_t bias = kern_tensor_alloc(b, dt, 1, (const int64_t[]){ N });
    kern_tensor_t y1 = kern_tensor_alloc(b, dt, 2, (const int64_t[]){ B * n, N });
    kern_tensor_t y2 = kern_tensor_alloc(b, dt, 2, (const int64_t[]){ B * n, N });
    kern_tensor_t xg = kern_tensor_alloc(b, dt, 2, (const int64_t[]){ n, K });
    kern_tensor_t yg = kern_tensor_alloc(b, dt, 2, (const int64_t[]){ n, N });
    const size_t esz = kern_dtype_size(dt);
    size_t nx = (size_t)(B * n * K), nw = (size_t)(N * K), ny = (size_t)(B * n * N);
    float *h = malloc((nx + nw + (size_t)N) * sizeof *h);
    unsigned char *r1 = malloc(ny * esz), *r2 = malloc(ny * esz);
    int rc = -1;
    if (!x.data || !w.data || !bias.data || !y1.data || !y2.data || !xg.data || !yg.data || !h || !r1 || !r2) goto out;
    float *hx = h, *hw = hx + nx, *hb = hw + nw;
    fill(hx, nx, seed);
    fill(hw, nw, seed + 1);
    fill(hb, (size_t)N, seed + 2);
    if (upload(s, &x, hx, nx, dt) || upload(s, &w, hw, nw, dt) || upload(s, &bias, hb, (size_t)N, dt)) goto out;
    /* each group alone, as a lone request runs it */
    const size_t gx = (size_t)(n * K) * esz, gy = (size_t)(n * N) * esz;
    for (int64_t i = 0; i < B; i++) {
        if (kern_copy_d2d(s, kern_tensor_ptr(&xg), (const char *)kern_tensor_ptr(&x) + (size_t)i * gx, gx) ||
            (gelu ? kern_gemm_gelu(s, &xg, &w, &bias, &yg) : kern_gemm(s, &xg, &w, &bias, &yg)) ||
            kern_copy_d2d(s, (char *)kern_tensor_ptr(&y2) + (size_t)i * gy, kern_tensor_ptr(&yg), gy))
            goto out;
    }
    if (kern_gemm_grouped(s, &x, &w, &bias, &y1, n, gelu)) {
        /* the grouped GEMM cannot run for this shape (no algorithm): no
         * merging; a device that failed is another matter */
        rc = kern_stream_sync(s) == 0 ? 0 : -1;
        goto out;
    }
    if (kern_copy_d2h(s, r1, kern_tensor_ptr(&y1), ny * esz) || kern_copy_d2h(s, r2, kern_tensor_ptr(&y2), ny * esz) ||
        kern_stream_sync(s))
        goto out;
    rc = !memcmp(r1, r2, ny * esz);
out:
    free(h);
    free(r1);
    free(r2);
    if (kern_stream_sync(s) && rc >= 0) rc = -1; /* nothing freed under a running launch */
    kern_free(b, x.data);
    kern_free(b, w.data);
    kern_free(b, bias.data);
    kern_free(b, y1.data);
    kern_free(b, y2.data);
    kern_free(b, xg.data);
    kern_free(b, yg.data);
    return rc;
}

/* The kept verdict for a shape, or NULL. The caller holds mu. */
static const verdict_t *find(kern_backend_kind_t kind, int device, kern_dtype_t dt, int64_t n, int64_t B, int64_t K,
                             int64_t N, bool gelu) {
    for (int i = 0; i < nverdicts; i++) {
        const verdict_t *v = &verdicts[i];
        if (v->kind == kind && v->device == device && v->dt == dt && v->n == n && v->B == B && v->K == K &&
            v->N == N && v->gelu == gelu)
            return v;
    }
    return NULL;
}

/* The backends and dtypes a grouped GEMM runs in: the CPU's F32, CUDA's
 * F32 and BF16. */
static bool mergeable(kern_backend_t *b, kern_dtype_t dt) {
    kern_backend_kind_t k = kern_backend_kind(b);
    return (k == KERN_BACKEND_CPU && dt == KERN_F32) || (k == KERN_BACKEND_CUDA && (dt == KERN_F32 || dt == KERN_BF16));
}

void tdit_gemm_merge_set_policy(int p) {
    pthread_mutex_lock(&mu);
    policy = p;
    policy_read = true;
    pthread_mutex_unlock(&mu);
}

/* 1: merging is bitwise for this shape; 0: it is not; -1: could not ask
 * (out of memory, or this thread captures: nothing may be allocated). */
static int probe(kern_backend_t *b, kern_dtype_t dt, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu) {
    if (!mergeable(b, dt) || n < 1 || B < 2 || K < 1 || N < 1) return 0;
    kern_stream_t *s = kern_stream_new(b); /* one stream (on CUDA one cuBLAS handle) for the three tries */
    if (!s) return -1;
    int r = 1;
    for (uint64_t seed = 1; seed <= 3 && r == 1; seed++) r = compare(b, s, dt, n, B, K, N, gelu, seed * 0x9e3779b97f4a7c15ull);
    kern_stream_destroy(&s);
    return r;
}

bool tdit_gemm_merge_probe(kern_backend_t *b, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu) {
    return probe(b, KERN_F32, n, B, K, N, gelu) == 1;
}

bool tdit_gemm_merge_ok(kern_backend_t *b, kern_dtype_t dt, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu) {
    if (B < 2 || !mergeable(b, dt)) return false;
    const kern_backend_kind_t kind = kern_backend_kind(b);
    const int device = kern_backend_device(b);
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
    const verdict_t *known = find(kind, device, dt, n, B, K, N, gelu);
    if (known) {
        bool ok = known->ok;
        pthread_mutex_unlock(&mu);
        return ok;
    }
    pthread_mutex_unlock(&mu);
    /* Asked outside the lock (a probe runs GEMMs); two threads may ask
     * the same shape at once and get the same answer. A full table
     * answers no: never merge on a guess. */
    int r = probe(b, dt, n, B, K, N, gelu);
    if (r < 0) return false; /* not asked: no verdict kept, asked again next time */
    bool ok = r == 1;
    pthread_mutex_lock(&mu);
    if ((known = find(kind, device, dt, n, B, K, N, gelu))) ok = known->ok; /* another thread asked first */
    else if (nverdicts < VERDICTS) verdicts[nverdicts++] = (verdict_t){ kind, device, dt, n, B, K, N, gelu, ok };
    else ok = false;
    pthread_mutex_unlock(&mu);
    return ok;
}
