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
 *          That is the pre-Hopper route; an sm_90a build on a cc 9.0 device runs
 *          the wgmma chain instead (contract in the sm_90a section below).
 * No split-K, no atomics. Names are extern "C" so the host finds them by name. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "async_copy.cuh"
#include "gemm_params.h"
#include "mma_m16n8k16.cuh"

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
#define MBD_SGEMM_F32(n, BM, BN, BK, TM, TN)                                             \
  MBD_SGEMM(mbd_sgemm_f32_##n, BM, BN, BK, TM, TN, false)
#define MBD_SGEMM_TF32(n, BM, BN, BK, TM, TN)                                            \
  MBD_SGEMM(mbd_sgemm_tf32_##n, BM, BN, BK, TM, TN, true)
MBD_SGEMM_TILES(MBD_SGEMM_F32) /* tiles: gemm_params.h */
MBD_SGEMM_TILES(MBD_SGEMM_TF32)

/* ---------------- bf16 / f16: mma.sync m16n8k16, cp.async pipeline ---------------- */

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
/* Tile configurations (scheduling only; see the contract above): gemm_params.h.
 * Per dtype the 16-byte cp.async kernels (_v), then the element-load ones (_e). */
#define MBD_HGEMM_V(ty, T, n, BM, BN, BK, WM, WN, SV, SE)                                 \
  MBD_HGEMM(mbd_hgemm_##ty##_##n##_v, T, BM, BN, BK, WM, WN, SV, true)
#define MBD_HGEMM_E(ty, T, n, BM, BN, BK, WM, WN, SV, SE)                                 \
  MBD_HGEMM(mbd_hgemm_##ty##_##n##_e, T, BM, BN, BK, WM, WN, SE, false)
#define MBD_HGEMM_ALL(ty, T) MBD_HGEMM_TILES(MBD_HGEMM_V, ty, T) MBD_HGEMM_TILES(MBD_HGEMM_E, ty, T)
MBD_HGEMM_ALL(bf16, __nv_bfloat16)
MBD_HGEMM_ALL(f16, __half)


/* ---------------- bf16 / f16 on Hopper (sm_90a): wgmma + TMA ----------------
 * Route contract on sm_90a (the route's isa says which family ran; it never
 * mixes with the mma.sync family above inside one route):
 *   K is cut into chunks of MBD_WG_KCH = 256 (zero-padded past K). Chunk c's
 *   partial p_c = the wgmma chain from 0 over its sixteen k16 steps in order
 *   (wgmma.m64nNk16, f32 accumulation, scale-d = 1);
 *   acc = p_0, then acc = acc + p_c for c = 1, 2, ... in order (fadd_rn);
 *   y = round(acc + b).
 * For K <= 256 that is a single chain. The chunks exist for decode: dependent
 * k16 wgmma steps are latency-bound, so one chain over a long K costs the same
 * whatever the tile (figures in docs/benchmarks.md); independent chunk chains
 * run on separate warps (mbd_mkgemm below) and are folded in the fixed order
 * above.
 *
 * Two kernel shapes issue exactly those chains and that fold:
 *  - mbd_wgemm (wg_body): a tile of 64*CWG rows x BN columns per block, one
 *    warpgroup per 64 rows running the chunks one after another (acc and the
 *    running chunk's partial in registers), a producer warp feeding a TMA ring;
 *  - mbd_mkgemm (mk_body), M <= 16: the same chains as mma.sync.m16n8k16 steps
 *    (bit-identical to wgmma k16 steps on sm_90a), one warp per (8 or 16
 *    columns, chunk), partials of the real rows folded by the block.
 * Every configuration uses BK = 64 (four k16 steps per stage, in order), the
 * same descriptor layout (128-byte swizzle), and only changes which rows and
 * columns a block owns, the wgmma N (the instruction's column count, which
 * only repeats the same per-column datapath; tests/gpu/test_gpu_gemm_bitwise.c
 * proves M=1 equals M=8192 bit for bit), and whether the producer uses the
 * tensor copy engine (TMA) or plain loads into the same layout. No split-K
 * across blocks, no atomics: a row's bits depend only on that row of x and on W.
 *
 * wg_body block: CWG consumer warpgroups (warps 0..4*CWG-1), then one producer
 * warp (under MBD_WG_RG a producer warpgroup, whose first warp loads). Shared
 * memory: STAGES x (A tile [64*CWG][64], B tile [BN][64]) in the TMA 128-byte
 * swizzle (16-byte chunk c of row r at r*128 + ((c ^ (r & 7)) * 16)),
 * then full/empty mbarriers. When M < BM the X box covers only the M rows
 * that exist (the copy engine's zero fill of absent rows is slower than real
 * loads). Rows past M
 * only feed output rows that are never stored. The parameter block
 * (mbd_wg_params) and MBD_WG_KCH are in gemm_params.h. */


#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MBD_HAVE_WGMMA 1
#endif

template <typename T, int N> struct wgmma_op {
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db);
};

#ifdef MBD_HAVE_WGMMA
/* wgmma_op<T, N>::run, generated: one wgmma.m64nNk16 (f32 accumulation,
 * scale-d = 1: acc += A*B, no transposes) per (dtype, N). A thread holds
 * R = N / 2 accumulators, operands %0..%R-1; the two descriptors are %R and
 * %R+1. WG_ACC_<R>(F) applies F to the accumulator indices 1..R-1 (index 0
 * is spelled where the comma-separated lists start). */
#define WG_ACC_8(F)                                                                     \
  F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define WG_ACC_16(F)                                                                    \
  WG_ACC_8(F)                                                                           \
  F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15)
#define WG_ACC_32(F)                                                                    \
  WG_ACC_16(F)                                                                          \
  F(16) F(17) F(18) F(19) F(20) F(21) F(22) F(23) F(24) F(25)                           \
  F(26) F(27) F(28) F(29) F(30) F(31)
#define WG_ACC_36(F)                                                                    \
  WG_ACC_32(F)                                                                          \
  F(32) F(33) F(34) F(35)
#define WG_ACC_64(F)                                                                    \
  WG_ACC_32(F)                                                                          \
  F(32) F(33) F(34) F(35) F(36) F(37) F(38) F(39) F(40) F(41)                           \
  F(42) F(43) F(44) F(45) F(46) F(47) F(48) F(49) F(50) F(51)                           \
  F(52) F(53) F(54) F(55) F(56) F(57) F(58) F(59) F(60) F(61)                           \
  F(62) F(63)
#define WG_ACC_96(F)                                                                    \
  WG_ACC_64(F)                                                                          \
  F(64) F(65) F(66) F(67) F(68) F(69) F(70) F(71) F(72) F(73)                           \
  F(74) F(75) F(76) F(77) F(78) F(79) F(80) F(81) F(82) F(83)                           \
  F(84) F(85) F(86) F(87) F(88) F(89) F(90) F(91) F(92) F(93)                           \
  F(94) F(95)
#define WG_ACC_128(F)                                                                   \
  WG_ACC_96(F)                                                                          \
  F(96) F(97) F(98) F(99) F(100) F(101) F(102) F(103)                                   \
  F(104) F(105) F(106) F(107) F(108) F(109) F(110) F(111) F(112) F(113)                 \
  F(114) F(115) F(116) F(117) F(118) F(119) F(120) F(121) F(122) F(123)                 \
  F(124) F(125) F(126) F(127)
#define WG_FMT(i) ", %" #i
#define WG_ARG(i) , "+f"(d[i])
#define MBD_WGMMA(T, ty, N, R, R1)                                                      \
  template <>                                                                           \
  __device__ __forceinline__ void wgmma_op<T, N>::run(float *d, uint64_t da, uint64_t db) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #ty "." #ty " {"       \
                 "%0" WG_ACC_##R(WG_FMT) "}, %" #R ", %" #R1 ", p, 1, 1, 0, 0;\n}\n"      \
                 : "+f"(d[0]) WG_ACC_##R(WG_ARG)                                        \
                 : "l"(da), "l"(db));                                                   \
  }
/* The instruction shapes: X(T, ty, N, R = N / 2, R + 1). */
#define MBD_WGMMA_SHAPES(X, T, ty)                                                      \
  X(T, ty, 16, 8, 9)                                                                    \
  X(T, ty, 32, 16, 17)                                                                  \
  X(T, ty, 64, 32, 33)                                                                  \
  X(T, ty, 72, 36, 37)                                                                  \
  X(T, ty, 128, 64, 65)                                                                 \
  X(T, ty, 192, 96, 97)                                                                 \
  X(T, ty, 256, 128, 129)
MBD_WGMMA_SHAPES(MBD_WGMMA, __nv_bfloat16, bf16)
MBD_WGMMA_SHAPES(MBD_WGMMA, __half, f16)

/* Shared-memory matrix descriptor, K-major, 128-byte swizzle: LBO unused (1),
 * SBO = 1024 bytes between 8-row groups. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)64 << 32) |
         ((uint64_t)1 << 62);
}
/* Pins accumulator registers after wgmma.wait_group: the compiler may not
 * move reads of them above the wait. */
template <int N> __device__ __forceinline__ void wg_fence_regs(float *d) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* A chunk partial into the running sum, after the wait_group that completed
 * its chain. */
template <int N> __device__ __forceinline__ void wg_fold(float *sum, float *p) {
  wg_fence_regs<N>(p);
#pragma unroll
  for (int i = 0; i < N; i++) sum[i] = __fadd_rn(sum[i], p[i]);
}
/* Hand registers between warpgroups (every warp of the warpgroup runs it). */
template <int R> __device__ __forceinline__ void wg_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R> __device__ __forceinline__ void wg_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
/* The host sizes shared memory from the same configuration table
 * (gemm_params.h); a mismatch would overrun it silently, so trap. */
__device__ __forceinline__ void wg_check_smem(uint32_t need) {
  uint32_t have;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
  if (have < need) __trap();
}
/* Programmatic dependent launch: no-ops unless the launch carries the
 * attribute (gpu_gemm.cu sets it only when the caller says W is static). */
__device__ __forceinline__ void wg_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void wg_pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Start fetching a tensor map into the copy engine's descriptor cache. */
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap *map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)map) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

/* The same box delivered to the same shared offset of every CTA of the
 * cluster in mask; each destination's mbarrier at offset bar counts the bytes. */
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                               int c0, int c1, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
__device__ __forceinline__ uint32_t cl_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
/* Every thread of every CTA of the cluster. */
__device__ __forceinline__ void cl_arrive() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cl_wait() {
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
/* Arrive on the mbarrier at shared offset bar of cluster CTA rank (itself
 * included). The ring's slot releases: CTA-scope release (what the slot's
 * reuse needs is the wgmma reads done, which wait_group gave; a cluster-scope
 * release per stage measured about half speed). */
__device__ __forceinline__ void mbar_arrive_cl(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
/* Shared offset a of this CTA as an address of cluster CTA rank's copy. */
__device__ __forceinline__ uint32_t cl_map(uint32_t a, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
  return remote;
}
/* Four f32 at a cluster shared address (cl_map), 16-byte aligned. */
__device__ __forceinline__ float4 ld_cl_f32x4(uint32_t remote) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
/* mbar_wait with a bound: a protocol error traps (the launch fails) instead
 * of hanging the device; no wait of a GEMM k tile comes near the bound
 * (2 s). CTA-scope acquire: what the ring needs (a cluster-scope acquire per
 * stage measured about half speed). */
__device__ __forceinline__ void mbar_wait_cl(uint32_t bar, uint32_t parity) {
  uint64_t t0 = 0;
  for (;;) {
    uint32_t ok;
    asm volatile(
        "{\n.reg .pred q;\nmbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2, %3;\n"
        "selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity), "r"(0x989680u)
        : "memory");
    if (ok) return;
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (t0 == 0)
      t0 = now;
    else if (now - t0 > 2000000000ull)
      __trap();
  }
}

/* A ring wait: bounded (mbar_wait_cl) or not. */
template <bool BOUND> __device__ __forceinline__ void wg_wait_bar(uint32_t bar, uint32_t parity) {
  if (BOUND)
    mbar_wait_cl(bar, parity);
  else
    mbar_wait(bar, parity);
}

/* Plain-load producer (K % 8 != 0 or unaligned pointers): the same swizzled
 * layout, zeros past the matrix, then a proxy fence so wgmma sees the stores. */
template <typename T>
__device__ __forceinline__ void wg_manual_tile(unsigned char *s, const T *g, int rows, int K,
                                               int r0, int k0, int R, int lane) {
  for (int e = lane; e < R * 64; e += 32) {
    int r = e >> 6, col = e & 63, gr = r0 + r, gk = k0 + col;
    T v = (gr < rows && gk < K) ? g[(size_t)gr * K + gk] : T(0.0f);
    *(T *)(s + r * 128 + ((((col >> 3) ^ (r & 7))) << 4) + (col & 7) * 2) = v;
  }
}
#endif /* MBD_HAVE_WGMMA */

#ifdef MBD_HAVE_WGMMA
/* One stage of a wgmma chain into d: wait for the stage's bytes, four k16
 * steps in order, then hand the previous stage's slot back. */
template <typename T, int BN, int IN, int STAGES, int NARR, bool BOUND = (NARR > 0)>
__device__ __forceinline__ void wg_stage(float *d, int kt, uint32_t stage_s, uint32_t a_off,
                                         uint32_t b_off, uint32_t full0, uint32_t empty0,
                                         int lane, uint32_t arr_rank, bool back = true) {
  const int s = kt % STAGES;
  wg_wait_bar<BOUND>(full0 + 8 * s, (uint32_t)(kt / STAGES) & 1u);
  const uint32_t a_s = stage_s + a_off, b_s = stage_s + b_off;
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++) { /* ascending k16 steps */
    const uint64_t da = wg_desc(a_s + kk * 32);
#pragma unroll
    for (int j = 0; j < BN / IN; j++)
      wgmma_op<T, IN>::run(d + j * (IN / 2), da, wg_desc(b_s + j * IN * 128 + kk * 32));
  }
  wg_commit();
  wg_wait<1>(); /* the previous stage's group is done: hand its slot back */
  if (!back || kt == 0) return;
  if (NARR == 0) {
    if (lane == 0) mbar_arrive(empty0 + 8 * ((kt - 1) % STAGES));
  } else { /* to every CTA that writes into this one's slots (lane i: the i-th) */
    if (lane < NARR) mbar_arrive_cl(empty0 + 8 * ((kt - 1) % STAGES), arr_rank);
  }
}
#endif

/* Outputs (gm, gn) and (gm, gn + 1) of a tile: the bias, then the store
 * (rows past M and columns past N are dropped). */
template <typename T>
__device__ __forceinline__ void wg_store2(const mbd_gemm_params &p, const T *B, int gm, int gn,
                                          float v0, float v1) {
  if (gm >= p.m) return;
  if (B) {
    if (gn < p.n) v0 = __fadd_rn(v0, mma_op<T>::to_f(B[gn]));
    if (gn + 1 < p.n) v1 = __fadd_rn(v1, mma_op<T>::to_f(B[gn + 1]));
  }
  const size_t o = (size_t)gm * p.n + gn;
  if (p.out_f32) {
    float *Y = (float *)p.y;
    if (gn + 1 < p.n && (((uintptr_t)(Y + o)) & 7) == 0) {
      *(float2 *)(Y + o) = make_float2(v0, v1);
    } else {
      if (gn < p.n) Y[o] = v0;
      if (gn + 1 < p.n) Y[o + 1] = v1;
    }
  } else {
    T *Y = (T *)p.y;
    if (gn < p.n) Y[o] = mma_op<T>::from_f(v0);
    if (gn + 1 < p.n) Y[o + 1] = mma_op<T>::from_f(v1);
  }
}

/* FOLD: K may exceed one chunk (acc plus a chunk partial in registers, so BN
 * is at most 128, 192 under RG); without it the host only dispatches K <=
 * MBD_WG_KCH. Each chunk's chain is waited for in full (wait_group 0) before
 * its fold: reading a partial while any wgmma is in flight makes ptxas
 * serialize every wgmma of the kernel (C7514, also with the partial of the
 * previous chunk in a second register set). SCHED = MBD_WG_RG
 * (gemm_params.h) widens the tile without changing a chain: the producer is
 * a warpgroup that gives its registers to the consumers (setmaxnreg), so a
 * 128 x 192 tile holds its sum and partial; the m64n192k16 steps read fewer
 * shared-memory bytes per product than m64n128k16 (one A fragment, 1.5x the
 * columns).
 * CM x CN > 1: a thread-block cluster of CM x CN blocks (TMA producer only),
 * rank = rn CM + rm, owning M tiles tm0 + rm and N tiles tn0 + rn. The CM
 * blocks of one N tile share its W tile: block rm loads rows [rm BN / CM,
 * (rm + 1) BN / CM) of it into its slot and multicasts them to the others'
 * slots at the same offset; likewise the CN blocks of one M tile share the X
 * tile. A block's full barrier counts the whole stage's bytes (its own and
 * its peers' boxes); since peers write into its slots, a slot is free only
 * when the consumers of every block it writes into (the same column and row
 * of the cluster, NARR = CM + CN - 1 blocks, itself included) have released
 * it: each consumer warp arrives on all those blocks' empty barriers. Boxes
 * past the matrix start at its last row instead (rows that feed only
 * outputs that are never stored). Every block runs every k tile, even one
 * past the last tile (it stores nothing), and the cluster waits for all
 * blocks before any exits (a peer may still arrive on its barriers). Which
 * block loads which bytes is all that changes: the chains and the fold are
 * the same.
 * CK > 1: a cluster of CK blocks shares one tile along K, so that a tile's
 * chunk chains run on CK SMs side by side where few tiles would leave most
 * SMs idle and each SM a long series of dependent wgmma steps. Block q runs
 * chunks q, q + CK, q + 2 CK, ...: in round j each block's chain of chunk
 * j CK + q goes from its registers to its shared memory, the cluster syncs,
 * and block q folds columns [q BN / CK, (q + 1) BN / CK) of every block's
 * partial into its running sum for those columns (distributed shared memory,
 * blocks in rank order, i.e. chunks in order; all of a round's remote loads
 * are issued before the fold, since one after another each waited a round
 * trip), then with one partial buffer the cluster syncs again (the partials
 * may be overwritten; two buffers alternate instead where they fit), and at
 * the end block q stores its columns: the chains and the fold of the
 * contract, only spread over blocks.
 * A chunk's ring slots are handed back when its chain ends, so that the
 * producer (which joins the cluster syncs of round j - 1 after issuing round
 * j's loads) never waits on a slot held across a sync. */
template <typename T, int CWG, int BN, int IN, int STAGES, bool TMA, bool FOLD, int CM, int CN,
          bool PERSIST, int SCHED, int CK>
__device__ __forceinline__ void wg_body(const mbd_wg_params &P) {
#ifdef MBD_HAVE_WGMMA
  constexpr bool RG = (SCHED & MBD_WG_RG) != 0;
  constexpr int BM = 64 * CWG, BK = 64, KCH = MBD_WG_KCH / BK;
  constexpr uint32_t A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
  constexpr uint32_t STAGE_BYTES = A_BYTES + B_BYTES;
  constexpr bool CL = CM * CN > 1;
  constexpr int NARR = CL ? CM + CN - 1 : 0;
  static_assert(BN % IN == 0 && IN % 8 == 0, "instruction N must tile BN");
  static_assert(!CL || (TMA && BN % (8 * CM) == 0 && BM % (8 * CN) == 0 && CM * CN <= 16),
                "cluster pieces are whole 8-row swizzle atoms");
  static_assert(!PERSIST || TMA, "the persistent tiles have the TMA producer");
  constexpr bool BOUND = CL || PERSIST; /* ring waits that trap instead of hanging */
  static_assert(!FOLD || BN <= (RG ? 192 : 128), "acc + partial must fit the register file");
  static_assert(!RG || (CWG == 2 && !CL && !PERSIST), "RG: two consumer warpgroups, alone");
  constexpr bool KS = CK > 1;
  constexpr int SL = BN / 2 / CK; /* KS: accumulator registers of a block's column slice */
  constexpr int PB = MBD_WG_KS_PBUF(BM); /* KS: partial buffers (gemm_params.h) */
  constexpr uint32_t PART_BYTES = KS ? (uint32_t)PB * BM * BN * 4 : 0u;
  static_assert(!KS || (TMA && FOLD && !CL && !PERSIST && !RG && SL % 4 == 0 && CK <= 8),
                "K split: TMA tiles alone, slices of whole 8-column groups");
  extern __shared__ __align__(16) unsigned char wg_raw[];
  const uint32_t raw_s = smem_u32(wg_raw);
  const uint32_t base_s = (raw_s + 1023u) & ~1023u; /* the swizzle atom needs 1024 */
  unsigned char *base = wg_raw + (base_s - raw_s);
  const uint32_t full0 = base_s + STAGES * STAGE_BYTES, empty0 = full0 + 8 * STAGES;
  const mbd_gemm_params &p = P.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  /* Grouped raster: 16 M tiles share each sweep over N (L2 reuse of W and X);
   * a cluster is one raster cell of CM x CN tiles. PERSIST: block (or
   * cluster) b takes cells b, b + grid, ... one after another (the ring runs
   * on across them, so the next cell's loads overlap this one's fold and
   * stores); otherwise cell b only. */
  uint32_t rm = 0, rn = 0;
  if (CL) {
    const uint32_t rank = cl_rank();
    rm = rank % CM;
    rn = rank / CM;
  }
  const int cm_tiles = (P.tiles_m + CM - 1) / CM, cn_tiles = (P.tiles_n + CN - 1) / CN;
  const int ncells = cm_tiles * cn_tiles;
  const int cell0 = CL ? (int)(blockIdx.x / (CM * CN)) : KS ? (int)(blockIdx.x / CK) : (int)blockIdx.x;
  const int cstride = CL ? (int)(gridDim.x / (CM * CN)) : (int)gridDim.x;
  auto tile_of = [&](int bid, int &tm, int &tn) {
    const int G = 16 / CM > 0 ? 16 / CM : 1, per = G * cn_tiles, grp = bid / per,
              first = grp * G;
    const int gs = min(cm_tiles - first, G), r = bid - grp * per;
    tm = first + r % gs;
    tn = r / gs;
    if (CL) {
      tm = tm * CM + (int)rm;
      tn = tn * CN + (int)rn;
    }
  };
  /* f(tm, tn) for each of this block's tiles: its cell's, then (PERSIST)
   * those of every cstride-th cell after it */
  auto for_tiles = [&](auto &&f) {
    int tm, tn;
    tile_of(cell0, tm, tn);
    for (int cell = cell0; cell < ncells;) {
      f(tm, tn);
      if (!PERSIST) break;
      cell += cstride;
      if (cell < ncells) tile_of(cell, tm, tn);
    }
  };
  const int KT = (p.k + BK - 1) / BK;
  wg_check_smem(1023u + STAGES * STAGE_BYTES + 16u * STAGES + PART_BYTES);
  /* KS: the K split's rounds (a chunk each per block) and the cluster syncs
   * of each (every thread of the cluster, the producer's included): one
   * before the fold, and with one partial buffer a second after it (the
   * partials may be overwritten); with two, round j + 1 writes the other
   * buffer and round j + 2's writes come after round j + 1's sync, which
   * every block reaches only after its fold of round j. */
  const int nch = (KT + KCH - 1) / KCH, rounds = (nch + CK - 1) / CK;
  auto ks_syncs = [] {
    cl_arrive();
    cl_wait();
    if (PB == 1) {
      cl_arrive();
      cl_wait();
    }
  };
  auto ks_last = [] { /* PB == 2: no block exits while a peer reads its partials */
    if (PB == 2) {
      cl_arrive();
      cl_wait();
    }
  };

  if (threadIdx.x == 0) {
    if (TMA) {
      tma_prefetch_desc(&P.tw);
      tma_prefetch_desc(&P.tx);
    }
    for (int s = 0; s < STAGES; s++) {
      mbar_init(full0 + 8 * s, TMA ? 1 : 32);
      mbar_init(empty0 + 8 * s, 4 * CWG * (CL ? NARR : 1));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  /* When M < BM the A rows past M are never loaded: they hold whatever shared
   * memory held and only feed output rows that are never stored (wgmma rows
   * are independent; zeroing them would cost every block time at decode). */
  if (CL) { /* the peers' barriers exist before anything signals them */
    cl_arrive();
    cl_wait();
  } else {
    __syncthreads();
  }
  wg_pdl_wait(); /* X and Y belong to the predecessor until it completes */
  wg_pdl_trigger();

  if (RG && warp >= 4 * CWG) { /* the producer warpgroup's registers go to the consumers */
    wg_setmaxnreg_dec<MBD_WG_RG_PRODUCER_REGS>();
    if (warp > 4 * CWG) return; /* one producer warp issues the copies */
  }
  if (warp == 4 * CWG) { /* producer warp: TMA from lane 0, plain loads from all lanes */
    constexpr int AP = BM / CN, BP = BN / CM; /* rows of this block's pieces */
    constexpr uint16_t col_mask = (uint16_t)((1u << CM) - 1u);
    uint16_t row_mask = 0;
    for (int j = 0; j < CN; j++) row_mask |= (uint16_t)(1u << (j * CM + rm));
    const uint16_t b_mask = (uint16_t)(col_mask << (rn * CM));
    int g = 0; /* ring stage count over all of this block's cells */
    auto load = [&](const int tm, const int tn, const int kt0, const int kt1) {
      const int m0 = tm * BM, n0 = tn * BN;
      const int a_row = CL ? min(m0 + (int)rn * AP, p.m - 1) : m0;
      const int b_row = CL ? min(n0 + (int)rm * BP, p.n - 1) : n0;
      for (int kt = kt0; kt < kt1; kt++, g++) {
        const int s = g % STAGES;
        const uint32_t ph = (uint32_t)(g / STAGES) & 1u, full = full0 + 8 * s;
        const uint32_t a_s = base_s + s * STAGE_BYTES, b_s = a_s + A_BYTES;
        if (g >= STAGES) wg_wait_bar<BOUND>(empty0 + 8 * s, ph ^ 1u);
        if (TMA) {
          mbar_expect_tx(full, CL ? STAGE_BYTES : (uint32_t)P.a_rows * 128u + B_BYTES);
          if (CN == 1)
            tma_load_2d(a_s, &P.tx, full, kt * BK, a_row);
          else
            tma_load_2d_mc(a_s + rn * AP * 128, &P.tx, full, kt * BK, a_row, row_mask);
          if (CM == 1)
            tma_load_2d(b_s, &P.tw, full, kt * BK, b_row);
          else
            tma_load_2d_mc(b_s + rm * BP * 128, &P.tw, full, kt * BK, b_row, b_mask);
        } else {
          unsigned char *a = base + s * STAGE_BYTES;
          wg_manual_tile<T>(a, (const T *)p.x, p.m, p.k, m0, kt * BK, BM, lane);
          wg_manual_tile<T>(a + A_BYTES, (const T *)p.w, p.n, p.k, n0, kt * BK, BN, lane);
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          mbar_arrive(full);
        }
      }
    };
    if constexpr (KS) {
      const int q = (int)cl_rank();
      int tm, tn;
      tile_of(cell0, tm, tn);
      for (int j = 0; j < rounds; j++) {
        const int ch = j * CK + q;
        if (lane == 0 && ch < nch) load(tm, tn, ch * KCH, min(KT, ch * KCH + KCH));
        __syncwarp();
        if (j > 0) ks_syncs(); /* round j - 1's */
      }
      ks_syncs();
      ks_last();
      return;
    }
    auto produce = [&](const int tm, const int tn) { load(tm, tn, 0, KT); };
    if (!TMA || lane == 0) for_tiles(produce);
    if (CL) {
      __syncwarp();
      cl_arrive();
      cl_wait();
    }
    return;
  }

  if (RG) wg_setmaxnreg_inc<MBD_WG_RG_CONSUMER_REGS>();
  /* consumer warpgroup c: rows [m0 + 64c, m0 + 64c + 64), all BN columns */
  const int c = warp >> 2;
  const uint32_t a_off = c * 64 * 128;
  /* cluster: lane i < NARR arrives on block arr_rank's empty barriers: first
   * the CM blocks of this column (W sharers, this one included), then the
   * other CN - 1 blocks of this row (X sharers) */
  uint32_t arr_rank = 0;
  if (CL) {
    if (lane < CM) {
      arr_rank = rn * CM + (uint32_t)lane;
    } else if (lane < NARR) {
      const uint32_t q = (uint32_t)lane - CM, j = q < rn ? q : q + 1;
      arr_rank = j * CM + rm;
    }
  }
  int g = 0; /* ring stage count over all of this block's cells */
  /* One chunk's chain from 0 into d over k tiles [kt, end of the chunk),
   * not waited for. */
  auto run_chunk = [&](float *d, int &kt) {
    const int end = FOLD ? min(KT, kt + KCH) : KT;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
    for (; kt < end; kt++, g++)
      wg_stage<T, BN, IN, STAGES, NARR, BOUND>(d, g, base_s + (g % STAGES) * STAGE_BYTES, a_off,
                                               A_BYTES, full0, empty0, lane, arr_rank);
  };
  if constexpr (KS) {
    const int q = (int)cl_rank();
    constexpr int NT = 128 * CWG;
    /* partials [PB][BN / 8][NT] float4: thread ct's accumulators 4i..4i+3 at
     * [i][ct], so a block's slice is SL / 4 16-byte loads a thread */
    const uint32_t part_s = full0 + 16u * STAGES;
    float4 *part = (float4 *)(base + STAGES * STAGE_BYTES + 16 * STAGES);
    const int ct = (int)threadIdx.x;
    int tm, tn;
    tile_of(cell0, tm, tn);
    float acc[BN / 2], sum[SL];
    for (int j = 0; j < rounds; j++) {
      const int ch = j * CK + q, pb = PB == 2 ? (j & 1) : 0;
      if (ch < nch) {
        const int kt0 = ch * KCH, kt1 = min(KT, kt0 + KCH);
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
        for (int kt = kt0; kt < kt1; kt++, g++)
          wg_stage<T, BN, IN, STAGES, 0, false>(acc, g, base_s + (g % STAGES) * STAGE_BYTES,
                                                a_off, A_BYTES, full0, empty0, lane, 0,
                                                kt > kt0);
        wg_wait<0>();
        wg_fence_regs<BN / 2>(acc);
        if (lane == 0) mbar_arrive(empty0 + 8 * ((g - 1) % STAGES)); /* the chunk's last slot */
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
          part[(pb * (BN / 8) + i) * NT + ct] =
              make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
      }
      cl_arrive(); /* every block's partial of round j is in its shared memory */
      cl_wait();
      /* every load of the round first (each remote load costs a round trip,
       * which one after another would serialise), then the fold in rank
       * order, which is chunk order */
      const int nr = min(CK, nch - j * CK);
      float4 v[CK][SL / 4];
      const uint32_t off = part_s + 16u * (uint32_t)((pb * (BN / 8) + q * (SL / 4)) * NT + ct);
#pragma unroll
      for (int r = 0; r < CK; r++) {
        if (r < nr) {
          const uint32_t ra = cl_map(off, (uint32_t)r);
#pragma unroll
          for (int i = 0; i < SL / 4; i++) v[r][i] = ld_cl_f32x4(ra + 16u * (uint32_t)(i * NT));
        }
      }
#pragma unroll
      for (int r = 0; r < CK; r++) {
        if (r < nr) {
          const bool first = j == 0 && r == 0;
#pragma unroll
          for (int i = 0; i < SL / 4; i++) {
            const float e[4] = {v[r][i].x, v[r][i].y, v[r][i].z, v[r][i].w};
#pragma unroll
            for (int u = 0; u < 4; u++)
              sum[4 * i + u] = first ? e[u] : __fadd_rn(sum[4 * i + u], e[u]);
          }
        }
      }
      if (PB == 1) { /* every block has read round j's partials */
        cl_arrive();
        cl_wait();
      }
    }
    ks_last();
    const T *B = (const T *)p.bias;
    const int wr = (warp & 3) * 16 + (lane >> 2);
#pragma unroll
    for (int i = 0; i < SL; i += 2) { /* accumulator index e = q SL + i: column group e / 4 */
      const int e = q * SL + i;
      wg_store2<T>(p, B, tm * BM + c * 64 + wr + ((e >> 1) & 1) * 8,
                   tn * BN + (e >> 2) * 8 + (lane & 3) * 2, sum[i], sum[i + 1]);
    }
    return;
  }
  /* one tile: the chains, the fold, the bias and the stores */
  auto consume = [&](const int tm, const int tn) {
  const int m0 = tm * BM, n0 = tn * BN;
  /* The running sum lives outside the wgmma accumulators: an accumulator that
   * ordinary instructions redefine between wgmmas makes ptxas serialize them. */
  float sum[BN / 2], acc[BN / 2];
  int kt = 0;
  run_chunk(acc, kt); /* chunk 0 (FOLD: each chunk drained, then folded) */
  wg_wait<0>();
  wg_fence_regs<BN / 2>(acc);
#pragma unroll
  for (int i = 0; i < BN / 2; i++) sum[i] = acc[i];
  if constexpr (FOLD) {
    while (kt < KT) {
      run_chunk(acc, kt);
      wg_wait<0>();
      wg_fold<BN / 2>(sum, acc);
    }
  }
  if (CL && !PERSIST) cl_arrive(); /* this block's arrivals on its peers are all done */
  const T *B = (const T *)p.bias;
  const int wr = (warp & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < BN / IN; j++) {
#pragma unroll
    for (int nb = 0; nb < IN / 8; nb++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int i = j * (IN / 2) + nb * 4 + h * 2;
        wg_store2<T>(p, B, m0 + c * 64 + wr + h * 8, n0 + j * IN + nb * 8 + (lane & 3) * 2,
                     sum[i], sum[i + 1]);
      }
    }
  }
  };
  for_tiles(consume);
  if (CL && PERSIST) cl_arrive(); /* this block's arrivals on its peers are all done */
  if (CL) cl_wait(); /* no block exits while a peer may still arrive on it */
#else
  (void)P;
  __trap(); /* not built for sm_90a: the host never dispatches here */
#endif
}

/* M <= 16 (decode): mma.sync.m16n8k16 chains instead of wgmma. On sm_90a an
 * m16n8k16 step accumulates with the same bits as a wgmma k16 step
 * (test_gpu_gemm_bitwise checks it at every M against the wgmma tile kernels),
 * so a chunk chain here is the contract's chunk chain, and an m16 instruction
 * wastes 15 rows where the m64 wgmma wastes 63 (a wgmma step costs an SM the
 * same time whatever the warpgroup count, which bounds decode GEMMs).
 *
 * Decode is a weight stream, so the kernel is built around keeping every SM's
 * memory pipe full. Loads serialised with each warp's chain, 16-byte cp.async
 * copies through a ring (the load/store unit caps an SM's bytes in flight) and
 * one 1D bulk copy per W row (bound by the copy engine's per-copy cost on
 * short rows) all leave it short of copy bandwidth (docs/benchmarks.md, "M <=
 * 16 decode GEMM"), so W moves by TMA boxes of 64 k x BN rows (128-byte swizzle,
 * zero fill past N and K) issued by a producer warp through a ring of `stages`
 * slots (full/empty mbarriers, across strip boundaries, from before the
 * grid-dependency wait: W is static under w_static). A persistent grid (one
 * block per SM) walks column strips of BN columns (strips b, b + grid, ...);
 * a slot holds BN rows x CPS = 8 >> lg chunks, one (column group, chunk) item
 * per consumer warp. Two forms, both the contract's chains:
 *  - SW (M <= 8, kernel _8): W is the A operand, so one m16n8k16 step covers 16
 *    W rows and the 8 B columns are the rows of X (an m16n8 output is 16
 *    columns x 8 rows). Half the dependent steps per W byte of the other form:
 *    a step's products and its k order are the same, only the operands' roles
 *    swap (test_gpu_gemm_bitwise checks the bits at every M against the tiles).
 *  - X is the A operand (kernel _16, M <= 16; also M <= 8 when N is too narrow
 *    for 16-column groups to fill the SMs): 8 W rows per step.
 * The 8 consumer warps stage X (M rows) once after the wait; consumer w takes
 * group w % G, chunk slot w / G of each slot, loads its fragments by ldmatrix
 * (X rows >= M read row M-1 and only feed outputs that are never stored), zeroes
 * X's k >= K in the last chunk (W past K is the copy engine's zero fill), and
 * runs the chain from 0 to the end of the last 64-wide k tile. CPS = 1: a warp
 * owns its columns' chunks in order and folds them in registers (__fadd_rn);
 * otherwise the real rows' partials go to shared memory [chunk][M][BN] (two
 * buffers by strip parity) and the consumers fold them in chunk order after a
 * named barrier. Then the bias and the store. Needs K % 8 == 0 and x, w 16-byte
 * aligned (gpu_gemm.cu picks the form, lg and stages from the same
 * mbd_mk_params and MK_* constants, gemm_params.h). */

__device__ __forceinline__ void mk_consumer_sync() { /* the 8 consumer warps only */
  asm volatile("bar.sync 1, %0;" ::"n"(MK_WARPS * 32) : "memory");
}

/* The ring's S full barriers (the producer's one arrival with its bytes) and
 * empty barriers (one arrival per consumer warp), then the whole block syncs. */
__device__ __forceinline__ void mk_init_ring(uint32_t full0, uint32_t empty0, int S) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; s++) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, MK_WARPS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

/* X [M, K] (K % 8 == 0) into shared rows of xs bytes by the consumer warps:
 * 16-byte pieces, eight loads in flight per thread before the stores. */
template <typename T>
__device__ __forceinline__ void mk_stage_x(unsigned char *xsm, const T *X, int M, int K, int xs) {
  const int pr = K / 8, total = M * pr, NT = MK_WARPS * 32;
  for (int i0 = threadIdx.x; i0 < total; i0 += 8 * NT) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
      const int i = i0 + u * NT, row = i / pr, col = i - row * pr;
      if (i < total) v[u] = *(const uint4 *)(X + (size_t)row * K + col * 8);
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
      const int i = i0 + u * NT, row = i / pr, col = i - row * pr;
      if (i < total) *(uint4 *)(xsm + (size_t)row * xs + col * 16) = v[u];
    }
  }
}

template <typename T, bool SW>
__device__ __forceinline__ void mk_body(const mbd_mk_params &P) {
#ifdef MBD_HAVE_WGMMA /* sm_90a only: the bit identity with wgmma is what makes it legal */
  const mbd_gemm_params &p = P.p;
  extern __shared__ __align__(16) unsigned char mk_raw[];
  constexpr int LW = SW ? 4 : 3; /* log2 of a warp's columns */
  const int M = p.m, N = p.n, K = p.k, C = P.chunks, lg = P.lg, S = P.stages;
  const int lbn = LW + lg, BN = 1 << lbn, G = 1 << lg, CPS = 8 >> lg;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int xs = 2 * K + 16, sps = (C + CPS - 1) / CPS, Kp = (K + 63) / 64 * 64;
  const uint32_t tile_b = (uint32_t)BN * 128, sb = tile_b * 4 * CPS; /* k tile, slot */
  const int mine = (P.strips - 1 - (int)blockIdx.x) / (int)gridDim.x + 1; /* grid <= strips */
  const int TT = mine * sps;
  const uint32_t full0 = smem_u32(mk_raw), empty0 = full0 + 8 * MK_MAX_STAGES;
  unsigned char *xsm = mk_raw + MK_BAR_BYTES;
  float *part = (float *)(xsm + (size_t)M * xs);
  const size_t pbuf = CPS > 1 ? (size_t)C * M * BN : 0; /* floats per partial buffer */
  const uint32_t x_s = smem_u32(xsm);
  const uint32_t ring_s = (smem_u32(part + 2 * pbuf) + 1023u) & ~1023u; /* swizzle atom */
  const T *X = (const T *)p.x, *B = (const T *)p.bias;

  mk_init_ring(full0, empty0, S);

  if (warp == MK_WARPS) { /* producer: W is static, no dependency wait */
    wg_pdl_trigger();
    if (lane == 0) {
      tma_prefetch_desc(&P.tw);
      for (int t = 0; t < TT; t++) {
        const int s = t % S;
        if (t >= S) mbar_wait(empty0 + 8 * s, (uint32_t)(t / S - 1) & 1u);
        const int n0 = (blockIdx.x + (t / sps) * gridDim.x) << lbn;
        const int kb = (t % sps) * CPS * MBD_WG_KCH;
        const int tiles = min(4 * CPS, (Kp - kb) / 64); /* the chains stop at Kp */
        mbar_expect_tx(full0 + 8 * s, (uint32_t)tiles * tile_b);
        for (int i = 0; i < tiles; i++)
          tma_load_2d(ring_s + s * sb + i * tile_b, &P.tw, full0 + 8 * s, kb + 64 * i, n0);
      }
    }
    return;
  }

  wg_pdl_wait(); /* X and Y belong to the predecessor until it completes */
  wg_pdl_trigger();
  mk_stage_x(xsm, X, M, K, xs);
  mk_consumer_sync();

  const int g = warp & (G - 1), j = warp >> lg, q = lane & 3, r = lane >> 2;
  /* ldmatrix lane addresses. W in the 128-byte swizzle: the 16-byte piece c of
   * row R of a k tile sits at R * 128 + ((c ^ (R & 7)) * 16); a lane's R & 7 is
   * lane & 7 and its piece is a constant per step xor its k offset, so the xor
   * of both is precomputed (w_x). SW: W rows g*16 + (lane & 15), k offset
   * 8 (lane >> 4); X rows lane & 7, k offset 8 (lane >> 3). Otherwise: W rows
   * g*8 + (lane & 7), k offset 8 (lane >> 3); X rows lane & 15, k offset
   * 8 (lane >> 4). X rows clamp to M - 1. */
  const int w_row = SW ? g * 16 + (lane & 15) : g * 8 + (lane & 7);
  const int w_x = (SW ? lane >> 4 : lane >> 3) ^ (lane & 7);
  const uint32_t w_lane = (uint32_t)(w_row * 128) + (uint32_t)j * 4 * tile_b;
  const uint32_t x_lane =
      SW ? x_s + (uint32_t)(min(lane & 7, M - 1) * xs + (lane >> 3) * 16)
         : x_s + (uint32_t)(min(lane & 15, M - 1) * xs + (lane >> 4) * 16);
  /* output i of a lane's m16n8 fragment: X row xr(i), column n0 + wc(i) */
  auto xr = [&](int i) { return SW ? 2 * q + (i & 1) : r + 8 * (i >> 1); };
  auto wc = [&](int i) { return SW ? g * 16 + r + 8 * (i >> 1) : g * 8 + 2 * q + (i & 1); };
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float bias[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int buf = 0;

  for (int t = 0; t < TT; t++) {
    const int s = t % S, ls = t % sps, c = ls * CPS + j;
    const int n0 = (blockIdx.x + (t / sps) * gridDim.x) << lbn;
    if (ls == 0 && B) { /* fetched early: used after the strip, off the critical path */
      if (CPS == 1) {
#pragma unroll
        for (int i = 0; i < 4; i++)
          bias[i] = n0 + wc(i) < N ? mma_op<T>::to_f(B[n0 + wc(i)]) : 0.0f;
      } else { /* the fold below gives this thread column threadIdx.x % BN only */
        const int on = n0 + (threadIdx.x & (BN - 1));
        bias[0] = on < N ? mma_op<T>::to_f(B[on]) : 0.0f;
      }
    }
    mbar_wait(full0 + 8 * s, (uint32_t)(t / S) & 1u);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (c < C) {
      const uint32_t ws = ring_s + s * sb + w_lane, xc = x_lane + c * 512;
      uint32_t w[16][4], x[16][4]; /* per step: SW w = A, x = B (2 words); else x = A, w = B */
      if (SW) {
#pragma unroll
        for (int st = 0; st < 16; st++)
          ldsm_x4(w[st], ws + (st >> 2) * tile_b + ((((2 * st) & 7) ^ w_x) << 4));
#pragma unroll
        for (int h = 0; h < 8; h++) {
          uint32_t v[4];
          ldsm_x4(v, xc + h * 64);
          x[2 * h][0] = v[0];
          x[2 * h][1] = v[1];
          x[2 * h + 1][0] = v[2];
          x[2 * h + 1][1] = v[3];
        }
      } else {
#pragma unroll
        for (int h = 0; h < 8; h++) {
          uint32_t v[4];
          ldsm_x4(v, ws + (h >> 1) * tile_b + ((((4 * h) & 7) ^ w_x) << 4));
          w[2 * h][0] = v[0];
          w[2 * h][1] = v[1];
          w[2 * h + 1][0] = v[2];
          w[2 * h + 1][1] = v[3];
        }
#pragma unroll
        for (int st = 0; st < 16; st++) ldsm_x4(x[st], xc + st * 32);
      }
      if (c * MBD_WG_KCH + MBD_WG_KCH > K) { /* last chunk: zero X's k >= K (K % 8 == 0) */
#pragma unroll
        for (int st = 0; st < 16; st++) {
          const int k0 = c * MBD_WG_KCH + 16 * st + 2 * q;
          if (SW) {
            if (k0 >= K) x[st][0] = 0u;
            if (k0 + 8 >= K) x[st][1] = 0u;
          } else {
            if (k0 >= K) x[st][0] = x[st][1] = 0u;
            if (k0 + 8 >= K) x[st][2] = x[st][3] = 0u;
          }
        }
      }
      const int steps = min(16, (Kp - c * MBD_WG_KCH) / 16);
#pragma unroll
      for (int st = 0; st < 16; st++)
        if (st < steps) {
          if (SW)
            mma_op<T>::run(d, w[st], x[st]);
          else
            mma_op<T>::run(d, x[st], w[st]);
        }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * s); /* the slot's fragments are consumed */

    if (CPS == 1) { /* this warp ran chunk ls of its columns: fold in order */
#pragma unroll
      for (int i = 0; i < 4; i++) sum[i] = ls == 0 ? d[i] : __fadd_rn(sum[i], d[i]);
      if (ls == sps - 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int row = xr(i), on = n0 + wc(i);
          if (row >= M || on >= N) continue;
          const float v = B ? __fadd_rn(sum[i], bias[i]) : sum[i];
          const size_t o = (size_t)row * N + on;
          if (p.out_f32)
            ((float *)p.y)[o] = v;
          else
            ((T *)p.y)[o] = mma_op<T>::from_f(v);
        }
      }
    } else {
      float *pb = part + buf * pbuf;
      if (c < C) {
#pragma unroll
        for (int i = 0; i < 4; i++)
          if (xr(i) < M) pb[((size_t)c * M + xr(i)) * BN + wc(i)] = d[i];
      }
      if (ls == sps - 1) { /* strip complete: fold in chunk order, bias, store */
        mk_consumer_sync();
        for (int e = threadIdx.x; e < M * BN; e += MK_WARPS * 32) {
          const int row = e >> lbn, col = e & (BN - 1), on = n0 + col;
          if (on >= N) continue;
          float v = pb[e];
          for (int cc = 1; cc < C; cc++) v = __fadd_rn(v, pb[(size_t)cc * M * BN + e]);
          if (B) v = __fadd_rn(v, bias[0]);
          const size_t o = (size_t)row * N + on;
          if (p.out_f32)
            ((float *)p.y)[o] = v;
          else
            ((T *)p.y)[o] = mma_op<T>::from_f(v);
        }
        /* the next strip writes the other buffer; this one again only after
         * every consumer passed the next strip's barrier, i.e. after this fold */
        buf ^= 1;
      }
    }
  }
#else
  (void)P;
  __trap();
#endif
}

/* M <= 16, ragged column ranges (mbd_mkrgemm): the chains and the fold of
 * mk_body's X-as-A form, scheduled for N that no strip width spreads evenly
 * over the SMs (mk_body's busiest SM then walks extra strips of small boxes).
 * Block b owns groups [b q + min(b, r), + q + (b < r)) of 8 columns
 * (mbd_mkr_params), so the busiest SM moves ceil(N / 8 / grid) x 8 rows of W,
 * in one box per k tile. Ring slot t holds chunk t of the block's rows (four
 * k tiles of BR = 8 (q + (r > 0)) rows each); item (t, g) = the chunk-t chain
 * of group g goes to warp (t G + g) % 8, so the warps share the items evenly
 * across slots; each warp arrives on a slot's empty barrier once. The
 * partials go to shared memory [chunk][M][BR]; after the last slot the
 * consumers fold them in chunk order, add the bias (staged before the first
 * slot) and store. Bits: the same chain per (row, column, chunk) as mk_body
 * and the same fold. */
template <typename T>
__device__ __forceinline__ void mkr_body(const mbd_mkr_params &P) {
#ifdef MBD_HAVE_WGMMA
  const mbd_gemm_params &p = P.p;
  extern __shared__ __align__(16) unsigned char mk_raw[];
  const int M = p.m, N = p.n, K = p.k, C = P.chunks, S = P.stages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.x;
  const bool big = b < P.r;
  const int G = P.q + (big ? 1 : 0), BR = 8 * (P.q + (P.r > 0 ? 1 : 0));
  const int n0 = 8 * (b * P.q + min(b, P.r)), W = 8 * G;
  const int xs = 2 * K + 16, Kp = (K + 63) / 64 * 64;
  const uint32_t tile_b = (uint32_t)BR * 128, sb = tile_b * 4; /* k tile, slot */
  const uint32_t full0 = smem_u32(mk_raw), empty0 = full0 + 8 * MK_MAX_STAGES;
  unsigned char *xsm = mk_raw + MK_BAR_BYTES;
  float *part = (float *)(xsm + (size_t)M * xs);
  float *bsm = part + (size_t)C * M * BR;
  const uint32_t x_s = smem_u32(xsm);
  const uint32_t ring_s = (smem_u32(bsm + BR) + 1023u) & ~1023u; /* swizzle atom */
  const T *X = (const T *)p.x, *B = (const T *)p.bias;
  const CUtensorMap *tw = big ? &P.tw_big : &P.tw;

  mk_init_ring(full0, empty0, S);

  if (warp == MK_WARPS) { /* producer: W is static, no dependency wait */
    wg_pdl_trigger();
    if (lane == 0) {
      tma_prefetch_desc(tw);
      const uint32_t box_b = (uint32_t)W * 128;
      for (int t = 0; t < C; t++) {
        const int s = t % S;
        if (t >= S) mbar_wait(empty0 + 8 * s, (uint32_t)(t / S - 1) & 1u);
        const int kb = t * MBD_WG_KCH;
        const int tiles = min(4, (Kp - kb) / 64); /* the chains stop at Kp */
        mbar_expect_tx(full0 + 8 * s, (uint32_t)tiles * box_b);
        for (int i = 0; i < tiles; i++)
          tma_load_2d(ring_s + s * sb + i * tile_b, tw, full0 + 8 * s, kb + 64 * i, n0);
      }
    }
    return;
  }

  if (B && threadIdx.x < W) /* static under w_static: before the dependency wait */
    bsm[threadIdx.x] = n0 + (int)threadIdx.x < N ? mma_op<T>::to_f(B[n0 + threadIdx.x]) : 0.0f;
  wg_pdl_wait(); /* X and Y belong to the predecessor until it completes */
  wg_pdl_trigger();
  mk_stage_x(xsm, X, M, K, xs);
  mk_consumer_sync();

  const int q = lane & 3, r = lane >> 2;
  /* mk_body's X-as-A lane addresses: W rows g*8 + (lane & 7), k offset
   * 8 (lane >> 3); X rows lane & 15 (clamped to M - 1), k offset 8 (lane >> 4). */
  const int w_x = (lane >> 3) ^ (lane & 7);
  const uint32_t x_lane = x_s + (uint32_t)(min(lane & 15, M - 1) * xs + (lane >> 4) * 16);

  for (int t = 0; t < C; t++) {
    const int s = t % S;
    mbar_wait(full0 + 8 * s, (uint32_t)(t / S) & 1u);
    const bool last = t * MBD_WG_KCH + MBD_WG_KCH > K;
    const int steps = min(16, (Kp - t * MBD_WG_KCH) / 16);
    for (int g = ((warp - t * G) % MK_WARPS + MK_WARPS) % MK_WARPS; g < G; g += MK_WARPS) {
      const uint32_t ws = ring_s + s * sb + (uint32_t)((g * 8 + (lane & 7)) * 128);
      const uint32_t xc = x_lane + t * 512;
      uint32_t w[16][2], x[16][4];
#pragma unroll
      for (int h = 0; h < 8; h++) {
        uint32_t v[4];
        ldsm_x4(v, ws + (h >> 1) * tile_b + ((((4 * h) & 7) ^ w_x) << 4));
        w[2 * h][0] = v[0];
        w[2 * h][1] = v[1];
        w[2 * h + 1][0] = v[2];
        w[2 * h + 1][1] = v[3];
      }
#pragma unroll
      for (int st = 0; st < 16; st++) ldsm_x4(x[st], xc + st * 32);
      if (last) { /* zero X's k >= K (K % 8 == 0) */
#pragma unroll
        for (int st = 0; st < 16; st++) {
          const int k0 = t * MBD_WG_KCH + 16 * st + 2 * q;
          if (k0 >= K) x[st][0] = x[st][1] = 0u;
          if (k0 + 8 >= K) x[st][2] = x[st][3] = 0u;
        }
      }
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int st = 0; st < 16; st++)
        if (st < steps) mma_op<T>::run(d, x[st], w[st]);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int row = r + 8 * (i >> 1);
        if (row < M) part[((size_t)t * M + row) * BR + g * 8 + 2 * q + (i & 1)] = d[i];
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * s); /* this warp's items of the slot are done */
  }
  mk_consumer_sync();
  for (int e = threadIdx.x; e < M * W; e += MK_WARPS * 32) { /* fold in chunk order */
    const int row = e / W, col = e - row * W, on = n0 + col;
    if (on >= N) continue;
    float v = part[(size_t)row * BR + col];
    for (int cc = 1; cc < C; cc++) v = __fadd_rn(v, part[((size_t)cc * M + row) * BR + col]);
    if (B) v = __fadd_rn(v, bsm[col]);
    const size_t o = (size_t)row * N + on;
    if (p.out_f32)
      ((float *)p.y)[o] = v;
    else
      ((T *)p.y)[o] = mma_op<T>::from_f(v);
  }
#else
  (void)P;
  __trap();
#endif
}

#define MBD_WG(name, T, CWG, BN, IN, ST, TMA, MINB, FOLD, CM, CN, PS, SCHED, CK)          \
  extern "C" __global__ void __launch_bounds__(MBD_WG_THREADS(CWG, SCHED), MINB)         \
      name(const __grid_constant__ mbd_wg_params P) {                                     \
    wg_body<T, CWG, BN, IN, ST, TMA, FOLD, CM, CN, PS, SCHED, CK>(P);                    \
  }
#define MBD_MK(name, T, SW, MINB)                                                         \
  extern "C" __global__ void __launch_bounds__(MK_WARPS * 32 + 32, MINB)                 \
      name(const __grid_constant__ mbd_mk_params P) {                                     \
    mk_body<T, SW>(P);                                                                    \
  }
#define MBD_MKR(name, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(MK_WARPS * 32 + 32, 1)                    \
      name(const __grid_constant__ mbd_mkr_params P) {                                    \
    mkr_body<T>(P);                                                                       \
  }
/* Configurations (scheduling only): the wgmma tiles of MBD_WG_TILES
 * (gemm_params.h, which gpu_gemm.cu expands too), then
 *   mkgemm _8 / _16: M <= 8 / M <= 16, mma.sync chains streaming W (strip width and
 *         ring depth chosen per call), one block per SM
 *   mkrgemm: M <= 16, the _16 chains over ragged column ranges, one block per SM
 * the cluster / persistent tiles of MBD_WG_CL_TILES (mbd_wgcl_*) and the K
 * split tiles of MBD_WG_KS_TILES (mbd_wgks_*). */
#define MBD_WG_TILE(ty, T, i, CWG, BN, IN, ST, TMA, MINB, FOLD, SCHED)                    \
  MBD_WG(mbd_wgemm_##ty##_##i, T, CWG, BN, IN, ST, TMA, MINB, FOLD, 1, 1, false, SCHED, 1)
#define MBD_WG_CL_TILE(ty, T, i, CWG, BN, IN, ST, MINB, FOLD, CM, CN, PS)                 \
  MBD_WG(mbd_wgcl_##ty##_##i, T, CWG, BN, IN, ST, true, MINB, FOLD, CM, CN, PS, 0, 1)
#define MBD_WG_KS_TILE(ty, T, i, CWG, BN, IN, ST, CK)                                     \
  MBD_WG(mbd_wgks_##ty##_##i, T, CWG, BN, IN, ST, true, 1, true, 1, 1, false, 0, CK)
#define MBD_WG_ALL(ty, T)                                                                  \
  MBD_WG_TILES(MBD_WG_TILE, ty, T)                                                         \
  MBD_WG_CL_TILES(MBD_WG_CL_TILE, ty, T)                                                   \
  MBD_WG_KS_TILES(MBD_WG_KS_TILE, ty, T)                                                   \
  MBD_MK(mbd_mkgemm_##ty##_8, T, true, 1)                                                  \
  MBD_MK(mbd_mkgemm_##ty##_16, T, false, 1)                                                \
  MBD_MKR(mbd_mkrgemm_##ty, T)
MBD_WG_ALL(bf16, __nv_bfloat16)
MBD_WG_ALL(f16, __half)

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
