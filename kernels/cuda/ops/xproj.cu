/* x_proj (see xproj.h): tensor-core group partials folded by the class tree
 * on the 16-bit routes, a thread per output (the f32 GEMM chain) on f32
 * routes. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/xproj.h"

#include <cooperative_groups.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

/* 16-bit routes, few rows: block (bx, by) owns outputs 16 bx .. 16 bx + 15
 * (the A operand's rows: w) of rows 8 by .. 8 by + 7 (the B operand's
 * columns: x; rows past M are zeros, not stored), one 16 x 8 result
 * fragment. Its XP_WARPS warps split the class tree: warp q runs the leaves
 * q * XP_LPW .. (q + 1) * XP_LPW - 1 (xp_warp_leaves: each class's groups in
 * order, one k16 step each, the classes folded by the binary counter), and
 * the warps' subtree sums are folded in warp order (xp_block_fold): the
 * contract's operations for every output, whatever M. Fragments come
 * straight from global memory (32-byte pieces of rows, eight groups ahead:
 * a class of K = 4096 in one round of loads). */
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
  xp_warp_leaves<T, XP_LPW, 8>(warp * XP_LPW, K, xp_rows_frag<VEC, T>{w0, w1, xr, K, t}, v);
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

/* The same contract for many rows (M >= XT_MIN_M, K a multiple of 512,
 * 16-byte aligned rows, sm_90: thread-block clusters). k_xproj reads every
 * weight row once per 8 rows; here a cluster of XT_SPLIT blocks owns a tile
 * of RT = 8 NF rows x OT = 16 nw outputs (nw warps a block, warp m the
 * outputs 16 m.. in the A operand, the rows in NF B-column fragments), and
 * cluster block q runs the leaves 8 q .. 8 q + 7 of the class tree for the
 * whole tile: leaf by leaf (xp_warp_leaves' order), each class's groups
 * g = c + 32 j ascending, one k16 step each, the class sums folded by the
 * binary counter (xp_tree_push, three levels). The four subtree sums of an
 * output meet through distributed shared memory and are folded in leaf
 * order (xp_tree_fold). Every output gets the contract's operations
 * whatever the tile.
 *
 * A leaf's operands (the tile's x and w rows at its class's J = K / 512
 * groups, 32 bytes each) travel by cp.async into shared memory, one leaf
 * ahead: [tile row][j][16], rows padded by 16 bytes so that the ldmatrix
 * rows of a fragment fall in distinct banks. The weights of the first leaf
 * are copied before the dependency wait. */
#define XT_SPLIT 4                         /* blocks a cluster */
#define XT_LEAVES (XP_CLASSES / XT_SPLIT)  /* leaves a block */
#define XT_MAXW 12                         /* warps a block (outputs a tile / 16) */
#define XT_MIN_M 32                        /* fewer rows: k_xproj */
#define XT_SMEM (227 * 1024)

__device__ __forceinline__ void xt_ldm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Shared bytes of one leaf's operands, and of the launch (two stages, or
 * the tile's subtree sums). */
static inline __host__ __device__ int xt_stage(int rt, int ot, int K) {
  return (rt + ot) * ((K / 512) * 32 + 16);
}
static inline size_t xt_smem(int rt, int ot, int K) {
  const size_t a = 2 * (size_t)xt_stage(rt, ot, K), b = (size_t)rt * (size_t)ot * 4;
  return a > b ? a : b;
}

template <typename T, int NF>
__global__ void __launch_bounds__(32 * XT_MAXW, 1)
    k_xproj_tile(int M, int K, int NO, const T *__restrict__ x, const T *__restrict__ w,
                 float *__restrict__ out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(NF % 2 == 0 && (8 * NF) % XT_SPLIT == 0, "row fragments in pairs");
  constexpr int RT = 8 * NF;
  extern __shared__ float4 xt_sm4[];
  unsigned char *sm = (unsigned char *)xt_sm4;
  cg::cluster_group cl = cg::this_cluster();
  const int q = (int)cl.block_rank();
  const int nt = (int)blockDim.x, OT = 16 * (nt >> 5);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t r0 = (int64_t)(blockIdx.x / XT_SPLIT) * RT;
  const int o0 = (int)blockIdx.y * OT;
  const int J = K / 512, rs = J * 32 + 16, stage = (RT + OT) * rs;
  /* the copies of leaf i: pieces (tile row, j, half) of 16 bytes */
  auto fetch = [&](int i, bool xs, bool ws) {
    const int c = xp_leaf_class(q * XT_LEAVES + i);
    unsigned char *buf = sm + (i & 1) * stage;
    const int r_lo = xs ? 0 : RT, r_hi = ws ? RT + OT : RT;
    for (int e = r_lo * J * 2 + tid; e < r_hi * J * 2; e += nt) {
      const int h = e & 1, rj = e >> 1, row = rj / J, j = rj - row * J;
      const bool isx = row < RT;
      const int64_t gr = isx ? r0 + row : (int64_t)o0 + (row - RT);
      unsigned char *dst = buf + row * rs + j * 32 + h * 16;
      if (gr < (isx ? (int64_t)M : (int64_t)NO))
        cp_async16(dst, (isx ? x : w) + gr * K + XP_GW * (c + XP_CLASSES * j) + 8 * h);
      else
        *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u);
    }
  };
  fetch(0, false, true);
  pdl_wait();
  pdl_trigger();
  fetch(0, true, false);
  cp_async_commit();
  /* ldmatrix rows: A (w rows 16 warp.., matrices rows 0-7 / 8-15 x k 0-7 /
   * 8-15 = a[0..3]); B pairs of row fragments (rows 0-7 k 0-7, k 8-15, rows
   * 8-15 k 0-7, k 8-15 = b[2p][0], b[2p][1], b[2p + 1][0], b[2p + 1][1]) */
  const uint32_t smb = (uint32_t)__cvta_generic_to_shared(sm);
  const uint32_t aoff = (uint32_t)((RT + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * rs +
                                   (lane >> 4) * 16);
  const uint32_t boff = (uint32_t)((((lane >> 4) & 1) * 8 + (lane & 7)) * rs + ((lane >> 3) & 1) * 16);
  float st[3][4 * NF], v[4 * NF];
#pragma unroll
  for (int i = 0; i < XT_LEAVES; i++) {
    cp_async_wait_group<0>();
    __syncthreads(); /* leaf i has landed; leaf i - 1's buffer is read */
    if (i + 1 < XT_LEAVES) {
      fetch(i + 1, true, true);
      cp_async_commit();
    }
    const uint32_t base = smb + (uint32_t)((i & 1) * stage);
    float S[4 * NF];
#pragma unroll
    for (int n = 0; n < 4 * NF; n++) S[n] = 0.0f;
#pragma unroll 2
    for (int j = 0; j < J; j++) {
      uint32_t a[4], b[NF][2];
      xt_ldm4(a, base + aoff + j * 32);
#pragma unroll
      for (int pr = 0; pr < NF / 2; pr++) {
        uint32_t r4[4];
        xt_ldm4(r4, base + boff + (uint32_t)(pr * 16 * rs) + j * 32);
        b[2 * pr][0] = r4[0], b[2 * pr][1] = r4[1];
        b[2 * pr + 1][0] = r4[2], b[2 * pr + 1][1] = r4[3];
      }
#pragma unroll
      for (int f = 0; f < NF; f++) {
        float p[4];
        xp_group_partial<T>(a, b[f], p);
#pragma unroll
        for (int n = 0; n < 4; n++) S[4 * f + n] = __fadd_rn(S[4 * f + n], p[n]);
      }
    }
    xp_tree_push<3, 4 * NF>(st, i, S);
    if (i == XT_LEAVES - 1)
#pragma unroll
      for (int n = 0; n < 4 * NF; n++) v[n] = S[n];
  }
  __syncthreads(); /* every warp is done with the buffers */
  float *sub = (float *)sm; /* [RT][OT]: this block's subtree sums */
  const int gq = lane >> 2, t = lane & 3;
#pragma unroll
  for (int f = 0; f < NF; f++)
#pragma unroll
    for (int n = 0; n < 4; n++)
      sub[(8 * f + 2 * t + (n & 1)) * OT + warp * 16 + gq + 8 * (n >> 1)] = v[4 * f + n];
  cl.sync();
  /* block q folds rows q RT / 4 .. of the tile from the four blocks' sums */
  const int rq = RT / XT_SPLIT;
  const float *subs[XT_SPLIT];
#pragma unroll
  for (int p = 0; p < XT_SPLIT; p++) subs[p] = cl.map_shared_rank(sub, p);
  for (int e = tid; e < rq * OT; e += nt) {
    const int r = q * rq + e / OT, o = e % OT;
    float s4[XT_SPLIT];
#pragma unroll
    for (int p = 0; p < XT_SPLIT; p++) s4[p] = subs[p][r * OT + o];
    const float val = xp_tree_fold<XT_SPLIT>(s4);
    if (r0 + r < M && o0 + o < NO) out[(r0 + r) * NO + o0 + o] = val;
  }
  cl.sync(); /* the other blocks' reads of this block's sums are done */
#endif
}

template <typename T, int NF>
static int xt_launch(cudaStream_t s, int M, int K, int NO, int nw, const T *x, const T *w,
                     float *out, mbd_error *err) {
  int rc = 0;
  const size_t sh = xt_smem(8 * NF, 16 * nw, K);
  if ((rc = allow_smem(k_xproj_tile<T, NF>, sh, err)) < 0) return rc;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  at[1].id = cudaLaunchAttributeClusterDimension;
  at[1].val.clusterDim.x = XT_SPLIT;
  at[1].val.clusterDim.y = 1;
  at[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(XT_SPLIT * ((M + 8 * NF - 1) / (8 * NF))),
                     (unsigned)((NO + 16 * nw - 1) / (16 * nw)));
  cfg.blockDim = dim3((unsigned)(32 * nw));
  cfg.dynamicSmemBytes = sh;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = 2;
  MBD_GPU_TRY(cudaLaunchKernelEx(&cfg, k_xproj_tile<T, NF>, M, K, NO, x, w, out), err);
  MBD_GPU_TRY(cudaGetLastError(), err);
  return 0;
fail:
  (void)cudaGetLastError();
  mbd_error_prefix(err, "launching x_proj (tiles)");
  return rc;
}

/* The tile for M rows: the most rows (NF) and outputs (nw) a block that
 * still give about a block per SM, within the shared memory; 1 if launched,
 * 0 if no tile fits (k_xproj then), < 0 on error. */
template <typename T>
static int xproj_tiles(cudaStream_t s, int M, int K, int NO, const T *x, const T *w, float *out,
                       mbd_error *err) {
  const int mf = (NO + 15) / 16;
  int nw = mf < XT_MAXW ? mf : XT_MAXW, NF = 8;
  auto blocks = [&](int nf, int n) {
    return (int64_t)XT_SPLIT * ((M + 8 * nf - 1) / (8 * nf)) * ((mf + n - 1) / n);
  };
  while (NF > 2 && blocks(NF, nw) < 128) NF /= 2;
  while (nw > 1 && blocks(NF, nw) < 128) nw = (nw + 1) / 2;
  while (xt_smem(8 * NF, 16 * nw, K) > XT_SMEM && (NF > 2 || nw > 1)) {
    if (NF > 2)
      NF /= 2;
    else
      nw = (nw + 1) / 2;
  }
  if (xt_smem(8 * NF, 16 * nw, K) > XT_SMEM || (NO + 16 * nw - 1) / (16 * nw) > 65535)
    return 0;
  const int rc = NF == 8   ? xt_launch<T, 8>(s, M, K, NO, nw, x, w, out, err)
                 : NF == 4 ? xt_launch<T, 4>(s, M, K, NO, nw, x, w, out, err)
                           : xt_launch<T, 2>(s, M, K, NO, nw, x, w, out, err);
  return rc < 0 ? rc : 1;
}

/* The same contract for many rows, any K (k_xproj_rows). k_xproj_tile's
 * blocks keep eight leaves' binary counter for 64 rows x 160 outputs in
 * registers and stage one leaf ahead; here a cluster of XR_SPLIT = 8 blocks
 * owns a tile of RT = 16 wm_n rows x OT = 16 FA wn_n outputs and block q runs
 * the four leaves 4 q .. 4 q + 3 (a subtree) for the whole tile: leaf by
 * leaf, each class's groups g = c + 32 j ascending, one k16 step each, the
 * four class sums folded by the binary counter (xp_tree_push, two levels).
 * The eight subtree sums of an output meet through distributed shared
 * memory and are folded in leaf order (xp_tree_fold). Warp (wm, wn) holds
 * the outputs 16 FA wn .. in FA A fragments (w rows) and the rows 16 wm ..
 * in two B fragments (x rows), so each fragment it loads feeds 2 or FA
 * steps. Every output gets the contract's operations whatever the tile.
 *
 * A leaf's operands (the tile's x and w rows at its class's groups, 32 bytes
 * a group) travel into one of ns stage buffers, ns - 1 leaves ahead, by
 * cp.async where K is a multiple of 8 and the rows 16-byte aligned (al),
 * else by element loads (zeros past K); rows [tile row][j][16], padded by
 * 16 bytes so that the eight rows of an ldmatrix fall in distinct banks
 * (the row stride over 16 bytes is odd). The weights of the first leaves
 * are copied before the dependency wait. */
#define XR_SPLIT 8                        /* blocks a cluster */
#define XR_LEAVES (XP_CLASSES / XR_SPLIT) /* leaves a block: a subtree */
#define XR_LV 2                           /* its levels */
#define XR_MIN_M 1024 /* the default from this many rows; below, the tiles are faster */
#define XR_SMEM (227 * 1024)

/* Bytes of one staged row (jm groups), and of the launch: ns stages, or
 * the tile's subtree sums [RT][OT + 4] (the padding spreads a fragment's
 * four rows over the banks). */
static inline __host__ __device__ int xr_rs(int jm) { return jm * 32 + 16; }
static inline size_t xr_smem(int rt, int ot, int jm, int ns) {
  const size_t st = (size_t)ns * (size_t)(rt + ot) * (size_t)xr_rs(jm);
  const size_t sub = (size_t)rt * (size_t)(ot + 4) * 4;
  return st > sub ? st : sub;
}

/* Elements k .. k + 7 of a 16-bit row, zeros past K. */
__device__ __forceinline__ uint4 xr_ld8(const void *row, int k, int K) {
  const unsigned short *p = (const unsigned short *)row;
  uint32_t v[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int e = k + 2 * i;
    const uint32_t lo = e < K ? p[e] : 0u, hi = e + 1 < K ? p[e + 1] : 0u;
    v[i] = hi << 16 | lo;
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}

template <typename T, int FA>
__global__ void __launch_bounds__(FA == 1 ? 384 : 256, 1)
    k_xproj_rows(int M, int K, int NO, const T *__restrict__ x, const T *__restrict__ w,
                 float *__restrict__ out, int wm_n, int ns, int al) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NV = 8 * FA; /* a thread's outputs: FA x 2 fragments x 4 */
  extern __shared__ float4 xr_sm4[];
  unsigned char *sm = (unsigned char *)xr_sm4;
  cg::cluster_group cl = cg::this_cluster();
  const int q = (int)cl.block_rank();
  const int nt = (int)blockDim.x, wn_n = (nt >> 5) / wm_n;
  const int RT = 16 * wm_n, OT = 16 * FA * wn_n;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % wm_n, wn = warp / wm_n;
  const int64_t r0 = (int64_t)(blockIdx.x / XR_SPLIT) * RT;
  const int o0 = (int)blockIdx.y * OT;
  const int ng = (K + XP_GW - 1) / XP_GW, jm = (ng + XP_CLASSES - 1) / XP_CLASSES;
  const int rs = xr_rs(jm), stage = (RT + OT) * rs;
  /* leaf i's class and its number of groups */
  auto leaf = [&](int i, int &c, int &jc) {
    c = xp_leaf_class(q * XR_LEAVES + i);
    jc = c < ng ? (ng - c + XP_CLASSES - 1) / XP_CLASSES : 0;
  };
  /* leaf i's copies into buffer i % ns: each (tile row, half) its class's
   * groups; xs, ws: the x rows, the w rows */
  auto fetch = [&](int i, bool xs, bool ws) {
    int c, jc;
    leaf(i, c, jc);
    unsigned char *buf = sm + (i % ns) * stage;
    const int lo = xs ? 0 : 2 * RT, hi = ws ? 2 * (RT + OT) : 2 * RT;
    for (int e = lo + tid; e < hi; e += nt) {
      const int row = e >> 1, h = e & 1;
      const bool isx = row < RT;
      const int64_t gr = isx ? r0 + row : (int64_t)o0 + (row - RT);
      const bool live = gr < (isx ? (int64_t)M : (int64_t)NO);
      const T *src = (isx ? x : w) + (live ? gr : 0) * (int64_t)K;
      unsigned char *dst = buf + row * rs + h * 16;
      for (int j = 0; j < jc; j++) {
        const int k = XP_GW * (c + XP_CLASSES * j) + 8 * h;
        uint4 *d = (uint4 *)(dst + j * 32);
        if (!live || k >= K)
          *d = make_uint4(0u, 0u, 0u, 0u);
        else if (al)
          cp_async16(d, src + k);
        else
          *d = xr_ld8(src, k, K);
      }
    }
  };
  /* leaves 0 .. ns - 2 ahead: group s holds leaf s's x rows (group 0 also
   * the weights of all of them) */
  for (int s = 0; s < ns - 1; s++) fetch(s, false, true);
  pdl_wait();
  pdl_trigger();
  for (int s = 0; s < ns - 1; s++) {
    fetch(s, true, false);
    cp_async_commit();
  }
  /* ldmatrix rows: A (w rows 16 FA wn + 16 fa .., matrices rows 0-7 / 8-15
   * x k 0-7 / 8-15 = a[0..3]); B (x rows 16 wm .., rows 0-7 k 0-7, k 8-15,
   * rows 8-15 k 0-7, k 8-15 = b[0][0], b[0][1], b[1][0], b[1][1]) */
  const uint32_t smb = (uint32_t)__cvta_generic_to_shared(sm);
  const uint32_t aoff = (uint32_t)((RT + 16 * FA * wn + (lane & 7) + ((lane >> 3) & 1) * 8) * rs +
                                   (lane >> 4) * 16);
  const uint32_t boff =
      (uint32_t)((16 * wm + ((lane >> 4) & 1) * 8 + (lane & 7)) * rs + ((lane >> 3) & 1) * 16);
  float st[XR_LV][NV], S[NV];
#pragma unroll
  for (int i = 0; i < XR_LEAVES; i++) {
    /* leaf i's group is in: ns - 1 + i committed, at most ns - 2 newer */
    if (ns >= 4)
      cp_async_wait_group<2>();
    else if (ns == 3)
      cp_async_wait_group<1>();
    else
      cp_async_wait_group<0>();
    __syncthreads(); /* leaf i has landed; leaf i - 1's buffer is read */
    if (i + ns - 1 < XR_LEAVES) fetch(i + ns - 1, true, true);
    cp_async_commit(); /* (empty past the last leaf: the count stays exact) */
    int c, jc;
    leaf(i, c, jc);
    const uint32_t base = smb + (uint32_t)((i % ns) * stage);
#pragma unroll
    for (int n = 0; n < NV; n++) S[n] = 0.0f;
    /* group j's fragments (b[u] = rows 8 u ..), and its steps; the next
     * group's loads are issued before this one's steps (the asm keeps the
     * written order) */
    uint32_t a0[FA][4], b0[2][2], a1[FA][4], b1[2][2];
    auto load = [&](int j, uint32_t(&a)[FA][4], uint32_t(&b)[2][2]) {
      uint32_t r4[4];
#pragma unroll
      for (int f = 0; f < FA; f++)
        xt_ldm4(a[f], base + aoff + (uint32_t)(f * 16 * rs + j * 32));
      xt_ldm4(r4, base + boff + (uint32_t)(j * 32));
      b[0][0] = r4[0], b[0][1] = r4[1], b[1][0] = r4[2], b[1][1] = r4[3];
    };
    auto steps = [&](const uint32_t(&a)[FA][4], const uint32_t(&b)[2][2]) {
#pragma unroll
      for (int f = 0; f < FA; f++)
#pragma unroll
        for (int u = 0; u < 2; u++) {
          float p[4];
          xp_group_partial<T>(a[f], b[u], p);
#pragma unroll
          for (int n = 0; n < 4; n++)
            S[(2 * f + u) * 4 + n] = __fadd_rn(S[(2 * f + u) * 4 + n], p[n]);
        }
    };
    if (jc > 0) load(0, a0, b0);
#pragma unroll 1
    for (int j = 0; j < jc; j += 2) {
      if (j + 1 < jc) load(j + 1, a1, b1);
      steps(a0, b0);
      if (j + 1 < jc) {
        if (j + 2 < jc) load(j + 2, a0, b0);
        steps(a1, b1);
      }
    }
    xp_tree_push<XR_LV, NV>(st, i, S); /* after leaf 3: S is the subtree's sum */
  }
  __syncthreads(); /* every warp is done with the buffers */
  const int ss = OT + 4;
  float *sub = (float *)sm; /* [RT][OT + 4]: this block's subtree sums */
  const int gq = lane >> 2, t = lane & 3;
#pragma unroll
  for (int f = 0; f < FA; f++)
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
      for (int n = 0; n < 4; n++)
        sub[(16 * wm + 8 * u + 2 * t + (n & 1)) * ss + 16 * FA * wn + 16 * f + gq + 8 * (n >> 1)] =
            S[(2 * f + u) * 4 + n];
  cl.sync();
  /* block q folds rows q RT / 8 .. of the tile from the eight blocks' sums */
  const int rq = RT / XR_SPLIT;
  const float *subs[XR_SPLIT];
#pragma unroll
  for (int p = 0; p < XR_SPLIT; p++) subs[p] = cl.map_shared_rank(sub, p);
  for (int e = tid; e < rq * OT; e += nt) {
    const int r = q * rq + e / OT, o = e % OT;
    float s8[XR_SPLIT];
#pragma unroll
    for (int p = 0; p < XR_SPLIT; p++) s8[p] = subs[p][r * ss + o];
    const float val = xp_tree_fold<XR_SPLIT>(s8);
    if (r0 + r < M && o0 + o < NO) out[(r0 + r) * NO + o0 + o] = val;
  }
  cl.sync(); /* the other blocks' reads of this block's sums are done */
#endif
}

template <typename T, int FA>
static int xr_launch(cudaStream_t s, int M, int K, int NO, int wm_n, int wn_n, int ns, int al,
                     const T *x, const T *w, float *out, mbd_error *err) {
  int rc = 0;
  const int RT = 16 * wm_n, OT = 16 * FA * wn_n;
  const int jm = ((K + XP_GW - 1) / XP_GW + XP_CLASSES - 1) / XP_CLASSES;
  const size_t sh = xr_smem(RT, OT, jm, ns);
  if ((rc = allow_smem(k_xproj_rows<T, FA>, sh, err)) < 0) return rc;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  at[1].id = cudaLaunchAttributeClusterDimension;
  at[1].val.clusterDim.x = XR_SPLIT;
  at[1].val.clusterDim.y = 1;
  at[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(XR_SPLIT * ((M + RT - 1) / RT)), (unsigned)((NO + OT - 1) / OT));
  cfg.blockDim = dim3((unsigned)(32 * wm_n * wn_n));
  cfg.dynamicSmemBytes = sh;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = 2;
  MBD_GPU_TRY(cudaLaunchKernelEx(&cfg, k_xproj_rows<T, FA>, M, K, NO, x, w, out, wm_n, ns, al),
              err);
  MBD_GPU_TRY(cudaGetLastError(), err);
  return 0;
fail:
  (void)cudaGetLastError();
  mbd_error_prefix(err, "launching x_proj (rows)");
  return rc;
}

/* k_xproj_rows' shape for M rows, and its launch: wide blocks (FA = 5 or 6,
 * whichever wastes fewer outputs, up to two output warps, 64 or 32 rows)
 * where they still give about a block per SM, else narrow ones (FA = 1, one
 * warp per 16 outputs, 16 rows, the outputs split over more blocks while
 * there are fewer than 128); the most stages (2..4) that fit the shared
 * memory. 1 if launched, 0 if no shape fits (the caller falls back), < 0
 * on error. */
template <typename T>
static int xproj_rows(cudaStream_t s, int M, int K, int NO, const T *x, const T *w, float *out,
                      int al, mbd_error *err) {
  const int jm = ((K + XP_GW - 1) / XP_GW + XP_CLASSES - 1) / XP_CLASSES;
  int fa = 5, wn = (NO + 79) / 80;
  const int wn6 = (NO + 95) / 96;
  if (96 * wn6 < 80 * wn) fa = 6, wn = wn6;
  if (wn > 2) wn = 2;
  const int gy = (NO + 16 * fa * wn - 1) / (16 * fa * wn);
  auto blocks = [&](int rt, int g) { return (int64_t)XR_SPLIT * ((M + rt - 1) / rt) * g; };
  int wm = blocks(64, gy) >= 128 ? 4 : blocks(32, gy) >= 128 ? 2 : 0;
  if (wm && xr_smem(16 * wm, 16 * fa * wn, jm, 2) > XR_SMEM) wm = 0;
  if (wm == 0) { /* narrow: fewer outputs a block while the blocks are few */
    fa = 1, wm = 1;
    wn = (NO + 15) / 16;
    if (wn > 12) wn = 12;
    while (wn > 1 && blocks(16, (NO + 16 * wn - 1) / (16 * wn)) < 128) wn = (wn + 1) / 2;
  }
  int ns = 4;
  while (ns >= 2 && xr_smem(16 * wm, 16 * fa * wn, jm, ns) > XR_SMEM) ns--;
  if (ns < 2 || (NO + 16 * fa * wn - 1) / (16 * fa * wn) > 65535) return 0;
  int rc;
  if (fa == 1)
    rc = xr_launch<T, 1>(s, M, K, NO, wm, wn, ns, al, x, w, out, err);
  else if (fa == 5)
    rc = xr_launch<T, 5>(s, M, K, NO, wm, wn, ns, al, x, w, out, err);
  else
    rc = xr_launch<T, 6>(s, M, K, NO, wm, wn, ns, al, x, w, out, err);
  return rc < 0 ? rc : 1;
}

/* Which kernel runs M rows (MBD_XPROJ_TILE, read at each call, for the
 * benchmarks and the tests; every choice has the same bits): unset:
 * k_xproj_rows from XR_MIN_M rows, below that the tiles where k_xproj's
 * grid would not fit one wave of the SMs (there k_xproj is latency-bound:
 * its blocks of 8 rows each read all 16 weight rows), else k_xproj; "0":
 * k_xproj for every M; "1": the tiles for every M >= XT_MIN_M (the
 * previous many-row kernel); "4": k_xproj_rows for every M. The tiles need
 * K a multiple of 512 and 16-byte aligned rows; they and k_xproj_rows need
 * sm_90 or later (clusters); where a choice cannot run, k_xproj does. */
enum xp_kernel { XPK_PLAIN, XPK_TILES, XPK_ROWS };
static xp_kernel xp_choose(int64_t M, int NO, bool tiles_ok) {
  const char *e = getenv("MBD_XPROJ_TILE");
  if (e && e[0] == '0') return XPK_PLAIN;
  int dev = 0, maj = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return XPK_PLAIN;
  }
  if (maj < 9) return XPK_PLAIN;
  if (e && e[0] == '4') return XPK_ROWS;
  tiles_ok = tiles_ok && M >= XT_MIN_M;
  if (e && e[0] == '1') return tiles_ok ? XPK_TILES : XPK_PLAIN;
  if (M >= XR_MIN_M) return XPK_ROWS;
  return tiles_ok && (M + XP_BR - 1) / XP_BR * ((NO + XP_BO - 1) / XP_BO) > sms ? XPK_TILES
                                                                                 : XPK_PLAIN;
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
  const bool a16 = ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
  const xp_kernel kind = xp_choose(M, NO, K % 512 == 0 && a16);
  const int al = K % 8 == 0 && a16;
#define XP(T)                                                                                \
  do {                                                                                       \
    int rt = 0;                                                                              \
    if (kind == XPK_TILES)                                                                   \
      rt = xproj_tiles<T>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err);           \
    else if (kind == XPK_ROWS)                                                               \
      rt = xproj_rows<T>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, al, err);        \
    if (rt != 0) return rt < 0 ? rt : 0;                                                     \
    if (vec)                                                                                 \
      return xproj_launch<T, true>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err);  \
    return xproj_launch<T, false>(s, (int)M, K, NO, (const T *)x, (const T *)w, out, err);   \
  } while (0)
  if (dt == MBD_DTYPE_BF16) XP(__nv_bfloat16);
  if (dt == MBD_DTYPE_F16) XP(__half);
#undef XP
  return mbd_error_set(err, MBD_E_INVALID, "x_proj: dtype %s unsupported", mbd_dtype_name(dt));
}
