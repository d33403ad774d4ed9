/* Reply packing for the worker: ERROR, FINAL and PARTIAL bodies, payload
 * frames without copies. See reply.h. */
#include "worker/reply.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define LOGC MBD_WSTATE_LOG

void mbd_wreply_send(mbd_wstate *st, mbd_msg **m) { st->send(st->send_ctx, m); }

void mbd_wreply_error(mbd_wstate *st, uint64_t tag, int code, const char *msg) {
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new_error(tag, code, msg, &m, &e)) {
    MBD_LOGE(LOGC, "cannot build an ERROR reply: %s", e.msg);
    return;
  }
  MBD_LOGD(LOGC, "ticket %" PRIu64 ": %s %s", tag, mbd_status_name(code), msg);
  mbd_wreply_send(st, &m);
}

void mbd_wreply_err(mbd_wstate *st, uint64_t tag, const mbd_error *e) {
  mbd_wreply_error(st, tag, e->code ? e->code : MBD_E_INTERNAL, e->msg);
}

void mbd_wreply_head(const mbd_wstate *st, msgpack_packer *pk, uint32_t nextra) {
  msgpack_pack_map(pk, 2 + nextra);
  mbd_pack_kv_str(pk, "route_id", st->route_id);
  mbd_pack_kv_str(pk, "worker", st->o.name);
}

/* ZeroMQ frees zero-copy payloads through this (possibly from its I/O thread). */
static void free_payload(void *data, void *hint) {
  (void)hint;
  free(data);
}

void mbd_wreply_body(mbd_wstate *st, uint8_t cmd, uint64_t tag, msgpack_sbuffer *sb, void *payload,
                     size_t plen) {
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_shm_cache_check(st->shm, &e)) { /* the result was computed from a shrunk object */
    free(payload);
    msgpack_sbuffer_destroy(sb);
    mbd_wreply_err(st, tag, &e);
    return;
  }
  if (mbd_msg_new(cmd, tag, &m, &e) || mbd_msg_take_body(m, sb, &e)) goto fail;
  if (payload) {
    int rc = plen ? mbd_msg_add_payload_ref(m, payload, plen, free_payload, NULL, &e)
                  : mbd_msg_add_payload_copy(m, "", 0, &e);
    if (!plen || rc) free(payload);
    payload = NULL;
    if (rc) goto fail;
  }
  mbd_wreply_send(st, &m);
  msgpack_sbuffer_destroy(sb);
  return;
fail:
  free(payload);
  msgpack_sbuffer_destroy(sb);
  MBD_LOGE(LOGC, "cannot build a reply: %s", e.msg);
  mbd_msg_destroy(&m);
  mbd_wreply_error(st, tag, e.code ? e.code : MBD_E_INTERNAL, e.msg);
}

void mbd_wreply_tensor(mbd_wstate *st, const mbd_wreq *q, uint64_t tag, const char *name,
                       const mbd_tensor_desc *desc, void *own) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  mbd_wreply_head(st, &pk, 1);
  mbd_pack_str(&pk, "tensors");
  msgpack_pack_array(&pk, 1);
  mbd_tensor_ref r;
  size_t nbytes = 0;
  mbd_tensor_desc_nbytes(desc, &nbytes, NULL);
  if (own) {
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", name);
    r.desc = *desc;
    r.kind = MBD_TREF_INLINE;
    r.frame = 0;
  } else {
    r = q->outputs[0];
  }
  mbd_pack_tensor_ref(&pk, &r);
  mbd_wreply_body(st, MBD_CMD_FINAL, tag, &sb, own, nbytes);
}

void mbd_wreply_fields_str(mbd_wstate *st, uint64_t tag, const char *k, const char *v) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  mbd_wreply_head(st, &pk, k ? 1 : 0);
  if (k) mbd_pack_kv_str(&pk, k, v);
  mbd_wreply_body(st, MBD_CMD_FINAL, tag, &sb, NULL, 0);
}

void mbd_wreply_step_logits(mbd_wstate *st, uint64_t tag, const mbd_tensor_ref *out,
                            const float *row, int64_t V) {
  mbd_tensor_desc ld;
  int64_t sh[1] = {V};
  mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 1, sh, NULL);
  mbd_wreq q;
  memset(&q, 0, sizeof q);
  if (out) { /* the row is host memory (the batch's logits): copied into the output */
    mbd_error err = {0};
    void *dst = NULL;
    bool on_device = false;
    q.outputs[0] = *out;
    q.noutputs = 1;
    mbd_shm_cache_watch(st->shm);
    if (mbd_wreq_output_at(st->be, st->shm, out, &ld, &dst, &on_device, &err) ||
        mbd_wreq_output_put(st->be, st->shm, out, 0, row, (size_t)V * sizeof(float), &err)) {
      mbd_wreply_err(st, tag, &err);
      return;
    }
    mbd_wreply_tensor(st, &q, tag, "logits", &ld, NULL);
    return;
  }
  float *own = malloc((size_t)V * sizeof(float));
  if (!own) {
    mbd_wreply_error(st, tag, MBD_E_NOMEM, "out of memory for step logits");
    return;
  }
  memcpy(own, row, (size_t)V * sizeof(float));
  mbd_wreply_tensor(st, &q, tag, "logits", &ld, own);
}

/* PARTIAL {tokens} when reason is NULL, else FINAL {tokens, reason, peak_batch}. */
static void send_tokens(mbd_wstate *st, uint64_t tag, const int64_t *tokens, int64_t n,
                        const char *reason, int64_t peak_batch, const mbd_tensor_ref *out) {
  if (out) { /* FINAL into the client's buffer too: tokens [0, n) of it */
    mbd_error e = {0};
    mbd_shm_cache_watch(st->shm);
    if (mbd_wreq_output_put(st->be, st->shm, out, 0, tokens, (size_t)n * sizeof *tokens, &e)) {
      mbd_wreply_err(st, tag, &e);
      return;
    }
  }
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  mbd_wreply_head(st, &pk, reason ? 3 : 1);
  mbd_pack_str(&pk, "tokens");
  msgpack_pack_array(&pk, (uint32_t)n);
  for (int64_t i = 0; i < n; i++) msgpack_pack_int64(&pk, tokens[i]);
  if (reason) {
    mbd_pack_kv_str(&pk, "reason", reason);
    /* Observable proof of batching (tests): timing-free, unlike reply order. */
    mbd_pack_kv_i64(&pk, "peak_batch", peak_batch);
  }
  mbd_wreply_body(st, reason ? MBD_CMD_FINAL : MBD_CMD_PARTIAL, tag, &sb, NULL, 0);
}

void mbd_wreply_gen_partial(mbd_wstate *st, uint64_t tag, const int64_t *tokens, int64_t n) {
  send_tokens(st, tag, tokens, n, NULL, 0, NULL);
}

void mbd_wreply_gen_final(mbd_wstate *st, uint64_t tag, const int64_t *tokens, int64_t n,
                          const char *reason, int64_t peak_batch, const mbd_tensor_ref *out) {
  send_tokens(st, tag, tokens, n, reason, peak_batch, out);
}
