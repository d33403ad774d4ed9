/* Per-op matrix of the CPU backend's Mamba-1 ops (kernels/cpu/mamba_ops.h),
 * in the manner of ggml's test-backend-ops: every op against a reference
 * written here from the header's contract, over d_state 4/8/16/32/64, d_conv
 * 2..8, d_inner that are not multiples of any tile (1, 37, 130, 257), with
 * weights that are f32 values or the f32 widenings of bf16/f16 values (the
 * ops take f32; bf16/f16 models widen their norm, conv, A and D weights at
 * load, and their GEMM weights are kernels/cpu/gemm.h's, tested in
 * test_cpu_gemm).
 *
 * Two kinds of check:
 * - bitwise (memcmp): the op against the contract's own sequence of f32
 *   roundings (docs/route.md "Model kernels": the CPU ops are the reference
 *   whose roundings the GPU ops repeat), against itself split over channel
 *   ranges (callers parallelise over channels), on the portable path and the
 *   AVX2+FMA path (same source, fma exact), and a prefill of T steps against
 *   T single steps (they are the same calls);
 * - a stated bound against a double-precision reference built on libm: how
 *   far the fixed f32 roundings may be from the real value, with the reason
 *   next to each bound. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/half.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/portable_math.h"

static const int k_dstate[] = {4, 8, 16, 32, 64};
static const int k_dinner[] = {1, 37, 130, 257};
enum { N_DSTATE = 5, N_DINNER = 4 };

/* How weights are drawn: f32 values, or f32 widenings of bf16 / f16 values. */
typedef enum { W_F32, W_BF16, W_F16 } wkind;
static const char *const k_wname[] = {"f32", "bf16", "f16"};

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [lo, hi), then rounded through the weight kind. */
static float draw(uint64_t *s, float lo, float hi, wkind k) {
  float v = lo + (hi - lo) * (float)((double)(rng(s) >> 40) / 16777216.0);
  if (k == W_BF16) v = mbd_bf16_to_f32(mbd_f32_to_bf16(v));
  if (k == W_F16) v = mbd_f16_to_f32(mbd_f32_to_f16(v));
  return v;
}

static float *vec(size_t n, uint64_t *s, float lo, float hi, wkind k) {
  float *v = malloc(n * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++) v[i] = draw(s, lo, hi, k);
  return v;
}

static float *dup(const float *x, size_t n) {
  float *v = malloc(n * sizeof *v);
  assert_non_null(v);
  memcpy(v, x, n * sizeof *v);
  return v;
}

/* Fails naming the first differing element when a and b differ in any bit. */
static void same_bits(const char *what, const float *a, const float *b, size_t n) {
  if (!memcmp(a, b, n * sizeof *a)) return;
  for (size_t i = 0; i < n; i++) {
    if (mbd_f32_to_bits(a[i]) != mbd_f32_to_bits(b[i]))
      fail_msg("%s: element %zu differs: %.9g (0x%08x) vs %.9g (0x%08x)", what, i, (double)a[i],
               mbd_f32_to_bits(a[i]), (double)b[i], mbd_f32_to_bits(b[i]));
  }
}

/* Distance in f32 ulps at the reference value. */
static double ulps(float got, double want) {
  double u = ldexp(1.0, (want == 0.0 ? -149 : ilogb(want) - 23));
  if (u < ldexp(1.0, -149)) u = ldexp(1.0, -149);
  return fabs((double)got - want) / u;
}

/* The ISA levels this machine runs: portable always, AVX2 when detected. */
static int isas(mbd_cpu_isa out[2]) {
  out[0] = MBD_CPU_ISA_PORTABLE;
  if (mbd_cpu_isa_detect() == MBD_CPU_ISA_AVX2) {
    out[1] = MBD_CPU_ISA_AVX2;
    return 2;
  }
  print_message("no AVX2+FMA on this CPU: only the portable path is compared\n");
  return 1;
}

/* ---- SiLU and softplus ---------------------------------------------------- */

/* Bitwise: the ops are mbd_pm_silu / mbd_pm_softplus (the same bits on every
 * host and on the GPU). Bound against libm in double: softplus within 2 ulp
 * (kernels/portable_math.h measures 1.57: exp's rounded result feeds log1p);
 * silu within 2.5 ulp of x / (1 + exp(-x)) where |silu| >= 2^-100: exp's
 * 0.98 ulp, the add's and the division's 0.5 ulp are each relative to their
 * own value, and ulps of a quotient that sits lower in its binade than the
 * divisor count up to twice (x = -16.7375 gives 2.04 ulp, above the 2 ulp
 * portable_math.h states); an absolute 2^-120 below 2^-100 (the quotient
 * loses bits to subnormal rounding). */
static void test_silu_softplus(void **state) {
  (void)state;
  double worst_silu = 0, worst_sp = 0;
  for (int i = -40000; i <= 40000; i++) {
    float x = (float)i * 0.0025f; /* [-100, 100] */
    float s = mbd_cpu_silu(x), sp = mbd_cpu_softplus(x);
    float rs = mbd_pm_silu(x), rsp = mbd_pm_softplus(x);
    if (mbd_f32_to_bits(s) != mbd_f32_to_bits(rs))
      fail_msg("silu(%g) is not mbd_pm_silu", (double)x);
    if (mbd_f32_to_bits(sp) != mbd_f32_to_bits(rsp))
      fail_msg("softplus(%g) is not mbd_pm_softplus", (double)x);
    double ws = (double)x / (1.0 + exp(-(double)x));
    double wsp = x > 20.0f ? (double)x : log1p(exp((double)x));
    if (fabs(ws) >= ldexp(1.0, -100)) {
      double e = ulps(s, ws);
      if (e > worst_silu) worst_silu = e;
      if (e > 2.5)
        fail_msg("silu(%.9g) = %.9g, libm %.17g: %.2f ulp > 2.5", (double)x, (double)s, ws, e);
    } else if (fabs((double)s - ws) > ldexp(1.0, -120)) {
      fail_msg("silu(%.9g) = %.9g, libm %.17g: beyond 2^-120", (double)x, (double)s, ws);
    }
    double e = ulps(sp, wsp);
    if (e > worst_sp) worst_sp = e;
    if (e > 2.0)
      fail_msg("softplus(%.9g) = %.9g, libm %.17g: %.2f ulp > 2", (double)x, (double)sp, wsp, e);
  }
  print_message("silu max %.2f ulp, softplus max %.2f ulp over [-100, 100]\n", worst_silu,
                worst_sp);
}

/* ---- RMSNorm ------------------------------------------------------------ */

/* The contract: ss = fmaf chain over i ascending from 0; r = 1 / sqrtf(ss / n
 * + eps); out[i] = w[i] * (x[i] * r). */
static void ref_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; i++) ss = fmaf(x[i], x[i], ss);
  float r = 1.0f / sqrtf(ss / (float)n + eps);
  for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* Bound against double: the square sum is an fmaf chain of n terms of one
 * sign (relative error <= n u, u = 2^-24), the mean, eps add, sqrt and
 * division add 4 u, the two products 2 u; r enters every output, so
 * |out - ref| <= ((n + 6) u / 2 + 2 u) |ref| (the /2: sqrt halves the
 * relative error of its argument), taken here as (n + 8) u |ref| + 2^-126. */
static void test_rmsnorm(void **state) {
  (void)state;
  uint64_t s = 1;
  const int64_t dims[] = {1, 37, 130, 257, 768, 1000};
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    for (int k = W_F32; k <= W_F16; k++) {
      int64_t n = dims[di];
      float *x = vec((size_t)n, &s, -3.0f, 3.0f, W_F32),
            *w = vec((size_t)n, &s, 0.5f, 1.5f, (wkind)k);
      float *out = malloc((size_t)n * sizeof *out), *ref = malloc((size_t)n * sizeof *ref);
      float eps = 1e-5f;
      mbd_cpu_rmsnorm(x, w, n, eps, out);
      ref_rmsnorm(x, w, n, eps, ref);
      char what[96];
      snprintf(what, sizeof what, "rmsnorm n=%lld w=%s", (long long)n, k_wname[k]);
      same_bits(what, out, ref, (size_t)n);
      /* in place gives the same bits */
      float *inplace = dup(x, (size_t)n);
      mbd_cpu_rmsnorm(inplace, w, n, eps, inplace);
      same_bits(what, inplace, ref, (size_t)n);
      double ss = 0;
      for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
      double r = 1.0 / sqrt(ss / (double)n + (double)eps);
      double u = ldexp(1.0, -24);
      for (int64_t i = 0; i < n; i++) {
        double want = (double)w[i] * ((double)x[i] * r);
        double bound = (double)(n + 8) * u * fabs(want) + ldexp(1.0, -126);
        if (fabs((double)out[i] - want) > bound)
          fail_msg("%s: out[%lld] = %.9g, double %.17g, beyond %.3g", what, (long long)i,
                   (double)out[i], want, bound);
      }
      free(inplace);
      free(x);
      free(w);
      free(out);
      free(ref);
    }
  }
}

/* ---- causal conv + SiLU -------------------------------------------------- */

/* The contract, one token on channels [c0, c1): acc = fmaf chain over the
 * taps oldest..newest (the K-1 state entries, then x), + bias; the window
 * shifts; out = silu(acc). */
static void ref_conv_step(int64_t c0, int64_t c1, int64_t di, int K, const float *w,
                          const float *bias, float *st, const float *x, float *out) {
  for (int64_t c = c0; c < c1; c++) {
    float acc = 0.0f;
    for (int j = 0; j < K - 1; j++) acc = fmaf(w[j * di + c], st[j * di + c], acc);
    acc = fmaf(w[(int64_t)(K - 1) * di + c], x[c], acc);
    if (bias) acc = acc + bias[c];
    for (int j = 0; j < K - 2; j++) st[j * di + c] = st[(j + 1) * di + c];
    if (K > 1) st[(int64_t)(K - 2) * di + c] = x[c];
    out[c] = mbd_pm_silu(acc);
  }
}

/* Bound of one step against double: the pre-activation is a chain of K fmaf
 * and a bias add (error <= (K + 1) u sum |terms|, u = 2^-24); SiLU's slope is
 * below 1.1 everywhere, and SiLU itself adds 2 ulp (test_silu_softplus):
 * |out - ref| <= 1.1 (K + 1) u S + 2 ulp(ref) + 2^-120, S = sum |w x| + |b|. */
static void conv_bound(const char *what, int64_t di, int K, const float *w, const float *bias,
                       const float *st_before, const float *x, const float *out) {
  double u = ldexp(1.0, -24);
  for (int64_t c = 0; c < di; c++) {
    double acc = 0, mag = 0;
    for (int j = 0; j < K - 1; j++) {
      acc += (double)w[j * di + c] * st_before[j * di + c];
      mag += fabs((double)w[j * di + c] * st_before[j * di + c]);
    }
    acc += (double)w[(int64_t)(K - 1) * di + c] * x[c];
    mag += fabs((double)w[(int64_t)(K - 1) * di + c] * x[c]);
    if (bias) {
      acc += bias[c];
      mag += fabs((double)bias[c]);
    }
    double want = acc / (1.0 + exp(-acc));
    double bound = 1.1 * (K + 1) * u * mag +
                   2.0 * ldexp(1.0, ilogb(want == 0 ? 1e-30 : want) - 23) + ldexp(1.0, -120);
    if (fabs((double)out[c] - want) > bound)
      fail_msg("%s: out[%lld] = %.9g, double %.17g, beyond %.3g", what, (long long)c,
               (double)out[c], want, bound);
  }
}

static void test_conv_step(void **state) {
  (void)state;
  uint64_t s = 2;
  mbd_cpu_isa isa[2];
  int nisa = isas(isa);
  enum { T = 11 }; /* more steps than the widest window: every tap sees a real input */
  for (int K = 2; K <= 8; K++) {
    for (int d = 0; d < N_DINNER; d++) {
      for (int k = W_F32; k <= W_F16; k++) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
          int64_t di = k_dinner[d];
          size_t nst = (size_t)(K - 1) * (size_t)di;
          float *w = vec((size_t)K * (size_t)di, &s, -0.6f, 0.6f, (wkind)k);
          float *b = with_bias ? vec((size_t)di, &s, -0.3f, 0.3f, (wkind)k) : NULL;
          float *x = vec((size_t)T * (size_t)di, &s, -2.0f, 2.0f, W_F32);
          float *st0 = vec(nst ? nst : 1, &s, -1.0f, 1.0f, W_F32);
          float *ref = malloc((size_t)T * (size_t)di * sizeof *ref);
          float *ref_st = dup(st0, nst ? nst : 1);
          for (int t = 0; t < T; t++)
            ref_conv_step(0, di, di, K, w, b, ref_st, x + t * di, ref + t * di);
          char what[128];
          for (int ii = 0; ii < nisa; ii++) {
            /* whole range, one step at a time */
            float *st = dup(st0, nst ? nst : 1),
                  *out = malloc((size_t)T * (size_t)di * sizeof *out);
            float *before = dup(st0, nst ? nst : 1);
            for (int t = 0; t < T; t++) {
              memcpy(before, st, nst * sizeof *st);
              mbd_cpu_conv_step(isa[ii], 0, di, di, K, w, b, st, x + t * di, out + t * di);
              snprintf(what, sizeof what, "conv K=%d di=%lld w=%s bias=%d %s t=%d", K,
                       (long long)di, k_wname[k], with_bias, mbd_cpu_isa_name(isa[ii]), t);
              if (ii == 0) conv_bound(what, di, K, w, b, before, x + t * di, out + t * di);
            }
            snprintf(what, sizeof what, "conv K=%d di=%lld w=%s bias=%d %s", K, (long long)di,
                     k_wname[k], with_bias, mbd_cpu_isa_name(isa[ii]));
            same_bits(what, out, ref, (size_t)T * (size_t)di);
            same_bits(what, st, ref_st, nst);
            /* split over uneven channel ranges: the same bits */
            float *st2 = dup(st0, nst ? nst : 1),
                  *out2 = malloc((size_t)T * (size_t)di * sizeof *out2);
            for (int t = 0; t < T; t++)
              for (int64_t c0 = 0, step = 1; c0 < di; c0 += step, step = step * 3 + 1) {
                int64_t c1 = c0 + step < di ? c0 + step : di;
                mbd_cpu_conv_step(isa[ii], c0, c1, di, K, w, b, st2, x + t * di, out2 + t * di);
              }
            same_bits(what, out2, ref, (size_t)T * (size_t)di);
            same_bits(what, st2, ref_st, nst);
            free(st);
            free(out);
            free(before);
            free(st2);
            free(out2);
          }
          free(w);
          free(b);
          free(x);
          free(st0);
          free(ref);
          free(ref_st);
        }
      }
    }
  }
}

/* ---- selective scan ------------------------------------------------------ */

/* The contract, one token on channels [c0, c1): dt = softplus(dt_raw[c]);
 * for n ascending: h = fmaf(exp(dt A), h, (dt B[n]) x); y = fmaf(h, C[n], y)
 * from +0; y = fmaf(D, x, y); out = y * silu(z). */
static void ref_scan_step(int64_t c0, int64_t c1, int N, const float *A, const float *D,
                          const float *dt_raw, const float *B, const float *C, const float *x,
                          const float *z, float *h, float *out) {
  for (int64_t c = c0; c < c1; c++) {
    float dt = mbd_pm_softplus(dt_raw[c]), y = 0.0f;
    for (int n = 0; n < N; n++) {
      float dA = mbd_pm_expf(dt * A[c * N + n]);
      h[c * N + n] = fmaf(dA, h[c * N + n], (dt * B[n]) * x[c]);
      y = fmaf(h[c * N + n], C[n], y);
    }
    y = fmaf(D[c], x[c], y);
    out[c] = y * mbd_pm_silu(z[c]);
  }
}

/* Bound of one step against double, from the f32 state before it.
 * State: h' = exp(dt A) h + dt B x (u = 2^-24). dt carries softplus's 2 ulp
 * (4 u) and dt A one more rounding, an absolute error of 6 u |dt A| <= 100 u
 * in exp's argument (|dt A| <= 16 here), so with exp's 1 ulp exp(dt A) is
 * within 104 u relative; dt B x: dt's 4 u and two roundings; the fmaf one:
 * |dh| <= 110 u (|exp h| + |dt B x|). Output: an fmaf chain of N + 1 terms
 * (<= (N + 1) u sum |h C| + |D x|) over states each off by their |dh|, then
 * the gate (silu 2 ulp + product 1 u): |dy| <= ((N + 4) u S + sum |dh C|)
 * |silu z| + 3 ulp(y). Taken with a factor 2 of headroom. */
static void scan_bound(const char *what, int64_t di, int N, const float *A, const float *D,
                       const float *dt_raw, const float *B, const float *C, const float *x,
                       const float *z, const float *h_before, const float *h, const float *out) {
  double u = ldexp(1.0, -24);
  for (int64_t c = 0; c < di; c++) {
    double dtr = dt_raw[c];
    double dt = dtr > 20.0 ? dtr : log1p(exp(dtr));
    double y = 0, S = 0, dS = 0;
    for (int n = 0; n < N; n++) {
      double a = exp(dt * A[c * N + n]) * h_before[c * N + n];
      double bx = dt * B[n] * x[c];
      double hn = a + bx;
      double dh = 110.0 * u * (fabs(a) + fabs(bx)) + ldexp(1.0, -126);
      if (fabs((double)h[c * N + n] - hn) > 2.0 * dh)
        fail_msg("%s: h[%lld][%d] = %.9g, double %.17g, beyond %.3g", what, (long long)c, n,
                 (double)h[c * N + n], hn, 2.0 * dh);
      y += hn * C[n];
      S += fabs(hn * C[n]);
      dS += dh * fabs((double)C[n]);
    }
    y += (double)D[c] * x[c];
    S += fabs((double)D[c] * x[c]);
    double g = (double)z[c] / (1.0 + exp(-(double)z[c]));
    double want = y * g;
    double bound = 2.0 * (((N + 4) * u * S + dS) * fabs(g) +
                          3.0 * ldexp(1.0, ilogb(want == 0 ? 1e-30 : want) - 23)) +
                   ldexp(1.0, -120);
    if (fabs((double)out[c] - want) > bound)
      fail_msg("%s: out[%lld] = %.9g, double %.17g, beyond %.3g", what, (long long)c,
               (double)out[c], want, bound);
  }
}

static void test_scan_step(void **state) {
  (void)state;
  uint64_t s = 3;
  mbd_cpu_isa isa[2];
  int nisa = isas(isa);
  enum { T = 7 };
  for (int q = 0; q < N_DSTATE; q++) {
    for (int d = 0; d < N_DINNER; d++) {
      for (int k = W_F32; k <= W_F16; k++) {
        int N = k_dstate[q];
        int64_t di = k_dinner[d];
        size_t nh = (size_t)di * (size_t)N;
        /* A = -exp(A_log) with A_log in [0, 2] (the model's range: -1..-7.4);
         * dt_raw in [-6, 2] keeps dt <= 2.2, so |dt A| <= 16.5. */
        float *A = malloc(nh * sizeof *A);
        for (size_t i = 0; i < nh; i++) A[i] = -mbd_pm_expf(draw(&s, 0.0f, 2.0f, (wkind)k));
        float *D = vec((size_t)di, &s, -1.0f, 1.0f, (wkind)k);
        float *dt = vec((size_t)T * (size_t)di, &s, -6.0f, 2.0f, W_F32);
        float *B = vec((size_t)T * (size_t)N, &s, -1.0f, 1.0f, W_F32);
        float *C = vec((size_t)T * (size_t)N, &s, -1.0f, 1.0f, W_F32);
        float *x = vec((size_t)T * (size_t)di, &s, -2.0f, 2.0f, W_F32);
        float *z = vec((size_t)T * (size_t)di, &s, -4.0f, 4.0f, W_F32);
        float *h0 = vec(nh, &s, -1.0f, 1.0f, W_F32);
        float *ref = malloc((size_t)T * (size_t)di * sizeof *ref), *ref_h = dup(h0, nh);
        for (int t = 0; t < T; t++)
          ref_scan_step(0, di, N, A, D, dt + t * di, B + t * N, C + t * N, x + t * di, z + t * di,
                        ref_h, ref + t * di);
        char what[128];
        for (int ii = 0; ii < nisa; ii++) {
          float *h = dup(h0, nh), *before = dup(h0, nh);
          float *out = malloc((size_t)T * (size_t)di * sizeof *out);
          for (int t = 0; t < T; t++) {
            memcpy(before, h, nh * sizeof *h);
            mbd_cpu_scan_step(isa[ii], 0, di, N, A, D, dt + t * di, B + t * N, C + t * N,
                              x + t * di, z + t * di, h, out + t * di);
            snprintf(what, sizeof what, "scan N=%d di=%lld w=%s %s t=%d", N, (long long)di,
                     k_wname[k], mbd_cpu_isa_name(isa[ii]), t);
            if (ii == 0)
              scan_bound(what, di, N, A, D, dt + t * di, B + t * N, C + t * N, x + t * di,
                         z + t * di, before, h, out + t * di);
          }
          snprintf(what, sizeof what, "scan N=%d di=%lld w=%s %s", N, (long long)di, k_wname[k],
                   mbd_cpu_isa_name(isa[ii]));
          same_bits(what, out, ref, (size_t)T * (size_t)di);
          same_bits(what, h, ref_h, nh);
          /* uneven channel ranges */
          float *h2 = dup(h0, nh), *out2 = malloc((size_t)T * (size_t)di * sizeof *out2);
          for (int t = 0; t < T; t++)
            for (int64_t c0 = 0, step = 2; c0 < di; c0 += step, step = step * 2 + 1) {
              int64_t c1 = c0 + step < di ? c0 + step : di;
              mbd_cpu_scan_step(isa[ii], c0, c1, N, A, D, dt + t * di, B + t * N, C + t * N,
                                x + t * di, z + t * di, h2, out2 + t * di);
            }
          same_bits(what, out2, ref, (size_t)T * (size_t)di);
          same_bits(what, h2, ref_h, nh);
          free(h);
          free(before);
          free(out);
          free(h2);
          free(out2);
        }
        free(A);
        free(D);
        free(dt);
        free(B);
        free(C);
        free(x);
        free(z);
        free(h0);
        free(ref);
        free(ref_h);
      }
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_silu_softplus),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_conv_step),
      cmocka_unit_test(test_scan_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
