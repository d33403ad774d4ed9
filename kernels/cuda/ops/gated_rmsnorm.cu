/* Gated RMSNorm (see gated_rmsnorm.h): one block per row; the gated values
 * go through shared memory, each group's square sum is formed, then the
 * block writes the row. f32 routes run the CPU's ascending fmaf chain on one
 * thread per group (rms_inv when the group is whole quads); 16-bit routes,
 * which are not compared with the CPU, give each group a warp and the
 * RMSNorm's lane split (rms_inv_lanes), since the serial chain over d_inner
 * channels sat on every layer's critical path of a small-batch decode.
 * Where rows and pointers allow 16-byte accesses, k_gated_rmsnorm4 does the
 * same with the row in registers (MBD_GATED_NORM=old keeps k_gated_rmsnorm:
 * gn_quads). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/gated_rmsnorm.h"
#include "kernels/cuda/ops/silu_group.cuh"

#include <string.h>

/* Each thread loads GN_BATCH elements before using any: one block per row
 * makes a batch-1 decode latency-bound, and a loop that waits on each load
 * in turn paid the memory latency n / GN_THREADS times. */
#define GN_THREADS 512
#define GN_BATCH 8
#define GN_MAX_GROUPS 64

/* rms_inv_lanes (the 16-bit routes' lane split: lane l's fmaf chain over
 * c = l, l + 32, ... ascending, the xor butterfly, the three roundings) with
 * the next eight of the lane's elements loaded while the current eight are
 * chained, so the chain waits on shared memory once, not once per eight. */
__device__ __forceinline__ float gn_rinv_lanes(const float *row, int d, float eps, int lane) {
  float ss = 0.0f, cur[8], nxt[8];
#pragma unroll
  for (int j = 0; j < 8; j++) cur[j] = lane + 32 * j < d ? row[lane + 32 * j] : 0.0f;
#pragma unroll 1
  for (int c0 = lane; c0 < d; c0 += 256) {
#pragma unroll
    for (int j = 0; j < 8; j++) nxt[j] = c0 + 256 + 32 * j < d ? row[c0 + 256 + 32 * j] : 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++)
      if (c0 + 32 * j < d) ss = __fmaf_rn(cur[j], cur[j], ss);
#pragma unroll
    for (int j = 0; j < 8; j++) cur[j] = nxt[j];
  }
  ss = lane_sum(ss);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
}

/* Each group's scale into r_sh from the gated values v[0, n) in shared
 * memory (16-byte aligned): f32 outputs run the CPU's ascending fmaf chain on
 * one thread per group (rms_inv when the group is whole quads), 16-bit
 * outputs give each group a warp and the RMSNorm's lane split (rms_inv_lanes,
 * or its pipelined twin gn_rinv_lanes when PIPE: the same bits). */
template <typename OutT, bool PIPE>
__device__ __forceinline__ void gn_group_scales(const float *v, int n, int group, float eps,
                                                float *r_sh) {
  if constexpr (sizeof(OutT) == 4) {
    for (int g = threadIdx.x; g < n / group; g += blockDim.x) {
      if (group % 4 == 0) {
        r_sh[g] = rms_inv(v + (int64_t)g * group, group, eps);
        continue;
      }
      float ss = 0.0f;
      for (int c = g * group; c < (g + 1) * group; c++) ss = __fmaf_rn(v[c], v[c], ss);
      r_sh[g] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)group), eps)));
    }
  } else {
    const int lane = threadIdx.x % 32;
    for (int g = threadIdx.x / 32; g < n / group; g += blockDim.x / 32) {
      const float *row = v + (int64_t)g * group;
      const float r = PIPE ? gn_rinv_lanes(row, group, eps, lane)
                           : rms_inv_lanes(row, group, eps, lane);
      if (lane == 0) r_sh[g] = r;
    }
  }
}

template <typename OutT>
__global__ void __launch_bounds__(GN_THREADS) k_gated_rmsnorm(int n, int group, const float *__restrict__ y,
                                const float *__restrict__ z, int64_t ldz,
                                const float *__restrict__ w, float eps, int norm_before_gate,
                                OutT *__restrict__ out, bool early) {
  extern __shared__ float4 smem4[];
  float *v = (float *)smem4;
  __shared__ float r_sh[GN_MAX_GROUPS];
  const int64_t i = blockIdx.x;
  float w0[GN_BATCH]; /* the first pass's weights: static, loaded before the wait */
#pragma unroll
  for (int j = 0; j < GN_BATCH; j++) {
    const int c = threadIdx.x + j * GN_THREADS;
    w0[j] = c < n ? w[c] : 0.0f;
  }
  pdl_enter(early);
  for (int c0 = threadIdx.x; c0 < n; c0 += GN_BATCH * GN_THREADS) {
    float yv[GN_BATCH], zv[GN_BATCH];
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      yv[j] = c < n ? y[i * n + c] : 0.0f;
      zv[j] = c < n && !norm_before_gate ? z[i * ldz + c] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      if (c < n) v[c] = norm_before_gate ? yv[j] : __fmul_rn(yv[j], mbd_pm_silu(zv[j]));
    }
  }
  __syncthreads();
  gn_group_scales<OutT, false>(v, n, group, eps, r_sh);
  __syncthreads();
  for (int c0 = threadIdx.x; c0 < n; c0 += GN_BATCH * GN_THREADS) {
    float wv[GN_BATCH], zv[GN_BATCH];
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      wv[j] = c0 == (int)threadIdx.x ? w0[j] : c < n ? w[c] : 0.0f;
      zv[j] = c < n && norm_before_gate ? z[i * ldz + c] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      if (c >= n) continue;
      float o = __fmul_rn(wv[j], __fmul_rn(v[c], r_sh[c / group]));
      if (norm_before_gate) o = __fmul_rn(o, mbd_pm_silu(zv[j]));
      st_act(out + i * n + c, o);
    }
  }
}

/* The vector kernel (rows, y, z, w and out allow 16-byte / 4-element
 * accesses; gn_vec): one block per row as k_gated_rmsnorm, but each thread
 * holds up to QN quads of the row in registers, quad q = tid + k *
 * blockDim.x, loaded 16 bytes at a time and all issued before any is used
 * (the row's y and z are in flight at once); the gated values go to shared
 * memory only for the square sums, which run as in k_gated_rmsnorm (the same
 * chains, so the same bits; 16-bit routes' chains pipelined, gn_rinv_lanes),
 * and the output pass reads back its own quads.
 * Blocks of n / (4 QN) threads (QN = 4 up to d_inner 4096, else 8:
 * gn_quads) let several rows per SM be in flight, so the bytes in flight,
 * not the one warp's chain, set the pace. Each quad's SiLUs run as one
 * group (silu_group: mbd_pm_silu's bits, the four chains overlapped). */
#define GN4_THREADS 256 /* at most */

__device__ __forceinline__ float4 gn_ld4(const float *p) { return *(const float4 *)p; }

template <typename OutT, int QN>
__global__ void __launch_bounds__(GN4_THREADS, sizeof(OutT) == 2 && QN == 4 ? 4 : 1)
    k_gated_rmsnorm4(int n, int group, const float *__restrict__ y, const float *__restrict__ z,
                     int64_t ldz, const float *__restrict__ w, float eps, int norm_before_gate,
                     OutT *__restrict__ out, bool early) {
  extern __shared__ float4 smem4[];
  float *v = (float *)smem4;
  __shared__ float r_sh[GN_MAX_GROUPS];
  const int64_t i = blockIdx.x;
  const int nq = n / 4;
  float4 wv[QN], a[QN], g[QN]; /* w; y, then v; z, then silu(z) */
  pdl_enter(early);
#pragma unroll
  for (int k = 0; k < QN; k++) {
    const int q = threadIdx.x + k * blockDim.x;
    a[k] = g[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* quads past the row: zeros */
    if (q < nq) {
      a[k] = gn_ld4(y + i * n + 4 * q);
      g[k] = gn_ld4(z + i * ldz + 4 * q);
    }
  }
#pragma unroll
  for (int k = 0; k < QN; k++) { /* silu(z), a quad a group */
    float sz[4] = {g[k].x, g[k].y, g[k].z, g[k].w};
    silu_group<4>(sz);
    g[k] = make_float4(sz[0], sz[1], sz[2], sz[3]);
  }
#pragma unroll
  for (int k = 0; k < QN; k++) {
    const int q = threadIdx.x + k * blockDim.x;
    if (q >= nq) continue;
    if (!norm_before_gate)
      a[k] = make_float4(__fmul_rn(a[k].x, g[k].x), __fmul_rn(a[k].y, g[k].y),
                         __fmul_rn(a[k].z, g[k].z), __fmul_rn(a[k].w, g[k].w));
    smem4[q] = a[k];
  }
  /* the weights (static) load while the square sums run, not alongside y
   * and z, where their registers would cost a row in flight per SM */
#pragma unroll
  for (int k = 0; k < QN; k++) {
    const int q = threadIdx.x + k * blockDim.x;
    if (q < nq) wv[k] = gn_ld4(w + 4 * q);
  }
  __syncthreads();
  gn_group_scales<OutT, true>(v, n, group, eps, r_sh);
  __syncthreads();
  const float r1 = r_sh[0]; /* the only scale when the row is one group */
#pragma unroll
  for (int k = 0; k < QN; k++) {
    const int q = threadIdx.x + k * blockDim.x;
    if (q >= nq) continue;
    const float4 vk = smem4[q]; /* this thread's own quad: no registers held across the sums */
    const float vq[4] = {vk.x, vk.y, vk.z, vk.w};
    const float wq[4] = {wv[k].x, wv[k].y, wv[k].z, wv[k].w};
    const float gq[4] = {g[k].x, g[k].y, g[k].z, g[k].w};
    alignas(4 * sizeof(OutT)) OutT h[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float r = group == n ? r1 : r_sh[(4 * q + e) / group];
      float o = __fmul_rn(wq[e], __fmul_rn(vq[e], r));
      if (norm_before_gate) o = __fmul_rn(o, gq[e]);
      st_act(h + e, o);
    }
    if constexpr (sizeof(OutT) == 4)
      *(float4 *)(out + i * n + 4 * q) = *(const float4 *)h;
    else
      *(uint2 *)(out + i * n + 4 * q) = *(const uint2 *)h;
  }
}

/* Whether k_gated_rmsnorm4 may run: 16-byte rows and pointers (out: four
 * elements), and at most 8 quads for each of GN4_THREADS threads. */
static bool gn_vec(int n, const float *y, const float *z, int64_t ldz, const float *w,
                   const void *out, size_t out_size) {
  const auto al = [](const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; };
  return n % 4 == 0 && n / 4 <= GN4_THREADS * 8 && ldz % 4 == 0 && al(y, 16) && al(z, 16) &&
         al(w, 16) && al(out, 4 * out_size);
}

/* The quads a thread of k_gated_rmsnorm4 holds for rows of n channels: 4 up
 * to d_inner 4096 (several rows per SM in flight), 8 above; 0 when the
 * benches and tests ask for k_gated_rmsnorm with MBD_GATED_NORM=old (read
 * at each launch; any other value, or none, keeps the default; the same
 * bits either way). */
static int gn_quads(int n) {
  const char *e = getenv("MBD_GATED_NORM");
  if (e && !strcmp(e, "old")) return 0;
  return n / 4 <= GN4_THREADS * 4 ? 4 : 8;
}

template <typename T>
static int gated_rmsnorm_launch(cudaStream_t s, int64_t M, int n, int group, const float *y,
                                const float *z, int64_t ldz, const float *w, float eps,
                                int norm_before_gate, T *out, mbd_error *err) {
  const size_t sh = ((size_t)n + 3) / 4 * 16;
  int rc;
  const int qn = gn_quads(n);
  if (qn && gn_vec(n, y, z, ldz, w, out, sizeof(T))) {
    const int th = ((n / 4 + qn - 1) / qn + 31) / 32 * 32;
    void (*k)(int, int, const float *, const float *, int64_t, const float *, float, int, T *,
              bool) = qn == 8 ? k_gated_rmsnorm4<T, 8> : k_gated_rmsnorm4<T, 4>;
    if ((rc = allow_smem(k, sh, err)) < 0) return rc;
    return launch_pdl("gated_rmsnorm (vec)", k, dim3((unsigned)M), dim3(th), sh, s, err, n,
                      group, y, z, ldz, w, eps, norm_before_gate, out, pdl_early());
  }
  if ((rc = allow_smem(k_gated_rmsnorm<T>, sh, err)) < 0) return rc;
  return launch_pdl("gated_rmsnorm", k_gated_rmsnorm<T>, dim3((unsigned)M), dim3(GN_THREADS), sh,
                    s, err, n, group, y, z, ldz, w, eps, norm_before_gate, out, pdl_early());
}

extern "C" int mbd_mops_gated_rmsnorm(void *stream, int64_t M, int n, int group, const float *y,
                                      const float *z, int64_t ldz, const float *w, float eps,
                                      int norm_before_gate, mbd_dtype act, void *out,
                                      mbd_error *err) {
  if (M <= 0) return 0;
  if (n <= 0 || n > 40960 || group <= 0 || n % group || n / group > GN_MAX_GROUPS ||
      M > INT32_MAX)
    return mbd_error_set(err, MBD_E_INVALID,
                         "gated_rmsnorm: width %d, group %d or %lld rows unsupported", n, group,
                         (long long)M);
  cudaStream_t s = (cudaStream_t)stream;
#define GNR(T)                                                                              \
  return gated_rmsnorm_launch<T>(s, M, n, group, y, z, ldz, w, eps, norm_before_gate, (T *)out, \
                                 err)
  MBD_ACT_DISPATCH(act, GNR)
#undef GNR
  return 0;
}
