/* Mamba-1 element-wise and recurrent CUDA kernels (see mamba_ops.h).
 *
 * Every rounding is spelled with an _rn intrinsic (__fmul_rn, __fadd_rn,
 * __fmaf_rn, __fdiv_rn, __fsqrt_rn) so nvcc can neither contract nor reorder
 * it, whatever --fmad says: that is what keeps these kernels on the CPU
 * reference's expression order. Parallelism is only across rows, sequences
 * and channels; time steps and reductions run in one fixed order per element. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/cuda/mamba_ops.h"
}

/* ------------------------------------------------------------ helpers */

__device__ __forceinline__ float ld_f32(const float *p) { return *p; }
__device__ __forceinline__ float ld_f32(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld_f32(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void st_act(float *p, float v) { *p = v; }
__device__ __forceinline__ void st_act(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st_act(__half *p, float v) { *p = __float2half_rn(v); }

/* x / (1 + expf(-x)), as mbd_cpu_silu. */
__device__ __forceinline__ float silu_f(float x) {
  return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
}
/* x > 20 ? x : log1pf(expf(x)), as mbd_cpu_softplus and torch. */
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static int launch_check(const char *what, mbd_error *err) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return mbd_error_set(err, MBD_E_DEVICE, "launching %s failed: %s (%d)", what,
                         cudaGetErrorName(e), (int)e);
  return 0;
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
  const T *src = table + (int64_t)tok[r] * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) out[r * d + c] = ld_f32(src + c);
}

extern "C" int mbd_mops_embed(void *stream, int64_t M, int d, const int32_t *tok, mbd_dtype dt,
                              const void *table, float *out, mbd_error *err) {
  if (M <= 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
#define EMB(T) k_embed<T><<<(unsigned)M, 256, 0, s>>>(M, d, tok, (const T *)table, out)
  MBD_ACT_DISPATCH(dt, EMB)
#undef EMB
  return launch_check("embedding gather", err);
}

/* ------------------------------------------------------------ RMSNorm */

/* One block per row. The row goes through shared memory; one thread runs the
 * CPU's ascending fmaf chain for the square sum (a tree would be faster but
 * would round differently from the reference), the block writes the output. */
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
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float v = x[c];
    if (delta) {
      v = __fadd_rn(v, delta[r * d + c]);
      x[c] = v;
    }
    row[c] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float ss = 0.0f;
    int c = 0;
    for (; c + 4 <= d; c += 4) {
      float4 q = smem4[c >> 2];
      ss = __fmaf_rn(q.x, q.x, ss);
      ss = __fmaf_rn(q.y, q.y, ss);
      ss = __fmaf_rn(q.z, q.z, ss);
      ss = __fmaf_rn(q.w, q.w, ss);
    }
    for (; c < d; c++) ss = __fmaf_rn(row[c], row[c], ss);
    r_sh = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
  }
  __syncthreads();
  const float rr = r_sh;
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    st_act(out + i * d + c, __fmul_rn(w[c], __fmul_rn(row[c], rr)));
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
    k_add_rmsnorm<T><<<(unsigned)M, 256, sh, s>>>(d, in_stride, in_offset, resid, delta, w, \
                                                  eps, (T *)out);                        \
  } while (0)
  MBD_ACT_DISPATCH(act, NRM)
#undef NRM
  return launch_check("add_rmsnorm", err);
}

/* ------------------------------------------------------------ conv + SiLU */

/* One thread per (sequence, channel) walks the sequence's tokens in order with
 * the window in registers: the per-token arithmetic is mbd_cpu_conv_step's. */
template <int K, typename ActT>
__global__ void k_conv_silu(int T, int di, const float *__restrict__ xz, int64_t ldxz,
                            const float *__restrict__ w, const float *__restrict__ bias,
                            float *__restrict__ conv_state, int64_t slot_stride,
                            const int32_t *__restrict__ slots, float *__restrict__ xc,
                            ActT *__restrict__ xc_act) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int s = blockIdx.y;
  if (c >= di) return;
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
  float win[K - 1], wk[K];
#pragma unroll
  for (int j = 0; j < K - 1; j++) win[j] = st[(int64_t)j * di];
#pragma unroll
  for (int j = 0; j < K; j++) wk[j] = w[(int64_t)j * di + c];
  const float b = bias ? bias[c] : 0.0f;
  int64_t row = (int64_t)s * T;
  float xnext = xz[row * ldxz + c];
  for (int t = 0; t < T; t++, row++) {
    const float xv = xnext;
    if (t + 1 < T) xnext = xz[(row + 1) * ldxz + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K - 1; j++) acc = __fmaf_rn(wk[j], win[j], acc);
    acc = __fmaf_rn(wk[K - 1], xv, acc);
    if (bias) acc = __fadd_rn(acc, b);
#pragma unroll
    for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
    win[K - 2] = xv;
    const float v = silu_f(acc);
    xc[row * di + c] = v;
    if (xc_act) st_act(xc_act + row * di + c, v);
  }
#pragma unroll
  for (int j = 0; j < K - 1; j++) st[(int64_t)j * di] = win[j];
}

extern "C" int mbd_mops_conv_silu(void *stream, int nseq, int T, int di, int K, const float *xz,
                                  int64_t ldxz, const float *w, const float *bias,
                                  float *conv_state, int64_t slot_stride, const int32_t *slots,
                                  float *xc, mbd_dtype act, void *xc_act, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  const int BT = 64;
  dim3 grid((unsigned)((di + BT - 1) / BT), (unsigned)nseq);
#define CONV_K(KK, T_)                                                                  \
  case KK:                                                                              \
    k_conv_silu<KK, T_><<<grid, BT, 0, s>>>(T, di, xz, ldxz, w, bias, conv_state,       \
                                            slot_stride, slots, xc, (T_ *)xc_act);      \
    break;
#define CONV(T_)                                                                        \
  switch (K) {                                                                          \
    CONV_K(2, T_) CONV_K(3, T_) CONV_K(4, T_) CONV_K(5, T_) CONV_K(6, T_) CONV_K(7, T_) \
    CONV_K(8, T_)                                                                       \
  default: return mbd_error_set(err, MBD_E_INVALID, "conv kernel width %d outside 2..8", K); \
  }
  MBD_ACT_DISPATCH(act, CONV)
#undef CONV
#undef CONV_K
  return launch_check("conv_silu", err);
}

/* ------------------------------------------------------------ selective scan */

/* One thread per (sequence, channel), state h[N] in registers, tokens in order;
 * the next token's inputs are loaded before the current one is computed so the
 * loads overlap the arithmetic. Per token this is mbd_cpu_scan_step. */
template <int N, typename ActT>
__global__ void __launch_bounds__(64)
    k_scan(int T, int di, const float *__restrict__ xc, const float *__restrict__ dt_raw,
           const float *__restrict__ bc, const float *__restrict__ A,
           const float *__restrict__ Dv, const float *__restrict__ xz, int64_t ldxz,
           int64_t zoff, float *__restrict__ ssm_state, int64_t slot_stride,
           const int32_t *__restrict__ slots, ActT *__restrict__ y) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int s = blockIdx.y;
  if (c >= di) return;
  float *hp = ssm_state + (int64_t)slots[s] * slot_stride + (int64_t)c * N;
  float h[N], a[N];
#pragma unroll
  for (int n = 0; n < N; n += 4) {
    float4 q = *(const float4 *)(hp + n);
    h[n] = q.x, h[n + 1] = q.y, h[n + 2] = q.z, h[n + 3] = q.w;
    float4 qa = *(const float4 *)(A + (int64_t)c * N + n);
    a[n] = qa.x, a[n + 1] = qa.y, a[n + 2] = qa.z, a[n + 3] = qa.w;
  }
  const float d = Dv[c];
  int64_t row = (int64_t)s * T;
  float nx = xc[row * di + c], ndt = dt_raw[row * di + c], nz = xz[row * ldxz + zoff + c];
  float nB[N], nC[N];
#pragma unroll
  for (int n = 0; n < N; n += 4) {
    float4 qb = *(const float4 *)(bc + row * 2 * N + n);
    float4 qc = *(const float4 *)(bc + row * 2 * N + N + n);
    nB[n] = qb.x, nB[n + 1] = qb.y, nB[n + 2] = qb.z, nB[n + 3] = qb.w;
    nC[n] = qc.x, nC[n + 1] = qc.y, nC[n + 2] = qc.z, nC[n + 3] = qc.w;
  }
  for (int t = 0; t < T; t++, row++) {
    const float x = nx, dtr = ndt, z = nz;
    float B[N], C[N];
#pragma unroll
    for (int n = 0; n < N; n++) B[n] = nB[n], C[n] = nC[n];
    if (t + 1 < T) {
      const int64_t r1 = row + 1;
      nx = xc[r1 * di + c];
      ndt = dt_raw[r1 * di + c];
      nz = xz[r1 * ldxz + zoff + c];
#pragma unroll
      for (int n = 0; n < N; n += 4) {
        float4 qb = *(const float4 *)(bc + r1 * 2 * N + n);
        float4 qc = *(const float4 *)(bc + r1 * 2 * N + N + n);
        nB[n] = qb.x, nB[n + 1] = qb.y, nB[n + 2] = qb.z, nB[n + 3] = qb.w;
        nC[n] = qc.x, nC[n + 1] = qc.y, nC[n + 2] = qc.z, nC[n + 3] = qc.w;
      }
    }
    const float dt = softplus_f(dtr);
    float acc = 0.0f;
#pragma unroll
    for (int n = 0; n < N; n++) {
      const float dA = expf(__fmul_rn(dt, a[n]));
      h[n] = __fmaf_rn(dA, h[n], __fmul_rn(__fmul_rn(dt, B[n]), x));
      acc = __fmaf_rn(h[n], C[n], acc);
    }
    acc = __fmaf_rn(d, x, acc);
    st_act(y + row * di + c, __fmul_rn(acc, silu_f(z)));
  }
#pragma unroll
  for (int n = 0; n < N; n += 4) *(float4 *)(hp + n) = make_float4(h[n], h[n + 1], h[n + 2], h[n + 3]);
}

extern "C" int mbd_mops_scan(void *stream, int nseq, int T, int di, int N, const float *xc,
                             const float *dt_raw, const float *bc, const float *A,
                             const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                             float *ssm_state, int64_t slot_stride, const int32_t *slots,
                             mbd_dtype act, void *y, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  const int BT = 64;
  dim3 grid((unsigned)((di + BT - 1) / BT), (unsigned)nseq);
#define SCAN_N(NN, T_)                                                                  \
  case NN:                                                                              \
    k_scan<NN, T_><<<grid, BT, 0, s>>>(T, di, xc, dt_raw, bc, A, D, xz, ldxz, zoff,      \
                                       ssm_state, slot_stride, slots, (T_ *)y);         \
    break;
#define SCAN(T_)                                                                        \
  switch (N) {                                                                          \
    SCAN_N(4, T_) SCAN_N(8, T_) SCAN_N(16, T_) SCAN_N(32, T_)                           \
  default: return mbd_error_set(err, MBD_E_INVALID, "d_state %d not in {4,8,16,32}", N); \
  }
  MBD_ACT_DISPATCH(act, SCAN)
#undef SCAN
#undef SCAN_N
  return launch_check("selective scan", err);
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
 * cannot change it. */
__device__ __forceinline__ void better(float v, int i, float &bv, int &bi) {
  if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

__global__ void k_sample(int V, const float *__restrict__ logits, int64_t ld,
                         const float *__restrict__ temp, const uint64_t *__restrict__ seed,
                         const uint64_t *__restrict__ step, int32_t *__restrict__ out) {
  const int r = blockIdx.x;
  const float *l = logits + (int64_t)r * ld;
  const float tp = temp ? temp[r] : 0.0f;
  const bool greedy = !(tp > 0.0f);
  const uint64_t sd = seed ? seed[r] : 0, sp = step ? step[r] : 0;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = l[i];
    if (!greedy) {
      const float u = sample_uniform(sd, sp, (uint64_t)i);
      v = __fadd_rn(__fdiv_rn(v, tp), -logf(-logf(u)));
    }
    better(v, i, bv, bi);
  }
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
  if (threadIdx.x == 0) {
    for (int k = 1; k < (int)(blockDim.x >> 5); k++) better(sv[k], si[k], bv, bi);
    out[r] = bi == 0x7fffffff ? 0 : bi; /* all NaN / -inf: token 0 */
  }
}

extern "C" int mbd_mops_sample(void *stream, int n, int V, const float *logits, int64_t ld,
                               const float *temp, const uint64_t *seed, const uint64_t *step,
                               int32_t *out, mbd_error *err) {
  if (n <= 0) return 0;
  k_sample<<<(unsigned)n, 512, 0, (cudaStream_t)stream>>>(V, logits, ld, temp, seed, step, out);
  return launch_check("sampling", err);
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
