/* cudnn_lazy.c -- cuDNN opened on first use (dlopen), in every binary.
 *
 * Only the opt-in fused attention (attention_cudnn.c) calls cuDNN, yet a
 * binary linked with -lcudnn cannot even start on a machine whose cuDNN is
 * missing or older than the one it was built with. Every cuDNN function
 * Reel calls is defined here with the header's own prototype (the compiler
 * checks they agree) and forwards to libcudnn.so.<CUDNN_MAJOR>, opened (the
 * executable's rpath, LD_LIBRARY_PATH, the system's: as the linker's entry
 * would have been found) the first time one is called. When it cannot be
 * opened, or lacks a function, every call returns
 * CUDNN_STATUS_NOT_INITIALIZED and cudnnGetErrorString says why, so
 * cudnnCreate fails with that reason and only the fused path is off
 * (attention_cudnn.c logs it); everything else runs. REEL_CUDNN_LIB names
 * another library file (the tests' fakes). */
#ifdef HAVE_CUDNN
#include <cudnn.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAZY_STR_(x) #x
#define LAZY_STR(x) LAZY_STR_(x)
#define CUDNN_SONAME "libcudnn.so." LAZY_STR(CUDNN_MAJOR)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *lib;
static pthread_mutex_t why_mu = PTHREAD_MUTEX_INITIALIZER;
static char why[512]; /* the first reason cuDNN is missing; written once, under why_mu */

static void set_why(const char *fmt, const char *a, const char *b) {
    pthread_mutex_lock(&why_mu);
    if (!why[0]) snprintf(why, sizeof why, fmt, a, b);
    pthread_mutex_unlock(&why_mu);
}

static const char *get_why(void) {
    pthread_mutex_lock(&why_mu);
    const char *w = why[0] ? why : NULL;
    pthread_mutex_unlock(&why_mu);
    return w;
}

static void open_lib(void) {
    const char *name = getenv("REEL_CUDNN_LIB");
    if (!name || !*name) name = CUDNN_SONAME;
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) set_why("cuDNN could not be loaded (the fused attention is off): %s%s", dlerror(), "");
}

/* The function `name`, cached in *slot; NULL (why[] says it) when it
 * cannot be had. */
static void *lazy_sym(const char *name, void **slot) {
    void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (p) return p;
    pthread_once(&once, open_lib);
    if (!lib) return NULL;
    p = dlsym(lib, name);
    if (!p) {
        set_why("cuDNN has no %s (%s is too old: the fused attention is off)", name, CUDNN_SONAME);
        return NULL;
    }
    __atomic_store_n(slot, p, __ATOMIC_RELEASE);
    return p;
}

#define LAZY(name, params, args)                                                         \
    cudnnStatus_t CUDNNWINAPI name params {                                              \
        static void *slot;                                                               \
        cudnnStatus_t(*fn) params = (cudnnStatus_t(*) params)lazy_sym(#name, &slot);     \
        return fn ? fn args : CUDNN_STATUS_NOT_INITIALIZED;                              \
    }

LAZY(cudnnCreate, (cudnnHandle_t * handle), (handle))
LAZY(cudnnDestroy, (cudnnHandle_t handle), (handle))
LAZY(cudnnSetStream, (cudnnHandle_t handle, cudaStream_t stream), (handle, stream))
LAZY(cudnnBackendCreateDescriptor, (cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t * d), (type, d))
LAZY(cudnnBackendDestroyDescriptor, (cudnnBackendDescriptor_t d), (d))
LAZY(cudnnBackendFinalize, (cudnnBackendDescriptor_t d), (d))
LAZY(cudnnBackendSetAttribute,
     (cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
      const void *values),
     (d, name, type, n, values))
LAZY(cudnnBackendGetAttribute,
     (cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
      int64_t requested, int64_t *count, void *values),
     (d, name, type, requested, count, values))
LAZY(cudnnBackendExecute, (cudnnHandle_t handle, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack),
     (handle, plan, pack))

const char *CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) {
    static void *slot;
    const char *(*fn)(cudnnStatus_t) = (const char *(*)(cudnnStatus_t))lazy_sym("cudnnGetErrorString", &slot);
    const char *w = get_why();
    /* NOT_INITIALIZED is what a missing library or function returns here */
    if (w && (!fn || status == CUDNN_STATUS_NOT_INITIALIZED)) return w;
    return fn ? fn(status) : "cuDNN is not loaded";
}

void CUDNNWINAPI cudnnGetLastErrorString(char *message, size_t max_size) {
    static void *slot;
    void (*fn)(char *, size_t) = (void (*)(char *, size_t))lazy_sym("cudnnGetLastErrorString", &slot);
    if (fn) {
        fn(message, max_size);
    } else if (max_size) {
        const char *w = get_why();
        snprintf(message, max_size, "%s", w ? w : "");
    }
}

size_t CUDNNWINAPI cudnnGetVersion(void) {
    static void *slot;
    size_t (*fn)(void) = (size_t (*)(void))lazy_sym("cudnnGetVersion", &slot);
    return fn ? fn() : 0;
}

/* Whether the fused SDPA can run here: every function resolves, the
 * library is 9.13 or newer (SDPA_FWD's first release in the backend API
 * Reel uses), and a handle can be made on the current device. 1, or 0
 * with the reason in *why (static). */
int reel_cudnn_sdpa_ready(const char **why);
int reel_cudnn_lazy_check(const char **reason);
int reel_cudnn_sdpa_ready(const char **why) {
    static char buf[160];
    if (reel_cudnn_lazy_check(why) != 0) return 0;
    size_t v = cudnnGetVersion();
    if (v < 91300) {
        snprintf(buf, sizeof buf, "cuDNN %zu.%zu.%zu is older than 9.13 (its fused SDPA): the fused attention is off",
                 v / 10000, v / 100 % 100, v % 100);
        *why = buf;
        return 0;
    }
    cudnnHandle_t h = NULL;
    cudnnStatus_t st = cudnnCreate(&h);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(buf, sizeof buf, "cudnnCreate: %s: the fused attention is off", cudnnGetErrorString(st));
        *why = buf;
        return 0;
    }
    cudnnDestroy(h);
    *why = NULL;
    return 1;
}

/* For tests/test_cudnn_lazy.c: whether the library is mapped yet, and a
 * resolution of every function above (0, or -1 with the reason). */
int reel_cudnn_lazy_check(const char **reason);
int reel_cudnn_lazy_check(const char **reason) {
    static const char *const all[] = { "cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnBackendCreateDescriptor",
                                       "cudnnBackendDestroyDescriptor", "cudnnBackendFinalize",
                                       "cudnnBackendSetAttribute", "cudnnBackendGetAttribute", "cudnnBackendExecute",
                                       "cudnnGetErrorString", "cudnnGetLastErrorString", "cudnnGetVersion" };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        void *slot = NULL;
        if (!lazy_sym(all[i], &slot)) {
            *reason = get_why();
            return -1;
        }
    }
    *reason = NULL;
    return 0;
}
#endif /* HAVE_CUDNN */
