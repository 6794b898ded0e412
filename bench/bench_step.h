/* bench_step.h -- the benches' one CFG step: a workspace of a model bound to
 * the same inputs every bench uses (bench_kernels, bench_artifacts,
 * bench_cpu_step), so their step numbers are of the same computation. */
#ifndef REEL_BENCH_BENCH_STEP_H
#define REEL_BENCH_BENCH_STEP_H

#include <stdlib.h>
#include "base/error.h"
#include "model/loop.h"
#include "model/tinydit.h"

/* A workspace of m for sh on s, bound to: the latent tdit_initial_latent(1),
 * both contexts tdit_initial_latent(2), σ 0.9 -> 0.8 (and 0.9 for the
 * timestep), guidance 5. NULL with a message on failure. */
static inline tdit_ws_t *bench_step_ws(tdit_model_t *m, kern_stream_t *s, const tdit_shape_t *sh) {
    tdit_ws_t *ws = tdit_ws_new(m, s, sh);
    if (!ws) return NULL;
    const tdit_config_t *c = tdit_model_config(m);
    size_t nl = (size_t)(c->in_channels * sh->frames * sh->height * sh->width);
    size_t nc = (size_t)(sh->text_len * c->text_dim);
    float *lat = malloc(nl * 4), *ctx = malloc(nc * 4);
    const float sig[3] = { 0.9f, 0.8f, 0.9f };
    int rc = -1;
    if (!lat || !ctx) {
        reel_fail(REEL_E_NOMEM, "out of memory for the bench's inputs");
    } else {
        tdit_initial_latent(1, lat, nl);
        tdit_initial_latent(2, ctx, nc);
        rc = tdit_ws_bind_latent(ws, s, lat, nl) || tdit_ws_bind_context(ws, s, ctx, nc, false) ||
                     tdit_ws_bind_context(ws, s, ctx, nc, true) || tdit_ws_bind_step(ws, s, sig, 5.0f) ||
                     kern_stream_sync(s) /* the copies are done before the inputs are freed */
                 ? -1
                 : 0;
    }
    free(lat);
    free(ctx);
    if (rc) tdit_ws_destroy(&ws);
    return ws;
}

#endif
