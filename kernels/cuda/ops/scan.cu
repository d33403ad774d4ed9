/* dt_proj + selective scan + D skip + SiLU gate (see scan.h): the chunked
 * prefill kernel and the single-step decode kernel, the same arithmetic per
 * step. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/scan.h"

#define SCAN_THREADS 128 /* threads per chunked-scan block: 128 / N channels x N states */
#define SCAN_TC 16 /* time steps staged per chunk */

__device__ __forceinline__ void cp_async4(void *sm, const void *g) {
  unsigned a = (unsigned)__cvta_generic_to_shared(sm);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(g));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait0() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* dt_proj + softplus + selective scan + D skip + SiLU gate, SCAN_TC steps at a
 * time. A block owns CB = SCAN_THREADS / N channels of one sequence; thread
 * tid = n * CB + cl owns channel cl in every phase and state entry n. The
 * inputs of SCAN_TC steps are staged in shared memory by cp.async one chunk
 * ahead; each chunk then runs three phases between barriers:
 *   dt: thread (cl, n) computes dt of steps t = n, n + N, ... of channel cl;
 *   h:  thread (cl, n) runs h[cl][n] through the chunk's steps: the steps'
 *       exps first (independent of each other, so they overlap), then the
 *       recurrence in step order, storing every h_t in shared memory;
 *   y:  thread (cl, n) reduces steps t = n, n + N, ...: C_t . h_t over the
 *       states in ascending order, D skip, gate.
 * One thread per channel walking all of it would run d_state portable exps
 * per step back to back, latency-bound; this spreads
 * the same work over N times the threads. Only independent elements are
 * spread: each dt, h[c][n] and y is computed by one thread with the roundings
 * of mbd_cpu_scan_step, in the same order (k_scan_step is the same per step,
 * so prefill == decode). Per step (model-kernel contract, docs/route.md):
 *   dt_raw = (fmaf chain over k = 0..R-1 ascending from 0 of
 *             round_act(dbl[k]) * widen(dt_w[c, k])) + widen(dt_b[c])
 *            (the f32 GEMM contract; dt_low rounded to the storage dtype as a
 *             GEMM input would be);
 *   dt = softplus(dt_raw), then mbd_cpu_scan_step's roundings. */
template <int N, typename ActT, typename WT>
__global__ void __launch_bounds__(SCAN_THREADS)
    k_scan(int T, int di, int R, const float *__restrict__ xc, const float *__restrict__ dbl,
           const WT *__restrict__ dt_w, const WT *__restrict__ dt_b,
           const float *__restrict__ A, const float *__restrict__ Dv,
           const float *__restrict__ xz, int64_t ldxz, int64_t zoff,
           float *__restrict__ ssm_state, int64_t slot_stride,
           const int32_t *__restrict__ slots, ActT *__restrict__ y) {
  constexpr int CB = SCAN_THREADS / N; /* channels per block */
  /* h_t row stride, padded by CB: phase y's warp reads steps t, t + 1, ...
   * (32 / CB of them) of the same states in disjoint banks */
  constexpr int HS = (N + 1) * CB;
  extern __shared__ float4 scan_sm4[];
  const int ND = R + 2 * N;       /* x_proj row width */
  const int NDP = ND | 1;         /* staged row stride, odd: steps' rows in distinct banks */
  const int TS = min(T, SCAN_TC); /* staged steps per chunk (T = 1: 1) */
  const int stage_floats = 2 * TS * CB + TS * NDP;
  float *sw = (float *)scan_sm4; /* [R][CB] dt_proj weights, f32, k-major */
  float *sdt = sw + R * CB;      /* [TS][CB] the chunk's dt */
  float *sh = sdt + TS * CB;     /* [TS][HS]: h_t[n] of channel cl at t * HS + n * CB + cl */
  float *smem = sh + TS * HS;    /* 2 stage buffers: x [TS][CB], z [TS][CB], dbl [TS][NDP] */
  const int tid = threadIdx.x;
  const int cl = tid % CB, n = tid / CB;
  const int c0 = blockIdx.x * CB, c = c0 + cl;
  const int s = blockIdx.y;
  const bool live = c < di;
  const int cc = live ? c : di - 1; /* dead channels load a valid channel, store nothing */
  const int64_t base = (int64_t)s * T;
  const int nchunk = (T + SCAN_TC - 1) / SCAN_TC;

  /* Issues the cp.async loads of chunk q into stage buffer q & 1. */
  auto stage = [&](int q) {
    float *sx = smem + (q & 1) * stage_floats, *sz = sx + TS * CB, *sd = sz + TS * CB;
    const int t0 = q * SCAN_TC, tc = min(SCAN_TC, T - t0);
    for (int t = n; t < tc; t += N) {
      const int64_t row = base + t0 + t;
      cp_async4(sx + t * CB + cl, xc + row * di + cc);
      cp_async4(sz + t * CB + cl, xz + row * ldxz + zoff + cc);
    }
    const float *g = dbl + (base + t0) * ND; /* the chunk's rows are contiguous */
    for (int e = tid; e < tc * ND; e += SCAN_THREADS) {
      const int t = e / ND;
      cp_async4(sd + t * NDP + (e - t * ND), g + e);
    }
    cp_async_commit();
  };

  /* the block's weight rows are contiguous: coalesced, all loads in flight */
  for (int e = tid; e < CB * R; e += SCAN_THREADS) {
    const int ch = e / R, k = e - ch * R;
    sw[k * CB + ch] = ld_f32(dt_w + (int64_t)min(c0 + ch, di - 1) * R + k);
  } /* visible after the first chunk's __syncthreads */
  const float a = A[(int64_t)cc * N + n];
  const float d = Dv[cc];
  const float bdt = ld_f32(dt_b + cc);
  pdl_wait(); /* weights above may be read early; activations and state only now */
  pdl_trigger();
  stage(0);
  float *hp = ssm_state + (int64_t)slots[s] * slot_stride + (int64_t)cc * N + n;
  float h = *hp;

  for (int q = 0; q < nchunk; q++) {
    cp_async_wait0();
    __syncthreads(); /* chunk q visible to all; buffer (q+1)&1, sdt, sh free (chunk q-1 done) */
    if (q + 1 < nchunk) stage(q + 1);
    const float *sx = smem + (q & 1) * stage_floats, *sz = sx + TS * CB,
                *sd = sz + TS * CB;
    const int t0 = q * SCAN_TC, tc = min(SCAN_TC, T - t0);
    /* dt: step t's chain over k ascending (weights column cl, conflict-free) */
    for (int t = n; t < tc; t += N) {
      const float *dr = sd + t * NDP;
      float v = 0.0f;
#pragma unroll 8
      for (int k = 0; k < R; k++) v = __fmaf_rn(round_act<ActT>(dr[k]), sw[k * CB + cl], v);
      sdt[t * CB + cl] = softplus_f(__fadd_rn(v, bdt));
    }
    __syncthreads();
    /* h: state entry (cl, n) through the chunk's steps. No step guard, so
     * the steps' exps may interleave: steps past tc (last chunk only)
     * recompute step tc - 1 from valid staged data and are discarded. */
    {
      float dA[SCAN_TC], u[SCAN_TC];
#pragma unroll
      for (int t = 0; t < SCAN_TC; t++) {
        const int tt = min(t, tc - 1);
        const float dt = sdt[tt * CB + cl];
        dA[t] = mbd_pm_expf(__fmul_rn(dt, a));
        u[t] = __fmul_rn(__fmul_rn(dt, sd[tt * NDP + R + n]), sx[tt * CB + cl]);
      }
#pragma unroll
      for (int t = 0; t < SCAN_TC; t++) {
        if (t >= tc) break;
        h = __fmaf_rn(dA[t], h, u[t]);
        sh[t * HS + n * CB + cl] = h;
      }
    }
    __syncthreads();
    /* y: step t of channel cl, states in ascending order */
    for (int t = n; t < tc; t += N) {
      const float *C = sd + t * NDP + R + N, *ht = sh + t * HS + cl;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < N; j++) acc = __fmaf_rn(ht[j * CB], C[j], acc);
      const float x = sx[t * CB + cl], z = sz[t * CB + cl];
      acc = __fmaf_rn(d, x, acc);
      if (live) st_act(y + (base + t0 + t) * di + c, __fmul_rn(acc, silu_f(z)));
    }
  }
  if (live) *hp = h;
}

/* The T = 1 (decode) form of k_scan: the same per-step arithmetic, statement
 * for statement (a decode step must give the bits of one prefill step), with
 * none of the chunk staging. A block runs SSTEP_BT channels of SQ sequences:
 * thread c reads its channel's dt_proj row once, with 16-byte loads from
 * L2, and runs the SQ sequences' dt chains side by side over it, so the
 * weights cross L2 once per SQ sequences and nothing but the sequences'
 * x_proj rows (dt_low, B, C) is staged in shared memory. With SQ = 1 (small
 * batches, latency-bound) the block's rows are instead copied to shared
 * memory before the PDL wait, overlapping the x_proj kernel. Each chain is
 * one sequence's alone, in k order, so SQ only changes speed, never bits. */
#define SSTEP_BT 128

/* sw[ch * RP + k] = widen(g[ch * R + k]) for the n = nch * R weights of nch
 * consecutive channels' dt_proj rows; 16-byte loads when vec (g 16-byte
 * aligned, n a multiple of the elements per load). BTN threads. */
template <int BTN, typename WT>
__device__ __forceinline__ void stage_dt_w(float *sw, int RP, const WT *g, int n, int R,
                                           int vec, int tid) {
  constexpr int PV = 16 / sizeof(WT); /* elements per 16-byte load */
  if (vec) {
    for (int e = tid * PV; e < n; e += BTN * PV) {
      uint4 q = *(const uint4 *)(g + e);
      const WT *h = (const WT *)&q;
      int ch = e / R, k = e - ch * R;
#pragma unroll
      for (int j = 0; j < PV; j++) {
        sw[ch * RP + k] = ld_f32(h + j);
        if (++k == R) k = 0, ch++;
      }
    }
  } else {
    for (int e = tid; e < n; e += BTN) {
      const int ch = e / R;
      sw[ch * RP + (e - ch * R)] = ld_f32(g + e);
    }
  }
}

/* KC > 0 (the decode fusion, after k_conv_xproj): x is not read from xc but
 * recomputed by conv_silu_out from xz's x part and the conv state (taps
 * loaded before the wait), and this thread, the only one of the grid on its
 * (slot, channel), shifts the conv window; see k_conv_xproj for why the state
 * is written here. vec: every dt_proj row is 16-byte aligned (checked on the
 * host), so it is read in 16-byte pieces. */
template <int N, typename ActT, typename WT, int KC, int SQ>
__global__ void __launch_bounds__(SSTEP_BT)
    k_scan_step(int nseq, int di, int R, const float *__restrict__ xc,
                const float *__restrict__ dbl, const WT *__restrict__ dt_w,
                const WT *__restrict__ dt_b, const float *__restrict__ A,
                const float *__restrict__ Dv, const float *__restrict__ xz, int64_t ldxz,
                int64_t zoff, float *__restrict__ ssm_state, int64_t slot_stride,
                const int32_t *__restrict__ slots, const float *__restrict__ cw,
                const float *__restrict__ cb, float *__restrict__ cstate, int64_t cslot,
                ActT *__restrict__ y, int vec) {
  constexpr int PV = 16 / sizeof(WT); /* weights per 16-byte load */
  extern __shared__ float4 step_sm4[];
  const int ND = R + 2 * N;
  const int NDP = (ND + 3) & ~3; /* staged row stride: float4-aligned rows */
  const int RP = R + 1;          /* SQ = 1: padded weight row, conflict-free column reads */
  float *sw = (float *)step_sm4; /* SQ = 1: [SSTEP_BT][RP] */
  float *sd = sw + (SQ == 1 ? SSTEP_BT * RP : 0); /* [SQ][NDP]: round_act(dt_low), B, C */
  const int tid = threadIdx.x;
  const int c0 = blockIdx.x * SSTEP_BT, c = c0 + tid;
  const int s0 = blockIdx.y * SQ, nq = min(SQ, nseq - s0);
  const bool live = c < di;
  const int cc = live ? c : di - 1;
  if constexpr (SQ == 1)
    stage_dt_w<SSTEP_BT>(sw, RP, dt_w + (int64_t)c0 * R, min(SSTEP_BT, di - c0) * R, R, vec, tid);
  float a[N];
  ld_f32x(A + (int64_t)cc * N, a);
  const float d = Dv[cc];
  const float bdt = ld_f32(dt_b + cc);
  const WT *wr = dt_w + (int64_t)cc * R;
  float wk[KC > 0 ? KC : 1], cbias = 0.0f;
  if constexpr (KC > 0) {
#pragma unroll
    for (int j = 0; j < KC; j++) wk[j] = cw[(int64_t)j * di + cc];
    if (cb) cbias = cb[cc];
  }
  pdl_wait(); /* activations and state only from here on */
  pdl_trigger();
  /* rows past nq are zeros: their chains run and are dropped */
  for (int e = tid; e < SQ * ND; e += SSTEP_BT) {
    const int q = e / ND, k = e - q * ND;
    const float v = q < nq ? dbl[(int64_t)(s0 + q) * ND + k] : 0.0f;
    sd[q * NDP + k] = k < R ? round_act<ActT>(v) : v;
  }
  __syncthreads();
  /* dt chains: from 0 over k ascending, one per sequence (scan_dt's) */
  float acc[SQ];
#pragma unroll
  for (int q = 0; q < SQ; q++) acc[q] = 0.0f;
  int k = 0;
  if constexpr (SQ == 1) {
#pragma unroll 8
    for (; k < R; k++) acc[0] = __fmaf_rn(sd[k], sw[tid * RP + k], acc[0]);
  } else if (vec) {
    for (; k + PV <= R; k += PV) {
      uint4 raw = *(const uint4 *)(wr + k);
      const WT *wp = (const WT *)&raw;
      float w[PV];
#pragma unroll
      for (int j = 0; j < PV; j++) w[j] = ld_f32(wp + j);
#pragma unroll
      for (int q = 0; q < SQ; q++) { /* rows and k are float4-aligned: 16-byte reads */
        const float4 *dq = (const float4 *)(sd + q * NDP + k);
#pragma unroll
        for (int j4 = 0; j4 < PV / 4; j4++) {
          const float4 v = dq[j4];
          acc[q] = __fmaf_rn(v.x, w[4 * j4], acc[q]);
          acc[q] = __fmaf_rn(v.y, w[4 * j4 + 1], acc[q]);
          acc[q] = __fmaf_rn(v.z, w[4 * j4 + 2], acc[q]);
          acc[q] = __fmaf_rn(v.w, w[4 * j4 + 3], acc[q]);
        }
      }
    }
  }
  for (; k < R; k++) {
    const float w = ld_f32(wr + k);
#pragma unroll
    for (int q = 0; q < SQ; q++) acc[q] = __fmaf_rn(sd[q * NDP + k], w, acc[q]);
  }
#pragma unroll
  for (int q = 0; q < SQ; q++) {
    if (q >= nq) break;
    const int s = s0 + q;
    float x;
    if constexpr (KC > 0)
      x = conv_step_state<KC>(cstate + (int64_t)slots[s] * cslot + cc, di,
                              xz[(int64_t)s * ldxz + cc], wk, cb != nullptr, cbias, live);
    else
      x = xc[(int64_t)s * di + cc];
    float *hp = ssm_state + (int64_t)slots[s] * slot_stride + (int64_t)cc * N;
    float h[N];
    ld_f32x(hp, h);
    const float z = xz[(int64_t)s * ldxz + zoff + cc];
    const float *row = sd + q * NDP;
    const float v = scan_one_dt<N>(softplus_f(__fadd_rn(acc[q], bdt)), row + R, row + R + N, a,
                                   d, x, z, h);
    if (live) {
      st_act(y + (int64_t)s * di + c, v);
#pragma unroll
      for (int n = 0; n < N; n += 4)
        *(float4 *)(hp + n) = make_float4(h[n], h[n + 1], h[n + 2], h[n + 3]);
    }
  }
}

/* The decode step (T = 1): SSTEP_BT channels of SQ sequences per block; KC:
 * the fused conv's width (conv non-NULL), or 0. */
template <int N, typename ActT, int KC, int SQ>
static int scan_step_launch_sq(cudaStream_t s, int nseq, int di, int R, const float *xc,
                               const float *dbl, const ActT *dt_w, const ActT *dt_b,
                               const float *A, const float *D, const float *xz, int64_t ldxz,
                               int64_t zoff, float *ssm_state, int64_t slot_stride,
                               const int32_t *slots, const mbd_mops_conv *conv, ActT *y,
                               mbd_error *err) {
  const dim3 grid((unsigned)((di + SSTEP_BT - 1) / SSTEP_BT), (unsigned)((nseq + SQ - 1) / SQ));
  const size_t sh = sizeof(float) * ((SQ == 1 ? (size_t)SSTEP_BT * (R + 1) : 0) +
                                     (size_t)SQ * (size_t)((R + 2 * N + 3) & ~3));
  const int vec = ((uintptr_t)dt_w & 15) == 0 && (R * (int)sizeof(ActT)) % 16 == 0;
  const float *cw = conv ? conv->w : NULL, *cb = conv ? conv->bias : NULL;
  float *cst = conv ? conv->state : NULL;
  const int64_t cslot = conv ? conv->slot_stride : 0;
  int rc = allow_smem(k_scan_step<N, ActT, ActT, KC, SQ>, sh, err);
  if (rc < 0) return rc;
  return launch_pdl("selective scan (step)", k_scan_step<N, ActT, ActT, KC, SQ>, grid,
                    dim3(SSTEP_BT), sh, s, err, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz,
                    zoff, ssm_state, slot_stride, slots, cw, cb, cst, cslot, y, vec);
}

/* Sequences per block: the most of 8, 4, 2 that still leaves the grid
 * SSTEP_BLOCKS_PER_SM blocks per SM (a block's sequences run one after
 * another, so fewer, longer blocks would leave SMs idle: the 130m shape at
 * batch 256 has only 12 channel blocks per sequence), else 1. */
#define SSTEP_BLOCKS_PER_SM 3

static int scan_step_sq(int nseq, int di) {
  static int sms; /* the device's SM count, read once */
  if (!sms) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      v = 132;
    sms = v;
  }
  const int64_t cblocks = (di + SSTEP_BT - 1) / SSTEP_BT, want = (int64_t)SSTEP_BLOCKS_PER_SM * sms;
  for (int sq = 8; sq > 1; sq /= 2)
    if (cblocks * ((nseq + sq - 1) / sq) >= want) return sq;
  return 1;
}

template <int N, typename ActT, int KC>
static int scan_step_launch(cudaStream_t s, int nseq, int di, int R, const float *xc,
                            const float *dbl, const ActT *dt_w, const ActT *dt_b, const float *A,
                            const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                            float *ssm_state, int64_t slot_stride, const int32_t *slots,
                            const mbd_mops_conv *conv, ActT *y, mbd_error *err) {
#define SSTEP_SQ(SQ)                                                                            \
  case SQ:                                                                                      \
    return scan_step_launch_sq<N, ActT, KC, SQ>(s, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, \
                                                ldxz, zoff, ssm_state, slot_stride, slots,     \
                                                conv, y, err);
  switch (scan_step_sq(nseq, di)) {
    SSTEP_SQ(8)
    SSTEP_SQ(4)
    SSTEP_SQ(2)
    default: break;
  }
#undef SSTEP_SQ
  return scan_step_launch_sq<N, ActT, KC, 1>(s, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz,
                                             zoff, ssm_state, slot_stride, slots, conv, y, err);
}

/* The chunked scan (T > 1). It is a long, serial kernel: launched early
 * (PDL) its blocks would be packed onto the few SMs x_proj leaves free and
 * run slower, so it waits for its predecessor normally. */
template <int N, typename ActT>
static int scan_chunked_launch(cudaStream_t s, int nseq, int T, int di, int R, const float *xc,
                               const float *dbl, const ActT *dt_w, const ActT *dt_b,
                               const float *A, const float *D, const float *xz, int64_t ldxz,
                               int64_t zoff, float *ssm_state, int64_t slot_stride,
                               const int32_t *slots, ActT *y, mbd_error *err) {
  const size_t ts = (size_t)(T < SCAN_TC ? T : SCAN_TC);
  /* k_scan's shared memory for N states: weights [R][cb], dt [ts][cb],
   * h_t [ts][(N + 1) cb], two stage buffers of x, z [ts][cb] and the x_proj
   * rows [ts][(R + 2N) | 1] (the layout at the top of k_scan) */
  const int cb = SCAN_THREADS / N;
  const size_t ndp = (size_t)((R + 2 * N) | 1);
  const size_t sh = sizeof(float) * ((size_t)R * cb + ts * cb + ts * (N + 1) * cb +
                                     2 * (2 * ts * cb + ts * ndp));
  int rc = allow_smem(k_scan<N, ActT, ActT>, sh, err);
  if (rc < 0) return rc;
  return launch_ex(false, "selective scan", k_scan<N, ActT, ActT>,
                   dim3((unsigned)((di + cb - 1) / cb), (unsigned)nseq), dim3(SCAN_THREADS), sh, s,
                   err, T, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz, zoff, ssm_state,
                   slot_stride, slots, y);
}

template <int N, typename ActT>
static int scan_launch(cudaStream_t s, int nseq, int T, int di, int R, const float *xc,
                       const float *dbl, const ActT *dt_w, const ActT *dt_b, const float *A,
                       const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                       float *ssm_state, int64_t slot_stride, const int32_t *slots,
                       const mbd_mops_conv *conv, ActT *y, mbd_error *err) {
  if (T == 1 && conv)
    return scan_step_launch<N, ActT, XPF_KC>(s, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz,
                                             zoff, ssm_state, slot_stride, slots, conv, y, err);
  if (T == 1)
    return scan_step_launch<N, ActT, 0>(s, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz,
                                        zoff, ssm_state, slot_stride, slots, conv, y, err);
  return scan_chunked_launch<N, ActT>(s, nseq, T, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz,
                                      zoff, ssm_state, slot_stride, slots, y, err);
}

extern "C" int mbd_mops_scan(void *stream, int nseq, int T, int di, int N, int R,
                             const float *xc, const float *dbl, mbd_dtype wdt, const void *dt_w,
                             const void *dt_b, const float *A, const float *D, const float *xz,
                             int64_t ldxz, int64_t zoff, float *ssm_state, int64_t slot_stride,
                             const int32_t *slots, const mbd_mops_conv *conv, mbd_dtype act,
                             void *y, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (conv && !conv_fusable(T, conv->K, act))
    return mbd_error_set(err, MBD_E_INVALID,
                         "scan: conv fused for %d tokens, width %d, %s: not a fused decode "
                         "shape (mbd_mops_conv_fused)", T, conv->K, mbd_dtype_name(act));
  if (R <= 0 || R > 4096 || nseq > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "scan: dt_rank %d or %d sequences out of range", R,
                         nseq);
  if (di <= 0)
    return mbd_error_set(err, MBD_E_INVALID, "scan: d_inner %d out of range", di);
  if (wdt != act)
    return mbd_error_set(err, MBD_E_INVALID, "scan: weight dtype %s differs from activation %s",
                         mbd_dtype_name(wdt), mbd_dtype_name(act));
  cudaStream_t s = (cudaStream_t)stream;
#define SCAN_N(NN, T_)                                                                      \
  case NN:                                                                                  \
    return scan_launch<NN, T_>(s, nseq, T, di, R, xc, dbl, (const T_ *)dt_w, (const T_ *)dt_b, \
                               A, D, xz, ldxz, zoff, ssm_state, slot_stride, slots, conv,   \
                               (T_ *)y, err);
#define SCAN(T_)                                                                            \
  switch (N) {                                                                              \
    SCAN_N(4, T_) SCAN_N(8, T_) SCAN_N(16, T_) SCAN_N(32, T_)                               \
  default: return mbd_error_set(err, MBD_E_INVALID, "d_state %d not in {4,8,16,32}", N);     \
  }
  MBD_ACT_DISPATCH(act, SCAN)
#undef SCAN
#undef SCAN_N
  return 0;
}
