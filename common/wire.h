/* Messages on ZeroMQ sockets: assembling, sending and receiving the frames
 * of common/protocol.h without copying tensor payloads.
 *
 * An mbd_msg owns its frames (zmq_msg_t). Payloads can be added by copy, by
 * reference with a free callback (zero-copy send), or by moving a received
 * zmq_msg_t (zero-copy forwarding in the broker). Receiving enforces a size cap
 * and validates magic, version, frame count and tag size before the caller sees
 * anything. Not thread-safe: one thread per mbd_msg. */
#ifndef MBD_WIRE_H
#define MBD_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "common/status.h"

typedef struct mbd_msg mbd_msg;

/* Most payload frames one message may carry; more is MBD_E_TOO_LARGE. */
#define MBD_MSG_MAX_FRAMES 1024

/* New empty message with command and tag; body empty (reads as empty map). */
int mbd_msg_new(uint8_t cmd, uint64_t tag, mbd_msg **out, mbd_error *err);
void mbd_msg_destroy(mbd_msg **m);

uint8_t mbd_msg_cmd(const mbd_msg *m);
void mbd_msg_set_cmd(mbd_msg *m, uint8_t cmd);
uint64_t mbd_msg_tag(const mbd_msg *m);
void mbd_msg_set_tag(mbd_msg *m, uint64_t tag);

/* Body: copy bytes in, or take a packed sbuffer's bytes (sb is left empty). */
int mbd_msg_set_body(mbd_msg *m, const void *data, size_t len, mbd_error *err);
int mbd_msg_take_body(mbd_msg *m, msgpack_sbuffer *sb, mbd_error *err);
const void *mbd_msg_body(const mbd_msg *m, size_t *len);

/* Payload frames. */
int mbd_msg_add_payload_copy(mbd_msg *m, const void *data, size_t len, mbd_error *err);
/* Zero-copy: ZeroMQ calls ffn(data, hint) when done with the bytes (may be from
 * the I/O thread). ffn may be NULL for static/long-lived memory. */
int mbd_msg_add_payload_ref(mbd_msg *m, void *data, size_t len, zmq_free_fn *ffn, void *hint,
                            mbd_error *err);
/* Moves *src into the message (src is re-initialised empty). */
int mbd_msg_add_payload_move(mbd_msg *m, zmq_msg_t *src, mbd_error *err);
size_t mbd_msg_npayloads(const mbd_msg *m);
const void *mbd_msg_payload(const mbd_msg *m, size_t i, size_t *len);
/* Moves payload i out into dst (for forwarding); m's slot becomes empty.
 * dst is treated as uninitialised (initialised here; the caller closes it). */
int mbd_msg_take_payload(mbd_msg *m, size_t i, zmq_msg_t *dst, mbd_error *err);

/* Peer identity for ROUTER sockets (sent as the first frame when set). */
int mbd_msg_set_peer(mbd_msg *m, const void *id, size_t len, mbd_error *err);
const void *mbd_msg_peer(const mbd_msg *m, size_t *len);

/* A ZeroMQ metadata property of a received message ("Peer-Address",
 * "User-Id", ...; see zmq_msg_gets), read from its body frame; NULL when the
 * message was not received or has no such property. Borrowed. */
const char *mbd_msg_gets(const mbd_msg *m, const char *property);

/* A second message with the same command, tag, peer, body and payloads; the
 * frames are shared by reference count (zmq_msg_copy), never copied, so a
 * broker can keep a request for a failover re-send at no cost. */
int mbd_msg_clone(mbd_msg *m, mbd_msg **out, mbd_error *err);

/* Sends and destroys *m (always, even on failure; *m becomes NULL).
 * MBD_E_IO on socket errors (errno-based message); EHOSTUNREACH from a ROUTER
 * with ROUTER_MANDATORY gives MBD_E_NOT_FOUND; EAGAIN (ZMQ_DONTWAIT and the
 * peer's high-water mark reached) gives MBD_E_BUSY. flags: 0 or ZMQ_DONTWAIT. */
int mbd_msg_send(mbd_msg **m, void *socket, int flags, mbd_error *err);

/* Receives one whole multipart message (blocking; honours ZMQ_RCVTIMEO, or
 * call it after zmq_poll / ZMQ_EVENTS says POLLIN). `router`: the socket is a ROUTER and
 * the first frame is the peer identity. max_bytes caps the total size (0 = no
 * cap); frames past the cap are drained and dropped.
 * Returns:
 *   0                 *out is a valid message
 *   MBD_E_PROTOCOL / MBD_E_TOO_LARGE / MBD_E_FORMAT
 *                     malformed: *out still holds the peer identity and, when
 *                     readable, the tag and command, so the caller can send an
 *                     ERROR reply; body and payloads are empty. More than
 *                     MBD_MSG_MAX_FRAMES payloads is MBD_E_TOO_LARGE.
 *   MBD_E_NOMEM       out of memory; the message was drained; *out is NULL
 *   MBD_E_IO          nothing received (EAGAIN, ETERM, EINTR); *out is NULL */
int mbd_msg_recv(void *socket, bool router, size_t max_bytes, mbd_msg **out, mbd_error *err);

/* Validates and assembles frames already received (the socket-free half of
 * mbd_msg_recv, for tests and fuzzing). Consumes frames[0..n) (all closed).
 * Same results and errors as mbd_msg_recv. */
int mbd_msg_decode(zmq_msg_t *frames, size_t n, bool router, size_t max_bytes, mbd_msg **out,
                   mbd_error *err);

/* Builds an ERROR reply {code, error: status name, message} with the given tag
 * and (optional) peer. */
int mbd_msg_new_error(uint64_t tag, int code, const char *message, mbd_msg **out, mbd_error *err);
/* Builds a message whose body is the one-entry map {key: value} (DISCONNECT
 * {reason}, and the like). */
int mbd_msg_new_kv(uint8_t cmd, uint64_t tag, const char *key, const char *value, mbd_msg **out,
                   mbd_error *err);

#endif
