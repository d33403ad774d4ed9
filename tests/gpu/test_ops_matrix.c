/* Per-op matrix of the CUDA Mamba-1 ops (kernels/cuda/mamba_ops.h) against
 * the CPU ops (kernels/cpu/mamba_ops.h), in the manner of ggml's
 * test-backend-ops: every entry over d_state 4/8/16/32 (64: refused with
 * MBD_E_INVALID, as the header states), d_conv 2..8, d_inner 37/130/257 (not
 * multiples of any tile: conv blocks of 64 channels, scan blocks of 128 / N,
 * x_proj groups of 16 and 512-wide lane strides), activation and weight
 * dtypes f32/bf16/f16, several sequences in permuted state slots, and
 * sequence lengths on both sides of the 16-step chunks.
 *
 * Bitwise (memcmp) wherever docs/route.md ("Model kernels", "Contract between
 * the backends") states the roundings: the f32 ops are the CPU ops' roundings
 * (CPU f32 == GPU f32); the 16-bit routes' RMSNorm has its own stated
 * reduction order, written out here, and their x_proj its tensor-core
 * contract, run by the plain reference kernel of tests/gpu/xproj_ref.cu; every store in a 16-bit dtype is
 * the f32 value rounded to nearest even. Where the orders differ by contract
 * (16-bit RMSNorm and x_proj against the CPU's f32 chains) the test states a
 * bound and its reason. Sampling with a temperature is not in the contract
 * (each backend draws its own numbers); greedy picks are, and are compared.
 *
 * Skips (exit 77) with a printed reason when no CUDA device is present. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "common/half.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gated_rmsnorm.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/cpu/ssd_step.h"
#include "kernels/cuda/mamba_ops.h"
#include "kernels/cuda/ops/gated_rmsnorm.h"
#include "kernels/cuda/ops/ssd_scan.h"
#include "kernels/portable_math.h"
#include "support/gpu_util.h"
#include "tests/gpu/gpu_op_test.h"
#include "tests/gpu/xproj_ref.h"

static const int k_dinner[] = {37, 130, 257};
static const mbd_dtype k_act[] = {MBD_DTYPE_F32, MBD_DTYPE_BF16, MBD_DTYPE_F16};
enum { N_DINNER = 3, N_ACT = 3 };

static cudaStream_t g_stream;

/* ---- embedding ------------------------------------------------------------ */

/* out[r] = table[tok[r]] widened: exact in every dtype. */
static void test_embed(void **state) {
  (void)state;
  uint64_t seed = 11;
  enum { M = 7, V = 13 };
  for (int a = 0; a < N_ACT; a++) {
    for (int q = 0; q < N_DINNER; q++) {
      int d = k_dinner[q];
      mbd_dtype dt = k_act[a];
      float *tf = malloc((size_t)V * d * sizeof *tf);
      void *table = fill(dt, (size_t)V * d, &seed, -2.0f, 2.0f, tf);
      int32_t tok[M];
      for (int r = 0; r < M; r++) tok[r] = (int32_t)(gpu_test_rng(&seed) % V);
      void *dtab = dput(table, (size_t)V * d * dsize(dt)), *dtok = dput(tok, sizeof tok);
      float *dout = dzero((size_t)M * d * 4);
      OP(mbd_mops_embed(g_stream, M, d, dtok, dt, dtab, dout, &err));
      float *got = malloc((size_t)M * d * 4), *want = malloc((size_t)M * d * 4);
      dget(got, dout, (size_t)M * d * 4);
      for (int r = 0; r < M; r++)
        memcpy(want + (size_t)r * d, tf + (size_t)tok[r] * d, (size_t)d * 4);
      char what[64];
      snprintf(what, sizeof what, "embed %s d=%d", mbd_dtype_name(dt), d);
      same_bytes(what, got, want, (size_t)M * d, 4);
      dfree(dtab);
      dfree(dtok);
      dfree(dout);
      free(tf);
      free(table);
      free(got);
      free(want);
    }
  }
}

/* ---- add + RMSNorm ---------------------------------------------------------- */

/* The 16-bit routes' scale (docs/route.md): lane l's fmaf chain from 0 over
 * c = l, l + 32, ... ascending, the xor butterfly 16, 8, 4, 2, 1 over the lane
 * sums, then 1 / sqrtf(ss / d + eps). */
static float rms_inv_lanes(const float *x, int d, float eps) {
  float s[32];
  for (int l = 0; l < 32; l++) {
    s[l] = 0.0f;
    for (int c = l; c < d; c += 32) s[l] = fmaf(x[c], x[c], s[l]);
  }
  for (int off = 16; off > 0; off >>= 1) {
    float t[32];
    for (int l = 0; l < 32; l++) t[l] = s[l] + s[l ^ off];
    memcpy(s, t, sizeof s);
  }
  return 1.0f / sqrtf(s[0] / (float)d + eps);
}

/* Bound of the 16-bit routes against the CPU op rounded to the same dtype:
 * both square sums are chains over the same d non-negative terms in different
 * orders (each within d u of the exact sum, u = 2^-24), so the two scales
 * differ by at most d u relative (the square root halves 2 d u); for d <=
 * 1000 that is 6e-5, far below half a bf16 (2^-9) or f16 (2^-12) ulp, so the
 * rounded outputs are equal or adjacent: at most 1 unit in the last place. */
static void test_add_rmsnorm(void **state) {
  (void)state;
  uint64_t seed = 12;
  const int dims[] = {37, 130, 257, 768, 1000};
  const float eps = 1e-5f;
  for (int a = 0; a < N_ACT; a++) {
    for (size_t q = 0; q < sizeof dims / sizeof dims[0]; q++) {
      for (int form = 0; form < 3;
           form++) { /* 0: no delta; 1: delta; 2: delta, every 3rd row + 2 */
        mbd_dtype act = k_act[a];
        int d = dims[q];
        int64_t M = 4, stride = form == 2 ? 3 : 1, offset = form == 2 ? 2 : 0;
        int64_t rows = (M - 1) * stride + offset + 1;
        size_t nr = (size_t)rows * d;
        float *resid = fillf(nr, &seed, -3.0f, 3.0f);
        float *delta = form ? fillf(nr, &seed, -1.0f, 1.0f) : NULL;
        float *w = malloc((size_t)d * 4);
        void *wdt = fill(act, (size_t)d, &seed, 0.5f, 1.5f, w); /* the model widens w to f32 */
        float *dres = dput(resid, nr * 4), *ddel = delta ? dput(delta, nr * 4) : NULL;
        float *dw = dput(w, (size_t)d * 4);
        void *dout = dzero((size_t)M * d * dsize(act));
        OP(mbd_mops_add_rmsnorm(g_stream, M, d, stride, offset, dres, ddel, dw, eps, act, dout,
                                &err));
        float *gres = malloc(nr * 4);
        void *gout = malloc((size_t)M * d * dsize(act)), *want = malloc((size_t)M * d * dsize(act));
        dget(gres, dres, nr * 4);
        dget(gout, dout, (size_t)M * d * dsize(act));
        /* reference: the residual add (f32, stored back) on the rows the op reads */
        float *rres = malloc(nr * 4), *row = malloc((size_t)d * 4);
        memcpy(rres, resid, nr * 4);
        char what[96];
        snprintf(what, sizeof what, "add_rmsnorm %s d=%d form=%d", mbd_dtype_name(act), d, form);
        for (int64_t i = 0; i < M; i++) {
          float *x = rres + (size_t)(i * stride + offset) * d;
          if (delta)
            for (int c = 0; c < d; c++) x[c] = x[c] + delta[(size_t)(i * stride + offset) * d + c];
          if (act == MBD_DTYPE_F32) {
            mbd_cpu_rmsnorm(x, w, d, eps, row); /* CPU f32 == GPU f32 */
            memcpy((float *)want + (size_t)i * d, row, (size_t)d * 4);
          } else {
            float r = rms_inv_lanes(x, d, eps);
            for (int c = 0; c < d; c++) store(act, want, (size_t)i * d + c, w[c] * (x[c] * r));
            /* the stated bound against the CPU op */
            mbd_cpu_rmsnorm(x, w, d, eps, row);
            for (int c = 0; c < d; c++) {
              uint16_t g = ((const uint16_t *)gout)[(size_t)i * d + c];
              uint16_t cpu =
                  act == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(row[c]) : mbd_f32_to_f16(row[c]);
              if (abs((int)g - (int)cpu) > 1)
                fail_msg("%s: row %lld col %d: 0x%04x vs CPU 0x%04x, more than 1 ulp", what,
                         (long long)i, c, g, cpu);
            }
          }
        }
        same_bytes(what, gout, want, (size_t)M * d, dsize(act));
        same_bytes(what, gres, rres, nr, 4);
        dfree(dres);
        dfree(ddel);
        dfree(dw);
        dfree(dout);
        free(resid);
        free(delta);
        free(w);
        free(wdt);
        free(gres);
        free(gout);
        free(want);
        free(rres);
        free(row);
      }
    }
  }
}

/* ---- conv + SiLU ------------------------------------------------------------ */

/* Three sequences in slots 2, 0, 3 of 4, row s * T + t; xz rows of 2 di + 3
 * floats (x first); the state slots padded by 5 floats. Every output and the
 * whole state buffer against T calls of mbd_cpu_conv_step per sequence. */
enum { NSEQ = 3, NSLOT = 4 };
static const int32_t k_slots[NSEQ] = {2, 0, 3};

static void test_conv_silu(void **state) {
  (void)state;
  uint64_t seed = 13;
  const int Ts[] = {1, 5, 40}; /* 40: three segments of 16 steps */
  /* al = 1: d_inner rounded up to a multiple of 4 and rows 16-byte aligned,
   * so that the decode step moves four channels at a time */
  for (int al = 0; al < 2; al++)
    for (int K = 2; K <= 8; K++)
      for (int q = 0; q < N_DINNER; q++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
          for (int a = 0; a < N_ACT; a++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
              int di = al ? (k_dinner[q] + 3) / 4 * 4 : k_dinner[q], T = Ts[ti];
              mbd_dtype act = k_act[a];
              int64_t M = (int64_t)NSEQ * T, ldxz = 2 * di + 3 + al,
                      sstride = (int64_t)(K - 1) * di + 5 - al;
              float *w = malloc((size_t)K * di * 4);
              float *b = with_bias ? malloc((size_t)di * 4) : NULL;
              /* weights as widened */
              void *w16 = fill(act, (size_t)K * di, &seed, -0.6f, 0.6f, w);
              void *b16 = with_bias ? fill(act, (size_t)di, &seed, -0.3f, 0.3f, b) : NULL;
              float *xz = fillf((size_t)M * ldxz, &seed, -2.0f, 2.0f);
              float *st = fillf((size_t)NSLOT * sstride, &seed, -1.0f, 1.0f);
              float *dxz = dput(xz, (size_t)M * ldxz * 4), *dw = dput(w, (size_t)K * di * 4);
              float *db = b ? dput(b, (size_t)di * 4) : NULL;
              float *dst = dput(st, (size_t)NSLOT * sstride * 4);
              int32_t *dsl = dput(k_slots, sizeof k_slots);
              float *dxc = dzero((size_t)M * di * 4);
              void *dact = dzero((size_t)M * di * dsize(act));
              OP(mbd_mops_conv_silu(g_stream, NSEQ, T, di, K, dxz, ldxz, dw, db, dst, sstride, dsl,
                                    dxc, act, dact, &err));
              float *gxc = malloc((size_t)M * di * 4), *gst = malloc((size_t)NSLOT * sstride * 4);
              void *gact = malloc((size_t)M * di * dsize(act));
              dget(gxc, dxc, (size_t)M * di * 4);
              dget(gst, dst, (size_t)NSLOT * sstride * 4);
              dget(gact, dact, (size_t)M * di * dsize(act));
              float *rxc = malloc((size_t)M * di * 4);
              void *ract = malloc((size_t)M * di * dsize(act));
              for (int s = 0; s < NSEQ; s++)
                for (int t = 0; t < T; t++) {
                  int64_t r = (int64_t)s * T + t;
                  mbd_cpu_conv_step(MBD_CPU_ISA_PORTABLE, 0, di, di, K, w, b,
                                    st + (int64_t)k_slots[s] * sstride, xz + r * ldxz,
                                    rxc + r * di);
                }
              for (int64_t i = 0; i < M * di; i++) store(act, ract, (size_t)i, rxc[i]);
              char what[96];
              snprintf(what, sizeof what, "conv_silu K=%d di=%d T=%d %s bias=%d aligned=%d", K, di,
                       T, mbd_dtype_name(act), with_bias, al);
              same_bytes(what, gxc, rxc, (size_t)(M * di), 4);
              same_bytes(what, gact, ract, (size_t)(M * di), dsize(act));
              same_bytes(what, gst, st, (size_t)NSLOT * sstride, 4); /* st: the reference's state */
              dfree(dxz);
              dfree(dw);
              dfree(db);
              dfree(dst);
              dfree(dsl);
              dfree(dxc);
              dfree(dact);
              free(w);
              free(b);
              free(w16);
              free(b16);
              free(xz);
              free(st);
              free(gxc);
              free(gst);
              free(gact);
              free(rxc);
              free(ract);
            }
  /* widths outside 2..8 are refused */
  mbd_error err = {0};
  assert_int_equal(mbd_mops_conv_silu(g_stream, 1, 1, 8, 9, NULL, 16, NULL, NULL, NULL, 0, NULL,
                                      NULL, MBD_DTYPE_F32, NULL, &err),
                   MBD_E_INVALID);
}

/* ---- x_proj ----------------------------------------------------------------- */

/* The f32 contract: fmaf chain from 0 over k ascending (the CPU model's x_proj). */
static float xproj_f32(const float *x, const float *w, int K) {
  float acc = 0.0f;
  for (int k = 0; k < K; k++) acc = fmaf(x[k], w[k], acc);
  return acc;
}

/* 16-bit routes: the contract (docs/route.md: one m16n8k16 step per group of
 * 16 channels, class sums in group order, the xor butterfly) is pinned by
 * memcmp against the plain reference kernel of tests/gpu/xproj_ref.cu (and
 * every x_proj kernel against it in test_xproj_mma); here, besides, within a
 * bound of the f32 chain over the same widened inputs: each order of the K
 * exact products is within (K + 5) u sum |x w| of the exact sum (u = 2^-24)
 * but for the step's own alignment of its 16 products, which costs at most
 * 16 ulp of the group's largest, so the two differ by at most
 * (2 K + 32) u sum |x w|. */
static void test_xproj(void **state) {
  (void)state;
  uint64_t seed = 14;
  /* 1..7: a warp per output, 4 rows per warp; 33, 70: tiles of 16 rows x 8
   * outputs where K is a multiple of 512 (partial row and output tiles) */
  const int Ms[] = {1, 3, 7, 33, 70};
  const int Ks[] = {37, 130, 257, 520, 1040, /* 520, 1040: vector loads, > one lane stride */
                    1024, 1536};             /* whole 512-channel chunks */
  const int NO = 5 + 2 * 16;
  for (int a = 0; a < N_ACT; a++)
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
      for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        mbd_dtype dt = k_act[a];
        int M = Ms[mi], K = Ks[ki];
        float *xf = malloc((size_t)M * K * 4), *wf = malloc((size_t)NO * K * 4);
        void *x = fill(dt, (size_t)M * K, &seed, -1.0f, 1.0f, xf);
        void *w = fill(dt, (size_t)NO * K, &seed, -1.0f, 1.0f, wf);
        void *dx = dput(x, (size_t)M * K * dsize(dt)), *dw = dput(w, (size_t)NO * K * dsize(dt));
        float *dout = dzero((size_t)M * NO * 4);
        OP(mbd_mops_xproj(g_stream, M, K, NO, dt, dx, dw, dout, &err));
        float *got = malloc((size_t)M * NO * 4), *want = malloc((size_t)M * NO * 4);
        dget(got, dout, (size_t)M * NO * 4);
        if (dt != MBD_DTYPE_F32) {
          float *dref = dzero((size_t)M * NO * 4);
          assert_int_equal(xproj_ref(dt == MBD_DTYPE_BF16, M, K, NO, dx, K, dw, dref), 0);
          dget(want, dref, (size_t)M * NO * 4);
          dfree(dref);
        }
        char what[64];
        snprintf(what, sizeof what, "x_proj %s M=%d K=%d", mbd_dtype_name(dt), M, K);
        for (int r = 0; r < M; r++)
          for (int o = 0; o < NO; o++) {
            const float *xr = xf + (size_t)r * K, *wr = wf + (size_t)o * K;
            float chain = xproj_f32(xr, wr, K);
            if (dt == MBD_DTYPE_F32) want[r * NO + o] = chain;
            if (dt != MBD_DTYPE_F32) {
              double mag = 0;
              for (int k = 0; k < K; k++) mag += fabs((double)xr[k] * wr[k]);
              double bound = (2.0 * K + 32.0) * ldexp(1.0, -24) * mag;
              if (fabs((double)got[r * NO + o] - chain) > bound)
                fail_msg("%s: out[%d][%d] = %.9g, f32 chain %.9g: beyond %.3g", what, r, o,
                         (double)got[r * NO + o], (double)chain, bound);
            }
          }
        same_bytes(what, got, want, (size_t)M * NO, 4);
        dfree(dx);
        dfree(dw);
        dfree(dout);
        free(xf);
        free(wf);
        free(x);
        free(w);
        free(got);
        free(want);
      }
}

/* ---- selective scan ----------------------------------------------------------- */

typedef struct scan_case {
  int N, R, di, T;
  int nseq, nslot;       /* sequences, state slots */
  const int32_t *slots;  /* [nseq]: sequence s's slot */
  mbd_dtype act;
  int64_t M, ldxz, zoff, sstride, nd;
  float *A, *D, *xc, *dbl, *xz, *st; /* host f32 */
  float *dtw_f, *dtb_f;              /* dt_proj weights as widened */
  void *dtw, *dtb;                   /* the same in act */
} scan_case;

/* nseq sequences in the slots of a state of nslot slots. */
static void scan_case_make_n(scan_case *c, int N, int R, int di, int T, mbd_dtype act, int nseq,
                             int nslot, const int32_t *slots, uint64_t *seed) {
  memset(c, 0, sizeof *c);
  c->N = N, c->R = R, c->di = di, c->T = T, c->act = act;
  c->nseq = nseq, c->nslot = nslot, c->slots = slots;
  c->M = (int64_t)nseq * T;
  c->ldxz = 2 * di + 3;
  c->zoff = di;
  c->sstride =
      (int64_t)di * N + 4; /* a multiple of 4: the decode kernel loads states by 16 bytes */
  c->nd = R + 2 * N;
  c->A = malloc((size_t)di * N * 4);
  for (int64_t i = 0; i < (int64_t)di * N; i++)
    c->A[i] = -mbd_pm_expf(2.0f * 0.5f * (gpu_test_uniform(seed) + 1.0f)); /* A_log in [0, 2] */
  c->D = fillf((size_t)di, seed, -1.0f, 1.0f);
  c->xc = fillf((size_t)c->M * di, seed, -2.0f, 2.0f);
  c->dbl = fillf((size_t)c->M * c->nd, seed, -1.0f, 1.0f);
  c->xz = fillf((size_t)c->M * c->ldxz, seed, -4.0f, 4.0f);
  c->st = fillf((size_t)nslot * c->sstride, seed, -1.0f, 1.0f);
  c->dtw_f = malloc((size_t)di * R * 4);
  c->dtb_f = malloc((size_t)di * 4);
  c->dtw = fill(act, (size_t)di * R, seed, -1.0f, 1.0f, c->dtw_f);
  c->dtb = fill(act, (size_t)di, seed, -3.0f, 0.0f, c->dtb_f);
}

/* NSEQ sequences in the slots k_slots of NSLOT. */
static void scan_case_make(scan_case *c, int N, int R, int di, int T, mbd_dtype act,
                           uint64_t *seed) {
  scan_case_make_n(c, N, R, di, T, act, NSEQ, NSLOT, k_slots, seed);
}

static void scan_case_free(scan_case *c) {
  free(c->A);
  free(c->D);
  free(c->xc);
  free(c->dbl);
  free(c->xz);
  free(c->st);
  free(c->dtw_f);
  free(c->dtb_f);
  free(c->dtw);
  free(c->dtb);
}

/* The reference: per sequence and step, dt_raw = (fmaf chain from 0 over k
 * of round_act(dt_low[k]) * dt_w[c, k]) + dt_b[c], then mbd_cpu_scan_step on
 * the sequence's slot, y rounded to act. Updates c->st; y in act. When xcs
 * is not NULL it replaces c->xc as the scan's input x. */
static void scan_ref(scan_case *c, const float *xcs, void *y) {
  float *dt_raw = malloc((size_t)c->di * 4), *out = malloc((size_t)c->di * 4);
  for (int s = 0; s < c->nseq; s++)
    for (int t = 0; t < c->T; t++) {
      int64_t r = (int64_t)s * c->T + t;
      const float *row = c->dbl + r * c->nd;
      for (int ch = 0; ch < c->di; ch++) {
        float v = 0.0f;
        for (int k = 0; k < c->R; k++)
          v = fmaf(round_to(c->act, row[k]), c->dtw_f[ch * c->R + k], v);
        dt_raw[ch] = v + c->dtb_f[ch];
      }
      mbd_cpu_scan_step(MBD_CPU_ISA_PORTABLE, 0, c->di, c->N, c->A, c->D, dt_raw, row + c->R,
                        row + c->R + c->N, (xcs ? xcs : c->xc) + r * c->di,
                        c->xz + r * c->ldxz + c->zoff, c->st + (int64_t)c->slots[s] * c->sstride,
                        out);
      for (int ch = 0; ch < c->di; ch++) store(c->act, y, (size_t)(r * c->di + ch), out[ch]);
    }
  free(dt_raw);
  free(out);
}

static void test_scan(void **state) {
  (void)state;
  uint64_t seed = 15;
  const int Ns[] = {4, 8, 16, 32};
  const int Ts[] = {1, 5, 37}; /* 1: the decode kernel; 37: three chunks of 16 steps */
  const int Rs[] = {1, 4, 5}; /* 4: di * R a multiple of 4 or 8, the decode kernel's vector loads */
  for (size_t ni = 0; ni < 4; ni++)
    for (int q = 0; q < N_DINNER; q++)
      for (size_t ti = 0; ti < 3; ti++)
        for (size_t ri = 0; ri < 3; ri++)
          for (int a = 0; a < N_ACT; a++) {
            scan_case c;
            scan_case_make(&c, Ns[ni], Rs[ri], k_dinner[q], Ts[ti], k_act[a], &seed);
            size_t es = dsize(c.act), ny = (size_t)c.M * c.di;
            float *dA = dput(c.A, (size_t)c.di * c.N * 4), *dD = dput(c.D, (size_t)c.di * 4);
            float *dxc = dput(c.xc, ny * 4), *ddbl = dput(c.dbl, (size_t)c.M * c.nd * 4);
            float *dxz = dput(c.xz, (size_t)c.M * c.ldxz * 4);
            float *dst = dput(c.st, (size_t)NSLOT * c.sstride * 4);
            void *dtw = dput(c.dtw, (size_t)c.di * c.R * es), *dtb = dput(c.dtb, (size_t)c.di * es);
            int32_t *dsl = dput(k_slots, sizeof k_slots);
            void *dy = dzero(ny * es);
            OP(mbd_mops_scan(g_stream, NSEQ, c.T, c.di, c.N, c.R, dxc, ddbl, c.act, dtw, dtb, dA,
                             dD, dxz, c.ldxz, c.zoff, dst, c.sstride, dsl, NULL, c.act, dy, &err));
            void *gy = malloc(ny * es), *ry = malloc(ny * es);
            float *gst = malloc((size_t)NSLOT * c.sstride * 4);
            dget(gy, dy, ny * es);
            dget(gst, dst, (size_t)NSLOT * c.sstride * 4);
            scan_ref(&c, NULL, ry);
            char what[96];
            snprintf(what, sizeof what, "scan N=%d R=%d di=%d T=%d %s", c.N, c.R, c.di, c.T,
                     mbd_dtype_name(c.act));
            same_bytes(what, gy, ry, ny, es);
            same_bytes(what, gst, c.st, (size_t)NSLOT * c.sstride, 4);
            dfree(dA);
            dfree(dD);
            dfree(dxc);
            dfree(ddbl);
            dfree(dxz);
            dfree(dst);
            dfree(dtw);
            dfree(dtb);
            dfree(dsl);
            dfree(dy);
            free(gy);
            free(ry);
            free(gst);
            scan_case_free(&c);
          }
  /* d_state 64 and a weight dtype other than act are refused */
  mbd_error err = {0};
  assert_int_equal(
      mbd_mops_scan(g_stream, 1, 1, 37, 64, 5, NULL, NULL, MBD_DTYPE_F32, NULL, NULL, NULL, NULL,
                    NULL, 80, 37, NULL, 0, NULL, NULL, MBD_DTYPE_F32, NULL, &err),
      MBD_E_INVALID);
  assert_int_equal(
      mbd_mops_scan(g_stream, 1, 1, 37, 16, 5, NULL, NULL, MBD_DTYPE_F32, NULL, NULL, NULL, NULL,
                    NULL, 80, 37, NULL, 0, NULL, NULL, MBD_DTYPE_BF16, NULL, &err),
      MBD_E_INVALID);
}

/* The decode step at many sequences, against the CPU: on a 132-SM device
 * (N <= 16), the batch sizes at which the kernel runs one sequence per block
 * with the staged weights (40), the streaming kernel with ranges of one (60
 * at R = 128, whose staged weights fit only 3 blocks per SM), two (150),
 * three or four (300) and ten sequences per block (1000: dt chains eight at
 * a time, then the rest); the last scan block part-filled (di = 1100: 76
 * live channels of 128, whole warps past di; di = 257; di = 1000: three
 * whole warps and one of 8 live channels); the 1.4b decode at batch 256
 * (di = 4096, R = 128: full groups of eight and short ones, and at d_state
 * 16 with 16-bit activations the form wide d_inner picks); R = 5 (element
 * loads of the dt_proj row), 16, 40 and 128 (16-byte loads); distinct
 * slots, in reverse order. */
static void test_scan_batch(void **state) {
  (void)state;
  uint64_t seed = 18;
  static const int cases[][3] = {/* di, nseq, R */
                                 {1100, 40, 5},    {1100, 60, 128},  {1100, 150, 5},
                                 {1100, 300, 5},   {1100, 1000, 16}, {257, 1000, 16},
                                 {1000, 37, 40},   {4096, 256, 128}};
  const int Ns[] = {4, 16, 32};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
    for (size_t ni = 0; ni < 3; ni++)
      for (int a = 0; a < N_ACT; a++) {
        const int di = cases[ci][0], ns = cases[ci][1], nslot = ns + 1;
        int32_t *slots = malloc((size_t)ns * sizeof *slots);
        for (int s = 0; s < ns; s++) slots[s] = ns - s; /* distinct, reversed */
        scan_case c;
        scan_case_make_n(&c, Ns[ni], cases[ci][2], di, 1, k_act[a], ns, nslot, slots, &seed);
        size_t es = dsize(c.act), ny = (size_t)c.M * c.di;
        float *dA = dput(c.A, (size_t)c.di * c.N * 4), *dD = dput(c.D, (size_t)c.di * 4);
        float *dxc = dput(c.xc, ny * 4), *ddbl = dput(c.dbl, (size_t)c.M * c.nd * 4);
        float *dxz = dput(c.xz, (size_t)c.M * c.ldxz * 4);
        float *dst = dput(c.st, (size_t)nslot * c.sstride * 4);
        void *dtw = dput(c.dtw, (size_t)c.di * c.R * es), *dtb = dput(c.dtb, (size_t)c.di * es);
        int32_t *dsl = dput(slots, (size_t)ns * sizeof *slots);
        void *dy = dzero(ny * es);
        OP(mbd_mops_scan(g_stream, ns, 1, c.di, c.N, c.R, dxc, ddbl, c.act, dtw, dtb, dA, dD,
                         dxz, c.ldxz, c.zoff, dst, c.sstride, dsl, NULL, c.act, dy, &err));
        void *gy = malloc(ny * es), *ry = malloc(ny * es);
        float *gst = malloc((size_t)nslot * c.sstride * 4);
        dget(gy, dy, ny * es);
        dget(gst, dst, (size_t)nslot * c.sstride * 4);
        scan_ref(&c, NULL, ry);
        char what[96];
        snprintf(what, sizeof what, "scan step N=%d R=%d di=%d nseq=%d %s", c.N, c.R, c.di, ns,
                 mbd_dtype_name(c.act));
        same_bytes(what, gy, ry, ny, es);
        same_bytes(what, gst, c.st, (size_t)nslot * c.sstride, 4);
        dfree(dA);
        dfree(dD);
        dfree(dxc);
        dfree(ddbl);
        dfree(dxz);
        dfree(dst);
        dfree(dtw);
        dfree(dtb);
        dfree(dsl);
        dfree(dy);
        free(gy);
        free(ry);
        free(gst);
        scan_case_free(&c);
        free(slots);
      }
}

/* One prefill over c's inputs (its state copied in, not changed); y and the
 * state out in gy, gst. how: 0 mbd_mops_scan as the model calls it, 1 the
 * same with MBD_SCAN_PREFILL=old (scan.cu's k_scan), 2 each sequence's steps
 * one at a time (the decode kernel, T = 1 each). */
static void scan_prefill_run(const scan_case *c, int how, void *gy, float *gst) {
  size_t es = dsize(c->act), ny = (size_t)c->M * c->di, sb = (size_t)c->nslot * c->sstride * 4;
  float *dA = dput(c->A, (size_t)c->di * c->N * 4), *dD = dput(c->D, (size_t)c->di * 4);
  float *dxc = dput(c->xc, ny * 4), *ddbl = dput(c->dbl, (size_t)c->M * c->nd * 4);
  float *dxz = dput(c->xz, (size_t)c->M * c->ldxz * 4);
  float *dst = dput(c->st, sb);
  void *dtw = dput(c->dtw, (size_t)c->di * c->R * es), *dtb = dput(c->dtb, (size_t)c->di * es);
  int32_t *dsl = dput(c->slots, (size_t)c->nseq * sizeof *c->slots);
  char *dy = dzero(ny * es);
  if (how == 1) setenv("MBD_SCAN_PREFILL", "old", 1);
  if (how < 2)
    OP(mbd_mops_scan(g_stream, c->nseq, c->T, c->di, c->N, c->R, dxc, ddbl, c->act, dtw, dtb, dA,
                     dD, dxz, c->ldxz, c->zoff, dst, c->sstride, dsl, NULL, c->act, dy, &err));
  else
    for (int q = 0; q < c->nseq; q++)
      for (int t = 0; t < c->T; t++) {
        int64_t r = (int64_t)q * c->T + t;
        OP(mbd_mops_scan(g_stream, 1, 1, c->di, c->N, c->R, dxc + r * c->di, ddbl + r * c->nd,
                         c->act, dtw, dtb, dA, dD, dxz + r * c->ldxz, c->ldxz, c->zoff, dst,
                         c->sstride, dsl + q, NULL, c->act, dy + (size_t)r * c->di * es, &err));
      }
  unsetenv("MBD_SCAN_PREFILL");
  dget(gy, dy, ny * es);
  dget(gst, dst, sb);
  dfree(dA);
  dfree(dD);
  dfree(dxc);
  dfree(ddbl);
  dfree(dxz);
  dfree(dst);
  dfree(dtw);
  dfree(dtb);
  dfree(dsl);
  dfree(dy);
}

/* The prefill kernel (scan_prefill.cu: d_state 8 and 16, dt rank a multiple
 * of 4; d_state 4 stays on k_scan, a control) by memcmp against the CPU, the
 * old chunked kernel and the decode kernel stepped T times: T = 2, 3 (less
 * than a chunk), 31, 33, 70 (chunks of 32 steps, the last part-filled);
 * d_inner 37 and 257 (blocks of 16 channels, the last part-filled); R = 4,
 * 12, 128; three sequences in permuted slots; every activation dtype. Every
 * other case has A scaled by 30 and z by 40, so that some exp arguments
 * leave the short exp path's range (|x| < 86) and take mbd_pm_expf's. */
static void test_scan_prefill(void **state) {
  (void)state;
  uint64_t seed = 23;
  const int Ns[] = {8, 16, 4}, Rs[] = {4, 12, 128}, Ts[] = {2, 3, 31, 33, 70}, dis[] = {37, 257};
  int wide = 0;
  for (size_t ni = 0; ni < 3; ni++)
    for (size_t ri = 0; ri < 3; ri++)
      for (size_t ti = 0; ti < 5; ti++)
        for (size_t q = 0; q < 2; q++)
          for (int a = 0; a < N_ACT; a++, wide ^= 1) {
            scan_case c;
            scan_case_make(&c, Ns[ni], Rs[ri], dis[q], Ts[ti], k_act[a], &seed);
            if (wide) {
              for (int64_t i = 0; i < (int64_t)c.di * c.N; i++) c.A[i] *= 30.0f;
              for (int64_t i = 0; i < c.M * c.ldxz; i++) c.xz[i] *= 40.0f;
            }
            size_t es = dsize(c.act), ny = (size_t)c.M * c.di, ns = (size_t)NSLOT * c.sstride;
            void *ry = malloc(ny * es), *gy = malloc(ny * es);
            float *st0 = malloc(ns * 4), *rst = malloc(ns * 4), *gst = malloc(ns * 4);
            memcpy(st0, c.st, ns * 4);
            char what[112];
            /* the model's path (ry, rst) against the CPU (which advances c.st) */
            scan_prefill_run(&c, 0, ry, rst);
            scan_ref(&c, NULL, gy);
            snprintf(what, sizeof what, "scan prefill N=%d R=%d di=%d T=%d %s%s vs CPU", c.N,
                     c.R, c.di, c.T, mbd_dtype_name(c.act), wide ? " wide" : "");
            same_bytes(what, ry, gy, ny, es);
            same_bytes(what, rst, c.st, ns, 4);
            for (int how = 1; how < 3; how++) {
              memcpy(c.st, st0, ns * 4);
              scan_prefill_run(&c, how, gy, gst);
              snprintf(what, sizeof what, "scan prefill N=%d R=%d di=%d T=%d %s%s vs %s", c.N,
                       c.R, c.di, c.T, mbd_dtype_name(c.act), wide ? " wide" : "",
                       how == 1 ? "MBD_SCAN_PREFILL=old" : "decode steps");
              same_bytes(what, ry, gy, ny, es);
              same_bytes(what, rst, gst, ns, 4);
            }
            free(ry);
            free(gy);
            free(st0);
            free(rst);
            free(gst);
            scan_case_free(&c);
          }
}

/* ---- the Mamba-2 recurrence --------------------------------------------------- */

/* One mbd_mops_ssd_scan case: H heads x P, d_state N, G groups, nseq
 * sequences of T steps in permuted slots of a padded stride. */
typedef struct ssd_case {
  int H, P, N, G, nseq, T;
} ssd_case;

/* GPU f32 == mbd_cpu_ssd_step token by token (memcmp of y and of every
 * slot's state), in one launch and in two (split at T1), over shapes that
 * take each lane split of the kernel: one to eight lanes per channel with
 * whole entries, four channels per lane (prefills of 8192 rows and more),
 * partial lanes (d_state 1, 24, 200), d_state 256, head_dim
 * not a multiple of the block's rows, chunk boundaries, T = 1 and short
 * launches (the state tile of its own), and odd slot and row strides (no
 * vector state access, no float4 B/C loads) beside multiples of four;
 * launches of 64 tokens and more, which go to the chunked kernel; and
 * prefills of many rows, which go to the prefill kernel. */
static void test_ssd_scan(void **state) {
  (void)state;
  static const ssd_case cases[] = {
      {3, 5, 16, 1, 2, 70},  {4, 7, 24, 2, 3, 33},   {2, 64, 128, 1, 1, 130},
      {8, 64, 128, 2, 40, 3}, {4, 64, 128, 1, 40, 2}, {2, 33, 200, 1, 2, 20},
      {2, 128, 256, 2, 1, 5}, {4, 64, 32, 1, 5, 1},   {1, 1, 1, 1, 1, 3},
      {6, 9, 64, 3, 3, 65},  {4, 64, 128, 1, 6, 1},  {2, 16, 48, 1, 2, 4},
      {8, 64, 128, 2, 40, 1}, {4, 64, 64, 2, 32, 40},  {2, 64, 128, 1, 64, 70},
      {2, 64, 128, 1, 64, 17}, {4, 64, 64, 2, 32, 40}, {3, 5, 16, 1, 2, 7},
      {2, 128, 16, 1, 32, 16}, {4, 64, 128, 1, 64, 6}, {4, 64, 128, 1, 64, 6},
      /* the chunked kernel (ssd_chunk.cu; 64 tokens and more, fewer than
       * 8192 rows): around its thresholds, partial last chunks, d_state 8 to
       * 256 (pieces of 8 entries, 200 and 24 giving odd piece counts, 8 a
       * single piece), one channel per thread and two (larger launches, even
       * head_dim; the 130m shape at one sequence takes one, 1.3b two; the
       * choice follows the SM count, 132 on the H200), groups, blocks that
       * span heads and end inside a group */
      {2, 64, 128, 1, 1, 63},  {2, 64, 128, 1, 1, 64},  {2, 64, 128, 1, 1, 65},
      {3, 64, 64, 3, 3, 200},  {2, 64, 256, 2, 1, 200}, {4, 64, 16, 2, 8, 100},
      {2, 64, 128, 1, 1, 2048}, {1, 64, 128, 1, 3, 1003}, {4, 33, 128, 2, 8, 257},
      {2, 5, 24, 1, 3, 77},    {1, 64, 200, 1, 1, 64},  {24, 64, 128, 1, 8, 130},
      {24, 64, 128, 1, 3, 70}, {64, 64, 128, 1, 1, 80}, {2, 7, 48, 2, 2, 129},
      {24, 64, 64, 2, 8, 70},  {16, 64, 256, 4, 8, 65}, {4, 64, 8, 1, 2, 66},
      {24, 64, 128, 1, 1, 96}, {12, 66, 128, 2, 4, 70}, {32, 64, 256, 1, 3, 70},
      {60, 33, 256, 2, 2, 66},
      /* the prefill kernel (ssd_prefill.cu; 16 tokens and more over 8192
       * rows and more, d_state 64/128/256, head_dim a multiple of 16): the
       * 130m shape at batch 8 and 6 as the model cuts them (256 and 341
       * tokens), tokens not a multiple of its 8-token chunks (and fewer
       * than the pipeline's lanes past a chunk), batches 2 to 64, groups,
       * head_dim 32, 48, 80 and 128 (other channels per block), odd and
       * even strides */
      {24, 64, 128, 1, 8, 256}, {24, 64, 128, 1, 6, 341}, {16, 64, 64, 4, 9, 37},
      {8, 128, 128, 2, 8, 23},  {4, 32, 256, 2, 64, 33},  {64, 64, 128, 8, 2, 50},
      {6, 48, 128, 3, 30, 29},  {4, 80, 64, 2, 26, 45},   {64, 64, 128, 1, 3, 18},
      {32, 64, 256, 2, 4, 34},  {128, 64, 64, 2, 2, 41},  {24, 64, 128, 1, 9, 16},
      /* .. with eight channels a lane (d_state 128, 2.2M state entries and
       * more on the H200's 132 SMs): lanes 15 tokens behind, over chunk
       * boundaries and short launches, groups, head_dim 128 */
      {64, 64, 128, 1, 5, 40},  {48, 64, 128, 4, 6, 27},  {32, 128, 128, 2, 5, 19},
  };
  uint64_t seed = 31;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
    for (int split = 0; split < 2; split++) {
      const ssd_case *c = &cases[ci];
      const int H = c->H, P = c->P, N = c->N, G = c->G, ns = c->nseq, T = c->T;
      const int64_t di = (int64_t)H * P, cd = di + 2 * (int64_t)G * N;
      const int64_t ld_x = cd + (ci % 2 ? 3 : 4), ld_dt = H + 2, M = (int64_t)ns * T;
      const int64_t per = di * N, stride = per + (ci % 2 ? 1 : 4), nslot = ns + 2;
      float *A = fillf((size_t)H, &seed, -2.0f, -0.05f), *D = fillf((size_t)H, &seed, -1, 1);
      float *bias = fillf((size_t)H, &seed, -1, 1);
      float *dtr = fillf((size_t)(M * ld_dt), &seed, -3, 1);
      float *xbc = fillf((size_t)(M * ld_x), &seed, -1, 1);
      float *st0 = fillf((size_t)(nslot * stride), &seed, -0.5f, 0.5f);
      const float lo = ci % 3 ? 0.0f : 0.01f, hi = ci % 3 ? INFINITY : 0.1f;
      int32_t *slots = malloc((size_t)ns * 4);
      for (int s = 0; s < ns; s++) slots[s] = (int32_t)(ns + 1 - s); /* reversed, 0 and 1 unused */
      /* CPU reference */
      float *rst = malloc((size_t)(nslot * stride) * 4), *ry = malloc((size_t)(M * di) * 4);
      memcpy(rst, st0, (size_t)(nslot * stride) * 4);
      const mbd_ssd_dims cdm = {H, P, N, G};
      for (int s = 0; s < ns; s++)
        for (int t = 0; t < T; t++) {
          const int64_t row = (int64_t)s * T + t;
          const float *xr = xbc + row * ld_x;
          mbd_cpu_ssd_step(MBD_CPU_ISA_PORTABLE, &cdm, 0, H, A, D, bias, lo, hi, dtr + row * ld_dt,
                           xr + di, xr + di + (int64_t)G * N, xr,
                           rst + (int64_t)slots[s] * stride, ry + row * di);
        }
      /* GPU: one launch, or two of T1 and T - T1 steps */
      const int T1 = split && T > 1 ? T / 2 + 1 : T;
      const int cut[3] = {0, T1, T};
      float *dA = dput(A, (size_t)H * 4), *dD = dput(D, (size_t)H * 4);
      float *dbias = dput(bias, (size_t)H * 4), *dst = dput(st0, (size_t)(nslot * stride) * 4);
      int32_t *dsl = dput(slots, (size_t)ns * 4);
      float *gy = malloc((size_t)(M * di) * 4);
      const mbd_mops_ssd_dims gdm = {H, P, N, G};
      for (int k = 0; k < 2; k++) {
        const int t0 = cut[k], tn = cut[k + 1] - cut[k];
        if (!tn) continue;
        const int64_t m = (int64_t)ns * tn;
        float *hx = malloc((size_t)(m * ld_x) * 4), *hd = malloc((size_t)(m * ld_dt) * 4);
        for (int s = 0; s < ns; s++) {
          memcpy(hx + (int64_t)s * tn * ld_x, xbc + ((int64_t)s * T + t0) * ld_x,
                 (size_t)(tn * ld_x) * 4);
          memcpy(hd + (int64_t)s * tn * ld_dt, dtr + ((int64_t)s * T + t0) * ld_dt,
                 (size_t)(tn * ld_dt) * 4);
        }
        float *dx = dput(hx, (size_t)(m * ld_x) * 4), *ddt = dput(hd, (size_t)(m * ld_dt) * 4);
        float *dy = dzero((size_t)(m * di) * 4), *part = malloc((size_t)(m * di) * 4);
        OP(mbd_mops_ssd_scan(g_stream, ns, tn, &gdm, dA, dD, dbias, lo, hi, ddt, ld_dt, dx, ld_x,
                             dst, stride, dsl, dy, &err));
        dget(part, dy, (size_t)(m * di) * 4);
        for (int s = 0; s < ns; s++)
          memcpy(gy + ((int64_t)s * T + t0) * di, part + (int64_t)s * tn * di,
                 (size_t)(tn * di) * 4);
        dfree(dx);
        dfree(ddt);
        dfree(dy);
        free(part);
        free(hx);
        free(hd);
      }
      float *gst = malloc((size_t)(nslot * stride) * 4);
      dget(gst, dst, (size_t)(nslot * stride) * 4);
      char what[128];
      snprintf(what, sizeof what, "ssd_scan H=%d P=%d N=%d G=%d nseq=%d T=%d split %d y", H, P,
               N, G, ns, T, T1);
      same_bytes(what, gy, ry, (size_t)(M * di), 4);
      snprintf(what, sizeof what, "ssd_scan H=%d P=%d N=%d G=%d nseq=%d T=%d split %d state", H,
               P, N, G, ns, T, T1);
      same_bytes(what, gst, rst, (size_t)(nslot * stride), 4);
      dfree(dA);
      dfree(dD);
      dfree(dbias);
      dfree(dst);
      dfree(dsl);
      free(gst);
      free(gy);
      free(rst);
      free(ry);
      free(slots);
      free(A);
      free(D);
      free(bias);
      free(dtr);
      free(xbc);
      free(st0);
    }
  /* d_state above the limit is refused */
  mbd_error err = {0};
  const mbd_mops_ssd_dims big = {2, 4, MBD_MOPS_SSD_MAX_STATE + 1, 1};
  assert_int_equal(mbd_mops_ssd_scan(g_stream, 1, 1, &big, NULL, NULL, NULL, 0, 1, NULL, 2, NULL,
                                     8, NULL, 0, NULL, NULL, &err),
                   MBD_E_INVALID);
}

/* mbd_mops_ssd_scan_bf16state over T tokens in one launch (64 and more:
 * the chunked kernel; 8192 rows and more: the prefill kernel) == the same
 * tokens one launch each (the decode step
 * of ssd_scan.cu), by memcmp of y and of the bf16 states, in permuted
 * slots, one channel and two per thread, blocks across heads, groups; the
 * one-token launches as the launch picks (k_ssd_step_rows from 4 tiles an
 * SM), then under MBD_SSD=spb1 (the other decode kernels: k_ssd_scan, one
 * sequence a block) and MBD_SSD=rows (k_ssd_step_rows at every count:
 * d_state 128, head_dim a multiple of 32, blocks of 64 or 32 rows). */
static void test_ssd_scan_bf16state(void **state) {
  (void)state;
  static const ssd_case cases[] = {
      {2, 64, 128, 1, 1, 70}, {4, 33, 128, 2, 3, 65}, {24, 64, 128, 1, 1, 96},
      {12, 66, 128, 2, 4, 70}, {2, 5, 24, 1, 2, 67},
      /* the prefill kernel (ssd_prefill.cu: 8192 rows and more) */
      {24, 64, 128, 1, 8, 70}, {16, 64, 64, 4, 9, 37}, {4, 32, 256, 2, 64, 33},
      {6, 48, 128, 3, 30, 29}, {64, 64, 128, 8, 2, 25}, {64, 64, 128, 2, 5, 21},
      /* short launches; for MBD_SSD=rows blocks of 32 rows and more tiles
       * than resident blocks */
      {8, 96, 128, 2, 3, 20}, {64, 64, 128, 2, 40, 3},
  };
  uint64_t seed = 77;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const ssd_case *c = &cases[ci];
    const int H = c->H, P = c->P, N = c->N, G = c->G, ns = c->nseq, T = c->T;
    const int64_t di = (int64_t)H * P, cd = di + 2 * (int64_t)G * N, ld_x = cd + 4, ld_dt = H;
    const int64_t M = (int64_t)ns * T, stride = di * N, nslot = ns + 1;
    float *A = fillf((size_t)H, &seed, -2.0f, -0.05f), *D = fillf((size_t)H, &seed, -1, 1);
    float *bias = fillf((size_t)H, &seed, -1, 1);
    float *dtr = fillf((size_t)(M * ld_dt), &seed, -3, 1);
    float *xbc = fillf((size_t)(M * ld_x), &seed, -1, 1);
    float *f0 = fillf((size_t)(nslot * stride), &seed, -0.5f, 0.5f);
    uint16_t *st0 = malloc((size_t)(nslot * stride) * 2);
    for (int64_t i = 0; i < nslot * stride; i++) st0[i] = mbd_f32_to_bf16(f0[i]);
    int32_t *slots = malloc((size_t)ns * 4);
    for (int s = 0; s < ns; s++) slots[s] = (int32_t)(ns - s); /* reversed, 0 unused */
    const mbd_mops_ssd_dims dm = {H, P, N, G};
    float *dA = dput(A, (size_t)H * 4), *dD = dput(D, (size_t)H * 4);
    float *dbias = dput(bias, (size_t)H * 4);
    int32_t *dsl = dput(slots, (size_t)ns * 4);
    const size_t sb = (size_t)(nslot * stride) * 2;
    void *sc[4] = {dput(st0, sb), dput(st0, sb), dput(st0, sb), dput(st0, sb)};
    float *dy[2] = {dzero((size_t)(M * di) * 4), dzero((size_t)(M * di) * 4)};
    /* one launch of T tokens (rows s * T + t) */
    float *dx = dput(xbc, (size_t)(M * ld_x) * 4), *ddt = dput(dtr, (size_t)(M * ld_dt) * 4);
    OP(mbd_mops_ssd_scan_bf16state(g_stream, ns, T, &dm, dA, dD, dbias, 0.0f, INFINITY, ddt,
                                   ld_dt, dx, ld_x, sc[0], stride, dsl, dy[0], &err));
    /* T launches of one token each (rows of token t gathered per sequence) */
    float *hx = malloc((size_t)(ns * ld_x) * 4), *hd = malloc((size_t)(ns * ld_dt) * 4);
    float *dx1 = dzero((size_t)(ns * ld_x) * 4), *dd1 = dzero((size_t)(ns * ld_dt) * 4);
    float *dy1 = dzero((size_t)(ns * di) * 4), *hy = malloc((size_t)(ns * di) * 4);
    float *gy = malloc((size_t)(M * di) * 4), *ry = malloc((size_t)(M * di) * 4);
    dget(gy, dy[0], (size_t)(M * di) * 4);
    uint16_t *g0 = malloc((size_t)(nslot * stride) * 2), *g1 = malloc((size_t)(nslot * stride) * 2);
    dget(g0, sc[0], (size_t)(nslot * stride) * 2);
    static const char *const pass_env[3] = {NULL, "spb1", "rows"};
    for (int pass = 0; pass < 3; pass++) {
      if (pass_env[pass]) setenv("MBD_SSD", pass_env[pass], 1);
      for (int t = 0; t < T; t++) {
        for (int s = 0; s < ns; s++) {
          memcpy(hx + s * ld_x, xbc + ((int64_t)s * T + t) * ld_x, (size_t)ld_x * 4);
          memcpy(hd + s * ld_dt, dtr + ((int64_t)s * T + t) * ld_dt, (size_t)ld_dt * 4);
        }
        CK(cudaMemcpy(dx1, hx, (size_t)(ns * ld_x) * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dd1, hd, (size_t)(ns * ld_dt) * 4, cudaMemcpyHostToDevice));
        OP(mbd_mops_ssd_scan_bf16state(g_stream, ns, 1, &dm, dA, dD, dbias, 0.0f, INFINITY, dd1,
                                       ld_dt, dx1, ld_x, sc[1 + pass], stride, dsl, dy1, &err));
        dget(hy, dy1, (size_t)(ns * di) * 4);
        for (int s = 0; s < ns; s++)
          memcpy(ry + ((int64_t)s * T + t) * di, hy + s * di, (size_t)di * 4);
      }
      unsetenv("MBD_SSD");
      dget(g1, sc[1 + pass], (size_t)(nslot * stride) * 2);
      char what[128];
      snprintf(what, sizeof what, "ssd_scan_bf16state H=%d P=%d N=%d G=%d nseq=%d T=%d y %s", H,
               P, N, G, ns, T, pass_env[pass] ? pass_env[pass] : "");
      same_bytes(what, gy, ry, (size_t)(M * di), 4);
      snprintf(what, sizeof what, "ssd_scan_bf16state H=%d P=%d N=%d G=%d nseq=%d T=%d state %s",
               H, P, N, G, ns, T, pass_env[pass] ? pass_env[pass] : "");
      same_bytes(what, g0, g1, (size_t)(nslot * stride), 2);
    }
    dfree(dA);
    dfree(dD);
    dfree(dbias);
    dfree(dsl);
    dfree(sc[0]);
    dfree(sc[1]);
    dfree(sc[2]);
    dfree(sc[3]);
    dfree(dy[0]);
    dfree(dy[1]);
    dfree(dx);
    dfree(ddt);
    dfree(dx1);
    dfree(dd1);
    dfree(dy1);
    free(hx);
    free(hd);
    free(hy);
    free(gy);
    free(ry);
    free(g0);
    free(g1);
    free(st0);
    free(f0);
    free(slots);
    free(A);
    free(D);
    free(bias);
    free(dtr);
    free(xbc);
  }
}

/* mbd_mops_ssd_scan_conv (decode step, conv folded in) == mbd_mops_conv_silu
 * then mbd_mops_ssd_scan (memcmp of y, the recurrent states and the conv
 * windows), two steps in a row (the group tickets are left zero), over
 * groups, conv widths 2/4/7 with and without bias, partial lanes and
 * head_dim not a multiple of the block's rows. */
static void test_ssd_scan_conv(void **state) {
  (void)state;
  static const int cases[][6] = {/* H, P, N, G, nseq, K */
                                 {4, 16, 16, 2, 3, 4},  {24, 64, 128, 1, 1, 4}, {24, 64, 128, 1, 8, 7},
                                 {3, 5, 32, 1, 2, 2},   {2, 33, 200, 1, 2, 4},  {4, 64, 64, 2, 16, 4},
                                 {6, 9, 24, 3, 5, 3}};
  uint64_t seed = 41;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int H = cases[ci][0], P = cases[ci][1], N = cases[ci][2], G = cases[ci][3];
    const int ns = cases[ci][4], K = cases[ci][5];
    const int64_t di = (int64_t)H * P, cd = di + 2 * (int64_t)G * N, pin = di + cd + H;
    const int64_t sstride = di * N + 4, cstride = (K - 1) * cd, nslot = ns + 2;
    float *zx = fillf((size_t)(ns * pin), &seed, -1, 1);
    float *w = fillf((size_t)(K * cd), &seed, -0.5f, 0.5f);
    float *b = ci % 2 ? NULL : fillf((size_t)cd, &seed, -0.5f, 0.5f);
    float *A = fillf((size_t)H, &seed, -2.0f, -0.05f), *D = fillf((size_t)H, &seed, -1, 1);
    float *bias = fillf((size_t)H, &seed, -1, 1);
    float *ss0 = fillf((size_t)(nslot * sstride), &seed, -0.5f, 0.5f);
    float *cs0 = fillf((size_t)(nslot * cstride), &seed, -1, 1);
    int32_t slots[16];
    for (int s = 0; s < ns; s++) slots[s] = (int32_t)(ns + 1 - s);
    float *dzx = dput(zx, (size_t)(ns * pin) * 4), *dw = dput(w, (size_t)(K * cd) * 4);
    float *db = b ? dput(b, (size_t)cd * 4) : NULL;
    float *dA = dput(A, (size_t)H * 4), *dD = dput(D, (size_t)H * 4);
    float *dbias = dput(bias, (size_t)H * 4);
    int32_t *dsl = dput(slots, (size_t)ns * 4), *dtk = dzero((size_t)(ns * G) * 4);
    float *ss[2], *cs[2], *yy[2];
    for (int v = 0; v < 2; v++) {
      ss[v] = dput(ss0, (size_t)(nslot * sstride) * 4);
      cs[v] = dput(cs0, (size_t)(nslot * cstride) * 4);
      yy[v] = dzero((size_t)(ns * di) * 4);
    }
    float *dxbc = dzero((size_t)(ns * cd) * 4);
    const mbd_mops_ssd_dims dm = {H, P, N, G};
    const mbd_mops_ssd_conv cv = {K, dw, db, cs[1], cstride, dzx + di, pin, dtk};
    for (int step = 0; step < 2; step++) {
      OP(mbd_mops_conv_silu(g_stream, ns, 1, (int)cd, K, dzx + di, pin, dw, db, cs[0], cstride,
                            dsl, dxbc, MBD_DTYPE_F32, NULL, &err));
      OP(mbd_mops_ssd_scan(g_stream, ns, 1, &dm, dA, dD, dbias, 0.0f, INFINITY, dzx + di + cd,
                           pin, dxbc, cd, ss[0], sstride, dsl, yy[0], &err));
      OP(mbd_mops_ssd_scan_conv(g_stream, ns, &dm, dA, dD, dbias, 0.0f, INFINITY, dzx + di + cd,
                                pin, &cv, ss[1], sstride, dsl, yy[1], &err));
      const size_t n[3] = {(size_t)(ns * di), (size_t)(nslot * sstride), (size_t)(nslot * cstride)};
      float *d0[3] = {yy[0], ss[0], cs[0]}, *d1[3] = {yy[1], ss[1], cs[1]};
      static const char *const what[3] = {"y", "state", "conv window"};
      for (int q = 0; q < 3; q++) {
        float *h0 = malloc(n[q] * 4), *h1 = malloc(n[q] * 4);
        dget(h0, d0[q], n[q] * 4);
        dget(h1, d1[q], n[q] * 4);
        char msg[128];
        snprintf(msg, sizeof msg, "ssd_scan_conv H=%d P=%d N=%d G=%d nseq=%d K=%d step %d %s", H,
                 P, N, G, ns, K, step, what[q]);
        same_bytes(msg, h1, h0, n[q], 4);
        free(h0);
        free(h1);
      }
      int32_t tk[64];
      dget(tk, dtk, (size_t)(ns * G) * 4);
      for (int i = 0; i < ns * G; i++) assert_int_equal(tk[i], 0);
    }
    for (int v = 0; v < 2; v++) {
      dfree(ss[v]);
      dfree(cs[v]);
      dfree(yy[v]);
    }
    dfree(dxbc);
    dfree(dzx);
    dfree(dw);
    dfree(db);
    dfree(dA);
    dfree(dD);
    dfree(dbias);
    dfree(dsl);
    dfree(dtk);
    free(zx);
    free(w);
    free(b);
    free(A);
    free(D);
    free(bias);
    free(ss0);
    free(cs0);
  }
  mbd_error err = {0};
  const mbd_mops_ssd_dims dm = {2, 4, 16, 1};
  const mbd_mops_ssd_conv bad = {9, NULL, NULL, NULL, 0, NULL, 0, NULL};
  assert_int_equal(mbd_mops_ssd_scan_conv(g_stream, 1, &dm, NULL, NULL, NULL, 0, 1, NULL, 2, &bad,
                                          NULL, 0, NULL, NULL, &err),
                   MBD_E_INVALID);
}

/* The 16-bit routes' gated norm: mbd_cpu_gated_rmsnorm with each group's
 * square sum split as rms_inv_lanes (docs/route.md). */
static void gated_rmsnorm_lanes(const float *y, const float *z, const float *w, int n, int group,
                                float eps, bool norm_before_gate, float *out) {
  for (int g0 = 0; g0 < n; g0 += group) {
    for (int i = g0; i < g0 + group; i++)
      out[i] = norm_before_gate ? y[i] : y[i] * mbd_pm_silu(z[i]);
    const float r = rms_inv_lanes(out + g0, group, eps);
    for (int i = g0; i < g0 + group; i++) {
      const float v = w[i] * (out[i] * r);
      out[i] = norm_before_gate ? v * mbd_pm_silu(z[i]) : v;
    }
  }
}

/* mbd_mops_gated_rmsnorm per row against mbd_cpu_gated_rmsnorm (f32) or
 * its lane-split twin (16-bit outputs: the f32 value rounded to nearest
 * even), memcmp; groups whole rows or parts of them, sizes with and without
 * a tail past the kernels' batches of squares, both gate orders. */
static void test_gated_rmsnorm(void **state) {
  (void)state;
  static const int shapes[][2] = {{1536, 1536}, {512, 256}, {96, 48}, {37, 37},
                                  {4096, 4096}, {4096, 512}, {90, 30}, {8192, 128}};
  enum { M = 5 };
  uint64_t seed = 51;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int nbg = 0; nbg < 2; nbg++)
      for (int a = 0; a < N_ACT; a++) {
        const int n = shapes[si][0], group = shapes[si][1];
        const int64_t ldz = n + 3;
        const mbd_dtype act = k_act[a];
        float *y = fillf((size_t)(M * n), &seed, -2, 2), *z = fillf((size_t)(M * ldz), &seed, -3, 3);
        float *w = fillf((size_t)n, &seed, 0.5f, 1.5f), *ref = malloc((size_t)n * 4);
        void *want = malloc((size_t)(M * n) * dsize(act)), *got = malloc((size_t)(M * n) * dsize(act));
        for (int r = 0; r < M; r++) {
          if (act == MBD_DTYPE_F32)
            mbd_cpu_gated_rmsnorm(y + (int64_t)r * n, z + r * ldz, w, n, group, 1e-5f, nbg != 0,
                                  ref);
          else
            gated_rmsnorm_lanes(y + (int64_t)r * n, z + r * ldz, w, n, group, 1e-5f, nbg != 0,
                                ref);
          for (int c = 0; c < n; c++) store(act, want, (size_t)(r * n + c), ref[c]);
        }
        float *dy = dput(y, (size_t)(M * n) * 4), *dz = dput(z, (size_t)(M * ldz) * 4);
        float *dw = dput(w, (size_t)n * 4);
        void *dout = dzero((size_t)(M * n) * dsize(act));
        OP(mbd_mops_gated_rmsnorm(g_stream, M, n, group, dy, dz, ldz, dw, 1e-5f, nbg, act, dout,
                                  &err));
        dget(got, dout, (size_t)(M * n) * dsize(act));
        char what[96];
        snprintf(what, sizeof what, "gated_rmsnorm n=%d group=%d nbg=%d %s", n, group, nbg,
                 mbd_dtype_name(act));
        same_bytes(what, got, want, (size_t)(M * n), dsize(act));
        dfree(dy);
        dfree(dz);
        dfree(dw);
        dfree(dout);
        free(y);
        free(z);
        free(w);
        free(ref);
        free(want);
        free(got);
      }
}

/* ---- the decode fusion: conv + x_proj, then the scan with the conv --------------- */

/* mbd_mops_conv_xproj then mbd_mops_scan with the conv give the bits of
 * conv_silu, x_proj and scan (which the tests above tie to the CPU), for the
 * shapes mbd_mops_conv_fused accepts: T = 1, width 4, bf16/f16. One case:
 * nseq sequences in the slots `slots` of nslot. */
static void conv_fusion_case(mbd_dtype act, int di, int N, int nseq, int nslot,
                             const int32_t *slots, uint64_t *seed) {
  const int K = 4, R = 5;
  scan_case c;
  scan_case_make_n(&c, N, R, di, 1, act, nseq, nslot, slots, seed);
  size_t es = dsize(act), ny = (size_t)nseq * di;
  int NO = R + 2 * N;
  int64_t cstride = (int64_t)(K - 1) * di + 5;
  float *cw = malloc((size_t)K * di * 4), *cb = malloc((size_t)di * 4);
  void *cw16 = fill(act, (size_t)K * di, seed, -0.6f, 0.6f, cw);
  void *cb16 = fill(act, (size_t)di, seed, -0.3f, 0.3f, cb);
  float *cst = fillf((size_t)nslot * cstride, seed, -1.0f, 1.0f);
  void *xw = fill(act, (size_t)NO * di, seed, -1.0f, 1.0f, NULL);
  float *dA = dput(c.A, (size_t)di * N * 4), *dD = dput(c.D, (size_t)di * 4);
  float *dxz = dput(c.xz, (size_t)nseq * c.ldxz * 4);
  void *dtw = dput(c.dtw, (size_t)di * R * es), *dtb = dput(c.dtb, (size_t)di * es);
  int32_t *dsl = dput(slots, (size_t)nseq * sizeof *slots);
  float *dcw = dput(cw, (size_t)K * di * 4), *dcb = dput(cb, (size_t)di * 4);
  void *dxw = dput(xw, (size_t)NO * di * es);
  float *out_st[2], *out_cst[2];
  void *out_y[2], *out_dbl[2];
  for (int path = 0; path < 2; path++) {
    float *dst = dput(c.st, (size_t)nslot * c.sstride * 4);
    float *dcst = dput(cst, (size_t)nslot * cstride * 4);
    float *ddbl = dzero((size_t)nseq * NO * 4);
    void *dy = dzero(ny * es);
    mbd_mops_conv conv = {.K = K, .w = dcw, .bias = dcb, .state = dcst, .slot_stride = cstride};
    if (path == 0) { /* conv_silu, x_proj, scan */
      float *dxc = dzero(ny * 4);
      void *dxa = dzero(ny * es);
      OP(mbd_mops_conv_silu(g_stream, nseq, 1, di, K, dxz, c.ldxz, dcw, dcb, dcst, cstride, dsl,
                            dxc, act, dxa, &err));
      OP(mbd_mops_xproj(g_stream, nseq, di, NO, act, dxa, dxw, ddbl, &err));
      OP(mbd_mops_scan(g_stream, nseq, 1, di, N, R, dxc, ddbl, act, dtw, dtb, dA, dD, dxz, c.ldxz,
                       c.zoff, dst, c.sstride, dsl, NULL, act, dy, &err));
      dfree(dxc);
      dfree(dxa);
    } else { /* the fusion */
      OP(mbd_mops_conv_xproj(g_stream, nseq, di, &conv, dxz, c.ldxz, dsl, NO, act, dxw, ddbl,
                             &err));
      OP(mbd_mops_scan(g_stream, nseq, 1, di, N, R, NULL, ddbl, act, dtw, dtb, dA, dD, dxz,
                       c.ldxz, c.zoff, dst, c.sstride, dsl, &conv, act, dy, &err));
    }
    out_st[path] = malloc((size_t)nslot * c.sstride * 4);
    out_cst[path] = malloc((size_t)nslot * cstride * 4);
    out_y[path] = malloc(ny * es);
    out_dbl[path] = malloc((size_t)nseq * NO * 4);
    dget(out_st[path], dst, (size_t)nslot * c.sstride * 4);
    dget(out_cst[path], dcst, (size_t)nslot * cstride * 4);
    dget(out_y[path], dy, ny * es);
    dget(out_dbl[path], ddbl, (size_t)nseq * NO * 4);
    dfree(dst);
    dfree(dcst);
    dfree(ddbl);
    dfree(dy);
  }
  char what[96];
  snprintf(what, sizeof what, "conv fusion N=%d di=%d nseq=%d %s", N, di, nseq,
           mbd_dtype_name(act));
  same_bytes(what, out_dbl[1], out_dbl[0], (size_t)nseq * NO, 4);
  same_bytes(what, out_y[1], out_y[0], ny, es);
  same_bytes(what, out_st[1], out_st[0], (size_t)nslot * c.sstride, 4);
  same_bytes(what, out_cst[1], out_cst[0], (size_t)nslot * cstride, 4);
  for (int path = 0; path < 2; path++) {
    free(out_st[path]);
    free(out_cst[path]);
    free(out_y[path]);
    free(out_dbl[path]);
  }
  dfree(dA);
  dfree(dD);
  dfree(dxz);
  dfree(dtw);
  dfree(dtb);
  dfree(dsl);
  dfree(dcw);
  dfree(dcb);
  dfree(dxw);
  free(cw);
  free(cb);
  free(cw16);
  free(cb16);
  free(cst);
  free(xw);
  scan_case_free(&c);
}

/* The conv_fusion_case matrix at NSEQ sequences, then the largest fused
 * batch (64) at a d_inner of 16 scan blocks, the last one part-filled, so
 * that the scan runs its streaming kernel over ranges of sequences. */
static void test_conv_fusion(void **state) {
  (void)state;
  uint64_t seed = 16;
  const int K = 4;
  int ran = 0;
  for (int a = 1; a < N_ACT; a++)
    for (int q = 0; q < N_DINNER; q++)
      for (int ni = 0; ni < 4; ni++) {
        if (!mbd_mops_conv_fused(NSEQ, 1, K, k_dinner[q], k_act[a])) continue;
        ran++;
        conv_fusion_case(k_act[a], k_dinner[q], 4 << ni, NSEQ, NSLOT, k_slots, &seed);
      }
  enum { BIG = 64, BIG_DI = 2000 };
  int32_t slots[BIG];
  for (int s = 0; s < BIG; s++) slots[s] = (7 * s + 3) % (BIG + 1); /* a permutation */
  for (int a = 1; a < N_ACT; a++)
    for (int ni = 0; ni < 4; ni += 2) {
      if (!mbd_mops_conv_fused(BIG, 1, K, BIG_DI, k_act[a])) continue;
      ran++;
      conv_fusion_case(k_act[a], BIG_DI, 4 << ni, BIG, BIG + 1, slots, &seed);
    }
  if (!ran) {
    print_message(
        "mbd_mops_conv_fused accepts none of these shapes (MBD_CONV_FUSE_MAX=0 "
        "in the environment): fusion not compared\n");
    skip();
  }
}

/* ---- greedy sampling ------------------------------------------------------------ */

/* Greedy picks: the lowest index among equal maxima, NaN never wins; the same
 * on the CPU by definition. Two launches on one workspace (it must be left
 * zero-filled). */
static void test_sample_greedy(void **state) {
  (void)state;
  uint64_t seed = 17;
  enum { NR = 4, V = 1000, LD = 1003 };
  float *l = fillf((size_t)NR * LD, &seed, -5.0f, 5.0f);
  l[1 * LD + 10] = 9.0f; /* a tie: index 10 wins */
  l[1 * LD + 900] = 9.0f;
  l[2 * LD + 5] = NAN; /* NaN ignored */
  l[2 * LD + 7] = 8.0f;
  for (int i = 0; i < V; i++) l[3 * LD + i] = -1.0f; /* all equal: index 0 */
  int32_t want[NR];
  for (int r = 0; r < NR; r++) {
    int bi = -1;
    for (int i = 0; i < V; i++) {
      float v = l[r * LD + i];
      if (v == v && (bi < 0 || v > l[r * LD + bi])) bi = i;
    }
    want[r] = bi;
  }
  assert_int_equal(want[1], 10);
  assert_int_equal(want[2], 7);
  float *dl = dput(l, (size_t)NR * LD * 4);
  void *work = dzero(mbd_mops_sample_work_bytes(NR));
  int32_t *dout = dzero(sizeof want);
  for (int rep = 0; rep < 2; rep++) {
    int32_t got[NR];
    OP(mbd_mops_sample(g_stream, NR, V, dl, LD, NULL, NULL, NULL, work, dout, &err));
    dget(got, dout, sizeof got);
    same_bytes("greedy sample", got, want, NR, 4);
  }
  dfree(dl);
  dfree(work);
  dfree(dout);
  free(l);
}

/* ---- synthetic weights ------------------------------------------------------------ */

/* Not an op of the model's arithmetic: values in [-scale, scale), the same
 * bits for the same seed. */
static void test_fill_uniform(void **state) {
  (void)state;
  enum { NV = 10007 };
  for (int a = 0; a < N_ACT; a++) {
    mbd_dtype dt = k_act[a];
    void *d1 = dzero(NV * dsize(dt)), *d2 = dzero(NV * dsize(dt));
    OP(mbd_mops_fill_uniform(g_stream, dt, d1, NV, 42, 0.5f, &err));
    OP(mbd_mops_fill_uniform(g_stream, dt, d2, NV, 42, 0.5f, &err));
    void *h1 = malloc(NV * dsize(dt)), *h2 = malloc(NV * dsize(dt));
    dget(h1, d1, NV * dsize(dt));
    dget(h2, d2, NV * dsize(dt));
    same_bytes("fill_uniform", h1, h2, NV, dsize(dt));
    for (size_t i = 0; i < NV; i++) {
      float v = load(dt, h1, i);
      if (!(v >= -0.5f && v <= 0.5f))
        fail_msg("fill_uniform %s: p[%zu] = %g", mbd_dtype_name(dt), i, (double)v);
    }
    dfree(d1);
    dfree(d2);
    free(h1);
    free(h2);
  }
}

static int setup(void **state) {
  (void)state;
  return cudaStreamCreate(&g_stream) == cudaSuccess ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  cudaStreamDestroy(g_stream);
  return 0;
}

int main(void) {
  gpu_test_require_device();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embed),         cmocka_unit_test(test_add_rmsnorm),
      cmocka_unit_test(test_conv_silu),     cmocka_unit_test(test_xproj),
      cmocka_unit_test(test_scan),          cmocka_unit_test(test_scan_batch),
      cmocka_unit_test(test_scan_prefill),
      cmocka_unit_test(test_ssd_scan),      cmocka_unit_test(test_ssd_scan_bf16state),
      cmocka_unit_test(test_ssd_scan_conv), cmocka_unit_test(test_gated_rmsnorm),
      cmocka_unit_test(test_conv_fusion),
      cmocka_unit_test(test_sample_greedy), cmocka_unit_test(test_fill_uniform),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
