/* dt_proj + selective scan + D skip + SiLU gate (see scan.h): the chunked
 * prefill kernel and the single-step decode kernel, the same arithmetic per
 * step. */
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/scan.h"
#include "kernels/cuda/ops/scan_exp.cuh"
#include "kernels/cuda/ops/scan_prefill.h"
#include "kernels/cuda/ops/silu_group.cuh"

#define SCAN_THREADS 128 /* threads per chunked-scan block: 128 / N channels x N states */
#define SCAN_TC 16 /* time steps staged per chunk */

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
 * so prefill == decode). The state is stored as ST (sp_st: f32, or bf16
 * rounded after every step). Per step (model-kernel contract, docs/route.md):
 *   dt_raw = (fmaf chain over k = 0..R-1 ascending from 0 of
 *             round_act(dbl[k]) * widen(dt_w[c, k])) + widen(dt_b[c])
 *            (the f32 GEMM contract; dt_low rounded to the storage dtype as a
 *             GEMM input would be);
 *   dt = softplus(dt_raw), then mbd_cpu_scan_step's roundings. */
template <int N, typename ActT, typename WT, typename ST>
__global__ void __launch_bounds__(SCAN_THREADS)
    k_scan(int T, int di, int R, const float *__restrict__ xc, const float *__restrict__ dbl,
           const WT *__restrict__ dt_w, const WT *__restrict__ dt_b,
           const float *__restrict__ A, const float *__restrict__ Dv,
           const float *__restrict__ xz, int64_t ldxz, int64_t zoff,
           ST *__restrict__ ssm_state, int64_t slot_stride,
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
  ST *hp = ssm_state + (int64_t)slots[s] * slot_stride + (int64_t)cc * N + n;
  float h = sp_st<ST>::ld(hp);

  for (int q = 0; q < nchunk; q++) {
    cp_async_wait_group<0>();
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
        h = sp_st<ST>::rnd(__fmaf_rn(dA[t], h, u[t]));
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
  if (live) sp_st<ST>::put(hp, h);
}

/* The T = 1 (decode) form of k_scan: the same per-step arithmetic, statement
 * for statement (a decode step must give the bits of one prefill step), with
 * none of the chunk staging. A block runs SSTEP_BT channels of a contiguous
 * range of sequences, SQ at a time: thread c reads its channel's dt_proj row
 * once per SQ sequences, with 16-byte loads from L2, and runs their dt chains
 * side by side over it (the weights cross L2 once per SQ sequences), then
 * the SQ sequences' steps one after another. Each chain is one sequence's
 * alone, in k order, so SQ and the ranges only change speed, never bits.
 *
 * SQ > 1: the state rows (and x, z, the conv window) are streamed: while
 * sequence i's step runs, cp.async moves sequence i + 1's into the other of
 * two shared-memory buffers, so a warp never waits on a load it could have
 * issued earlier, and the data in flight takes no registers. Each warp moves
 * and stores the rows of its own 32 channels, lane l the 16-byte pieces l,
 * l + 32, ... (coalesced), so it synchronises only with itself. Its form
 * V > 0 (V = 0 is the plainer one; sstep_form picks) spends fewer
 * instructions a step: the group's
 * gates SiLU(z) run side by side (silu_group) while the dt chains are
 * done, B and C are staged 16-byte aligned for float4 reads, and a bf16
 * state is rounded two entries per instruction, whose packed words are
 * stored as they are (sstep_one).
 *
 * SQ = 1 (small batches, a range of one sequence, latency-bound): the
 * block's dt_proj rows are copied to shared memory before the PDL wait,
 * overlapping the x_proj kernel, and the sequence's state and inputs are
 * loaded into registers before its dt chain runs. */
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

/* A state row of N entries of ST (sp_st) in pieces of PB bytes (16; a bf16
 * row of 4 entries is one piece of 8): EP entries a piece, NP pieces. */
template <int N, typename ST>
struct srow {
  static constexpr int RB = N * (int)sizeof(ST);
  static constexpr int PB = RB < 16 ? RB : 16, EP = PB / (int)sizeof(ST), NP = N / EP;
};
/* The EP entries of one piece at p (aligned to its bytes), widened into o. */
template <typename ST, int EP>
__device__ __forceinline__ void srow_ld(const ST *p, float *o) {
  if constexpr (std::is_same<ST, float>::value) {
    const float4 v = *(const float4 *)p;
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
  } else { /* bf16: a float's upper half */
    unsigned w[EP / 2];
    if constexpr (EP == 8) {
      const uint4 v = *(const uint4 *)p;
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      const uint2 v = *(const uint2 *)p;
      w[0] = v.x, w[1] = v.y;
    }
#pragma unroll
    for (int j = 0; j < EP / 2; j++)
      o[2 * j] = __uint_as_float(w[j] << 16), o[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}
/* Stores the EP entries v of one piece at p, already rounded to ST (exact). */
template <typename ST, int EP>
__device__ __forceinline__ void srow_put(ST *p, const float *v) {
  if constexpr (std::is_same<ST, float>::value) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    unsigned w[EP / 2];
#pragma unroll
    for (int j = 0; j < EP / 2; j++)
      w[j] = __float_as_uint(v[2 * j]) >> 16 | (__float_as_uint(v[2 * j + 1]) & 0xffff0000u);
    if constexpr (EP == 8)
      *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
    else
      *(uint2 *)p = make_uint2(w[0], w[1]);
  }
}
/* One piece of PB bytes from src to dst: by cp.async (global to shared), or a copy. */
template <int PB>
__device__ __forceinline__ void srow_cp_async(void *dst, const void *src) {
  if constexpr (PB == 16) {
    cp_async16(dst, src);
  } else {
    cp_async4(dst, src);
    cp_async4((char *)dst + 4, (const char *)src + 4);
  }
}
template <int PB>
__device__ __forceinline__ void srow_copy(const void *src, void *dst) {
  if constexpr (PB == 16) {
    const float4 v = *(const float4 *)src;
    *(float4 *)dst = v;
  } else {
    const uint2 v = *(const uint2 *)src;
    *(uint2 *)dst = v;
  }
}
/* A whole row of N entries at p (aligned to its pieces), widened / stored. */
template <int N, typename ST>
__device__ __forceinline__ void srow_ld_all(const ST *p, float (&h)[N]) {
  if constexpr (std::is_same<ST, float>::value) {
    ld_f32x(p, h);
  } else {
    using W = srow<N, ST>;
#pragma unroll
    for (int i = 0; i < W::NP; i++) srow_ld<ST, W::EP>(p + W::EP * i, h + W::EP * i);
  }
}
template <int N, typename ST>
__device__ __forceinline__ void srow_put_all(ST *p, const float (&h)[N]) {
  if constexpr (std::is_same<ST, float>::value) {
#pragma unroll
    for (int n = 0; n < N; n += 4)
      *(float4 *)(p + n) = make_float4(h[n], h[n + 1], h[n + 2], h[n + 3]);
  } else {
    using W = srow<N, ST>;
#pragma unroll
    for (int i = 0; i < W::NP; i++) srow_put<ST, W::EP>(p + W::EP * i, h + W::EP * i);
  }
}

/* Piece p of staged state row r (NP pieces, unpadded) is stored at piece
 * p ^ sstep_swz<NP>(r): the 8 threads of a quarter warp reading piece p of
 * their own rows, and the 8 lanes storing consecutive pieces of the warp's
 * rows, then fall in distinct banks (f32 rows: NP = N / 4). */
template <int NP>
__device__ __forceinline__ int sstep_swz(int r) {
  constexpr int D = NP >= 8 ? 1 : 8 / NP;
  return (r / D) % NP;
}
/* Lane `lane`'s share of a warp's 32 staged state rows: pieces e = lane + 32 i
 * (i < NP), row e / NP, piece e % NP. Its element offset among the staged
 * (swizzled) rows, and among the rows as stored from the warp's first row:
 * EP e, since N = NP EP. Because 32 / NP rows later the swizzle has moved by
 * 4 (sstep_swz's D divides 32 / NP), it changes with i only where NP = 8, so
 * elsewhere piece i sits 32 EP elements after piece 0 in both: a fixed base
 * and immediate offsets instead of each piece's own address arithmetic. */
template <int NP, int EP>
__device__ __forceinline__ int sstep_staged_off(int lane, int i) {
  const int r = lane / NP + i * (32 / NP);
  return r * NP * EP + EP * ((lane % NP) ^ sstep_swz<NP>(r));
}
/* Per-channel rows of one stage buffer besides the state: x (xc, or xz's x
 * part with the conv fused), z, and the conv window's KC - 1 taps. */
__host__ __device__ constexpr int sstep_nx(int KC) { return 2 + (KC > 0 ? KC - 1 : 0); }

/* Shared memory of k_scan_step, in floats: the SQ staged x_proj rows, then
 * SQ = 1: the block's weights; SQ > 1: two stage buffers of state rows (N
 * entries of ES bytes) and x / z / window rows, the SQ sequences' dt and
 * (OLD false) their gates. */
__host__ __device__ constexpr size_t sstep_smem_floats(int N, int KC, int SQ, int R, int ES,
                                                       bool OLD) {
  return (size_t)SQ * ((R + 2 * N + 3) & ~3) +
         (SQ == 1 ? (size_t)SSTEP_BT * (R + 1)
                  : 2 * (size_t)SSTEP_BT * ((size_t)N * ES / 4 + sstep_nx(KC)) +
                        (size_t)(OLD ? 1 : 2) * SQ * SSTEP_BT);
}

/* The blocks an SM that k_scan_step's launch bounds ask for, which sets its
 * register cap: at d_state > 16, 3 (one sequence a block) or 4; otherwise
 * 7, and 8 for the streaming forms over a bf16 state, where the extra warps
 * measured faster (over an f32 state, slower: docs/benchmarks.md). */
__host__ __device__ constexpr int sstep_min_blocks(int N, int SQ, size_t st_bytes) {
  return N > 16 ? (SQ == 1 ? 3 : 4) : (SQ > 1 && st_bytes == 2 ? 8 : 7);
}

/* One streamed step of one channel (k_scan_step, SQ > 1, V > 0):
 * sp_one_dt's statements, with B and C read as float4 (16-byte aligned),
 * the gate g = SiLU(z) computed beforehand (silu_group), and a bf16 state's
 * entries rounded in pairs by one cvt.rn.bf16x2.f32 (each entry rounded to
 * nearest even, as __float2bfloat16_rn rounds it): w[j] holds entries 2j
 * (low half) and 2j + 1, the words srow_put would store. */
template <int N, typename ST>
__device__ __forceinline__ float sstep_one(float dt, const float *B, const float *C,
                                           const float (&a)[N], float amax, float d, float x,
                                           float g, float (&h)[N], uint32_t (&w)[N / 2]) {
  if (sp_exp_fast(__fmul_rn(dt, amax))) {
#pragma unroll
    for (int n = 0; n < N; n += 4) {
      const float4 b4 = *(const float4 *)(B + n);
      const float bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int i = 0; i < 4; i++)
        h[n + i] = __fmaf_rn(sp_exp_in_range(__fmul_rn(dt, a[n + i])), h[n + i],
                             __fmul_rn(__fmul_rn(dt, bv[i]), x));
    }
  } else {
#pragma unroll
    for (int n = 0; n < N; n++) h[n] = scan_state(dt, a[n], B[n], x, h[n]);
  }
  if constexpr (!std::is_same<ST, float>::value) {
#pragma unroll
    for (int j = 0; j < N / 2; j++) {
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[j]) : "f"(h[2 * j + 1]), "f"(h[2 * j]));
      h[2 * j] = __uint_as_float(w[j] << 16);
      h[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
  float acc = 0.0f;
#pragma unroll
  for (int n = 0; n < N; n += 4) {
    const float4 c4 = *(const float4 *)(C + n);
    acc = __fmaf_rn(h[n], c4.x, acc);
    acc = __fmaf_rn(h[n + 1], c4.y, acc);
    acc = __fmaf_rn(h[n + 2], c4.z, acc);
    acc = __fmaf_rn(h[n + 3], c4.w, acc);
  }
  acc = __fmaf_rn(d, x, acc);
  return __fmul_rn(acc, g);
}

/* KC > 0 (the decode fusion, after k_conv_xproj): x is not read from xc but
 * recomputed by conv_silu_out from xz's x part and the conv window, and this
 * thread, the only one of the grid on its (slot, channel), shifts the window
 * (the oldest input out, the new one in); see k_conv_xproj for why the state is written
 * here. vec: every dt_proj row is 16-byte aligned (checked on the host), so
 * it is read in 16-byte pieces. Block y runs the sequences
 * [y nseq / G, (y + 1) nseq / G), G = gridDim.y <= nseq. The state is stored
 * as ST (sp_st), moved in srow's pieces. */
template <int N, typename ActT, typename WT, int KC, int SQ, typename ST, int V>
__global__ void __launch_bounds__(SSTEP_BT, sstep_min_blocks(N, SQ, sizeof(ST)))
    k_scan_step(int nseq, int di, int R, const float *__restrict__ xc,
                const float *__restrict__ dbl, const WT *__restrict__ dt_w,
                const WT *__restrict__ dt_b, const float *__restrict__ A,
                const float *__restrict__ Dv, const float *__restrict__ xz, int64_t ldxz,
                int64_t zoff, ST *__restrict__ ssm_state, int64_t slot_stride,
                const int32_t *__restrict__ slots, const float *__restrict__ cw,
                const float *__restrict__ cb, float *__restrict__ cstate, int64_t cslot,
                ActT *__restrict__ y, int vec) {
  constexpr int PV = 16 / sizeof(WT); /* weights per 16-byte load */
  constexpr int NX = sstep_nx(KC);
  constexpr int NP = srow<N, ST>::NP, EP = srow<N, ST>::EP, PB = srow<N, ST>::PB;
  extern __shared__ float4 step_sm4[];
  const int ND = R + 2 * N;
  const int NDP = (ND + 3) & ~3; /* staged row stride: float4-aligned rows */
  const int RP = R + 1;          /* SQ = 1: padded weight row, conflict-free column reads */
  float *sd = (float *)step_sm4; /* [SQ][NDP]: round_act(dt_low), B, C */
  float *sw = sd + SQ * NDP;     /* SQ = 1: [SSTEP_BT][RP] */
  ST *sst = (ST *)sw; /* SQ > 1: [2][SSTEP_BT][N] state rows (swizzled) */
  /* SQ > 1: [2][NX][SSTEP_BT] x, z, window taps */
  float *sxz = sw + 2 * SSTEP_BT * N * (int)sizeof(ST) / 4;
  float *sdt = sxz + 2 * NX * SSTEP_BT; /* SQ > 1: [SQ][SSTEP_BT] the group's dt */
  float *sgz = sdt + SQ * SSTEP_BT;     /* SQ > 1, V > 0: [SQ][SSTEP_BT] their gates */
  constexpr bool NEW = SQ > 1 && V > 0;
  /* NEW: B and C staged from the first multiple of 4 at or after R (16-byte aligned) */
  const int RB = NEW ? (R + 3) & ~3 : R;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c0 = blockIdx.x * SSTEP_BT, c = c0 + tid;
  const int wc0 = c0 + 32 * warp; /* the warp's first channel */
  const bool wfull = wc0 + 32 <= di; /* all 32 of the warp's channels are live */
  const int sb = (int)((int64_t)blockIdx.y * nseq / gridDim.y);
  const int se = (int)((int64_t)(blockIdx.y + 1) * nseq / gridDim.y);
  const bool live = c < di;
  const int cc = live ? c : di - 1;
  if constexpr (SQ == 1)
    stage_dt_w<SSTEP_BT>(sw, RP, dt_w + (int64_t)c0 * R, min(SSTEP_BT, di - c0) * R, R, vec, tid);
  float a[N];
  ld_f32x(A + (int64_t)cc * N, a);
  const float amax = sp_absmax(a);
  const float d = Dv[cc];
  const float bdt = ld_f32(dt_b + cc);
  const WT *wr = dt_w + (int64_t)cc * R;
  float wk[KC > 0 ? KC : 1], cbias = 0.0f;
  if constexpr (KC > 0) {
#pragma unroll
    for (int j = 0; j < KC; j++) wk[j] = cw[(int64_t)j * di + cc];
    if (cb) cbias = cb[cc];
  }
  /* SQ > 1: starts the copies of sequence s's inputs into stage buffer b
   * (none past the range; the group is committed either way, so that
   * cp_async_wait_group<1> always leaves exactly the newest one pending). Dead
   * channels' rows hold channel di - 1's. */
  auto fetch = [&](int s, int b) {
    if (s < se) {
      const ST *g = ssm_state + (int64_t)slots[s] * slot_stride;
      ST *dst = sst + (b * SSTEP_BT + 32 * warp) * N;
      if (wfull) {
        const ST *gw = g + (int64_t)wc0 * N + EP * lane;
#pragma unroll
        for (int i = 0; i < NP; i++)
          srow_cp_async<PB>(dst + sstep_staged_off<NP, EP>(lane, i), gw + 32 * EP * i);
      } else {
#pragma unroll
        for (int e = lane; e < 32 * NP; e += 32) {
          const int r = e / NP, p = e - r * NP;
          srow_cp_async<PB>(dst + r * N + EP * (p ^ sstep_swz<NP>(r)),
                            g + (int64_t)min(wc0 + r, di - 1) * N + EP * p);
        }
      }
      float *sx = sxz + b * NX * SSTEP_BT + tid;
      if constexpr (KC > 0) {
        cp_async4(sx, xz + (int64_t)s * ldxz + cc);
        const float *cs = cstate + (int64_t)slots[s] * cslot + cc;
#pragma unroll
        for (int j = 0; j < KC - 1; j++) cp_async4(sx + (2 + j) * SSTEP_BT, cs + (int64_t)j * di);
      } else {
        cp_async4(sx, xc + (int64_t)s * di + cc);
      }
      if constexpr (!NEW) cp_async4(sx + SSTEP_BT, xz + (int64_t)s * ldxz + zoff + cc);
    }
    cp_async_commit();
  };
  if constexpr (SQ > 1) { /* the block's dt_proj rows (contiguous) toward L2, all at once */
    const char *g = (const char *)(dt_w + (int64_t)c0 * R);
    const int bytes = min(SSTEP_BT, di - c0) * R * (int)sizeof(WT);
    for (int o = tid * 128; o < bytes; o += SSTEP_BT * 128) prefetch_l2(g + o);
  }
  pdl_wait(); /* activations and state only from here on */
  pdl_trigger();
  if constexpr (SQ > 1) fetch(sb, 0);
  for (int q0 = sb; q0 < se; q0 += SQ) {
    const int nq = min(SQ, se - q0);
    if (q0 != sb) __syncthreads(); /* the previous group's rows are read */
    if constexpr (NEW) { /* the group's rows by cp.async, all in flight, then dt_low rounded */
      for (int q = 0; q < nq; q++)
        for (int k = tid; k < ND; k += SSTEP_BT)
          cp_async4(sd + q * NDP + (k < R ? k : k + RB - R), dbl + (int64_t)(q0 + q) * ND + k);
      cp_async_commit();
      cp_async_wait_group<0>(); /* (the next sequence's rows too, if in flight) */
      if constexpr (!std::is_same<ActT, float>::value)
        for (int q = 0; q < nq; q++)
          for (int k = tid; k < R; k += SSTEP_BT)
            sd[q * NDP + k] = round_act<ActT>(sd[q * NDP + k]);
    } else {
      for (int e = tid; e < nq * ND; e += SSTEP_BT) {
        const int q = e / ND, k = e - q * ND;
        const float v = dbl[(int64_t)(q0 + q) * ND + k];
        sd[q * NDP + k] = k < R ? round_act<ActT>(v) : v;
      }
    }
    __syncthreads();
    if constexpr (SQ == 1) {
      const int s = q0;
      ST *hp = ssm_state + (int64_t)slots[s] * slot_stride + (int64_t)cc * N;
      float h[N];
      srow_ld_all<N>(hp, h);
      const float z = xz[(int64_t)s * ldxz + zoff + cc];
      float xin, win[KC > 1 ? KC - 1 : 1];
      float *cs = nullptr;
      if constexpr (KC > 0) {
        cs = cstate + (int64_t)slots[s] * cslot + cc;
        xin = xz[(int64_t)s * ldxz + cc];
#pragma unroll
        for (int j = 0; j < KC - 1; j++) win[j] = cs[(int64_t)j * di];
      } else {
        xin = xc[(int64_t)s * di + cc];
      }
      float acc = 0.0f; /* scan_dt's chain */
#pragma unroll 8
      for (int k = 0; k < R; k++) acc = __fmaf_rn(sd[k], sw[tid * RP + k], acc);
      float x = xin;
      if constexpr (KC > 0) {
        x = conv_silu_out<KC>(wk, win, xin, cb != nullptr, cbias);
        if (live) { /* the window advances in place */
#pragma unroll
          for (int j = 0; j + 1 < KC - 1; j++) cs[(int64_t)j * di] = win[j + 1];
          cs[(int64_t)(KC - 2) * di] = xin;
        }
      }
      const float v = sp_one_dt<N, ST>(sp_softplus(__fadd_rn(acc, bdt)), sd + R, sd + R + N,
                                       a, amax, d, x, z, h);
      if (live) {
        st_act(y + (int64_t)s * di + c, v);
        srow_put_all<N>(hp, h);
      }
    } else {
      /* dt chains: from 0 over k ascending, one per sequence (scan_dt's) */
      float acc[SQ];
#pragma unroll
      for (int q = 0; q < SQ; q++) acc[q] = 0.0f;
      int k = 0;
      if (vec) {
        /* one 16-byte piece of the row into the chains, k ascending */
        const auto piece = [&](const uint4 &raw, int k) {
          const WT *wp = (const WT *)&raw;
          float w[PV];
#pragma unroll
          for (int j = 0; j < PV; j++) w[j] = ld_f32(wp + j);
#pragma unroll
          for (int q = 0; q < SQ; q++) { /* rows and k are float4-aligned: 16-byte reads */
            if (q >= nq) break;
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
        };
        if constexpr (NEW) { /* the next two pieces in flight while two are chained */
          if (2 * PV <= R) {
            uint4 c0 = *(const uint4 *)wr, c1 = *(const uint4 *)(wr + PV);
            for (; k + 4 * PV <= R; k += 2 * PV) {
              const uint4 n0 = *(const uint4 *)(wr + k + 2 * PV);
              const uint4 n1 = *(const uint4 *)(wr + k + 3 * PV);
              piece(c0, k);
              piece(c1, k + PV);
              c0 = n0, c1 = n1;
            }
            piece(c0, k);
            piece(c1, k + PV);
            k += 2 * PV;
          }
        } else {
          for (; k + 4 * PV <= R; k += 4 * PV) { /* four pieces' loads in flight */
            uint4 rw[4];
#pragma unroll
            for (int i = 0; i < 4; i++) rw[i] = *(const uint4 *)(wr + k + i * PV);
#pragma unroll
            for (int i = 0; i < 4; i++) piece(rw[i], k + i * PV);
          }
        }
        for (; k + PV <= R; k += PV) piece(*(const uint4 *)(wr + k), k);
      }
      for (; k < R; k++) {
        const float w = ld_f32(wr + k);
#pragma unroll
        for (int q = 0; q < SQ; q++) {
          if (q >= nq) break;
          acc[q] = __fmaf_rn(sd[q * NDP + k], w, acc[q]);
        }
      }
      /* each thread's dt of the group's sequences, in its own column */
      if constexpr (NEW) { /* softplus and SiLU(z) of the group, side by side */
        float zg[SQ]; /* the group's z, loaded under the softplus */
#pragma unroll
        for (int q = 0; q < SQ; q++)
          zg[q] = q < nq ? xz[(int64_t)(q0 + q) * ldxz + zoff + cc] : 0.0f;
#pragma unroll
        for (int q = 0; q < SQ; q++) acc[q] = __fadd_rn(acc[q], bdt);
        sp_softplus_group<SQ>(acc);
#pragma unroll
        for (int q = 0; q < SQ; q++)
          if (q < nq) sdt[q * SSTEP_BT + tid] = acc[q];
        silu_group<SQ>(zg);
#pragma unroll
        for (int q = 0; q < SQ; q++)
          if (q < nq) sgz[q * SSTEP_BT + tid] = zg[q];
      } else {
#pragma unroll
        for (int q = 0; q < SQ; q++)
          if (q < nq) sdt[q * SSTEP_BT + tid] = sp_softplus(__fadd_rn(acc[q], bdt));
      }
      for (int q = 0; q < nq; q++) {
        const int s = q0 + q, b = (s - sb) & 1;
        fetch(s + 1, b ^ 1);
        cp_async_wait_group<1>();
        __syncwarp(); /* the warp's copies of sequence s are visible */
        ST *hs = sst + (b * SSTEP_BT + tid) * N;
        const int sw_t = sstep_swz<NP>(tid);
        const float *sx = sxz + b * NX * SSTEP_BT + tid;
        float x = sx[0];
        if constexpr (KC > 0) {
          float win[KC - 1];
#pragma unroll
          for (int j = 0; j < KC - 1; j++) win[j] = sx[(2 + j) * SSTEP_BT];
          x = conv_silu_out<KC>(wk, win, sx[0], cb != nullptr, cbias);
          if (live) { /* the window advances in place */
            float *cs = cstate + (int64_t)slots[s] * cslot + cc;
#pragma unroll
            for (int j = 0; j + 1 < KC - 1; j++) cs[(int64_t)j * di] = win[j + 1];
            cs[(int64_t)(KC - 2) * di] = sx[0];
          }
        }
        float h[N];
#pragma unroll
        for (int p = 0; p < NP; p++) srow_ld<ST, EP>(hs + EP * (p ^ sw_t), h + EP * p);
        const float *row = sd + q * NDP;
        if constexpr (NEW) {
          uint32_t w[N / 2];
          const float v = sstep_one<N, ST>(sdt[q * SSTEP_BT + tid], row + RB, row + RB + N, a,
                                           amax, d, x, sgz[q * SSTEP_BT + tid], h, w);
          if (live) st_act(y + (int64_t)s * di + c, v);
#pragma unroll
          for (int p = 0; p < NP; p++) {
            ST *dp = hs + EP * (p ^ sw_t);
            if constexpr (std::is_same<ST, float>::value)
              srow_put<ST, EP>(dp, h + EP * p);
            else if constexpr (EP == 8)
              *(uint4 *)dp = make_uint4(w[4 * p], w[4 * p + 1], w[4 * p + 2], w[4 * p + 3]);
            else
              *(uint2 *)dp = make_uint2(w[2 * p], w[2 * p + 1]);
          }
        } else {
          const float v = sp_one_dt<N, ST>(sdt[q * SSTEP_BT + tid], row + R, row + R + N, a,
                                           amax, d, x, sx[SSTEP_BT], h);
          if (live) st_act(y + (int64_t)s * di + c, v);
#pragma unroll
          for (int p = 0; p < NP; p++) srow_put<ST, EP>(hs + EP * (p ^ sw_t), h + EP * p);
        }
        __syncwarp(); /* the warp's new rows are in shared memory */
        ST *g = ssm_state + (int64_t)slots[s] * slot_stride;
        const ST *src = sst + (b * SSTEP_BT + 32 * warp) * N;
        if (wfull) {
          ST *gw = g + (int64_t)wc0 * N + EP * lane;
#pragma unroll
          for (int i = 0; i < NP; i++)
            srow_copy<PB>(src + sstep_staged_off<NP, EP>(lane, i), gw + 32 * EP * i);
        } else {
#pragma unroll
          for (int e = lane; e < 32 * NP; e += 32) {
            const int r = e / NP, p = e - r * NP;
            if (wc0 + r < di)
              srow_copy<PB>(src + r * N + EP * (p ^ sstep_swz<NP>(r)),
                            g + (int64_t)(wc0 + r) * N + EP * p);
          }
        }
        __syncwarp(); /* buffer b is free for sequence s + 2 */
      }
    }
  }
}

/* The decode step (T = 1): SSTEP_BT channels of one of G ranges of sequences
 * per block; KC: the fused conv's width (conv non-NULL), or 0; V: the
 * streaming kernel's form (1, or 0: sstep_form). */
template <int N, typename ActT, int KC, int SQ, typename ST, int V>
static int scan_step_launch_sq(cudaStream_t s, int nseq, int G, int di, int R, const float *xc,
                               const float *dbl, const ActT *dt_w, const ActT *dt_b,
                               const float *A, const float *D, const float *xz, int64_t ldxz,
                               int64_t zoff, ST *ssm_state, int64_t slot_stride,
                               const int32_t *slots, const mbd_mops_conv *conv, ActT *y,
                               mbd_error *err) {
  const dim3 grid((unsigned)((di + SSTEP_BT - 1) / SSTEP_BT), (unsigned)G);
  const size_t sh = sizeof(float) * sstep_smem_floats(N, KC, SQ, R, (int)sizeof(ST), V == 0);
  const int vec = ((uintptr_t)dt_w & 15) == 0 && (R * (int)sizeof(ActT)) % 16 == 0;
  const float *cw = conv ? conv->w : NULL, *cb = conv ? conv->bias : NULL;
  float *cst = conv ? conv->state : NULL;
  const int64_t cslot = conv ? conv->slot_stride : 0;
  int rc = allow_smem(k_scan_step<N, ActT, ActT, KC, SQ, ST, V>, sh, err);
  if (rc < 0) return rc;
  return launch_pdl("selective scan (step)", k_scan_step<N, ActT, ActT, KC, SQ, ST, V>, grid,
                    dim3(SSTEP_BT), sh, s, err, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz,
                    zoff, ssm_state, slot_stride, slots, cw, cb, cst, cslot, y, vec);
}

/* The device's SM count, read once. */
static int sstep_sms(void) {
  static int sms;
  if (!sms) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      v = 132;
    sms = v;
  }
  return sms;
}

/* Blocks of k_scan_step<N, ActT, KC, SQ, ST, V> resident per SM at dt rank
 * R, asked once per instantiation and R (after allowing the kernel its
 * shared memory, as the launch does; 1 if the query fails). */
template <int N, typename ActT, int KC, int SQ, typename ST, int V>
static int sstep_blocks_per_sm(int R) {
  static int bps, bps_r;
  if (!bps || bps_r != R) {
    const size_t sh = sizeof(float) * sstep_smem_floats(N, KC, SQ, R, (int)sizeof(ST), V == 0);
    int v = 0;
    if ((sh > 48 * 1024 &&
         cudaFuncSetAttribute(k_scan_step<N, ActT, ActT, KC, SQ, ST, V>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)sh) != cudaSuccess) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &v, k_scan_step<N, ActT, ActT, KC, SQ, ST, V>, SSTEP_BT, sh) != cudaSuccess ||
        v <= 0) {
      (void)cudaGetLastError();
      v = 1;
    }
    bps = v, bps_r = R;
  }
  return bps;
}

/* Which form of the streaming step runs (built in both for d_state 16 and
 * bf16 activations only; other shapes take V = 1). V = 0 streams faster
 * where each block's 128 channels are a small share of a wide d_inner
 * (the 1.4b and 2.8b shapes, 4096 and 5120: docs/benchmarks.md), V = 1
 * below that. MBD_SCAN_STEP (read at each launch, for the bench's
 * ablation) overrides: old or v0, v1, or other (the form the width would
 * not pick). Both forms give the same bits. */
static int sstep_form(int di) {
  const int by_width = di >= 4096 ? 0 : 1;
  const char *v = getenv("MBD_SCAN_STEP");
  if (!v) return by_width;
  if (!strcmp(v, "old") || !strcmp(v, "v0")) return 0;
  if (!strcmp(v, "v1")) return 1;
  if (!strcmp(v, "other")) return 1 - by_width;
  return by_width;
}

/* The streaming kernel over G ranges, SQ the power of two from 2 to 8
 * covering the longest range (a longer one runs its dt chains 8 sequences
 * at a time). */
template <int N, typename ActT, int KC, typename ST, int V>
static int scan_stream_launch(cudaStream_t s, int nseq, int di, int R, const float *xc,
                              const float *dbl, const ActT *dt_w, const ActT *dt_b,
                              const float *A, const float *D, const float *xz, int64_t ldxz,
                              int64_t zoff, ST *ssm_state, int64_t slot_stride,
                              const int32_t *slots, const mbd_mops_conv *conv, ActT *y,
                              mbd_error *err) {
#define SSTEP_SQ(SQ, G)                                                                        \
  return scan_step_launch_sq<N, ActT, KC, SQ, ST, V>(s, nseq, (int)(G), di, R, xc, dbl, dt_w, \
                                                       dt_b, A, D, xz, ldxz, zoff, ssm_state,   \
                                                       slot_stride, slots, conv, y, err)
  const int64_t cblocks = (di + SSTEP_BT - 1) / SSTEP_BT;
  int64_t G = sstep_sms() * sstep_blocks_per_sm<N, ActT, KC, 8, ST, V>(R) / cblocks;
  if (G > nseq) G = nseq;
  if (G < 1) G = 1;
  const int64_t per = (nseq + G - 1) / G; /* the longest range */
  if (per > 4) SSTEP_SQ(8, G);
  if (per > 2) SSTEP_SQ(4, G);
  SSTEP_SQ(2, G);
#undef SSTEP_SQ
}

/* One sequence per block with the staged weights (SQ = 1) while that grid
 * fits on the SMs at once. Otherwise the streaming kernel over sequence
 * ranges: as many as fill every SM with resident blocks once (resident
 * blocks / channel blocks, at most one per sequence), split as evenly as
 * possible so that all blocks end together, instead of a grid of short
 * blocks whose last wave leaves SMs idle. */
template <int N, typename ActT, int KC, typename ST>
static int scan_step_launch(cudaStream_t s, int nseq, int di, int R, const float *xc,
                            const float *dbl, const ActT *dt_w, const ActT *dt_b, const float *A,
                            const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                            ST *ssm_state, int64_t slot_stride, const int32_t *slots,
                            const mbd_mops_conv *conv, ActT *y, mbd_error *err) {
  const int64_t cblocks = (di + SSTEP_BT - 1) / SSTEP_BT;
  if (cblocks * nseq <= sstep_sms() * sstep_blocks_per_sm<N, ActT, KC, 1, ST, 1>(R))
    return scan_step_launch_sq<N, ActT, KC, 1, ST, 1>(s, nseq, nseq, di, R, xc, dbl, dt_w,
                                                          dt_b, A, D, xz, ldxz, zoff, ssm_state,
                                                          slot_stride, slots, conv, y, err);
#define SSTEP_V(V_)                                                                             \
  return scan_stream_launch<N, ActT, KC, ST, V_>(s, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, \
                                                 ldxz, zoff, ssm_state, slot_stride, slots,     \
                                                 conv, y, err)
  if constexpr (N == 16 && std::is_same<ActT, __nv_bfloat16>::value)
    if (sstep_form(di) == 0) SSTEP_V(0);
  SSTEP_V(1);
#undef SSTEP_V
}

/* The chunked scan (T > 1). It is a long, serial kernel: launched early
 * (PDL) its blocks would be packed onto the few SMs x_proj leaves free and
 * run slower, so it waits for its predecessor normally. */
template <int N, typename ActT, typename ST>
static int scan_chunked_launch(cudaStream_t s, int nseq, int T, int di, int R, const float *xc,
                               const float *dbl, const ActT *dt_w, const ActT *dt_b,
                               const float *A, const float *D, const float *xz, int64_t ldxz,
                               int64_t zoff, ST *ssm_state, int64_t slot_stride,
                               const int32_t *slots, ActT *y, mbd_error *err) {
  const size_t ts = (size_t)(T < SCAN_TC ? T : SCAN_TC);
  /* k_scan's shared memory for N states: weights [R][cb], dt [ts][cb],
   * h_t [ts][(N + 1) cb], two stage buffers of x, z [ts][cb] and the x_proj
   * rows [ts][(R + 2N) | 1] (the layout at the top of k_scan) */
  const int cb = SCAN_THREADS / N;
  const size_t ndp = (size_t)((R + 2 * N) | 1);
  const size_t sh = sizeof(float) * ((size_t)R * cb + ts * cb + ts * (N + 1) * cb +
                                     2 * (2 * ts * cb + ts * ndp));
  int rc = allow_smem(k_scan<N, ActT, ActT, ST>, sh, err);
  if (rc < 0) return rc;
  return launch_ex(false, "selective scan", k_scan<N, ActT, ActT, ST>,
                   dim3((unsigned)((di + cb - 1) / cb), (unsigned)nseq), dim3(SCAN_THREADS), sh, s,
                   err, T, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz, zoff, ssm_state,
                   slot_stride, slots, y);
}

template <int N, typename ActT, typename ST>
static int scan_launch(cudaStream_t s, int nseq, int T, int di, int R, const float *xc,
                       const float *dbl, const ActT *dt_w, const ActT *dt_b, const float *A,
                       const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                       ST *ssm_state, int64_t slot_stride, const int32_t *slots,
                       const mbd_mops_conv *conv, ActT *y, mbd_error *err) {
  if constexpr (!std::is_same<ActT, float>::value) /* (conv_fusable: 16-bit only) */
    if (T == 1 && conv)
      return scan_step_launch<N, ActT, XPF_KC, ST>(s, nseq, di, R, xc, dbl, dt_w, dt_b, A, D,
                                                   xz, ldxz, zoff, ssm_state, slot_stride, slots,
                                                   conv, y, err);
  if (T == 1)
    return scan_step_launch<N, ActT, 0, ST>(s, nseq, di, R, xc, dbl, dt_w, dt_b, A, D, xz, ldxz,
                                            zoff, ssm_state, slot_stride, slots, conv, y, err);
  return scan_chunked_launch<N, ActT, ST>(s, nseq, T, di, R, xc, dbl, dt_w, dt_b, A, D, xz,
                                          ldxz, zoff, ssm_state, slot_stride, slots, y, err);
}

/* mbd_mops_scan over a state stored as ST (float or __nv_bfloat16). */
template <typename ST>
static int scan_entry(void *stream, int nseq, int T, int di, int N, int R, const float *xc,
                      const float *dbl, mbd_dtype wdt, const void *dt_w, const void *dt_b,
                      const float *A, const float *D, const float *xz, int64_t ldxz,
                      int64_t zoff, ST *ssm_state, int64_t slot_stride, const int32_t *slots,
                      const mbd_mops_conv *conv, mbd_dtype act, void *y, mbd_error *err) {
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
  /* T > 1: scan_prefill.cu's kernel where it runs the shape, unless
   * MBD_SCAN_PREFILL=old (read at each launch) picks k_scan below, to
   * compare the two; both give the same bits */
  const char *pick = getenv("MBD_SCAN_PREFILL");
  if (T > 1 && !(pick && !strcmp(pick, "old")) && mbd_mops_scan_prefill_fits(N, R, dbl)) {
    if constexpr (std::is_same<ST, float>::value)
      return mbd_mops_scan_prefill(stream, nseq, T, di, N, R, xc, dbl, dt_w, dt_b, A, D, xz,
                                   ldxz, zoff, ssm_state, slot_stride, slots, act, y, err);
    else
      return mbd_mops_scan_prefill_bf16state(stream, nseq, T, di, N, R, xc, dbl, dt_w, dt_b, A,
                                             D, xz, ldxz, zoff, ssm_state, slot_stride, slots,
                                             act, y, err);
  }
  cudaStream_t s = (cudaStream_t)stream;
#define SCAN_N(NN, T_)                                                                      \
  case NN:                                                                                  \
    return scan_launch<NN, T_, ST>(s, nseq, T, di, R, xc, dbl, (const T_ *)dt_w,            \
                                   (const T_ *)dt_b, A, D, xz, ldxz, zoff, ssm_state,       \
                                   slot_stride, slots, conv, (T_ *)y, err);
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

extern "C" int mbd_mops_scan(void *stream, int nseq, int T, int di, int N, int R,
                             const float *xc, const float *dbl, mbd_dtype wdt, const void *dt_w,
                             const void *dt_b, const float *A, const float *D, const float *xz,
                             int64_t ldxz, int64_t zoff, float *ssm_state, int64_t slot_stride,
                             const int32_t *slots, const mbd_mops_conv *conv, mbd_dtype act,
                             void *y, mbd_error *err) {
  return scan_entry<float>(stream, nseq, T, di, N, R, xc, dbl, wdt, dt_w, dt_b, A, D, xz, ldxz,
                           zoff, ssm_state, slot_stride, slots, conv, act, y, err);
}

extern "C" int mbd_mops_scan_bf16state(void *stream, int nseq, int T, int di, int N, int R,
                                       const float *xc, const float *dbl, mbd_dtype wdt,
                                       const void *dt_w, const void *dt_b, const float *A,
                                       const float *D, const float *xz, int64_t ldxz,
                                       int64_t zoff, void *ssm_state, int64_t slot_stride,
                                       const int32_t *slots, const mbd_mops_conv *conv,
                                       mbd_dtype act, void *y, mbd_error *err) {
  /* the decode kernel moves state rows in pieces of min(16, 2N) bytes */
  const int pb = 2 * N < 16 ? 2 * N : 16;
  if (nseq > 0 && T > 0 && N > 0 && ((uintptr_t)ssm_state % pb || (slot_stride * 2) % pb))
    return mbd_error_set(err, MBD_E_INVALID,
                         "scan: bf16 state at %p, slot stride %lld: rows not %d-byte aligned",
                         ssm_state, (long long)slot_stride, pb);
  return scan_entry<__nv_bfloat16>(stream, nseq, T, di, N, R, xc, dbl, wdt, dt_w, dt_b, A, D,
                                   xz, ldxz, zoff, (__nv_bfloat16 *)ssm_state, slot_stride,
                                   slots, conv, act, y, err);
}
