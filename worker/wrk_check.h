/* wrk_check.h -- WRK_CHECK(call): in builds with -DREEL_INVARIANTS, an
 * invariant check (0, or -1 with reel_err_text() naming what broke) whose
 * failure prints the description and aborts; nothing in other builds. */
#ifndef REEL_WORKER_WRK_CHECK_H
#define REEL_WORKER_WRK_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include "base/error.h"

#ifdef REEL_INVARIANTS
#define WRK_CHECK(call)                                                                        \
    do {                                                                                       \
        if ((call) != 0) {                                                                     \
            fprintf(stderr, "worker invariant violated: %s (%s:%d)\n", reel_err_text(), __FILE__, \
                    __LINE__);                                                                 \
            abort();                                                                           \
        }                                                                                      \
    } while (0)
#else
#define WRK_CHECK(call) ((void)0)
#endif

#endif
