/* Reply packing: every message the worker sends for a request (FINAL,
 * PARTIAL, ERROR) is built here and handed to the state's send callback.
 * Every FINAL/PARTIAL body starts with route_id and worker. */
#ifndef MBD_WORKER_REPLY_H
#define MBD_WORKER_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "common/protocol.h"
#include "common/tensor.h"
#include "worker/request.h"
#include "worker/state.h"

/* Hands *m to st->send (consumed). */
void mbd_wreply_send(mbd_wstate *st, mbd_msg **m);
/* ERROR {code, message} for ticket tag. */
void mbd_wreply_error(mbd_wstate *st, uint64_t tag, int code, const char *msg);
/* ERROR from e (code MBD_E_INTERNAL when e has none). */
void mbd_wreply_err(mbd_wstate *st, uint64_t tag, const mbd_error *e);
/* Starts a FINAL/PARTIAL body: a map of 2 + nextra entries whose first two are
 * route_id and worker. */
void mbd_wreply_head(const mbd_wstate *st, msgpack_packer *pk, uint32_t nextra);
/* Sends cmd with the body in sb (consumed). `payload` (malloc'ed, owned here)
 * becomes the first payload frame without a copy when non-NULL. On a build failure the
 * ticket gets an ERROR instead. */
void mbd_wreply_body(mbd_wstate *st, uint8_t cmd, uint64_t tag, msgpack_sbuffer *sb, void *payload,
                     size_t plen);
/* FINAL {route_id, worker, tensors: [ref]} for a result in `own` (malloc'ed,
 * taken: the payload frame, or copied into q's CUDA IPC output) or, when own
 * is NULL, already in q's shm output (the ref is echoed). */
void mbd_wreply_tensor(mbd_wstate *st, const mbd_wreq *q, uint64_t tag, const char *name,
                       const mbd_tensor_desc *desc, void *own);
/* FINAL {route_id, worker[, k: v]} (no extra field when k is NULL). */
void mbd_wreply_fields_str(mbd_wstate *st, uint64_t tag, const char *k, const char *v);
/* A STEP's FINAL: the logits row [V] into the shm output out (when non-NULL)
 * or as the payload frame. */
void mbd_wreply_step_logits(mbd_wstate *st, uint64_t tag, const mbd_tensor_ref *out,
                            const float *row, int64_t V);
/* GENERATE's PARTIAL {tokens} (tokens[0..n)). */
void mbd_wreply_gen_partial(mbd_wstate *st, uint64_t tag, const int64_t *tokens, int64_t n);
/* GENERATE's FINAL {tokens: all n, reason, peak_batch}. */
void mbd_wreply_gen_final(mbd_wstate *st, uint64_t tag, const int64_t *tokens, int64_t n,
                          const char *reason, int64_t peak_batch);

#endif
