/* brk_check.h -- the broker's invariants (internal header), SQLite style
 * (capture_cache/cache.c's invariants()): what must hold between two
 * messages, once the loop has settled (dead workers dropped, queued work
 * sent). Builds with -DREEL_INVARIANTS (make asan, make tsan, make
 * asan-cli) check them after every message the loop handles and every
 * timer pass, and abort naming the first one broken.
 *
 * What is checked:
 *  - requests: the list of live requests is well linked; every one is in
 *    its id bucket and the buckets hold nothing else; the queue holds
 *    exactly the QUEUED ones, each once; an INFLIGHT or ABANDONED one
 *    names a registered worker; held_bytes is the sum of their bytes.
 *  - workers: none is dead (the loop drops them at once), names and
 *    identities are distinct, counts fit their arrays, and each one's
 *    inflight equals the requests it holds (and is at most max_inflight).
 *  - syncs: at most one barrier per (component, version); each has a
 *    member still waiting (a settled one is answered and freed), members
 *    are distinct, a waiting one is a registered worker that was sent the
 *    version (or one marked undelivered: a send failed, and it waits for
 *    the worker to come back; no member but a waiting one is so marked);
 *    a pending SYNC is the barrier's own; each current SYNC is
 *    the component's version (none while it is 0).
 *  - uploads (brk_upload_check): a closed slot holds nothing, an open one
 *    its file, hasher and no more bytes than announced, each slot names a
 *    distinct version, parked FETCHes fit and wait for bytes still to
 *    come; spares and removals queued fit their arrays.
 *  - answers held for clients (brk_deliver_check): each client listed
 *    once, with at least one, none a PROGRESS, counts and bytes adding
 *    up. */
#ifndef REEL_BROKER_BRK_CHECK_H
#define REEL_BROKER_BRK_CHECK_H

#include <stddef.h>

#include "broker/brk_broker.h"

/* 0 when every invariant above holds; -1 with the first broken one as a
 * REEL_E_INTERNAL error (base/error.h) whose message says what, and which
 * request, worker or barrier. Reads b only (the upload locks are taken
 * and released). Can't fail otherwise: out of memory, the checks that
 * need a scratch array are skipped. */
int brk_check(const brk_t *b);

/* brk_check, aborting with "broker invariant violated after WHERE: " and
 * the error's text on stderr when one is broken. For the loop, under
 * REEL_INVARIANTS. */
void brk_check_or_die(const brk_t *b, const char *where);

#ifdef REEL_INVARIANTS
#define BRK_CHECK_INVARIANTS(b, where) brk_check_or_die((b), (where))
#else
#define BRK_CHECK_INVARIANTS(b, where) ((void)0)
#endif

#endif
