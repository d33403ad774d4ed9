/* Who sent a client request, as the broker knows it, and how the broker tells
 * the worker: the reactor reads the peer's identity from the ZeroMQ metadata of
 * the received message and stamps it into the body as `caller` (dropping any
 * `caller` the client wrote), so the core and the workers read only what the
 * broker vouched for. docs/security.md describes the trust model. */
#ifndef MBD_BROKER_CALLER_H
#define MBD_BROKER_CALLER_H

#include <stdbool.h>
#include <stdint.h>

#include <msgpack.h>

#include "common/status.h"
#include "common/wire.h"

#define MBD_BCALLER_ID_MAX 96

typedef struct mbd_bcaller {
  char id[MBD_BCALLER_ID_MAX]; /* "uid:<n>" (ipc), "key:<z85 public key>" (CURVE), "" anonymous */
  bool has_uid;                /* uid/gid/pid are an ipc peer's credentials (SO_PEERCRED) */
  uint32_t uid, gid;
  int64_t pid;
} mbd_bcaller;

/* The sender of m. ipc: the endpoint m came in on is ipc://, whose peer
 * credentials libzmq appends to "Peer-Address" as ":uid:gid:pid". Otherwise
 * "User-Id" as the ZAP handler set it ("key:<z85>"), or anonymous. */
void mbd_bcaller_of(const mbd_msg *m, bool ipc, mbd_bcaller *out);

/* Parses a Peer-Address of an ipc connection (the last three ':' fields);
 * false when it carries no credentials. Exposed for the fuzz target. */
bool mbd_bcaller_parse_peer(const char *peer_address, mbd_bcaller *out);

/* Rewrites m's body as the same map without any `caller` key plus
 * caller: {id, uid?, gid?, pid?}. MBD_E_FORMAT when the body is not a map;
 * MBD_E_NOMEM. */
int mbd_bcaller_stamp(mbd_msg *m, const mbd_bcaller *c, mbd_error *err);

/* Makes a worker reply's body say that `worker` and `route_id` are what the
 * broker knows of the sending worker (its registration), not what the reply
 * claims; other keys are kept. A body that opens with exactly those two
 * entries (as workers write it) is left as it is, not copied; any other is
 * rewritten. MBD_E_FORMAT when the body is not a map. */
int mbd_bcaller_vouch_reply(mbd_msg *m, const char *worker, const char *route_id, mbd_error *err);

/* Reads the stamped `caller` of a body map (absent: anonymous). */
void mbd_bcaller_read(const msgpack_object *root, mbd_bcaller *out);

#endif
