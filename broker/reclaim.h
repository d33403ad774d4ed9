/* Sessions of clients that went away: the broker remembers which local (ipc)
 * client process opened each session (from the OPEN/IMPORT reply and the
 * caller's pid in the peer credentials) and, on a short timer, closes the
 * sessions whose process no longer exists, so a crashed client does not hold
 * worker slots until the idle timeout. Sessions of callers without a pid
 * (CURVE, anonymous) are left to the workers' idle expiry. */
#ifndef MBD_BROKER_RECLAIM_H
#define MBD_BROKER_RECLAIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MBD_RECLAIM_MAX 65536 /* sessions tracked; beyond, left to idle expiry */

typedef struct mbd_breclaim mbd_breclaim;

mbd_breclaim *mbd_breclaim_new(void);
void mbd_breclaim_destroy(mbd_breclaim **r);
/* Session `id` was opened on worker `worker_uid` by `caller` (process pid > 0). */
void mbd_breclaim_opened(mbd_breclaim *r, const char *id, const char *worker_uid,
                         const char *caller, int64_t pid);
/* Session `id` was closed (by its owner, or it is gone with its worker). */
void mbd_breclaim_closed(mbd_breclaim *r, const char *id);
/* For every tracked session whose process is gone (alive(pid) false): calls
 * close(ctx, id, worker_uid, caller) and forgets it. Returns how many. */
size_t mbd_breclaim_sweep(mbd_breclaim *r, bool (*alive)(int64_t pid),
                          void (*close)(void *ctx, const char *id, const char *worker_uid,
                                        const char *caller),
                          void *ctx);
size_t mbd_breclaim_count(const mbd_breclaim *r);

#endif
