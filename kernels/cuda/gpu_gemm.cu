/* Host entry of the GEMM family: argument checks, tile dispatch for the
 * deterministic kernels (pure scheduling: every tile issues the same reduction
 * chain per output element, see device/gemm_kernels.cu), cuBLAS in the cuBLAS
 * modes, and launch recording. On an sm_90a build running on a cc 9.0 device,
 * bf16/f16 go to the wgmma family (tensor maps encoded here per call). */
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/device/gemm_params.h"
#include "kernels/cuda/gpu_ctx_impl.h"
extern "C" {
#include "kernels/cuda/gpu_gemm.h"
}

/* The kernels' tile configurations (device/gemm_params.h), index = kernel
 * slot offset. */
struct tile_cfg {
  int bm, bn, bk, threads, stages_vec, stages_elem;
};
#define HTILE(ty, T, n, BM, BN, BK, WM, WN, SV, SE)                                     \
  {BM, BN, BK, (BM / WM) * (BN / WN) * 32, SV, SE},
#define STILE(n, BM, BN, BK, TM, TN) {BM, BN, BK, (BM / TM) * (BN / TN), 0, 0},
static const tile_cfg k_htiles[4] = {MBD_HGEMM_TILES(HTILE, , )};
static const tile_cfg k_stiles[3] = {MBD_SGEMM_TILES(STILE)};
#undef HTILE
#undef STILE

/* wgmma configurations: bm, bn, stages, blocks per SM, threads, tma, fold. */
struct wtile_cfg {
  int bm, bn, stages, occ, threads;
  bool tma, fold;
};
#define WTILE(ty, T, i, CWG, BN, IN, ST, TMA, MINB, FOLD, SCHED)                          \
  {64 * CWG, BN, ST, MINB, MBD_WG_THREADS(CWG, SCHED), TMA, FOLD},
static constexpr wtile_cfg k_wtiles[11] = {MBD_WG_TILES(WTILE, , )};
#undef WTILE
/* M > 64 cost model of each TMA wgmma configuration (pick_wtile): a block
 * runs its tile's K / 64 stages at t_us each after o_us of fixed cost (the
 * prologue, the fold's drains, the stores); with two blocks an SM (occ 2)
 * each stage takes alpha times as long once two share it. Least-squares fits
 * to bench_gemm_gpu's tiles lines on the H200 (docs/benchmarks.md, "Figures
 * behind design choices"). 7, 8 (plain loads): not costed. */
struct wtile_cost {
  double t_us, o_us, alpha;
};
static const wtile_cost k_wcost[11] = {
    {0.160, 1.71, 1}, {0.172, 2.16, 1}, {0.199, 2.87, 1}, {0.248, 4.44, 1},
    {0.278, 3.24, 1.85}, {0.375, 4.53, 1}, {0.610, 6.23, 1}, {0, 0, 0},
    {0, 0, 0}, {0.204, 3.02, 1}, {0.560, 5.75, 1}};
/* Configuration 9 (64 x 72): for M <= 64 only, taken over 0..3 only when its
 * estimate is at least 10% lower (see pick_wtile). */
#define WTILE_72 9
/* Configuration 6 (128 x 256) keeps no chunk partial: K <= one chunk only. */
#define WTILE_NOFOLD 6
static_assert(!k_wtiles[WTILE_NOFOLD].fold && k_wtiles[WTILE_NOFOLD - 1].fold,
              "pick_wtile's K > one chunk range ends below WTILE_NOFOLD");
/* The cluster / persistent tiles (MBD_WG_CL_TILES): bm, bn, stages, blocks
 * per SM, cm x cn blocks a cluster, persistent. */
struct wcltile_cfg {
  int bm, bn, stages, occ, cm, cn;
  bool ps;
};
#define WCLTILE(ty, T, i, CWG, BN, IN, ST, MINB, FOLD, CM, CN, PS)                        \
  {64 * CWG, BN, ST, MINB, CM, CN, PS},
static constexpr wcltile_cfg k_wcltiles[9] = {MBD_WG_CL_TILES(WCLTILE, , )};
#undef WCLTILE
static constexpr bool wcl_all_128(int i) {
  return i == 9 || (k_wcltiles[i].bm == 128 && wcl_all_128(i + 1));
}
static_assert(wcl_all_128(0), "pick_wcltile replaces 128-row tiles only");
/* The K split tiles (MBD_WG_KS_TILES): bm, bn, stages, blocks a cluster
 * along K. */
struct wkstile_cfg {
  int bm, bn, stages, ck;
};
#define WKSTILE(ty, T, i, CWG, BN, IN, ST, CK) {64 * CWG, BN, ST, CK},
static constexpr wkstile_cfg k_wkstiles[4] = {MBD_WG_KS_TILES(WKSTILE, , )};
#undef WKSTILE
/* The kernel slots (gpu_ctx_impl.h) hold one kernel per configuration. */
static_assert(MBD_K_SGEMM_TF32 - MBD_K_SGEMM_F32 == sizeof k_stiles / sizeof k_stiles[0], "");
static_assert(MBD_K_HGEMM_F16 - MBD_K_HGEMM_BF16 == 2 * sizeof k_htiles / sizeof k_htiles[0], "");
static_assert(MBD_K_WGEMM_F16 - MBD_K_WGEMM_BF16 == sizeof k_wtiles / sizeof k_wtiles[0], "");
static_assert(MBD_K_WGCL_F16 - MBD_K_WGCL_BF16 == sizeof k_wcltiles / sizeof k_wcltiles[0], "");
static_assert(MBD_K_WGKS_BF16 - MBD_K_WGCL_F16 == sizeof k_wcltiles / sizeof k_wcltiles[0], "");
static_assert(MBD_K_WGKS_F16 - MBD_K_WGKS_BF16 == sizeof k_wkstiles / sizeof k_wkstiles[0], "");
static_assert(MBD_K_COUNT - MBD_K_WGKS_F16 == sizeof k_wkstiles / sizeof k_wkstiles[0], "");

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* M <= 64 streams the weights: a block keeps stages x BN x 128 weight bytes
 * in flight, so it moves about that much per loaded memory latency (taken as
 * 3 us); a wave's rate is the sum over its blocks, capped by HBM (~4 TB/s).
 * The estimated time (relative) of configuration c over N columns. */
static double wave_time(const mbd_gpu_ctx *ctx, const wtile_cfg &c, int64_t n) {
  double blk_rate = (double)c.stages * c.bn * 128 / 3e-6; /* bytes/s per block */
  if (blk_rate > 150e9) blk_rate = 150e9;
  int64_t left = cdiv(n, c.bn);
  double t = 0;
  while (left > 0) {
    int64_t w = left < ctx->sm_count ? left : ctx->sm_count;
    double rate = (double)w * blk_rate;
    t += (double)w * c.bn * 128 / (rate < 4e12 ? rate : 4e12);
    left -= w;
  }
  return t;
}

/* Estimated us of TMA configuration i on an M x N x K problem (k_wcost):
 * L = ceil(tiles / SMs) blocks an SM, run in ceil(L / occ) waves. */
static double tile_time(const mbd_gpu_ctx *ctx, int i, int64_t m, int64_t n, int64_t k) {
  const wtile_cfg &c = k_wtiles[i];
  const wtile_cost &w = k_wcost[i];
  const int64_t per_sm = cdiv(cdiv(m, c.bm) * cdiv(n, c.bn), (int64_t)ctx->sm_count);
  const int64_t waves = cdiv(per_sm, (int64_t)c.occ);
  const double share = c.occ > 1 && per_sm >= 2 ? w.alpha : 1.0;
  return (double)waves * ((double)cdiv(k, 64) * w.t_us * share + w.o_us);
}

/* Pure scheduling (every configuration computes the same bits, see the kernel
 * contract). M <= 64: the least wave_time. Larger M: the least tile_time. */
static int pick_wtile(const mbd_gpu_ctx *ctx, int64_t m, int64_t n, int64_t k, bool tma) {
  if (!tma) return m <= 64 ? 7 : 8;
  if (m <= 64) {
    int best = 3;
    double best_t = 0;
    for (int i = 3; i >= 0; i--) {
      const double t = wave_time(ctx, k_wtiles[i], n);
      if (i == 3 || t < best_t * 0.97) {
        best = i;
        best_t = t;
      }
    }
    /* 64 x 72 where N / 64 tiles leave a few blocks for a second wave
     * (MBD_GEMM_TILE72=0: not considered; same bits either way) */
    const char *env = getenv("MBD_GEMM_TILE72");
    if (!(env && env[0] == '0') && wave_time(ctx, k_wtiles[WTILE_72], n) < best_t * 0.9)
      return WTILE_72;
    return best;
  }
  int best = WTILE_NOFOLD - 1;
  double best_t = 0;
  for (int i = 0; i < (int)(sizeof k_wtiles / sizeof k_wtiles[0]); i++) {
    const wtile_cfg &c = k_wtiles[i];
    if (!c.tma || (!c.fold && k > MBD_WG_KCH)) continue;
    const double t = tile_time(ctx, i, m, n, k);
    if (best_t == 0 || t < best_t) {
      best = i;
      best_t = t;
    }
  }
  return best;
}

/* MBD_GEMM_SCHED (read per call) overrides pick_wtile's choice between the
 * 128 x 192 tile (configuration 10, MBD_WG_RG) and the 128 x 128 TMA tile
 * (5): old = 5 wherever 10 was picked (the dispatch before 10 existed);
 * w192f = 10 wherever 5 was picked; unset or other: the pick. Same bits in
 * every setting (the bench and the bitwise test compare them). */
#define WTILE_W192 10
static_assert(k_wtiles[WTILE_W192].bm == 128 && k_wtiles[WTILE_W192].bn == 192 &&
                  k_wtiles[WTILE_W192].fold && k_wtiles[WTILE_W192].tma,
              "sched_tile's wide tile is 128 x 192 with the fold and the TMA producer");
static int sched_tile(int ti) {
  const char *env = getenv("MBD_GEMM_SCHED");
  if (env && !strcmp(env, "old") && ti == WTILE_W192) return WTILE_NOFOLD - 1;
  if (env && !strcmp(env, "w192f") && ti == WTILE_NOFOLD - 1) return WTILE_W192;
  return ti;
}

/* cc 9.0 device and an sm_90a build: the wgmma family is the route's. */
static bool use_wgmma(const mbd_gpu_ctx *ctx) {
  if (ctx->cc_major != 9 || ctx->cc_minor != 0) return false;
  const char *archs = MBD_CUDA_ARCHS;
  const char *p = strstr(archs, "90a");
  return p && (p == archs || p[-1] == ';' || p[-1] == ' ');
}

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion,
                                    CUtensorMapFloatOOBfill);
/* The driver's tensor-map encoder, or NULL (then the plain-load kernels run:
 * same bits, slower). */
static encode_tiled_fn encoder(void) {
  static encode_tiled_fn fn = [] {
    void *f = NULL;
    cudaDriverEntryPointQueryResult q;
    if (!mbd_gpu_status_ok(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                            cudaEnableDefault, &q)) ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return (encode_tiled_fn)NULL;
    }
    return (encode_tiled_fn)f;
  }();
  return fn;
}

/* Row-major [rows, k] matrix, box {64, box_rows}, 128-byte swizzle, zero fill. */
static bool encode_map(CUtensorMap *m, mbd_dtype dt, const void *base, int64_t rows, int64_t k,
                       int box_rows) {
  encode_tiled_fn fn = encoder();
  if (!fn) return false;
  cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)k * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
  cuuint32_t es[2] = {1, 1};
  CUresult r = fn(m, dt == MBD_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                          : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                  2, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return mbd_gpu_status_ok(r);
}
static int64_t blocks_of(const tile_cfg &t, int64_t m, int64_t n) {
  return cdiv(m, t.bm) * cdiv(n, t.bn);
}

static int pick_htile(const mbd_gpu_ctx *ctx, int64_t m, int64_t n) {
  if (m <= 16) return 0;
  if (m <= 64) return blocks_of(k_htiles[2], m, n) >= 2 * ctx->sm_count ? 2 : 1;
  if (blocks_of(k_htiles[3], m, n) >= ctx->sm_count) return 3;
  if (blocks_of(k_htiles[2], m, n) >= ctx->sm_count) return 2;
  return 1;
}
static int pick_stile(const mbd_gpu_ctx *ctx, int64_t m, int64_t n) {
  if (m <= 16) return 0;
  if (blocks_of(k_stiles[2], m, n) >= ctx->sm_count) return 2;
  if (blocks_of(k_stiles[1], m, n) >= ctx->sm_count / 2) return 1;
  return 0;
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return a && b && x < y + bn && y < x + an;
}

static int check_args(const mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, mbd_error *err) {
  if (!a) return mbd_error_set(err, MBD_E_INVALID, "GEMM: args is NULL");
  if (a->m < 1 || a->n < 1 || a->k < 1 || a->m > INT32_MAX || a->n > INT32_MAX ||
      a->k > INT32_MAX)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "GEMM: M=%lld N=%lld K=%lld out of range (each 1..2^31-1)",
                         (long long)a->m, (long long)a->n, (long long)a->k);
  if (a->n > 65535LL * 32)
    return mbd_error_set(err, MBD_E_SHAPE, "GEMM: N=%lld exceeds %lld", (long long)a->n,
                         65535LL * 32);
  mbd_dtype want = ctx->policy == MBD_POLICY_BF16  ? MBD_DTYPE_BF16
                   : ctx->policy == MBD_POLICY_F16 ? MBD_DTYPE_F16
                                                   : MBD_DTYPE_F32;
  if (a->dtype != want)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "GEMM: input dtype %s does not match the context's storage policy %s "
                         "(expects %s)", mbd_dtype_name(a->dtype),
                         mbd_dtype_policy_name(ctx->policy), mbd_dtype_name(want));
  if (a->out_dtype != MBD_DTYPE_F32 && a->out_dtype != a->dtype)
    return mbd_error_set(err, MBD_E_SHAPE, "GEMM: output dtype %s must be f32 or %s",
                         mbd_dtype_name(a->out_dtype), mbd_dtype_name(a->dtype));
  if (!a->x || !a->w || !a->y)
    return mbd_error_set(err, MBD_E_INVALID, "GEMM: x, w and y must be device pointers");
  size_t es = mbd_dtype_size(a->dtype), os = mbd_dtype_size(a->out_dtype);
  size_t ybytes = (size_t)a->m * (size_t)a->n * os;
  if (overlaps(a->y, ybytes, a->x, (size_t)a->m * a->k * es) ||
      overlaps(a->y, ybytes, a->w, (size_t)a->n * a->k * es) ||
      overlaps(a->y, ybytes, a->bias, (size_t)a->n * es))
    return mbd_error_set(err, MBD_E_INVALID, "GEMM: output y overlaps an input");
  return MBD_OK;
}

/* pdl: launch with programmatic stream serialization (the kernel waits with
 * griddepcontrol.wait before touching x or y; only the wgmma kernels do).
 * cluster > 1: thread-block clusters of that many blocks along x. */
static int launch(mbd_gpu_ctx *ctx, int slot, dim3 grid, dim3 block, size_t smem, void **args,
                  bool pdl, mbd_error *err, unsigned cluster = 1) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[2];
  unsigned n = 0;
  if (pdl) {
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  if (cluster > 1) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = cluster;
    at[n].val.clusterDim.y = 1;
    at[n].val.clusterDim.z = 1;
    n++;
  }
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx->stream;
  cfg.attrs = at;
  cfg.numAttrs = n;
  MBD_GPU_CHECK(cudaLaunchKernelExC(&cfg, (const void *)ctx->k[slot], args), err);
  MBD_GPU_CHECK(cudaGetLastError(), err);
  return MBD_OK;
}

/* The ragged form of the M <= 16 kernel (mbd_mkrgemm): block b of grid =
 * min(SMs, groups) owns q + (b < r) contiguous groups of 8 columns, W by
 * boxes of all its rows. Taken at M = 1 (measured on the H200 at N = 8512:
 * 5% faster at M = 1, 3% and 9% slower at M = 8 and 16, where its partials
 * leave room for fewer ring slots) when its busiest block has fewer columns
 * than the strided plan's busiest SM (strips x width), or as many in a
 * larger box (cols, box_rows: that plan's), and its box fits 128 rows; the environment
 * variable MBD_GEMM_RAGGED=0 keeps the strided kernel (same bits: the bench
 * and the bitwise test compare both). Shared memory = mbarriers + X + the
 * partials (chunks x M x BR f32) + the bias (BR f32) + 1024 + stages x BR x
 * 512. Returns 1 when it does not apply. */
static int gemm_mkr(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, const mbd_gemm_params &p,
                    int64_t chunks, int64_t xbytes, int64_t cols, int64_t box_rows,
                    const char **kname, mbd_error *err) {
  const char *env = getenv("MBD_GEMM_RAGGED");
  if ((env && env[0] == '0') || a->m != 1) return 1;
  const int64_t groups = cdiv(a->n, 8);
  const int64_t grid = groups < ctx->sm_count ? groups : ctx->sm_count;
  const int64_t q = groups / grid, r = groups % grid;
  const int64_t br = 8 * (q + (r > 0));
  if (br > 128 || br > cols || (br == cols && br <= box_rows)) return 1;
  const int64_t fixed = MK_BAR_BYTES + xbytes + chunks * a->m * br * 4 + br * 4 + 1024;
  int64_t stages = ((int64_t)ctx->smem_optin - fixed) / (br * 512);
  if (stages > MK_MAX_STAGES) stages = MK_MAX_STAGES;
  if (stages < 2) return 1;
  mbd_mkr_params P;
  memset(&P, 0, sizeof P);
  if (!encode_map(&P.tw, a->dtype, a->w, a->n, a->k, (int)(8 * q)) ||
      (r > 0 && !encode_map(&P.tw_big, a->dtype, a->w, a->n, a->k, (int)br)))
    return 1;
  P.p = p;
  P.chunks = (int)chunks;
  P.q = (int)q;
  P.r = (int)r;
  P.stages = (int)stages;
  const int slot = MBD_K_MKRGEMM_BF16 + (a->dtype == MBD_DTYPE_BF16 ? 0 : 1);
  *kname = mbd_k_kernel_names[slot];
  void *args[] = {&P};
  return launch(ctx, slot, dim3((unsigned)grid), dim3(MK_WARPS * 32 + 32),
                (size_t)(fixed + stages * br * 512), args, a->w_static != 0, err);
}

/* M <= 16 with K % 8 == 0 and 16-byte aligned x, w: the streaming mma.sync
 * chunk-chain kernel (mk_body). Scheduling only: for each form (SW: 16
 * columns per warp, M <= 8 only; else 8) and strip width BN (grid =
 * min(strips, SMs), one block per SM) the estimated time is the larger of
 * the busiest SM's weight bytes at ~25 GB/s and its slots at ~0.5 us of
 * consumer time each (one chain); near-ties go to the larger TMA box (W rows
 * x 128 bytes), then fewer slots, then the deeper ring. Shared memory =
 * mbarriers + X (M rows of 2K + 16 bytes) + for CPS > 1 two partial buffers
 * (chunks x M x BN f32 each) + 1024 (the ring's swizzle alignment) + stages x
 * BN x CPS x 512. Returns 1 when it does not apply (the caller runs the tile
 * kernels: same bits). */
static int gemm_mk(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, const mbd_gemm_params &p,
                   const char **kname, mbd_error *err) {
  if (a->m > 16 || a->k % 8 != 0 || ((uintptr_t)a->x & 15) || ((uintptr_t)a->w & 15)) return 1;
  if (a->k > (1 << 20) || encoder() == NULL) return 1; /* X would not fit shared memory */
  const int64_t chunks = cdiv(a->k, MBD_WG_KCH);
  const int64_t xbytes = a->m * (2 * a->k + 16);
  int best_sw = -1, best_lg = -1;
  int64_t best_box = 0, best_stages = 0, best_strips = 0, best_slots = 0, best_cols = 0;
  double best_t = 0;
  for (int sw = a->m <= 8; sw >= 0; sw--)
    for (int lg = 3; lg >= 0; lg--) {
      const int64_t bn = (int64_t)(sw ? 16 : 8) << lg, cps = 8 >> lg;
      const int64_t strips = cdiv(a->n, bn);
      const int64_t grid = strips < ctx->sm_count ? strips : ctx->sm_count;
      const int64_t rounds = cdiv(strips, grid); /* strips on the busiest SM */
      const int64_t slots = rounds * cdiv(chunks, cps);
      const double t_bytes = (double)(rounds * bn) * (double)a->k * 2 / 25e9;
      const double t_slots = (double)slots * 0.5e-6;
      const double t = t_bytes > t_slots ? t_bytes : t_slots;
      const int64_t box = bn * 128;
      const int64_t slot = box * 4 * cps;
      const int64_t pbytes = lg == 3 ? 0 : 2 * chunks * a->m * bn * 4;
      const int64_t avail = (int64_t)ctx->smem_optin - MK_BAR_BYTES - xbytes - pbytes - 1024;
      int64_t stages = avail > 0 ? avail / slot : 0;
      if (stages > MK_MAX_STAGES) stages = MK_MAX_STAGES;
      if (stages < 1) continue;
      const bool near = best_lg >= 0 && t <= best_t * 1.02 && t >= best_t * 0.98;
      const bool better_tie =
          box > best_box || (box == best_box && (slots < best_slots ||
                                                 (slots == best_slots && stages > best_stages)));
      if (best_lg < 0 || (!near && t < best_t) || (near && better_tie)) {
        best_sw = sw;
        best_lg = lg;
        best_t = t;
        best_box = box;
        best_slots = slots;
        best_stages = stages;
        best_strips = strips;
        best_cols = rounds * bn;
      }
    }
  if (best_lg < 0) return 1;
  {
    const int rc = gemm_mkr(ctx, a, p, chunks, xbytes, best_cols, best_box / 128, kname, err);
    if (rc != 1) return rc; /* 1: the strided kernel runs */
  }
  mbd_mk_params P;
  memset(&P, 0, sizeof P);
  const int bn = (best_sw ? 16 : 8) << best_lg;
  if (!encode_map(&P.tw, a->dtype, a->w, a->n, a->k, bn)) return 1;
  const int64_t pbytes = best_lg == 3 ? 0 : 2 * chunks * a->m * bn * 4;
  const size_t smem = (size_t)(MK_BAR_BYTES + xbytes + pbytes + 1024 +
                               best_stages * (int64_t)bn * 512 * (8 >> best_lg));
  P.p = p;
  P.chunks = (int)chunks;
  P.lg = best_lg;
  P.strips = (int)best_strips;
  P.stages = (int)best_stages;
  int slot = (a->dtype == MBD_DTYPE_BF16 ? MBD_K_MKGEMM_BF16 : MBD_K_MKGEMM_F16) + !best_sw;
  *kname = mbd_k_kernel_names[slot];
  void *args[] = {&P};
  const int64_t grid = best_strips < ctx->sm_count ? best_strips : ctx->sm_count;
  return launch(ctx, slot, dim3((unsigned)grid), dim3(MK_WARPS * 32 + 32), smem, args,
                a->w_static != 0, err);
}

/* MBD_GEMM_MCAST (read per call): 0 = the tile kernels alone (no cluster
 * kernel of either kind); 2 = 2 x 1 clusters; 4 = 2 x 2 clusters where the
 * tile allows; unset or other = -1, automatic (pick_wcltile): 2 x 1 only
 * where it measured faster. MBD_GEMM_PERSIST=1: the 128 x 128 and
 * 128 x 256 tiles (clustered or not) run persistent. Same bits in every
 * setting (the bench and the bitwise test compare them). */
static int mcast_mode(void) {
  const char *env = getenv("MBD_GEMM_MCAST");
  if (env && (env[0] == '0' || env[0] == '2' || env[0] == '4') && env[1] == 0)
    return env[0] - '0';
  return -1;
}

/* The cluster form of tile configuration ti for an M x N problem, or -1: the
 * 128-row TMA tiles, when the M tiles pair up (an even count, or enough that
 * the idle half of the last cluster costs little); 2 x 2 (X shared too) for
 * 128 x 128 under MBD_GEMM_MCAST=4 when there are two N tiles or more. */
static int pick_wcltile(int ti, int64_t m, int64_t n) {
  int mode = mcast_mode();
  const char *ps_env = getenv("MBD_GEMM_PERSIST");
  const bool ps = ps_env && ps_env[0] == '1';
  const int64_t tiles_m = cdiv(m, 128);
  /* Automatic: 2 x 1 for the 128 x 128 tiles of a narrow N (one or two N
   * tiles) over many M tiles, where it measured 14-21% faster than the
   * plain tiles (H200, x_proj N = 160 / 192, K = 4096 / 5120, M = 8192);
   * everywhere else the plain tiles measured faster. */
  if (mode < 0)
    mode = !ps && ti == WTILE_NOFOLD - 1 && cdiv(n, k_wtiles[ti].bn) <= 2 && tiles_m >= 32 ? 2 : 0;
  if ((mode == 0 && !ps) || !k_wtiles[ti].tma || k_wtiles[ti].bm != 128) return -1;
  const bool pairs = tiles_m >= 2 && !(tiles_m < 5 && tiles_m % 2);
  const int bn = k_wtiles[ti].bn;
  int cm = 1, cn = 1;
  if (mode != 0 && pairs) {
    cm = 2;
    cn = mode == 4 && bn == 128 && cdiv(n, bn) >= 2 ? 2 : 1;
  }
  if (cm * cn == 1 && !ps) return -1;
  for (int i = 0; i < (int)(sizeof k_wcltiles / sizeof k_wcltiles[0]); i++) {
    const wcltile_cfg &c = k_wcltiles[i];
    if (c.bn == bn && c.cm == cm && c.cn == cn && c.ps == ps) return i;
  }
  return -1;
}

/* The device's count of co-resident clusters of cs blocks for this launch
 * of the kernel in slot, or -1 when it gives no answer. */
static int cl_fit(mbd_gpu_ctx *ctx, int slot, unsigned grid, unsigned threads, size_t smem,
                  unsigned cs) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = cs;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  int fit = -1;
  if (!mbd_gpu_status_ok(cudaOccupancyMaxActiveClusters(&fit, (const void *)ctx->k[slot], &cfg))) {
    (void)cudaGetLastError();
    fit = -1;
  }
  return fit;
}

/* MBD_GEMM_CLDEBUG=1: each cluster launch prints its kernel, grid, cluster
 * size, shared memory and the device's count of co-resident clusters of that
 * launch to stderr (a diagnostic for the bench). */
static void cl_debug(mbd_gpu_ctx *ctx, int slot, unsigned grid, unsigned threads, size_t smem,
                     unsigned cs) {
  const char *env = getenv("MBD_GEMM_CLDEBUG");
  if (!(env && env[0] == '1')) return;
  const int fit = cl_fit(ctx, slot, grid, threads, smem, cs);
  fprintf(stderr, "cluster launch: %s grid %u x %u threads, cluster %u, smem %zu, "
          "co-resident clusters %d (%d blocks; %d SMs)\n", mbd_k_kernel_names[slot], grid,
          threads, cs, smem, fit, fit * (int)cs, ctx->sm_count);
}

/* The parameters of a wgmma launch over bm x bn tiles: the problem, X boxes of
 * x_box rows and W boxes of w_box rows (64 k each), a_rows the X rows a stage
 * brings. False when the encoder refuses (the caller runs the tile kernels:
 * same bits). */
static bool wg_params_init(mbd_wg_params *P, const mbd_gpu_gemm_args *a,
                           const mbd_gemm_params &p, int a_rows, int x_box, int w_box, int bm,
                           int bn) {
  memset(P, 0, sizeof *P);
  P->p = p;
  P->a_rows = a_rows;
  if (!encode_map(&P->tx, a->dtype, a->x, a->m, a->k, x_box) ||
      !encode_map(&P->tw, a->dtype, a->w, a->n, a->k, w_box))
    return false;
  P->tiles_m = (int)cdiv(a->m, bm);
  P->tiles_n = (int)cdiv(a->n, bn);
  return true;
}

/* The cluster tile kernels (wg_body with CM x CN > 1): tensor-map boxes of
 * the pieces each block loads (BM / CN rows of X, BN / CM rows of W), a grid
 * of whole clusters. Returns 1 when the encoder refuses (the caller runs the
 * tile kernels: same bits). */
static int gemm_wgcl(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, const mbd_gemm_params &p,
                     int ci, const char **kname, mbd_error *err) {
  const wcltile_cfg &c = k_wcltiles[ci];
  mbd_wg_params P;
  if (!wg_params_init(&P, a, p, c.bm, c.bm / c.cn, c.bn / c.cm, c.bm, c.bn)) return 1;
  int64_t clusters = cdiv(P.tiles_m, c.cm) * cdiv(P.tiles_n, c.cn);
  const size_t smem = (size_t)c.stages * (c.bm + c.bn) * 128 + 1024 + 16 * (size_t)c.stages;
  const int slot = (a->dtype == MBD_DTYPE_BF16 ? MBD_K_WGCL_BF16 : MBD_K_WGCL_F16) + ci;
  *kname = mbd_k_kernel_names[slot];
  void *args[] = {&P};
  const unsigned cs = (unsigned)(c.cm * c.cn), threads = (unsigned)MBD_WG_THREADS(c.bm / 64, 0);
  if (c.ps) { /* persistent: at most the clusters (blocks) that fit at once */
    int fit = 0;
    if (cs > 1) {
      fit = cl_fit(ctx, slot, (unsigned)(clusters * cs), threads, smem, cs);
    } else {
      int per_sm = 0;
      if (!mbd_gpu_status_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &per_sm, (const void *)ctx->k[slot], (int)threads, smem))) {
        (void)cudaGetLastError();
        per_sm = 0;
      }
      fit = per_sm * ctx->sm_count;
    }
    if (fit <= 0) fit = ctx->sm_count * c.occ / (int)cs; /* no answer: the table's occupancy */
    if (clusters > fit) clusters = fit;
  }
  cl_debug(ctx, slot, (unsigned)(clusters * cs), threads, smem, cs);
  return launch(ctx, slot, dim3((unsigned)(clusters * cs)), dim3(threads), smem, args,
                a->w_static != 0, err, cs);
}

/* Shared memory of K split tile i: the ring, its barriers, the partials. */
static size_t wks_smem(int i) {
  const wkstile_cfg &c = k_wkstiles[i];
  return (size_t)c.stages * (c.bm + c.bn) * 128 + 1024 + 16 * (size_t)c.stages +
         (size_t)MBD_WG_KS_PBUF(c.bm) * c.bm * c.bn * 4;
}

/* The blocks of K split tile i that run at once (whole clusters), asked of
 * the device once per context. */
static int64_t wks_fit(mbd_gpu_ctx *ctx, int dtype_slot0, int i) {
  int &fit = ctx->ks_fit[i];
  if (fit == 0) {
    const wkstile_cfg &c = k_wkstiles[i];
    const int cl = cl_fit(ctx, dtype_slot0 + i, (unsigned)(ctx->sm_count / c.ck * c.ck),
                          (unsigned)MBD_WG_THREADS(c.bm / 64, 0), wks_smem(i), (unsigned)c.ck);
    fit = cl > 0 ? cl * c.ck : -1;
  }
  return fit > 0 ? fit : ctx->sm_count / k_wkstiles[i].ck * k_wkstiles[i].ck;
}

/* The K split form of an M x N x K problem, or -1. MBD_GEMM_KSPLIT (read per
 * call): 1..4 = K split tile 0..3 wherever K exceeds one chunk; 0 = never;
 * unset or other: tile 1 (64 x 128 by 8) where K has at least KS_MIN_CHUNKS
 * chunks and its clusters all run at once, i.e. narrow N (x_proj's 160 or
 * 192 columns at M = 64..256, 768 at M = 64), the one class where it beat
 * the tile kernels; wherever its blocks took a second wave or K was short,
 * and with every other K split tile, it lost (docs/benchmarks.md, "Figures
 * behind design choices"). Same bits in every setting (the bitwise test
 * compares them). */
#define KS_AUTO_TILE 1
#define KS_MIN_CHUNKS 6
static int pick_wkstile(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, int ti, bool tma) {
  const int64_t chunks = cdiv(a->k, MBD_WG_KCH);
  if (chunks < 2 || !tma || !k_wtiles[ti].tma) return -1;
  const char *env = getenv("MBD_GEMM_KSPLIT");
  const int nks = (int)(sizeof k_wkstiles / sizeof k_wkstiles[0]);
  if (env && env[0] >= '1' && env[0] < '1' + nks && env[1] == 0) return env[0] - '1';
  if (env && env[0] == '0' && env[1] == 0) return -1;
  const wkstile_cfg &c = k_wkstiles[KS_AUTO_TILE];
  const int slot0 = a->dtype == MBD_DTYPE_BF16 ? MBD_K_WGKS_BF16 : MBD_K_WGKS_F16;
  const int64_t blocks = cdiv(a->m, c.bm) * cdiv(a->n, c.bn) * c.ck;
  if (chunks < KS_MIN_CHUNKS || blocks > wks_fit(ctx, slot0, KS_AUTO_TILE)) return -1;
  return KS_AUTO_TILE;
}

/* K split tile i (wg_body with CK > 1): the tile kernels' tensor maps, a
 * grid of CK blocks per tile, clusters of CK. Returns 1 when the encoder
 * refuses (the caller runs the tile kernels: same bits). */
static int gemm_wgks(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, const mbd_gemm_params &p,
                     int i, const char **kname, mbd_error *err) {
  const wkstile_cfg &c = k_wkstiles[i];
  const int a_rows = a->m < c.bm ? (int)a->m : c.bm;
  mbd_wg_params P;
  if (!wg_params_init(&P, a, p, a_rows, a_rows, c.bn, c.bm, c.bn)) return 1;
  const int slot = (a->dtype == MBD_DTYPE_BF16 ? MBD_K_WGKS_BF16 : MBD_K_WGKS_F16) + i;
  *kname = mbd_k_kernel_names[slot];
  void *args[] = {&P};
  const unsigned threads = (unsigned)MBD_WG_THREADS(c.bm / 64, 0);
  const unsigned grid = (unsigned)((int64_t)P.tiles_m * P.tiles_n * c.ck);
  const size_t smem = wks_smem(i);
  cl_debug(ctx, slot, grid, threads, smem, (unsigned)c.ck);
  return launch(ctx, slot, dim3(grid), dim3(threads), smem, args, a->w_static != 0, err,
                (unsigned)c.ck);
}

/* MBD_GEMM_WTILE=<i> (read per call; for benchmarks): tile configuration i
 * alone wherever it can run (the TMA tiles need the TMA path, 6 needs K <= one
 * chunk), no cluster or K split form; unset or unusable: the dispatch above.
 * Same bits in every setting (scheduling only). */
static int forced_wtile(int64_t k, bool tma) {
  const char *env = getenv("MBD_GEMM_WTILE");
  if (!env || !*env) return -1;
  char *end;
  const long i = strtol(env, &end, 10);
  const long n = (long)(sizeof k_wtiles / sizeof k_wtiles[0]);
  if (*end || i < 0 || i >= n) return -1;
  if ((k_wtiles[i].tma && !tma) || (!k_wtiles[i].fold && k > MBD_WG_KCH)) return -1;
  return (int)i;
}

static int gemm_wg(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, const mbd_gemm_params &p,
                   const char **kname, mbd_error *err) {
  mbd_wg_params P;
  memset(&P, 0, sizeof P);
  P.p = p;
  bool tma = a->k % 8 == 0 && ((uintptr_t)a->x % 16) == 0 && ((uintptr_t)a->w % 16) == 0 &&
             encoder() != NULL;
  if (a->m <= 16) {
    int rc = gemm_mk(ctx, a, p, kname, err);
    if (rc != 1) return rc; /* 1: not applicable, the tile kernels run */
  }
  int ti = forced_wtile(a->k, tma);
  if (ti < 0) {
    ti = pick_wtile(ctx, a->m, a->n, a->k, tma);
    ti = sched_tile(ti);
    const int ki = pick_wkstile(ctx, a, ti, tma);
    if (ki >= 0) {
      const int rc = gemm_wgks(ctx, a, p, ki, kname, err);
      if (rc != 1) return rc; /* 1: the encoder refused, the tile kernels run */
    }
    const int ci = pick_wcltile(ti, a->m, a->n);
    if (ci >= 0) {
      const int rc = gemm_wgcl(ctx, a, p, ci, kname, err);
      if (rc != 1) return rc; /* 1: the encoder refused, the tile kernels run */
    }
  }
  const wtile_cfg &t = k_wtiles[ti];
  /* M < BM: the X box brings exactly the rows that exist (a box past the
   * tensor's last row makes the copy engine zero-fill, which is slow) */
  P.a_rows = a->m < t.bm ? (int)a->m : t.bm;
  if (tma && !(encode_map(&P.tx, a->dtype, a->x, a->m, a->k, P.a_rows) &&
               encode_map(&P.tw, a->dtype, a->w, a->n, a->k, t.bn))) {
    /* the encoder refused (limits we did not foresee): same bits on plain loads */
    memset(&P, 0, sizeof P);
    P.p = p;
    ti = pick_wtile(ctx, a->m, a->n, a->k, false);
  }
  const wtile_cfg &u = k_wtiles[ti];
  if (!u.tma) P.a_rows = u.bm;
  P.tiles_m = (int)cdiv(a->m, u.bm);
  P.tiles_n = (int)cdiv(a->n, u.bn);
  size_t smem = (size_t)u.stages * (u.bm + u.bn) * 128 + 1024 + 16 * (size_t)u.stages;
  int slot = (a->dtype == MBD_DTYPE_BF16 ? MBD_K_WGEMM_BF16 : MBD_K_WGEMM_F16) + ti;
  *kname = mbd_k_kernel_names[slot];
  void *args[] = {&P};
  dim3 grid((unsigned)((int64_t)P.tiles_m * P.tiles_n));
  return launch(ctx, slot, grid, dim3((unsigned)u.threads), smem, args, a->w_static != 0, err);
}

static int gemm_det(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, const char **kname,
                    mbd_error *err) {
  mbd_gemm_params p = {a->x, a->w, a->bias, a->y, (int)a->m, (int)a->n, (int)a->k,
                       a->out_dtype == MBD_DTYPE_F32};
  if (a->dtype != MBD_DTYPE_F32 && use_wgmma(ctx)) return gemm_wg(ctx, a, p, kname, err);
  void *args[] = {&p};
  int slot;
  tile_cfg t;
  size_t smem = 0;
  if (a->dtype == MBD_DTYPE_F32) {
    int ti = pick_stile(ctx, a->m, a->n);
    t = k_stiles[ti];
    slot = (ctx->policy == MBD_POLICY_TF32 ? MBD_K_SGEMM_TF32 : MBD_K_SGEMM_F32) + ti;
  } else {
    int ti = pick_htile(ctx, a->m, a->n);
    t = k_htiles[ti];
    bool vec = a->k % 8 == 0 && ((uintptr_t)a->x % 16) == 0 && ((uintptr_t)a->w % 16) == 0;
    int stages = vec ? t.stages_vec : t.stages_elem;
    smem = (size_t)stages * (t.bm + t.bn) * (t.bk + 8) * 2;
    slot = (a->dtype == MBD_DTYPE_BF16 ? MBD_K_HGEMM_BF16 : MBD_K_HGEMM_F16) + ti + (vec ? 0 : 4);
  }
  *kname = mbd_k_kernel_names[slot];
  dim3 grid((unsigned)cdiv(a->m, t.bm), (unsigned)cdiv(a->n, t.bn));
  return launch(ctx, slot, grid, dim3(t.threads), smem, args, false, err);
}

static cudaDataType_t cuda_type(mbd_dtype d) {
  return d == MBD_DTYPE_BF16 ? CUDA_R_16BF : d == MBD_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static int gemm_blas(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, mbd_error *err) {
  if (!ctx->blas)
    return mbd_error_set(err, MBD_E_INTERNAL, "cuBLAS mode without a cuBLAS handle");
  float alpha = 1.0f, beta = 0.0f;
  if (a->bias) {
    int slot = a->out_dtype == MBD_DTYPE_F32 && a->dtype != MBD_DTYPE_F32
                   ? (a->dtype == MBD_DTYPE_BF16 ? MBD_K_BCAST_BF16_F32 : MBD_K_BCAST_F16_F32)
                   : (a->out_dtype == MBD_DTYPE_F32 ? MBD_K_BCAST_U32 : MBD_K_BCAST_U16);
    void *y = a->y;
    const void *b = a->bias;
    int m = (int)a->m, n = (int)a->n;
    void *args[] = {&y, &b, &m, &n};
    int64_t total = a->m * a->n;
    int rc = launch(ctx, slot, dim3((unsigned)cdiv(total, 256)), dim3(256), 0, args, false, err);
    if (rc < 0) return rc;
    beta = 1.0f;
  }
  cublasComputeType_t ct =
      ctx->mode == MBD_GEMM_CUBLAS_PEDANTIC ? CUBLAS_COMPUTE_32F_PEDANTIC
      : (a->dtype == MBD_DTYPE_F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  /* Row-major Y[M,N] = X W^T is column-major Y^T[N,M] = W^T(op T on [K,N]) * X^T. */
  MBD_GPU_CHECK(cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->n, (int)a->m,
                             (int)a->k, &alpha, a->w, cuda_type(a->dtype), (int)a->k, a->x,
                             cuda_type(a->dtype), (int)a->k, &beta, a->y,
                             cuda_type(a->out_dtype), (int)a->n, ct, CUBLAS_GEMM_DEFAULT),
                err);
  return MBD_OK;
}

extern "C" int mbd_gpu_gemm(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  rc = check_args(ctx, a, err);
  if (rc < 0) return rc;
  const char *kname = "cublasGemmEx";
  if (ctx->mode == MBD_GEMM_DETERMINISTIC)
    rc = gemm_det(ctx, a, &kname, err);
  else
    rc = gemm_blas(ctx, a, err);
  if (rc < 0) return rc;
  mbd_gpu_launch_rec r;
  memset(&r, 0, sizeof r);
  snprintf(r.kernel, sizeof r.kernel, "%s", kname);
  r.m = a->m;
  r.n = a->n;
  r.k = a->k;
  r.dtype = a->dtype;
  r.out_dtype = a->out_dtype;
  r.has_bias = a->bias != NULL;
  r.mode = ctx->mode;
  return mbd_gpu_ctx_note_launch(ctx, &r, err);
}
