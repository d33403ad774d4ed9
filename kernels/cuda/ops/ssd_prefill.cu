/* The Mamba-2 recurrence for prefills of many rows (see ssd_prefill.h).
 *
 * A block takes CB consecutive channels of one head of one sequence; a
 * channel's state row splits into KS ranges of NL entries, and lane j of a
 * row group (KS adjacent lanes of a warp) keeps range j of R adjacent
 * channels in registers for the whole launch. The n chain of each output
 * runs through the row group as a pipeline: at tick k lane j takes token
 * k - j, updates its entries, continues the chain from the value lane j - 1
 * handed on at the tick before (a shuffle) and hands it to lane j + 1; the
 * last lane adds the D skip and writes y. So each entry takes its steps in
 * time order and each chain its n in ascending order, the CPU step's
 * roundings (kernels/cpu/ssd_step.c). The pipeline runs once over the whole
 * launch, not once per chunk of tokens: it fills and drains once.
 *
 * Shared memory, not the FP32 pipe, bounds a tick: it hands an SM 32 floats
 * a cycle (a 128-bit load costs a wavefront per quarter-warp, shared
 * addresses or not), and each entry's update and chain step read dt * B and
 * C once for the lane's R channels. So R = 2 (KS = 8 lanes of 16 entries at
 * d_state 128) keeps most warps, R = 8 (16 lanes of 8 entries) a quarter of
 * the reads per FMA for launches that still fill the GPU.
 *
 * Tokens are staged in chunks of TC by cp.async two chunks ahead into a
 * ring of 3 + LAG buffers (LAG the chunks the last lane lags behind the
 * first); one chunk ahead the block prepares a chunk in place: dA per
 * token, and dt * B per token and entry over B, formed once per block
 * instead of once per lane, so that a tick is nearly only the step's FMUL
 * and two FMAs per entry; C and x are read as staged. One barrier per
 * chunk. Every thread of the preparation computes dt of its own token (a
 * handful per thread and chunk), so no second barrier is needed for it.
 * Ticks run two to a loop trip: eight unrolled overflowed the instruction
 * cache. The state is stored as ST
 * between launches (float or bf16); each step's value is rounded as stored
 * before the chain reads it. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/ssd_common.cuh"
#include "kernels/cuda/ops/ssd_prefill.h"

#include <type_traits>

#define SP_TC 8                  /* tokens per chunk */
#define SP_UNROLL 2              /* ticks unrolled */
#define SP_R8_WARPS 2            /* eight channels a lane from this many warps a scheduler */
#define SP_MAX_THREADS 256       /* threads per block at most */
#define SP_MAX_SMEM (200 * 1024) /* shared bytes per block at most */

/* Shared row strides: dt * B and C rows of a token (N + 4: the KS lanes of
 * a row group, reading ranges NL apart of tokens one apart, hit distinct
 * 16-byte bank groups), x rows (4 mod 32, 8 at KS = 4: the lanes' tokens
 * and row groups spread over the banks). */
__host__ __device__ static inline int sp_ldn(int N) { return N + 4; }
__host__ __device__ static inline int sp_ldx(int cb, int ks) {
  return cb + ((ks >= 8 ? 4 : 8) - cb % 32 + 32) % 32;
}
/* Chunk buffers, a ring: the chunk arriving, the one being prepared, the
 * one the first lanes read and those the lagging lanes still read (KS - 1
 * tokens behind). */
__host__ __device__ static inline int sp_nslot(int ks) {
  return 3 + (ks - 1 + SP_TC - 1) / SP_TC;
}
/* Floats of a chunk buffer: dA, dt_raw [TC], B (dt * B once prepared) and
 * C [TC][ldn], x [TC][ldx]; a multiple of 32, so that lanes on either side
 * of a chunk boundary keep the banks apart. */
__host__ __device__ static inline int sp_slot_floats(int N, int cb, int ks) {
  return (2 * SP_TC + 2 * SP_TC * sp_ldn(N) + SP_TC * sp_ldx(cb, ks) + 31) / 32 * 32;
}
static size_t sp_smem_bytes(int N, int cb, int ks) {
  return (size_t)sp_nslot(ks) * sp_slot_floats(N, cb, ks) * sizeof(float);
}

/* R floats to global memory (16-byte aligned when vec; 8-byte for R = 2). */
template <int R>
__device__ __forceinline__ void sp_str(float *p, const float (&v)[R], bool vec) {
  if constexpr (R == 8) {
    if (vec) {
      *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
      *(float4 *)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
      return;
    }
  } else if constexpr (R == 4) {
    if (vec) {
      *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
  } else if constexpr (R == 2) {
    if (vec) {
      *(float2 *)p = make_float2(v[0], v[1]);
      return;
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) p[r] = v[r];
}

/* vec: bit 0 the state rows allow 16-byte access, bit 1 xbc allows 16-byte
 * copies, bit 2 y allows 16-byte stores. Registers: up to 128 at MINB = 2
 * (two blocks of 256 threads per SM; without a bound ptxas spilled the bf16
 * variants at 80; eight channels of 8 entries fit in 128 unspilled, which
 * lets the 1.3b b8 launch's 512 blocks of 4 warps run as one wave, 16 warps
 * an SM, where 156 registers left 12 and a second wave of 116 blocks), at
 * MINB = 1 as many as the one block needs. */
template <typename ST, int NL, int R, int KS, int MINB>
__global__ void __launch_bounds__(SP_MAX_THREADS, MINB)
    k_ssd_prefill(int T, mbd_mops_ssd_dims dm, int CB, const float *__restrict__ A,
                  const float *__restrict__ D, const float *__restrict__ dt_bias, float lo,
                  float hi, const float *__restrict__ dt_raw, int64_t ld_dt,
                  const float *__restrict__ xbc, int64_t ld_xbc, ST *__restrict__ state,
                  int64_t slot_stride, int vec, const int32_t *__restrict__ slots,
                  float *__restrict__ y) {
  constexpr int TC = SP_TC, N = KS * NL, RG = 32 / KS, CPW = RG * R;
  constexpr int LAG = (KS - 1 + TC - 1) / TC, NS = LAG + 3; /* chunks of lag; chunk buffers */
  static_assert((TC & (TC - 1)) == 0, "chunks of a power of two");
  extern __shared__ float4 sp_smem4[];
  const int P = dm.head_dim, bph = P / CB;
  const int h = blockIdx.x / bph, p0 = (blockIdx.x - h * bph) * CB, s = blockIdx.y;
  const int g = h / (dm.heads / dm.n_groups);
  const int tid = threadIdx.x, nth = blockDim.x, lane = tid & 31;
  const int j = lane & (KS - 1), cw = (tid >> 5) * CPW + (lane / KS) * R, n0 = j * NL;
  const int64_t di = (int64_t)dm.heads * P, GN = (int64_t)dm.n_groups * N;
  const int LDN = sp_ldn(N), LDX = sp_ldx(CB, KS);
  const int PF = sp_slot_floats(N, CB, KS);
  float *prep_buf = (float *)sp_smem4;
  const float a = A[h], dd = D[h], bias = dt_bias[h]; /* weights: before the wait */
  pdl_wait();
  const int nch = (T + TC - 1) / TC;
  const int64_t row0 = (int64_t)s * T;
  auto tokens = [&](int q) { return T - q * TC < TC ? T - q * TC : TC; };
  /* Chunk q's raw inputs into buffer q % NS, one commit group (empty past
   * the end). */
  auto stage = [&](int q) {
    if (q < nch) {
      float *r_dt = prep_buf + (q % NS) * PF + TC, *r_b = r_dt + TC, *r_c = r_b + TC * LDN;
      float *r_x = r_c + TC * LDN;
      const int tn = tokens(q);
      const int64_t r0 = row0 + (int64_t)q * TC;
      for (int e = tid; e < tn; e += nth) cp_async4(r_dt + e, dt_raw + (r0 + e) * ld_dt + h);
      const float *bsrc = xbc + di + (int64_t)g * N, *xsrc = xbc + (int64_t)h * P + p0;
      if (vec & 2) {
        constexpr int N4 = N / 4;
        for (int e = tid; e < tn * N4; e += nth) {
          const int t = e / N4, u = (e - t * N4) * 4;
          const float *src = bsrc + (r0 + t) * ld_xbc + u;
          cp_async16(r_b + t * LDN + u, src);
          cp_async16(r_c + t * LDN + u, src + GN);
        }
        const int X4 = CB / 4;
        for (int e = tid; e < tn * X4; e += nth) {
          const int t = e / X4, u = (e - t * X4) * 4;
          cp_async16(r_x + t * LDX + u, xsrc + (r0 + t) * ld_xbc + u);
        }
      } else {
        for (int e = tid; e < tn * N; e += nth) {
          const int t = e / N, u = e - t * N;
          const float *src = bsrc + (r0 + t) * ld_xbc + u;
          cp_async4(r_b + t * LDN + u, src);
          cp_async4(r_c + t * LDN + u, src + GN);
        }
        for (int e = tid; e < tn * CB; e += nth) {
          const int t = e / CB, u = e - t * CB;
          cp_async4(r_x + t * LDX + u, xsrc + (r0 + t) * ld_xbc + u);
        }
      }
    }
    cp_async_commit();
  };
  /* Chunk q (arrived, visible) prepared in its buffer: nth / TC threads
   * per token, each computing its token's dt and dA as ssd_scan does, then
   * dt * B in place of B (the step's rounding); C and x stay as staged. */
  auto prepare = [&](int q) {
    if (q >= nch) return;
    float *p_da = prep_buf + (q % NS) * PF, *p_b = p_da + 2 * TC;
    const int tpt = nth / TC, t = tid / tpt, u0 = 4 * (tid - t * tpt);
    if (t >= tokens(q)) return;
    const float dt = ssd_dt(p_da[TC + t], bias, lo, hi);
    if (u0 == 0) p_da[t] = ssd_da(dt, a);
    for (int u = u0; u < N; u += 4 * tpt) {
      float4 *pb4 = (float4 *)(p_b + t * LDN + u);
      const float4 b4 = *pb4;
      *pb4 = make_float4(__fmul_rn(dt, b4.x), __fmul_rn(dt, b4.y), __fmul_rn(dt, b4.z),
                         __fmul_rn(dt, b4.w));
    }
  };
  ST *srow = state + (int64_t)slots[s] * slot_stride + ((int64_t)h * P + p0 + cw) * N + n0;
  float st[R][NL];
#pragma unroll
  for (int r = 0; r < R; r++) ssd_slot<ST>::template load<NL>(st[r], srow + r * N, vec & 1);
  float *yo = y + (int64_t)h * P + p0 + cw;
  stage(0);
  stage(1);
  cp_async_wait_group<1>();
  __syncthreads();
  prepare(0);
  float hand[R]; /* the chains after this lane's entries, at the tick before */
#pragma unroll
  for (int r = 0; r < R; r++) hand[r] = 0.0f;
  /* chunk c's ticks (lane 0 on its tokens); from c = nch on the last lanes
   * drain: tick c TC + k runs while it is at most T + KS - 2 */
  const int cend = (T + KS - 2) / TC;
  for (int c = 0; c <= cend; c++) {
    cp_async_wait_group<0>(); /* this thread's copies of chunk c + 1 are in */
    __syncthreads(); /* everyone's are; chunk c is prepared; chunk c - 1 - LAG is read */
    stage(c + 2);
    prepare(c + 1);
    const float *pcur = prep_buf + (c % NS) * PF, *pprev = prep_buf + ((c + NS - 1) % NS) * PF;
    /* tick k: lane j's token c TC + k - j, if live (all are when ALL) */
    auto tick = [&](int k, auto all) {
      float in[R];
#pragma unroll
      for (int r = 0; r < R; r++) in[r] = __shfl_up_sync(0xffffffffu, hand[r], 1, KS);
      const int t = c * TC + k - j;
      if (decltype(all)::value || (t >= 0 && t < T)) {
        const float *pb;
        if constexpr (LAG == 1)
          pb = k >= j ? pcur : pprev;
        else
          pb = prep_buf + (int)((unsigned)t / TC % NS) * PF; /* t >= 0 here */
        const int tt = (k - j) & (TC - 1);
        const float da = pb[tt];
        const float *bt = pb + 2 * TC + tt * LDN + n0, *ct = bt + TC * LDN;
        float xv[R], acc[R];
        ssd_ldr<R>(xv, pb + 2 * TC + 2 * TC * LDN + tt * LDX + cw);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = j ? in[r] : 0.0f;
#pragma unroll
        for (int i = 0; i < NL; i += 4) {
          const float4 b4 = *(const float4 *)(bt + i), c4 = *(const float4 *)(ct + i);
          const float bq[4] = {b4.x, b4.y, b4.z, b4.w}, cq[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
          for (int q = 0; q < 4; q++) {
            float v[R];
#pragma unroll
            for (int r = 0; r < R; r++)
              v[r] = __fmaf_rn(da, st[r][i + q], __fmul_rn(bq[q], xv[r]));
#pragma unroll
            for (int r = 0; r < R; r++) v[r] = ssd_slot<ST>::round(v[r]);
#pragma unroll
            for (int r = 0; r < R; r++) {
              st[r][i + q] = v[r];
              acc[r] = __fmaf_rn(v[r], cq[q], acc[r]);
            }
          }
        }
        if (j == KS - 1) {
          float o[R];
#pragma unroll
          for (int r = 0; r < R; r++) o[r] = __fmaf_rn(dd, xv[r], acc[r]);
          sp_str<R>(yo + (row0 + t) * di, o, vec & 4);
        }
#pragma unroll
        for (int r = 0; r < R; r++) hand[r] = acc[r];
      }
    };
    /* Not unrolled further: a tick is some 130 instructions (more for bf16
     * or four channels), and eight of them in a row overflowed the
     * instruction cache. */
    if (c * TC >= KS - 1 && (c + 1) * TC <= T) { /* a whole chunk, every lane live */
#pragma unroll 2
      for (int k = 0; k < TC; k++) tick(k, std::true_type());
    } else {
      const int nk = T + KS - 1 - c * TC < TC ? T + KS - 1 - c * TC : TC;
#pragma unroll 1
      for (int k = 0; k < nk; k++) tick(k, std::false_type());
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) ssd_slot<ST>::template store<NL>(srow + r * N, st[r], vec & 1);
}

extern "C" bool mbd_mops_ssd_prefill_takes(int nseq, int T, const mbd_mops_ssd_dims *dm) {
  const int N = dm->d_state;
  return nseq >= 1 && T >= MBD_MOPS_SSD_PREFILL_MIN_T &&
         (int64_t)nseq * dm->heads * dm->head_dim >= MBD_MOPS_SSD_PREFILL_MIN_ROWS &&
         (N == 64 || N == 128 || N == 256) && dm->head_dim % 16 == 0;
}

/* Channels per block: a multiple of cpw (a warp's channels) dividing
 * head_dim, up to SP_MAX_THREADS threads. Blocks go to the SMs in waves of
 * occ(cb) per SM; a wave costs its busiest SM's channels, scaled up while
 * that SM holds fewer than SP_FULL_WARPS warps at two channels a lane
 * (too few to hide the chains' latency; each lane's R chains hide each
 * other's, so proportionally fewer at R = 4 or 8). The cheapest, the
 * widest of those on a tie (B and C staged fewer times); a negative status
 * on a CUDA error. */
#define SP_FULL_WARPS 12
template <typename K>
static int sp_pick_cb(K k, int nseq, const mbd_mops_ssd_dims *dm, int ks, int cpw,
                      mbd_error *err) {
  const int P = dm->head_dim, N = dm->d_state;
  const int64_t sms = ssd_sms();
  const int full = SP_FULL_WARPS * 2 / (cpw * ks / 32); /* fewer with more channels a lane */
  size_t most = 0;
  for (int cb = cpw; cb <= P && cb / cpw * 32 <= SP_MAX_THREADS; cb += cpw)
    if (P % cb == 0 && sp_smem_bytes(N, cb, ks) > most) most = sp_smem_bytes(N, cb, ks);
  const int rc = allow_smem(k, most, err);
  if (rc < 0) return rc;
  int best = cpw;
  double least = -1.0;
  for (int cb = cpw; cb <= P && cb / cpw * 32 <= SP_MAX_THREADS; cb += cpw) {
    if (P % cb) continue;
    const int wpb = cb / cpw;
    const size_t bytes = sp_smem_bytes(N, cb, ks);
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, wpb * 32, bytes) != cudaSuccess ||
        occ < 1) {
      (void)cudaGetLastError();
      continue;
    }
    double cost = 0.0;
    for (int64_t left = (int64_t)nseq * dm->heads * (P / cb); left > 0;) {
      const int64_t wave = left < sms * occ ? left : sms * occ, busiest = (wave + sms - 1) / sms;
      const double eff = busiest * wpb >= full ? 1.0 : (double)(busiest * wpb) / full;
      cost += (double)(busiest * cb) / eff;
      left -= wave;
    }
    if (least < 0 || cost <= least) least = cost, best = cb;
  }
  return best;
}

template <typename ST, int NL, int KS, int R, int MINB>
static int sp_launch(cudaStream_t stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                     const float *A, const float *D, const float *dt_bias, float lo, float hi,
                     const float *dt_raw, int64_t ld_dt, const float *xbc, int64_t ld_xbc,
                     ST *state, int64_t slot_stride, const int32_t *slots, float *y, int vec,
                     mbd_error *err) {
  constexpr int cpw = 32 / KS * R;
  auto k = k_ssd_prefill<ST, NL, R, KS, MINB>;
  const int N = dm->d_state, cb = sp_pick_cb(k, nseq, dm, KS, cpw, err);
  if (cb < 0) return cb; /* a status */
  /* a long kernel: not launched early (PDL), where it would share the SMs
   * its predecessor still holds */
  return launch_ex(false, "ssd_prefill", k,
                   dim3((unsigned)(dm->heads * (dm->head_dim / cb)), (unsigned)nseq),
                   dim3((unsigned)(cb / cpw * 32)), sp_smem_bytes(N, cb, KS), stream, err, T, *dm,
                   cb, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc, state, slot_stride,
                   vec, slots, y);
}

template <typename ST>
static int sp_scan(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm, const float *A,
                   const float *D, const float *dt_bias, float lo, float hi, const float *dt_raw,
                   int64_t ld_dt, const float *xbc, int64_t ld_xbc, ST *state,
                   int64_t slot_stride, const int32_t *slots, float *y, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (!mbd_mops_ssd_prefill_takes(nseq, T, dm) || nseq > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "ssd_prefill: %d tokens, d_state %d, head_dim %d "
                         "unsupported", T, dm->d_state, dm->head_dim);
  const int64_t di = (int64_t)dm->heads * dm->head_dim;
  const int epv = 16 / (int)sizeof(ST); /* state entries per 16 bytes */
  const int vec = ((uintptr_t)state % 16 == 0 && slot_stride % epv == 0 ? 1 : 0) |
                  ((uintptr_t)xbc % 16 == 0 && ld_xbc % 4 == 0 && di % 4 == 0 ? 2 : 0) |
                  ((uintptr_t)y % 16 == 0 ? 4 : 0); /* di: a multiple of 16 */
  cudaStream_t s = (cudaStream_t)stream;
#define SP_L(NLv, KSv, Rv, MINBv)                                                       \
  sp_launch<ST, NLv, KSv, Rv, MINBv>(s, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, \
                                     xbc, ld_xbc, state, slot_stride, slots, y, vec, err)
  /* d_state 128: eight channels a lane while that leaves SP_R8_WARPS warps
   * per scheduler (shared-memory reads per FMA a quarter of two channels'),
   * else two (more warps to hide the chains' latency). Eight channels in
   * 128 registers (MINB 2). */
  const int64_t entries = (int64_t)nseq * di * dm->d_state;
  const bool r8 = entries / (8 * 8) >= (int64_t)SP_R8_WARPS * 4 * 32 * ssd_sms() &&
                  !ssd_env_is("r2"); /* MBD_SSD=r2: two channels a lane, for measurement */
  switch (dm->d_state) {
  case 64: return SP_L(16, 4, 2, 2);
  case 128:
    if (!r8) return SP_L(16, 8, 2, 2);
    return SP_L(8, 16, 8, 2);
  default: return SP_L(32, 8, 2, 1);
  }
#undef SP_L
}

extern "C" int mbd_mops_ssd_prefill_scan(void *stream, int nseq, int T,
                                         const mbd_mops_ssd_dims *dm, const float *A,
                                         const float *D, const float *dt_bias, float lo,
                                         float hi, const float *dt_raw, int64_t ld_dt,
                                         const float *xbc, int64_t ld_xbc, float *state,
                                         int64_t slot_stride, const int32_t *slots, float *y,
                                         mbd_error *err) {
  return sp_scan(stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc, state,
                 slot_stride, slots, y, err);
}

extern "C" int mbd_mops_ssd_prefill_scan_bf16state(void *stream, int nseq, int T,
                                                   const mbd_mops_ssd_dims *dm, const float *A,
                                                   const float *D, const float *dt_bias,
                                                   float lo, float hi, const float *dt_raw,
                                                   int64_t ld_dt, const float *xbc,
                                                   int64_t ld_xbc, void *state,
                                                   int64_t slot_stride, const int32_t *slots,
                                                   float *y, mbd_error *err) {
  return sp_scan(stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc,
                 (__nv_bfloat16 *)state, slot_stride, slots, y, err);
}
