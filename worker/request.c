/* Request decoding and tensor-ref resolution for the worker. */
#include "worker/request.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

static int decode_tensors(const msgpack_object *root, const char *key, bool required,
                          mbd_tensor_ref *out, size_t *n, mbd_error *err) {
  *n = 0;
  return mbd_obj_tensor_refs(root, key, required, out, MBD_WREQ_MAX_TENSORS, n, err);
}

static int decode_generate(const msgpack_object *root, mbd_wreq *r, mbd_error *err) {
  int rc = mbd_obj_i64(root, "max_tokens", true, &r->max_tokens, err);
  if (rc) return rc;
  if (r->max_tokens < 1 || r->max_tokens > MBD_WREQ_MAX_TOKENS_CAP)
    return mbd_error_set(err, MBD_E_INVALID, "max_tokens must be in 1..%d (got %lld)",
                         MBD_WREQ_MAX_TOKENS_CAP, (long long)r->max_tokens);
  if ((rc = mbd_obj_i64_array(root, "stop", false, r->stop, MBD_WREQ_MAX_STOP, &r->nstop, err)))
    return rc;
  if ((rc = mbd_obj_f64(root, "temperature", false, &r->temperature, err))) return rc;
  if (!isfinite(r->temperature) || r->temperature < 0)
    return mbd_error_set(err, MBD_E_INVALID,
                         "temperature must be a finite number >= 0 (0 = greedy)");
  if ((rc = mbd_obj_i64(root, "top_k", false, &r->top_k, err))) return rc;
  if (r->top_k < 0) return mbd_error_set(err, MBD_E_INVALID, "top_k must be >= 0 (0 = off)");
  if ((rc = mbd_obj_f64(root, "top_p", false, &r->top_p, err))) return rc;
  if (!(r->top_p > 0 && r->top_p <= 1))
    return mbd_error_set(err, MBD_E_INVALID, "top_p must be in (0, 1] (1 = off)");
  if ((rc = mbd_obj_u64(root, "seed", false, &r->seed, err))) return rc;
  if ((rc = mbd_obj_i64(root, "partial_every", false, &r->partial_every, err))) return rc;
  if (r->partial_every < 1)
    return mbd_error_set(err, MBD_E_INVALID, "partial_every must be >= 1 (tokens per PARTIAL)");
  bool rl = false;
  if ((rc = mbd_obj_bool(root, "return_logits", false, &rl, err))) return rc;
  if (rl)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "generate with return_logits is not supported: use STEP to get logits");
  return MBD_OK;
}

/* `caller` as the broker stamped it; absent = anonymous. */
static int decode_caller(const msgpack_object *root, mbd_wcaller *c, mbd_error *err) {
  const msgpack_object *m = mbd_obj_get(root, "caller");
  if (!m) return MBD_OK;
  if (m->type != MSGPACK_OBJECT_MAP)
    return mbd_error_set(err, MBD_E_INVALID, "caller must be a map (the broker sets it)");
  int rc = mbd_obj_str(m, "id", false, c->id, sizeof c->id, err);
  if (rc) return rc;
  if (!mbd_obj_get(m, "uid")) return MBD_OK;
  uint64_t uid = 0, gid = 0;
  if ((rc = mbd_obj_u64(m, "uid", true, &uid, err)) || (rc = mbd_obj_u64(m, "gid", false, &gid, err)) ||
      (rc = mbd_obj_i64(m, "pid", false, &c->pid, err)))
    return rc;
  if (uid > UINT32_MAX || gid > UINT32_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "caller uid/gid out of range");
  c->has_uid = true;
  c->uid = (uint32_t)uid;
  c->gid = (uint32_t)gid;
  return MBD_OK;
}

static int decode_one(uint8_t cmd, const msgpack_object *root, mbd_wreq *r, mbd_error *err);

/* GENERATE and EXPORT outputs: at most one, I64 [n] with n == `len` (or any
 * n when len is 0: an EXPORT's size shows only when the state is written). */
static int check_blob_output(const mbd_wreq *r, const char *cmd, const char *want, int64_t len,
                             mbd_error *err) {
  if (r->noutputs == 0) return MBD_OK;
  const mbd_tensor_desc *d = &r->outputs[0].desc;
  if (r->noutputs > 1 || d->dtype != MBD_DTYPE_I64 || d->ndim != 1 ||
      (len > 0 && d->shape[0] != len)) {
    char f[96];
    mbd_tensor_desc_format(d, f, sizeof f);
    return mbd_error_set(err, MBD_E_SHAPE, "%s takes one output, %s (got %zu, the first %s)", cmd,
                         want, r->noutputs, f);
  }
  return MBD_OK;
}

/* Stamps the caller's uid into every ref and applies the CUDA IPC rule. */
static int bind_refs(mbd_wreq *r, mbd_error *err) {
  mbd_tensor_ref *all[2] = {r->tensors, r->outputs};
  size_t n[2] = {r->ntensors, r->noutputs};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < n[k]; i++) {
      mbd_tensor_ref *t = &all[k][i];
      t->caller_known = r->caller.has_uid;
      t->caller_uid = r->caller.uid;
      if (t->kind != MBD_TREF_CUDA_IPC) continue;
      uid_t self = geteuid();
      if (!r->caller.has_uid || (r->caller.uid != (uint32_t)self && r->caller.uid != 0))
        return mbd_error_set(err, MBD_E_INVALID,
                             "tensor '%s': CUDA IPC refs are accepted only from clients on this "
                             "host running as the worker's uid (%u) or root; send the bytes "
                             "inline or in shm",
                             t->name, (unsigned)self);
    }
  return MBD_OK;
}

int mbd_wreq_decode(uint8_t cmd, const msgpack_object *root, mbd_wreq *r, mbd_error *err) {
  int rc = decode_one(cmd, root, r, err);
  if (rc) return rc;
  return bind_refs(r, err);
}

static int decode_one(uint8_t cmd, const msgpack_object *root, mbd_wreq *r, mbd_error *err) {
  memset(r, 0, sizeof *r);
  r->cmd = cmd;
  r->dtype = MBD_DTYPE_F32;
  r->top_p = 1.0;
  r->partial_every = 1;
  if (!root || root->type != MSGPACK_OBJECT_MAP)
    return mbd_error_set(err, MBD_E_FORMAT, "request body must be a msgpack map");
  int rc = mbd_obj_i64(root, "deadline_ms", false, &r->deadline_ms, err);
  if (rc) return rc;
  if ((rc = decode_caller(root, &r->caller, err))) return rc;
  if (r->deadline_ms < 0) return mbd_error_set(err, MBD_E_INVALID, "deadline_ms must be >= 0");
  switch (cmd) {
  case MBD_CMD_GEMM: {
    char dt[16] = "f32";
    if ((rc = mbd_obj_str(root, "dtype", false, dt, sizeof dt, err))) return rc;
    if ((rc = mbd_dtype_parse(dt, &r->dtype, err))) return rc;
    if (r->dtype == MBD_DTYPE_I64)
      return mbd_error_set(err, MBD_E_INVALID, "gemm dtype must be f32, bf16 or f16");
    if ((rc = decode_tensors(root, "tensors", true, r->tensors, &r->ntensors, err))) return rc;
    if (r->ntensors < 2 || r->ntensors > 3)
      return mbd_error_set(err, MBD_E_INVALID,
                           "gemm takes tensors [a [M,K], b [N,K], bias [N]?] (got %zu)",
                           r->ntensors);
    return decode_tensors(root, "outputs", false, r->outputs, &r->noutputs, err);
  }
  case MBD_CMD_FORWARD:
    if ((rc = mbd_obj_str(root, "model", true, r->model, sizeof r->model, err))) return rc;
    if ((rc = mbd_obj_bool(root, "last_only", false, &r->last_only, err))) return rc;
    if ((rc = decode_tensors(root, "tensors", true, r->tensors, &r->ntensors, err))) return rc;
    if (r->ntensors != 1)
      return mbd_error_set(err, MBD_E_INVALID, "forward takes tensors [input_ids I64 [B,T]]");
    return decode_tensors(root, "outputs", false, r->outputs, &r->noutputs, err);
  case MBD_CMD_OPEN:
    return mbd_obj_str(root, "model", true, r->model, sizeof r->model, err);
  case MBD_CMD_IMPORT:
    if ((rc = mbd_obj_str(root, "model", false, r->model, sizeof r->model, err))) return rc;
    if ((rc = decode_tensors(root, "tensors", true, r->tensors, &r->ntensors, err))) return rc;
    if (r->ntensors != 1)
      return mbd_error_set(err, MBD_E_INVALID, "import takes tensors [state] (an EXPORT blob)");
    return MBD_OK;
  case MBD_CMD_PREFILL:
  case MBD_CMD_STEP:
  case MBD_CMD_GENERATE:
  case MBD_CMD_EXPORT:
  case MBD_CMD_CLOSE:
    if ((rc = mbd_obj_str(root, "session", true, r->session, sizeof r->session, err))) return rc;
    if (cmd == MBD_CMD_PREFILL) {
      if ((rc = mbd_obj_bool(root, "last_only", false, &r->last_only, err))) return rc;
      if ((rc = mbd_obj_i64_array(root, "cache_points", false, r->cache_points,
                                  MBD_PREFIX_POINTS_MAX, &r->ncache_points, err)))
        return rc;
      if ((rc = decode_tensors(root, "tensors", true, r->tensors, &r->ntensors, err))) return rc;
      if (r->ntensors != 1)
        return mbd_error_set(err, MBD_E_INVALID, "prefill takes tensors [input_ids I64 [T]]");
      return decode_tensors(root, "outputs", false, r->outputs, &r->noutputs, err);
    }
    if (cmd == MBD_CMD_STEP) {
      if ((rc = mbd_obj_i64(root, "token", true, &r->token, err))) return rc;
      return decode_tensors(root, "outputs", false, r->outputs, &r->noutputs, err);
    }
    if (cmd == MBD_CMD_GENERATE) {
      if ((rc = decode_generate(root, r, err))) return rc;
      if ((rc = decode_tensors(root, "outputs", false, r->outputs, &r->noutputs, err))) return rc;
      return check_blob_output(r, "generate", "I64 [max_tokens]", r->max_tokens, err);
    }
    if (cmd == MBD_CMD_EXPORT) {
      if ((rc = decode_tensors(root, "outputs", false, r->outputs, &r->noutputs, err))) return rc;
      return check_blob_output(r, "export", "I64 [n] holding the state (n * 8 bytes or more)", 0,
                               err);
    }
    return MBD_OK;
  default:
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "command %s (0x%02x) is not served by workers",
                         mbd_cmd_name(cmd), cmd);
  }
}

/* Element alignment for shm ranges: misaligned f32/i64 loads are undefined. */
static int check_align(const mbd_tensor_ref *r, mbd_error *err) {
  size_t es = mbd_dtype_size(r->desc.dtype);
  if (es && r->offset % es)
    return mbd_error_set(err, MBD_E_INVALID,
                         "tensor '%s': shm offset %llu is not a multiple of its element size %zu",
                         r->name, (unsigned long long)r->offset, es);
  return MBD_OK;
}

static int no_device(const mbd_tensor_ref *r, mbd_error *err);

static int64_t caller_uid(const mbd_tensor_ref *r) {
  return r->caller_known ? (int64_t)r->caller_uid : -1;
}

int mbd_wreq_input(const mbd_tensor_ref *r, const mbd_msg *msg, mbd_shm_cache *shm,
                   const void **data, size_t *nbytes, mbd_error *err) {
  *data = NULL;
  int rc = mbd_tensor_desc_nbytes(&r->desc, nbytes, err);
  if (rc) return mbd_error_prefix(err, "tensor '%s'", r->name);
  switch (r->kind) {
  case MBD_TREF_INLINE: {
    size_t npayloads = msg ? mbd_msg_npayloads(msg) : 0, len = 0;
    if (r->frame >= npayloads)
      return mbd_error_set(err, MBD_E_INVALID,
                           "tensor '%s' names payload frame %u but the request has %zu", r->name,
                           r->frame, npayloads);
    const void *p = mbd_msg_payload(msg, r->frame, &len);
    if (len != *nbytes) {
      char d[96];
      mbd_tensor_desc_format(&r->desc, d, sizeof d);
      return mbd_error_set(err, MBD_E_SHAPE,
                           "tensor '%s' is %s = %zu bytes but payload frame %u has %zu", r->name,
                           d, *nbytes, r->frame, len);
    }
    *data = p;
    return MBD_OK;
  }
  case MBD_TREF_SHM: {
    void *p = NULL;
    if ((rc = check_align(r, err))) return rc;
    rc = mbd_shm_cache_map(shm, r->shm_name, r->offset, r->size, *nbytes, false, caller_uid(r), &p,
                           err);
    if (rc) return mbd_error_prefix(err, "tensor '%s'", r->name);
    *data = p;
    return MBD_OK;
  }
  default:
    return no_device(r, err);
  }
}

static int same_desc(const mbd_tensor_ref *r, const mbd_tensor_desc *want, mbd_error *err);

int mbd_wreq_output(const mbd_tensor_ref *r, const mbd_tensor_desc *want, mbd_shm_cache *shm,
                    void **data, mbd_error *err) {
  *data = NULL;
  if (r->kind != MBD_TREF_SHM)
    return mbd_error_set(err, MBD_E_INVALID,
                         "output '%s' must be a shm or CUDA IPC ref (inline outputs come back as "
                         "frames without being asked)",
                         r->name);
  int rc = same_desc(r, want, err);
  if (rc) return rc;
  size_t nbytes;
  if ((rc = mbd_tensor_desc_nbytes(want, &nbytes, err))) return rc;
  if ((rc = check_align(r, err))) return rc;
  rc = mbd_shm_cache_map(shm, r->shm_name, r->offset, r->size, nbytes, true, caller_uid(r), data,
                         err);
  if (rc) return mbd_error_prefix(err, "output '%s'", r->name);
  return MBD_OK;
}

static int no_device(const mbd_tensor_ref *r, mbd_error *err) {
  return mbd_error_set(err, MBD_E_UNSUPPORTED,
                       "tensor '%s': CUDA IPC refs need a GPU worker; this worker is CPU (send "
                       "the bytes inline or in shm)",
                       r->name);
}

int mbd_wreq_input_dev(mbd_backend *be, const mbd_tensor_ref *r, const void **dev, size_t *nbytes,
                       mbd_error *err) {
  *dev = NULL;
  int rc = mbd_tensor_desc_nbytes(&r->desc, nbytes, err);
  if (rc) return mbd_error_prefix(err, "tensor '%s'", r->name);
  if (r->kind != MBD_TREF_CUDA_IPC)
    return mbd_error_set(err, MBD_E_INTERNAL, "tensor '%s' is not a CUDA IPC ref", r->name);
  if (!be->ops->ipc_map) return no_device(r, err);
  void *p = NULL;
  rc = be->ops->ipc_map(be, r, *nbytes, &p, err);
  *dev = p;
  return rc;
}

/* MBD_E_SHAPE unless r's dtype and shape are want's. */
static int same_desc(const mbd_tensor_ref *r, const mbd_tensor_desc *want, mbd_error *err) {
  bool same = r->desc.dtype == want->dtype && r->desc.ndim == want->ndim;
  for (int i = 0; same && i < want->ndim; i++) same = r->desc.shape[i] == want->shape[i];
  if (same) return MBD_OK;
  char a[96], b[96];
  mbd_tensor_desc_format(&r->desc, a, sizeof a);
  mbd_tensor_desc_format(want, b, sizeof b);
  return mbd_error_set(err, MBD_E_SHAPE, "output '%s' is %s but the result is %s", r->name, a, b);
}

int mbd_wreq_output_at(mbd_backend *be, mbd_shm_cache *shm, const mbd_tensor_ref *r,
                       const mbd_tensor_desc *want, void **data, bool *on_device, mbd_error *err) {
  *data = NULL;
  *on_device = false;
  if (r->kind != MBD_TREF_CUDA_IPC) return mbd_wreq_output(r, want, shm, data, err);
  int rc = same_desc(r, want, err);
  if (rc) return rc;
  size_t nbytes = 0;
  if ((rc = mbd_tensor_desc_nbytes(want, &nbytes, err))) return rc;
  if (!be->ops->ipc_map) return no_device(r, err);
  if ((rc = be->ops->ipc_map(be, r, nbytes, data, err))) return mbd_error_prefix(err, "output '%s'", r->name);
  *on_device = true;
  return MBD_OK;
}

/* r narrowed to [at, at + nbytes) of its range (the event is not waited on
 * again: the request's first use did). */
static int sub_ref(const mbd_tensor_ref *r, uint64_t at, size_t nbytes, mbd_tensor_ref *out,
                   mbd_error *err) {
  if (at > r->size || nbytes > r->size - at)
    return mbd_error_set(err, MBD_E_INVALID,
                         "output '%s' holds %llu bytes, the result needs %zu at byte %llu", r->name,
                         (unsigned long long)r->size, nbytes, (unsigned long long)at);
  *out = *r;
  out->offset = r->offset + at;
  out->size = nbytes;
  out->has_event = false;
  return MBD_OK;
}

int mbd_wreq_output_put(mbd_backend *be, mbd_shm_cache *shm, const mbd_tensor_ref *r, uint64_t at,
                        const void *src, size_t nbytes, mbd_error *err) {
  mbd_tensor_ref s;
  int rc = sub_ref(r, at, nbytes, &s, err);
  if (rc) return rc;
  if (r->kind == MBD_TREF_CUDA_IPC) {
    if (!be->ops->ipc_write) return no_device(r, err);
    rc = be->ops->ipc_write(be, &s, src, nbytes, err);
    return rc ? mbd_error_prefix(err, "output '%s'", r->name) : MBD_OK;
  }
  if (r->kind != MBD_TREF_SHM)
    return mbd_error_set(err, MBD_E_INVALID,
                         "output '%s' must be a shm or CUDA IPC ref (inline outputs come back as "
                         "frames without being asked)",
                         r->name);
  if ((rc = check_align(r, err))) return rc;
  void *p = NULL;
  rc = mbd_shm_cache_map(shm, r->shm_name, r->offset, r->size, (size_t)(at + nbytes), true,
                         caller_uid(r), &p, err);
  if (rc) return mbd_error_prefix(err, "output '%s'", r->name);
  memcpy((char *)p + at, src, nbytes);
  return MBD_OK;
}

int mbd_wreq_output_get(mbd_backend *be, const mbd_tensor_ref *r, uint64_t at, void *dst,
                        size_t nbytes, mbd_error *err) {
  mbd_tensor_ref s;
  int rc = sub_ref(r, at, nbytes, &s, err);
  if (rc) return rc;
  if (r->kind != MBD_TREF_CUDA_IPC || !be->ops->ipc_read) return no_device(r, err);
  return be->ops->ipc_read(be, &s, dst, nbytes, err);
}
