/* Mamba-1 element-wise and recurrent CUDA kernels (see mamba_ops.h).
 *
 * Every rounding is spelled with an _rn intrinsic (__fmul_rn, __fadd_rn,
 * __fmaf_rn, __fdiv_rn, __fsqrt_rn) so nvcc can neither contract nor reorder
 * it, whatever --fmad says: that is what keeps these kernels on the CPU
 * reference's expression order. exp, log1p, SiLU and softplus are the
 * functions of kernels/portable_math.h, which the CPU ops also use (not CUDA's
 * expf/log1pf): f32 results are bit-identical to the CPU backend's.
 * Parallelism is only across independent elements (rows, sequences,
 * channels, state entries); each element's time steps and reductions run in
 * one fixed order. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <utility>

extern "C" {
#include "kernels/cuda/mamba_ops.h"
}
#include "kernels/cuda/mops_arith.cuh"

/* ------------------------------------------------------------ helpers */

static int launch_check(const char *what, mbd_error *err) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return mbd_error_set(err, MBD_E_DEVICE, "launching %s failed: %s (%d)", what,
                         cudaGetErrorName(e), (int)e);
  return 0;
}

static bool pdl_on() {
  static const bool on = [] {
    const char *e = getenv("MBD_PDL");
    return !(e && e[0] == '0');
  }();
  return on;
}

/* MBD_SCAN_STEP=0: decode steps use the chunked prefill scan (benchmarking
 * switch; same bits). */
static bool scan_step_on() {
  static const bool on = [] {
    const char *e = getenv("MBD_SCAN_STEP");
    return !(e && e[0] == '0');
  }();
  return on;
}

/* k<<<grid, block, sh, s>>>(args...), with the programmatic-serialisation
 * attribute when pdl (kept by stream capture as a programmatic graph edge). */
template <typename... KArgs, typename... Args>
static int launch_ex(bool pdl, const char *what, void (*k)(KArgs...), dim3 grid, dim3 block,
                     size_t sh, cudaStream_t s, mbd_error *err, Args &&...args) {
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = sh;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return mbd_error_set(err, MBD_E_DEVICE, "launching %s failed: %s (%d)", what,
                         cudaGetErrorName(e), (int)e);
  }
  return launch_check(what, err);
}

template <typename... KArgs, typename... Args>
static int launch_pdl(const char *what, void (*k)(KArgs...), dim3 grid, dim3 block, size_t sh,
                      cudaStream_t s, mbd_error *err, Args &&...args) {
  return launch_ex(pdl_on(), what, k, grid, block, sh, s, err, std::forward<Args>(args)...);
}

/* Dispatches on the activation dtype: F(type) is instantiated for the three. */
#define MBD_ACT_DISPATCH(act, F)                                                        \
  switch (act) {                                                                        \
  case MBD_DTYPE_F32: F(float); break;                                                  \
  case MBD_DTYPE_BF16: F(__nv_bfloat16); break;                                         \
  case MBD_DTYPE_F16: F(__half); break;                                                 \
  default: return mbd_error_set(err, MBD_E_INVALID, "activation dtype %s unsupported", \
                                mbd_dtype_name(act));                                   \
  }

/* ------------------------------------------------------------ embedding */

template <typename T>
__global__ void k_embed(int64_t M, int d, const int32_t *__restrict__ tok,
                        const T *__restrict__ table, float *__restrict__ out) {
  int64_t r = blockIdx.x;
  pdl_wait();
  pdl_trigger();
  const T *src = table + (int64_t)tok[r] * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) out[r * d + c] = ld_f32(src + c);
}

extern "C" int mbd_mops_embed(void *stream, int64_t M, int d, const int32_t *tok, mbd_dtype dt,
                              const void *table, float *out, mbd_error *err) {
  if (M <= 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
#define EMB(T)                                                                          \
  return launch_pdl("embedding gather", k_embed<T>, dim3((unsigned)M), dim3(256), 0, s, err, M, \
                    d, tok, (const T *)table, out)
  MBD_ACT_DISPATCH(dt, EMB)
#undef EMB
  return 0;
}

/* ------------------------------------------------------------ RMSNorm */

/* One block per row. The row goes through shared memory; the first warp
 * computes the route's scale (rms_inv_route), the block writes the output
 * (rms_out). */
template <typename OutT>
__global__ void k_add_rmsnorm(int d, int64_t in_stride, int64_t in_offset,
                              float *__restrict__ resid, const float *__restrict__ delta,
                              const float *__restrict__ w, float eps, OutT *__restrict__ out) {
  extern __shared__ float4 smem4[];
  float *row = (float *)smem4;
  __shared__ float r_sh;
  const int64_t i = blockIdx.x;
  const int64_t r = i * in_stride + in_offset;
  float *x = resid + r * d;
  pdl_wait();
  pdl_trigger();
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float v = x[c];
    if (delta) {
      v = __fadd_rn(v, delta[r * d + c]);
      x[c] = v;
    }
    row[c] = v;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const float v = rms_inv_route<OutT>(row, d, eps, threadIdx.x);
    if (threadIdx.x == 0) r_sh = v;
  }
  __syncthreads();
  const float rr = r_sh;
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    st_act(out + i * d + c, rms_out(w[c], row[c], rr));
}

extern "C" int mbd_mops_add_rmsnorm(void *stream, int64_t M, int d, int64_t in_stride,
                                    int64_t in_offset, float *resid, const float *delta,
                                    const float *w, float eps, mbd_dtype act, void *out,
                                    mbd_error *err) {
  if (M <= 0) return 0;
  if (d <= 0 || d > 12288)
    return mbd_error_set(err, MBD_E_INVALID, "rmsnorm width %d outside 1..12288", d);
  cudaStream_t s = (cudaStream_t)stream;
  size_t sh = ((size_t)d + 3) / 4 * 16;
#define NRM(T)                                                                           \
  do {                                                                                   \
    if (sh > 48 * 1024)                                                                  \
      cudaFuncSetAttribute(k_add_rmsnorm<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                           (int)sh);                                                     \
    return launch_pdl("add_rmsnorm", k_add_rmsnorm<T>, dim3((unsigned)M), dim3(256), sh, s,  \
                      err, d, in_stride, in_offset, resid, delta, w, eps, (T *)out);     \
  } while (0)
  MBD_ACT_DISPATCH(act, NRM)
#undef NRM
  return 0;
}

/* ------------------------------------------------------------ conv + SiLU */

/* Time steps per conv thread. A thread owns (sequence, channel, segment of
 * CONV_SEG steps); its window starts from the inputs just before the segment
 * (the slot's state for the first segment), so segments run in parallel and
 * each output still gets mbd_cpu_conv_step's arithmetic: the window taps in
 * ascending order, then the new input, then the bias. Only the first
 * segment's thread touches the state: it reads it first and writes the new
 * window last, so no other thread can observe a half-updated state. */
#define CONV_SEG 16

template <int K, typename ActT>
__global__ void k_conv_silu(int T, int di, const float *__restrict__ xz, int64_t ldxz,
                            const float *__restrict__ w, const float *__restrict__ bias,
                            float *__restrict__ conv_state, int64_t slot_stride,
                            const int32_t *__restrict__ slots, float *__restrict__ xc,
                            ActT *__restrict__ xc_act) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int seg = blockIdx.y, s = blockIdx.z;
  const int cw = c < di ? c : di - 1;
  float win[K - 1], wk[K];
#pragma unroll
  for (int j = 0; j < K; j++) wk[j] = w[(int64_t)j * di + cw]; /* weights: before the wait */
  const float b = bias ? bias[cw] : 0.0f;
  pdl_wait();
  pdl_trigger();
  if (c >= di) return;
  const int t0 = seg * CONV_SEG, t1 = min(T, t0 + CONV_SEG);
  const int64_t base = (int64_t)s * T; /* row of the sequence's step 0 */
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
#pragma unroll
  for (int j = 0; j < K - 1; j++)
    win[j] = seg == 0 ? st[(int64_t)j * di] : xz[(base + t0 - (K - 1) + j) * ldxz + c];
  /* The segment's inputs are independent of the arithmetic: load them all
   * first so their latencies overlap. */
  float xs[CONV_SEG];
#pragma unroll
  for (int i = 0; i < CONV_SEG; i++)
    xs[i] = t0 + i < t1 ? xz[(base + t0 + i) * ldxz + c] : 0.0f;
#pragma unroll
  for (int i = 0; i < CONV_SEG; i++) {
    if (t0 + i >= t1) break;
    const float xv = xs[i];
    const float v = conv_silu_out<K>(wk, win, xv, bias != nullptr, b);
#pragma unroll
    for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
    win[K - 2] = xv;
    const int64_t row = base + t0 + i;
    xc[row * di + c] = v;
    if (xc_act) st_act(xc_act + row * di + c, v);
  }
  if (seg != 0) return;
  if (t1 == T) { /* one segment: the window is the new state */
#pragma unroll
    for (int j = 0; j < K - 1; j++) st[(int64_t)j * di] = win[j];
  } else { /* T > CONV_SEG >= K - 1: the last K - 1 inputs */
#pragma unroll
    for (int j = 0; j < K - 1; j++)
      st[(int64_t)j * di] = xz[(base + T - (K - 1) + j) * ldxz + c];
  }
}

extern "C" int mbd_mops_conv_silu(void *stream, int nseq, int T, int di, int K, const float *xz,
                                  int64_t ldxz, const float *w, const float *bias,
                                  float *conv_state, int64_t slot_stride, const int32_t *slots,
                                  float *xc, mbd_dtype act, void *xc_act, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (nseq > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "conv_silu: %d sequences > 65535", nseq);
  cudaStream_t s = (cudaStream_t)stream;
  const int BT = 64;
  dim3 grid((unsigned)((di + BT - 1) / BT), (unsigned)((T + CONV_SEG - 1) / CONV_SEG),
            (unsigned)nseq);
#define CONV_K(KK, T_)                                                                  \
  case KK:                                                                              \
    return launch_pdl("conv_silu", k_conv_silu<KK, T_>, grid, dim3(BT), 0, s, err, T, di, xz, \
                      ldxz, w, bias, conv_state, slot_stride, slots, xc, (T_ *)xc_act);   
#define CONV(T_)                                                                        \
  switch (K) {                                                                          \
    CONV_K(2, T_) CONV_K(3, T_) CONV_K(4, T_) CONV_K(5, T_) CONV_K(6, T_) CONV_K(7, T_) \
    CONV_K(8, T_)                                                                       \
  default: return mbd_error_set(err, MBD_E_INVALID, "conv kernel width %d outside 2..8", K); \
  }
  MBD_ACT_DISPATCH(act, CONV)
#undef CONV
#undef CONV_K
  return 0;
}

/* ------------------------------------------------------------ x_proj */

#define XP_WARPS 8 /* outputs (warps) per block */

/* out[r, o] = sum_k x[r, k] w[o, k] (f32 [M, NO]); x, w widened to f32.
 * Model-kernel contract (docs/route.md): lane l of the warp owning (r, o)
 * runs, for i ascending, the group partial p = fmaf chain from 0 over
 * k = 512 i + 16 l + j, j = 0..15 (k < K only), and acc = acc + p (from 0);
 * then the 32 lane sums are added by the xor butterfly 16, 8, 4, 2, 1
 * (a + b == b + a, so every lane ends with the same bits). Nothing in it
 * depends on M, the row's position or the other rows: XP_ROWS only shares
 * the weight loads. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(32 * XP_WARPS)
    k_xproj(int M, int K, int NO, const T *__restrict__ x, const T *__restrict__ w,
            float *__restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int o = blockIdx.x * XP_WARPS + (threadIdx.x >> 5);
  const int r0 = blockIdx.y * XP_ROWS, nr = min(XP_ROWS, M - r0);
  const T *wr = w + (int64_t)(o < NO ? o : NO - 1) * K;
  /* the warp's weight row toward L2 while the conv still runs */
  for (int k = lane * 128 / (int)sizeof(T); k < K; k += 32 * 128 / (int)sizeof(T))
    prefetch_l2(wr + k);
  pdl_wait();
  pdl_trigger();
  if (o >= NO) return;
  float acc[XP_ROWS];
#pragma unroll
  for (int r = 0; r < XP_ROWS; r++) acc[r] = 0.0f;
  const T *xr = x + (int64_t)r0 * K;
#pragma unroll 2
  for (int k = lane * XP_GW; k < K; k += 32 * XP_GW) {
    float wv[XP_GW];
    ld8<VEC>(wr, k, K, wv);
    ld8<VEC>(wr, k + 8, K, wv + 8);
    xp_chunk<VEC>(xr, K, nr, k, K, wv, acc);
  }
  xp_store(acc, nr, lane, out + (int64_t)r0 * NO, NO, o);
}

/* Decode fusion of conv + SiLU into x_proj (T = 1 rows, conv width 4).
 *
 * Block (bx, by) owns outputs bx * XPF_WARPS.. (one warp each) of rows
 * by * XP_ROWS..; it first recomputes the conv + SiLU output of every channel
 * of its rows with conv_silu_out (k_conv_silu's function) into shared memory,
 * rounded to T exactly as k_conv_silu's xc_act store, then runs k_xproj's
 * per-lane chain (xp_chunk, xp_store) on it: out is bit-identical to
 * conv_silu + x_proj. Every block of a row recomputes the same conv (a few
 * thousand multiply-adds, cheaper than a launch at small M; XPF_WARPS = 16
 * keeps the copies to five for the 80 x_proj outputs of the 130m shape).
 *
 * The conv state. Several blocks read the same slot's state, and CUDA orders
 * no block of a grid before another: a block that wrote the new window here
 * could do so before a block scheduled later had read the old one. So no
 * block of this kernel writes the state (nor xc: nothing reads it); the
 * decode scan (k_scan_step with KC > 0) recomputes the same conv output for
 * its channel and shifts the window, after its pdl_wait, i.e. after this
 * whole grid has completed and every read here is done. The next read of
 * the state is this layer's kernel in the next step, stream-ordered after
 * that scan. Padding rows of a bucket share the scratch slot and race on it
 * as in k_conv_silu; their outputs are discarded and touch no real row.
 *
 * Before the wait (weights only): the conv taps of the thread's first
 * XPF_CPT channels and, for 16-byte aligned rows, the lane's first XPF_PRE
 * chunks of its x_proj weight row, into registers. */
#define XPF_WARPS 16 /* outputs (warps) per block */
#define XPF_PRE 8    /* weight chunks per lane loaded before the wait (K <= 2048 all) */
#define XPF_CPT 4    /* conv channels per thread per pass (weights in registers) */
#define XPF_KC 4     /* the conv width of the fused path */

template <typename T, bool VEC>
__global__ void __launch_bounds__(32 * XPF_WARPS)
    k_conv_xproj(int M, int K, int NO, const float *__restrict__ cw, const float *__restrict__ cb,
                 const float *__restrict__ cstate, int64_t cslot,
                 const int32_t *__restrict__ slots, const float *__restrict__ xz, int64_t ldxz,
                 const T *__restrict__ w, float *__restrict__ out) {
  constexpr int BT = 32 * XPF_WARPS, KC = XPF_KC;
  extern __shared__ float4 xpf_sm4[];
  T *xs = (T *)xpf_sm4; /* [nr][K]: the rows' conv + SiLU outputs in dtype T */
  const int tid = threadIdx.x, lane = tid & 31;
  const int o = blockIdx.x * XPF_WARPS + (tid >> 5);
  const int r0 = blockIdx.y * XP_ROWS, nr = min(XP_ROWS, M - r0);
  const T *wr = w + (int64_t)(o < NO ? o : NO - 1) * K;
  float wk[XPF_CPT][KC], bb[XPF_CPT];
  auto load_taps = [&](int p0) {
#pragma unroll
    for (int i = 0; i < XPF_CPT; i++) {
      const int cc = min(p0 + i * BT + tid, K - 1);
#pragma unroll
      for (int j = 0; j < KC; j++) wk[i][j] = cw[(int64_t)j * K + cc];
      bb[i] = cb ? cb[cc] : 0.0f;
    }
  };
  load_taps(0);
  uint4 wpre[XPF_PRE]; /* 2 per group: k = 512 (i / 2) + 16 lane + 8 (i % 2) */
#pragma unroll
  for (int i = 0; i < XPF_PRE; i++) {
    const int k = lane * XP_GW + 32 * XP_GW * (i >> 1) + 8 * (i & 1);
    wpre[i] = make_uint4(0u, 0u, 0u, 0u);
    if (VEC && k < K) wpre[i] = *(const uint4 *)(wr + k);
  }
  if (!VEC)
    for (int k = lane * 128 / (int)sizeof(T); k < K; k += 32 * 128 / (int)sizeof(T))
      prefetch_l2(wr + k);
  pdl_wait(); /* xz and the conv state only from here on */
  pdl_trigger();
  for (int p0 = 0; p0 < K; p0 += XPF_CPT * BT) {
    if (p0) load_taps(p0);
#pragma unroll
    for (int r = 0; r < XP_ROWS; r++) {
      if (r >= nr) break;
      const float *st = cstate + (int64_t)slots[r0 + r] * cslot;
      const float *xr = xz + (int64_t)(r0 + r) * ldxz;
      float win[XPF_CPT][KC - 1], xv[XPF_CPT];
#pragma unroll
      for (int i = 0; i < XPF_CPT; i++) { /* all loads first: their latencies overlap */
        const int cc = min(p0 + i * BT + tid, K - 1);
#pragma unroll
        for (int j = 0; j < KC - 1; j++) win[i][j] = st[(int64_t)j * K + cc];
        xv[i] = xr[cc];
      }
#pragma unroll
      for (int i = 0; i < XPF_CPT; i++) {
        const int c = p0 + i * BT + tid;
        if (c < K)
          st_act(xs + (int64_t)r * K + c,
                 conv_silu_out<KC>(wk[i], win[i], xv[i], cb != nullptr, bb[i]));
      }
    }
  }
  __syncthreads();
  if (o >= NO) return;
  float acc[XP_ROWS];
#pragma unroll
  for (int r = 0; r < XP_ROWS; r++) acc[r] = 0.0f;
#pragma unroll
  for (int i = 0; i < XPF_PRE / 2; i++) {
    const int k = lane * XP_GW + 32 * XP_GW * i;
    if (k >= K) break;
    float wv[XP_GW];
    if (VEC) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const T *hp = (const T *)&wpre[2 * i + h];
#pragma unroll
        for (int j = 0; j < 8; j++) wv[8 * h + j] = ld_f32(hp + j);
      }
    } else {
      ld8<false>(wr, k, K, wv);
      ld8<false>(wr, k + 8, K, wv + 8);
    }
    xp_chunk<VEC>((const T *)xs, K, nr, k, K, wv, acc);
  }
  for (int k = lane * XP_GW + 32 * XP_GW * (XPF_PRE / 2); k < K; k += 32 * XP_GW) {
    float wv[XP_GW];
    ld8<VEC>(wr, k, K, wv);
    ld8<VEC>(wr, k + 8, K, wv + 8);
    xp_chunk<VEC>((const T *)xs, K, nr, k, K, wv, acc);
  }
  xp_store(acc, nr, lane, out + (int64_t)r0 * NO, NO, o);
}

/* f32 routes: the f32 GEMM contract, which is also the CPU model's x_proj
 * (mbd_cpu_gemm_packed, no bias): out[r, o] = fmaf chain from 0 over k
 * ascending of x[r, k] * w[o, k], one thread per output. That serial chain is
 * what makes f32 logits bit-identical to the CPU backend; it costs a few
 * microseconds of latency per layer, small beside the f32 GEMMs' own chains.
 * Each thread runs XPS_ROWS rows (independent chains: the weight loads are
 * shared and the chains overlap); rows past M are not computed. */
#define XPS_THREADS 64
#define XPS_ROWS 4

template <bool VEC>
__global__ void __launch_bounds__(XPS_THREADS)
    k_xproj_seq(int M, int K, int NO, const float *__restrict__ x, const float *__restrict__ w,
                float *__restrict__ out) {
  const int o = blockIdx.x * XPS_THREADS + threadIdx.x;
  const float *wr = w + (int64_t)(o < NO ? o : NO - 1) * K;
  for (int k = 0; k < K; k += 32) prefetch_l2(wr + k); /* the row toward L2 during the wait */
  pdl_wait();
  pdl_trigger();
  if (o >= NO) return;
  for (int r0 = blockIdx.y * XPS_ROWS; r0 < M; r0 += gridDim.y * XPS_ROWS) {
    const int nr = min(XPS_ROWS, M - r0);
    const float *xr = x + (int64_t)r0 * K;
    float acc[XPS_ROWS];
#pragma unroll
    for (int i = 0; i < XPS_ROWS; i++) acc[i] = 0.0f;
    int k = 0;
    if (VEC) {
#pragma unroll 2
      for (; k + 4 <= K; k += 4) {
        const float4 b = *(const float4 *)(wr + k);
#pragma unroll
        for (int i = 0; i < XPS_ROWS; i++) {
          if (i >= nr) break;
          const float4 a = *(const float4 *)(xr + (int64_t)i * K + k);
          acc[i] = __fmaf_rn(a.x, b.x, acc[i]);
          acc[i] = __fmaf_rn(a.y, b.y, acc[i]);
          acc[i] = __fmaf_rn(a.z, b.z, acc[i]);
          acc[i] = __fmaf_rn(a.w, b.w, acc[i]);
        }
      }
    }
    for (; k < K; k++) {
      const float b = wr[k];
#pragma unroll
      for (int i = 0; i < XPS_ROWS; i++)
        if (i < nr) acc[i] = __fmaf_rn(xr[(int64_t)i * K + k], b, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < XPS_ROWS; i++)
      if (i < nr) out[(int64_t)(r0 + i) * NO + o] = acc[i];
  }
}

extern "C" int mbd_mops_xproj(void *stream, int64_t M, int K, int NO, mbd_dtype dt,
                              const void *x, const void *w, float *out, mbd_error *err) {
  if (M <= 0 || NO <= 0) return 0;
  if (K <= 0 || M > INT32_MAX || (M + XP_ROWS - 1) / XP_ROWS > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "x_proj: K %d or M %lld out of range", K,
                         (long long)M);
  cudaStream_t s = (cudaStream_t)stream;
  if (dt == MBD_DTYPE_F32) {
    dim3 grid((unsigned)((NO + XPS_THREADS - 1) / XPS_THREADS),
              (unsigned)((M + XPS_ROWS - 1) / XPS_ROWS));
    const bool vec4 = K % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
    if (vec4)
      return launch_pdl("x_proj (f32)", k_xproj_seq<true>, grid, dim3(XPS_THREADS), 0, s, err,
                        (int)M, K, NO, (const float *)x, (const float *)w, out);
    return launch_pdl("x_proj (f32)", k_xproj_seq<false>, grid, dim3(XPS_THREADS), 0, s, err,
                      (int)M, K, NO, (const float *)x, (const float *)w, out);
  }
  dim3 grid((unsigned)((NO + XP_WARPS - 1) / XP_WARPS), (unsigned)((M + XP_ROWS - 1) / XP_ROWS));
  const bool vec = K % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
#define XP(T)                                                                               \
  do {                                                                                      \
    if (vec)                                                                                \
      return launch_pdl("x_proj", k_xproj<T, true>, grid, dim3(32 * XP_WARPS), 0, s, err,   \
                        (int)M, K, NO, (const T *)x, (const T *)w, out);                    \
    return launch_pdl("x_proj", k_xproj<T, false>, grid, dim3(32 * XP_WARPS), 0, s, err,    \
                      (int)M, K, NO, (const T *)x, (const T *)w, out);                      \
  } while (0)
  MBD_ACT_DISPATCH(dt, XP)
#undef XP
  return 0;
}

extern "C" int mbd_mops_conv_xproj(void *stream, int nseq, int di, const mbd_mops_conv *conv,
                                   const float *xz, int64_t ldxz, const int32_t *slots, int NO,
                                   mbd_dtype dt, const void *w, float *out, mbd_error *err) {
  if (nseq <= 0 || NO <= 0) return 0;
  if (!conv || conv->K != XPF_KC || (dt != MBD_DTYPE_BF16 && dt != MBD_DTYPE_F16))
    return mbd_error_set(err, MBD_E_INVALID,
                         "conv + x_proj: conv width %d / dtype %s not fused (width %d, bf16 or "
                         "f16 only)", conv ? conv->K : 0, mbd_dtype_name(dt), XPF_KC);
  const size_t sh = ((size_t)(nseq < XP_ROWS ? nseq : XP_ROWS) * (size_t)(di > 0 ? di : 0) *
                         mbd_dtype_size(dt) + 15) / 16 * 16;
  if (di <= 0 || (nseq + XP_ROWS - 1) / XP_ROWS > 65535 || sh > 227 * 1024)
    return mbd_error_set(err, MBD_E_INVALID, "conv + x_proj: d_inner %d or %d rows out of range",
                         di, nseq);
  cudaStream_t s = (cudaStream_t)stream;
  dim3 grid((unsigned)((NO + XPF_WARPS - 1) / XPF_WARPS),
            (unsigned)((nseq + XP_ROWS - 1) / XP_ROWS));
  const bool vec = di % 8 == 0 && ((uintptr_t)w & 15) == 0;
#define XPF(T, V)                                                                          \
  do {                                                                                     \
    if (sh > 48 * 1024)                                                                    \
      cudaFuncSetAttribute(k_conv_xproj<T, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                           (int)sh);                                                       \
    return launch_pdl("conv + x_proj", k_conv_xproj<T, V>, grid, dim3(32 * XPF_WARPS), sh, s, \
                      err, nseq, di, NO, conv->w, conv->bias, (const float *)conv->state,  \
                      conv->slot_stride, slots, xz, ldxz, (const T *)w, out);              \
  } while (0)
  if (dt == MBD_DTYPE_BF16) {
    if (vec) XPF(__nv_bfloat16, true);
    XPF(__nv_bfloat16, false);
  }
  if (vec) XPF(__half, true);
  XPF(__half, false);
#undef XPF
}

/* ------------------------------------------------------------ selective scan */

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
 * One thread per channel walking all of it (the previous form) ran d_state
 * portable exps per step back to back and was latency-bound; this spreads
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
 * none of the chunk staging. SSTEP_BT channels of one sequence per block; the
 * block's dt_proj weight rows are copied to shared memory with 16-byte loads
 * before the PDL wait (they overlap the x_proj kernel), the sequence's x_proj
 * row (dt_low, B, C) is staged once per block. Each thread keeps only h[N],
 * A[N] and its scalars: no per-chunk arrays, so it runs many more blocks per
 * SM than k_scan at large batch. */
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
 * is written here. */
template <int N, typename ActT, typename WT, int KC>
__global__ void __launch_bounds__(SSTEP_BT, 6)
    k_scan_step(int di, int R, const float *__restrict__ xc, const float *__restrict__ dbl,
                const WT *__restrict__ dt_w, const WT *__restrict__ dt_b,
                const float *__restrict__ A, const float *__restrict__ Dv,
                const float *__restrict__ xz, int64_t ldxz, int64_t zoff,
                float *__restrict__ ssm_state, int64_t slot_stride,
                const int32_t *__restrict__ slots, const float *__restrict__ cw,
                const float *__restrict__ cb, float *__restrict__ cstate, int64_t cslot,
                ActT *__restrict__ y, int vec) {
  extern __shared__ float4 step_sm4[];
  const int ND = R + 2 * N;
  const int RP = R + 1; /* padded weight row: conflict-free column reads */
  float *sw = (float *)step_sm4; /* [SSTEP_BT][RP] */
  float *sd = sw + SSTEP_BT * RP; /* [ND]: round_act(dt_low), then B, C */
  const int tid = threadIdx.x;
  const int c0 = blockIdx.x * SSTEP_BT, c = c0 + tid;
  const int s = blockIdx.y;
  const bool live = c < di;
  const int cc = live ? c : di - 1;
  const int nch = min(SSTEP_BT, di - c0);
  /* vec: dt_w 16-byte aligned, di * R a multiple of PV (checked on the host) */
  stage_dt_w<SSTEP_BT>(sw, RP, dt_w + (int64_t)c0 * R, nch * R, R, vec, tid);
  float a[N];
  ld_f32x(A + (int64_t)cc * N, a);
  const float d = Dv[cc];
  const float bdt = ld_f32(dt_b + cc);
  float wk[KC > 0 ? KC : 1], cbias = 0.0f;
  if constexpr (KC > 0) {
#pragma unroll
    for (int j = 0; j < KC; j++) wk[j] = cw[(int64_t)j * di + cc];
    if (cb) cbias = cb[cc];
  }
  pdl_wait(); /* activations and state only from here on */
  pdl_trigger();
  float x;
  if constexpr (KC > 0)
    x = conv_step_state<KC>(cstate + (int64_t)slots[s] * cslot + cc, di,
                            xz[(int64_t)s * ldxz + cc], wk, cb != nullptr, cbias, live);
  else
    x = xc[(int64_t)s * di + cc];
  const float *row = dbl + (int64_t)s * ND;
  for (int e = tid; e < ND; e += SSTEP_BT) sd[e] = e < R ? round_act<ActT>(row[e]) : row[e];
  float *hp = ssm_state + (int64_t)slots[s] * slot_stride + (int64_t)cc * N;
  float h[N];
  ld_f32x(hp, h);
  const float z = xz[(int64_t)s * ldxz + zoff + cc];
  __syncthreads();
  const float v = scan_one<N>(sd, sw + tid * RP, R, bdt, a, d, x, z, h);
  if (live) {
    st_act(y + (int64_t)s * di + c, v);
#pragma unroll
    for (int n = 0; n < N; n += 4)
      *(float4 *)(hp + n) = make_float4(h[n], h[n + 1], h[n + 2], h[n + 3]);
  }
}

/* MBD_CONV_FUSE_MAX: the most decode rows that run the conv fused into
 * x_proj and the scan (0: never). Above it the recomputed conv costs more
 * than the launch saved (130m b256: 132365 -> 127460 tokens/s). */
static int conv_fuse_max() {
  static const int n = [] {
    const char *e = getenv("MBD_CONV_FUSE_MAX");
    return e ? atoi(e) : 64;
  }();
  return n;
}

/* The shapes the conv fusion (k_conv_xproj + k_scan_step<KC>) supports. */
static bool conv_fusable(int T, int K, mbd_dtype act) {
  return T == 1 && K == XPF_KC && (act == MBD_DTYPE_BF16 || act == MBD_DTYPE_F16) &&
         scan_step_on();
}

extern "C" int mbd_mops_conv_fused(int nseq, int T, int K, int di, mbd_dtype act) {
  /* di > 2048 (1.4b: 4096): the recomputed conv made decode slower at every
   * batch measured (b1 394 -> 381, b64 11366 -> 9965 tokens/s) */
  return nseq >= 1 && nseq <= conv_fuse_max() && di <= 2048 && conv_fusable(T, K, act);
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
  if (wdt != act)
    return mbd_error_set(err, MBD_E_INVALID, "scan: weight dtype %s differs from activation %s",
                         mbd_dtype_name(wdt), mbd_dtype_name(act));
  cudaStream_t s = (cudaStream_t)stream;
  if (T == 1 && scan_step_on()) { /* decode */
    dim3 grid((unsigned)((di + SSTEP_BT - 1) / SSTEP_BT), (unsigned)nseq);
    const size_t sh = sizeof(float) * ((size_t)SSTEP_BT * (R + 1) + (size_t)(R + 2 * N));
    const int vec = ((uintptr_t)dt_w & 15) == 0 &&
                    (int64_t)di * R % (int64_t)(16 / mbd_dtype_size(wdt)) == 0;
    const float *cw = conv ? conv->w : NULL, *cb = conv ? conv->bias : NULL;
    float *cst = conv ? conv->state : NULL;
    const int64_t cslot = conv ? conv->slot_stride : 0;
#define STEP_KC(NN, T_, KC_)                                                                \
  do {                                                                                      \
    if (sh > 48 * 1024)                                                                     \
      cudaFuncSetAttribute(k_scan_step<NN, T_, T_, KC_>,                                    \
                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh);           \
    return launch_pdl("selective scan (step)", k_scan_step<NN, T_, T_, KC_>, grid,          \
                      dim3(SSTEP_BT), sh, s, err, di, R, xc, dbl, (const T_ *)dt_w,         \
                      (const T_ *)dt_b, A, D, xz, ldxz, zoff, ssm_state, slot_stride, slots, \
                      cw, cb, cst, cslot, (T_ *)y, vec);                                    \
  } while (0)
#define STEP_N(NN, T_)                                                                      \
  case NN:                                                                                  \
    if (conv) STEP_KC(NN, T_, XPF_KC);                                                      \
    STEP_KC(NN, T_, 0);
#define STEP(T_)                                                                        \
  switch (N) {                                                                          \
    STEP_N(4, T_) STEP_N(8, T_) STEP_N(16, T_) STEP_N(32, T_)                           \
  default: return mbd_error_set(err, MBD_E_INVALID, "d_state %d not in {4,8,16,32}", N); \
  }
    MBD_ACT_DISPATCH(act, STEP)
#undef STEP
#undef STEP_N
#undef STEP_KC
  }
  /* The chunked scan is a long, serial kernel: launched early (PDL) its
   * blocks were packed onto the few SMs x_proj left free and ran slower
   * (prefill T=2048, one thread per channel then: 47208 -> 30170 tokens/s),
   * so it waits normally. */
  const size_t ts = (size_t)(T < SCAN_TC ? T : SCAN_TC);
  /* k_scan's shared memory for N states: weights [R][cb], dt [ts][cb],
   * h_t [ts][(N + 1) cb], two stage buffers of x, z [ts][cb] and the x_proj
   * rows [ts][(R + 2N) | 1] (the layout at the top of k_scan) */
  auto scan_sh = [&](int NN) {
    const size_t cb = SCAN_THREADS / NN, ndp = (size_t)((R + 2 * NN) | 1);
    return sizeof(float) * ((size_t)R * cb + ts * cb + ts * (NN + 1) * cb +
                            2 * (2 * ts * cb + ts * ndp));
  };
#define SCAN_N(NN, T_)                                                                     \
  case NN: {                                                                               \
    const size_t sh = scan_sh(NN);                                                         \
    const int cb = SCAN_THREADS / NN;                                                      \
    if (sh > 48 * 1024)                                                                    \
      cudaFuncSetAttribute(k_scan<NN, T_, T_>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                           (int)sh);                                                       \
    return launch_ex(false, "selective scan", k_scan<NN, T_, T_>,                          \
                     dim3((unsigned)((di + cb - 1) / cb), (unsigned)nseq), dim3(SCAN_THREADS), \
                     sh, s, err, T, di, R, xc, dbl, (const T_ *)dt_w, (const T_ *)dt_b, A, D, \
                     xz, ldxz, zoff, ssm_state, slot_stride, slots, (T_ *)y);              \
  }
#define SCAN(T_)                                                                        \
  switch (N) {                                                                          \
    SCAN_N(4, T_) SCAN_N(8, T_) SCAN_N(16, T_) SCAN_N(32, T_)                           \
  default: return mbd_error_set(err, MBD_E_INVALID, "d_state %d not in {4,8,16,32}", N); \
  }
  MBD_ACT_DISPATCH(act, SCAN)
#undef SCAN
#undef SCAN_N
  return 0;
}

/* ------------------------------------------------------------ sampling */

/* Counter-based uniform in (0, 1): splitmix64 finaliser over (seed, step,
 * index), top 24 bits, centred. Pure function of its inputs. */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float sample_uniform(uint64_t seed, uint64_t step, uint64_t idx) {
  uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ull);
  z = mix64(z ^ (step * 0xd1b54a32d192ed03ull));
  z = mix64(z ^ (idx * 0x8cb92ba72f3d8dd7ull));
  return ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

/* (v, i) beats (bv, bi) when larger, or equal with a lower index; NaN never
 * wins. The winner is the unique lowest-index maximum, so the reduction tree
 * (and the number of blocks) cannot change it. */
__device__ __forceinline__ void better(float v, int i, float &bv, int &bi) {
  if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

#define SAMPLE_BLOCKS 32 /* blocks per row: each scans V / 32 logits */
#define SAMPLE_THREADS 256
#define SAMPLE_ROW_BYTES (16 + 8 * SAMPLE_BLOCKS)

/* Block-wide winner of (bv, bi); valid in thread 0. */
__device__ __forceinline__ void block_best(float &bv, int &bi) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    better(ov, oi, bv, bi);
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int k = 1; k < (int)(blockDim.x >> 5); k++) better(sv[k], si[k], bv, bi);
}

/* Grid (SAMPLE_BLOCKS, n). Each block writes its slice's winner to the
 * workspace; the last block of a row to finish (counter) picks the row's
 * winner and re-zeroes the counter for the next launch. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_sample(int V, const float *__restrict__ logits, int64_t ld, const float *__restrict__ temp,
             const uint64_t *__restrict__ seed, const uint64_t *__restrict__ step,
             unsigned char *__restrict__ work, int32_t *__restrict__ out) {
  const int r = blockIdx.y, blk = blockIdx.x;
  pdl_wait();
  pdl_trigger();
  /* Row r's workspace block: counter, then the blocks' values and indices. Its
   * place depends on r alone, not on n, so launches of any size share it. */
  unsigned char *wr = work + (size_t)r * SAMPLE_ROW_BYTES;
  unsigned *cnt = (unsigned *)wr;
  float *pv = (float *)(wr + 16);
  int *pi = (int *)(wr + 16 + 4 * SAMPLE_BLOCKS);
  const float *l = logits + (int64_t)r * ld;
  const float tp = temp ? temp[r] : 0.0f;
  const bool greedy = !(tp > 0.0f);
  const uint64_t sd = seed ? seed[r] : 0, sp = step ? step[r] : 0;
  const int per = (V + SAMPLE_BLOCKS - 1) / SAMPLE_BLOCKS;
  const int i0 = blk * per, i1 = min(V, i0 + per);
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = i0 + threadIdx.x; i < i1; i += SAMPLE_THREADS) {
    float v = l[i];
    if (!greedy) {
      const float u = sample_uniform(sd, sp, (uint64_t)i);
      v = __fadd_rn(__fdiv_rn(v, tp), -logf(-logf(u)));
    }
    better(v, i, bv, bi);
  }
  block_best(bv, bi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    pv[blk] = bv;
    pi[blk] = bi;
    __threadfence();
    last = atomicAdd(cnt, 1u) == SAMPLE_BLOCKS - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x < 32) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    if (threadIdx.x < SAMPLE_BLOCKS) {
      v = __ldcg(pv + threadIdx.x);
      i = __ldcg(pi + threadIdx.x);
    }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, v, o);
      int oi = __shfl_xor_sync(0xffffffffu, i, o);
      better(ov, oi, v, i);
    }
    if (threadIdx.x == 0) {
      out[r] = i == 0x7fffffff ? 0 : i; /* all NaN / -inf: token 0 */
      *cnt = 0;
    }
  }
}

extern "C" size_t mbd_mops_sample_work_bytes(int n) {
  return n <= 0 ? 0 : (size_t)n * SAMPLE_ROW_BYTES;
}

extern "C" int mbd_mops_sample(void *stream, int n, int V, const float *logits, int64_t ld,
                               const float *temp, const uint64_t *seed, const uint64_t *step,
                               void *work, int32_t *out, mbd_error *err) {
  if (n <= 0) return 0;
  if (n > 65535 || V <= 0 || !work)
    return mbd_error_set(err, MBD_E_INVALID, "sampling: %d rows, vocabulary %d, workspace %p", n,
                         V, work);
  dim3 grid(SAMPLE_BLOCKS, (unsigned)n);
  return launch_pdl("sampling", k_sample, grid, dim3(SAMPLE_THREADS), 0, (cudaStream_t)stream,
                    err, V, logits, ld, temp, seed, step, (unsigned char *)work, out);
}

/* ------------------------------------------------------------ synthetic data */

template <typename T>
__global__ void k_fill_uniform(T *p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float u = sample_uniform(seed, 0x5eedull, (uint64_t)i); /* (0, 1) */
    st_act(p + i, (2.0f * u - 1.0f) * scale);
  }
}

extern "C" int mbd_mops_fill_uniform(void *stream, mbd_dtype dt, void *p, int64_t n,
                                     uint64_t seed, float scale, mbd_error *err) {
  if (n <= 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
#define FILL(T) k_fill_uniform<T><<<1024, 256, 0, s>>>((T *)p, n, seed, scale)
  MBD_ACT_DISPATCH(dt, FILL)
#undef FILL
  return launch_check("fill_uniform", err);
}
