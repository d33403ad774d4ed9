/* The decode fusion of conv + SiLU into x_proj (see conv_xproj.h). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/conv_xproj.h"


/* Decode fusion of conv + SiLU into x_proj (T = 1 rows, conv width 4).
 *
 * Block (bx, by) owns outputs bx * XPF_WARPS.. (one warp each) of rows
 * by * XP_ROWS..; it first recomputes the conv + SiLU output of every channel
 * of its rows with conv_silu_out (k_conv_silu's function) into shared memory,
 * rounded to T exactly as k_conv_silu's xc_act store, then runs k_xproj's
 * per-lane chain (xp_chunk, xp_store) on it: out is bit-identical to
 * conv_silu + x_proj. Every block of a row recomputes the same conv (a few
 * thousand multiply-adds, cheaper than a launch at small M; XPF_WARPS = 16
 * keeps the copies to five for the 80 x_proj outputs of the 130m shape).
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
 * XPF_CPT channels and, for 16-byte aligned rows, the lane's first XPF_PRE
 * chunks of its x_proj weight row, into registers. */
#define XPF_WARPS 16 /* outputs (warps) per block */
#define XPF_PRE 8    /* weight chunks per lane loaded before the wait (K <= 2048 all) */
#define XPF_CPT 4    /* conv channels per thread per pass (weights in registers) */

template <typename T, bool VEC>
__global__ void __launch_bounds__(32 * XPF_WARPS)
    k_conv_xproj(int M, int K, int NO, const float *__restrict__ cw, const float *__restrict__ cb,
                 const float *__restrict__ cstate, int64_t cslot,
                 const int32_t *__restrict__ slots, const float *__restrict__ xz, int64_t ldxz,
                 const T *__restrict__ w, float *__restrict__ out) {
  constexpr int BT = 32 * XPF_WARPS, KC = XPF_KC;
  extern __shared__ float4 xpf_sm4[];
  T *xs = (T *)xpf_sm4; /* [nr][K]: the rows' conv + SiLU outputs in dtype T */
  const int tid = threadIdx.x, lane = tid & 31;
  const int o = blockIdx.x * XPF_WARPS + (tid >> 5);
  const int r0 = blockIdx.y * XP_ROWS, nr = min(XP_ROWS, M - r0);
  const T *wr = w + (int64_t)(o < NO ? o : NO - 1) * K;
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
  uint4 wpre[XPF_PRE]; /* 2 per group: k = 512 (i / 2) + 16 lane + 8 (i % 2) */
#pragma unroll
  for (int i = 0; i < XPF_PRE; i++) {
    const int k = lane * XP_GW + 32 * XP_GW * (i >> 1) + 8 * (i & 1);
    wpre[i] = make_uint4(0u, 0u, 0u, 0u);
    if (VEC && k < K) wpre[i] = *(const uint4 *)(wr + k);
  }
  if (!VEC)
    for (int k = lane * 128 / (int)sizeof(T); k < K; k += 32 * 128 / (int)sizeof(T))
      prefetch_l2(wr + k);
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
  if (o >= NO) return;
  float acc[XP_ROWS];
#pragma unroll
  for (int r = 0; r < XP_ROWS; r++) acc[r] = 0.0f;
#pragma unroll
  for (int i = 0; i < XPF_PRE / 2; i++) {
    const int k = lane * XP_GW + 32 * XP_GW * i;
    if (k >= K) break;
    float wv[XP_GW];
    if (VEC) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const T *hp = (const T *)&wpre[2 * i + h];
#pragma unroll
        for (int j = 0; j < 8; j++) wv[8 * h + j] = ld_f32(hp + j);
      }
    } else {
      ld8<false>(wr, k, K, wv);
      ld8<false>(wr, k + 8, K, wv + 8);
    }
    xp_chunk<VEC>((const T *)xs, K, nr, k, K, wv, acc);
  }
  for (int k = lane * XP_GW + 32 * XP_GW * (XPF_PRE / 2); k < K; k += 32 * XP_GW) {
    float wv[XP_GW];
    ld8<VEC>(wr, k, K, wv);
    ld8<VEC>(wr, k + 8, K, wv + 8);
    xp_chunk<VEC>((const T *)xs, K, nr, k, K, wv, acc);
  }
  xp_store(acc, nr, lane, out + (int64_t)r0 * NO, NO, o);
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
  const dim3 grid((unsigned)((NO + XPF_WARPS - 1) / XPF_WARPS),
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
  const bool vec = di % 8 == 0 && ((uintptr_t)w & 15) == 0;
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
