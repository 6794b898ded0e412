/* gpu_probe.c -- the first thing deploy/gpu-check.sh runs on a GPU machine:
 * the GPU, the driver, the CUDA runtime, cuBLAS and cuDNN as this binary's
 * loader finds them, then whether Reel's CUDA backend comes up.
 *
 * Prints one "key: value" line per item and exits 0 when the backend is
 * usable. Otherwise the last line is "probe: FAIL <reason>" (no driver, no
 * device, a driver older than the runtime, a GPU older than sm_80, Reel's
 * backend unavailable) and the exit status is 1. cuDNN is optional here
 * (dlopen'ed, "not found" is not a failure): a build that links it is
 * caught earlier, by gpu-check's ldd step. */
#include <stdio.h>

#ifndef HAVE_CUDA
int main(void) {
    printf("probe: FAIL this probe was built without CUDA (CUDA=0); run make gpu-bundle where nvcc exists\n");
    return 1;
}
#else

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <string.h>

#include "kernels/backend.h"
#include "base/error.h"

static int fail(const char *what, cudaError_t e) {
    printf("probe: FAIL %s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
}

/* cuDNN through dlopen, so that a machine without it still probes: its
 * version and the file the loader picked, or why it is absent. */
static void print_cudnn(void) {
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("cudnn: not found (%s)\n", dlerror());
        return;
    }
    size_t (*ver)(void) = (size_t (*)(void))dlsym(h, "cudnnGetVersion");
    Dl_info info;
    memset(&info, 0, sizeof info);
    if (!ver || !dladdr((void *)ver, &info)) {
        printf("cudnn: libcudnn.so.9 loads but has no cudnnGetVersion\n");
    } else {
        size_t v = ver(); /* cuDNN 9: major·10000 + minor·100 + patch */
        printf("cudnn: %zu.%zu.%zu (%s)\n", v / 10000, v / 100 % 100, v % 100,
               info.dli_fname ? info.dli_fname : "?");
    }
    dlclose(h);
}

int main(void) {
    int drv = 0, rt = 0, n = 0;
    cudaError_t e = cudaRuntimeGetVersion(&rt);
    if (e != cudaSuccess) return fail("cudaRuntimeGetVersion", e);
    printf("cuda runtime: %d.%d (linked statically into the bundle)\n", rt / 1000, rt % 1000 / 10);
    e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess) return fail("cudaDriverGetVersion", e);
    if (drv == 0) {
        printf("probe: FAIL no NVIDIA driver (libcuda.so.1 not loadable)\n");
        return 1;
    }
    printf("cuda driver api: %d.%d\n", drv / 1000, drv % 1000 / 10);
    int major = 0, minor = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        printf("cublas: %d.%d.%d\n", major, minor, patch);
    else
        printf("cublas: version unknown\n");
    print_cudnn();
    if (drv < rt) {
        printf("probe: FAIL the driver supports CUDA %d.%d, the bundle's runtime is %d.%d: a newer driver is needed\n",
               drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return 1;
    }
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return fail("no usable CUDA device", e);
    if (n < 1) {
        printf("probe: FAIL no CUDA device\n");
        return 1;
    }
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) return fail("cudaGetDeviceProperties(0)", e);
    printf("gpu: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, %d device(s)\n", p.name, p.major, p.minor,
           p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30), p.l2CacheSize >> 20, n);
    if (p.major < 8) {
        printf("probe: FAIL %s is sm_%d%d: Reel's CUDA code is built for sm_80 and newer\n", p.name, p.major,
               p.minor);
        return 1;
    }
    kern_backend_t *b = kern_backend_cuda_new(0);
    if (!b) {
        printf("probe: FAIL Reel's CUDA backend is unavailable: %s\n", reel_err_text());
        return 1;
    }
    printf("reel backend: %s, %s\n", kern_backend_device_name(b), kern_backend_arch(b));
    kern_backend_destroy(&b);
    return 0;
}

#endif /* HAVE_CUDA */
