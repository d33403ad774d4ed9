/* CPU backend: the deterministic CPU GEMM (kernels/cpu/gemm.h) and the model
 * families' CPU implementations (kernels/model/family.h, chosen by each
 * checkpoint's config.json) behind the backend vtable.
 *
 * Route identity: deterministic mode only; the kernel digest is SHA-256 of the
 * configure-time digest of the kernel sources (MBD_KERNEL_SRC_DIGEST, see
 * kernels/CMakeLists.txt) and the compiler identity, so any source or compiler
 * change gives a new route id. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/model/family.h"
#include "kernels/backend.h"

#ifndef MBD_KERNEL_SRC_DIGEST
#error "MBD_KERNEL_SRC_DIGEST must come from kernels/CMakeLists.txt"
#endif

/* Revision of the CPU tile/dispatch policy (thread split, panel width): bump
 * when it changes in a way that could change bits. */
#define MBD_CPU_DISPATCH_REV 1

typedef struct cpu_backend {
  mbd_backend base;       /* vtable + impl (points back here) */
  mbd_backend_opts opts;  /* as given */
  mbd_cpu_ctx *ctx;       /* GEMM requests' thread pool */
  char isa[32];           /* ISA level in use */
} cpu_backend;

static cpu_backend *impl(mbd_backend *b) { return (cpu_backend *)b->impl; }

static void cpu_destroy(mbd_backend *b) {
  cpu_backend *c = impl(b);
  mbd_cpu_ctx_destroy(&c->ctx);
  free(c);
}

static void cpu_route(mbd_backend *b, mbd_route_identity *r) {
  cpu_backend *c = impl(b);
  memset(r, 0, sizeof *r);
  r->mode = MBD_GEMM_DETERMINISTIC;
  r->policy = c->opts.policy;
  r->family = MBD_FAMILY_INFERENCE;
  r->backend = MBD_BACKEND_CPU;
  snprintf(r->isa, sizeof r->isa, "%s", c->isa);
  char text[512];
  int n = snprintf(text, sizeof text, "mambad-cpu-kernels\nsources=%s\ncompiler=%s\n",
                   MBD_KERNEL_SRC_DIGEST, __VERSION__);
  uint8_t d[32];
  mbd_sha256(text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1, d);
  mbd_sha256_hex(d, r->kernel_digest);
  snprintf(r->compiler, sizeof r->compiler, "%s", __VERSION__);
  snprintf(r->device_name, sizeof r->device_name, "cpu");
  r->dispatch_rev = MBD_CPU_DISPATCH_REV;
  r->state_capacity = c->opts.state_capacity;
}

static int cpu_gemm(mbd_backend *b, int64_t M, int64_t N, int64_t K, mbd_dtype a_dtype,
                    const void *A, mbd_dtype b_dtype, const void *B, const float *bias, float *C,
                    mbd_error *err) {
  return mbd_cpu_gemm(impl(b)->ctx, MBD_GEMM_NT, M, N, K, a_dtype, A, K, b_dtype, B, K, bias, C,
                      N, err);
}

static mbd_dtype policy_dtype(mbd_dtype_policy p) {
  return p == MBD_POLICY_BF16 ? MBD_DTYPE_BF16 : p == MBD_POLICY_F16 ? MBD_DTYPE_F16 : MBD_DTYPE_F32;
}

/* A loaded model: its family's CPU vtable and the family's model. */
typedef struct cpu_model {
  const mbd_cpu_model_ops *f;
  void *m;
  int64_t vocab;
  int64_t cap;  /* rows of the step scratch (grow-only) */
  int32_t *tok; /* [cap] a step's tokens as i32 */
  void **st;    /* [cap] a step's family states */
} cpu_model;

/* A session state: the family's state and the vtable that frees it. */
typedef struct cpu_state {
  const mbd_cpu_model_ops *f;
  void *s;
} cpu_state;

static void cpu_model_destroy(mbd_backend *b, mbd_bmodel *bm) {
  (void)b;
  cpu_model *cm = (cpu_model *)bm;
  if (!cm) return;
  cm->f->destroy(cm->m);
  free(cm->tok);
  free(cm->st);
  free(cm);
}

static int cpu_model_load(mbd_backend *b, const char *dir, mbd_bmodel **out, mbd_error *err) {
  cpu_backend *c = impl(b);
  const mbd_model_family *fam = NULL;
  *out = NULL;
  int rc = mbd_model_family_detect(dir, &fam, err);
  if (rc) return rc;
  if (!fam->cpu)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "model %s: the %s family has no CPU implementation in this build", dir,
                         fam->name);
  cpu_model *cm = calloc(1, sizeof *cm);
  if (!cm) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a model");
  cm->f = fam->cpu;
  mbd_cpu_model_opts o = {.dtype = policy_dtype(c->opts.policy), .threads = c->opts.threads,
                          .progress = c->opts.progress,
                          .isa = (int)mbd_cpu_ctx_isa(c->ctx)};
  if ((rc = cm->f->load(dir, &o, &cm->m, err))) {
    free(cm);
    return rc;
  }
  cm->vocab = cm->f->vocab(cm->m);
  if (strcmp(cm->f->isa(cm->m), c->isa)) {
    mbd_error_set(err, MBD_E_INTERNAL, "model runs ISA %s but the GEMM context runs %s",
                  cm->f->isa(cm->m), c->isa);
    cpu_model_destroy(b, (mbd_bmodel *)cm);
    return MBD_E_INTERNAL;
  }
  *out = (mbd_bmodel *)cm;
  return MBD_OK;
}

static int64_t cpu_model_vocab(const mbd_bmodel *m) { return ((const cpu_model *)m)->vocab; }

/* Prefill of n rows of T tokens each (ids [n,T]) into the family states st[n]. */
static int prefill_rows(cpu_model *cm, void *const *st, int64_t n, const int64_t *ids, int64_t T,
                        bool last_only, float *logits, mbd_error *err) {
  int rc = MBD_OK;
  if (n < 1 || T < 1 || n > INT32_MAX || T > INT64_MAX / n)
    return mbd_error_set(err, MBD_E_SHAPE, "prefill needs rows >= 1 and T >= 1");
  int32_t *tok = malloc((size_t)(n * T) * sizeof *tok);
  const int32_t **rows = malloc((size_t)n * sizeof *rows);
  int64_t *lens = malloc((size_t)n * sizeof *lens);
  if (!tok || !rows || !lens) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld x %lld tokens", (long long)n,
                       (long long)T);
    goto fail;
  }
  if ((rc = mbd_backend_tokens_i32(ids, n * T, cm->vocab, tok, err))) goto fail;
  for (int64_t i = 0; i < n; i++) {
    rows[i] = tok + i * T;
    lens[i] = T;
  }
  rc = cm->f->prefill(cm->m, st, (int)n, rows, lens, last_only ? MBD_LOGITS_LAST : MBD_LOGITS_ALL,
                      logits, err);
fail:
  free(tok);
  free(rows);
  free(lens);
  return rc;
}

static int cpu_forward(mbd_backend *b, mbd_bmodel *bm, const int64_t *ids, int64_t B, int64_t T,
                       bool last_only, float *logits, mbd_error *err) {
  (void)b;
  cpu_model *cm = (cpu_model *)bm;
  int rc = MBD_OK;
  if (B < 1 || T < 1 || B > INT32_MAX || T > INT64_MAX / B)
    return mbd_error_set(err, MBD_E_SHAPE, "forward needs B >= 1 and T >= 1");
  void **st = calloc((size_t)B, sizeof *st);
  if (!st)
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a forward of %lld x %lld",
                         (long long)B, (long long)T);
  for (int64_t i = 0; i < B && !rc; i++) rc = cm->f->state_new(cm->m, &st[i], err);
  if (!rc) rc = prefill_rows(cm, st, B, ids, T, last_only, logits, err);
  for (int64_t i = 0; i < B; i++) cm->f->state_free(st[i]);
  free(st);
  return rc;
}

static int cpu_state_new(mbd_backend *b, mbd_bmodel *bm, mbd_bstate **out, mbd_error *err) {
  (void)b;
  cpu_model *cm = (cpu_model *)bm;
  *out = NULL;
  cpu_state *s = calloc(1, sizeof *s);
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a session state");
  s->f = cm->f;
  int rc = cm->f->state_new(cm->m, &s->s, err);
  if (rc) {
    free(s);
    return rc;
  }
  *out = (mbd_bstate *)s;
  return MBD_OK;
}

static void cpu_state_free(mbd_backend *b, mbd_bstate *bs) {
  (void)b;
  cpu_state *s = (cpu_state *)bs;
  if (!s) return;
  s->f->state_free(s->s);
  free(s);
}

static size_t cpu_state_bytes(const mbd_bstate *bs) {
  const cpu_state *s = (const cpu_state *)bs;
  return s->f->state_bytes(s->s);
}

static int cpu_state_save(const mbd_bstate *bs, void *dst, size_t cap, mbd_error *err) {
  const cpu_state *s = (const cpu_state *)bs;
  return s->f->state_save(s->s, dst, cap, err);
}

static int cpu_state_load(mbd_bstate *bs, const void *src, size_t len, mbd_error *err) {
  cpu_state *s = (cpu_state *)bs;
  return s->f->state_load(s->s, src, len, err);
}

/* Grows the step scratch to n rows and fills cm->st with the family states
 * of states[n]; steps then allocate nothing once the largest batch was seen. */
static int family_states(cpu_model *cm, mbd_bstate *const *states, int64_t n, mbd_error *err) {
  if (n > cm->cap) {
    int32_t *tok = realloc(cm->tok, (size_t)n * sizeof *tok);
    if (tok) cm->tok = tok;
    void **st = tok ? realloc(cm->st, (size_t)n * sizeof *st) : NULL;
    if (!st)
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a batch of %lld", (long long)n);
    cm->st = st;
    cm->cap = n;
  }
  for (int64_t i = 0; i < n; i++) cm->st[i] = ((cpu_state *)states[i])->s;
  return MBD_OK;
}

static int cpu_prefill_batch(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states, int64_t n,
                             const int64_t *ids, int64_t T, bool last_only, float *logits,
                             mbd_error *err) {
  (void)b;
  cpu_model *cm = (cpu_model *)bm;
  if (n < 1 || n > INT32_MAX)
    return mbd_error_set(err, MBD_E_SHAPE, "prefill of %lld rows", (long long)n);
  int rc = family_states(cm, states, n, err);
  return rc ? rc : prefill_rows(cm, cm->st, n, ids, T, last_only, logits, err);
}

static int cpu_prefill(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *s, const int64_t *ids,
                       int64_t T, bool last_only, float *logits, mbd_error *err) {
  if (T < 1) return mbd_error_set(err, MBD_E_SHAPE, "prefill needs at least one token");
  return cpu_prefill_batch(b, bm, &s, 1, ids, T, last_only, logits, err);
}

static int cpu_step(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states,
                    const int64_t *tokens, int64_t n, float *logits, mbd_error *err) {
  (void)b;
  cpu_model *cm = (cpu_model *)bm;
  if (n < 1 || n > INT32_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "step batch of %lld", (long long)n);
  int rc = family_states(cm, states, n, err);
  if (!rc) rc = mbd_backend_tokens_i32(tokens, n, cm->vocab, cm->tok, err);
  if (!rc) rc = cm->f->step(cm->m, cm->st, (int)n, cm->tok, logits, err);
  return rc;
}

static const mbd_backend_ops k_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .route = cpu_route,
    .gemm = cpu_gemm,
    .model_load = cpu_model_load,
    .model_destroy = cpu_model_destroy,
    .model_vocab = cpu_model_vocab,
    .forward = cpu_forward,
    .state_new = cpu_state_new,
    .state_free = cpu_state_free,
    .state_bytes = cpu_state_bytes,
    .state_save = cpu_state_save,
    .state_load = cpu_state_load,
    .prefill = cpu_prefill,
    .step = cpu_step,
    .prefill_batch = cpu_prefill_batch,
};

int mbd_backend_cpu_new(const mbd_backend_opts *opts, mbd_backend **out, mbd_error *err) {
  *out = NULL;
  if (opts->mode != MBD_GEMM_DETERMINISTIC)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "the CPU backend runs only --gemm-mode deterministic (got %s); cuBLAS "
                         "modes need --device cuda",
                         mbd_gemm_mode_name(opts->mode));
  if (opts->policy == MBD_POLICY_TF32)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "the CPU backend stores weights as f32, bf16 or f16; tf32 is a GPU policy");
  if (opts->state != MBD_STATE_F32)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "state dtype %s is supported for %s; the CPU backend keeps an f32 "
                         "state (--state-dtype f32)",
                         mbd_state_dtype_name(opts->state), mbd_state_dtype_where(opts->state));
  cpu_backend *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the CPU backend");
  c->opts = *opts;
  int rc = mbd_cpu_ctx_new(opts->threads, (mbd_cpu_isa)opts->isa, &c->ctx, err);
  if (rc) {
    free(c);
    return rc;
  }
  snprintf(c->isa, sizeof c->isa, "%s", mbd_cpu_isa_name(mbd_cpu_ctx_isa(c->ctx)));
  c->base.ops = &k_cpu_ops;
  c->base.impl = c;
  *out = &c->base;
  return MBD_OK;
}
