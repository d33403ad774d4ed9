/* x_proj (see xproj.h): tensor-core group partials folded by the class tree
 * on the 16-bit routes, a thread per output (the f32 GEMM chain) on f32
 * routes. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/xproj.h"

/* 16-bit routes, few rows: block (bx, by) owns outputs 16 bx .. 16 bx + 15
 * (the A operand's rows: w) of rows 8 by .. 8 by + 7 (the B operand's
 * columns: x; rows past M are zeros, not stored), one 16 x 8 result
 * fragment. Its XP_WARPS warps split the class tree: warp q runs the leaves
 * q * XP_LPW .. (q + 1) * XP_LPW - 1 (xp_warp_leaves: each class's groups in
 * order, one k16 step each, the classes folded by the binary counter), and
 * the warps' subtree sums are folded in warp order (xp_block_fold): the
 * contract's operations for every output, whatever M. Fragments come
 * straight from global memory (32-byte pieces of rows, four groups ahead). */
#define XP_WARPS 16               /* warps a block */
#define XP_LPW (32 / XP_WARPS)    /* leaves a warp */
#define XP_BO 16                  /* outputs a block */
#define XP_BR 8                   /* rows a block */

template <typename T, bool VEC>
__global__ void __launch_bounds__(32 * XP_WARPS)
    k_xproj(int M, int K, int NO, const T *__restrict__ x, const T *__restrict__ w,
            float *__restrict__ out) {
  __shared__ float part[XP_WARPS][4][32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int o0 = blockIdx.x * XP_BO, r0 = blockIdx.y * XP_BR, nr = min(XP_BR, M - r0);
  /* the block's weight rows toward L2 while the predecessor still runs */
  const int lines = (int)(((int64_t)K * (int64_t)sizeof(T) + 127) / 128);
  for (int i = tid; i < XP_BO * lines; i += 32 * XP_WARPS)
    if (o0 + i / lines < NO)
      prefetch_l2((const char *)(w + (int64_t)(o0 + i / lines) * K) + (int64_t)(i % lines) * 128);
  pdl_wait();
  pdl_trigger();
  const int gq = lane >> 2, t = lane & 3;
  const T *w0 = o0 + gq < NO ? w + (int64_t)(o0 + gq) * K : nullptr;
  const T *w1 = o0 + gq + 8 < NO ? w + (int64_t)(o0 + gq + 8) * K : nullptr;
  const T *xr = gq < nr ? x + (int64_t)(r0 + gq) * K : nullptr;
  float v[4];
  xp_warp_leaves<T, XP_LPW>(warp * XP_LPW, K,
                            [&](int g, uint32_t (&a)[4], uint32_t (&b)[2]) {
                              const int k = XP_GW * g + 2 * t;
                              a[0] = xp_ld2<VEC>(w0, k, K);
                              a[1] = xp_ld2<VEC>(w1, k, K);
                              a[2] = xp_ld2<VEC>(w0, k + 8, K);
                              a[3] = xp_ld2<VEC>(w1, k + 8, K);
                              b[0] = xp_ld2<VEC>(xr, k, K);
                              b[1] = xp_ld2<VEC>(xr, k + 8, K);
                            },
                            v);
  xp_block_fold<XP_WARPS>(part, v, [&](int e, float s) {
    /* fragment element e: output row gq + 8 (n / 2), column 2 t + n % 2 */
    const int ln = e >> 2, n = e & 3;
    const int o = o0 + (ln >> 2) + 8 * (n >> 1), r = 2 * (ln & 3) + (n & 1);
    if (o < NO && r < nr) out[(int64_t)(r0 + r) * NO + o] = s;
  });
}

template <typename T, bool VEC>
static int xproj_launch(cudaStream_t s, int M, int K, int NO, const T *x, const T *w, float *out,
                        mbd_error *err) {
  const dim3 grid((unsigned)((NO + XP_BO - 1) / XP_BO), (unsigned)((M + XP_BR - 1) / XP_BR));
  return launch_pdl("x_proj", k_xproj<T, VEC>, grid, dim3(32 * XP_WARPS), 0, s, err, M, K, NO, x,
                    w, out);
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
  if ((M + XP_BR - 1) / XP_BR > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "x_proj: M %lld out of range", (long long)M);
  const bool vec = K % 2 == 0 && ((uintptr_t)x & 3) == 0 && ((uintptr_t)w & 3) == 0;
#define XP(T)                                                                               \
  do {                                                                                      \
    if (vec)                                                                                \
      return xproj_launch<T, true>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err); \
    return xproj_launch<T, false>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err);  \
  } while (0)
  if (dt == MBD_DTYPE_BF16) XP(__nv_bfloat16);
  if (dt == MBD_DTYPE_F16) XP(__half);
#undef XP
  return mbd_error_set(err, MBD_E_INVALID, "x_proj: dtype %s unsupported", mbd_dtype_name(dt));
}
