/* The Mamba-2 recurrence for long prefills (see ssd_chunk.h).
 *
 * The only serial dependence across tokens is each state entry with its own
 * past; the n chains of different tokens' outputs are independent. So a
 * block takes CB consecutive channels of one group of one sequence (they
 * share B and C; they may span heads) and splits each channel's state row
 * into KP = N / NL ranges ("pieces") of NL entries: thread (k, l) keeps
 * entries [k NL, (k + 1) NL) of channels l R .. l R + R - 1 in registers
 * for the whole launch (R = 2 at larger launches: each B and C value read
 * from shared memory then serves two updates). Tokens run in chunks of TC, and the
 * pieces form a wavefront over the chunks: at tick m piece k takes chunk
 * m - k. For each of the chunk's tokens in order it updates its entries,
 * then continues that token's n chain over them from the value piece k - 1
 * left in shared memory at tick m - 1 (piece 0 starts from +0), and leaves
 * the chain for piece k + 1; the last piece adds the D skip and writes y.
 * So each entry takes its steps in time order and each chain its n in
 * ascending order, the CPU step's roundings (kernels/cpu/ssd_step.c), while
 * a thread's TC chains of a tick are independent of each other and the
 * entries' updates interleave with them.
 *
 * Per tick, one barrier: chunk inputs are staged by cp.async two ticks
 * ahead (each piece's range of B and C of its chunk, three buffers; x of
 * a chunk into a ring of KP + 2 chunks, as pieces read it for KP ticks),
 * so a tick's copies have a whole tick to arrive; and every SC_DG ticks
 * the block computes dt and dA of the next SC_DG chunks for its heads, a
 * token and head per thread, from the raw dt staged with them and the
 * heads' weights held in shared memory (a ring of KP + SC_DG chunks), so
 * that no thread waits on a global load there or runs more than one of
 * these chains of transcendentals. Each thread forms dt * B for its
 * entries, as the step does. B and C are staged once per block, so blocks
 * are made as wide as the SMs allow. Adjacent threads are channels of one
 * piece, so B and C reads are shared by lane pairs; x and the chain
 * hand-offs are padded so that a warp's pieces hit distinct banks. The
 * state is stored as ST between launches (float or bf16); each step's
 * value is rounded as stored (ssd_slot<ST>::round) before the chain reads
 * it. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/ssd_chunk.h"
#include "kernels/cuda/ops/ssd_common.cuh"

#define SC_TC 8             /* tokens per chunk */
#define SC_DG 4             /* chunks per dt pass */
#define SC_MAX_THREADS 512  /* threads per block at most */
#define SC_MAX_SMEM (200 * 1024) /* shared bytes per block at most */
#define SC_NL 8             /* state entries per thread and channel */
#define SC_R2_THREADS 128   /* two channels per thread from this many threads per SM on */

/* Shared floats of a block of cb channels, kp pieces and up to nh heads:
 * B and C [3][TC][2 N], the x ring [kp + 2][(TC + 1) cb], the chain
 * hand-offs [2][kp][(TC + 1) cb], (dt, dA) pairs [kp + DG][nh][TC + 1],
 * dt_raw [nh][DG TC], (A, dt_bias) [nh]. */
static int sc_smem_floats(int N, int cb, int kp, int nh) {
  const int xw = (SC_TC + 1) * cb;
  return 3 * SC_TC * 2 * N + (kp + 2) * xw + 2 * kp * xw +
         2 * (kp + SC_DG) * nh * (SC_TC + 1) + nh * SC_DG * SC_TC + 2 * nh;
}

/* vec: bit 0 the state rows allow 16-byte access, bit 1 B and C allow
 * 16-byte copies. Ring slots are counters advanced each tick and each
 * thread's staging elements start from indices formed once, so that no
 * tick divides (a tick's integer work once equalled its arithmetic, on two
 * warps a scheduler that cannot hide the division chains). A register cap
 * for SC_MAX_THREADS threads rather than __launch_bounds__, under which
 * ptxas held NL = 8 to 64 registers and spilled. */
template <int NL, int R, int TC, int DG, typename ST>
__global__ void __maxnreg__(65536 / SC_MAX_THREADS)
    k_ssd_chunk(int T, mbd_mops_ssd_dims dm, int CB, int NH, const float *__restrict__ A,
                const float *__restrict__ D, const float *__restrict__ dt_bias, float lo,
                float hi, const float *__restrict__ dt_raw, int64_t ld_dt,
                const float *__restrict__ xbc, int64_t ld_xbc, ST *__restrict__ state,
                int64_t slot_stride, int vec, const int32_t *__restrict__ slots,
                float *__restrict__ y) {
  static_assert(DG >= 3, "a pass's raw dt is staged two ticks before, over the pass before");
  extern __shared__ float4 sc_smem4[];
  const int P = dm.head_dim, N = dm.d_state, KP = N / NL;
  const int gch = dm.heads / dm.n_groups * P; /* channels per group */
  const int bpg = (gch + CB - 1) / CB;        /* blocks per group */
  const int g = blockIdx.x / bpg, s = blockIdx.y;
  const int c0 = g * gch + (blockIdx.x - g * bpg) * CB; /* the block's first channel */
  const int cn = g * gch + gch - c0 < CB ? g * gch + gch - c0 : CB; /* .. and its live ones */
  const int h0 = c0 / P, nh = (c0 + cn - 1) / P - h0 + 1; /* its heads (nh <= NH) */
  /* lanes per piece; this thread's piece, lane, first channel, head. With R
   * = 2 (head_dim even: CB, the group and cn are too) a thread's channels
   * are both live or both not, of one head. */
  const int LP = CB / R, tid = threadIdx.x, nth = LP * KP, k = tid / LP, l = tid - k * LP;
  const int n0 = k * NL, cl = l * R;
  const bool live = cl < cn;
  const int c = c0 + (live ? cl : 0), hl = c / P - h0;
  const int64_t di = (int64_t)dm.heads * P, GN = (int64_t)dm.n_groups * N;
  /* x ring slots, slot and piece stride (= CB mod 32: a warp's pieces hit
   * distinct banks; the ring runs backwards, so that the pieces' chunks
   * m - k do too); (dt, dA) ring slots and head row stride */
  const int XS = KP + 2, XW = (TC + 1) * CB;
  const int DS = KP + DG, DW = TC + 1;
  float *s_bc = (float *)sc_smem4;           /* [3][TC][B N | C N] */
  float *s_x = s_bc + 3 * TC * 2 * N;        /* [XS][XW]: x[t][j] at t * CB + j */
  float *s_p = s_x + XS * XW;                /* [2][KP][XW]: chain after piece k */
  float2 *s_dd = (float2 *)(s_p + 2 * KP * XW); /* [DS][NH][DW]: (dt, dA) */
  float *s_dtr = (float *)(s_dd + DS * NH * DW); /* [NH][DG TC]: raw dt of the next pass */
  float2 *s_ab = (float2 *)(s_dtr + NH * DG * TC); /* [NH]: (A, dt_bias) of the block's heads */
  const float dd = D[h0 + hl];
  /* the heads' weights, so that the dt passes wait on no global load */
  if (tid < nh) s_ab[tid] = make_float2(A[h0 + tid], dt_bias[h0 + tid]);
  pdl_wait();
  const int nch = (T + TC - 1) / TC, nticks = nch + KP - 1;
  const int64_t row0 = (int64_t)s * T;
  const float *xg = xbc + c0, *bg = xbc + di + (int64_t)g * N;
  auto tokens = [&](int q) { return T - q * TC < TC ? T - q * TC : TC; };
  /* dt and dA of a head with weights ab = (A, dt_bias) from its raw dt, as
   * ssd_scan computes them */
  auto dt_of = [&](float2 ab, float raw, float2 *o) {
    const float dt = ssd_dt(raw, ab.y, lo, hi);
    *o = make_float2(dt, ssd_da(dt, ab.x));
  };
  /* this thread's first staging elements and the steps between them: B and
   * C columns (u, row rw) of NQ = N / W, x (token xt, channel xj) */
  const int NQ = (vec & 2) ? N / 4 : N, bu0 = tid % NQ, br0 = tid / NQ;
  const int bdu = nth % NQ, bdr = nth / NQ;
  const int xt0 = tid / CB, xj0 = tid - xt0 * CB, xdt = nth / CB, xdj = nth - xdt * CB;
  /* Staging for tick m, one commit group (empty past the end): piece kk's
   * range of B and C of chunk m - kk into bc (buffer m % 3); x of chunk m
   * into xs (its ring slot); when tick m has a dt pass (m % DG == 0),
   * dt_raw of chunks m + 1 .. m + DG. */
  auto stage = [&](int m, float *bc, float *xs) {
    /* element e = (t, w, u): column u (W floats) of B (w = 0) or C of step
     * t; consecutive threads take consecutive columns, so that their
     * shared-memory writes fall in distinct banks */
    auto copy_bc = [&](auto width) {
      constexpr int W = decltype(width)::value;
      int u = bu0, rw = br0;
      for (; rw < 2 * TC; u += bdu, rw += bdr) {
        if (u >= NQ) u -= NQ, rw++;
        if (rw >= 2 * TC) break;
        const int t = rw >> 1, w = rw & 1, kk = u * W / NL, q = m - kk;
        if (q < 0 || q >= nch || t >= tokens(q)) continue;
        const int64_t row = row0 + (int64_t)q * TC + t;
        if (W == 4)
          cp_async16(bc + t * 2 * N + w * N + 4 * u, bg + row * ld_xbc + w * GN + 4 * u);
        else
          cp_async4(bc + t * 2 * N + w * N + u, bg + row * ld_xbc + w * GN + u);
      }
    };
    if (vec & 2)
      copy_bc(std::integral_constant<int, 4>());
    else
      copy_bc(std::integral_constant<int, 1>());
    if (m < nch) {
      const int tn = tokens(m);
      const float *xm = xg + (row0 + (int64_t)m * TC) * ld_xbc;
      for (int t = xt0, j = xj0; t < tn;) {
        if (j < cn)
          cp_async4(xs + t * CB + j, xm + t * ld_xbc + j);
        else
          xs[t * CB + j] = 0.0f; /* channels past the group: zeros, never written out */
        j += xdj, t += xdt;
        if (j >= CB) j -= CB, t++;
      }
    }
    if (m % DG == 0 && m + 1 < nch) {
      const int64_t t1 = (int64_t)(m + 1) * TC; /* first token of the pass */
      const int tn = T - t1 < DG * TC ? (int)(T - t1) : DG * TC;
      for (int e = tid; e < nh * DG * TC; e += nth) {
        const int hh = e / (DG * TC), j = e - hh * (DG * TC);
        if (j < tn) cp_async4(s_dtr + e, dt_raw + (row0 + t1 + j) * ld_dt + h0 + hh);
      }
    }
    cp_async_commit();
  };
  ST *srow = state + (int64_t)slots[s] * slot_stride + (int64_t)c * N + n0;
  float st[R][NL];
#pragma unroll
  for (int r = 0; r < R; r++) {
    if (live) {
      ssd_slot<ST>::template load<NL>(st[r], srow + r * N, vec & 1);
    } else {
#pragma unroll
      for (int i = 0; i < NL; i++) st[r][i] = 0.0f;
    }
  }
  /* chunk 0's dt and dA straight from dt_raw (visible after tick 0's barrier) */
  for (int e = tid; e < nh * TC; e += nth) {
    const int hh = e / TC, t = e - hh * TC;
    if (t < tokens(0))
      dt_of(make_float2(A[h0 + hh], dt_bias[h0 + hh]), dt_raw[(row0 + t) * ld_dt + h0 + hh],
            s_dd + hh * DW + t);
  }
  /* ring positions at tick m: B and C buffer bm = m % 3; x slot of chunk
   * m + 2 (the ring runs backwards: slot XS - 1 - chunk % XS); this
   * piece's chunk q = m - k modulo XS and DS (qx, qd); (dt, dA) slot of
   * chunk m + 1 (d1) */
  const int TB = TC * 2 * N;
  int bm = 0, xm2 = XS - 1 - 2 % XS, qx = (XS - k % XS) % XS, qd = (DS - k % DS) % DS;
  int d1 = 1 % DS;
  stage(0, s_bc, s_x + (XS - 1) * XW);
  stage(1, s_bc + TB, s_x + (XS - 1 - 1 % XS) * XW);
  for (int m = 0; m < nticks; m++) {
    cp_async_wait_group<1>(); /* this thread's copies for tick m are in (tick m + 1's may not be) */
    __syncthreads();    /* everyone's are; tick m - 1 has finished reading */
    const int b2 = bm == 0 ? 2 : bm - 1; /* (m + 2) % 3 */
    stage(m + 2, s_bc + b2 * TB, s_x + xm2 * XW);
    const int cbm = bm, cqx = qx, cqd = qd, cd1 = d1;
    bm = bm == 2 ? 0 : bm + 1;
    xm2 = xm2 == 0 ? XS - 1 : xm2 - 1;
    qx = qx == XS - 1 ? 0 : qx + 1;
    qd = qd == DS - 1 ? 0 : qd + 1;
    d1 = d1 == DS - 1 ? 0 : d1 + 1;
    /* dt and dA of chunks m + 1 .. m + DG (read from tick m + 1 on), a
     * token and head per thread */
    if (m % DG == 0 && m + 1 < nch) {
      const int64_t t1 = (int64_t)(m + 1) * TC;
      const int tn = T - t1 < DG * TC ? (int)(T - t1) : DG * TC;
      for (int e = tid; e < nh * DG * TC; e += nth) {
        const int hh = e / (DG * TC), j = e - hh * (DG * TC);
        if (j >= tn) continue;
        int sl = cd1 + j / TC;
        if (sl >= DS) sl -= DS;
        const int o = (sl * NH + hh) * DW + j % TC;
        dt_of(s_ab[hh], s_dtr[e], s_dd + o);
      }
    }
    const int q = m - k;
    if (q < 0 || q >= nch) continue;
    const int tn = tokens(q), sd = cqd;
    const float *bc = s_bc + cbm * TB + n0;
    const float *xs = s_x + (XS - 1 - cqx) * XW + cl;
    const float2 *dds = s_dd + (sd * NH + hl) * DW;
    const float *pin = s_p + (((m + 1) & 1) * KP + (k > 0 ? k - 1 : 0)) * XW + cl;
    float *pout = s_p + ((m & 1) * KP + k) * XW + cl;
    float *yq = y + (row0 + (int64_t)q * TC) * di + c;
    /* the tick's chains, stored after the loop: shared stores among the
     * steps would keep each step's loads behind the step before */
    float outv[TC][R];
    /* Token t's chain runs over the entries as updated for t while they
     * are updated for t + 1 (each entry read by the chain before its next
     * update): R chains of dependent FMAs alone, each right behind the
     * updates it reads, left a thread's issue waiting on them; the same
     * operations on the same values. */
    float xv[R];                   /* x of the token whose chain runs */
    auto update = [&](int t, float (&xo)[R], const float *ct, float (&acc)[R], bool chain) {
      const float2 dda = dds[t];
      const float dt = dda.x, da = dda.y;
      ssd_ldr<R>(xo, xs + t * CB);
      const float *bt = bc + t * 2 * N;
#pragma unroll
      for (int i = 0; i < NL; i += 4) {
        const float4 b4 = *(const float4 *)(bt + i);
        float4 c4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (chain) c4 = *(const float4 *)(ct + i);
        const float bq[4] = {b4.x, b4.y, b4.z, b4.w}, cq[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const float dtb = __fmul_rn(dt, bq[j]);
#pragma unroll
          for (int r = 0; r < R; r++) {
            if (chain) acc[r] = __fmaf_rn(st[r][i + j], cq[j], acc[r]);
            st[r][i + j] =
                ssd_slot<ST>::round(__fmaf_rn(da, st[r][i + j], __fmul_rn(dtb, xo[r])));
          }
        }
      }
    };
    /* token t's chain over the entries as they stand; then token t + 1's
     * update with it when more follows */
    auto chain = [&](int t, bool more) {
      float acc[R];
      if (k > 0) {
        ssd_ldr<R>(acc, pin + t * CB);
      } else {
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
      }
      const float *ct = bc + t * 2 * N + N;
      float xn[R];
      if (more) {
        update(t + 1, xn, ct, acc, true);
      } else {
#pragma unroll
        for (int i = 0; i < NL; i += 4) {
          const float4 c4 = *(const float4 *)(ct + i);
          const float cq[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
          for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = __fmaf_rn(st[r][i + j], cq[j], acc[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < R; r++) outv[t][r] = k == KP - 1 ? __fmaf_rn(dd, xv[r], acc[r]) : acc[r];
      if (more) {
#pragma unroll
        for (int r = 0; r < R; r++) xv[r] = xn[r];
      }
    };
    float unused[R];
    update(0, xv, nullptr, unused, false);
    if (tn == TC) {
#pragma unroll
      for (int t = 0; t < TC; t++) chain(t, t + 1 < TC);
    } else {
#pragma unroll
      for (int t = 0; t < TC; t++)
        if (t < tn) chain(t, t + 1 < tn);
    }
    if (k == KP - 1) {
      if (live) {
#pragma unroll
        for (int t = 0; t < TC; t++)
          if (t < tn) {
#pragma unroll
            for (int r = 0; r < R; r++) yq[t * di + r] = outv[t][r];
          }
      }
    } else {
#pragma unroll
      for (int t = 0; t < TC; t++)
        if (t < tn) {
          if constexpr (R == 2)
            *(float2 *)(pout + t * CB) = make_float2(outv[t][0], outv[t][1]);
          else
            pout[t * CB] = outv[t][0];
        }
    }
  }
  if (live) {
#pragma unroll
    for (int r = 0; r < R; r++) ssd_slot<ST>::template store<NL>(srow + r * N, st[r], vec & 1);
  }
}

/* Channels per block: the widest multiple of 4, up to R SC_MAX_THREADS /
 * kp and the group's width (rounded up to 4), whose busiest SM gets within 3%
 * of the fewest channels any width gives when blocks go to the SMs in
 * waves (wider blocks: B and C staged fewer times). */
static int64_t sc_load(int nseq, const mbd_mops_ssd_dims *dm, int64_t cb) {
  const int64_t gch = (int64_t)dm->heads / dm->n_groups * dm->head_dim, sms = ssd_sms();
  const int64_t blocks = (int64_t)nseq * dm->n_groups * ((gch + cb - 1) / cb);
  return (blocks + sms - 1) / sms * cb;
}
static int sc_pick_cb(int nseq, const mbd_mops_ssd_dims *dm, int kp, int R) {
  const int64_t gch = (int64_t)dm->heads / dm->n_groups * dm->head_dim;
  const int64_t wide = (gch + 3) / 4 * 4, cap = R * SC_MAX_THREADS / kp / 4 * 4;
  const int64_t top = cap < wide ? cap : wide;
  int64_t least = sc_load(nseq, dm, 4);
  for (int64_t cb = 8; cb <= top; cb += 4) {
    const int64_t l = sc_load(nseq, dm, cb);
    if (l < least) least = l;
  }
  int64_t cb = top;
  while (cb > 4 && sc_load(nseq, dm, cb) * 100 > least * 103) cb -= 4;
  return (int)cb;
}

/* Heads a block of cb consecutive channels can touch. */
static int sc_heads(const mbd_mops_ssd_dims *dm, int cb) {
  const int nh = (cb - 1) / dm->head_dim + 2, hpg = dm->heads / dm->n_groups;
  return nh < hpg ? nh : hpg;
}

extern "C" bool mbd_mops_ssd_chunk_takes(int nseq, int T, const mbd_mops_ssd_dims *dm) {
  return T >= MBD_MOPS_SSD_CHUNK_MIN_T &&
         (int64_t)nseq * dm->heads * dm->head_dim < MBD_MOPS_SSD_CHUNK_MAX_ROWS &&
         dm->d_state % SC_NL == 0 && dm->d_state <= MBD_MOPS_SSD_MAX_STATE;
}

template <int R, typename ST>
static int sc_launch(cudaStream_t stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                     const float *A, const float *D, const float *dt_bias, float lo, float hi,
                     const float *dt_raw, int64_t ld_dt, const float *xbc, int64_t ld_xbc,
                     ST *state, int64_t slot_stride, const int32_t *slots, float *y, int vec,
                     mbd_error *err) {
  const int N = dm->d_state, kp = N / SC_NL;
  int cb = sc_pick_cb(nseq, dm, kp, R);
  while (cb > 4 && (size_t)sc_smem_floats(N, cb, kp, sc_heads(dm, cb)) * sizeof(float) >
                       SC_MAX_SMEM)
    cb -= 4;
  const int nh = sc_heads(dm, cb);
  const size_t bytes = (size_t)sc_smem_floats(N, cb, kp, nh) * sizeof(float);
  auto k = k_ssd_chunk<SC_NL, R, SC_TC, SC_DG, ST>;
  int rc = allow_smem(k, bytes, err);
  if (rc < 0) return rc;
  const int gch = dm->heads / dm->n_groups * dm->head_dim, bpg = (gch + cb - 1) / cb;
  /* a long kernel: not launched early (PDL), where it would share the SMs
   * its predecessor still holds */
  return launch_ex(false, "ssd_chunk", k, dim3((unsigned)(dm->n_groups * bpg), (unsigned)nseq),
                   dim3((unsigned)(cb / R * kp)),
                   bytes, stream, err, T, *dm, cb, nh, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc,
                   ld_xbc, state, slot_stride, vec, slots, y);
}

template <typename ST>
static int sc_scan(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm, const float *A,
                   const float *D, const float *dt_bias, float lo, float hi, const float *dt_raw,
                   int64_t ld_dt, const float *xbc, int64_t ld_xbc, ST *state,
                   int64_t slot_stride, const int32_t *slots, float *y, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (!mbd_mops_ssd_chunk_takes(nseq, T, dm) || nseq > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "ssd_chunk: %d tokens, d_state %d unsupported", T,
                         dm->d_state);
  const int64_t di = (int64_t)dm->heads * dm->head_dim;
  const int epv = 16 / (int)sizeof(ST); /* state entries per 16 bytes */
  const int vec = ((uintptr_t)state % 16 == 0 && slot_stride % epv == 0 ? 1 : 0) |
                  ((uintptr_t)xbc % 16 == 0 && ld_xbc % 4 == 0 && di % 4 == 0 ? 2 : 0);
  /* two channels per thread (half the shared-memory reads of B and C per
   * update) when that still leaves SC_R2_THREADS threads per SM */
  const int64_t entries = (int64_t)nseq * di * dm->d_state;
  cudaStream_t s = (cudaStream_t)stream;
  /* MBD_SSD=r1: one channel a thread whatever the launch */
  if (dm->head_dim % 2 == 0 && entries / (2 * SC_NL) >= (int64_t)SC_R2_THREADS * ssd_sms() &&
      !ssd_env_is("r1"))
    return sc_launch<2, ST>(s, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc,
                            state, slot_stride, slots, y, vec, err);
  return sc_launch<1, ST>(s, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc,
                          state, slot_stride, slots, y, vec, err);
}

extern "C" int mbd_mops_ssd_chunk_scan(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                                       const float *A, const float *D, const float *dt_bias,
                                       float lo, float hi, const float *dt_raw, int64_t ld_dt,
                                       const float *xbc, int64_t ld_xbc, float *state,
                                       int64_t slot_stride, const int32_t *slots, float *y,
                                       mbd_error *err) {
  return sc_scan(stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc, state,
                 slot_stride, slots, y, err);
}

extern "C" int mbd_mops_ssd_chunk_scan_bf16state(void *stream, int nseq, int T,
                                                 const mbd_mops_ssd_dims *dm, const float *A,
                                                 const float *D, const float *dt_bias, float lo,
                                                 float hi, const float *dt_raw, int64_t ld_dt,
                                                 const float *xbc, int64_t ld_xbc, void *state,
                                                 int64_t slot_stride, const int32_t *slots,
                                                 float *y, mbd_error *err) {
  return sc_scan(stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt, xbc, ld_xbc,
                 (__nv_bfloat16 *)state, slot_stride, slots, y, err);
}
