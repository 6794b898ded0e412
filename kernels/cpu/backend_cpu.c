/* backend_cpu.c -- the CPU backend: host memory, synchronous streams, and
 * graphs recorded by the dispatcher (backend.c).
 *
 * A CPU stream runs each launch on the calling thread at launch time, so
 * sync is a no-op; capture diverts launches into a recorded list instead. */
#include "../backend_impl.h"
#include "cpu_pool.h"
#include "base/error.h"
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#define CPU_ALIGN 64

/* Blocks of 4 MiB or more (weights, workspaces) start on a 2 MiB boundary
 * and ask for transparent huge pages: filling them (a weights file read
 * into the arena, a first step) then takes one page fault per 2 MiB, not
 * per 4 KiB; on the VMs measured those faults were most of a load. Where
 * the kernel's THP is off (or "never") the advice is ignored. */
#define CPU_HUGE_MIN ((size_t)4 << 20)
#define CPU_HUGE_ALIGN ((size_t)2 << 20)

/* Each block carries its size in a 64-byte header so free can account. */
static void *cpu_alloc(kern_backend_t *b, size_t bytes) {
    (void)b;
    size_t total = CPU_ALIGN + ((bytes + CPU_ALIGN - 1) & ~(size_t)(CPU_ALIGN - 1));
    unsigned char *p = NULL;
    if (total >= CPU_HUGE_MIN) {
        void *q = NULL;
        if (posix_memalign(&q, CPU_HUGE_ALIGN, total) == 0) {
            p = q;
            (void)madvise(p, total & ~(CPU_HUGE_ALIGN - 1), MADV_HUGEPAGE);
        }
    } else {
        p = aligned_alloc(CPU_ALIGN, total);
    }
    if (!p) {
        reel_fail(REEL_E_NOMEM, "cpu: out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    memcpy(p, &bytes, sizeof bytes);
    return p + CPU_ALIGN;
}

static size_t cpu_free(kern_backend_t *b, void *ptr) {
    (void)b;
    unsigned char *p = (unsigned char *)ptr - CPU_ALIGN;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    free(p);
    return bytes;
}

static void *cpu_stream_new(kern_backend_t *b) {
    (void)b;
    static char token; /* CPU streams carry no state of their own */
    return &token;
}

static void cpu_stream_destroy(kern_backend_t *b, void *st) { (void)b; (void)st; }

static int cpu_stream_sync(void *st) { (void)st; return 0; }

static int cpu_copy(void *st, void *dst, const void *src, size_t n, int dir) {
    (void)st; (void)dir;
    memmove(dst, src, n);
    return 0;
}

static int cpu_launch(void *st, kern_fn_t fn, const void *args) {
    (void)st;
    return fn(NULL, args);
}

static const kern_backend_iface_t cpu_iface = {
    .kind_name      = "cpu",
    .destroy        = NULL,               /* no state beyond the handle */
    .alloc          = cpu_alloc,
    .free           = cpu_free,
    .stream_new     = cpu_stream_new,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync    = cpu_stream_sync,
    .copy           = cpu_copy,
    .launch         = cpu_launch,
    .capture_begin  = NULL,               /* NULL: the dispatcher records */
    .capture_end    = NULL,
    .graph_launch   = NULL,
    .graph_destroy  = NULL,
};

static const char *cpu_arch(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "cpu-avx512";
    if (__builtin_cpu_supports("avx2")) return "cpu-avx2";
    return "cpu-x86";
#elif defined(__aarch64__)
    return "cpu-arm64";
#else
    return "cpu-generic";
#endif
}

kern_backend_t *kern_backend_cpu_new_impl(void) {
    kern_backend_t *b = calloc(1, sizeof *b);
    if (!b) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    kern_cpu_blas_single(); /* the pool shares out the work (cpu_pool.h) */
    b->iface = &cpu_iface;
    b->kind = KERN_BACKEND_CPU;
    b->device = KERN_DEVICE_HOST;
    strcpy(b->device_name, "cpu");
    strcpy(b->arch, cpu_arch());
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psize > 0 && (size_t)pages <= SIZE_MAX / (size_t)psize) b->mem_total = (size_t)pages * (size_t)psize;
    return b;
}
