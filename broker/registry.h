/* Broker worker registry: the live workers keyed by their ZeroMQ routing id,
 * each with its decoded numeric route, models and load, and the pure routing
 * decisions over them (match, least-loaded pick, NO_ROUTE explanation).
 * No sockets: everything here is testable with plain data. */
#ifndef MBD_BROKER_REGISTRY_H
#define MBD_BROKER_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/defaults.h"
#include "common/prefix_hash.h"
#include "common/protocol.h"
#include "common/route.h"
#include "common/status.h"

#define MBD_BW_NAME_MAX 64
#define MBD_BW_UID_MAX 64
#define MBD_BW_MODELS_MAX 16
#define MBD_BW_ROUTE_ENC_MAX 1024
#define MBD_BW_IDENT_MAX 255
#define MBD_BW_CAPACITY_MAX MBD_CAPACITY_MAX
#define MBD_BW_DIGEST_MAX 72
#define MBD_BW_DEFAULTS_MAX 64
#define MBD_DIGEST_PREFIX_MIN 8

/* A model identity: name, weights digest and (when the model directory has
 * one) tokenizer digest. Two digests under one name are two models. */
typedef struct mbd_bmodel {
  char name[MBD_BW_NAME_MAX];
  char digest[MBD_BW_DIGEST_MAX];           /* hex SHA-256 of the weights, as the worker reported */
  char tokenizer_digest[MBD_BW_DIGEST_MAX]; /* hex SHA-256 of tokenizer.json, "" when none */
} mbd_bmodel;

/* A worker's prefix state cache as its last HEARTBEAT `prefix` said:
 * counters (for STATUS) and the routing hashes of the prefixes it holds
 * (common/prefix_hash.h), most recently used first. */
typedef struct mbd_bprefix {
  bool known;          /* the worker reported a cache */
  uint64_t lookups, hits, hit_tokens, inserts, evictions, bytes, entries;
  uint64_t device_hits, demotions, device_bytes, device_entries; /* device tier (GPU workers) */
  uint64_t hashes[MBD_PREFIX_HASHES_MAX];
  size_t nhashes;
} mbd_bprefix;

/* One registered worker (plain data, owned by the registry). */
typedef struct mbd_bworker {
  char name[MBD_BW_NAME_MAX];             /* human name from READY */
  char uid[MBD_BW_UID_MAX];               /* unique per process start; prefixes session ids */
  char host_id[MBD_BW_NAME_MAX];          /* same host => shm/IPC possible */
  int device;                             /* CUDA ordinal of a GPU worker; -1 = CPU/unknown */
  char route_id[65];                      /* recomputed from route_enc, verified */
  char route_enc[MBD_BW_ROUTE_ENC_MAX];   /* canonical route encoding */
  mbd_route_identity route;               /* decoded route_enc */
  mbd_bmodel models[MBD_BW_MODELS_MAX];
  int nmodels;
  int capacity;                           /* concurrent requests it accepts (>= 1) */
  int inflight;                           /* requests sent and not finished */
  int64_t sessions;                       /* open sessions, from its last HEARTBEAT; -1 unknown */
  int64_t pid;                            /* reported process id (informational) */
  uint8_t ident[MBD_BW_IDENT_MAX];        /* ZeroMQ routing id on the workers socket */
  size_t ident_len;
  int64_t last_seen_ms;                   /* last message from it (monotonic ms) */
  int64_t registered_ms;
  uint64_t dispatch_seq;                  /* when it last got work: ties go round-robin */
  uint64_t gen;                           /* registration instance, set by the caller; requests
                                             remember it so a re-registered worker's old requests
                                             are told apart from new ones */
  bool dead;                              /* unreachable (send failed): expired at the next tick */
  mbd_bprefix prefix;                     /* its prefix cache, from heartbeats */
  char peer_id[96];                       /* who registered it, as the reactor stamped the READY:
                                             "key:<z85>" (CURVE), "uid:<n>" (ipc), "" unknown */
} mbd_bworker;

typedef struct mbd_registry mbd_registry;

int mbd_registry_new(mbd_registry **out, mbd_error *err);
void mbd_registry_destroy(mbd_registry **r);

/* Parses and checks a READY body into w (ident/time fields untouched):
 * name, uid (no '/'), route (decoded with mbd_route_decode), route_id (must
 * equal mbd_route_id_hex of the decoded route), host_id, capacity (1..4096,
 * default 1), models [{name, digest, tokenizer_digest?}], pid. MBD_E_INVALID / MBD_E_FORMAT with
 * the reason otherwise. */
int mbd_registry_parse_ready(const msgpack_object *body, mbd_bworker *w, mbd_error *err);

/* Adds w (copied) under its ident. An existing worker with the same ident or
 * the same uid is replaced: its old record is copied to *replaced (when not
 * NULL) and *was_replaced set, so the caller can fail over its requests.
 * MBD_E_BUSY when the registry is full (1024 workers). */
int mbd_registry_add(mbd_registry *r, const mbd_bworker *w, mbd_bworker *replaced,
                     bool *was_replaced, mbd_error *err);
/* Borrowed pointers, valid until the next add/remove. NULL when absent. */
mbd_bworker *mbd_registry_find_ident(mbd_registry *r, const void *ident, size_t len);
mbd_bworker *mbd_registry_find_uid(mbd_registry *r, const char *uid);
mbd_bworker *mbd_registry_find_gen(mbd_registry *r, uint64_t gen);
/* Removes by ident; 0 or MBD_E_NOT_FOUND. */
int mbd_registry_remove(mbd_registry *r, const void *ident, size_t len);
size_t mbd_registry_count(const mbd_registry *r);
mbd_bworker *mbd_registry_at(mbd_registry *r, size_t i);

/* True when w serves `model` ("" = any model) with a weights digest that
 * starts with `digest` (NULL or "" = any digest) and, when `tokenizer` is not
 * NULL, exactly that tokenizer digest ("" = a model without tokenizer). */
bool mbd_bworker_serves(const mbd_bworker *w, const char *model, const char *digest,
                        const char *tokenizer);
/* True when w matches the route constraint and model (name, digest prefix, tokenizer). */
bool mbd_bworker_matches(const mbd_bworker *w, const mbd_route_want *want, const char *model,
                         const char *digest, const char *tokenizer);

/* Marks `digest` (a hex prefix of >= 8 chars) as the default of model `name`:
 * requests for `name` that pin no digest are served by it only. Replaces an
 * earlier default of that name. MBD_E_INVALID for a bad prefix, MBD_E_BUSY
 * beyond MBD_BW_DEFAULTS_MAX names. */
int mbd_registry_set_default(mbd_registry *r, const char *name, const char *digest,
                             mbd_error *err);
/* The default digest prefix of `name`, or NULL when the deployment set none. */
const char *mbd_registry_default(const mbd_registry *r, const char *name);

/* Decides which weights a request for `model` gets, so that one name never
 * means two models without the client choosing. `pin` is the request's digest
 * prefix ("" = none). Among the live workers matching want and serving model
 * with a digest starting with pin (or, unpinned, with the name's default),
 * the distinct (weights digest, tokenizer digest) pairs are counted: one ->
 * its full digest goes to out and its tokenizer digest to tokenizer_out;
 * none -> out is the prefix (the caller's select then finds no worker: NO_ROUTE);
 * more than one -> MBD_E_INVALID with a message listing every digest and its
 * workers and saying how to pin one. model "" leaves out = pin. */
int mbd_registry_resolve_digest(mbd_registry *r, const mbd_route_want *want, const char *model,
                                const char *pin, char out[MBD_BW_DIGEST_MAX],
                                char tokenizer_out[MBD_BW_DIGEST_MAX], mbd_error *err);

/* Picks the least-loaded matching worker with spare capacity (lowest
 * inflight/capacity; ties: fewer in flight, then least recently used).
 * Returns NULL when none has capacity; *n_match (optional) counts matching
 * workers regardless of load, so the caller can tell "queue" from NO_ROUTE.
 * Workers marked dead are skipped and not counted.
 * `exclude` (optional) is never picked. */
mbd_bworker *mbd_registry_select(mbd_registry *r, const mbd_route_want *want, const char *model,
                                 const char *digest, const char *tokenizer,
                                 const mbd_bworker *exclude, size_t *n_match);

/* Reads a HEARTBEAT's `prefix` value {lookups, hits, hit_tokens, inserts,
 * evictions, bytes, entries, device_hits, demotions, device_bytes,
 * device_entries (each optional, 0 when absent), hashes: [u64]} into
 * w->prefix; a malformed one
 * leaves w->prefix as it was and returns false. */
bool mbd_bworker_read_prefix(mbd_bworker *w, const msgpack_object *v);
/* How many of a request's routing hashes h[0..n) (ascending prefix lengths)
 * w holds, as the longest: i + 1 for the last h[i] it advertises, 0 for none. */
size_t mbd_bworker_prefix_match(const mbd_bworker *w, const uint64_t *h, size_t n);
/* As mbd_registry_select, preferring the worker holding the longest of the
 * prompt's cached prefixes h[0..n) among those whose in-flight load is under
 * MBD_PREFIX_ROUTE_LOAD_PCT percent of their capacity (ties: the less
 * loaded); none: mbd_registry_select's choice. */
mbd_bworker *mbd_registry_select_prefix(mbd_registry *r, const mbd_route_want *want,
                                        const char *model, const char *digest,
                                        const char *tokenizer, const uint64_t *h, size_t n,
                                        const mbd_bworker *exclude, size_t *n_match);

/* As mbd_registry_select, for requests carrying CUDA IPC tensors: only GPU
 * workers on the client's host (host_id equal, device >= 0) match; among
 * those with spare capacity the one on `device` (the GPU holding the memory)
 * is preferred, then the least loaded (GPU-affine routing). */
mbd_bworker *mbd_registry_select_ipc(mbd_registry *r, const mbd_route_want *want,
                                     const char *model, const char *digest,
                                     const char *tokenizer, const char *host_id, int device,
                                     const mbd_bworker *exclude, size_t *n_match);

/* NO_ROUTE message naming what was asked and what exists, e.g.
 * "no live worker matches route dtype=bf16 model=m; available: 3fa2c1d0 cpu/f32/deterministic
 * models=[m2]; ..." (truncated with "..." to fit cap). */
void mbd_registry_no_route_message(mbd_registry *r, const mbd_route_want *want, const char *model,
                                   const char *digest, char *buf, size_t cap);

#endif
