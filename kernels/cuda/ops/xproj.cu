/* x_proj (see xproj.h): a warp per output on the 16-bit routes, a thread per
 * output (the f32 GEMM chain) on f32 routes. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/xproj.h"

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


/* The same contract for many rows (M >= XT_MIN_M, K a multiple of the
 * 512-channel lane stride, 16-bit T): k_xproj reloads and widens every x row
 * once per output warp and keeps few chains in flight, so at batch 256 or in
 * a prefill it was latency-bound far from its few bytes. Here a block owns a
 * tile of XT_R rows x XT_O outputs, and thread `lane` of a warp runs, for
 * its warp's XT_WR rows x XT_WO outputs, exactly what lane `lane` of
 * k_xproj's warp runs for each of those outputs: per 512-channel chunk the
 * group partial p = fmaf chain from 0 over j = 0..15 of x[r, k] w[o, k],
 * k = 512 i + 16 lane + j, then acc = acc + p (chunks ascending); then the
 * same xor butterfly. Rows past M and outputs past NO compute on zeros and
 * are not stored.
 *
 * The tile's chunks travel by cp.async, two buffers deep, into shared memory
 * as they are in memory (16-bit): a lane's 16 elements of a row are two
 * 16-byte pieces, read by two 16-byte loads and widened in registers, which
 * moves half the shared-memory bytes of a tile staged widened to f32 (the
 * kernel's limit). The pieces are stored swizzled (piece q at q ^ (q / 8
 * mod 2)) so that a warp's loads of one piece per lane fall in distinct
 * banks. With the small tile (M = 256, NO = 160: 320 blocks) every SM gets a
 * few blocks of little work; 111 registers, two blocks per SM. */
#define XT_R 16       /* rows per block */
#define XT_O 8        /* outputs per block */
#define XT_WR 4       /* rows per warp */
#define XT_WO 4       /* outputs per warp */
#define XT_MIN_M 32   /* fewer rows: k_xproj (or the decode fusion) */
#define XT_CHUNK 512  /* channels per chunk: 32 lanes x XP_GW */
#define XT_THREADS (32 * (XT_R / XT_WR) * (XT_O / XT_WO))
#define XT_PIECES ((XT_R + XT_O) * XT_CHUNK / 8) /* 16-byte pieces of a tile's chunk */
#define XT_LD (XT_PIECES / XT_THREADS)           /* of them per thread */

/* Thread tid's pieces of a tile's chunk: piece c (c < XT_LD) is tile row
 * tid / XT_QN + XT_RS c (x rows, then w rows), 16-byte column q = tid % XT_QN,
 * i.e. that row's elements 8 q .. 8 q + 7 of the chunk. */
#define XT_QN (XT_CHUNK / 8)         /* 16-byte columns of a chunk row */
#define XT_RS (XT_THREADS / XT_QN)   /* tile rows per round of pieces */

/* Where column q of a row is stored (in 16-byte pieces). */
__device__ __forceinline__ int xt_swz(int q) { return q ^ ((q >> 3) & 1); }

/* Starts the copies of this thread's pieces of chunk k0 into buf ([tile
 * row][XT_CHUNK], swizzled); tile rows past M or NO are zeros. */
template <typename T>
__device__ __forceinline__ void xt_fetch(T *buf, const T *x, const T *w, int M, int NO, int K,
                                         int64_t r0, int64_t o0, int k0, int tid) {
  const int rt = tid / XT_QN, q = tid % XT_QN;
#pragma unroll
  for (int c = 0; c < XT_LD; c++) {
    const int r = rt + XT_RS * c;
    T *dst = buf + r * XT_CHUNK + xt_swz(q) * 8;
    const bool isx = r < XT_R; /* the same for every thread at this c when XT_RS divides XT_R */
    const int64_t g = isx ? r0 + r : o0 + (r - XT_R);
    if (g < (isx ? M : NO)) {
      const T *src = (isx ? x : w) + g * K + k0 + q * 8;
      cp_async16(dst, src);
    } else {
      *(uint4 *)dst = make_uint4(0, 0, 0, 0);
    }
  }
  cp_async_commit();
}

template <typename T>
__global__ void __launch_bounds__(XT_THREADS, 2)
    k_xproj_tile(int M, int K, int NO, const T *__restrict__ x, const T *__restrict__ w,
                 float *__restrict__ out) {
  static_assert(sizeof(T) == 2 && XT_LD * XT_THREADS == XT_PIECES && XT_THREADS % XT_QN == 0 &&
                    XT_R % XT_RS == 0,
                "16-bit T, whole pieces per thread and rows per round, x and w apart");
  extern __shared__ float4 xt_sm4[];
  T *bufs = (T *)xt_sm4; /* [2][XT_R + XT_O][XT_CHUNK] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t r0 = (int64_t)blockIdx.y * XT_R, o0 = (int64_t)blockIdx.x * XT_O;
  /* the warp's rows and outputs */
  const int wr = (warp % (XT_R / XT_WR)) * XT_WR, wo = (warp / (XT_R / XT_WR)) * XT_WO;
  if (o0 + XT_O <= NO) /* the block's weights toward L2 while the predecessor runs */
    for (int i = tid; i < XT_O * (K / 64); i += XT_THREADS)
      prefetch_l2(w + (o0 + i / (K / 64)) * K + (i % (K / 64)) * 64);
  pdl_wait();
  pdl_trigger();
  xt_fetch(bufs, x, w, M, NO, K, r0, o0, 0, tid);
  float acc[XT_WR][XT_WO];
#pragma unroll
  for (int a = 0; a < XT_WR; a++)
#pragma unroll
    for (int b = 0; b < XT_WO; b++) acc[a][b] = 0.0f;
  for (int k0 = 0, i = 0; k0 < K; k0 += XT_CHUNK, i++) {
    cp_async_wait_group<0>();
    __syncthreads(); /* chunk i has landed; chunk i - 1's buffer is read */
    if (k0 + XT_CHUNK < K)
      xt_fetch(bufs + ((i + 1) & 1) * (XT_R + XT_O) * XT_CHUNK, x, w, M, NO, K, r0, o0,
               k0 + XT_CHUNK, tid);
    const T *buf = bufs + (i & 1) * (XT_R + XT_O) * XT_CHUNK;
    float p[XT_WR][XT_WO];
#pragma unroll
    for (int a = 0; a < XT_WR; a++)
#pragma unroll
      for (int b = 0; b < XT_WO; b++) p[a][b] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) { /* j = 8 h .. 8 h + 7: piece 2 lane + h of each row */
      const int col = xt_swz(2 * lane + h) * 8;
      uint4 xq[XT_WR], wq[XT_WO];
#pragma unroll
      for (int a = 0; a < XT_WR; a++) xq[a] = *(const uint4 *)(buf + (wr + a) * XT_CHUNK + col);
#pragma unroll
      for (int b = 0; b < XT_WO; b++)
        wq[b] = *(const uint4 *)(buf + (XT_R + wo + b) * XT_CHUNK + col);
#pragma unroll
      for (int jj = 0; jj < 8; jj++) {
        float xa[XT_WR], wb[XT_WO];
#pragma unroll
        for (int a = 0; a < XT_WR; a++) xa[a] = ld_f32((const T *)&xq[a] + jj);
#pragma unroll
        for (int b = 0; b < XT_WO; b++) wb[b] = ld_f32((const T *)&wq[b] + jj);
#pragma unroll
        for (int a = 0; a < XT_WR; a++)
#pragma unroll
          for (int b = 0; b < XT_WO; b++) p[a][b] = __fmaf_rn(xa[a], wb[b], p[a][b]);
      }
    }
#pragma unroll
    for (int a = 0; a < XT_WR; a++)
#pragma unroll
      for (int b = 0; b < XT_WO; b++) acc[a][b] = __fadd_rn(acc[a][b], p[a][b]);
  }
#pragma unroll
  for (int a = 0; a < XT_WR; a++)
#pragma unroll
    for (int b = 0; b < XT_WO; b++) {
      const float v = lane_sum(acc[a][b]);
      const int64_t r = r0 + wr + a, o = o0 + wo + b;
      if (lane == a * XT_WO + b && r < M && o < NO) out[r * NO + o] = v;
    }
}

template <typename T>
static int xproj_tile_launch(cudaStream_t s, int M, int K, int NO, const T *x, const T *w,
                             float *out, mbd_error *err) {
  if constexpr (sizeof(T) != 2) {
    return mbd_error_set(err, MBD_E_INVALID, "x_proj tiles: 16-bit dtypes only");
  } else {
    const size_t sh = 2 * sizeof(T) * XT_CHUNK * (XT_R + XT_O); /* two chunk buffers */
    int rc = allow_smem(k_xproj_tile<T>, sh, err);
    if (rc < 0) return rc;
    const dim3 grid((unsigned)((NO + XT_O - 1) / XT_O), (unsigned)((M + XT_R - 1) / XT_R));
    return launch_pdl("x_proj (tiles)", k_xproj_tile<T>, grid, dim3(XT_THREADS), sh, s, err, M,
                      K, NO, x, w, out);
  }
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

template <bool VEC>
static int xproj_seq_launch(cudaStream_t s, int M, int K, int NO, const float *x, const float *w,
                            float *out, mbd_error *err) {
  const dim3 grid((unsigned)((NO + XPS_THREADS - 1) / XPS_THREADS),
                  (unsigned)((M + XPS_ROWS - 1) / XPS_ROWS));
  return launch_pdl("x_proj (f32)", k_xproj_seq<VEC>, grid, dim3(XPS_THREADS), 0, s, err, M, K,
                    NO, x, w, out);
}

template <typename T, bool VEC>
static int xproj_launch(cudaStream_t s, int M, int K, int NO, const T *x, const T *w, float *out,
                        mbd_error *err) {
  const dim3 grid((unsigned)((NO + XP_WARPS - 1) / XP_WARPS),
                  (unsigned)((M + XP_ROWS - 1) / XP_ROWS));
  return launch_pdl("x_proj", k_xproj<T, VEC>, grid, dim3(32 * XP_WARPS), 0, s, err, M, K, NO, x,
                    w, out);
}

extern "C" int mbd_mops_xproj(void *stream, int64_t M, int K, int NO, mbd_dtype dt,
                              const void *x, const void *w, float *out, mbd_error *err) {
  if (M <= 0 || NO <= 0) return 0;
  if (K <= 0 || M > INT32_MAX || (M + XP_ROWS - 1) / XP_ROWS > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "x_proj: K %d or M %lld out of range", K,
                         (long long)M);
  cudaStream_t s = (cudaStream_t)stream;
  if (dt == MBD_DTYPE_F32) {
    const bool vec4 = K % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
    if (vec4)
      return xproj_seq_launch<true>(s, (int)M, K, NO, (const float *)x, (const float *)w, out,
                                    err);
    return xproj_seq_launch<false>(s, (int)M, K, NO, (const float *)x, (const float *)w, out, err);
  }
  const bool vec = K % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
  const bool tiles = vec && M >= XT_MIN_M && K % XT_CHUNK == 0 && (M + XT_R - 1) / XT_R <= 65535;
#define XP(T)                                                                               \
  do {                                                                                      \
    if (tiles)                                                                              \
      return xproj_tile_launch<T>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err);  \
    if (vec)                                                                                \
      return xproj_launch<T, true>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err); \
    return xproj_launch<T, false>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err);  \
  } while (0)
  MBD_ACT_DISPATCH(dt, XP)
#undef XP
  return 0;
}
