/* Session checkpoints to the broker, and the restore-side request fields
 * (IMPORT `replay`, GENERATE `resume`). See checkpoint.h. */
#include "worker/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/defaults.h"
#include "common/log.h"
#include "common/protocol.h"
#include "kernels/state_blob.h"
#include "worker/reply.h"

#define LOGC MBD_WSTATE_LOG
#define LIST_MAX_BYTES ((size_t)MBD_WREQ_MAX_TOKENS_CAP * 9 + 64) /* msgpack i64 array, worst case */

int mbd_wckpt_blob(mbd_wstate *st, const mbd_wsession *s, void **blob, size_t *size,
                   mbd_error *err) {
  const mbd_wsess_data *ws = s->user;
  const mbd_wmodel *m = &st->models[s->model];
  mbd_state_blob_info info;
  memset(&info, 0, sizeof info);
  snprintf(info.model, sizeof info.model, "%s", m->name);
  memcpy(info.model_digest, m->digest, sizeof info.model_digest);
  memcpy(info.route_id, st->route_id, sizeof info.route_id);
  info.state_bytes = st->be->ops->state_bytes((const mbd_bstate *)s->state);
  info.vocab = (uint64_t)m->vocab;
  info.has_logits = ws->has_logits;
  *size = mbd_state_blob_size(info.state_bytes, info.vocab, info.has_logits);
  *blob = *size ? malloc(*size) : NULL;
  if (!*blob) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a %zu-byte state", *size);
  void *sdst, *ldst;
  mbd_state_blob_write_header(*blob, *size, &info, &sdst, &ldst);
  int rc = st->be->ops->state_save((const mbd_bstate *)s->state, sdst, info.state_bytes, err);
  if (rc) {
    free(*blob);
    *blob = NULL;
    return rc;
  }
  if (ldst) memcpy(ldst, ws->logits, (size_t)m->vocab * sizeof(float));
  return MBD_OK;
}

bool mbd_wckpt_enabled(const mbd_wstate *st) {
  return st->o.checkpoint_tokens > 0 || st->o.checkpoint_ms > 0;
}

bool mbd_wckpt_due_tokens(const mbd_wstate *st, const mbd_wsession *s, int64_t extra) {
  return st->o.checkpoint_tokens > 0 &&
         ((const mbd_wsess_data *)s->user)->ckpt_tokens + extra >= st->o.checkpoint_tokens;
}

void mbd_wckpt_consumed(mbd_wsession *s, int64_t n) { ((mbd_wsess_data *)s->user)->ckpt_tokens += n; }

static void free_blob(void *data, void *hint) {
  (void)hint;
  free(data);
}

/* CHECKPOINT {session, owner, model, model_digest[, closed]} with the blob
 * as F4 (none when closed). */
static void send_checkpoint(mbd_wstate *st, const mbd_wsession *s, void *blob, size_t size) {
  const mbd_wmodel *m = &st->models[s->model];
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, blob ? 4 : 5);
  mbd_pack_kv_str(&pk, "session", s->id);
  mbd_pack_kv_str(&pk, "owner", s->owner);
  mbd_pack_kv_str(&pk, "model", m->name);
  mbd_pack_kv_str(&pk, "model_digest", m->digest);
  if (!blob) mbd_pack_kv_bool(&pk, "closed", true);
  mbd_msg *msg = NULL;
  mbd_error e = {0};
  int rc = mbd_msg_new(MBD_CMD_CHECKPOINT, 0, &msg, &e);
  if (!rc) rc = mbd_msg_take_body(msg, &sb, &e);
  if (!rc && blob) {
    rc = mbd_msg_add_payload_ref(msg, blob, size, free_blob, NULL, &e);
    if (!rc) blob = NULL; /* the message frees it */
  }
  msgpack_sbuffer_destroy(&sb);
  free(blob);
  if (rc) {
    MBD_LOGW(LOGC, "cannot send a checkpoint of session %s: %s", s->id, e.msg);
    mbd_msg_destroy(&msg);
    return;
  }
  mbd_wreply_send(st, &msg);
}

void mbd_wckpt_emit(mbd_wstate *st, mbd_wsession *s) {
  if (!mbd_wckpt_enabled(st)) return;
  mbd_wsess_data *ws = s->user;
  void *blob = NULL;
  size_t size = 0;
  mbd_error e = {0};
  if (mbd_wckpt_blob(st, s, &blob, &size, &e)) {
    MBD_LOGW(LOGC, "cannot checkpoint session %s: %s", s->id, e.msg);
    return;
  }
  send_checkpoint(st, s, blob, size);
  ws->ckpt_tokens = 0;
  ws->ckpt_at = mbd_wstate_now(st);
}

void mbd_wckpt_settle(mbd_wstate *st, mbd_wsession *s) {
  if (((mbd_wsess_data *)s->user)->ckpt_tokens > 0) mbd_wckpt_emit(st, s);
}

void mbd_wckpt_tick(mbd_wstate *st) {
  if (!mbd_wckpt_enabled(st)) return;
  double now = mbd_wstate_now(st);
  for (size_t i = 0; i < mbd_wsession_capacity(st->sessions); i++) {
    mbd_wsession *s = mbd_wsession_at(st->sessions, i);
    if (!s) continue;
    mbd_wsess_data *ws = s->user;
    if (ws->ckpt_tokens <= 0 || (s->busy && !ws->gen) || ws->logits_stale) continue;
    bool due = (st->o.checkpoint_tokens > 0 && ws->ckpt_tokens >= st->o.checkpoint_tokens) ||
               (st->o.checkpoint_ms > 0 && now - ws->ckpt_at >= st->o.checkpoint_ms / 1000.0);
    if (!due) continue;
    mbd_wgen *g = ws->gen;
    if (g && g->sent < g->n) { /* the broker must know every token the checkpoint covers */
      mbd_wreply_gen_partial(st, g->tag, g->tokens + g->sent, g->n - g->sent);
      g->sent = g->n;
    }
    mbd_wckpt_emit(st, s);
  }
}

void mbd_wckpt_expiring(mbd_wstate *st, double now, double idle_s) {
  if (!mbd_wckpt_enabled(st) || idle_s <= 0) return;
  for (size_t i = 0; i < mbd_wsession_capacity(st->sessions); i++) {
    mbd_wsession *s = mbd_wsession_at(st->sessions, i);
    if (s && !s->busy && now - s->last_used > idle_s) send_checkpoint(st, s, NULL, 0);
  }
}

/* The integer array `key` of msg's body in *out (malloc'ed; NULL, *n = 0 when
 * absent), at most `cap` entries, each in [0, vocab). */
static int read_tokens(const mbd_msg *msg, const char *key, int64_t cap, int64_t vocab,
                       int64_t **out, int64_t *n, mbd_error *err) {
  *out = NULL;
  *n = 0;
  const char *keys[2] = {key, NULL};
  size_t blen = 0;
  const void *b = mbd_msg_body(msg, &blen);
  mbd_body *body = NULL;
  int rc = mbd_body_parse_keys(b, blen, keys, LIST_MAX_BYTES, &body, err);
  if (rc) return rc;
  const msgpack_object *a = mbd_obj_get(mbd_body_root(body), key);
  if (!a) goto done;
  if (a->type != MSGPACK_OBJECT_ARRAY || (int64_t)a->via.array.size > cap) {
    rc = mbd_error_set(err, MBD_E_INVALID, "'%s' must be an array of at most %lld token ids", key,
                       (long long)cap);
    goto done;
  }
  if (!a->via.array.size) goto done;
  if (!(*out = malloc(a->via.array.size * sizeof **out))) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for '%s'", key);
    goto done;
  }
  for (uint32_t i = 0; i < a->via.array.size; i++) {
    const msgpack_object *o = &a->via.array.ptr[i];
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= (uint64_t)vocab) {
      rc = mbd_error_set(err, MBD_E_INVALID, "'%s'[%u] is not a token id in [0, %lld)", key, i,
                         (long long)vocab);
      free(*out);
      *out = NULL;
      goto done;
    }
    (*out)[i] = (int64_t)o->via.u64;
  }
  *n = (int64_t)a->via.array.size;
done:
  mbd_body_destroy(&body);
  return rc;
}

int mbd_wckpt_replay(mbd_wstate *st, const mbd_msg *msg, mbd_wsession *s, mbd_error *err) {
  const mbd_wmodel *m = &st->models[s->model];
  int64_t *ids = NULL, n = 0;
  int rc = read_tokens(msg, "replay", MBD_DURABLE_LOG_MAX, m->vocab, &ids, &n, err);
  if (rc || !n) return rc;
  mbd_wsess_data *ws = s->user;
  int64_t chunk = st->o.slice_tokens > 0 ? st->o.slice_tokens : MBD_DEFAULT_SLICE_TOKENS;
  /* Prefill equals decode bit for bit, so the replayed state and logits are
   * those the steps produced on the lost worker. */
  for (int64_t done = 0; !rc && done < n; done += chunk) {
    int64_t c = n - done < chunk ? n - done : chunk;
    rc = st->be->ops->prefill(st->be, m->bm, (mbd_bstate *)s->state, ids + done, c, true,
                              ws->logits, err);
  }
  free(ids);
  if (rc) return rc;
  ws->has_logits = true;
  ws->logits_stale = false;
  MBD_LOGD(LOGC, "session %s: replayed %lld token(s) after its checkpoint", s->id, (long long)n);
  return MBD_OK;
}

int mbd_wckpt_resume_tokens(const mbd_msg *msg, int64_t max_tokens, int64_t vocab, int64_t **out,
                            int64_t *n, mbd_error *err) {
  return read_tokens(msg, "resume", max_tokens, vocab, out, n, err);
}
