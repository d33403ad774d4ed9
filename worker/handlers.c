/* Request handlers: one function per request verb, from the decoded body to
 * the reply (or, for STEP and GENERATE, to the scheduler's queue). See
 * handlers.h. */
#include "worker/handlers.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/protocol.h"
#include "worker/checkpoint.h"
#include "worker/models.h"
#include "worker/reply.h"
#include "worker/request.h"
#include "worker/scheduler.h"
#include "kernels/state_blob.h"

#define LOGC MBD_WSTATE_LOG
#define MAX_FORWARD_ROWS 4096 /* sequences per FORWARD */

/* Input bytes, copied to an aligned buffer (*own) only when the frame is not
 * aligned for the element type. A CUDA IPC input is device memory used in
 * place when `on_device` (the backend reads it there: GEMM operands), else
 * copied down (token ids, which are checked on the host before any kernel
 * indexes with them, and state images: small). */
static int get_input(mbd_wstate *st, const mbd_msg *msg, const mbd_tensor_ref *r, bool on_device,
                     const void **data, size_t *nbytes, void **own, mbd_error *err) {
  *own = NULL;
  int rc;
  if (r->kind == MBD_TREF_CUDA_IPC && on_device && st->be->ops->ipc_map)
    return mbd_wreq_input_dev(st->be, r, data, nbytes, err);
  if (r->kind == MBD_TREF_CUDA_IPC && st->be->ops->ipc_read) {
    if ((rc = mbd_tensor_desc_nbytes(&r->desc, nbytes, err))) return rc;
    if (!(*own = malloc(*nbytes ? *nbytes : 1)))
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory for IPC tensor '%s'", r->name);
    if ((rc = st->be->ops->ipc_read(st->be, r, *own, *nbytes, err))) {
      free(*own);
      *own = NULL;
      return rc;
    }
    *data = *own;
    return MBD_OK;
  }
  rc = mbd_wreq_input(r, msg, st->shm, data, nbytes, err);
  if (rc) return rc;
  size_t es = mbd_dtype_size(r->desc.dtype);
  if (es > 1 && ((uintptr_t)*data % es)) {
    if (!(*own = malloc(*nbytes ? *nbytes : 1)))
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory copying tensor '%s'", r->name);
    memcpy(*own, *data, *nbytes);
    *data = *own;
  }
  return MBD_OK;
}

/* Destination for a result `want`: the request's shm output or the client's
 * device memory (CUDA IPC, written in place) when given, else a malloc'ed
 * buffer (*own) that becomes the reply's payload frame. */
static int get_output(mbd_wstate *st, const mbd_wreq *q, const mbd_tensor_desc *want, void **dst,
                      void **own, mbd_error *err) {
  *own = NULL;
  size_t nbytes;
  int rc = mbd_tensor_desc_nbytes(want, &nbytes, err);
  if (rc) return rc;
  bool on_device;
  if (q->noutputs) return mbd_wreq_output_at(st->be, st->shm, &q->outputs[0], want, dst, &on_device, err);
  if (nbytes > st->o.max_message_bytes) {
    char d[96];
    mbd_tensor_desc_format(want, d, sizeof d);
    return mbd_error_set(err, MBD_E_TOO_LARGE,
                         "result %s is %zu bytes, over the %zu-byte message cap: ask for "
                         "last_only, split the batch, or pass a shm output",
                         d, nbytes, st->o.max_message_bytes);
  }
  if (!(*own = malloc(nbytes ? nbytes : 1)))
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a %zu-byte result", nbytes);
  *dst = *own;
  return MBD_OK;
}

/* Deadline of q on the state's clock (0 = none). */
static double deadline_of(const mbd_wstate *st, const mbd_wreq *q) {
  return q->deadline_ms > 0 ? mbd_wstate_now(st) + (double)q->deadline_ms / 1000.0 : 0;
}

/* Queues a FORWARD/PREFILL as a sliced job (worker/scheduler.h): the ids are
 * copied (the frame and shm mapping need not outlive this call), the output
 * is checked now so a bad one fails before any compute, and the result goes
 * to a buffer of the job's own. */
static int queue_job(mbd_wstate *st, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                     uint8_t cmd, int mi, const mbd_wsession *s, const mbd_tensor_ref *r, int64_t B,
                     int64_t T, const mbd_tensor_desc *ld, mbd_error *err) {
  const void *ids = NULL;
  void *own = NULL, *dst = NULL, *outown = NULL;
  size_t n = 0, nout = 0;
  int rc = get_input(st, msg, r, false, &ids, &n, &own, err);
  if (!rc) rc = get_output(st, q, ld, &dst, &outown, err);
  if (!rc) rc = mbd_tensor_desc_nbytes(ld, &nout, err);
  /* A CUDA IPC output is written in place slice by slice (j->out stays NULL). */
  bool dev_out = q->noutputs && q->outputs[0].kind == MBD_TREF_CUDA_IPC;
  mbd_wjob *j = NULL;
  if (!rc && (!(j = calloc(1, sizeof *j)) || !(j->ids = malloc(n ? n : 1)) ||
              !(j->q = malloc(sizeof *j->q)) ||
              (!dev_out && !(j->out = outown ? outown : malloc(nout ? nout : 1)))))
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory queueing a %s of %lld x %lld tokens",
                       mbd_cmd_name(cmd), (long long)B, (long long)T);
  if (rc) {
    if (j && j->out == outown) j->out = NULL;
    mbd_wjob_free(j);
    free(outown);
    free(own);
    return rc;
  }
  memcpy(j->ids, ids, n);
  free(own);
  *j->q = *q;
  j->tag = tag;
  j->cmd = cmd;
  j->model = mi;
  if (s) snprintf(j->session, sizeof j->session, "%s", s->id);
  j->B = B;
  j->T = T;
  j->last_only = q->last_only;
  j->ld = *ld;
  j->deadline = deadline_of(st, q);
  mbd_wsched_job(st, j);
  return MBD_OK;
}

static int check_desc(const mbd_tensor_ref *r, mbd_dtype dt, int ndim_lo, int ndim_hi,
                      const char *what, mbd_error *err) {
  if (r->desc.dtype != dt || r->desc.ndim < ndim_lo || r->desc.ndim > ndim_hi) {
    char d[96];
    mbd_tensor_desc_format(&r->desc, d, sizeof d);
    return mbd_error_set(err, MBD_E_SHAPE, "%s must be %s with %d..%d dims (got '%s' %s)", what,
                         mbd_dtype_name(dt), ndim_lo, ndim_hi, r->name, d);
  }
  return MBD_OK;
}

/* Session lookup for session commands (its data in *ws): MBD_E_BUSY while a
 * GENERATE or a PREFILL owns the session (until its reply). */
static int get_session(mbd_wstate *st, const mbd_wreq *q, mbd_wsession **s, mbd_wsess_data **ws,
                       mbd_error *err) {
  int rc = mbd_wsession_find_for(st->sessions, q->session, q->caller.id, s, err);
  if (rc) return rc;
  *ws = (*s)->user;
  if ((*ws)->inflight) mbd_wsched_flush(st); /* the session as its last step left it */
  (*s)->last_used = mbd_wstate_now(st);
  if ((*s)->busy)
    return mbd_error_set(err, MBD_E_BUSY,
                         "session '%s' is busy (a GENERATE or PREFILL runs on it): wait for its "
                         "reply before sending more requests to it",
                         (*s)->id);
  return MBD_OK;
}

static int h_gemm(mbd_wstate *st, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                  mbd_error *err) {
  const void *a = NULL, *b = NULL, *bias = NULL;
  void *own[3] = {NULL, NULL, NULL}, *outown = NULL, *c = NULL;
  size_t na, nb, nbias;
  int rc;
  const mbd_tensor_ref *ra = &q->tensors[0], *rb = &q->tensors[1];
  if ((rc = check_desc(ra, q->dtype, 2, 2, "gemm a", err))) return rc;
  if ((rc = check_desc(rb, q->dtype, 2, 2, "gemm b (weights layout [N,K])", err))) return rc;
  int64_t M = ra->desc.shape[0], K = ra->desc.shape[1], N = rb->desc.shape[0];
  if (rb->desc.shape[1] != K)
    return mbd_error_set(err, MBD_E_SHAPE, "gemm: a is [%lld,%lld] but b is [%lld,%lld]: b must "
                         "be [N,K] with the same K",
                         (long long)M, (long long)K, (long long)N, (long long)rb->desc.shape[1]);
  if (q->ntensors == 3) {
    const mbd_tensor_ref *rc3 = &q->tensors[2];
    if ((rc = check_desc(rc3, MBD_DTYPE_F32, 1, 1, "gemm bias", err))) return rc;
    if (rc3->desc.shape[0] != N)
      return mbd_error_set(err, MBD_E_SHAPE, "gemm: bias has %lld entries, N is %lld",
                           (long long)rc3->desc.shape[0], (long long)N);
  }
  mbd_tensor_desc cd;
  int64_t cs[2] = {M, N};
  if ((rc = mbd_tensor_desc_make(&cd, MBD_DTYPE_F32, 2, cs, err))) return rc;
  if ((rc = get_input(st, msg, ra, true, &a, &na, &own[0], err))) goto fail;
  if ((rc = get_input(st, msg, rb, true, &b, &nb, &own[1], err))) goto fail;
  if (q->ntensors == 3 &&
      (rc = get_input(st, msg, &q->tensors[2], true, &bias, &nbias, &own[2], err)))
    goto fail;
  if ((rc = get_output(st, q, &cd, &c, &outown, err))) goto fail;
  rc = st->be->ops->gemm(st->be, M, N, K, ra->desc.dtype, a, rb->desc.dtype, b, bias, c, err);
  if (rc) goto fail;
  mbd_wreply_tensor(st, q, tag, "c", &cd, outown);
  outown = NULL;
fail:
  for (int i = 0; i < 3; i++) free(own[i]);
  free(outown);
  return rc;
}

static int h_forward(mbd_wstate *st, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                     mbd_error *err) {
  int mi = mbd_wmodels_find(st, q->model, err);
  if (mi < 0) return mi;
  mbd_wmodel *m = &st->models[mi];
  const mbd_tensor_ref *r = &q->tensors[0];
  int rc = check_desc(r, MBD_DTYPE_I64, 2, 2, "forward input_ids", err);
  if (rc) return rc;
  int64_t B = r->desc.shape[0], T = r->desc.shape[1];
  if (B < 1 || T < 1)
    return mbd_error_set(err, MBD_E_SHAPE, "forward input_ids must be [B,T] with B, T >= 1");
  if (B > MAX_FORWARD_ROWS) /* each row holds a recurrent state while it runs */
    return mbd_error_set(err, MBD_E_TOO_LARGE,
                         "forward batch of %lld sequences is over the limit of %d: split it",
                         (long long)B, MAX_FORWARD_ROWS);
  mbd_tensor_desc ld;
  int64_t s3[3] = {B, T, m->vocab}, s2[2] = {B, m->vocab};
  if ((rc = q->last_only ? mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 2, s2, err)
                         : mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 3, s3, err)))
    return rc;
  return queue_job(st, msg, q, tag, MBD_CMD_FORWARD, mi, NULL, r, B, T, &ld, err);
}

static int h_open(mbd_wstate *st, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  int mi = mbd_wmodels_find(st, q->model, err);
  if (mi < 0) return mi;
  mbd_wsession *s = NULL;
  int rc = mbd_wsession_admit(st->sessions, q->caller.id, st->o.client_sessions, err);
  if (rc || (rc = mbd_wstate_session_new(st, mi, &s, err))) return rc;
  mbd_wsession_own(s, q->caller.id);
  ((mbd_wsess_data *)s->user)->fresh = true; /* its first PREFILL may use the prefix cache */
  MBD_LOGD(LOGC, "opened session %s (%s)", s->id, q->model);
  mbd_wreply_fields_str(st, tag, "session", s->id);
  mbd_wckpt_emit(st, s); /* the base a durable session is restored from */
  return MBD_OK;
}

static int h_prefill(mbd_wstate *st, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                     mbd_error *err) {
  mbd_wsession *s;
  mbd_wsess_data *ws;
  int rc = get_session(st, q, &s, &ws, err);
  if (rc) return rc;
  mbd_wmodel *m = &st->models[s->model];
  const mbd_tensor_ref *r = &q->tensors[0];
  if ((rc = check_desc(r, MBD_DTYPE_I64, 1, 2, "prefill input_ids", err))) return rc;
  if (r->desc.ndim == 2 && r->desc.shape[0] != 1)
    return mbd_error_set(err, MBD_E_SHAPE, "prefill input_ids must be [T] or [1,T] (one session "
                         "is one sequence; use FORWARD for batches)");
  int64_t T = r->desc.shape[r->desc.ndim - 1];
  if (T < 1) return mbd_error_set(err, MBD_E_SHAPE, "prefill needs at least one token");
  mbd_tensor_desc ld;
  int64_t sh[2] = {q->last_only ? 1 : T, m->vocab};
  if ((rc = mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 2, sh, err))) return rc;
  if ((rc = mbd_wsched_check_no_step(st, s, err))) return rc;
  if ((rc = queue_job(st, msg, q, tag, MBD_CMD_PREFILL, s->model, s, r, 1, T, &ld, err))) return rc;
  s->busy = true; /* the job owns the session until its reply */
  return MBD_OK;
}

static int h_step(mbd_wstate *st, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  mbd_wsession *s;
  mbd_wsess_data *ws;
  int rc = get_session(st, q, &s, &ws, err);
  if (rc) return rc;
  int64_t V = st->models[s->model].vocab;
  if (q->token < 0 || q->token >= V)
    return mbd_error_set(err, MBD_E_INVALID, "token %lld is outside the vocabulary [0, %lld)",
                         (long long)q->token, (long long)V);
  if (q->noutputs) { /* check the output now so the error comes before queueing */
    mbd_tensor_desc ld;
    int64_t sh[1] = {V};
    void *dst;
    bool on_device;
    if ((rc = mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 1, sh, err))) return rc;
    if ((rc = mbd_wreq_output_at(st->be, st->shm, &q->outputs[0], &ld, &dst, &on_device, err)))
      return rc;
  }
  return mbd_wsched_step_until(st, s, tag, q->token, q->noutputs ? &q->outputs[0] : NULL,
                               deadline_of(st, q), err);
}

static int h_generate(mbd_wstate *st, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                      mbd_error *err) {
  mbd_wsession *s;
  mbd_wsess_data *ws;
  int rc = get_session(st, q, &s, &ws, err);
  if (rc) return rc;
  if (q->noutputs) { /* fail a bad token output before generating */
    void *dst;
    bool on_device;
    if ((rc = mbd_wreq_output_at(st->be, st->shm, &q->outputs[0], &q->outputs[0].desc, &dst,
                                 &on_device, err)))
      return rc;
  }
  int64_t *done = NULL, ndone = 0; /* a loop continued after its session was re-homed */
  if ((rc = mbd_wckpt_resume_tokens(msg, q->max_tokens, st->models[s->model].vocab, &done, &ndone,
                                    err)))
    return rc;
  rc = mbd_wsched_generate_resume(st, s, tag, q, done, ndone, err);
  free(done);
  return rc;
}

static int h_export(mbd_wstate *st, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  mbd_wsession *s;
  mbd_wsess_data *ws;
  int rc = get_session(st, q, &s, &ws, err);
  if (rc) return rc;
  if ((rc = mbd_wsched_check_no_step(st, s, err))) return rc;
  mbd_wmodel *m = &st->models[s->model];
  void *blob = NULL;
  size_t size = 0;
  if ((rc = mbd_wckpt_blob(st, s, &blob, &size, err))) return rc;
  mbd_tensor_ref r;
  memset(&r, 0, sizeof r);
  snprintf(r.name, sizeof r.name, "state");
  int64_t sh[1] = {(int64_t)(size / 8)};
  mbd_tensor_desc_make(&r.desc, MBD_DTYPE_I64, 1, sh, NULL);
  r.kind = MBD_TREF_INLINE;
  if (q->noutputs) { /* into the client's shm or device buffer; the reply names it */
    mbd_shm_cache_watch(st->shm);
    rc = mbd_wreq_output_put(st->be, st->shm, &q->outputs[0], 0, blob, size, err);
    free(blob);
    blob = NULL;
    if (rc) return rc;
    mbd_tensor_desc d = r.desc;
    r = q->outputs[0];
    r.desc = d;
    r.size = size;
  }
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  mbd_wreply_head(st, &pk, 3);
  mbd_pack_kv_str(&pk, "model", m->name);
  mbd_pack_kv_str(&pk, "model_digest", m->digest);
  mbd_pack_str(&pk, "tensors");
  msgpack_pack_array(&pk, 1);
  mbd_pack_tensor_ref(&pk, &r);
  mbd_wreply_body(st, MBD_CMD_FINAL, tag, &sb, blob, blob ? size : 0);
  return MBD_OK;
}

static int h_import(mbd_wstate *st, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                    mbd_error *err) {
  const void *blob = NULL;
  void *own = NULL;
  size_t n;
  mbd_wsession *s = NULL;
  int rc = get_input(st, msg, &q->tensors[0], false, &blob, &n, &own, err);
  if (rc) return rc;
  mbd_state_blob_info info;
  if ((rc = mbd_state_blob_parse(blob, n, &info, err))) goto fail;
  if (q->model[0] && strcmp(q->model, info.model)) {
    rc = mbd_error_set(err, MBD_E_INVALID, "import names model '%s' but the state is of '%s'",
                       q->model, info.model);
    goto fail;
  }
  int mi = mbd_wmodels_find(st, info.model, err);
  if (mi < 0) {
    rc = mi;
    goto fail;
  }
  mbd_wmodel *m = &st->models[mi];
  if (strcmp(info.model_digest, m->digest)) {
    rc = mbd_error_set(err, MBD_E_STATE,
                       "state of model '%s' was exported from weights %.16s… but this worker "
                       "loaded %.16s…: import it on a worker serving the same checkpoint",
                       info.model, info.model_digest, m->digest);
    goto fail;
  }
  if (strcmp(info.route_id, st->route_id)) {
    rc = mbd_error_set(err, MBD_E_STATE,
                       "state was exported on route %.16s… but this worker is route %.16s…: "
                       "bit-exact continuation needs the same route (send IMPORT with "
                       "route.route_id=%s)",
                       info.route_id, st->route_id, info.route_id);
    goto fail;
  }
  if (info.vocab != (uint64_t)m->vocab) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "state blob vocab %llu != model vocab %lld",
                       (unsigned long long)info.vocab, (long long)m->vocab);
    goto fail;
  }
  if ((rc = mbd_wsession_admit(st->sessions, q->caller.id, st->o.client_sessions, err)) ||
      (rc = mbd_wstate_session_new(st, mi, &s, err)))
    goto fail;
  mbd_wsession_own(s, q->caller.id);
  /* The state image may sit at any offset in the frame: the backend's import
   * reads it with memcpy-safe code, and logits are copied bytewise. */
  if ((rc = st->be->ops->state_load((mbd_bstate *)s->state, info.state, info.state_bytes, err)))
    goto fail;
  mbd_wsess_data *ws = s->user;
  ws->has_logits = info.has_logits;
  if (info.has_logits) memcpy(ws->logits, info.logits, (size_t)m->vocab * sizeof(float));
  if ((rc = mbd_wckpt_replay(st, msg, s, err))) goto fail; /* a re-homed session's tokens since */
  MBD_LOGD(LOGC, "imported session %s (%s)", s->id, m->name);
  mbd_wreply_fields_str(st, tag, "session", s->id);
  mbd_wckpt_emit(st, s);
  s = NULL;
fail:
  if (s) mbd_wsession_close(st->sessions, s);
  free(own);
  return rc;
}

static int h_close(mbd_wstate *st, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  mbd_wsession *s;
  mbd_wsess_data *ws;
  int rc = get_session(st, q, &s, &ws, err);
  if (rc) return rc;
  if ((rc = mbd_wsched_check_no_step(st, s, err))) return rc;
  mbd_wsession_close(st->sessions, s);
  mbd_wreply_fields_str(st, tag, NULL, NULL);
  return MBD_OK;
}

/* Checks the request's route constraint against this worker (the broker
 * already matched it; this catches misrouting). */
static int check_route(mbd_wstate *st, const msgpack_object *root, mbd_error *err) {
  if (!mbd_obj_get(root, "route")) return MBD_OK;
  mbd_route_want want;
  int rc = mbd_obj_route_want(root, "route", &want, err);
  if (rc) return rc;
  if (!mbd_route_matches(&want, &st->route, st->route_id)) {
    char d[256];
    mbd_route_want_format(&want, d, sizeof d);
    return mbd_error_set(err, MBD_E_NO_ROUTE, "worker %s (route %.16s…) does not match %s",
                         st->o.name, st->route_id, d);
  }
  return MBD_OK;
}

void mbd_whandle_request(mbd_wstate *st, mbd_msg *msg) {
  uint8_t cmd = mbd_msg_cmd(msg);
  uint64_t tag = mbd_msg_tag(msg);
  mbd_error err = {0};
  mbd_body *body = NULL;
  size_t blen = 0;
  const void *b = mbd_msg_body(msg, &blen);
  int rc = mbd_body_parse(b, blen, &body, &err);
  mbd_wreq *q = NULL;
  mbd_shm_cache_watch(st->shm); /* a shrunk shm object fails this request's reply */
  if (rc) goto done;
  const msgpack_object *root = mbd_body_root(body);
  char rid[40] = "-"; /* the client's request_id, for the log */
  mbd_obj_str(root, "request_id", false, rid, sizeof rid, NULL);
  MBD_LOGD(LOGC, "request %s: %s as ticket %" PRIu64, rid, mbd_cmd_name(cmd), tag);
  if ((rc = check_route(st, root, &err))) goto done;
  if (!(q = malloc(sizeof *q))) {
    rc = mbd_error_set(&err, MBD_E_NOMEM, "out of memory decoding a request");
    goto done;
  }
  if ((rc = mbd_wreq_decode(cmd, root, q, &err))) goto done;
  if (st->draining && (cmd == MBD_CMD_GENERATE || cmd == MBD_CMD_OPEN || cmd == MBD_CMD_IMPORT)) {
    /* Bounded work that was on its way is still served while draining;
     * loops of unknown length and new sessions are not. */
    rc = mbd_error_set(&err, MBD_E_BUSY, "worker %s is shutting down: resend the %s", st->o.name,
                       mbd_cmd_name(cmd));
    goto done;
  }
  switch (cmd) {
  case MBD_CMD_GEMM: rc = h_gemm(st, msg, q, tag, &err); break;
  case MBD_CMD_FORWARD: rc = h_forward(st, msg, q, tag, &err); break;
  case MBD_CMD_OPEN: rc = h_open(st, q, tag, &err); break;
  case MBD_CMD_PREFILL: rc = h_prefill(st, msg, q, tag, &err); break;
  case MBD_CMD_STEP: rc = h_step(st, q, tag, &err); break;
  case MBD_CMD_GENERATE: rc = h_generate(st, msg, q, tag, &err); break;
  case MBD_CMD_EXPORT: rc = h_export(st, q, tag, &err); break;
  case MBD_CMD_IMPORT: rc = h_import(st, msg, q, tag, &err); break;
  case MBD_CMD_CLOSE: rc = h_close(st, q, tag, &err); break;
  default:
    rc = mbd_error_set(&err, MBD_E_UNSUPPORTED, "command %s is not served by workers",
                       mbd_cmd_name(cmd));
  }
done:
  if (rc) {
    if (!err.code) err.code = rc;
    mbd_wreply_err(st, tag, &err);
  }
  mbd_shm_cache_watch(st->shm);
  st->served++;
  free(q);
  mbd_body_destroy(&body);
}
