/* The mambad wire protocol: commands, message bodies (msgpack), tensor refs.
 *
 * Every message, in every direction, is a ZeroMQ multipart message:
 *   F0  header, MBD_PROTO_HEADER_BYTES: "MBD", the version byte
 *       (MBD_PROTO_VERSION), the command (1 byte, mbd_cmd), the tag (8 bytes
 *       little-endian u64: the client's request id between client and broker;
 *       the broker's ticket between broker and worker; 0 for control)
 *   F1  body: a msgpack map with string keys (may be empty map)
 *   F2+ tensor payloads, raw bytes, referenced from the body by index
 * ROUTER sockets prepend the peer identity frame (see common/wire.h).
 * docs/protocol.md is the reference for commands and body fields. */
#ifndef MBD_PROTOCOL_H
#define MBD_PROTOCOL_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/route.h"
#include "common/status.h"
#include "common/tensor.h"

#define MBD_PROTO_MAGIC "MBD"
#define MBD_PROTO_VERSION 2
#define MBD_PROTO_HEADER_BYTES 13 /* magic 3, version 1, command 1, tag 8 */

typedef enum mbd_cmd {
  /* client -> broker (-> worker) requests */
  MBD_CMD_STATUS = 0x01,   /* answered by the broker: workers, routes, models, load */
  MBD_CMD_GEMM = 0x02,     /* C = A B^T (+bias) under a route */
  MBD_CMD_FORWARD = 0x03,  /* stateless batch of sequences -> logits */
  MBD_CMD_OPEN = 0x04,     /* open a session (model, route) -> session id */
  MBD_CMD_PREFILL = 0x05,  /* feed tokens to a session -> logits */
  MBD_CMD_STEP = 0x06,     /* one token -> logits */
  MBD_CMD_GENERATE = 0x07, /* server-side loop, tokens streamed (PARTIAL...FINAL) */
  MBD_CMD_EXPORT = 0x08,   /* session state -> bytes */
  MBD_CMD_IMPORT = 0x09,   /* bytes -> new session */
  MBD_CMD_CLOSE = 0x0A,    /* close a session */
  /* client -> broker -> worker: stop request `tag` (no reply of its own; the
   * cancelled request ends with ERROR CANCELLED) */
  MBD_CMD_CANCEL = 0x0B,
  /* replies (worker -> broker -> client, or broker -> client) */
  MBD_CMD_PARTIAL = 0x40, /* streamed part; more follow */
  MBD_CMD_FINAL = 0x41,   /* success, last message of the request */
  MBD_CMD_ERROR = 0x42,   /* failure, last message: body {code, error, message} */
  /* worker <-> broker control */
  MBD_CMD_READY = 0x80,      /* worker registration */
  MBD_CMD_HEARTBEAT = 0x81,  /* both ways */
  MBD_CMD_DISCONNECT = 0x82, /* both ways: going away / re-register */
  MBD_CMD_CHECKPOINT = 0x83, /* worker -> broker: a session's state, kept for re-homing */
} mbd_cmd;

/* "forward", "ERROR", ...; "unknown" otherwise. */
const char *mbd_cmd_name(int cmd);
/* True for the client request commands (STATUS..CLOSE). */
bool mbd_cmd_is_request(int cmd);
/* True for commands that act on an existing session (PREFILL, STEP, GENERATE, EXPORT, CLOSE). */
bool mbd_cmd_is_session(int cmd);

/* ---- reading bodies --------------------------------------------------- */

typedef struct mbd_body mbd_body; /* a decoded msgpack map; opaque */

/* Validates without allocating that buf is exactly one msgpack map (empty
 * buffer = empty map), nested at most 24 levels, whose containers' declared
 * counts fit in the bytes present. MBD_E_FORMAT with the reason otherwise.
 * mbd_body_parse and mbd_msg_recv call it first. */
int mbd_body_check(const void *buf, size_t len, mbd_error *err);

/* Decodes a body (copied: it does not borrow buf); it must be exactly one msgpack map (empty buffer = empty map).
 * MBD_E_FORMAT with a readable reason otherwise. */
int mbd_body_parse(const void *buf, size_t len, mbd_body **out, mbd_error *err);
/* Decodes only the top-level entries whose keys are in `keys` (NULL-ended):
 * every other value is skipped over without being decoded or copied, so the
 * cost is bounded by the wanted fields, not the body (how the broker reads a
 * request's routing header). MBD_E_TOO_LARGE when the wanted entries together
 * exceed max_bytes; MBD_E_FORMAT for a body that is not one msgpack map. */
int mbd_body_parse_keys(const void *buf, size_t len, const char *const *keys, size_t max_bytes,
                        mbd_body **out, mbd_error *err);
/* Writes into out (initialised by the caller) the map body buf[len] (already
 * checked by mbd_body_check) with `key: v` put first, so mbd_obj_get finds
 * it before any older entry of that key; the other entries are copied as
 * bytes, not decoded. MBD_E_FORMAT when buf is not a map. */
int mbd_body_prepend_u64(const void *buf, size_t len, const char *key, uint64_t v,
                         msgpack_sbuffer *out, mbd_error *err);
/* Writes into out (initialised by the caller) the map body buf[len] with
 * every top-level entry of `key` dropped and `key: val` put first (val: one
 * encoded msgpack object of vlen bytes); the other entries are copied as
 * bytes, not decoded, so the cost is one copy of the body (how the broker
 * stamps the caller). MBD_E_FORMAT when buf is not one msgpack map. */
int mbd_body_replace_raw(const void *buf, size_t len, const char *key, const void *val, size_t vlen,
                         msgpack_sbuffer *out, mbd_error *err);
void mbd_body_destroy(mbd_body **b);
/* The root map object (borrowed). */
const msgpack_object *mbd_body_root(const mbd_body *b);

/* Typed lookups in a map object (use mbd_body_root for the top level). Absent
 * optional keys leave *out untouched and return 0; absent required keys and
 * wrong types give MBD_E_INVALID naming the key. */
const msgpack_object *mbd_obj_get(const msgpack_object *map, const char *key);
int mbd_obj_str(const msgpack_object *map, const char *key, bool required, char *dst, size_t cap,
                mbd_error *err);
int mbd_obj_u64(const msgpack_object *map, const char *key, bool required, uint64_t *out,
                mbd_error *err);
int mbd_obj_i64(const msgpack_object *map, const char *key, bool required, int64_t *out,
                mbd_error *err);
int mbd_obj_f64(const msgpack_object *map, const char *key, bool required, double *out,
                mbd_error *err);
int mbd_obj_bool(const msgpack_object *map, const char *key, bool required, bool *out,
                 mbd_error *err);
/* Array of integers (e.g. stop tokens, token ids); at most cap entries
 * (MBD_E_TOO_LARGE beyond). *n is set to 0 first, so an absent key reads as empty. */
int mbd_obj_i64_array(const msgpack_object *map, const char *key, bool required, int64_t *out,
                      size_t cap, size_t *n, mbd_error *err);

/* True when s is a lower-case hex digest prefix of 8 to 64 characters (how
 * requests pin a model's weights digest, `model_digest`). */
bool mbd_digest_prefix_ok(const char *s);

/* ---- tensor references ------------------------------------------------ */

typedef enum mbd_tref_kind {
  MBD_TREF_INLINE = 0,   /* bytes in payload frame `frame` */
  MBD_TREF_SHM = 1,      /* POSIX shared memory object `shm_name` at [offset, offset+size) */
  MBD_TREF_CUDA_IPC = 2, /* cudaIpcMemHandle_t bytes + offset/size on device `device` */
} mbd_tref_kind;

#define MBD_TREF_NAME_MAX 64
#define MBD_SHM_NAME_MAX 64
#define MBD_IPC_HANDLE_BYTES 64

/* Body encoding: {"name", "dtype", "shape", and one of "frame" | "shm":{name,offset,size} |
 * "ipc":{handle(bin 64), device, offset, size, [event(bin 64)]}} */
typedef struct mbd_tensor_ref {
  char name[MBD_TREF_NAME_MAX]; /* e.g. "input_ids", "logits" */
  mbd_tensor_desc desc;         /* dtype + shape */
  mbd_tref_kind kind;
  uint32_t frame;                /* INLINE: payload index (0 = F2) */
  char shm_name[MBD_SHM_NAME_MAX]; /* SHM: "/name" */
  uint64_t offset, size;          /* SHM / CUDA_IPC: byte range; size >= desc bytes */
  uint8_t ipc_handle[MBD_IPC_HANDLE_BYTES]; /* CUDA_IPC */
  int device;                               /* CUDA_IPC: exporter's device ordinal */
  bool has_event;                           /* CUDA_IPC: ipc_event is set */
  uint8_t ipc_event[MBD_IPC_HANDLE_BYTES];  /* CUDA_IPC: optional cudaIpcEventHandle_t the
                                               worker waits on before touching the memory */
  /* Worker side, never read from the wire: the uid of the client that sent
   * the ref, as the broker vouched for it (worker/request.c fills it). */
  bool caller_known;
  uint32_t caller_uid;
} mbd_tensor_ref;

/* Reads array `key` of tensor refs into out[0..cap); checks dtype names, shape
 * rank and non-negative dims, the one-of location rule, for shm/ipc that
 * offset+size does not overflow and size >= the tensor's bytes. *n = 0 first.
 * (Inline frame sizes are checked by the consumer, who holds the frames.) */
int mbd_obj_tensor_refs(const msgpack_object *map, const char *key, bool required,
                        mbd_tensor_ref *out, size_t cap, size_t *n, mbd_error *err);
/* Reads a route constraint map {route_id, backend, gemm_mode, dtype, state, family,
 * device}. *out is zeroed first (absent key = any route). route_id must be >= 8 hex
 * chars (lower-cased); backend/gemm_mode/dtype/state/family must be known names. */
int mbd_obj_route_want(const msgpack_object *map, const char *key, mbd_route_want *out,
                       mbd_error *err);

/* ---- writing bodies ---------------------------------------------------- */

/* Writes into out (initialised by the caller) the map `body` (len bytes, an
 * empty buffer = empty map) with one more entry key: val at its end, copying
 * the other entries' bytes as they are (nothing decoded). MBD_E_FORMAT when
 * body does not start with a map header. */
int mbd_body_append_str(const void *body, size_t len, const char *key, const char *val,
                        msgpack_sbuffer *out, mbd_error *err);
/* Thin helpers over msgpack_packer; keys are C strings. */
void mbd_pack_str(msgpack_packer *pk, const char *s);
void mbd_pack_kv_str(msgpack_packer *pk, const char *key, const char *val);
void mbd_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t v);
void mbd_pack_kv_i64(msgpack_packer *pk, const char *key, int64_t v);
void mbd_pack_kv_f64(msgpack_packer *pk, const char *key, double v);
void mbd_pack_kv_bool(msgpack_packer *pk, const char *key, bool v);
/* Packs one tensor ref as a map (the caller packs the enclosing array). */
void mbd_pack_tensor_ref(msgpack_packer *pk, const mbd_tensor_ref *r);
/* Packs a route constraint map (only the set fields). */
void mbd_pack_route_want(msgpack_packer *pk, const mbd_route_want *w);

#endif
