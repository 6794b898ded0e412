/* philox.h -- Philox4x32-10 and the standard normal Reel draws from it,
 * identical on host and device (header-only, pure integer arithmetic).
 *
 * The noise of element `index` at denoising step `step` under `seed` is
 *   key     = (seed & 0xffffffff, seed >> 32)
 *   counter = (index & 0xffffffff, index >> 32, step, 0x5245454c /"REEL"/)
 *   r       = philox4x32_10(counter, key)
 *   u1 = (r0 + 1) / 2^32  (in (0, 1]),  u2 = r1 / 2^32
 *   ε  = (float)( sqrt(−2 ln u1) · cos(2π u2) )      (computed in double)
 * so a rollout is reproducible and independent of batching and threads. */
#ifndef REEL_KERNELS_PHILOX_H
#define REEL_KERNELS_PHILOX_H

#include <stdint.h>
#include <math.h>

#ifdef __CUDACC__
#define KERN_HD __host__ __device__ __forceinline__
#else
#define KERN_HD static inline
#endif

KERN_HD void kern_philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2], uint32_t out[4]) {
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

KERN_HD float kern_philox_normal(uint64_t seed, uint32_t step, uint64_t index) {
    uint32_t ctr[4] = { (uint32_t)index, (uint32_t)(index >> 32), step, 0x5245454cu };
    uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    uint32_t r[4];
    kern_philox4x32_10(ctr, key, r);
    double u1 = ((double)r[0] + 1.0) / 4294967296.0;
    double u2 = (double)r[1] / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));
}

#endif
