/* Durable sessions, the broker's half: per session the last checkpoint its
 * worker sent (CHECKPOINT, worker/checkpoint.h) and the tokens the session
 * consumed since (learnt from the replies the broker relays: STEP tokens,
 * GENERATE tokens), so that when the worker dies the session is restored on
 * another live worker of the same route and model (IMPORT of the checkpoint
 * with `replay` = those tokens) and a GENERATE in flight continues there
 * (re-sent with `resume` = the tokens the client already received). The
 * client's session id stays valid: this module maps it to the id on the
 * worker that holds the session now, and only for the owner that opened it.
 *
 * Memory: checkpoints, token logs and records together are bounded by a
 * budget (--durable-mb); a checkpoint that would pass it is refused: a
 * session already held keeps its older checkpoint and its log (still
 * restorable), a new one is not durable; a log that cannot grow leaves its
 * session not restorable until its next checkpoint.
 * The token log is capped at MBD_DURABLE_LOG_MAX; past it, or after a PREFILL
 * whose tokens the broker did not see (until the checkpoint that follows
 * it), the session is not restorable and its loss is answered WORKER_LOST
 * with the reason. No sockets: broker/core.c calls it. */
#ifndef MBD_BROKER_DURABLE_H
#define MBD_BROKER_DURABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "common/status.h"
#include "common/wire.h"

typedef struct mbd_bdurable_stats {
  uint64_t checkpoints;     /* CHECKPOINTs kept */
  uint64_t dropped;         /* CHECKPOINTs refused: over the byte budget */
  uint64_t bytes;           /* bytes held now: checkpoints, token logs, records (<= budget) */
  uint64_t sessions;        /* durable sessions held now */
  uint64_t rehomed;         /* sessions restored on another worker after theirs died */
  uint64_t replayed_tokens; /* tokens those restores replayed after their checkpoints */
  uint64_t resumed;         /* GENERATEs continued on the new worker */
  uint64_t lost;            /* sessions whose worker died and that could not be re-homed */
} mbd_bdurable_stats;

typedef struct mbd_bdurable mbd_bdurable;

/* Where a session lives now (mbd_bdurable_locate). */
typedef enum mbd_bdur_where {
  MBD_BDUR_NONE = 0, /* not durable (or not this caller's): route by the id's uid as ever */
  MBD_BDUR_HOMED,    /* on worker *uid under id *wid */
  MBD_BDUR_MOVING,   /* its restore is under way: requests wait */
  MBD_BDUR_LOST,     /* its worker died and it could not be re-homed: *why says why */
} mbd_bdur_where;

/* Hands over a restore request for session id: an IMPORT (*restore, taken)
 * to place on a live worker of route_id serving model at digest. */
typedef void (*mbd_bdurable_restore_fn)(void *ctx, const char *id, const char *model,
                                        const char *digest, const char *route_id,
                                        mbd_msg **restore);

/* budget_bytes: checkpoint bytes held at most (0: none, durability off). */
int mbd_bdurable_new(uint64_t budget_bytes, mbd_bdurable **out, mbd_error *err);
void mbd_bdurable_destroy(mbd_bdurable **d);

/* A CHECKPOINT from the registered worker with uid/route_id (*m taken):
 * kept (replacing the session's older one, its log restarting empty),
 * refused over budget, or, with `closed`, the session forgotten. One for a
 * session homed on another worker is dropped. */
void mbd_bdurable_checkpoint(mbd_bdurable *d, mbd_msg **m, const char *uid, const char *route_id);
/* Session `id` (the client's id) as `caller` sees it (NULL: no owner check).
 * Borrowed strings, valid until the next call into d. */
mbd_bdur_where mbd_bdurable_locate(mbd_bdurable *d, const char *id, const char *caller,
                                   const char **uid, const char **wid, const char **why);
/* For a send of session request cmd (body[blen]) from `caller` to the session's home: the
 * body with `session` = the id there and, for a GENERATE re-sent after a
 * re-home (resend), `resume` = the tokens its client already has. Returns 1
 * with *out (initialised by the caller) filled when the body must change, 0
 * when it goes as it is, or a status. */
int mbd_bdurable_rewrite(mbd_bdurable *d, const char *id, const char *caller, uint8_t cmd,
                         bool resend, const void *body, size_t blen, msgpack_sbuffer *out, mbd_error *err);
/* A reply (PARTIAL/FINAL/ERROR) to session request cmd of session id (a STEP
 * fed `token`), relayed or not: the tokens it shows consumed join the log;
 * CLOSE's FINAL forgets the session. */
void mbd_bdurable_reply(mbd_bdurable *d, const char *id, uint8_t cmd, int64_t token,
                        const mbd_msg *reply);
/* Worker uid (named wname) is gone: every session homed there becomes
 * MOVING with its restore handed to fn, or LOST when it cannot be restored
 * (no checkpoint; tokens missing from its log). Returns how many moved. */
size_t mbd_bdurable_rehome(mbd_bdurable *d, const char *uid, const char *wname,
                           mbd_bdurable_restore_fn fn, void *ctx, int64_t now_ms);
/* Session id's restore answered FINAL on worker uid as session wid. */
void mbd_bdurable_restored(mbd_bdurable *d, const char *id, const char *uid, const char *wid);
/* Session id's restore failed: it is LOST with reason why. */
void mbd_bdurable_failed(mbd_bdurable *d, const char *id, const char *why, int64_t now_ms);
/* Forgets session id (closed; its client went away). */
void mbd_bdurable_forget(mbd_bdurable *d, const char *id);
/* Drops LOST sessions' records after a minute (their requests got the reason). */
void mbd_bdurable_sweep(mbd_bdurable *d, int64_t now_ms);
const mbd_bdurable_stats *mbd_bdurable_get_stats(const mbd_bdurable *d);

#endif
