/* dt_proj + selective scan + D skip + SiLU gate over T > 1 steps (see
 * scan_prefill.h): the prefill kernel. Per step the arithmetic of scan.cu's
 * kernels (mbd_cpu_scan_step's roundings in its order); what differs is only
 * which thread computes which element and when.
 *
 * The scan is bound by instruction issue, and its bulk is per state entry
 * and step: exp(dt * a) and the update. So this kernel spends as few
 * instructions as it can there: every operand of that phase arrives by
 * 16-byte shared loads (dt, x and B staged step-contiguous), the exp takes a
 * short exact path (sp_exp_in_range), untested when the dt phase has shown
 * that every argument of the chunk is in its range, and the dt_proj chains
 * run two to four per thread over 16-byte loads of weights and inputs. */
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/scan_exp.cuh"
#include "kernels/cuda/ops/scan_prefill.h"

#define SP_CB 16           /* channels per block (threads: SP_CB x N) */
#define SP_TC 32           /* steps per chunk */
#define SP_TCP (SP_TC + 4) /* step-contiguous rows: float4-aligned, an odd count of float4 */

__device__ __forceinline__ float4 sp_ld4(const float *p) { return *(const float4 *)p; }

/* Row strides in floats: a multiple of 4 whose quotient by 4 is odd, so 8
 * consecutive rows' float4 at one offset fall in distinct banks. */
__host__ __device__ constexpr int sp_odd4(int n) { return 4 * (((n + 3) / 4) | 1); }

/* The layout of the kernel's shared memory, in floats (sp_layout<N>(R)):
 *   w   [SP_CB][RP]       the block's dt_proj rows, widened, k-contiguous
 *   dt  [SP_CB][SP_TCP]   the chunk's dt, step-contiguous per channel
 *   hw  [2][warps][32/N][CS] per warp: its channels' h_t, [step][HP] each
 *   y   [SP_TC][SP_CB+1]  the chunk's y (f32), written out after the chunk
 *   2 stage buffers of one chunk's inputs:
 *       d  [SP_TC][NDP]   x_proj rows (dt_low rounded to act in place, B, C)
 *       bt [N][SP_TCP]    B, step-contiguous per state
 *       xt, zt [SP_CB][SP_TCP] x, z, step-contiguous per channel */
template <int N>
struct sp_layout {
  static constexpr int NT = SP_CB * N, HP = N + 4, CS = N * HP + N, WA = (32 / N) * CS;
  static constexpr int SYP = SP_CB + 1;
  static constexpr int HWB = (NT / 32) * WA; /* one hw buffer */
  int RP, NDP, w, dt, hw, y, stage, stage_floats, total;
  __host__ __device__ explicit sp_layout(int R)
      : RP(sp_odd4(R)), NDP(sp_odd4(R + 2 * N)), w(0), dt(SP_CB * RP), hw(dt + SP_CB * SP_TCP),
        y(hw + 2 * HWB), stage(y + ((SP_TC * SYP + 3) & ~3)),
        stage_floats(SP_TC * NDP + N * SP_TCP + 2 * SP_CB * SP_TCP),
        total(stage + 2 * stage_floats) {}
};

/* Block (x, s) runs channels [SP_CB x, SP_CB x + SP_CB) of sequence s, over
 * chunks of SP_TC steps staged by cp.async one chunk ahead. Per chunk, between
 * barriers:
 *   round: dt_low rounded to act in place (what a GEMM input in act holds);
 *   dt:    thread (c, t0) runs the dt_proj chains of steps t0 + 8 i of
 *          channel c (i < SP_TC / N), each from 0 over k ascending, then
 *          + bias and softplus (the f32 GEMM contract, scan_dt's);
 *   h, y:  thread (c, n) of warp w (the N states of a channel in one warp)
 *          runs h[c][n] through the chunk in runs of N steps: the run's
 *          exps and inputs (independent), then the recurrence in step
 *          order, storing h_t in its warp's buffer; then lane (c, j) of the
 *          warp reduces step j of the run, C_t . h_t over the states in
 *          ascending order, + D x, times SiLU(z) (scan_one_dt's order).
 * Steps past T in the last chunk run on stale or zeroed staged data and are
 * discarded (neither the state nor y sees them). The state is stored as ST
 * (sp_st: f32, or bf16 rounded after every step). Each thread rounds the
 * dt_low pieces it staged and puts
 * SiLU(z) in place of the z it staged, a few side by side (silu_group),
 * before the chunk's first barrier (no round phase, one barrier fewer),
 * and runs its softplus side by side too (sp_softplus_group), so the y
 * phase's chain no longer waits on a SiLU of its own; and in a whole chunk
 * whose exps are all short, run r's y phase is issued after run r + 1's
 * exps and recurrence, in one stretch of straight-line code (hw
 * double-buffered), so its dependent chain overlaps them. */
template <int N, typename ActT, typename ST>
__global__ void __launch_bounds__(SP_CB *N, 2)
    k_scan_prefill(int T, int di, int R, const float *__restrict__ xc,
                   const float *__restrict__ dbl, const ActT *__restrict__ dt_w,
                   const ActT *__restrict__ dt_b, const float *__restrict__ A,
                   const float *__restrict__ Dv, const float *__restrict__ xz, int64_t ldxz,
                   int64_t zoff, ST *__restrict__ ssm_state, int64_t slot_stride,
                   const int32_t *__restrict__ slots, ActT *__restrict__ y) {
  using L = sp_layout<N>;
  constexpr int NT = L::NT, NW = NT / 32, CPW = 32 / N; /* threads, warps, channels per warp */
  constexpr int TPT = SP_TC / N;                          /* dt chains per thread */
  constexpr int CG = SP_CB / 4, BS = SP_TC / (NW / CG);   /* dt: channel groups, band steps */
  static_assert(N == 8 || N == 16, "d_state 8 or 16");
  static_assert(BS == 8 * TPT, "dt bands");
  extern __shared__ float4 sp_sm4[];
  float *sm = (float *)sp_sm4;
  const L lay(R);
  const int RP = lay.RP, NDP = lay.NDP, ND = R + 2 * N, ND4 = ND / 4, R4 = R / 4;
  float *sw = sm + lay.w, *sdt = sm + lay.dt, *sy = sm + lay.y;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const int c0 = blockIdx.x * SP_CB, s = blockIdx.y;
  const int64_t base = (int64_t)s * T;
  const int nchunk = (T + SP_TC - 1) / SP_TC;

  /* dt phase: channel dc, steps dt0 + 8 i */
  const int dc = 4 * (w % CG) + (l & 3), dt0 = (w / CG) * BS + (l >> 2);
  /* h, y phases: channel hc (global ch), state n; lane (hc, n) also reduces step n of a run */
  const int hcw = l / N, n = l % N, hc = w * CPW + hcw, ch = c0 + hc;
  const bool live = ch < di;
  const int cc = live ? ch : di - 1; /* dead channels compute on a valid one, store nothing */
  float *hw = sm + lay.hw + w * L::WA + hcw * L::CS;

  /* The incremental (row, piece) walk of a [rows][per] array by NT threads:
   * start and stride, without a division per element. */
  const int nd_t0 = tid / ND4, nd_p0 = tid % ND4, nd_dt = NT / ND4, nd_dp = NT % ND4;

  /* Issues the cp.async loads of chunk q into stage buffer q & 1. */
  auto stage = [&](int q) {
    float *sd = sm + lay.stage + (q & 1) * lay.stage_floats, *sbt = sd + SP_TC * NDP,
          *sxt = sbt + N * SP_TCP, *szt = sxt + SP_CB * SP_TCP;
    const int t0 = q * SP_TC, tc = min(SP_TC, T - t0);
    const float *g = dbl + (base + t0) * ND; /* the chunk's rows are contiguous */
    for (int t = nd_t0, p = nd_p0; t < tc;) {
      cp_async16(sd + t * NDP + 4 * p, g + (int64_t)t * ND + 4 * p);
      t += nd_dt, p += nd_dp;
      if (p >= ND4) p -= ND4, t++;
    }
    for (int e = tid; e < tc * N; e += NT) {
      const int t = e / N, m = e % N;
      cp_async4(sbt + m * SP_TCP + t, g + (int64_t)t * ND + R + m);
    }
    for (int e = tid; e < tc * SP_CB; e += NT) {
      const int t = e / SP_CB, c = e % SP_CB;
      const int64_t row = base + t0 + t;
      const int cx = min(c0 + c, di - 1);
      cp_async4(sxt + c * SP_TCP + t, xc + row * di + cx);
      cp_async4(szt + c * SP_TCP + t, xz + row * ldxz + zoff + cx);
    }
    cp_async_commit();
  };
  /* y of chunk q (in sy) to global memory, coalesced along the channels. */
  auto write_out = [&](int q) {
    const int t0 = q * SP_TC, tc = min(SP_TC, T - t0);
    for (int e = tid; e < SP_TC * SP_CB; e += NT) {
      const int t = e / SP_CB, c = e % SP_CB;
      if (t < tc && c0 + c < di) st_act(y + (base + t0 + t) * di + c0 + c, sy[t * L::SYP + c]);
    }
  };

  /* the block's weight rows are contiguous */
  for (int e = tid; e < SP_CB * R; e += NT) {
    const int c = e / R, k = e - c * R;
    sw[c * RP + k] = ld_f32(dt_w + (int64_t)min(c0 + c, di - 1) * R + k);
  }
  const float bdt = ld_f32(dt_b + min(c0 + dc, di - 1));
  /* max |A| over channel dc's states (NaN: +inf): |dt a| <= dt amax, rounded
   * alike, so dt amax in the short exp range puts every dt a there */
  float amax = 0.0f;
  for (int m = 0; m < N; m++) {
    const float v = A[(int64_t)min(c0 + dc, di - 1) * N + m];
    amax = v == v ? fmaxf(amax, fabsf(v)) : INFINITY;
  }
  const float a = A[(int64_t)cc * N + n];
  const float d = Dv[cc];
  if (T % SP_TC) { /* the last chunk's unstaged rows: zeros, not uninitialised memory */
    float4 *st4 = (float4 *)(sm + lay.stage);
    for (int e = tid; e < 2 * lay.stage_floats / 4; e += NT) st4[e] = make_float4(0, 0, 0, 0);
    __syncthreads();
  }
  pdl_wait();
  pdl_trigger();
  stage(0);
  ST *hp = ssm_state + (int64_t)slots[s] * slot_stride + (int64_t)cc * N + n;
  float h = sp_st<ST>::ld(hp);

  for (int q = 0; q < nchunk; q++) {
    cp_async_wait_group<0>();
    {
      /* each thread's own copies of chunk q (stage's walks) are visible to it:
       * their dt_low rounded to act in place, and SiLU(z) in place of z, a
       * few side by side, before the barrier publishes them */
      float *sd = sm + lay.stage + (q & 1) * lay.stage_floats, *sbt = sd + SP_TC * NDP,
            *szt = sbt + N * SP_TCP + SP_CB * SP_TCP;
      if constexpr (!std::is_same<ActT, float>::value) {
        const int tc = min(SP_TC, T - q * SP_TC);
        for (int t = nd_t0, p = nd_p0; t < tc;) {
          if (p < R4) {
            float4 *v = (float4 *)(sd + t * NDP + 4 * p);
            float4 u = *v;
            u.x = round_act<ActT>(u.x), u.y = round_act<ActT>(u.y);
            u.z = round_act<ActT>(u.z), u.w = round_act<ActT>(u.w);
            *v = u;
          }
          t += nd_dt, p += nd_dp;
          if (p >= ND4) p -= ND4, t++;
        }
      }
      constexpr int GZ = SP_CB * SP_TC / NT; /* z of step e / SP_CB, channel e % SP_CB */
      float g[GZ];
#pragma unroll
      for (int i = 0; i < GZ; i++) {
        const int e = tid + i * NT;
        g[i] = szt[(e % SP_CB) * SP_TCP + e / SP_CB];
      }
      silu_group<GZ>(g);
#pragma unroll
      for (int i = 0; i < GZ; i++) {
        const int e = tid + i * NT;
        szt[(e % SP_CB) * SP_TCP + e / SP_CB] = g[i];
      }
    }
    __syncthreads(); /* chunk q visible; chunk q - 1 done: its buffer, sdt, sy free */
    if (q > 0) write_out(q - 1);
    if (q + 1 < nchunk) stage(q + 1);
    float *sd = sm + lay.stage + (q & 1) * lay.stage_floats, *sbt = sd + SP_TC * NDP,
          *sxt = sbt + N * SP_TCP, *szt = sxt + SP_CB * SP_TCP;
    const int tc = min(SP_TC, T - q * SP_TC);
    /* dt: TPT chains of channel dc side by side, each over k ascending */
    bool fast = true; /* every exp argument of the chunk in the short range */
    {
      float acc[TPT];
#pragma unroll
      for (int i = 0; i < TPT; i++) acc[i] = 0.0f;
      const float *wr = sw + dc * RP, *dr = sd + dt0 * NDP;
#pragma unroll 4
      for (int k = 0; k < R; k += 4) {
        const float4 wv = sp_ld4(wr + k);
#pragma unroll
        for (int i = 0; i < TPT; i++) {
          const float4 v = sp_ld4(dr + 8 * i * NDP + k);
          acc[i] = __fmaf_rn(v.x, wv.x, acc[i]);
          acc[i] = __fmaf_rn(v.y, wv.y, acc[i]);
          acc[i] = __fmaf_rn(v.z, wv.z, acc[i]);
          acc[i] = __fmaf_rn(v.w, wv.w, acc[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < TPT; i++) acc[i] = __fadd_rn(acc[i], bdt);
      sp_softplus_group<TPT>(acc);
#pragma unroll
      for (int i = 0; i < TPT; i++) {
        fast &= sp_exp_fast(__fmul_rn(acc[i], amax));
        sdt[dc * SP_TCP + dt0 + 8 * i] = acc[i];
      }
    }
    const bool all_fast = __syncthreads_and(fast);
    /* h, y: runs of N steps */
    {
      /* a whole chunk with every exp in the short range: run r's y phase is
       * done after run r + 1's exps and recurrence have been issued, in the
       * same straight-line code (hw double-buffered, one __syncwarp a run),
       * so its dependent chain overlaps them */
      if (all_fast && tc == SP_TC) {
        constexpr int NR = SP_TC / N;
        const auto exps_rec = [&](int tb, float *hb) {
          const float *pdt = sdt + hc * SP_TCP + tb, *pb = sbt + n * SP_TCP + tb,
                      *px = sxt + hc * SP_TCP + tb;
          float dA[N], u[N];
#pragma unroll
          for (int j = 0; j < N; j += 4) {
            const float4 t4 = sp_ld4(pdt + j), b4 = sp_ld4(pb + j), x4 = sp_ld4(px + j);
            const float tv[4] = {t4.x, t4.y, t4.z, t4.w}, bv[4] = {b4.x, b4.y, b4.z, b4.w},
                        xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
              dA[j + i] = sp_exp_in_range(__fmul_rn(tv[i], a));
              u[j + i] = __fmul_rn(__fmul_rn(tv[i], bv[i]), xv[i]);
            }
          }
#pragma unroll
          for (int j = 0; j < N; j++) {
            h = sp_st<ST>::rnd(__fmaf_rn(dA[j], h, u[j]));
            hb[j * L::HP + n] = h;
          }
        };
        const auto yrun = [&](int tb, const float *hb) {
          const int t = tb + n;
          const float *hr = hb + n * L::HP, *C = sd + t * NDP + R + N;
          float acc = 0.0f;
#pragma unroll
          for (int m = 0; m < N; m += 4) {
            const float4 h4 = sp_ld4(hr + m), c4 = sp_ld4(C + m);
            acc = __fmaf_rn(h4.x, c4.x, acc);
            acc = __fmaf_rn(h4.y, c4.y, acc);
            acc = __fmaf_rn(h4.z, c4.z, acc);
            acc = __fmaf_rn(h4.w, c4.w, acc);
          }
          const float x = sxt[hc * SP_TCP + t], g = szt[hc * SP_TCP + t];
          acc = __fmaf_rn(d, x, acc);
          sy[t * L::SYP + hc] = __fmul_rn(acc, g);
        };
        exps_rec(0, hw);
        __syncwarp(); /* run 0's h_t are in buffer 0 */
#pragma unroll
        for (int r = 1; r < NR; r++) {
          yrun((r - 1) * N, hw + ((r - 1) & 1) * L::HWB);
          exps_rec(r * N, hw + (r & 1) * L::HWB);
          __syncwarp(); /* run r's h_t are in; run r - 1's buffer is free */
        }
        yrun((NR - 1) * N, hw + ((NR - 1) & 1) * L::HWB);
        continue;
      }
    }
    for (int tb = 0; tb < tc; tb += N) {
      const float *pdt = sdt + hc * SP_TCP + tb, *pb = sbt + n * SP_TCP + tb,
                  *px = sxt + hc * SP_TCP + tb;
      float dA[N], u[N];
      /* the run's exps and inputs; check: test each exp argument (when not
       * all_fast), and if one of the warp's is out of the short range, take
       * mbd_pm_expf for the whole run */
      const auto inputs = [&](auto check) {
        bool ok = true;
#pragma unroll
        for (int j = 0; j < N; j += 4) {
          const float4 t4 = sp_ld4(pdt + j), b4 = sp_ld4(pb + j), x4 = sp_ld4(px + j);
          const float tv[4] = {t4.x, t4.y, t4.z, t4.w}, bv[4] = {b4.x, b4.y, b4.z, b4.w},
                      xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const float xa = __fmul_rn(tv[i], a);
            if constexpr (decltype(check)::value) ok &= sp_exp_fast(xa);
            dA[j + i] = sp_exp_in_range(xa);
            u[j + i] = __fmul_rn(__fmul_rn(tv[i], bv[i]), xv[i]);
          }
        }
        if constexpr (decltype(check)::value) {
          if (!__all_sync(0xffffffffu, ok)) {
#pragma unroll
            for (int j = 0; j < N; j++) dA[j] = mbd_pm_expf(__fmul_rn(pdt[j], a));
          }
        }
      };
      if (all_fast)
        inputs(std::false_type());
      else
        inputs(std::true_type());
      if (tb + N <= tc) {
#pragma unroll
        for (int j = 0; j < N; j++) {
          h = sp_st<ST>::rnd(__fmaf_rn(dA[j], h, u[j]));
          hw[j * L::HP + n] = h;
        }
      } else {
#pragma unroll
        for (int j = 0; j < N; j++) {
          if (tb + j < tc) h = sp_st<ST>::rnd(__fmaf_rn(dA[j], h, u[j]));
          hw[j * L::HP + n] = h;
        }
      }
      __syncwarp(); /* the warp's h_t are in hw */
      {
        const int t = tb + n; /* this lane's step of the run */
        const float *hr = hw + n * L::HP, *C = sd + t * NDP + R + N;
        float acc = 0.0f;
#pragma unroll
        for (int m = 0; m < N; m += 4) {
          const float4 h4 = sp_ld4(hr + m), c4 = sp_ld4(C + m);
          acc = __fmaf_rn(h4.x, c4.x, acc);
          acc = __fmaf_rn(h4.y, c4.y, acc);
          acc = __fmaf_rn(h4.z, c4.z, acc);
          acc = __fmaf_rn(h4.w, c4.w, acc);
        }
        const float x = sxt[hc * SP_TCP + t], z = szt[hc * SP_TCP + t];
        acc = __fmaf_rn(d, x, acc);
        sy[t * L::SYP + hc] = __fmul_rn(acc, z); /* z holds SiLU(z) */
      }
      __syncwarp(); /* hw free for the next run */
    }
  }
  __syncthreads();
  write_out(nchunk - 1);
  if (live) sp_st<ST>::put(hp, h);
}

template <int N, typename ActT, typename ST>
static int scan_prefill_launch(cudaStream_t s, int nseq, int T, int di, int R, const float *xc,
                               const float *dbl, const ActT *dt_w, const ActT *dt_b,
                               const float *A, const float *D, const float *xz, int64_t ldxz,
                               int64_t zoff, ST *ssm_state, int64_t slot_stride,
                               const int32_t *slots, ActT *y, mbd_error *err) {
  const size_t sh = sizeof(float) * (size_t)sp_layout<N>(R).total;
  int rc = allow_smem(k_scan_prefill<N, ActT, ST>, sh, err);
  if (rc < 0) return rc;
  /* a long, serial kernel: it waits for its predecessor normally (see
   * scan.cu's chunked launch) */
  return launch_ex(false, "selective scan (prefill)", k_scan_prefill<N, ActT, ST>,
                   dim3((unsigned)((di + SP_CB - 1) / SP_CB), (unsigned)nseq),
                   dim3((unsigned)(SP_CB * N)), sh, s, err, T, di, R, xc, dbl, dt_w, dt_b, A, D,
                   xz, ldxz, zoff, ssm_state, slot_stride, slots, y);
}

/* The device's shared memory per block (opt-in), read once; 48 KiB if the
 * query fails. */
static size_t sp_smem_max(void) {
  static size_t mx;
  if (!mx) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        v <= 0) {
      (void)cudaGetLastError();
      v = 48 * 1024;
    }
    mx = (size_t)v;
  }
  return mx;
}

extern "C" int mbd_mops_scan_prefill_fits(int N, int R, const float *dbl) {
  if (!(N == 8 || N == 16) || R <= 0 || R % 4 || R > 4096 || ((uintptr_t)dbl & 15)) return 0;
  const int fl = N == 8 ? sp_layout<8>(R).total : sp_layout<16>(R).total;
  const size_t sh = sizeof(float) * (size_t)fl;
  return sh <= sp_smem_max();
}

template <typename ST>
static int scan_prefill_entry(void *stream, int nseq, int T, int di, int N, int R,
                              const float *xc, const float *dbl, const void *dt_w,
                              const void *dt_b, const float *A, const float *D, const float *xz,
                              int64_t ldxz, int64_t zoff, ST *ssm_state, int64_t slot_stride,
                              const int32_t *slots, mbd_dtype act, void *y, mbd_error *err) {
  if (!mbd_mops_scan_prefill_fits(N, R, dbl))
    return mbd_error_set(err, MBD_E_INVALID, "scan prefill: d_state %d, dt rank %d unsupported",
                         N, R);
  cudaStream_t s = (cudaStream_t)stream;
#define SCAN_P(T_)                                                                             \
  return N == 8 ? scan_prefill_launch<8, T_, ST>(s, nseq, T, di, R, xc, dbl, (const T_ *)dt_w, \
                                                 (const T_ *)dt_b, A, D, xz, ldxz, zoff,       \
                                                 ssm_state, slot_stride, slots, (T_ *)y, err)  \
                : scan_prefill_launch<16, T_, ST>(s, nseq, T, di, R, xc, dbl,                  \
                                                  (const T_ *)dt_w, (const T_ *)dt_b, A, D,    \
                                                  xz, ldxz, zoff, ssm_state, slot_stride,      \
                                                  slots, (T_ *)y, err);
  MBD_ACT_DISPATCH(act, SCAN_P)
#undef SCAN_P
  return 0;
}

extern "C" int mbd_mops_scan_prefill(void *stream, int nseq, int T, int di, int N, int R,
                                     const float *xc, const float *dbl, const void *dt_w,
                                     const void *dt_b, const float *A, const float *D,
                                     const float *xz, int64_t ldxz, int64_t zoff,
                                     float *ssm_state, int64_t slot_stride,
                                     const int32_t *slots, mbd_dtype act, void *y,
                                     mbd_error *err) {
  return scan_prefill_entry<float>(stream, nseq, T, di, N, R, xc, dbl, dt_w, dt_b, A, D, xz,
                                   ldxz, zoff, ssm_state, slot_stride, slots, act, y, err);
}

extern "C" int mbd_mops_scan_prefill_bf16state(void *stream, int nseq, int T, int di, int N,
                                               int R, const float *xc, const float *dbl,
                                               const void *dt_w, const void *dt_b,
                                               const float *A, const float *D, const float *xz,
                                               int64_t ldxz, int64_t zoff, void *ssm_state,
                                               int64_t slot_stride, const int32_t *slots,
                                               mbd_dtype act, void *y, mbd_error *err) {
  return scan_prefill_entry<__nv_bfloat16>(stream, nseq, T, di, N, R, xc, dbl, dt_w, dt_b, A, D,
                                           xz, ldxz, zoff, (__nv_bfloat16 *)ssm_state,
                                           slot_stride, slots, act, y, err);
}
