/* CPU backend of the worker: the deterministic CPU GEMM (kernels/cpu/gemm.h)
 * and the Mamba-1 model (kernels/model/mamba1.h) behind the backend vtable.
 *
 * Route identity: deterministic mode only; the kernel digest is SHA-256 of the
 * configure-time digest of the kernel sources (MBD_KERNEL_SRC_DIGEST, see
 * worker/CMakeLists.txt) and the compiler identity, so any source or compiler
 * change gives a new route id. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/model/mamba1.h"
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

static int cpu_model_load(mbd_backend *b, const char *dir, mbd_bmodel **out, mbd_error *err) {
  cpu_backend *c = impl(b);
  mbd_mamba1_options o;
  mbd_mamba1_options_default(&o);
  o.backend = MBD_BACKEND_CPU;
  o.dtype = policy_dtype(c->opts.policy);
  o.threads = c->opts.threads;
  o.isa = (int)mbd_cpu_ctx_isa(c->ctx);
  mbd_mamba1_model *m = NULL;
  int rc = mbd_mamba1_load(dir, &o, &m, err);
  if (rc) return rc;
  if (strcmp(mbd_mamba1_isa(m), c->isa)) {
    mbd_error_set(err, MBD_E_INTERNAL, "model runs ISA %s but the GEMM context runs %s",
                  mbd_mamba1_isa(m), c->isa);
    mbd_mamba1_destroy(&m);
    return MBD_E_INTERNAL;
  }
  *out = (mbd_bmodel *)m;
  return MBD_OK;
}

static void cpu_model_destroy(mbd_backend *b, mbd_bmodel *m) {
  mbd_mamba1_model *mm = (mbd_mamba1_model *)m;
  mbd_mamba1_destroy(&mm);
}

static int64_t cpu_model_vocab(const mbd_bmodel *m) {
  return mbd_mamba1_vocab((const mbd_mamba1_model *)m);
}

static int cpu_forward(mbd_backend *b, mbd_bmodel *bm, const int64_t *ids, int64_t B, int64_t T,
                       bool last_only, float *logits, mbd_error *err) {
  mbd_mamba1_model *m = (mbd_mamba1_model *)bm;
  int rc = MBD_OK;
  if (B < 1 || T < 1 || B > INT32_MAX || T > INT64_MAX / B)
    return mbd_error_set(err, MBD_E_SHAPE, "forward needs B >= 1 and T >= 1");
  mbd_mamba1_state **st = calloc((size_t)B, sizeof *st);
  int32_t *tok = malloc((size_t)(B * T) * sizeof *tok);
  const int32_t **rows = malloc((size_t)B * sizeof *rows);
  int64_t *lens = malloc((size_t)B * sizeof *lens);
  if (!st || !tok || !rows || !lens) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for a forward of %lld x %lld", (long long)B,
                       (long long)T);
    goto fail;
  }
  if ((rc = mbd_backend_tokens_i32(ids, B * T, mbd_mamba1_vocab(m), tok, err))) goto fail;
  for (int64_t i = 0; i < B; i++) {
    if ((rc = mbd_mamba1_state_new(m, &st[i], err))) goto fail;
    rows[i] = tok + i * T;
    lens[i] = T;
  }
  rc = mbd_mamba1_prefill(m, st, (int)B, rows, lens,
                          last_only ? MBD_MAMBA1_LOGITS_LAST : MBD_MAMBA1_LOGITS_ALL, logits, err);
fail:
  if (st)
    for (int64_t i = 0; i < B; i++) mbd_mamba1_state_destroy(&st[i]);
  free(st);
  free(tok);
  free(rows);
  free(lens);
  return rc;
}

static int cpu_state_new(mbd_backend *b, mbd_bmodel *m, mbd_bstate **out, mbd_error *err) {
  mbd_mamba1_state *s = NULL;
  int rc = mbd_mamba1_state_new((const mbd_mamba1_model *)m, &s, err);
  *out = (mbd_bstate *)s;
  return rc;
}

static void cpu_state_free(mbd_backend *b, mbd_bstate *s) {
  mbd_mamba1_state *ms = (mbd_mamba1_state *)s;
  mbd_mamba1_state_destroy(&ms);
}

static size_t cpu_state_bytes(const mbd_bstate *s) {
  return mbd_mamba1_state_export_size((const mbd_mamba1_state *)s);
}

static int cpu_state_save(const mbd_bstate *s, void *dst, size_t cap, mbd_error *err) {
  size_t len = 0;
  return mbd_mamba1_state_export((const mbd_mamba1_state *)s, dst, cap, &len, err);
}

static int cpu_state_load(mbd_bstate *s, const void *src, size_t len, mbd_error *err) {
  return mbd_mamba1_state_import((mbd_mamba1_state *)s, src, len, err);
}

static int cpu_prefill(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *s, const int64_t *ids,
                       int64_t T, bool last_only, float *logits, mbd_error *err) {
  mbd_mamba1_model *m = (mbd_mamba1_model *)bm;
  if (T < 1) return mbd_error_set(err, MBD_E_SHAPE, "prefill needs at least one token");
  int32_t *tok = malloc((size_t)T * sizeof *tok);
  if (!tok) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld tokens", (long long)T);
  int rc = mbd_backend_tokens_i32(ids, T, mbd_mamba1_vocab(m), tok, err);
  if (!rc) {
    mbd_mamba1_state *st = (mbd_mamba1_state *)s;
    const int32_t *row = tok;
    rc = mbd_mamba1_prefill(m, &st, 1, &row, &T,
                            last_only ? MBD_MAMBA1_LOGITS_LAST : MBD_MAMBA1_LOGITS_ALL, logits, err);
  }
  free(tok);
  return rc;
}

static int cpu_step(mbd_backend *b, mbd_bmodel *bm, mbd_bstate *const *states,
                    const int64_t *tokens, int64_t n, float *logits, mbd_error *err) {
  mbd_mamba1_model *m = (mbd_mamba1_model *)bm;
  if (n < 1 || n > INT32_MAX) return mbd_error_set(err, MBD_E_INVALID, "step batch of %lld", (long long)n);
  int32_t *tok = malloc((size_t)n * sizeof *tok);
  if (!tok) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a step batch");
  int rc = mbd_backend_tokens_i32(tokens, n, mbd_mamba1_vocab(m), tok, err);
  if (!rc)
    rc = mbd_mamba1_step(m, (mbd_mamba1_state *const *)states, (int)n, tok, logits, err);
  free(tok);
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
  cpu_backend *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the CPU backend");
  c->opts = *opts;
  int rc = mbd_cpu_ctx_new(opts->threads, MBD_CPU_ISA_AUTO, &c->ctx, err);
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
