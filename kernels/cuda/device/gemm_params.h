/* What the GEMM kernels (device/gemm_kernels.cu) and their host dispatch
 * (gpu_gemm.cu) both read: the kernels' parameter blocks, the constants their
 * layouts depend on, and the tile configurations, each defined once. Plain C
 * layout (C and C++ include the same definitions); the configuration tables
 * are X-macros: the device expands them into kernels, the host into the
 * tables it sizes grids and shared memory from, so the two cannot disagree. */
#ifndef MBD_GEMM_PARAMS_H
#define MBD_GEMM_PARAMS_H

#include <cuda.h> /* CUtensorMap */

/* Every GEMM kernel's problem: Y[M,N] = X[M,K] W[N,K]^T (+ b[N]). */
typedef struct mbd_gemm_params {
  const void *x;    /* [M,K] row-major */
  const void *w;    /* [N,K] row-major (HF [out,in]) */
  const void *bias; /* [N] in the input dtype, or NULL */
  void *y;          /* [M,N] row-major, f32 or the input dtype */
  int m, n, k;
  int out_f32; /* 1: y is f32; 0: y has the input dtype */
} mbd_gemm_params;

/* f32 / tf32 SIMT tiles, slot order s, m, l (scheduling only):
 * X(name, BM, BN, BK, TM, TN), TM x TN outputs per thread,
 * (BM / TM) * (BN / TN) threads. */
#define MBD_SGEMM_TILES(X)                                                               \
  X(s, 16, 32, 128, 2, 2)                                                                \
  X(m, 64, 64, 16, 4, 4)                                                                 \
  X(l, 128, 128, 8, 8, 8)

/* bf16 / f16 mma.sync tiles, slot order s, m, n, l (scheduling only):
 *   s: M <= 16, weight streaming (decode)  m: M <= 64  n: medium  l: large M
 * X(ty, T, name, BM, BN, BK, WM, WN, STAGES_VEC, STAGES_ELEM), WM x WN per
 * warp, (BM / WM) * (BN / WN) warps; the stage counts of the 16-byte cp.async
 * (_v) and the element-load (_e) kernels. ty, T: passed through. */
#define MBD_HGEMM_TILES(X, ty, T)                                                        \
  X(ty, T, s, 16, 32, 128, 16, 8, 4, 2)                                                  \
  X(ty, T, m, 64, 32, 64, 32, 16, 4, 2)                                                  \
  X(ty, T, n, 64, 64, 32, 32, 32, 4, 2)                                                  \
  X(ty, T, l, 128, 128, 64, 64, 32, 3, 2)

/* ---- sm_90a wgmma family ---- */

#define MBD_WG_KCH 256 /* K per chunk of the sm_90a contract */

/* MBD_WG_RG (a wgmma tile's SCHED; scheduling only, the same chains and fold):
 * the producer is a whole warpgroup that hands its registers to the consumer
 * warpgroups (setmaxnreg: producer 56, consumers 224 of a 384-thread block's
 * 168), which then hold a 64 x 192 sum and chunk partial. */
#define MBD_WG_RG 1
#define MBD_WG_RG_PRODUCER_REGS 56
#define MBD_WG_RG_CONSUMER_REGS 224
/* Threads of a wgmma tile block: 128 a consumer warpgroup, then the producer
 * (one warp, or a warpgroup under MBD_WG_RG). */
#define MBD_WG_THREADS(CWG, SCHED) ((CWG) * 128 + (((SCHED) & MBD_WG_RG) ? 128 : 32))

/* wgmma configurations, index = kernel slot offset (scheduling only):
 *   0..3: 64 x {16,32,64,128}, one block per SM with ~200 KB of stages so each SM
 *         keeps 40-140 KB of weights in flight (decode is latency x bytes bound)
 *   4, 5: 128 x {64,128}; 6: 128 x 256 for K <= one chunk (no room for a partial)
 *   7, 8: plain-load producer, 64 x 64 and 128 x 128
 *   9: 64 x 72 (M <= 64 where N / 64 tiles leave a second wave of a few
 *      blocks, e.g. N = 8512 = 133 x 64: 119 tiles of 72 fill one wave)
 *   10: 128 x 192 under MBD_WG_RG (gpu_gemm.cu sched_tile: where its waves
 *       cost no more than 5's, which it replaces)
 * X(ty, T, index, CWG, BN, IN, STAGES, TMA, MINB, FOLD, SCHED): CWG consumer
 * warpgroups (BM = 64 CWG), wgmma N = IN, MINB blocks per SM (launch bounds),
 * FOLD: K may exceed one chunk; SCHED: 0 or MBD_WG_RG. ty, T: passed through.
 * (The table uses true/false: it is expanded by C++ only.) */
#define MBD_WG_TILES(X, ty, T)                                                          \
  X(ty, T, 0, 1, 16, 16, 20, true, 1, true, 0)                                          \
  X(ty, T, 1, 1, 32, 32, 18, true, 1, true, 0)                                          \
  X(ty, T, 2, 1, 64, 64, 13, true, 1, true, 0)                                          \
  X(ty, T, 3, 1, 128, 128, 9, true, 1, true, 0)                                         \
  X(ty, T, 4, 2, 64, 64, 4, true, 2, true, 0)                                           \
  X(ty, T, 5, 2, 128, 128, 4, true, 1, true, 0)                                         \
  X(ty, T, 6, 2, 256, 256, 4, true, 1, false, 0)                                        \
  X(ty, T, 7, 1, 64, 64, 4, false, 2, true, 0)                                          \
  X(ty, T, 8, 2, 128, 128, 3, false, 1, true, 0)                                        \
  X(ty, T, 9, 1, 72, 72, 12, true, 1, true, 0)                                          \
  X(ty, T, 10, 2, 192, 192, 5, true, 1, true, MBD_WG_RG)

/* The same tiles run by thread-block clusters of CM x CN blocks on
 * neighbouring M x N tiles, the W tile multicast to the CM blocks of its
 * column and the X tile to the CN blocks of its row, and/or persistent (PS:
 * a grid of at most the co-resident blocks, each walking tiles b, b + grid,
 * ... with one ring across them) (wg_body; TMA producer only; scheduling
 * only, same bits as the tiles above), index = slot offset:
 *   0, 1: 128 x 128 in 2 x 1 and 2 x 2 clusters; 2: 128 x 256 (K <= one
 *   chunk) in 2 x 1; 3: 128 x 64 in 2 x 1;
 *   4, 5, 6: 128 x 128 persistent alone, 2 x 1, 2 x 2; 7, 8: 128 x 256 (K <=
 *   one chunk) persistent alone, 2 x 1
 * X(ty, T, index, CWG, BN, IN, STAGES, MINB, FOLD, CM, CN, PS). */
#define MBD_WG_CL_TILES(X, ty, T)                                                       \
  X(ty, T, 0, 2, 128, 128, 6, 1, true, 2, 1, false)                                     \
  X(ty, T, 1, 2, 128, 128, 6, 1, true, 2, 2, false)                                     \
  X(ty, T, 2, 2, 256, 256, 4, 1, false, 2, 1, false)                                    \
  X(ty, T, 3, 2, 64, 64, 4, 2, true, 2, 1, false)                                       \
  X(ty, T, 4, 2, 128, 128, 6, 1, true, 1, 1, true)                                      \
  X(ty, T, 5, 2, 128, 128, 6, 1, true, 2, 1, true)                                      \
  X(ty, T, 6, 2, 128, 128, 6, 1, true, 2, 2, true)                                      \
  X(ty, T, 7, 2, 256, 256, 4, 1, false, 1, 1, true)                                     \
  X(ty, T, 8, 2, 256, 256, 4, 1, false, 2, 1, true)

/* The tiles of MBD_WG_TILES' TMA family with K split over a thread-block
 * cluster of CK blocks on one tile (wg_body; scheduling only, same bits),
 * index = slot offset: 0: 128 x 128 by 4; 1: 64 x 128 by 8; 2: 128 x 128 by
 * 2; 3: 64 x 128 by 4. Shared memory: the stages and MBD_WG_KS_PBUF(BM) BM x BN f32 partial
 * buffers (two where they fit beside the stages: one cluster sync a round
 * instead of two).
 * X(ty, T, index, CWG, BN, IN, STAGES, CK). */
#define MBD_WG_KS_PBUF(BM) ((BM) == 64 ? 2 : 1)
#define MBD_WG_KS_TILES(X, ty, T)                                                       \
  X(ty, T, 0, 2, 128, 128, 4, 4)                                                        \
  X(ty, T, 1, 1, 128, 128, 6, 8)                                                        \
  X(ty, T, 2, 2, 128, 128, 4, 2)                                                        \
  X(ty, T, 3, 1, 128, 128, 6, 4)

typedef struct mbd_wg_params {
  CUtensorMap tx; /* X [M,K], box {64, 64*CWG}, 128B swizzle, zero fill */
  CUtensorMap tw; /* W [N,K], box {64, BN} */
  mbd_gemm_params p;
  int tiles_m, tiles_n;
  int a_rows; /* rows of X the TMA box brings per stage (min(M, BM)) */
} mbd_wg_params;

/* mbd_mkgemm (M <= 16): consumer warps, ring depth, and the bytes of
 * mbarriers at the start of its shared memory. */
#define MK_WARPS 8 /* consumer warps; one producer warp more */
#define MK_MAX_STAGES 8
#define MK_BAR_BYTES 128 /* full[8], empty[8] mbarriers at the start of shared memory */

typedef struct mbd_mk_params {
  CUtensorMap tw; /* W [N,K], box {64, BN}, 128B swizzle */
  mbd_gemm_params p;
  int chunks; /* C = ceil(K / 256) */
  int lg;     /* strip width BN = (SW ? 16 : 8) << lg (lg 0..3); CPS = 8 >> lg */
  int strips; /* ceil(N / BN) */
  int stages; /* ring slots, 1..MK_MAX_STAGES */
} mbd_mk_params;

/* mbd_mkrgemm (M <= 16, ragged): one block per SM owns one contiguous range
 * of 8-column groups, q + 1 groups for blocks b < r, q for the others, from
 * group b q + min(b, r); its W moves by boxes of all its rows (64 k x 8 q or
 * 8 (q + 1) rows), one chunk (four k tiles) per ring slot. */
typedef struct mbd_mkr_params {
  CUtensorMap tw;     /* W [N,K], box {64, 8 q}, 128B swizzle */
  CUtensorMap tw_big; /* W [N,K], box {64, 8 (q + 1)} (blocks b < r; unused when r == 0) */
  mbd_gemm_params p;
  int chunks; /* C = ceil(K / 256) */
  int q, r;   /* groups per block: q + (b < r); q >= 1, grid * q + r = ceil(N / 8) */
  int stages; /* ring slots, 1..MK_MAX_STAGES */
} mbd_mkr_params;

#endif
