/* Request builders for the worker harness: each packs one request body as
 * docs/protocol.md describes it and sends it through wh_send (the tag is
 * returned; wh_wait collects the reply). */
#ifndef MBD_TEST_WH_REQUESTS_H
#define MBD_TEST_WH_REQUESTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/route.h"
#include "support/worker_harness.h"

/* A body being packed. */
typedef struct {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} wh_pack;

/* An empty body with its packer. */
void wh_pack_init(wh_pack *p);

/* Packs a tensor reference {name, dtype, shape, frame}. */
void wh_ref(msgpack_packer *pk, const char *name, const char *dt, int ndim, const int64_t *shape,
            int frame);

/* Packs a tensor reference {name, dtype, shape, shm: {name: obj, offset, size}}. */
void wh_ref_shm(msgpack_packer *pk, const char *name, const char *dt, int ndim,
                const int64_t *shape, const char *obj, uint64_t off, uint64_t size);

/* OPEN of model "tiny", without waiting for the reply. */
uint64_t wh_send_open(wh *h);

/* OPEN of model "tiny"; the session id goes to sid. Returns the reply. */
mbd_msg *wh_open(wh *h, char *sid, size_t cap);

/* PREFILL of ids[T] into session sid; last_only: logits of the last position only. */
uint64_t wh_send_prefill(wh *h, const char *sid, const int64_t *ids, int64_t T, bool last_only);

/* STEP of session sid with one token. */
uint64_t wh_send_step(wh *h, const char *sid, int64_t token);

/* GENERATE; temperature 0 = greedy. */
uint64_t wh_send_generate(wh *h, const char *sid, int64_t max_tokens, double temperature,
                          uint64_t seed);

/* EXPORT of session sid's state. */
uint64_t wh_send_export(wh *h, const char *sid);

/* CLOSE of session sid. */
uint64_t wh_send_close(wh *h, const char *sid);

/* IMPORT of an exported state blob (n bytes, i64 words) for model "tiny"
 * under `want` (exact route id, dtype, ...). */
uint64_t wh_send_import(wh *h, const void *blob, size_t n, const mbd_route_want *want);

/* Stateless FORWARD of ids [B, T] through model "tiny". */
uint64_t wh_send_forward(wh *h, const int64_t *ids, int64_t B, int64_t T, bool last_only);

/* ids[n]: deterministic pseudo-random token ids in [0, V) (xorshift64, the
 * same sequence on every run). */
void wh_fill_ids(int64_t *ids, size_t n, int64_t V);

#endif
