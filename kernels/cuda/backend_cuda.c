/* CUDA backend: one GPU context (kernels/cuda/gpu_ctx.h) on cuda:N and the
 * model families' GPU implementations (kernels/cuda/gpu_family.h, chosen by
 * each checkpoint's config.json) behind the backend vtable (kernels/backend.h).
 *
 * Sessions: each state is a preallocated device slot of the model (the
 * context's state capacity); a batched step gathers the slots by index and
 * replays the decode graph of the smallest bucket that holds the batch.
 * Stateless FORWARDs run on extra slots above the sessions' ones.
 * Export/import write and read the family's state image (kernels/state_blob.h),
 * the one the family's CPU model writes too, so a blob moves between CPU and
 * GPU workers byte-compatibly; the worker's route check decides whether an
 * import is allowed (same route id = bit-exact continuation).
 *
 * CUDA IPC tensors: a handle is opened once and cached by its bytes; every
 * use checks [offset, offset+size) against the real allocation found with
 * cuMemGetAddressRange (resolved through cudaGetDriverEntryPointByVersion,
 * so the worker does not link libcuda and still starts without a driver),
 * and waits on the client's IPC event when the ref carries one. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/gpu_family.h"
#include "kernels/cuda/state_stash.h"
#include "kernels/model/family.h"
#include "kernels/backend.h"
#include "kernels/state_blob.h"

#define LOGC "cuda-backend"
#define STATE_HEADER MBD_STATE_IMAGE_HEADER
#define IPC_CACHE_MAX 256 /* open handles kept; the oldest is closed beyond */

typedef CUresult (*addr_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);

/* One opened IPC memory handle or event. */
typedef struct ipc_entry {
  uint8_t key[MBD_IPC_HANDLE_BYTES]; /* handle bytes */
  bool is_event;
  void *base;                        /* opened mapping (memory) */
  size_t size;                       /* allocation size (cuMemGetAddressRange) */
  cudaEvent_t event;                 /* opened event */
  uint64_t used;                     /* LRU clock */
} ipc_entry;

typedef struct cuda_backend cuda_backend;

typedef struct cuda_model {
  cuda_backend *c;            /* the backend that loaded it */
  const mbd_gpu_model_ops *f; /* the family's GPU implementation */
  void *m;                    /* its model */
  int64_t vocab;
  int64_t *free_slots; /* stack of free session slots */
  int64_t nfree;
  int64_t fwd_base;    /* first forward slot */
  int64_t fwd_slots;   /* forward slots (= max batch) */
  int32_t *tok, *slots, *next; /* [max_batch] scratch for steps */
} cuda_model;

/* Session state: a slot of its model and the tokens it consumed. */
typedef struct cuda_state {
  cuda_model *cm;
  int64_t slot;
  int64_t pos;
} cuda_state;

/* A step launched by step_launch that step_wait has not collected yet. */
typedef struct pending_step {
  cuda_model *cm; /* its model; NULL: none */
  int64_t *next;  /* the caller's next[n], or NULL */
  int64_t n;
  bool done;      /* already waited for (another call needed the device): status below */
  int rc;
  mbd_error err;
} pending_step;

struct cuda_backend {
  mbd_backend base;
  mbd_backend_opts opts;
  mbd_gpu_ctx *ctx;
  int64_t sessions;     /* session slots per model (--sessions) */
  ipc_entry ipc[IPC_CACHE_MAX];
  int nipc;
  uint64_t clock;
  addr_range_fn addr_range; /* cuMemGetAddressRange, or NULL (IPC refused) */
  uint64_t ipc_hits;        /* cached handle lookups, and their summed time */
  double ipc_hit_us;
  pending_step pend;        /* the launched step, if any */
};

static cuda_backend *impl(mbd_backend *b) { return (cuda_backend *)b->impl; }

static int cu_err(mbd_error *err, cudaError_t e, const char *what) {
  return mbd_error_set(err, MBD_E_DEVICE, "%s failed: %s (%s)", what, cudaGetErrorName(e),
                       cudaGetErrorString(e));
}

/* Waits for the launched step (if any) and keeps its status for step_wait:
 * every other call starts here, so it runs after that step and never
 * touches the family's staging while the step still reads it. */
static void settle(cuda_backend *c) {
  pending_step *p = &c->pend;
  if (!p->cm || p->done) return;
  cuda_model *cm = p->cm;
  memset(&p->err, 0, sizeof p->err);
  p->rc = cm->f->step_wait(cm->m, p->next ? cm->next : NULL, &p->err);
  for (int64_t i = 0; i < p->n && !p->rc && p->next; i++) p->next[i] = cm->next[i];
  p->done = true;
}

static void cuda_destroy(mbd_backend *b) {
  cuda_backend *c = impl(b);
  settle(c);
  for (int i = 0; i < c->nipc; i++) {
    if (c->ipc[i].is_event) cudaEventDestroy(c->ipc[i].event);
    else cudaIpcCloseMemHandle(c->ipc[i].base);
  }
  mbd_gpu_ctx_destroy(&c->ctx);
  free(c);
}

static void cuda_route(mbd_backend *b, mbd_route_identity *r) {
  cuda_backend *c = impl(b);
  mbd_error e = {0};
  memset(r, 0, sizeof *r);
  if (mbd_gpu_ctx_route(c->ctx, r, &e)) MBD_LOGE(LOGC, "route: %s", e.msg);
}

static mbd_dtype policy_dtype(mbd_dtype_policy p) {
  return p == MBD_POLICY_BF16 ? MBD_DTYPE_BF16 : p == MBD_POLICY_F16 ? MBD_DTYPE_F16 : MBD_DTYPE_F32;
}

/* Whether [p, p + n) lies inside a CUDA IPC mapping this backend opened
 * (an ipc_map result): such operands are used in place. */
static bool ipc_owned(const cuda_backend *c, const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; p && i < c->nipc; i++) {
    const ipc_entry *e = &c->ipc[i];
    uintptr_t b = (uintptr_t)e->base;
    if (!e->is_event && a >= b && a - b <= e->size && n <= e->size - (a - b)) return true;
  }
  return false;
}

static bool overlap(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return p && q && n && m && (a < b ? b - a < n : a - b < m);
}

/* A device copy of host operand `src` (n bytes) in *own, or src itself when
 * it already is IPC memory on the device. */
static int operand(cuda_backend *c, const void *src, size_t n, const void **dev, void **own,
                   mbd_error *err) {
  *own = NULL;
  if (ipc_owned(c, src, n)) {
    *dev = src;
    return MBD_OK;
  }
  int rc = mbd_gpu_alloc(c->ctx, n, own, err);
  if (!rc) rc = mbd_gpu_upload(c->ctx, *own, src, n, err);
  *dev = *own;
  return rc;
}

/* GEMM request: one mbd_gpu_gemm under the context's mode. Operands that are
 * IPC memory (ipc_map) are read and written in place; host ones go through
 * per-request device buffers (GEMM requests are not on the token path). */
static int cuda_gemm(mbd_backend *b, int64_t M, int64_t N, int64_t K, mbd_dtype a_dtype,
                     const void *A, mbd_dtype b_dtype, const void *B, const float *bias, float *C,
                     mbd_error *err) {
  cuda_backend *c = impl(b);
  settle(c);
  mbd_dtype dt = policy_dtype(c->opts.policy);
  if (a_dtype != dt || b_dtype != dt)
    return mbd_error_set(err, MBD_E_INVALID,
                         "this GPU worker's route stores %s: send gemm a and b as %s (got %s, %s)",
                         mbd_dtype_name(dt), mbd_dtype_name(dt), mbd_dtype_name(a_dtype),
                         mbd_dtype_name(b_dtype));
  if (bias && dt != MBD_DTYPE_F32)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "a gemm bias needs the f32 route on GPU workers (the device GEMM takes "
                         "the bias in the input dtype): add it on the client");
  if (M < 1 || N < 1 || K < 1 || M >= INT32_MAX || N >= INT32_MAX || K >= INT32_MAX)
    return mbd_error_set(err, MBD_E_SHAPE, "gemm dims must be in 1..2^31-1");
  size_t es = mbd_dtype_size(dt), na = (size_t)M * (size_t)K * es, nb = (size_t)N * (size_t)K * es,
         nc = (size_t)M * (size_t)N * sizeof(float), nbias = (size_t)N * sizeof(float);
  const void *dA = NULL, *dB = NULL, *dbias = NULL;
  void *oA = NULL, *oB = NULL, *obias = NULL, *dC = NULL, *oC = NULL;
  bool c_dev = ipc_owned(c, C, nc);
  if (c_dev && (overlap(C, nc, A, na) || overlap(C, nc, B, nb) || overlap(C, nc, bias, nbias)))
    return mbd_error_set(err, MBD_E_INVALID,
                         "gemm output c overlaps an input in the same device allocation: give "
                         "it a range of its own");
  int rc;
  if ((rc = operand(c, A, na, &dA, &oA, err)) || (rc = operand(c, B, nb, &dB, &oB, err)) ||
      (bias && (rc = operand(c, bias, nbias, &dbias, &obias, err))))
    goto fail;
  if (c_dev) dC = C;
  else if ((rc = mbd_gpu_alloc(c->ctx, nc, &oC, err))) goto fail;
  else dC = oC;
  mbd_gpu_gemm_args g = {.dtype = dt, .out_dtype = MBD_DTYPE_F32, .m = M, .n = N, .k = K,
                         .x = dA, .w = dB, .bias = dbias, .y = dC};
  if ((rc = mbd_gpu_gemm(c->ctx, &g, err))) goto fail;
  rc = c_dev ? mbd_gpu_ctx_sync(c->ctx, err) : mbd_gpu_download(c->ctx, C, dC, nc, err);
fail:
  mbd_gpu_free(c->ctx, oA);
  mbd_gpu_free(c->ctx, oB);
  mbd_gpu_free(c->ctx, obias);
  mbd_gpu_free(c->ctx, oC);
  return rc;
}

static void cuda_model_destroy(mbd_backend *b, mbd_bmodel *bm) {
  cuda_model *cm = (cuda_model *)bm;
  if (!cm) return;
  settle(impl(b));
  if (impl(b)->pend.cm == cm) impl(b)->pend.cm = NULL; /* its status dies with it */
  if (cm->f) cm->f->destroy(cm->m);
  free(cm->free_slots);
  free(cm->tok);
  free(cm->slots);
  free(cm->next);
  free(cm);
}

static int cuda_model_load(mbd_backend *b, const char *dir, mbd_bmodel **out, mbd_error *err) {
  cuda_backend *c = impl(b);
  int rc;
  const mbd_model_family *fam = NULL;
  *out = NULL;
  settle(c);
  if ((rc = mbd_model_family_detect(dir, &fam, err))) return rc;
  const mbd_gpu_model_ops *f = mbd_gpu_model_ops_find(fam->name);
  if (!f)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "model %s: the %s family has no CUDA implementation in this build", dir,
                         fam->name);
  if (!(f->state_dtypes & (1u << c->opts.state)))
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "model %s: state dtype %s is supported for %s; the %s family keeps an "
                         "f32 state (--state-dtype f32)",
                         dir, mbd_state_dtype_name(c->opts.state),
                         mbd_state_dtype_where(c->opts.state), fam->name);
  cuda_model *cm = calloc(1, sizeof *cm);
  if (!cm) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a model");
  mbd_gpu_model_opts o = {.dtype = policy_dtype(c->opts.policy), .max_batch = c->opts.max_batch,
                          .use_graphs = 1, .progress = c->opts.progress};
  if ((rc = f->load(c->ctx, dir, &o, &cm->m, err))) goto fail;
  cm->f = f;
  cm->c = c;
  cm->vocab = f->vocab(cm->m);
  cm->fwd_slots = c->opts.max_batch;
  cm->fwd_base = c->sessions;
  if (f->slots(cm->m) < cm->fwd_base + cm->fwd_slots) {
    rc = mbd_error_set(err, MBD_E_INTERNAL, "model has %lld slots, need %lld",
                       (long long)f->slots(cm->m),
                       (long long)(cm->fwd_base + cm->fwd_slots));
    goto fail;
  }
  cm->free_slots = malloc((size_t)c->sessions * sizeof *cm->free_slots);
  cm->tok = malloc((size_t)c->opts.max_batch * sizeof *cm->tok);
  cm->slots = malloc((size_t)c->opts.max_batch * sizeof *cm->slots);
  cm->next = malloc((size_t)c->opts.max_batch * sizeof *cm->next);
  if (!cm->free_slots || !cm->tok || !cm->slots || !cm->next) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for slot tables");
    goto fail;
  }
  for (int64_t i = 0; i < c->sessions; i++) cm->free_slots[i] = c->sessions - 1 - i;
  cm->nfree = c->sessions;
  *out = (mbd_bmodel *)cm;
  return MBD_OK;
fail:
  cuda_model_destroy(b, (mbd_bmodel *)cm);
  return rc;
}

static int64_t cuda_model_vocab(const mbd_bmodel *m) { return ((const cuda_model *)m)->vocab; }

/* Stateless forward: rows in chunks of the forward slots, each from a zeroed
 * slot; chunking does not change bits (the family's determinism contract). */
static int cuda_forward(mbd_backend *b, mbd_bmodel *bm, const int64_t *ids, int64_t B, int64_t T,
                        bool last_only, float *logits, mbd_error *err) {
  cuda_model *cm = (cuda_model *)bm;
  settle(impl(b));
  if (B < 1 || T < 1 || T > INT32_MAX || B > INT64_MAX / T)
    return mbd_error_set(err, MBD_E_SHAPE, "forward needs B >= 1 and 1 <= T < 2^31");
  int64_t chunk = cm->fwd_slots;
  int32_t *tok = malloc((size_t)(chunk * T) * sizeof *tok), slots[4096];
  if (!tok) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a forward");
  int rc = MBD_OK;
  size_t per = (size_t)(last_only ? 1 : T) * (size_t)cm->vocab;
  for (int64_t r0 = 0; r0 < B && !rc; r0 += chunk) {
    int64_t n = B - r0 < chunk ? B - r0 : chunk;
    if ((rc = mbd_backend_tokens_i32(ids + r0 * T, n * T, cm->vocab, tok, err))) break;
    for (int64_t i = 0; i < n && !rc; i++) {
      slots[i] = (int32_t)(cm->fwd_base + i);
      rc = cm->f->slot_reset(cm->m, slots[i], err);
    }
    if (!rc)
      rc = cm->f->prefill(cm->m, (int)n, (int)T, tok, slots,
                          last_only ? MBD_LOGITS_LAST : MBD_LOGITS_ALL, logits + (size_t)r0 * per,
                          err);
  }
  free(tok);
  return rc;
}

static int cuda_state_new(mbd_backend *b, mbd_bmodel *bm, mbd_bstate **out, mbd_error *err) {
  cuda_model *cm = (cuda_model *)bm;
  *out = NULL;
  settle(impl(b));
  if (cm->nfree == 0)
    return mbd_error_set(err, MBD_E_BUSY, "all %lld device state slots are in use: close sessions "
                         "or raise --sessions", (long long)impl(b)->sessions);
  cuda_state *s = calloc(1, sizeof *s);
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a session state");
  s->cm = cm;
  s->slot = cm->free_slots[--cm->nfree];
  int rc = cm->f->slot_reset(cm->m, s->slot, err);
  if (rc) {
    cm->free_slots[cm->nfree++] = s->slot;
    free(s);
    return rc;
  }
  *out = (mbd_bstate *)s;
  return MBD_OK;
}

static void cuda_state_free(mbd_backend *b, mbd_bstate *bs) {
  cuda_state *s = (cuda_state *)bs;
  if (!s) return;
  s->cm->free_slots[s->cm->nfree++] = s->slot;
  free(s);
}

static size_t cuda_state_bytes(const mbd_bstate *bs) {
  const cuda_state *s = (const cuda_state *)bs;
  return STATE_HEADER + s->cm->f->state_payload(s->cm->m);
}

static int cuda_state_save(const mbd_bstate *bs, void *dst, size_t cap, mbd_error *err) {
  const cuda_state *s = (const cuda_state *)bs;
  settle(s->cm->c);
  size_t need = cuda_state_bytes(bs);
  if (cap < need)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "state export needs %zu bytes, buffer has %zu", need,
                         cap);
  unsigned char *p = dst;
  mbd_state_shape shape = s->cm->f->state_shape(s->cm->m);
  mbd_state_image_write_header(p, &shape, s->pos);
  return s->cm->f->slot_read(s->cm->m, s->slot, p + STATE_HEADER, need - STATE_HEADER, err);
}

static int cuda_state_load(mbd_bstate *bs, const void *src, size_t len, mbd_error *err) {
  cuda_state *s = (cuda_state *)bs;
  settle(s->cm->c);
  const unsigned char *p = src;
  int64_t pos;
  mbd_state_shape shape = s->cm->f->state_shape(s->cm->m);
  int rc = mbd_state_image_read_header(p, len, &shape, &pos, err);
  if (rc) return rc;
  if (len != cuda_state_bytes(bs))
    return mbd_error_set(err, MBD_E_FORMAT, "state import: %zu bytes, expected %zu", len,
                         cuda_state_bytes(bs));
  /* The payload may be unaligned inside the request frame: slot_write copies bytes. */
  rc = s->cm->f->slot_write(s->cm->m, s->slot, p + STATE_HEADER, len - STATE_HEADER, err);
  if (!rc) s->pos = pos;
  return rc;
}

/* n sessions' prompts of T tokens in one prefill over their slots. */
static int cuda_prefill_batch(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states,
                              int64_t n, const int64_t *ids, int64_t T, bool last_only,
                              float *logits, mbd_error *err) {
  settle(impl(b));
  cuda_model *cm = (cuda_model *)bm;
  if (T < 1 || T > INT32_MAX || n < 1 || n > INT32_MAX || n > INT64_MAX / T)
    return mbd_error_set(err, MBD_E_SHAPE, "prefill needs 1..2^31-1 rows of 1..2^31-1 tokens");
  int32_t *tok = malloc((size_t)(n * T) * sizeof *tok);
  int32_t *slots = malloc((size_t)n * sizeof *slots);
  int rc = !tok || !slots ? mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld x %lld tokens",
                                          (long long)n, (long long)T)
                          : mbd_backend_tokens_i32(ids, n * T, cm->vocab, tok, err);
  for (int64_t i = 0; i < n && !rc; i++) slots[i] = (int32_t)((cuda_state *)states[i])->slot;
  if (!rc)
    rc = cm->f->prefill(cm->m, (int)n, (int)T, tok, slots,
                        last_only ? MBD_LOGITS_LAST : MBD_LOGITS_ALL, logits, err);
  for (int64_t i = 0; i < n && !rc; i++) ((cuda_state *)states[i])->pos += T;
  free(slots);
  free(tok);
  return rc;
}

static int cuda_prefill(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *bs, const int64_t *ids,
                        int64_t T, bool last_only, float *logits, mbd_error *err) {
  return cuda_prefill_batch(b, bm, &bs, 1, ids, T, last_only, logits, err);
}

/* Checks a step batch of n and stages its tokens and slots into cm->tok and
 * cm->slots, the family's step arguments. */
static int step_stage(const cuda_backend *c, cuda_model *cm, mbd_bstate *const *states,
                      const int64_t *tokens, int64_t n, mbd_error *err) {
  if (n < 1 || n > c->opts.max_batch)
    return mbd_error_set(err, MBD_E_INVALID, "step batch of %lld outside 1..%d", (long long)n,
                         c->opts.max_batch);
  int rc = mbd_backend_tokens_i32(tokens, n, cm->vocab, cm->tok, err);
  if (rc) return rc;
  for (int64_t i = 0; i < n; i++) cm->slots[i] = (int32_t)((cuda_state *)states[i])->slot;
  return MBD_OK;
}

/* One graph-replayed decode over the sessions' slots (gathered by index);
 * greedy picks on the device when next is given. */
static int step_impl(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states,
                     const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                     mbd_error *err) {
  cuda_backend *c = impl(b);
  cuda_model *cm = (cuda_model *)bm;
  settle(c);
  int rc = step_stage(c, cm, states, tokens, n, err);
  if (rc) return rc;
  rc = cm->f->step(cm->m, (int)n, cm->tok, cm->slots, next ? cm->next : NULL, logits, err);
  if (rc) return rc;
  for (int64_t i = 0; i < n; i++) {
    ((cuda_state *)states[i])->pos++;
    if (next) next[i] = cm->next[i];
  }
  return MBD_OK;
}

/* The split step: the family's step_launch where it has one (the states
 * count their token from here), else the whole step now. */
static int cuda_step_launch(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states,
                            const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                            int64_t nlogits, mbd_error *err) {
  cuda_backend *c = impl(b);
  cuda_model *cm = (cuda_model *)bm;
  if (c->pend.cm)
    return mbd_error_set(err, MBD_E_STATE, "step launched before the last one was waited for");
  if (nlogits < 0 || nlogits > n)
    return mbd_error_set(err, MBD_E_INVALID, "%lld logits rows of a step of %lld",
                         (long long)nlogits, (long long)n);
  if (!cm->f->step_launch)
    return step_impl(b, bm, states, tokens, n, next, nlogits > 0 ? logits : NULL, err);
  int rc = step_stage(c, cm, states, tokens, n, err);
  if (rc) return rc;
  rc = cm->f->step_launch(cm->m, (int)n, cm->tok, cm->slots, logits, (int)nlogits, err);
  if (rc) return rc;
  for (int64_t i = 0; i < n; i++) ((cuda_state *)states[i])->pos++;
  c->pend = (pending_step){.cm = cm, .next = next, .n = n};
  return MBD_OK;
}

static int cuda_step_wait(mbd_backend *b, mbd_error *err) {
  cuda_backend *c = impl(b);
  if (!c->pend.cm) return MBD_OK; /* nothing launched, or the step ran whole at launch */
  settle(c);
  int rc = c->pend.rc;
  if (rc && err) *err = c->pend.err;
  c->pend.cm = NULL;
  return rc;
}

static int cuda_step(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states,
                     const int64_t *tokens, int64_t n, float *logits, mbd_error *err) {
  return step_impl(b, bm, states, tokens, n, NULL, logits, err);
}

static int cuda_step_greedy(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states,
                            const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                            mbd_error *err) {
  return step_impl(b, bm, states, tokens, n, next, logits, err);
}

/* ---- CUDA IPC ------------------------------------------------------------ */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void ipc_evict(cuda_backend *c) {
  int old = 0;
  for (int i = 1; i < c->nipc; i++)
    if (c->ipc[i].used < c->ipc[old].used) old = i;
  if (c->ipc[old].is_event) cudaEventDestroy(c->ipc[old].event);
  else cudaIpcCloseMemHandle(c->ipc[old].base);
  c->ipc[old] = c->ipc[--c->nipc];
}

static ipc_entry *ipc_find(cuda_backend *c, const uint8_t *key, bool is_event) {
  for (int i = 0; i < c->nipc; i++)
    if (c->ipc[i].is_event == is_event && !memcmp(c->ipc[i].key, key, MBD_IPC_HANDLE_BYTES)) {
      c->ipc[i].used = ++c->clock;
      return &c->ipc[i];
    }
  return NULL;
}

/* Opens (or finds) the mapping of r's handle and checks r's range against the
 * allocation; *dptr = base + offset. */
static int ipc_resolve(cuda_backend *c, const mbd_tensor_ref *r, size_t nbytes, char **dptr,
                       mbd_error *err) {
  if (r->kind != MBD_TREF_CUDA_IPC)
    return mbd_error_set(err, MBD_E_INVALID, "tensor '%s' is not a CUDA IPC ref", r->name);
  double t0 = now_us();
  cudaError_t se = cudaSetDevice(c->opts.device); /* handles open on the current device */
  if (se != cudaSuccess) return cu_err(err, se, "cudaSetDevice");
  ipc_entry *e = ipc_find(c, r->ipc_handle, false);
  if (!e) {
    cudaIpcMemHandle_t h;
    memcpy(&h, r->ipc_handle, sizeof h);
    void *base = NULL;
    cudaError_t ce = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
      cudaGetLastError(); /* clear the sticky-free error so the worker keeps serving */
      return mbd_error_set(err, MBD_E_INVALID,
                           "tensor '%s': cannot open its CUDA IPC handle (%s: %s): the "
                           "allocation was freed, the handle is from another machine or not "
                           "a cudaIpcGetMemHandle result",
                           r->name, cudaGetErrorName(ce), cudaGetErrorString(ce));
    }
    CUdeviceptr ab = 0;
    size_t asz = 0;
    CUresult cr = c->addr_range ? c->addr_range(&ab, &asz, (CUdeviceptr)(uintptr_t)base)
                                : CUDA_ERROR_NOT_FOUND;
    if (cr != CUDA_SUCCESS) {
      cudaIpcCloseMemHandle(base);
      return mbd_error_set(err, MBD_E_DEVICE,
                           "tensor '%s': cuMemGetAddressRange on the opened IPC mapping failed "
                           "(CUresult %d): cannot check the range, refusing it",
                           r->name, (int)cr);
    }
    /* The handle maps the exporter's whole allocation from its base. */
    size_t span = asz - (size_t)((uintptr_t)base - (uintptr_t)ab);
    if ((uintptr_t)base < (uintptr_t)ab || (uintptr_t)base - (uintptr_t)ab > asz) span = 0;
    if (c->nipc == IPC_CACHE_MAX) ipc_evict(c);
    e = &c->ipc[c->nipc++];
    memset(e, 0, sizeof *e);
    memcpy(e->key, r->ipc_handle, MBD_IPC_HANDLE_BYTES);
    e->base = base;
    e->size = span;
    e->used = ++c->clock;
    MBD_LOGI(LOGC, "opened a CUDA IPC handle: %zu-byte allocation, %.1f us", span, now_us() - t0);
  } else {
    c->ipc_hit_us += now_us() - t0;
    if (++c->ipc_hits % 50 == 0)
      MBD_LOGI(LOGC, "CUDA IPC cache: %llu hits, mean cached lookup %.2f us",
               (unsigned long long)c->ipc_hits, c->ipc_hit_us / (double)c->ipc_hits);
  }
  /* Overflow-safe: offset <= size, then both lengths within size - offset. */
  if (r->offset > e->size || r->size > e->size - r->offset || nbytes > r->size)
    return mbd_error_set(err, MBD_E_INVALID,
                         "tensor '%s': IPC range [%llu, +%llu) is outside the %zu-byte allocation "
                         "its handle names",
                         r->name, (unsigned long long)r->offset, (unsigned long long)r->size,
                         e->size);
  size_t es = mbd_dtype_size(r->desc.dtype);
  if (es > 1 && r->offset % es)
    return mbd_error_set(err, MBD_E_INVALID,
                         "tensor '%s': IPC offset %llu is not a multiple of its element size %zu",
                         r->name, (unsigned long long)r->offset, es);
  *dptr = (char *)e->base + r->offset;
  if (r->has_event) { /* order our copy after the client's producer work */
    ipc_entry *ev = ipc_find(c, r->ipc_event, true);
    if (!ev) {
      cudaIpcEventHandle_t eh;
      memcpy(&eh, r->ipc_event, sizeof eh);
      cudaEvent_t evt = NULL;
      cudaError_t ce = cudaIpcOpenEventHandle(&evt, eh);
      if (ce != cudaSuccess) {
        cudaGetLastError();
        return mbd_error_set(err, MBD_E_INVALID,
                             "tensor '%s': cannot open its CUDA IPC event (%s): create it with "
                             "cudaEventInterprocess | cudaEventDisableTiming",
                             r->name, cudaGetErrorName(ce));
      }
      if (c->nipc == IPC_CACHE_MAX) ipc_evict(c);
      ev = &c->ipc[c->nipc++];
      memset(ev, 0, sizeof *ev);
      memcpy(ev->key, r->ipc_event, MBD_IPC_HANDLE_BYTES);
      ev->is_event = true;
      ev->event = evt;
      ev->used = ++c->clock;
    }
    cudaError_t ce = cudaStreamWaitEvent((cudaStream_t)mbd_gpu_ctx_stream(c->ctx), ev->event, 0);
    if (ce != cudaSuccess) {
      cudaGetLastError();
      return cu_err(err, ce, "cudaStreamWaitEvent on the client's IPC event");
    }
  }
  return MBD_OK;
}

static int ipc_copy(cuda_backend *c, void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                    mbd_error *err) {
  cudaStream_t s = (cudaStream_t)mbd_gpu_ctx_stream(c->ctx);
  cudaError_t ce = cudaMemcpyAsync(dst, src, n, k, s);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
  if (ce != cudaSuccess) {
    cudaGetLastError();
    return cu_err(err, ce, "copy through the CUDA IPC mapping");
  }
  return MBD_OK;
}

static int cuda_ipc_map(mbd_backend *b, const mbd_tensor_ref *r, size_t nbytes, void **dev,
                        mbd_error *err) {
  char *p = NULL;
  settle(impl(b));
  int rc = ipc_resolve(impl(b), r, nbytes, &p, err);
  *dev = rc ? NULL : p;
  return rc;
}

static int cuda_ipc_read(mbd_backend *b, const mbd_tensor_ref *r, void *dst, size_t nbytes,
                         mbd_error *err) {
  cuda_backend *c = impl(b);
  char *p = NULL;
  settle(c);
  int rc = ipc_resolve(c, r, nbytes, &p, err);
  if (rc || nbytes == 0) return rc;
  return ipc_copy(c, dst, p, nbytes, cudaMemcpyDeviceToHost, err);
}

static int cuda_ipc_write(mbd_backend *b, const mbd_tensor_ref *r, const void *src, size_t nbytes,
                          mbd_error *err) {
  cuda_backend *c = impl(b);
  char *p = NULL;
  settle(c);
  int rc = ipc_resolve(c, r, nbytes, &p, err);
  if (rc || nbytes == 0) return rc;
  return ipc_copy(c, p, src, nbytes, cudaMemcpyHostToDevice, err);
}

/* ---- page-locked host memory ------------------------------------------- */

/* A D2H copy into pageable memory is staged by the driver at a fraction of the
 * link rate; the worker's [max_batch, V] logits buffer lives here instead. */
static void *cuda_host_alloc(mbd_backend *b, size_t bytes) {
  (void)b;
  void *p = NULL;
  cudaError_t ce = cudaMallocHost(&p, bytes ? bytes : 1);
  if (ce != cudaSuccess) {
    cudaGetLastError();
    MBD_LOGW(LOGC, "cudaMallocHost of %zu bytes failed (%s): using pageable memory", bytes,
             cudaGetErrorName(ce));
    return NULL;
  }
  return p;
}

static void cuda_host_free(mbd_backend *b, void *p) {
  settle(impl(b)); /* the launched step may still copy into it */
  if (p) cudaFreeHost(p);
}

/* ---- state stashes (kernels/cuda/state_stash.h) ------------------------ */

/* Export reads a stash back through the first forward slot (reset before
 * every forward use). */
static size_t cuda_stash_bytes(mbd_backend *b, mbd_bmodel *bm) {
  (void)b;
  const cuda_model *cm = (const cuda_model *)bm;
  return mbd_state_stash_bytes(cm->f, cm->m);
}
static int cuda_stash_new(mbd_backend *b, mbd_bmodel *bm, mbd_bstash **out, mbd_error *err) {
  cuda_model *cm = (cuda_model *)bm;
  settle(impl(b));
  return mbd_state_stash_new(impl(b)->ctx, cm->f, cm->m, cm->fwd_base, (mbd_state_stash **)out,
                             err);
}
static void cuda_stash_free(mbd_backend *b, mbd_bstash *st) {
  settle(impl(b));
  mbd_state_stash *p = (mbd_state_stash *)st;
  mbd_state_stash_free(&p);
}
static int cuda_stash_save(mbd_backend *b, mbd_bstash *st, const mbd_bstate *bs, mbd_error *err) {
  settle(impl(b));
  const cuda_state *s = (const cuda_state *)bs;
  return mbd_state_stash_save((mbd_state_stash *)st, s->cm->m, s->slot, s->pos, err);
}
static int cuda_stash_load(mbd_backend *b, mbd_bstate *bs, const mbd_bstash *st, mbd_error *err) {
  settle(impl(b));
  cuda_state *s = (cuda_state *)bs;
  return mbd_state_stash_load((const mbd_state_stash *)st, s->cm->m, s->slot, &s->pos, err);
}
static int cuda_stash_export(mbd_backend *b, const mbd_bstash *st, void *dst, size_t cap,
                             mbd_error *err) {
  settle(impl(b));
  return mbd_state_stash_export((const mbd_state_stash *)st, dst, cap, err);
}

static const mbd_backend_ops k_cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .route = cuda_route,
    .gemm = cuda_gemm,
    .model_load = cuda_model_load,
    .model_destroy = cuda_model_destroy,
    .model_vocab = cuda_model_vocab,
    .forward = cuda_forward,
    .state_new = cuda_state_new,
    .state_free = cuda_state_free,
    .state_bytes = cuda_state_bytes,
    .state_save = cuda_state_save,
    .state_load = cuda_state_load,
    .prefill = cuda_prefill,
    .step = cuda_step,
    .step_greedy = cuda_step_greedy,
    .step_launch = cuda_step_launch,
    .step_wait = cuda_step_wait,
    .ipc_map = cuda_ipc_map,
    .ipc_read = cuda_ipc_read,
    .ipc_write = cuda_ipc_write,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .prefill_batch = cuda_prefill_batch,
    .stash_bytes = cuda_stash_bytes,
    .stash_new = cuda_stash_new,
    .stash_free = cuda_stash_free,
    .stash_save = cuda_stash_save,
    .stash_load = cuda_stash_load,
    .stash_export = cuda_stash_export,
};

int mbd_backend_cuda_new(const mbd_backend_opts *opts, mbd_backend **out, mbd_error *err) {
  *out = NULL;
  if (opts->max_batch < 1 || opts->max_batch > 4096 || opts->state_capacity < 1)
    return mbd_error_set(err, MBD_E_INVALID, "cuda backend needs --max-batch in 1..4096 and "
                         "--sessions >= 1");
  cuda_backend *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the CUDA backend");
  c->opts = *opts;
  c->sessions = opts->state_capacity;
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.device = opts->device;
  cfg.mode = opts->mode;
  cfg.policy = opts->policy;
  cfg.state = opts->state;
  cfg.family = MBD_FAMILY_INFERENCE;
  /* Session slots + one forward chunk of max_batch rows (the route's capacity). */
  cfg.state_capacity = opts->state_capacity + opts->max_batch;
  int rc = mbd_gpu_ctx_new(&cfg, &c->ctx, err);
  if (rc) {
    free(c);
    return mbd_error_prefix(err, "--device cuda:%d", opts->device);
  }
  enum cudaDriverEntryPointQueryResult q;
  void *fn = NULL;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    c->addr_range = (addr_range_fn)fn;
  else
    MBD_LOGW(LOGC, "cuMemGetAddressRange unavailable: CUDA IPC tensors will be refused");
  c->base.ops = &k_cuda_ops;
  c->base.impl = c;
  *out = &c->base;
  return MBD_OK;
}
