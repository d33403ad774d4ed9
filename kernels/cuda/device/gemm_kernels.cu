/* Deterministic GEMM kernels of the CUDA backend, compiled to one fatbin that
 * is embedded in the library and loaded with cudaLibraryLoadData, so the route
 * identity can hash the exact machine code that runs (kernels/cuda/gpu_ctx.cu).
 *
 * Inference family: Y[M,N] = X[M,K] W[N,K]^T (+ b[N]).
 * Contract shared by every tile configuration of one dtype (what makes a row's
 * bits independent of M, of the tile and of the other rows):
 *   f32  : acc = 0; for k = 0..K-1 ascending: acc = fmaf(x[k], w[k], acc); y = acc + b.
 *          (Same as the CPU backend; built with --fmad=false, __fmaf_rn explicit.)
 *   tf32 : as f32 with x and w first rounded to tf32 (cvt.rna.tf32.f32).
 *   bf16/f16 : acc = 0; for each 16-wide K chunk ascending (zero-padded past K):
 *          acc = mma.m16n8k16(x chunk, w chunk, acc) with f32 accumulation;
 *          y = round(acc + b). Every configuration issues the same mma chain per
 *          output element; tiles only change which warp issues it.
 * No split-K, no atomics. Names are extern "C" so the host finds them by name. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

struct mbd_gemm_params {
  const void *x;    /* [M,K] row-major */
  const void *w;    /* [N,K] row-major (HF [out,in]) */
  const void *bias; /* [N] in the input dtype, or NULL */
  void *y;          /* [M,N] row-major, f32 or the input dtype */
  int m, n, k;
  int out_f32; /* 1: y is f32; 0: y has the input dtype */
};

/* ---------------- f32 / tf32: SIMT, one fmaf per K step ---------------- */

__device__ __forceinline__ float to_tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return __uint_as_float(r);
}

template <int BM, int BN, int BK, int TM, int TN, bool TF32>
__device__ __forceinline__ void sgemm_body(const mbd_gemm_params &p) {
  constexpr int TX = BN / TN, TY = BM / TM, NT = TX * TY;
  __shared__ __align__(16) float As[BK][BM + 4];
  __shared__ __align__(16) float Ws[BK][BN + 4];
  const float *X = (const float *)p.x, *W = (const float *)p.w;
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < p.k; k0 += BK) {
    for (int e = tid; e < BM * BK; e += NT) {
      int r = e / BK, c = e % BK, gm = m0 + r, gk = k0 + c;
      float v = (gm < p.m && gk < p.k) ? X[(size_t)gm * p.k + gk] : 0.0f;
      As[c][r] = TF32 ? to_tf32(v) : v;
    }
    for (int e = tid; e < BN * BK; e += NT) {
      int r = e / BK, c = e % BK, gn = n0 + r, gk = k0 + c;
      float v = (gn < p.n && gk < p.k) ? W[(size_t)gn * p.k + gk] : 0.0f;
      Ws[c][r] = TF32 ? to_tf32(v) : v;
    }
    __syncthreads();
    const int kend = min(BK, p.k - k0); /* never fma past K: -0 + 0 would give +0 */
    if (kend == BK) {
#pragma unroll
      for (int kk = 0; kk < BK; kk++) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; i++) a[i] = As[kk][ty * TM + i];
#pragma unroll
        for (int j = 0; j < TN; j++) b[j] = Ws[kk][tx * TN + j];
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
          for (int j = 0; j < TN; j++) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
      }
    } else {
      for (int kk = 0; kk < kend; kk++) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; i++) a[i] = As[kk][ty * TM + i];
#pragma unroll
        for (int j = 0; j < TN; j++) b[j] = Ws[kk][tx * TN + j];
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
          for (int j = 0; j < TN; j++) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  float *Y = (float *)p.y;
  const float *B = (const float *)p.bias;
#pragma unroll
  for (int i = 0; i < TM; i++) {
    int gm = m0 + ty * TM + i;
    if (gm >= p.m) continue;
#pragma unroll
    for (int j = 0; j < TN; j++) {
      int gn = n0 + tx * TN + j;
      if (gn >= p.n) continue;
      float v = acc[i][j];
      if (B) v = __fadd_rn(v, B[gn]);
      Y[(size_t)gm * p.n + gn] = v;
    }
  }
}

#define MBD_SGEMM(name, BM, BN, BK, TM, TN, TF)                                          \
  extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN))                    \
      name(const mbd_gemm_params p) {                                                     \
    sgemm_body<BM, BN, BK, TM, TN, TF>(p);                                               \
  }
MBD_SGEMM(mbd_sgemm_f32_s, 16, 32, 128, 2, 2, false)
MBD_SGEMM(mbd_sgemm_f32_m, 64, 64, 16, 4, 4, false)
MBD_SGEMM(mbd_sgemm_f32_l, 128, 128, 8, 8, 8, false)
MBD_SGEMM(mbd_sgemm_tf32_s, 16, 32, 128, 2, 2, true)
MBD_SGEMM(mbd_sgemm_tf32_m, 64, 64, 16, 4, 4, true)
MBD_SGEMM(mbd_sgemm_tf32_l, 128, 128, 8, 8, 8, true)

/* ---------------- bf16 / f16: mma.sync m16n8k16, cp.async pipeline ---------------- */

template <typename T> struct mma_op;
template <> struct mma_op<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  static __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }
};
template <> struct mma_op<__half> {
  static __device__ __forceinline__ void run(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  static __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

/* Loads one BK-wide K slice of R rows (global row-major, row length K) into
 * smem rows of stride LD halves. VEC: 16-byte cp.async (needs K % 8 == 0 and a
 * 16-byte aligned base); otherwise element loads. Past M/N/K: zeros. */
template <typename T, int R, int BK, int LD, int NT, bool VEC>
__device__ __forceinline__ void load_tile(T *s, const T *g, int rows, int K, int r0, int k0,
                                          int tid) {
  if (VEC) {
    constexpr int CPR = BK / 8; /* 16-byte chunks per row */
#pragma unroll
    for (int c = tid; c < R * CPR; c += NT) {
      int r = c / CPR, col = (c % CPR) * 8, gr = r0 + r, gk = k0 + col;
      bool ok = gr < rows && gk < K;
      const T *src = ok ? g + (size_t)gr * K + gk : g;
      cp_async16(smem_u32(s + r * LD + col), src, ok ? 16 : 0);
    }
  } else {
    for (int e = tid; e < R * BK; e += NT) {
      int r = e / BK, col = e % BK, gr = r0 + r, gk = k0 + col;
      T v = (gr < rows && gk < K) ? g[(size_t)gr * K + gk] : T(0.0f);
      s[r * LD + col] = v;
    }
  }
}

template <typename T, int BM, int BN, int BK, int WM, int WN, int STAGES, bool VEC>
__device__ __forceinline__ void hgemm_body(const mbd_gemm_params &p) {
  constexpr int LD = BK + 8; /* +16 bytes: conflict-free ldmatrix rows */
  constexpr int WARPS_N = BN / WN, NT = (BM / WM) * WARPS_N * 32;
  constexpr int MT = WM / 16, NTL = WN / 8; /* mma tiles per warp */
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *As = (T *)smem_raw;
  T *Bs = As + STAGES * BM * LD;
  const T *X = (const T *)p.x, *W = (const T *)p.w;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int KT = (p.k + BK - 1) / BK;

  float acc[MT][NTL][4];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < NTL; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < KT) {
      load_tile<T, BM, BK, LD, NT, VEC>(As + s * BM * LD, X, p.m, p.k, m0, s * BK, tid);
      load_tile<T, BN, BK, LD, NT, VEC>(Bs + s * BN * LD, W, p.n, p.k, n0, s * BK, tid);
    }
    cp_commit();
  }
  for (int kt = 0; kt < KT; kt++) {
    cp_wait<STAGES - 2>();
    __syncthreads();
    {
      int nk = kt + STAGES - 1, slot = nk % STAGES;
      if (nk < KT) {
        load_tile<T, BM, BK, LD, NT, VEC>(As + slot * BM * LD, X, p.m, p.k, m0, nk * BK, tid);
        load_tile<T, BN, BK, LD, NT, VEC>(Bs + slot * BN * LD, W, p.n, p.k, n0, nk * BK, tid);
      }
      cp_commit();
    }
    const T *a_s = As + (kt % STAGES) * BM * LD;
    const T *b_s = Bs + (kt % STAGES) * BN * LD;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) { /* ascending 16-wide K chunks */
      uint32_t af[MT][4], bfr[NTL][2];
#pragma unroll
      for (int i = 0; i < MT; i++)
        ldsm_x4(af[i], smem_u32(a_s + (wm0 + i * 16 + (lane & 15)) * LD + kk + (lane >> 4) * 8));
      if (NTL % 2 == 0) {
#pragma unroll
        for (int j = 0; j < NTL; j += 2) {
          uint32_t r[4];
          int nrow = wn0 + j * 8 + (lane & 7) + (lane >> 4) * 8;
          ldsm_x4(r, smem_u32(b_s + nrow * LD + kk + ((lane >> 3) & 1) * 8));
          bfr[j][0] = r[0];
          bfr[j][1] = r[1];
          bfr[j + 1][0] = r[2];
          bfr[j + 1][1] = r[3];
        }
      } else {
#pragma unroll
        for (int j = 0; j < NTL; j++) {
          int nrow = wn0 + j * 8 + (lane & 7);
          ldsm_x2(bfr[j], smem_u32(b_s + nrow * LD + kk + ((lane >> 3) & 1) * 8));
        }
      }
#pragma unroll
      for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NTL; j++) mma_op<T>::run(acc[i][j], af[i], bfr[j]);
    }
  }
  cp_wait<0>();

  const T *B = (const T *)p.bias;
#pragma unroll
  for (int i = 0; i < MT; i++) {
#pragma unroll
    for (int j = 0; j < NTL; j++) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        int gm = m0 + wm0 + i * 16 + (lane >> 2) + (q >> 1) * 8;
        int gn = n0 + wn0 + j * 8 + (lane & 3) * 2 + (q & 1);
        if (gm >= p.m || gn >= p.n) continue;
        float v = acc[i][j][q];
        if (B) v = __fadd_rn(v, mma_op<T>::to_f(B[gn]));
        if (p.out_f32)
          ((float *)p.y)[(size_t)gm * p.n + gn] = v;
        else
          ((T *)p.y)[(size_t)gm * p.n + gn] = mma_op<T>::from_f(v);
      }
    }
  }
}

#define MBD_HGEMM(name, T, BM, BN, BK, WM, WN, ST, VEC)                                   \
  extern "C" __global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)                \
      name(const mbd_gemm_params p) {                                                      \
    hgemm_body<T, BM, BN, BK, WM, WN, ST, VEC>(p);                                        \
  }
/* Tile configurations (scheduling only; see the contract above):
 *   s: M <= 16, weight streaming (decode)  m: M <= 64  n: medium  l: large M */
#define MBD_HGEMM_ALL(ty, T)                                                              \
  MBD_HGEMM(mbd_hgemm_##ty##_s_v, T, 16, 32, 128, 16, 8, 4, true)                         \
  MBD_HGEMM(mbd_hgemm_##ty##_m_v, T, 64, 32, 64, 32, 16, 4, true)                         \
  MBD_HGEMM(mbd_hgemm_##ty##_n_v, T, 64, 64, 32, 32, 32, 4, true)                         \
  MBD_HGEMM(mbd_hgemm_##ty##_l_v, T, 128, 128, 64, 64, 32, 3, true)                       \
  MBD_HGEMM(mbd_hgemm_##ty##_s_e, T, 16, 32, 128, 16, 8, 2, false)                        \
  MBD_HGEMM(mbd_hgemm_##ty##_m_e, T, 64, 32, 64, 32, 16, 2, false)                        \
  MBD_HGEMM(mbd_hgemm_##ty##_n_e, T, 64, 64, 32, 32, 32, 2, false)                        \
  MBD_HGEMM(mbd_hgemm_##ty##_l_e, T, 128, 128, 64, 64, 32, 2, false)
MBD_HGEMM_ALL(bf16, __nv_bfloat16)
MBD_HGEMM_ALL(f16, __half)

/* Broadcast a bias row into every row of Y (cuBLAS modes add it with beta=1). */
extern "C" __global__ void mbd_bcast_rows_u32(uint32_t *y, const uint32_t *b, int m, int n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (size_t)m * n) y[i] = b[i % n];
}
extern "C" __global__ void mbd_bcast_rows_u16(uint16_t *y, const uint16_t *b, int m, int n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (size_t)m * n) y[i] = b[i % n];
}
extern "C" __global__ void mbd_bcast_rows_bf16_f32(float *y, const __nv_bfloat16 *b, int m, int n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (size_t)m * n) y[i] = __bfloat162float(b[i % n]);
}
extern "C" __global__ void mbd_bcast_rows_f16_f32(float *y, const __half *b, int m, int n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (size_t)m * n) y[i] = __half2float(b[i % n]);
}
