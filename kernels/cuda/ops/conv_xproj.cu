/* The decode fusion of conv + SiLU into x_proj (see conv_xproj.h). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/conv_xproj.h"


/* Decode fusion of conv + SiLU into x_proj (T = 1 rows, conv width 4).
 *
 * Block (bx, by) owns outputs 16 bx .. 16 bx + 15 of rows by * XP_ROWS..; it
 * first recomputes the conv + SiLU output of every channel of its rows with
 * conv_silu_out (k_conv_silu's function) into shared memory, rounded to T
 * exactly as k_conv_silu's xc_act store, then runs k_xproj's contract on it:
 * one 16 x 8 result fragment (w in the A operand, the rows in B columns
 * 0..XP_ROWS - 1, the other columns zeros), warp q the leaves 2 q, 2 q + 1
 * of the class tree (xp_warp_leaves), the warps' sums folded in warp order
 * (xp_block_fold): out is bit-identical to conv_silu + x_proj. Every block
 * of a row recomputes the same conv (a few thousand multiply-adds, cheaper
 * than a launch at small M; five copies for the 80 x_proj outputs of the
 * 130m shape).
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
 * XPF_CPT channels and, for even K and 4-byte aligned w, the warp's A
 * fragments of its first XPF_PRE groups, into registers. */
#define XPF_WARPS 16 /* warps a block: two leaves each */
#define XPF_BO 16    /* outputs a block */
#define XPF_PRE 4    /* groups a warp whose weights load before the wait */
#define XPF_CPT 4    /* conv channels per thread per pass (weights in registers) */

/* xp_rows_frag with the A fragments of XPF_PRE groups already loaded. */
template <bool VEC, typename T>
struct xpf_frag {
  xp_rows_frag<VEC, T> rows;
  uint32_t apre[XPF_PRE][4];
  int gpre[XPF_PRE];
  __device__ __forceinline__ void operator()(int g, uint32_t (&a)[4], uint32_t (&b)[2]) const {
    bool have = false;
#pragma unroll
    for (int i = 0; i < XPF_PRE; i++)
      if (gpre[i] == g) {
        a[0] = apre[i][0], a[1] = apre[i][1], a[2] = apre[i][2], a[3] = apre[i][3];
        have = true;
      }
    const int k = XP_GW * g + 2 * rows.t;
    if (!have) {
      a[0] = xp_ld2<VEC>(rows.w0, k, rows.K);
      a[1] = xp_ld2<VEC>(rows.w1, k, rows.K);
      a[2] = xp_ld2<VEC>(rows.w0, k + 8, rows.K);
      a[3] = xp_ld2<VEC>(rows.w1, k + 8, rows.K);
    }
    b[0] = xp_ld2<VEC>(rows.xr, k, rows.K);
    b[1] = xp_ld2<VEC>(rows.xr, k + 8, rows.K);
  }
};

template <typename T, bool VEC>
__global__ void __launch_bounds__(32 * XPF_WARPS)
    k_conv_xproj(int M, int K, int NO, const float *__restrict__ cw, const float *__restrict__ cb,
                 const float *__restrict__ cstate, int64_t cslot,
                 const int32_t *__restrict__ slots, const float *__restrict__ xz, int64_t ldxz,
                 const T *__restrict__ w, float *__restrict__ out) {
  constexpr int BT = 32 * XPF_WARPS, KC = XPF_KC, LPW = 32 / XPF_WARPS;
  extern __shared__ float4 xpf_sm4[];
  __shared__ float part[XPF_WARPS][4][32];
  T *xs = (T *)xpf_sm4; /* [nr][K]: the rows' conv + SiLU outputs in dtype T */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int o0 = blockIdx.x * XPF_BO;
  const int r0 = blockIdx.y * XP_ROWS, nr = min(XP_ROWS, M - r0);
  const int gq = lane >> 2, t = lane & 3;
  const T *w0 = o0 + gq < NO ? w + (int64_t)(o0 + gq) * K : nullptr;
  const T *w1 = o0 + gq + 8 < NO ? w + (int64_t)(o0 + gq + 8) * K : nullptr;
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
  /* the A fragments of the warp's first XPF_PRE groups in xp_warp_leaves'
   * order (leaf 2 warp's class, then the next leaf's, each ascending) */
  const int ng = (K + XP_GW - 1) / XP_GW;
  auto pre_g = [&](int i) { /* group of the i-th step of the warp, or -1 */
    const int per = (ng + XP_CLASSES - 1) / XP_CLASSES; /* steps of a full class */
    const int leaf = warp * LPW + i / per, j = i % per;
    const int g = xp_leaf_class(leaf) + j * XP_CLASSES;
    return i < LPW * per && g < ng ? g : -1;
  };
  uint32_t apre[XPF_PRE][4];
  int gpre[XPF_PRE];
#pragma unroll
  for (int i = 0; i < XPF_PRE; i++) {
    gpre[i] = VEC ? pre_g(i) : -1;
    const int k = XP_GW * gpre[i] + 2 * t;
    apre[i][0] = gpre[i] >= 0 ? xp_ld2<VEC>(w0, k, K) : 0u;
    apre[i][1] = gpre[i] >= 0 ? xp_ld2<VEC>(w1, k, K) : 0u;
    apre[i][2] = gpre[i] >= 0 ? xp_ld2<VEC>(w0, k + 8, K) : 0u;
    apre[i][3] = gpre[i] >= 0 ? xp_ld2<VEC>(w1, k + 8, K) : 0u;
  }
  const int lines = (int)(((int64_t)K * (int64_t)sizeof(T) + 127) / 128);
  for (int i = tid; i < XPF_BO * lines; i += BT) /* the block's weight rows toward L2 */
    if (o0 + i / lines < NO)
      prefetch_l2((const char *)(w + (int64_t)(o0 + i / lines) * K) + (int64_t)(i % lines) * 128);
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
  const T *xr = gq < nr ? xs + (int64_t)gq * K : nullptr; /* B column gq: row gq */
  float v[4];
  xpf_frag<VEC, T> fr;
  fr.rows = xp_rows_frag<VEC, T>{w0, w1, xr, K, t};
#pragma unroll
  for (int i = 0; i < XPF_PRE; i++) {
    fr.gpre[i] = gpre[i];
#pragma unroll
    for (int n = 0; n < 4; n++) fr.apre[i][n] = apre[i][n];
  }
  xp_warp_leaves<T, LPW>(warp * LPW, K, fr, v);
  xp_block_fold<XPF_WARPS>(part, v, [&](int e, float s) {
    const int ln = e >> 2, n = e & 3;
    const int o = o0 + (ln >> 2) + 8 * (n >> 1), r = 2 * (ln & 3) + (n & 1);
    if (o < NO && r < nr) out[(int64_t)(r0 + r) * NO + o] = s;
  });
}

/* Decode rows and d_inner up to which the fusion pays (mbd_mops_conv_fused):
 * past them the conv recomputed by every block of a row costs more than the
 * launch it saves. */
#define CONV_FUSE_MAX_ROWS 64
#define CONV_FUSE_MAX_DI 2048

extern "C" int mbd_mops_conv_fused(int nseq, int T, int K, int di, mbd_dtype act) {
  return nseq >= 1 && nseq <= CONV_FUSE_MAX_ROWS && di <= CONV_FUSE_MAX_DI &&
         conv_fusable(T, K, act);
}

template <typename T, bool VEC>
static int conv_xproj_launch(cudaStream_t s, int nseq, int di, const mbd_mops_conv *conv,
                             const float *xz, int64_t ldxz, const int32_t *slots, int NO,
                             const T *w, float *out, size_t sh, mbd_error *err) {
  const dim3 grid((unsigned)((NO + XPF_BO - 1) / XPF_BO),
                  (unsigned)((nseq + XP_ROWS - 1) / XP_ROWS));
  int rc = allow_smem(k_conv_xproj<T, VEC>, sh, err);
  if (rc < 0) return rc;
  return launch_pdl("conv + x_proj", k_conv_xproj<T, VEC>, grid, dim3(32 * XPF_WARPS), sh, s, err,
                    nseq, di, NO, conv->w, conv->bias, (const float *)conv->state,
                    conv->slot_stride, slots, xz, ldxz, w, out);
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
  const bool vec = di % 2 == 0 && ((uintptr_t)w & 3) == 0;
#define XPF(T)                                                                              \
  do {                                                                                      \
    if (vec)                                                                                \
      return conv_xproj_launch<T, true>(s, nseq, di, conv, xz, ldxz, slots, NO, (const T *)w, \
                                        out, sh, err);                                      \
    return conv_xproj_launch<T, false>(s, nseq, di, conv, xz, ldxz, slots, NO, (const T *)w, \
                                       out, sh, err);                                       \
  } while (0)
  if (dt == MBD_DTYPE_BF16) XPF(__nv_bfloat16);
  XPF(__half);
#undef XPF
}
