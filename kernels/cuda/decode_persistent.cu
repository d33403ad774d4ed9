/* Persistent decode kernel (see decode_persistent.h).
 *
 * Work split, block b of nb (one per SM), per layer:
 *   A  blocks owning channels (groups G = b, b + nb, ... of 16: the x columns
 *      16G.. and the z columns di + 16G.., as two 8-row items each): the
 *      residual add of the previous layer's out_proj words as they arrive, the
 *      RMSNorm of all rows (the same bits in every owner), in_proj for its
 *      groups, the conv of its channels (it owns their conv state), and its
 *      groups' x_proj partials (the contract's one k16 step per 16-channel
 *      group and 16 outputs, mops_arith.cuh xp_group_partial) out as xq words;
 *   C  one owner warp per x_proj output folds that output's partials (the
 *      contract's lane sums and butterfly) into an xs word; every owner takes
 *      all xs words, then runs dt_proj + scan + D skip + gate of its channels
 *      (it owns their state) and sends y out as xy words, two channels a word;
 *   D  blocks owning out_proj column groups b, b + nb, ...: out_proj on the xy
 *      words as they arrive, out as xo words.
 * Block 0 ends with the final add + norm. Blocks with no channel and no
 * column leave at once. The exchanges need no barrier: a word is a value and
 * its layer's tag in one 64-bit store (single-copy atomic), so a reader that
 * sees the tag sees the value; it reloads until every word it needs carries
 * the tag. Overwrites are safe because every reader of a layer's words fed
 * the next layer's words that their writers wait for.
 * The projections are chunk chains of m16n8k16 steps (device/mma_m16n8k16.cuh)
 * from W slices in shared memory, partials folded in chunk order and then the
 * bias, as the GEMM family's mbd_mkgemm (same bits as its wgmma tiles); a
 * warp runs two items' chains interleaved to hide the mma latency. A ninth
 * (producer) warp streams each layer's W rows, small parameters and this
 * block's conv/scan state into one half of a two-buffer ring by 1D bulk
 * copies (full/empty mbarriers), a layer or two ahead; the eight compute
 * warps sync on a named barrier. Rows of W slices and of the activations are
 * padded by 16 bytes, which makes the fragments' 32-bit shared loads
 * conflict-free. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "kernels/cuda/decode_persistent.h"
}
#include "kernels/cuda/device/async_copy.cuh"
#include "kernels/cuda/device/mma_m16n8k16.cuh"
#include "kernels/cuda/mops_arith.cuh"

#define DP_WARPS 8
#define DP_THREADS (32 * DP_WARPS) /* compute threads; one more warp produces copies */
#define DP_BLOCK (DP_THREADS + 32)
#define DP_KC 4        /* conv width */
#define DP_N 16        /* d_state */
#define DP_CH 256      /* K chunk of the GEMM contract (MBD_WG_KCH) */
#define DP_MAXROWS XP_ROWS
#define DP_RES_PT 12   /* words a thread polls at once (dp_poll: n <= 3072) */
#define DP_XPI (MBD_DP_MAX_INNER / (32 * XP_GW)) /* x_proj group partials per lane (fold) */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DP_HAVE_KERNEL 1 /* the mma.sync == wgmma bit identity is an sm_90a fact */
#endif

/* Shared-memory plan, the same on host and device. */
struct dp_plan {
  int gpb, opb;        /* 8-channel groups (two per x_proj group), out_proj groups per block (max) */
  int cin, cout, no;   /* K chunks of in_proj / out_proj; x_proj outputs */
  int sh, sa;          /* row strides (elements) of hn [rows][d] and act [rows][di] */
  uint32_t swi, swo;   /* W slice row strides, bytes */
  uint32_t wbuf;       /* one layer buffer: W slices, then the small parameters and state */
  uint32_t o_out, o_xp; /* offsets of the out_proj and x_proj slices inside a buffer */
  /* inside a buffer: norm weight, per owned channel group conv taps/bias, A,
   * D, dt bias, dt_proj rows, in_proj bias; out_proj bias; per row and group
   * the conv window and the scan state */
  uint32_t o_norm, o_cw, o_cb, o_A, o_D, o_dtb, o_dtwr, o_inb, o_outb, o_cst, o_h;
  uint32_t o_resid, o_hn, o_act, o_part, o_xc, o_z, o_sd, o_dtw, o_rinv, o_mbar, total;
};

__host__ __device__ inline uint32_t dp_al16(uint32_t v) { return (v + 15u) & ~15u; }

__host__ __device__ inline dp_plan dp_make_plan(int d, int di, int R, int rows, int nb, int ts) {
  dp_plan P;
  P.gpb = 2 * ((di / XP_GW + nb - 1) / nb);
  P.opb = (d / 8 + nb - 1) / nb;
  P.no = R + 2 * DP_N;
  P.cin = (d + DP_CH - 1) / DP_CH;
  P.cout = (di + DP_CH - 1) / DP_CH;
  P.sh = d + 16 / ts;
  P.sa = di + 16 / ts;
  P.swi = (uint32_t)(d * ts + 16);
  P.swo = (uint32_t)(di * ts + 16);
  P.o_out = (uint32_t)P.gpb * 16u * P.swi;
  P.o_xp = P.o_out + (uint32_t)P.opb * 8u * P.swo;
  const uint32_t G = (uint32_t)P.gpb;
  uint32_t o = P.o_xp + G * (uint32_t)P.no * 8u * (uint32_t)ts; /* [group][o][8] */
  P.o_norm = o; o = dp_al16(o + (uint32_t)d * 4u);
  P.o_cw = o;   o = dp_al16(o + G * DP_KC * 8u * 4u);
  P.o_cb = o;   o = dp_al16(o + G * 8u * 4u);
  P.o_A = o;    o = dp_al16(o + G * 8u * DP_N * 4u);
  P.o_D = o;    o = dp_al16(o + G * 8u * 4u);
  P.o_dtb = o;  o = dp_al16(o + G * 8u * (uint32_t)ts);
  P.o_dtwr = o; o = dp_al16(o + G * 8u * (uint32_t)(R * ts));
  P.o_inb = o;  o = dp_al16(o + G * 16u * (uint32_t)ts);
  P.o_outb = o; o = dp_al16(o + (uint32_t)P.opb * 8u * (uint32_t)ts);
  P.o_cst = o;  o = dp_al16(o + (uint32_t)rows * G * (DP_KC - 1) * 8u * 4u);
  P.o_h = o;    o = dp_al16(o + (uint32_t)rows * G * 8u * DP_N * 4u);
  P.wbuf = o;
  const int items = 2 * P.gpb * P.cin > P.opb * P.cout ? 2 * P.gpb * P.cin : P.opb * P.cout;
  o = 2u * P.wbuf;
  P.o_resid = o;  o = dp_al16(o + (uint32_t)(rows * d) * 4u);
  P.o_hn = o;     o = dp_al16(o + (uint32_t)(rows * P.sh * ts));
  P.o_act = o;    o = dp_al16(o + (uint32_t)(rows * P.sa * ts));
  P.o_part = o;   o = dp_al16(o + (uint32_t)(items * rows * 8) * 4u);
  P.o_xc = o;     o = dp_al16(o + (uint32_t)(rows * P.gpb * 8) * 4u);
  P.o_z = o;      o = dp_al16(o + (uint32_t)(rows * P.gpb * 8) * 4u);
  P.o_sd = o;     o = dp_al16(o + (uint32_t)(rows * P.no) * 4u);
  P.o_dtw = o;    o = dp_al16(o + (uint32_t)(P.gpb * 8 * (R + 1)) * 4u);
  P.o_rinv = o;   o = dp_al16(o + DP_MAXROWS * 4u);
  P.o_mbar = o;   o = dp_al16(o + 32u); /* per buffer: full (landed), empty (released) */
  P.total = o;
  return P;
}

/* Stage trace points a layer (decode_persistent.h). */
#define DP_TP MBD_DP_TRACE_POINTS

struct dp_args {
  mbd_dp_model m;
  int rows;
  const int32_t *tok, *slots;
  long long *trace; /* [nb][L][DP_TP] or NULL */
  mbd_dp_side side;
};

#ifdef DP_HAVE_KERNEL
/* The compute warps' barrier (the producer warp never joins it). */
__device__ __forceinline__ void dp_sync() { asm volatile("bar.sync 1, %0;" ::"n"(DP_THREADS) : "memory"); }

/* Exchange words (NCCL's low-latency protocol): a value and the tag of the
 * layer that wrote it in one 64-bit store, so a reader that sees the tag
 * sees the value, with no fence and no grid barrier. Tags grow by launch
 * and layer (tag0 + l in the kernel), so stale words never match. */
__device__ __forceinline__ uint64_t dp_word(uint32_t bits, uint32_t tag) {
  return (uint64_t)tag << 32 | bits;
}
__device__ __forceinline__ void st_word(uint64_t *p, uint64_t w) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ uint64_t ld_word(const uint64_t *p) {
  uint64_t w;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
  return w;
}
__device__ __forceinline__ uint32_t word_tag(uint64_t w) { return (uint32_t)(w >> 32); }

/* The words e = threadIdx.x + i * DP_THREADS (i < DP_RES_PT) below n, each
 * handed to f(e, its low 32 bits) once it carries `tag`; the pending ones
 * are reloaded together, one round trip a round. */
template <typename F>
__device__ __forceinline__ void dp_poll(const uint64_t *src, int n, uint32_t tag, F f) {
  uint32_t pend = 0;
#pragma unroll
  for (int i = 0; i < DP_RES_PT; i++)
    if ((int)threadIdx.x + i * DP_THREADS < n) pend |= 1u << i;
  while (pend) {
    uint64_t w[DP_RES_PT];
#pragma unroll
    for (int i = 0; i < DP_RES_PT; i++)
      if (pend >> i & 1u) w[i] = ld_word(src + threadIdx.x + i * DP_THREADS);
#pragma unroll
    for (int i = 0; i < DP_RES_PT; i++)
      if ((pend >> i & 1u) && word_tag(w[i]) == tag) {
        f((int)threadIdx.x + i * DP_THREADS, (uint32_t)w[i]);
        pend &= ~(1u << i);
      }
  }
}

/* The 16 bits of v rounded to the activation dtype T (st_act's rounding). */
template <typename T>
__device__ __forceinline__ uint32_t act_bits(float v) {
  T t;
  st_act(&t, v);
  return (uint32_t)*(const unsigned short *)&t;
}

/* rinv[r] = the RMSNorm scale of row r of resid (rms_inv_route, warp r). */
template <typename T>
__device__ __forceinline__ void dp_rms_rows(const float *resid, int rows, int d, float eps,
                                            float *rinv, int warp, int lane) {
  if (warp < rows) {
    const float v = rms_inv_route<T>(resid + warp * d, d, eps, lane);
    if (lane == 0) rinv[warp] = v;
  }
}

/* Blocks of groups b, b + nb, ... below n: how many this block owns. */
__device__ __forceinline__ int dp_owned(int n, int per) {
  int k = 0;
  while (k < per && (int)blockIdx.x + k * (int)gridDim.x < n) k++;
  return k;
}

/* Two contract chunk chains interleaved (same x; the second hides the first's
 * mma latency): 8 outputs each (W rows at w1 / w2, stride sw elements) for the
 * rows of x (stride sx) below `rows`, k16 steps from k0 (steps of them) from 0.
 * Lane 4g + t ends with row g's outputs 2t, 2t + 1 in d[0], d[1]. */
template <typename T>
__device__ __forceinline__ void dp_chain2(const T *w1, int k01, int steps1, const T *w2, int k02,
                                          int steps2, int sw, const T *x, int sx, int rows,
                                          float d1[4], float d2[4], int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint32_t *wr1 = (const uint32_t *)(w1 + (size_t)g * sw + k01);
  const uint32_t *wr2 = (const uint32_t *)(w2 + (size_t)g * sw + k02);
  const uint32_t *xr1 = (const uint32_t *)(x + (size_t)(g < rows ? g : 0) * sx + k01);
  const uint32_t *xr2 = (const uint32_t *)(x + (size_t)(g < rows ? g : 0) * sx + k02);
  const bool xl = g < rows;
  d1[0] = d1[1] = d1[2] = d1[3] = 0.0f;
  d2[0] = d2[1] = d2[2] = d2[3] = 0.0f;
  /* Each half chunk's fragments are loaded before its first step, so the
   * steps wait on one round of shared-memory loads, not one per step. */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    uint32_t b1[8][2], a1[8][2], b2[8][2], a2[8][2];
#pragma unroll
    for (int jj = 0; jj < 8; jj++) {
      const int j = 8 * h + jj;
      b1[jj][0] = wr1[8 * j + t];
      b1[jj][1] = wr1[8 * j + 4 + t];
      a1[jj][0] = xl ? xr1[8 * j + t] : 0u;
      a1[jj][1] = xl ? xr1[8 * j + 4 + t] : 0u;
      b2[jj][0] = wr2[8 * j + t];
      b2[jj][1] = wr2[8 * j + 4 + t];
      a2[jj][0] = xl ? xr2[8 * j + t] : 0u;
      a2[jj][1] = xl ? xr2[8 * j + 4 + t] : 0u;
    }
#pragma unroll
    for (int jj = 0; jj < 8; jj++) {
      const int j = 8 * h + jj;
      if (j < steps1) {
        const uint32_t a[4] = {a1[jj][0], 0u, a1[jj][1], 0u};
        mma_op<T>::run(d1, a, b1[jj]);
      }
      if (j < steps2) {
        const uint32_t a[4] = {a2[jj][0], 0u, a2[jj][1], 0u};
        mma_op<T>::run(d2, a, b2[jj]);
      }
    }
  }
}

/* The chains of items it = warp, warp + DP_WARPS, ... (two at a time) of a
 * projection: item (group row block rb, chunk c) = rb * C + c; W rows of
 * row block rb at w + rb * 8 rows. Partials of the real rows to
 * part[(it * rows + row) * 8 + col]. */
template <typename T>
__device__ __forceinline__ void dp_project(int items, int C, int K, const T *w, int sw,
                                           const T *x, int sx, int rows, float *part, int warp,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
  for (int it = warp; it < items; it += 2 * DP_WARPS) {
    const int it2 = it + DP_WARPS;
    const int c1 = it % C, c2 = it2 % C;
    float d1[4], d2[4];
    dp_chain2<T>(w + (size_t)(it / C) * 8 * sw, c1 * DP_CH, min(16, (K - c1 * DP_CH) / 16),
                 w + (size_t)(it2 < items ? it2 / C : 0) * 8 * sw, c2 * DP_CH,
                 it2 < items ? min(16, (K - c2 * DP_CH) / 16) : 0, sw, x, sx, rows, d1, d2, lane);
    if (g < rows) {
      part[(it * rows + g) * 8 + 2 * t] = d1[0];
      part[(it * rows + g) * 8 + 2 * t + 1] = d1[1];
      if (it2 < items) {
        part[(it2 * rows + g) * 8 + 2 * t] = d2[0];
        part[(it2 * rows + g) * 8 + 2 * t + 1] = d2[1];
      }
    }
  }
}

#endif

template <typename T>
__global__ void __launch_bounds__(DP_BLOCK, 1) k_decode_layers(const __grid_constant__ dp_args A) {
#ifdef DP_HAVE_KERNEL
  extern __shared__ __align__(16) unsigned char dsm[];
  const mbd_dp_model &M = A.m;
  const int rows = A.rows, d = M.d_model, di = M.d_inner, R = M.dt_rank, L = M.n_layer;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int b = blockIdx.x, nb = gridDim.x;
  const dp_plan P = dp_make_plan(d, di, R, rows, nb, (int)sizeof(T));
  const int NO = P.no;
  const int ng = di / XP_GW, nin = 2 * dp_owned(ng, P.gpb / 2), nout = dp_owned(d / 8, P.opb);
  /* the first channel of its 8-channel group jj (two per x_proj group) */
  auto ch0 = [&](int jj) { return XP_GW * (b + (jj >> 1) * nb) + 8 * (jj & 1); };
  float *resid = (float *)(dsm + P.o_resid), *part = (float *)(dsm + P.o_part);
  float *xcv = (float *)(dsm + P.o_xc), *zv = (float *)(dsm + P.o_z);
  float *sd = (float *)(dsm + P.o_sd), *dtw = (float *)(dsm + P.o_dtw);
  float *rinv = (float *)(dsm + P.o_rinv);
  T *hn = (T *)(dsm + P.o_hn), *act = (T *)(dsm + P.o_act);
  const int qn = P.gpb * 8; /* channel slots per row in xcv, zv */

  /* a block with no channels and no out_proj columns takes no part (nobody
   * waits for its words) */
  if (nin == 0 && nout == 0) {
    if (A.trace && tid == 0) /* no stamps: the trace skips this block */
      for (int i = 0; i < L * DP_TP; i++) A.trace[(size_t)b * L * DP_TP + i] = 0;
    return;
  }
  /* The producer warp's lane 0 walks the layers, each into buffer l & 1 as
   * soon as the compute warps have released it (layer l - 2 done): the W
   * rows, the small parameters and this block's conv/scan state, one 1D bulk
   * copy each, counted in bytes on the buffer's full mbarrier. Issuing can
   * block on the copy engine's queue; only this warp waits for it. */
  const uint32_t mbar0 = (uint32_t)__cvta_generic_to_shared(dsm + P.o_mbar);
  const uint32_t full0 = mbar0, empty0 = mbar0 + 16;
  if (tid == 0) {
    for (int i = 0; i < 2; i++) {
      mbar_init(full0 + 8 * i, 1);
      mbar_init(empty0 + 8 * i, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  /* the rows' tokens and slots, read once (they may be in mapped host memory) */
  __shared__ int32_t s_tok[DP_MAXROWS], s_slot[DP_MAXROWS];
  if (tid < rows) {
    s_tok[tid] = A.tok[tid];
    s_slot[tid] = A.slots[tid];
  }
  __syncthreads();
  if (warp == DP_WARPS) {
    if (lane != 0) { /* block 0's spare lanes move the side bytes */
      for (int k = 0; b == 0 && k < 3; k++)
        for (size_t i = lane - 1; i < A.side.bytes[k] / 4; i += 31)
          ((uint32_t *)A.side.dst[k])[i] = ((const uint32_t *)A.side.src[k])[i];
      return;
    }
    const int ts = (int)sizeof(T);
    const uint32_t ri = (uint32_t)d * ts, ro = (uint32_t)di * ts;
    for (int l = 0; l < L; l++) {
      const mbd_dp_layer &Y = M.layers[l];
      const uint32_t wb = (uint32_t)__cvta_generic_to_shared(dsm) + (uint32_t)(l & 1) * P.wbuf;
      const uint32_t full = full0 + 8u * (l & 1);
      if (l >= 2) mbar_wait(empty0 + 8u * (l & 1), (uint32_t)((l >> 1) - 1) & 1u);
      const uint32_t xgb = (uint32_t)NO * 8u * ts; /* one group's x_proj slice */
      uint32_t bytes = (uint32_t)nin * (16u * ri + xgb) + (uint32_t)nout * 8u * ro + (uint32_t)d * 4u;
      bytes += (uint32_t)nin * (DP_KC * 32u + (Y.conv_b ? 32u : 0u) + DP_N * 32u + 32u + 8u * ts +
                                8u * R * ts + (Y.in_b ? 16u * ts : 0u));
      bytes += (uint32_t)(rows * nin) * ((DP_KC - 1) * 32u + DP_N * 32u);
      if (Y.out_b) bytes += (uint32_t)nout * 8u * ts;
      mbar_expect_tx(full, bytes);
      for (int row = 0; row < nin * 16; row++) {
        const int n = ((row >> 3) & 1) * di + ch0(row >> 4) + (row & 7);
        bulk_g2s(wb + row * P.swi, (const T *)Y.in_w + (size_t)n * d, ri, full);
      }
      for (int row = 0; row < nout * 8; row++) {
        const int n = 8 * (b + (row >> 3) * nb) + (row & 7);
        bulk_g2s(wb + P.o_out + row * P.swo, (const T *)Y.out_w + (size_t)n * di, ro, full);
      }
      for (int jj = 0; jj < nin; jj++)
        bulk_g2s(wb + P.o_xp + jj * xgb, (const T *)Y.x_wg + (size_t)(ch0(jj) / 8) * NO * 8, xgb, full);
      bulk_g2s(wb + P.o_norm, Y.norm, (uint32_t)d * 4u, full);
      for (int jj = 0; jj < nin; jj++) {
        const int c0 = ch0(jj);
        for (int j = 0; j < DP_KC; j++)
          bulk_g2s(wb + P.o_cw + (jj * DP_KC + j) * 32, Y.conv_w + (size_t)j * di + c0, 32u, full);
        if (Y.conv_b) bulk_g2s(wb + P.o_cb + jj * 32, Y.conv_b + c0, 32u, full);
        bulk_g2s(wb + P.o_A + jj * DP_N * 32, Y.A + (size_t)c0 * DP_N, DP_N * 32u, full);
        bulk_g2s(wb + P.o_D + jj * 32, Y.D + c0, 32u, full);
        bulk_g2s(wb + P.o_dtb + jj * 8 * ts, (const T *)Y.dt_b + c0, 8u * ts, full);
        bulk_g2s(wb + P.o_dtwr + jj * 8 * R * ts, (const T *)Y.dt_w + (size_t)c0 * R, 8u * R * ts, full);
        if (Y.in_b)
          for (int h = 0; h < 2; h++)
            bulk_g2s(wb + P.o_inb + (jj * 16 + 8 * h) * ts, (const T *)Y.in_b + h * di + c0, 8u * ts, full);
        for (int r = 0; r < rows; r++) {
          const int64_t slot = s_slot[r];
          for (int j = 0; j < DP_KC - 1; j++)
            bulk_g2s(wb + P.o_cst + ((r * P.gpb + jj) * (DP_KC - 1) + j) * 32,
                     M.conv_state + slot * M.conv_slot + ((int64_t)l * (DP_KC - 1) + j) * di + c0, 32u, full);
          bulk_g2s(wb + P.o_h + (r * P.gpb + jj) * 8 * DP_N * 4,
                   M.ssm_state + slot * M.ssm_slot + ((int64_t)l * di + c0) * DP_N, DP_N * 32u, full);
        }
      }
      if (Y.out_b)
        for (int j = 0; j < nout; j++)
          bulk_g2s(wb + P.o_outb + j * 8 * ts, (const T *)Y.out_b + 8 * (b + j * nb), 8u * ts, full);
    }
    return;
  }
  long long *trc = A.trace ? A.trace + (size_t)b * L * DP_TP : nullptr;
  /* block 0's %globaltimer at start and end, after the per-block stamps */
  long long *gtt = A.trace && b == 0 && tid == 0 ? A.trace + (size_t)nb * L * DP_TP : nullptr;
  if (gtt) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gtt[0]));
#define DP_MARK(l, i) \
  if (trc && tid == 0) trc[(l) * DP_TP + (i)] = clock64()

  /* Layer l's words carry tag0 + l. Every participant reads the count before
   * it writes a word, and block 0 advances it only after the last layer's
   * words reached it, which needed every participant's words of layer 0. */
  const uint32_t epoch = __ldcg(M.epoch), tag0 = epoch * (uint32_t)L + 1u;
  const int nu = rows * NO, nown = ng < nb ? ng : nb; /* channel owners: blocks 0..nown-1 */
  for (int l = 0; l < L; l++) {
    const mbd_dp_layer &Y = M.layers[l];
    const uint32_t tag = tag0 + (uint32_t)l;
    const unsigned char *wb = dsm + (uint32_t)(l & 1) * P.wbuf;
    const float *s_cw = (const float *)(wb + P.o_cw), *s_cb = (const float *)(wb + P.o_cb);
    const float *s_A = (const float *)(wb + P.o_A), *s_D = (const float *)(wb + P.o_D);
    const float *s_cst = (const float *)(wb + P.o_cst), *s_h = (const float *)(wb + P.o_h);
    const T *s_dtb = (const T *)(wb + P.o_dtb), *s_dtwr = (const T *)(wb + P.o_dtwr);
    const T *s_inb = (const T *)(wb + P.o_inb), *s_outb = (const T *)(wb + P.o_outb);
    const float *s_norm = (const float *)(wb + P.o_norm);
    DP_MARK(l, 0);

    /* ---- A (channel owners): residual, norm (k_embed, k_add_rmsnorm), in_proj, conv */
    if (nin == 0) {
      mbar_wait(full0 + 8u * (l & 1), (uint32_t)(l >> 1) & 1u);
      DP_MARK(l, 1);
      DP_MARK(l, 2);
      DP_MARK(l, 3);
    } else {
      if (l == 0) {
        for (int e = tid; e < rows * d; e += DP_THREADS) {
          const int r = e / d;
          resid[e] = ld_f32((const T *)M.emb + (size_t)s_tok[r] * d + (e - r * d));
        }
      } else { /* the previous layer's out_proj outputs, as they arrive */
        dp_poll(M.xo, rows * d, tag - 1u,
                [&](int e, uint32_t v) { resid[e] = __fadd_rn(resid[e], __uint_as_float(v)); });
      }
      dp_sync();
      dp_rms_rows<T>(resid, rows, d, M.norm_eps, rinv, warp, lane);
      /* the other threads wait for layer l's buffer meanwhile */
      mbar_wait(full0 + 8u * (l & 1), (uint32_t)(l >> 1) & 1u);
      dp_sync();
      for (int e = tid; e < rows * d; e += DP_THREADS) {
        const int r = e / d, c = e - r * d;
        st_act(hn + r * P.sh + c, rms_out(s_norm[c], resid[e], rinv[r]));
      }
      dp_sync();
      DP_MARK(l, 1);
      dp_project<T>(nin * 2 * P.cin, P.cin, d, (const T *)wb, (int)(P.swi / sizeof(T)), hn, P.sh,
                    rows, part, warp, lane);
      DP_MARK(l, 2);
      dp_sync();
      for (int e = tid; e < nin * 2 * rows * 8; e += DP_THREADS) {
        const int col = e & 7, r = (e >> 3) % rows, row8 = (e >> 3) / rows;
        const int jj = row8 >> 1, half = row8 & 1, ch = ch0(jj) + col;
        float v = part[((row8 * P.cin) * rows + r) * 8 + col];
        for (int c = 1; c < P.cin; c++)
          v = __fadd_rn(v, part[((row8 * P.cin + c) * rows + r) * 8 + col]);
        if (Y.in_b) v = __fadd_rn(v, ld_f32(s_inb + jj * 16 + half * 8 + col));
        const int q = jj * 8 + col;
        if (half) {
          zv[r * qn + q] = v;
        } else { /* conv_silu_out on the prefetched window */
          float wk[DP_KC], win[DP_KC - 1];
#pragma unroll
          for (int j = 0; j < DP_KC; j++) wk[j] = s_cw[jj * DP_KC * 8 + j * 8 + col];
#pragma unroll
          for (int j = 0; j < DP_KC - 1; j++)
            win[j] = s_cst[(r * P.gpb + jj) * (DP_KC - 1) * 8 + j * 8 + col];
          const float xc = conv_silu_out<DP_KC>(wk, win, v, Y.conv_b != nullptr,
                                                Y.conv_b ? s_cb[jj * 8 + col] : 0.0f);
          float *cs = M.conv_state + (int64_t)s_slot[r] * M.conv_slot +
                      (int64_t)l * (DP_KC - 1) * di + ch;
#pragma unroll
          for (int j = 0; j + 1 < DP_KC - 1; j++) cs[(int64_t)j * di] = win[j + 1];
          cs[(int64_t)(DP_KC - 2) * di] = v;
          xcv[r * qn + q] = xc;
        }
      }
      DP_MARK(l, 3);
      dp_sync();
      /* x_proj partials of its groups, the contract's p_g (xp_group_partial):
       * item (jg, m) = owned 16-channel group jg x outputs 16 m .. 16 m + 15,
       * one warp and one k16 step each, W in the A operand (outputs past NO
       * zeros), the rows' conv outputs rounded to T (k_conv_silu's xc_act
       * store) in B columns 0..rows-1 (the other columns zeros). To
       * xq[r][o][lane l][i] for group 32 i + l: a folding lane reads its
       * DP_XPI partials of an output, adjacent words. */
      {
        const int nm = (NO + 15) / 16, gq = lane >> 2, t = lane & 3;
        const T *xw = (const T *)(wb + P.o_xp); /* [8-channel group][o][8] */
        for (int it = warp; it < (nin / 2) * nm; it += DP_WARPS) {
          const int jg = it / nm, o0 = (it % nm) * 16;
          auto wword = [&](int h, int o) { /* W[o][8 h + 2 t, + 1] */
            return o < NO ? *(const uint32_t *)(xw + ((size_t)(2 * jg + h) * NO + o) * 8 + 2 * t)
                          : 0u;
          };
          auto xword = [&](int j) { /* row gq's channels j, j + 1 of group jg */
            if (gq >= rows) return 0u;
            const float *xc = xcv + gq * qn + jg * XP_GW + j;
            return act_bits<T>(xc[1]) << 16 | act_bits<T>(xc[0]);
          };
          const uint32_t a[4] = {wword(0, o0 + gq), wword(0, o0 + gq + 8), wword(1, o0 + gq),
                                 wword(1, o0 + gq + 8)};
          const uint32_t bx[2] = {xword(2 * t), xword(8 + 2 * t)};
          float p[4];
          xp_group_partial<T>(a, bx, p);
          const int G = b + jg * nb;
#pragma unroll
          for (int n = 0; n < 4; n++) {
            const int o = o0 + gq + 8 * (n >> 1), r = 2 * t + (n & 1);
            if (o < NO && r < rows)
              st_word(M.xq + (((size_t)r * NO + o) * 32 + G % 32) * DP_XPI + G / 32,
                      dp_word(__float_as_uint(p[n]), tag));
          }
        }
      }
      /* the scan's dt_proj rows widened to f32 (stage_dt_w's values) */
      for (int e = tid; e < nin * 8 * R; e += DP_THREADS) {
        const int q = e / R, k = e - q * R;
        dtw[q * (R + 1) + k] = ld_f32(s_dtwr + e);
      }
    }
    DP_MARK(l, 4);

    /* ---- C: x_proj fold (the contract's class sums over the groups, then
     * its xor butterfly), then dt_proj + scan + D + gate (k_scan_step) */
    /* Each output is folded once, by warp (u / nown) % DP_WARPS of channel
     * owner u % nown: its lanes wait for their partials (lane l: groups l,
     * l + 32, ...; slots of groups >= ng are never written), add them in the
     * contract's order and butterfly; the sum goes out as a word of xs. Then
     * every owner takes all of xs into sd. */
    for (int u = b + nown * warp; nin > 0 && u < nu; u += nown * DP_WARPS) {
      static_assert(DP_XPI == 4, "four group partials a lane and output");
      const uint64_t *src = M.xq + ((size_t)u * 32 + lane) * DP_XPI;
      uint64_t w[DP_XPI];
      bool ok;
      do {
#pragma unroll
        for (int i = 0; i < DP_XPI; i++) w[i] = 32 * i + lane < ng ? ld_word(src + i) : 0;
        ok = true;
#pragma unroll
        for (int i = 0; i < DP_XPI; i++) ok &= 32 * i + lane >= ng || word_tag(w[i]) == tag;
      } while (!__all_sync(0xffffffffu, ok));
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < DP_XPI; i++)
        if (32 * i + lane < ng) acc = __fadd_rn(acc, __uint_as_float((uint32_t)w[i]));
      for (int off = 16; off > 0; off >>= 1)
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
      if (lane == 0)
        st_word(M.xs + u, dp_word(__float_as_uint(u % NO < R ? round_act<T>(acc) : acc), tag));
    }
    if (nin > 0) {
      for (int e = tid; e < nu; e += DP_THREADS) { /* one or two words a thread */
        uint64_t w;
        while (word_tag(w = ld_word(M.xs + e)) != tag) __nanosleep(32);
        sd[e] = __uint_as_float((uint32_t)w);
      }
      dp_sync();
    }
    DP_MARK(l, 5);
    {
      /* DP_N lanes per (row, channel), lane n owning state n; rows * nq * DP_N
       * is a multiple of 32 (nq of 8), so every warp runs whole, its lanes
       * 0..15 on an even channel and 16..31 on the next one */
      const int nq = nin * 8; /* this block's channels */
      for (int e = tid; e < rows * nq * DP_N; e += DP_THREADS) {
        const int n = e % DP_N, rc = e / DP_N, sr = rc / nq, sq = rc - sr * nq;
        const int sch = ch0(sq >> 3) + (sq & 7);
        float h = s_h[(sr * P.gpb * 8 + sq) * DP_N + n];
        const float v = scan_one_lanes<DP_N>(sd + sr * NO, dtw + sq * (R + 1), R,
                                             ld_f32(s_dtb + sq), s_A[sq * DP_N + n], s_D[sq],
                                             xcv[sr * qn + sq], zv[sr * qn + sq], h, n);
        const uint32_t hi = act_bits<T>(__shfl_down_sync(0xffffffffu, v, 16));
        if (lane == 0) /* y of channels sch, sch + 1 in one word */
          st_word(M.xy + ((size_t)sr * di + sch) / 2, dp_word(hi << 16 | act_bits<T>(v), tag));
        M.ssm_state[(int64_t)s_slot[sr] * M.ssm_slot + ((int64_t)l * di + sch) * DP_N + n] = h;
      }
    }
    DP_MARK(l, 6);

    /* ---- D: out_proj, on y as its words arrive */
    if (nout > 0) {
      dp_poll(M.xy, rows * di / 2, tag, [&](int e, uint32_t v) {
        const int r = e / (di / 2), c = e - r * (di / 2);
        *(uint32_t *)(act + (size_t)r * P.sa + 2 * c) = v;
      });
      dp_sync();
      DP_MARK(l, 7);
      dp_project<T>(nout * P.cout, P.cout, di, (const T *)(wb + P.o_out), (int)(P.swo / sizeof(T)),
                    act, P.sa, rows, part, warp, lane);
      dp_sync();
      for (int e = tid; e < nout * rows * 8; e += DP_THREADS) {
        const int col = e & 7, r = (e >> 3) % rows, jj = (e >> 3) / rows;
        const int n = 8 * (b + jj * nb) + col;
        float v = part[((jj * P.cout) * rows + r) * 8 + col];
        for (int c = 1; c < P.cout; c++) v = __fadd_rn(v, part[((jj * P.cout + c) * rows + r) * 8 + col]);
        if (Y.out_b) v = __fadd_rn(v, ld_f32(s_outb + jj * 8 + col));
        st_word(M.xo + (size_t)r * d + n, dp_word(__float_as_uint(v), tag));
      }
    }
    if (nout == 0) DP_MARK(l, 7);
    DP_MARK(l, 8);
    dp_sync(); /* every compute warp is done with buffer l & 1 */
    if (tid == 0) mbar_arrive(empty0 + 8u * (l & 1));
  }
  if (b != 0) return;
  /* Block 0: the final add + norm (k_add_rmsnorm's arithmetic, as stage A),
   * resid and out as the per-op path leaves them, then the next launch's
   * tags. */
  dp_poll(M.xo, rows * d, tag0 + (uint32_t)L - 1u, [&](int e, uint32_t v) {
    const float o = __uint_as_float(v), x = __fadd_rn(resid[e], o);
    M.out[e] = o;
    M.resid[e] = x;
    resid[e] = x;
  });
  dp_sync();
  dp_rms_rows<T>(resid, rows, d, M.norm_eps, rinv, warp, lane);
  dp_sync();
  for (int e = tid; e < rows * d; e += DP_THREADS) {
    const int r = e / d, c = e - r * d;
    st_act((T *)M.hn + e, rms_out(M.norm_f[c], resid[e], rinv[r]));
  }
  /* Every word of this launch has been read (each reader's words fed the
   * last layer's out_proj, which block 0 just read). At the wrap the words
   * go back to tag 0 before the count restarts. */
  const bool wrap = epoch + 1u >= M.epoch_wrap;
  if (wrap) {
    const size_t nq = (size_t)DP_MAXROWS * NO * 32 * DP_XPI, ny = (size_t)DP_MAXROWS * di / 2,
                 no = (size_t)DP_MAXROWS * d;
    for (size_t e = tid; e < nq; e += DP_THREADS) M.xq[e] = 0;
    for (size_t e = tid; e < ny; e += DP_THREADS) M.xy[e] = 0;
    for (size_t e = tid; e < no; e += DP_THREADS) M.xo[e] = 0;
    for (size_t e = tid; e < (size_t)DP_MAXROWS * NO; e += DP_THREADS) M.xs[e] = 0;
  }
  if (tid == 0) *M.epoch = wrap ? 0u : epoch + 1u;
  if (gtt) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gtt[1]));
#endif
}

/* ------------------------------------------------------------ host */

/* Whether `rows` rows of m run persistently here; when they do, the grid
 * (one block per SM) and the shared-memory plan of the launch. */
static int dp_check(const mbd_dp_model *m, int rows, int *nb, dp_plan *P) {
  if (!m || rows < 1 || rows > DP_MAXROWS) return 0;
  if (m->dtype != MBD_DTYPE_BF16 && m->dtype != MBD_DTYPE_F16) return 0;
  if (m->d_state != DP_N || m->d_conv != DP_KC || m->n_layer < 1 || m->dt_rank < 1) return 0;
  /* whole 256-wide K chunks: dp_chain2 loads a chunk's fragments before its
   * steps (every Mamba size; a partial chunk would read past its rows) */
  if (m->d_model % DP_CH || m->d_inner % DP_CH || m->d_model <= 0 || m->d_inner <= 0) return 0;
  int dev = 0, sms = 0, smax = 0, maj = 0, min_ = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smax, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&min_, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
#ifdef MBD_CUDA_ARCHS
  if (!strstr(MBD_CUDA_ARCHS, "90a")) return 0;
#endif
  if (maj != 9 || min_ != 0) return 0;
  const int ts = (int)mbd_dtype_size(m->dtype);
  *P = dp_make_plan(m->d_model, m->d_inner, m->dt_rank, rows, sms, ts);
  if (P->total + 64u > (uint32_t)smax || rows * P->gpb * 8 > DP_THREADS) return 0; /* + static */
  if (m->d_inner > MBD_DP_MAX_INNER || !m->xq || !m->xs || !m->xy || !m->xo || !m->epoch) return 0;
  /* dp_poll's words a thread */
  if (rows * m->d_model > DP_RES_PT * DP_THREADS || rows * m->d_inner / 2 > DP_RES_PT * DP_THREADS)
    return 0;
  *nb = sms;
  return 1;
}

extern "C" int mbd_dp_fits(const mbd_dp_model *m, int rows) {
  int nb = 0;
  dp_plan P;
  return dp_check(m, rows, &nb, &P);
}

extern "C" size_t mbd_dp_trace_bytes(int n_layer) {
  int dev = 0, nb = 0;
  if (n_layer < 1 || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&nb, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return ((size_t)nb * (size_t)n_layer * DP_TP + 2) * 8;
}

extern "C" int mbd_dp_decode(void *stream, const mbd_dp_model *m, int rows, const int32_t *tok,
                             const int32_t *slots, const mbd_dp_side *side, void *trace,
                             mbd_error *err) {
  int nb = 0;
  dp_plan P;
  if (!dp_check(m, rows, &nb, &P))
    return mbd_error_set(err, MBD_E_INVALID,
                         "persistent decode: %d rows of this model do not fit (mbd_dp_fits)", rows);
  dp_args a;
  a.m = *m;
  a.rows = rows;
  a.tok = tok;
  a.slots = slots;
  a.trace = (long long *)trace;
  a.side = side ? *side : mbd_dp_side{};
  void (*k)(dp_args) = m->dtype == MBD_DTYPE_BF16 ? k_decode_layers<__nv_bfloat16>
                                                  : k_decode_layers<__half>;
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)P.total);
  if (e == cudaSuccess) {
    /* Cooperative: the launch fails rather than deadlock waiting for words
     * of a block that could not be resident at the same time. */
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)nb);
    cfg.blockDim = dim3(DP_BLOCK);
    cfg.dynamicSmemBytes = P.total;
    cfg.stream = (cudaStream_t)stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, k, a);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return mbd_error_set(err, MBD_E_DEVICE, "launching the persistent decode (%d blocks, %u B "
                         "shared) failed: %s (%d)", nb, P.total, cudaGetErrorName(e), (int)e);
  }
  return 0;
}
