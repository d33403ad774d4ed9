/* Sessions of clients that went away: the broker remembers which client
 * opened each session (from the OPEN/IMPORT reply) and closes, on a short
 * timer, the sessions whose client is gone, so a crashed client does not
 * hold worker slots until the idle timeout:
 *
 *  - a local (ipc) client, known by its pid from the peer credentials, is
 *    gone when its process no longer exists;
 *  - any other (CURVE or anonymous tcp) is known by its connection (routing
 *    id). When the clients socket reports a closed connection the core asks
 *    which tracked connections can still be reached; sessions whose
 *    connection cannot are closed once it has stayed gone for the grace
 *    period. A request from the same CURVE key (key: or op: caller) within
 *    it moves that key's sessions to the new connection, so a client that
 *    reconnects keeps them. Anonymous sessions are never moved. */
#ifndef MBD_BROKER_RECLAIM_H
#define MBD_BROKER_RECLAIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MBD_RECLAIM_MAX 65536 /* sessions tracked; beyond, left to idle expiry */
#define MBD_RECLAIM_CONN_MAX 256 /* routing id bytes kept (ZeroMQ allows 255) */

typedef struct mbd_breclaim mbd_breclaim;

/* Tells whether the client connection `conn` can still be reached. */
typedef bool (*mbd_breclaim_reachable_fn)(void *ctx, const uint8_t *conn, size_t len);
/* Closes session id on worker_uid for caller; `why` says how its client went. */
typedef void (*mbd_breclaim_close_fn)(void *ctx, const char *id, const char *worker_uid,
                                      const char *caller, const char *why);

mbd_breclaim *mbd_breclaim_new(void);
void mbd_breclaim_destroy(mbd_breclaim **r);
/* Session `id` was opened on worker `worker_uid` by `caller`: a local process
 * (pid > 0), or else the client on connection conn[0..len). */
void mbd_breclaim_opened(mbd_breclaim *r, const char *id, const char *worker_uid,
                         const char *caller, int64_t pid, const uint8_t *conn, size_t len);
/* Session `id` was closed (by its owner, or it is gone with its worker). */
void mbd_breclaim_closed(mbd_breclaim *r, const char *id);
/* Asks reachable() about the connection of every tracked session that has no
 * pid and is not already marked gone; those that cannot be reached are
 * marked gone at now. */
void mbd_breclaim_probe(mbd_breclaim *r, mbd_breclaim_reachable_fn reachable, void *ctx,
                        int64_t now);
/* A request of `caller` came on conn: when the caller is a CURVE key, its
 * sessions marked gone move to conn and are no longer gone. */
void mbd_breclaim_seen(mbd_breclaim *r, const char *caller, const uint8_t *conn, size_t len);
/* For every tracked session whose process is gone (alive(pid) false) or whose
 * connection has been gone for grace_ms: calls close() and forgets it.
 * Returns how many. */
size_t mbd_breclaim_sweep(mbd_breclaim *r, bool (*alive)(int64_t pid), mbd_breclaim_close_fn close,
                          void *ctx, int64_t now, int64_t grace_ms);
size_t mbd_breclaim_count(const mbd_breclaim *r);

#endif
