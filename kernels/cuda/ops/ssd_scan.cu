/* The Mamba-2 recurrence (see ssd_scan.h).
 *
 * Rows (channel p of head h of sequence s) are independent, so a block takes
 * PB rows of one head and gives each row KS lanes (a power of two: a row's
 * lanes are adjacent lanes of one warp). Lane j of a row keeps the row's
 * state entries n in [j NL, (j + 1) NL) in registers for the whole launch.
 * The n chain of each output runs through the row's lanes as a pipeline: at
 * tick k lane j takes step t = k - j, updates its entries, continues the
 * chain from the value lane j - 1 handed on at the tick before (a shuffle)
 * and hands it to lane j + 1; the last lane adds the D skip and writes y.
 * So every state entry takes its steps in time order and every chain its n
 * in ascending order, as the CPU step does. Time runs in chunks of TC steps:
 * a chunk's dt_raw, B, C and the block's rows of x stream into shared
 * memory by cp.async while the chunk before runs (two buffers); dt and dA
 * are then computed once per step, and each lane forms dt * B for its
 * entries (the step's roundings, so the same values everywhere).
 *
 * KS grows while the launch has few rows (decode of a few sequences, prefill
 * of one), so that small launches still fill the GPU; at large batches a
 * lane keeps up to 64 entries and the pipeline costs little. A prefill of
 * many rows gives each lane the same entries of four rows (R = 4): each B
 * and C value read from shared memory then serves four updates, and the
 * four chains hide each other's latency.
 *
 * The state is stored as f32 or as bf16 (template ST): the arithmetic is
 * f32 either way; with bf16 each updated entry is rounded to bf16 at once
 * and the registers keep the rounded value, so the y chain reads the state
 * that is stored and every chunking rounds after every step. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/ssd_scan.h"
#include "kernels/cuda/ops/ssd_chunk.h"
#include "kernels/cuda/ops/ssd_common.cuh"
#include "kernels/cuda/ops/ssd_prefill.h"

#include <type_traits>

#define SSD_BLOCK 128         /* threads per block at most */
#define SSD_FILL_ROWS 32768   /* rows x KS wanted in flight before KS stops growing */
#define SSD_MAX_SMEM (200 * 1024)
#define SSD_OWN_TILE_T 4      /* launches of at most this many steps: tile of its own */
#define SSD_R4_MIN_T 16       /* four rows per lane: launches of at least this many steps */
#define SSD_DT_WIN 2048       /* prefill: dt and dA computed this many steps at a time */
#define SSD_R4_MIN_ROWS 8192  /* .. and of at least this many rows */
#define SSD_DEC16_BLOCKS 4    /* bf16 decode, several sequences a block: blocks per SM */
#define SSD_SPB_WAVES 8       /* .. taken only while this many blocks per SM remain */

/* A launch's shape: KS lanes per row, PB rows per block, TC steps per
 * chunk, the shared row strides of dt * B and C (ldn) and of x (ldx), and
 * where the state tile starts (floats; 0: it shares the chunk's memory). */
typedef struct ssd_shape {
  int ks, pb, tc, ldn, ldx, tile_at;
  int sb;  /* bytes of one stored state entry (4: f32, 2: bf16) */
  int spb, nseq; /* sequences per block (k_ssd_scan_multi: > 1), of nseq */
  int dtw; /* prefill: dt and dA of up to this many steps at a time, after the chunk buffers */
} ssd_shape;

/* Shared floats of one chunk buffer: dA, dt, dt_raw [tc] (+ [tc] of
 * alignment), B and C [tc][ldn], x [tc][ldx], rounded up to whole float4s. */
__host__ __device__ static inline int ssd_chunk_floats_d(int tc, int ldn, int ldx) {
  return (4 * tc + tc * (2 * ldn + ldx) + 3) / 4 * 4;
}
/* Chunk buffers of a launch of T steps: two when it has several chunks. */
static int ssd_nbuf(const ssd_shape *sh, int T) { return T > sh->tc ? 2 : 1; }
/* Shared bytes of a launch: the chunk buffers and the state tile [pb][N +
 * 16 / sb] entries of sb bytes, one after the other or sharing memory. */
static size_t ssd_smem_bytes(const ssd_shape *sh, int N, int T) {
  const size_t chunk =
      ((size_t)ssd_nbuf(sh, T) * ssd_chunk_floats_d(sh->tc, sh->ldn, sh->ldx) +
       (T > SSD_OWN_TILE_T ? (size_t)(2 * sh->dtw + 3) / 4 * 4 : 0)) *
      sizeof(float);
  const size_t tile = (size_t)sh->pb * (size_t)(N + 16 / sh->sb) * (size_t)sh->sb;
  if (sh->tile_at) return chunk + (sh->spb > 1 ? 2 : 1) * tile;
  return chunk > tile ? chunk : tile;
}

/* Storage of one state entry: rnd is the rounding of an updated entry to
 * what is stored (none for f32, round to nearest even for bf16), ld widens a
 * stored entry, put stores a value rnd already rounded (exact). EPV entries
 * fill 16 bytes. */
template <typename ST>
struct ssd_st;
template <>
struct ssd_st<float> {
  static constexpr int EPV = 4;
  static __device__ __forceinline__ float rnd(float v) { return v; }
  static __device__ __forceinline__ float ld(const float *p) { return *p; }
  static __device__ __forceinline__ void put(float *p, float v) { *p = v; }
};
template <>
struct ssd_st<__nv_bfloat16> {
  static constexpr int EPV = 8;
  static __device__ __forceinline__ float rnd(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
  }
  static __device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
  static __device__ __forceinline__ void put(__nv_bfloat16 *p, float v) {
    *p = __float2bfloat16_rn(v);
  }
};

/* Entries i .. i + 3 of a lane's row from 16-byte-aligned storage (a full
 * float4 of f32; for bf16, half of a 16-byte line, read as 8 bytes). */
__device__ __forceinline__ void st_ld4(const float *p, float *o) {
  const float4 v = *(const float4 *)p;
  o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
}
__device__ __forceinline__ void st_ld4(const __nv_bfloat16 *p, float *o) {
  const uint2 v = *(const uint2 *)p;
  const __nv_bfloat162 a = *(const __nv_bfloat162 *)&v.x, b = *(const __nv_bfloat162 *)&v.y;
  o[0] = __low2float(a), o[1] = __high2float(a), o[2] = __low2float(b), o[3] = __high2float(b);
}
/* Stores four already rounded entries (exact for bf16). */
__device__ __forceinline__ void st_put4(float *p, const float *v) {
  *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void st_put4(__nv_bfloat16 *p, const float *v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
  uint2 u;
  u.x = *(const unsigned *)&a;
  u.y = *(const unsigned *)&b;
  *(uint2 *)p = u;
}

/* A lane's R rows of NL entries from the state tile (zeros past row P). */
template <int NL, int R, typename ST>
__device__ __forceinline__ void tile_read(float (&st)[R][NL], const ST *s_t, int LDT, int pr0,
                                          int n0, int p0, int P) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int i = 0; i < NL; i += 4) {
      if (p0 + pr0 + r < P) {
        st_ld4(s_t + (pr0 + r) * LDT + n0 + i, &st[r][i]);
      } else {
        st[r][i] = st[r][i + 1] = st[r][i + 2] = st[r][i + 3] = 0.0f;
      }
    }
}

/* NL entries per lane; FULL: N == KS * NL (every lane full; N is then a
 * power of two), else lanes beyond N keep fewer (or none: they hand the
 * chain on unchanged). R rows per lane (R = 4: the B and C values a lane
 * loads serve four rows, which shared memory's return bandwidth needs to
 * keep the FP32 pipe busy; the host takes it with FULL, float4 access and
 * blocks that tile the head exactly). vec: bit 0 the state, bit 1 xbc (and
 * y) allow float4 access. */
/* Channel ch's conv + SiLU output from its window at cst (+ j * cd for tap
 * j) and the new input xv, conv_silu_out's arithmetic; with advance, the
 * window then moves on by one input. */
template <int K>
__device__ __forceinline__ float conv_ch(const float *w, const float *bias, float *cst, int64_t cd,
                                         int64_t ch, float xv, bool advance) {
  float wk[K], win[K - 1];
#pragma unroll
  for (int j = 0; j < K; j++) wk[j] = w[j * cd + ch];
#pragma unroll
  for (int j = 0; j < K - 1; j++) win[j] = cst[j * cd + ch];
  const float v = conv_silu_out<K>(wk, win, xv, bias != nullptr, bias ? bias[ch] : 0.0f);
  if (advance) {
#pragma unroll
    for (int j = 0; j + 1 < K - 1; j++) cst[j * cd + ch] = win[j + 1];
    cst[(K - 2) * cd + ch] = xv;
  }
  return v;
}
__device__ __forceinline__ float conv_any(const mbd_mops_ssd_conv &cv, float *cst, int64_t cd,
                                          int64_t ch, float xv, bool advance) {
  switch (cv.K) {
  case 2: return conv_ch<2>(cv.w, cv.bias, cst, cd, ch, xv, advance);
  case 3: return conv_ch<3>(cv.w, cv.bias, cst, cd, ch, xv, advance);
  case 4: return conv_ch<4>(cv.w, cv.bias, cst, cd, ch, xv, advance);
  case 5: return conv_ch<5>(cv.w, cv.bias, cst, cd, ch, xv, advance);
  case 6: return conv_ch<6>(cv.w, cv.bias, cst, cd, ch, xv, advance);
  case 7: return conv_ch<7>(cv.w, cv.bias, cst, cd, ch, xv, advance);
  default: return conv_ch<8>(cv.w, cv.bias, cst, cd, ch, xv, advance);
  }
}

/* CONV (T = 1 only): x, B and C are the conv of cv.xin (see
 * mbd_mops_ssd_conv), not read from xbc. PREFILL: launches of more than
 * SSD_OWN_TILE_T steps (dt and dA by window; one row per lane of up to 32
 * entries runs its ticks software-pipelined). MULTI: sequence s is the q-th of
 * its block (k_ssd_scan_multi); its tile went into tile buffer q & 1 while
 * the one before ran (`fetched`), and it fetches the next one's into the
 * other buffer as soon as it has read its own. */
template <typename ST, int NL, int R, bool FULL, bool CONV, bool PREFILL, bool MULTI>
__device__ __forceinline__ void ssd_seq(
    int s, int q, bool &fetched, int T, const mbd_mops_ssd_dims &dm, const ssd_shape &sh,
    const float *__restrict__ A, const float *__restrict__ D, const float *__restrict__ dt_bias,
    float lo, float hi, const float *__restrict__ dt_raw, int64_t ld_dt,
    const float *__restrict__ xbc, int64_t ld_xbc, ST *__restrict__ state, int64_t slot_stride,
    int vec, const int32_t *__restrict__ slots, float *__restrict__ y,
    const mbd_mops_ssd_conv &cv) {
  typedef ssd_st<ST> IO;
  extern __shared__ float4 smem4[];
  __shared__ int s_last; /* conv: this block advances the group's B and C windows */
  const int KS = sh.ks, PB = sh.pb, TC = sh.tc, LDN = sh.ldn, LDX = sh.ldx;
  const int CF = ssd_chunk_floats_d(TC, LDN, LDX);
  const int P = dm.head_dim, N = dm.d_state;
  const int bph = (P + PB - 1) / PB; /* blocks per head */
  const int h = blockIdx.x / bph, p0 = (blockIdx.x - h * bph) * PB;
  /* lane j of row group pl: rows p0 + pl R + r, r < R */
  const int tid = threadIdx.x, pl = tid / KS, j = tid & (KS - 1), pr0 = pl * R;
  const int n0 = j * NL;
  const int nn = FULL ? NL : (N - n0 < 0 ? 0 : N - n0 < NL ? N - n0 : NL);
  const int g = h / (dm.heads / dm.n_groups);
  const int64_t di = (int64_t)dm.heads * P, GN = (int64_t)dm.n_groups * N;
  const float a = A[h], dd = D[h], bias = dt_bias[h]; /* weights: before the wait */
  if (q == 0) {
    pdl_wait();
    pdl_trigger();
  }
  /* The block's rows of state are contiguous; with vector access they pass
   * through shared memory (s_t, rows padded by 16 bytes) so that the
   * global loads and stores are whole coalesced lines. A tile of its own
   * (short launches) is read once the first chunk has arrived, so the two
   * loads overlap; one that shares the chunk buffers is read first. */
  ST *tile = state + (int64_t)slots[s] * slot_stride + ((int64_t)h * P + p0) * N;
  const int TF = MULTI ? sh.pb * (N + IO::EPV) * (int)sizeof(ST) / 4 : 0; /* floats a buffer */
  ST *s_t = (ST *)((float *)smem4 + sh.tile_at + (q & 1) * TF);
  const int EPV = IO::EPV; /* entries per 16 bytes */
  const int LDT = N + EPV, nrows = P - p0 < PB ? P - p0 : PB, n4 = N / EPV;
  const bool tiled = FULL && (vec & 1), vbc = FULL && (vec & 2);
  const int l4 = FULL ? __ffs(N) - 3 : 0; /* log2(N / 4): N is a power of two when FULL */
  /* x staging, R = 1: thread (xi, xq) takes row p0 + xq of steps xi, xi +
   * KS, .. (the block has PB x KS threads); R = 4: rows p0 + 4 xq .. + 3 */
  const int xw = R == 1 ? PB : PB / 4, xi = tid / xw, xq = tid - xi * xw;
  const bool x_ok = p0 + xq < P;
  float st[R][NL];
  if (tiled) {
    for (int e = tid; !(MULTI && fetched) && e < nrows * n4; e += blockDim.x) {
      const int r = e / n4;
      cp_async16(s_t + r * LDT + EPV * (e - r * n4), (const float4 *)tile + e);
    }
    if (!sh.tile_at) {
      cp_async_wait_all();
      __syncthreads();
      tile_read<NL, R>(st, s_t, LDT, pr0, n0, p0, P);
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int i = 0; i < NL; i++)
        st[r][i] = p0 + pr0 + r < P && i < nn ? IO::ld(tile + (pr0 + r) * N + n0 + i) : 0.0f;
  }
  bool tile_due = tiled && sh.tile_at; /* st still to be read from the tile */
  /* Chunk c's inputs, raw, go to buffer c & 1 by cp.async (dA, dt, dt_raw
   * [TC] at +0, +TC, +2 TC; B and C [TC][LDN] at +4 TC; x [TC][LDX]); they
   * are in flight while the chunk before runs. */
  const int nch = (T + TC - 1) / TC;
  auto stage = [&](int c) {
    float *bf = (float *)smem4 + (c & 1) * CF;
    float *q_dtr = bf + 2 * TC, *q_b = bf + 4 * TC, *q_c = q_b + TC * LDN, *q_x = q_c + TC * LDN;
    const int t0 = c * TC, tn = T - t0 < TC ? T - t0 : TC;
    const int64_t r0 = (int64_t)s * T + t0;
    if (!PREFILL)
      for (int i = tid; i < tn; i += blockDim.x) cp_async4(q_dtr + i, dt_raw + (r0 + i) * ld_dt + h);
    if (CONV) { /* T = 1: the conv of x (this block's rows: their windows are its own), B, C */
      const float *cin = cv.xin + r0 * cv.ld_xin;
      float *cst = cv.state + (int64_t)slots[s] * cv.slot_stride;
      const int64_t cd = di + 2 * GN;
      for (int e = tid; e < PB + 2 * N; e += blockDim.x) {
        if (e < PB) {
          const int64_t ch = (int64_t)h * P + p0 + e;
          q_x[e] = p0 + e < P ? conv_any(cv, cst, cd, ch, cin[ch], true) : 0.0f;
        } else {
          const int n = e - PB; /* B then C */
          const int64_t ch = di + (n < N ? 0 : GN) + (int64_t)g * N + (n < N ? n : n - N);
          (n < N ? q_b + n : q_c + n - N)[0] = conv_any(cv, cst, cd, ch, cin[ch], false);
        }
      }
    } else if (R == 1) {
      for (int i = xi; i < tn; i += KS) {
        if (x_ok)
          cp_async4(q_x + i * LDX + xq, xbc + (r0 + i) * ld_xbc + (int64_t)h * P + p0 + xq);
        else
          q_x[i * LDX + xq] = 0.0f;
      }
    } else {
      for (int i = xi; i < tn; i += KS)
        cp_async16(q_x + i * LDX + 4 * xq, xbc + (r0 + i) * ld_xbc + (int64_t)h * P + p0 + 4 * xq);
    }
    if (CONV) {
    } else if (vbc) {
      for (int e = tid; e < tn << l4; e += blockDim.x) {
        const int i = e >> l4, cc = (e & ((1 << l4) - 1)) * 4;
        const float *bc = xbc + (r0 + i) * ld_xbc + di + (int64_t)g * N + cc;
        cp_async16(q_b + i * LDN + cc, bc);
        cp_async16(q_c + i * LDN + cc, bc + GN);
      }
    } else {
      for (int e = tid; e < tn * N; e += blockDim.x) {
        const int i = e / N, n = e - i * N;
        const float *bc = xbc + (r0 + i) * ld_xbc + di + (int64_t)g * N + n;
        cp_async4(q_b + i * LDN + n, bc);
        cp_async4(q_c + i * LDN + n, bc + GN);
      }
    }
    cp_async_commit();
  };
  for (int c = 0; c < nch; c++) {
    const int t0 = c * TC, tn = T - t0 < TC ? T - t0 : TC;
    const int64_t r0 = (int64_t)s * T + t0; /* the chunk's first row */
    float *bf = (float *)smem4 + (c & 1) * CF;
    float *s_da = bf, *s_dt = bf + TC, *s_dtr = bf + 2 * TC, *s_b = bf + 4 * TC;
    float *s_c = s_b + TC * LDN, *s_x = s_c + TC * LDN;
    __syncthreads(); /* chunk c - 1 is read: its buffer may take chunk c + 1 */
    if (c == 0) stage(0);
    if (c + 1 < nch) stage(c + 1);
    if (PREFILL) {
      /* dt and dA of a window of DTW steps (a multiple of TC) at once, while
       * the copies fly: no per-chunk phase for them */
      const int DTW = sh.dtw, wo = t0 % DTW;
      float *s_dtt = (float *)smem4 + (T > TC ? 2 : 1) * CF, *s_dta = s_dtt + DTW;
      if (wo == 0) {
        const int wn = T - t0 < DTW ? T - t0 : DTW;
        for (int i = tid; i < wn; i += blockDim.x) {
          float dt = mbd_pm_softplus(__fadd_rn(dt_raw[(r0 + i) * ld_dt + h], bias));
          if (dt < lo) dt = lo;
          if (dt > hi) dt = hi;
          s_dtt[i] = dt;
          s_dta[i] = mbd_pm_expf(__fmul_rn(dt, a));
        }
      }
      s_dt = s_dtt + wo;
      s_da = s_dta + wo;
    }
    if (c + 1 < nch)
      cp_async_wait_group<1>();
    else
      cp_async_wait_group<0>();
    __syncthreads(); /* chunk c (and a tile of its own) has arrived */
    if (CONV && tid == 0) {
      /* every thread of this block has read its B and C windows: count the
       * block in; the group's last block advances them at the end */
      __threadfence();
      int32_t *tk = cv.tickets + (int64_t)s * dm.n_groups + g;
      const int last = atomicAdd(tk, 1) == (dm.heads / dm.n_groups) * bph - 1;
      if (last) {
        *tk = 0;
        __threadfence();
      }
      s_last = last;
    }
    if (!PREFILL) {
      for (int i = tid; i < tn; i += blockDim.x) {
        float dt = mbd_pm_softplus(__fadd_rn(s_dtr[i], bias));
        if (dt < lo) dt = lo;
        if (dt > hi) dt = hi;
        s_dt[i] = dt;
        s_da[i] = mbd_pm_expf(__fmul_rn(dt, a));
      }
      __syncthreads();
    }
    if (tile_due) {
      tile_read<NL, R>(st, s_t, LDT, pr0, n0, p0, P);
      tile_due = false;
      if (MULTI) {
        /* the other buffer was read out before the barriers above: the next
         * sequence's tile goes there now */
        fetched = q + 1 < sh.spb && s + 1 < sh.nseq;
        if (fetched) {
          const ST *nt = state + (int64_t)slots[s + 1] * slot_stride + ((int64_t)h * P + p0) * N;
          ST *nb = (ST *)((float *)smem4 + sh.tile_at + ((q + 1) & 1) * TF);
          for (int e = tid; e < nrows * n4; e += blockDim.x) {
            const int r = e / n4;
            cp_async16(nb + r * LDT + EPV * (e - r * n4), (const float4 *)nt + e);
          }
          cp_async_commit();
        }
      }
    }
    float hand[R]; /* the chains after this lane's entries, at the last tick */
#pragma unroll
    for (int r = 0; r < R; r++) hand[r] = 0.0f;
    if (PREFILL && R == 1 && NL <= 32) {
    /* Software-pipelined ticks: iteration k runs tick k's chain over the
     * entries as updated for tick k while it updates them for tick k + 1
     * (each entry is read by the chain before its next update), so the
     * chain's dependent FMAs and the next step's updates share the issue
     * slots; the same operations and values as tick by tick. */
    float xv[R], cq[NL]; /* tick k's x and C */
    auto load = [&](int t, float (&xo)[R], float &dao, float (&bo)[NL], float (&co)[NL]) {
      if (R == 1) {
        xo[0] = s_x[t * LDX + pl];
      } else {
        const float4 x4 = *(const float4 *)(s_x + t * LDX + pr0);
        xo[0] = x4.x, xo[R > 1 ? 1 : 0] = x4.y, xo[R > 2 ? 2 : 0] = x4.z;
        xo[R > 3 ? 3 : 0] = x4.w;
      }
      dao = s_da[t];
      const float dt = s_dt[t];
      const float *bt = s_b + t * LDN + n0, *ct = s_c + t * LDN + n0;
      if (FULL) {
#pragma unroll
        for (int i = 0; i < NL; i += 4) {
          const float4 b4 = *(const float4 *)(bt + i), c4 = *(const float4 *)(ct + i);
          bo[i] = __fmul_rn(dt, b4.x), bo[i + 1] = __fmul_rn(dt, b4.y);
          bo[i + 2] = __fmul_rn(dt, b4.z), bo[i + 3] = __fmul_rn(dt, b4.w);
          co[i] = c4.x, co[i + 1] = c4.y, co[i + 2] = c4.z, co[i + 3] = c4.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < NL; i++) {
          bo[i] = i < nn ? __fmul_rn(dt, bt[i]) : 0.0f;
          co[i] = i < nn ? ct[i] : 0.0f;
        }
      }
    };
    {
      /* tick 0's update (lane 0: step 0) */
      float da0, b0[NL];
#pragma unroll
      for (int r = 0; r < R; r++) xv[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < NL; i++) cq[i] = 0.0f;
      if (j == 0 && tn > 0) {
        load(0, xv, da0, b0, cq);
#pragma unroll
        for (int i = 0; i < NL; i++)
          if (FULL || i < nn)
#pragma unroll
            for (int r = 0; r < R; r++)
              st[r][i] = IO::rnd(__fmaf_rn(da0, st[r][i], __fmul_rn(b0[i], xv[r])));
      }
    }
    for (int k = 0; k < tn + KS - 1; k++) {
      const int t = k - j;
      const bool act = t >= 0 && t < tn, act1 = t + 1 >= 0 && t + 1 < tn;
      float xn[R], cn[NL], dan = 0.0f, bn[NL];
#pragma unroll
      for (int r = 0; r < R; r++) xn[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < NL; i++) bn[i] = 0.0f, cn[i] = 0.0f;
      if (act1) load(t + 1, xn, dan, bn, cn);
      float acc[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        acc[r] = __shfl_up_sync(0xffffffffu, hand[r], 1, KS);
        if (j == 0) acc[r] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < NL; i++)
        if (FULL || i < nn)
#pragma unroll
          for (int r = 0; r < R; r++) {
            if (act) acc[r] = __fmaf_rn(st[r][i], cq[i], acc[r]);
            if (act1) st[r][i] = IO::rnd(__fmaf_rn(dan, st[r][i], __fmul_rn(bn[i], xn[r])));
          }
      if (act) {
#pragma unroll
        for (int r = 0; r < R; r++) hand[r] = acc[r];
        if (j == KS - 1) {
          float *yr = y + (r0 + t) * di + (int64_t)h * P + p0 + pr0;
          if (R == 4) {
            *(float4 *)yr = make_float4(__fmaf_rn(dd, xv[0], acc[0]), __fmaf_rn(dd, xv[1 % R], acc[1 % R]),
                                        __fmaf_rn(dd, xv[2 % R], acc[2 % R]),
                                        __fmaf_rn(dd, xv[3 % R], acc[3 % R]));
          } else {
#pragma unroll
            for (int r = 0; r < R; r++)
              if (p0 + pr0 + r < P) yr[r] = __fmaf_rn(dd, xv[r], acc[r]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; r++) xv[r] = xn[r];
#pragma unroll
      for (int i = 0; i < NL; i++) cq[i] = cn[i];
    }
    } else if (!PREFILL && R == 1 && KS > 1 && tn == 1) {
    /* One step: every lane updates its entries at once (an update needs
     * its entry alone), then only the n chain passes from lane to lane
     * (tick k: lane k continues lane k - 1's sum over the updated entries).
     * The operations of the ticks below, with no lane idle in the updates. */
    const float xv = s_x[pl], da = s_da[0], dt = s_dt[0];
    const float *bt = s_b + n0, *ct = s_c + n0;
    if (FULL) {
#pragma unroll
      for (int i = 0; i < NL; i += 4) {
        const float4 b4 = *(const float4 *)(bt + i);
        const float bq[4] = {__fmul_rn(dt, b4.x), __fmul_rn(dt, b4.y), __fmul_rn(dt, b4.z),
                             __fmul_rn(dt, b4.w)};
#pragma unroll
        for (int q = 0; q < 4; q++)
          st[0][i + q] = IO::rnd(__fmaf_rn(da, st[0][i + q], __fmul_rn(bq[q], xv)));
      }
    } else {
#pragma unroll
      for (int i = 0; i < NL; i++)
        if (i < nn) st[0][i] = IO::rnd(__fmaf_rn(da, st[0][i], __fmul_rn(__fmul_rn(dt, bt[i]), xv)));
    }
    float acc = 0.0f;
    for (int k = 0; k < KS; k++) {
      const float in = __shfl_up_sync(0xffffffffu, acc, 1, KS);
      if (j == k) {
        acc = j == 0 ? 0.0f : in;
        if (FULL) {
#pragma unroll
          for (int i = 0; i < NL; i += 4) {
            const float4 c4 = *(const float4 *)(ct + i);
            acc = __fmaf_rn(st[0][i], c4.x, acc);
            acc = __fmaf_rn(st[0][i + 1], c4.y, acc);
            acc = __fmaf_rn(st[0][i + 2], c4.z, acc);
            acc = __fmaf_rn(st[0][i + 3], c4.w, acc);
          }
        } else {
#pragma unroll
          for (int i = 0; i < NL; i++)
            if (i < nn) acc = __fmaf_rn(st[0][i], ct[i], acc);
        }
        if (j == KS - 1 && p0 + pr0 < P)
          y[r0 * di + (int64_t)h * P + p0 + pr0] = __fmaf_rn(dd, xv, acc);
      }
    }
    } else {
    /* Entry by entry: decode steps (few ticks, fewer registers live) and
     * four rows per lane (their four chains interleave by themselves). */
    for (int k = 0; k < tn + KS - 1; k++) {
      float acc[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        acc[r] = __shfl_up_sync(0xffffffffu, hand[r], 1, KS);
        if (j == 0) acc[r] = 0.0f;
      }
      const int t = k - j;
      if (t >= 0 && t < tn) {
        float xv[R];
        if (R == 1) {
          xv[0] = s_x[t * LDX + pl];
        } else {
          const float4 x4 = *(const float4 *)(s_x + t * LDX + pr0);
          xv[0] = x4.x, xv[R > 1 ? 1 : 0] = x4.y, xv[R > 2 ? 2 : 0] = x4.z;
          xv[R > 3 ? 3 : 0] = x4.w;
        }
        const float da = s_da[t], dt = s_dt[t];
        const float *bt = s_b + t * LDN + n0, *ct = s_c + t * LDN + n0;
        if (FULL) {
#pragma unroll
          for (int i = 0; i < NL; i += 4) {
            const float4 b4 = *(const float4 *)(bt + i), c4 = *(const float4 *)(ct + i);
            const float bq[4] = {__fmul_rn(dt, b4.x), __fmul_rn(dt, b4.y), __fmul_rn(dt, b4.z),
                                 __fmul_rn(dt, b4.w)};
            const float cq[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
              for (int r = 0; r < R; r++) {
                st[r][i + q] = IO::rnd(__fmaf_rn(da, st[r][i + q], __fmul_rn(bq[q], xv[r])));
                acc[r] = __fmaf_rn(st[r][i + q], cq[q], acc[r]);
              }
          }
        } else {
#pragma unroll
          for (int i = 0; i < NL; i++)
            if (i < nn) {
              const float bq = __fmul_rn(dt, bt[i]);
#pragma unroll
              for (int r = 0; r < R; r++) {
                st[r][i] = IO::rnd(__fmaf_rn(da, st[r][i], __fmul_rn(bq, xv[r])));
                acc[r] = __fmaf_rn(st[r][i], ct[i], acc[r]);
              }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) hand[r] = acc[r];
        if (j == KS - 1) {
          float *yr = y + (r0 + t) * di + (int64_t)h * P + p0 + pr0;
          if (R == 4) {
            *(float4 *)yr = make_float4(__fmaf_rn(dd, xv[0], acc[0]), __fmaf_rn(dd, xv[1 % R], acc[1 % R]),
                                        __fmaf_rn(dd, xv[2 % R], acc[2 % R]),
                                        __fmaf_rn(dd, xv[3 % R], acc[3 % R]));
          } else {
#pragma unroll
            for (int r = 0; r < R; r++)
              if (p0 + pr0 + r < P) yr[r] = __fmaf_rn(dd, xv[r], acc[r]);
          }
        }
      }
    }
    }
  }
  if (tiled) {
    __syncthreads(); /* the last chunk (or the tile) is read */
#pragma unroll
    for (int r = 0; r < R; r++)
      if (p0 + pr0 + r < P) {
#pragma unroll
        for (int i = 0; i < NL; i += 4) st_put4(s_t + (pr0 + r) * LDT + n0 + i, &st[r][i]);
      }
    __syncthreads();
    for (int e = tid; e < nrows * n4; e += blockDim.x) {
      const int r = e / n4;
      ((float4 *)tile)[e] = *(const float4 *)(s_t + r * LDT + EPV * (e - r * n4));
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; r++)
      if (p0 + pr0 + r < P) {
#pragma unroll
        for (int i = 0; i < NL; i++)
          if (i < nn) IO::put(tile + (pr0 + r) * N + n0 + i, st[r][i]);
      }
  }
  if (CONV && s_last) { /* (s_last was set before a barrier above) */
    const float *cin = cv.xin + (int64_t)s * cv.ld_xin;
    float *cst = cv.state + (int64_t)slots[s] * cv.slot_stride;
    const int64_t cd = di + 2 * GN;
    for (int e = tid; e < 2 * N; e += blockDim.x) {
      const int64_t ch = di + (e < N ? 0 : GN) + (int64_t)g * N + (e < N ? e : e - N);
      for (int jj = 0; jj + 1 < cv.K - 1; jj++) cst[jj * cd + ch] = cst[(jj + 1) * cd + ch];
      cst[(cv.K - 2) * cd + ch] = cin[ch];
    }
  }
}

template <typename ST, int NL, int R, bool FULL, bool CONV, bool PREFILL>
__global__ void __launch_bounds__(SSD_BLOCK)
    k_ssd_scan(int T, mbd_mops_ssd_dims dm, ssd_shape sh, const float *__restrict__ A,
               const float *__restrict__ D, const float *__restrict__ dt_bias, float lo, float hi,
               const float *__restrict__ dt_raw, int64_t ld_dt, const float *__restrict__ xbc,
               int64_t ld_xbc, ST *__restrict__ state, int64_t slot_stride, int vec,
               const int32_t *__restrict__ slots, float *__restrict__ y, mbd_mops_ssd_conv cv) {
  bool fetched = false;
  ssd_seq<ST, NL, R, FULL, CONV, PREFILL, false>((int)blockIdx.y, 0, fetched, T, dm, sh, A, D,
                                                 dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc,
                                                 state, slot_stride, vec, slots, y, cv);
}

/* Decode steps of a bf16 state, sh.spb sequences a block (blockIdx.y * spb
 * + q): a bf16 block moves half the bytes of an f32 one, too few in flight
 * to cover its own load and compute one after the other; here the next
 * sequence's tile loads while one computes. The same steps per sequence. */
template <typename ST, int NL, bool FULL>
__global__ void __launch_bounds__(SSD_BLOCK, SSD_DEC16_BLOCKS)
    k_ssd_scan_multi(int T, mbd_mops_ssd_dims dm, ssd_shape sh, const float *__restrict__ A,
                     const float *__restrict__ D, const float *__restrict__ dt_bias, float lo,
                     float hi, const float *__restrict__ dt_raw, int64_t ld_dt,
                     const float *__restrict__ xbc, int64_t ld_xbc, ST *__restrict__ state,
                     int64_t slot_stride, int vec, const int32_t *__restrict__ slots,
                     float *__restrict__ y, mbd_mops_ssd_conv cv) {
  bool fetched = false;
  for (int q = 0; q < sh.spb; q++) {
    const int s = (int)blockIdx.y * sh.spb + q;
    if (s >= sh.nseq) break;
    ssd_seq<ST, NL, 1, FULL, false, false, true>(s, q, fetched, T, dm, sh, A, D, dt_bias, lo, hi,
                                                 dt_raw, ld_dt, xbc, ld_xbc, state, slot_stride,
                                                 vec, slots, y, cv);
  }
}

/* Decode steps of a bf16 state at d_state SR_N over many sequences, one
 * thread per state row: a block of PB threads takes
 * tiles of PB rows of one head of one sequence (tile id = (s H + h) P / PB
 * + row block, blocks striding over the tiles), and a ring of SR_STAGES
 * shared buffers keeps the next two tiles' state rows and step inputs in
 * flight (cp.async) while one computes. A thread walks its row in
 * ascending n: each entry's update, rounded to bf16, then its chain FMA, so
 * the y chain is the CPU's n order in one thread, with no hand-offs; the
 * row is written back in place and leaves as whole coalesced lines. Rows
 * are padded by one 16-byte chunk so that a quarter-warp's rows fall in
 * distinct bank groups. Same steps and roundings as ssd_seq's one-step
 * path (dt * B, then times x; the state rounded before the chain reads it). */
#define SR_N 128
#define SR_STAGES 3
#define SR_MIN_TILES 4 /* tiles an SM from which a launch takes k_ssd_step_rows */
template <int PB>
__host__ __device__ constexpr int sr_stage_bytes() {
  return PB * (SR_N / 8 + 1) * 16 + (PB + 2 * SR_N + 4) * 4;
}
template <int PB>
__global__ void __launch_bounds__(PB)
    k_ssd_step_rows(int ntiles, mbd_mops_ssd_dims dm, const float *__restrict__ A,
                    const float *__restrict__ D, const float *__restrict__ dt_bias, float lo,
                    float hi, const float *__restrict__ dt_raw, int64_t ld_dt,
                    const float *__restrict__ xbc, int64_t ld_xbc,
                    __nv_bfloat16 *__restrict__ state, int64_t slot_stride,
                    const int32_t *__restrict__ slots, float *__restrict__ y) {
  constexpr int N = SR_N, CH = N / 8, LDT = CH + 1; /* 16-byte chunks a row; row stride */
  constexpr int TILE4 = PB * LDT, STAGE4 = sr_stage_bytes<PB>() / 16;
  static_assert(sr_stage_bytes<PB>() % 16 == 0, "stages of whole 16-byte chunks");
  extern __shared__ uint4 sr_smem[];
  const int P = dm.head_dim, H = dm.heads, bph = P / PB, hpg = H / dm.n_groups;
  const int64_t di = (int64_t)H * P, GN = (int64_t)dm.n_groups * N;
  const int tid = threadIdx.x;
  pdl_wait();
  pdl_trigger();
  /* Tile j of this block into stage j % SR_STAGES, one commit group (empty
   * past the last tile): the state rows, then x [PB], B and C [N], dt_raw,
   * A, D, dt_bias of the head. */
  auto issue = [&](int j, int stage) {
    const int id = (int)blockIdx.x + j * (int)gridDim.x;
    if (id < ntiles) {
      uint4 *stg = sr_smem + stage * STAGE4;
      const int sq = id / (H * bph), r = id - sq * (H * bph), h = r / bph;
      const int p0 = (r - h * bph) * PB;
      const uint4 *src = (const uint4 *)(state + (int64_t)slots[sq] * slot_stride +
                                         ((int64_t)h * P + p0) * N);
      for (int e = tid; e < PB * CH; e += PB) cp_async16(stg + e / CH * LDT + e % CH, src + e);
      float *in = (float *)(stg + TILE4);
      const float *xr = xbc + (int64_t)sq * ld_xbc;
      const float *bsrc = xr + di + (int64_t)(h / hpg) * N;
      for (int e = tid; e < PB / 4 + N / 2; e += PB) {
        if (e < PB / 4) {
          cp_async16(in + 4 * e, xr + (int64_t)h * P + p0 + 4 * e);
        } else {
          const int u = e - PB / 4; /* B's chunks, then C's */
          cp_async16(in + PB + 4 * u, bsrc + (u < N / 4 ? 4 * u : GN + 4 * (u - N / 4)));
        }
      }
      if (tid == 0) cp_async4(in + PB + 2 * N, dt_raw + (int64_t)sq * ld_dt + h);
      if (tid == 1) cp_async4(in + PB + 2 * N + 1, A + h);
      if (tid == 2) cp_async4(in + PB + 2 * N + 2, D + h);
      if (tid == 3) cp_async4(in + PB + 2 * N + 3, dt_bias + h);
    }
    cp_async_commit();
  };
  issue(0, 0);
  issue(1, 1 % SR_STAGES);
  for (int j = 0, cur = 0;; j++, cur = cur == SR_STAGES - 1 ? 0 : cur + 1) {
    const int id = (int)blockIdx.x + j * (int)gridDim.x;
    if (id >= ntiles) break;
    cp_async_wait_group<1>(); /* this thread's copies of tile j are in */
    __syncthreads();          /* everyone's; tile j - 1's stage is written out */
    issue(j + 2, cur == 0 ? SR_STAGES - 1 : cur - 1);
    uint4 *stg = sr_smem + cur * STAGE4;
    const float *in = (const float *)(stg + TILE4);
    const int sq = id / (H * bph), r = id - sq * (H * bph), h = r / bph;
    const int p0 = (r - h * bph) * PB;
    const float *w = in + PB + 2 * N; /* dt_raw, A, D, dt_bias */
    const float dt = ssd_dt(w[0], w[3], lo, hi), da = ssd_da(dt, w[1]), xv = in[tid];
    const float *bn = in + PB, *cn = bn + N;
    uint4 *row = stg + tid * LDT;
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < CH; c++) {
      const uint4 v = row[c];
      const float4 b0 = *(const float4 *)(bn + 8 * c), b1 = *(const float4 *)(bn + 8 * c + 4);
      const float4 c0 = *(const float4 *)(cn + 8 * c), c1 = *(const float4 *)(cn + 8 * c + 4);
      const unsigned vi[4] = {v.x, v.y, v.z, v.w};
      const float bq[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      const float cq[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      unsigned vo[4];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        /* entries 2q (low half) and 2q + 1, widened exactly */
        float s0 = __uint_as_float(vi[q] << 16), s1 = __uint_as_float(vi[q] & 0xffff0000u);
        s0 = ssd_slot<__nv_bfloat16>::round(
            __fmaf_rn(da, s0, __fmul_rn(__fmul_rn(dt, bq[2 * q]), xv)));
        acc = __fmaf_rn(s0, cq[2 * q], acc);
        s1 = ssd_slot<__nv_bfloat16>::round(
            __fmaf_rn(da, s1, __fmul_rn(__fmul_rn(dt, bq[2 * q + 1]), xv)));
        acc = __fmaf_rn(s1, cq[2 * q + 1], acc);
        vo[q] = __byte_perm(__float_as_uint(s0), __float_as_uint(s1), 0x7632);
      }
      row[c] = make_uint4(vo[0], vo[1], vo[2], vo[3]);
    }
    y[(int64_t)sq * di + (int64_t)h * P + p0 + tid] = __fmaf_rn(w[2], xv, acc);
    __syncthreads(); /* the tile is updated in place */
    uint4 *dst = (uint4 *)(state + (int64_t)slots[sq] * slot_stride + ((int64_t)h * P + p0) * N);
    for (int e = tid; e < PB * CH; e += PB) dst[e] = stg[e / CH * LDT + e % CH];
  }
}

/* k_ssd_step_rows over nseq sequences (the caller has checked the shape:
 * d_state SR_N, head_dim a multiple of PB, 16-byte aligned state rows, x,
 * B and C); blocks striding over the tiles, as many as stay resident. */
template <int PB>
static int sr_launch(cudaStream_t s, int nseq, const mbd_mops_ssd_dims *dm, const float *A,
                     const float *D, const float *dt_bias, float lo, float hi,
                     const float *dt_raw, int64_t ld_dt, const float *xbc, int64_t ld_xbc,
                     __nv_bfloat16 *state, int64_t slot_stride, const int32_t *slots, float *y,
                     mbd_error *err) {
  const size_t bytes = (size_t)SR_STAGES * sr_stage_bytes<PB>();
  int rc = allow_smem(k_ssd_step_rows<PB>, bytes, err);
  if (rc < 0) return rc;
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_ssd_step_rows<PB>, PB, bytes) !=
          cudaSuccess ||
      occ < 1) {
    (void)cudaGetLastError();
    occ = 1;
  }
  const int64_t ntiles = (int64_t)nseq * dm->heads * (dm->head_dim / PB);
  const int64_t most = (int64_t)occ * ssd_sms();
  const int grid = (int)(ntiles < most ? ntiles : most);
  return launch_pdl("ssd_scan", k_ssd_step_rows<PB>, dim3((unsigned)grid), dim3((unsigned)PB),
                    bytes, s, err, (int)ntiles, *dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc,
                    ld_xbc, state, slot_stride, slots, y);
}

/* Lanes per row and entries per lane: the smallest KS that splits N exactly
 * into NL <= 64 entries (<= 32 with the conv folded in: its variants need
 * more registers), doubled while the launch has few rows (up to 8 lanes,
 * NL >= 8); NL 8 with partial lanes when N has no such split. */
static void ssd_pick(int nseq, bool conv, const mbd_mops_ssd_dims *dm, int *ks, int *nl,
                     bool *full) {
  const int N = dm->d_state;
  const int64_t rows = (int64_t)nseq * dm->heads * dm->head_dim;
  int k = 1;
  while (k < 32 && (N % k || N / k > 64)) k <<= 1;
  const int q = N % k ? 0 : N / k;
  if (q == 8 || q == 16 || q == 32 || q == 64) {
    if (conv && N / k > 32) k <<= 1;
    while (k < 8 && N / (k * 2) >= 8 && rows * k < SSD_FILL_ROWS) k <<= 1;
    *ks = k, *nl = N / k, *full = true;
    return;
  }
  k = 1;
  while (k * 8 < N) k <<= 1;
  *ks = k, *nl = 8, *full = false;
}

template <typename ST, int NL, int R, bool FULL, bool CONV, bool PREFILL>
static int ssd_launch_nl(cudaStream_t s, int nseq, int T, const mbd_mops_ssd_dims *dm,
                         const ssd_shape *sh, const float *A, const float *D,
                         const float *dt_bias, float lo, float hi, const float *dt_raw,
                         int64_t ld_dt, const float *xbc, int64_t ld_xbc, ST *state,
                         int64_t slot_stride, int vec, const int32_t *slots, float *y,
                         const mbd_mops_ssd_conv *cv, mbd_error *err) {
  const size_t bytes = ssd_smem_bytes(sh, dm->d_state, T);
  const int bph = (dm->head_dim + sh->pb - 1) / sh->pb;
  if constexpr (R == 1 && !CONV && !PREFILL && sizeof(ST) == 2) {
    if (sh->spb > 1) {
      int rc = allow_smem(k_ssd_scan_multi<ST, NL, FULL>, bytes, err);
      if (rc < 0) return rc;
      return launch_pdl("ssd_scan", k_ssd_scan_multi<ST, NL, FULL>,
                        dim3((unsigned)(dm->heads * bph), (unsigned)((nseq + sh->spb - 1) / sh->spb)),
                        dim3((unsigned)(sh->ks * sh->pb)), bytes, s, err, T, *dm, *sh, A, D,
                        dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc, state, slot_stride, vec,
                        slots, y, *cv);
    }
  }
  int rc = allow_smem(k_ssd_scan<ST, NL, R, FULL, CONV, PREFILL>, bytes, err);
  if (rc < 0) return rc;
  return launch_pdl("ssd_scan", k_ssd_scan<ST, NL, R, FULL, CONV, PREFILL>,
                    dim3((unsigned)(dm->heads * bph), (unsigned)nseq),
                    dim3((unsigned)(sh->pb / R * sh->ks)), bytes, s, err, T, *dm, *sh, A, D, dt_bias,
                    lo, hi, dt_raw, ld_dt, xbc, ld_xbc, state, slot_stride, vec, slots, y, *cv);
}

/* The launch for state storage ST (float or __nv_bfloat16; the conv folded
 * in only with float). */
template <typename ST>
static int ssd_scan_launch(cudaStream_t s, int nseq, int T, const mbd_mops_ssd_dims *dm,
                           const float *A, const float *D, const float *dt_bias, float lo,
                           float hi, const float *dt_raw, int64_t ld_dt, const float *xbc,
                           int64_t ld_xbc, ST *state, int64_t slot_stride,
                           const int32_t *slots, float *y, const mbd_mops_ssd_conv *cv,
                           mbd_error *err) {
  if constexpr (sizeof(ST) == 2) {
    /* bf16 decode steps of at least SR_MIN_TILES tiles an SM go to
     * k_ssd_step_rows where it takes the shape (MBD_SSD=rows: whatever the
     * count; spb1, spb8: never) */
    const int64_t dix = (int64_t)dm->heads * dm->head_dim;
    const int pb = dm->head_dim % 64 == 0 ? 64 : dm->head_dim % 32 == 0 ? 32 : 0;
    if (T == 1 && !cv->w && dm->d_state == SR_N && pb && (uintptr_t)state % 16 == 0 &&
        slot_stride % 8 == 0 && (uintptr_t)xbc % 16 == 0 && ld_xbc % 4 == 0 && dix % 4 == 0 &&
        !ssd_env_is("spb1") && !ssd_env_is("spb8")) {
      const int64_t tiles = (int64_t)nseq * dm->heads * (dm->head_dim / pb);
      if (ssd_env_is("rows") || tiles >= (int64_t)SR_MIN_TILES * ssd_sms()) {
        if (pb == 64)
          return sr_launch<64>(s, nseq, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc,
                               state, slot_stride, slots, y, err);
        return sr_launch<32>(s, nseq, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc,
                             state, slot_stride, slots, y, err);
      }
    }
  }
  int ks = 1, nl = 8;
  bool full = false;
  ssd_pick(nseq, cv->w != NULL, dm, &ks, &nl, &full);
  /* bit 0: float4 state access; bit 1: float4 B, C, x and y access */
  const int P = dm->head_dim, N = dm->d_state;
  const int64_t di = (int64_t)dm->heads * P, rows = (int64_t)nseq * di;
  const int vec = ((uintptr_t)state % 16 == 0 && slot_stride % ssd_st<ST>::EPV == 0 ? 1 : 0) |
                  ((uintptr_t)xbc % 16 == 0 && ld_xbc % 4 == 0 && di % 4 == 0 &&
                           (uintptr_t)y % 16 == 0
                       ? 2
                       : 0);
  /* four rows per lane: a prefill of many rows, 16 entries per lane, row
   * groups that fill whole warps and tile the head */
  int R = 1, gb = 0;
  if (T >= SSD_R4_MIN_T && rows >= SSD_R4_MIN_ROWS && full && vec == 3 && N % 16 == 0 &&
      N / 16 <= 8 && P % 4 == 0) {
    const int k = N / 16;
    gb = SSD_BLOCK / k < P / 4 ? SSD_BLOCK / k : P / 4;
    if ((P / 4) % gb == 0 && (gb * k) % 32 == 0) R = 4, ks = k, nl = 16;
  }
  ssd_shape sh;
  sh.ks = ks;
  sh.sb = (int)sizeof(ST);
  sh.spb = 1;
  sh.nseq = nseq;
  const int rw = 32 / ks; /* row groups per warp */
  if (R == 4) {
    sh.pb = 4 * gb;
    sh.ldx = sh.pb + ((4 - sh.pb) & 31); /* float4 x reads of one tick: distinct banks */
  } else {
    const int pr = (P + rw - 1) / rw * rw;
    sh.pb = SSD_BLOCK / ks < pr ? SSD_BLOCK / ks : pr;
    sh.ldx = sh.pb + ((rw - sh.pb) & 31); /* x reads of one tick: distinct banks */
  }
  sh.ldn = ks * nl + 4; /* lanes of one tick read distinct 16-byte bank groups */
  /* 64-step chunks (less pipeline fill at 8+ lanes) when every block has
   * an SM to itself; 32 (two chunk buffers for more blocks per SM) else */
  sh.tc = 32;
  if (T > 32 && ks >= 8) {
    const int64_t blocks = (int64_t)nseq * dm->heads * ((P + sh.pb - 1) / sh.pb);
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        blocks <= sms)
      sh.tc = 64;
  }
  if (sh.tc > T) sh.tc = T;
  sh.tile_at = 0;
  sh.dtw = T <= SSD_DT_WIN ? T : SSD_DT_WIN; /* SSD_DT_WIN: a multiple of any TC below T */
  while (sh.tc > 1 && ssd_smem_bytes(&sh, N, T) > SSD_MAX_SMEM) sh.tc /= 2;
  /* a short launch (decode) gives the tile memory of its own: the state
   * load then overlaps the staging of the step's inputs */
  if (T <= SSD_OWN_TILE_T)
    sh.tile_at = ssd_nbuf(&sh, T) * ssd_chunk_floats_d(sh.tc, sh.ldn, sh.ldx);
  /* bf16 decode with blocks to spare: two or four sequences a block
   * (k_ssd_scan_multi), while SSD_SPB_WAVES blocks per SM remain */
  if (sizeof(ST) == 2 && T <= SSD_OWN_TILE_T && !cv->w && full && (vec & 1)) {
    const int64_t blocks = (int64_t)dm->heads * ((P + sh.pb - 1) / sh.pb) * nseq;
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
      for (int k = 4; k > 1 && sh.spb == 1; k /= 2) {
        ssd_shape t = sh;
        t.spb = k;
        if (blocks / k >= (int64_t)SSD_SPB_WAVES * sms && ssd_smem_bytes(&t, N, T) <= SSD_MAX_SMEM)
          sh.spb = k;
      }
    /* MBD_SSD=spb1 / spb8: that many sequences a block, for measurement */
    const int want = ssd_env_is("spb1") ? 1 : ssd_env_is("spb8") ? 8 : 0;
    ssd_shape t = sh;
    t.spb = want;
    if (want && ssd_smem_bytes(&t, N, T) <= SSD_MAX_SMEM) sh.spb = want;
  }
#define SSD_L(NLv, Rv, FULLv, CONVv, PREv)                                                    \
  ssd_launch_nl<ST, NLv, Rv, FULLv, CONVv, PREv>(s, nseq, T, dm, &sh, A, D, dt_bias, lo, hi,     \
                                                 dt_raw, ld_dt, xbc, ld_xbc, state, slot_stride, \
                                                 vec, slots, y, cv, err)
  if (T <= SSD_OWN_TILE_T) { /* decode steps: R = 1; with the conv NL <= 32 (ssd_pick) */
    if constexpr (std::is_same<ST, float>::value) {
      if (cv->w) {
        if (!full) return SSD_L(8, 1, false, true, false);
        switch (nl) {
        case 8: return SSD_L(8, 1, true, true, false);
        case 16: return SSD_L(16, 1, true, true, false);
        default: return SSD_L(32, 1, true, true, false);
        }
      }
    }
    if (!full) return SSD_L(8, 1, false, false, false);
    switch (nl) {
    case 8: return SSD_L(8, 1, true, false, false);
    case 16: return SSD_L(16, 1, true, false, false);
    case 32: return SSD_L(32, 1, true, false, false);
    default: return SSD_L(64, 1, true, false, false);
    }
  }
  if (R == 4) return SSD_L(16, 4, true, false, true);
  if (!full) return SSD_L(8, 1, false, false, true);
  switch (nl) {
  case 8: return SSD_L(8, 1, true, false, true);
  case 16: return SSD_L(16, 1, true, false, true);
  case 32: return SSD_L(32, 1, true, false, true);
  default: return SSD_L(64, 1, true, false, true);
  }
#undef SSD_L
}

static int ssd_check(int nseq, const mbd_mops_ssd_dims *dm, mbd_error *err) {
  if (nseq > 65535 || dm->heads < 1 || dm->n_groups < 1 || dm->heads % dm->n_groups ||
      dm->head_dim < 1 || dm->d_state < 1 || dm->d_state > MBD_MOPS_SSD_MAX_STATE ||
      (int64_t)dm->heads * dm->head_dim > (1 << 24))
    return mbd_error_set(err, MBD_E_INVALID,
                         "ssd_scan: %d sequences, %d heads x %d, d_state %d, %d groups "
                         "unsupported (at most 65535 sequences, d_state 1..%d)",
                         nseq, dm->heads, dm->head_dim, dm->d_state, dm->n_groups,
                         MBD_MOPS_SSD_MAX_STATE);
  return 0;
}

extern "C" int mbd_mops_ssd_scan(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                                 const float *A, const float *D, const float *dt_bias, float lo,
                                 float hi, const float *dt_raw, int64_t ld_dt, const float *xbc,
                                 int64_t ld_xbc, float *state, int64_t slot_stride,
                                 const int32_t *slots, float *y, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  int rc = ssd_check(nseq, dm, err);
  if (rc) return rc;
  if (mbd_mops_ssd_chunk_takes(nseq, T, dm)) /* long prefills of few rows: the wavefront */
    return mbd_mops_ssd_chunk_scan(stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc,
                                   ld_xbc, state, slot_stride, slots, y, err);
  if (mbd_mops_ssd_prefill_takes(nseq, T, dm)) /* long prefills of many rows */
    return mbd_mops_ssd_prefill_scan(stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt,
                                     xbc, ld_xbc, state, slot_stride, slots, y, err);
  const mbd_mops_ssd_conv none = {0, NULL, NULL, NULL, 0, NULL, 0, NULL};
  return ssd_scan_launch((cudaStream_t)stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt,
                         xbc, ld_xbc, state, slot_stride, slots, y, &none, err);
}

extern "C" int mbd_mops_ssd_scan_bf16state(void *stream, int nseq, int T,
                                           const mbd_mops_ssd_dims *dm, const float *A,
                                           const float *D, const float *dt_bias, float lo,
                                           float hi, const float *dt_raw, int64_t ld_dt,
                                           const float *xbc, int64_t ld_xbc, void *state,
                                           int64_t slot_stride, const int32_t *slots, float *y,
                                           mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  int rc = ssd_check(nseq, dm, err);
  if (rc) return rc;
  if (mbd_mops_ssd_chunk_takes(nseq, T, dm)) /* long prefills of few rows: the wavefront */
    return mbd_mops_ssd_chunk_scan_bf16state(stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw,
                                             ld_dt, xbc, ld_xbc, state, slot_stride, slots, y,
                                             err);
  if (mbd_mops_ssd_prefill_takes(nseq, T, dm)) /* long prefills of many rows */
    return mbd_mops_ssd_prefill_scan_bf16state(stream, nseq, T, dm, A, D, dt_bias, lo, hi,
                                               dt_raw, ld_dt, xbc, ld_xbc, state, slot_stride,
                                               slots, y, err);
  const mbd_mops_ssd_conv none = {0, NULL, NULL, NULL, 0, NULL, 0, NULL};
  return ssd_scan_launch((cudaStream_t)stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt,
                         xbc, ld_xbc, (__nv_bfloat16 *)state, slot_stride, slots, y, &none, err);
}

extern "C" int mbd_mops_ssd_scan_conv(void *stream, int nseq, const mbd_mops_ssd_dims *dm,
                                      const float *A, const float *D, const float *dt_bias,
                                      float lo, float hi, const float *dt_raw, int64_t ld_dt,
                                      const mbd_mops_ssd_conv *conv, float *state,
                                      int64_t slot_stride, const int32_t *slots, float *y,
                                      mbd_error *err) {
  if (nseq <= 0) return 0;
  int rc = ssd_check(nseq, dm, err);
  if (rc) return rc;
  if (!conv || conv->K < 2 || conv->K > 8 || !conv->w || !conv->state || !conv->xin ||
      !conv->tickets)
    return mbd_error_set(err, MBD_E_INVALID, "ssd_scan_conv: conv width %d outside 2..8 or "
                         "a NULL conv pointer", conv ? conv->K : 0);
  return ssd_scan_launch((cudaStream_t)stream, nseq, 1, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt,
                         NULL, 0, state, slot_stride, slots, y, conv, err);
}
