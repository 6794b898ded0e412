/* artifact_abi.h -- what an artifact's shared object is built against: the
 * one header (with the registry's kern_impl_t and the argument blocks of
 * ops_args.h) a kernel bundle includes. docs/ARTIFACTS.md has the whole
 * contract; kernels/artifacts.h is the host side.
 *
 * An object exports two symbols:
 *
 *   const uint32_t reel_artifact_abi;           KERN_ART_ABI it was built for
 *   int reel_artifact_init(const kern_art_host_t *host);
 *
 * Init registers the object's kernels by calling host->register_kernel once
 * per (op, dtype) with an ordinary kern_impl_t: its op, backend and dtype
 * must be ones the bundle's manifest declares, its args_size the size of
 * the op's argument block, and its workspace_bytes contract is honoured
 * exactly like a built-in kernel's (scratch comes from the stream, never
 * from the kernel). Init returns 0, or -1 after host->fail(...). host is
 * valid during init only: an object that reports failures later keeps
 * host->fail (a function of the host process), not host.
 *
 * The ABI version names everything an object relies on: this header, the
 * argument blocks of ops_args.h, kern_args_hdr_t, and on CUDA the
 * kern_cuda_ctx_t a kernel gets as ctx (kernels/cuda/cuda_common.h). Any
 * change to one of them bumps KERN_ART_ABI, and bundles built for another
 * version are refused before they are loaded.
 *
 * Rules for a kernel (the host relies on each):
 *  - it never allocates and never synchronizes the device (it may be
 *    captured into a graph, like any kernel);
 *  - a kernel that fails returns -1 via host->fail before writing its
 *    output (the host then runs the native kernel on the same inputs);
 *  - it reads its inputs and writes only its output and its scratch;
 *  - it is deterministic: the same inputs give the same bytes, so a graph
 *    that captured it replays its eager result bit for bit. */
#ifndef REEL_KERNELS_ARTIFACT_ABI_H
#define REEL_KERNELS_ARTIFACT_ABI_H

#include <stdint.h>
#include "registry.h"
#include "ops_args.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_ART_ABI 3u /* 2: kern_gemm_args_t.group (grouped GEMMs, CPU); 3: row groups, batched attention, per-step ops
                           by rows, and CUDA GEMMs given groups too (ops_args.h) */

#define KERN_ART_SYM_ABI "reel_artifact_abi"
#define KERN_ART_SYM_INIT "reel_artifact_init"

typedef struct kern_art_host {
    uint32_t abi;         /* KERN_ART_ABI of the host */
    const char *id;       /* the manifest's id, for messages */
    void *reg;            /* the host's: pass it back to register_kernel */
    /* Registers one kernel (copied). 0, or -1 with a message (wrong op,
     * backend, dtype or args_size, a second kernel for one dtype). */
    int (*register_kernel)(void *reg, const kern_impl_t *impl);
    /* Records the artifact's failure (printf format; the host's error value,
     * base/error.h, code internal) and returns -1. */
    int (*fail)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
} kern_art_host_t;

typedef int (*kern_art_init_fn)(const kern_art_host_t *host);

/* The ABI an object says it speaks: KERN_ART_ABI unless a build overrides
 * it (the tests build an object for another ABI to prove it is refused). */
#ifndef KERN_ART_OBJECT_ABI
#define KERN_ART_OBJECT_ABI KERN_ART_ABI
#endif

#ifdef __cplusplus
}
#endif
#endif
