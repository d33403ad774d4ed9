/* Deterministic CPU GEMM (see gemm.h for the contract).
 *
 * Work is cut into tasks of (a chunk of mc rows) x (a group of NR-column
 * panels). A task packs its rows of op(A) into [K][MR] f32 blocks, and for each
 * panel runs an MR x NR micro-kernel: for k ascending, acc[i][j] =
 * fma(a[i][k], b[k][j], acc[i][j]). Vector lanes are output columns j, so the
 * AVX2 kernel performs exactly the same roundings as the portable one. Padding
 * rows/columns are zero and their results discarded. */
#include "kernels/cpu/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MBD_GEMM_HAVE_AVX2 1
#endif

#define MR 4
#define NR MBD_GEMM_NR
#define MC_MAX 256
#define A_CHUNK_BYTES (512 * 1024) /* packed rows of op(A) per task: stays in L2 */

struct mbd_cpu_wpack {
  mbd_dtype dtype; /* f32, bf16 or f16 */
  int64_t n, k;    /* W is [n, k] */
  int64_t npanels; /* ceil(n / NR) */
  size_t esize;    /* bytes per element */
  void *data;      /* npanels x [k][NR] elements */
};

static inline float widen(mbd_dtype dt, const void *p, int64_t i) {
  switch (dt) {
    case MBD_DTYPE_BF16: return mbd_bf16_to_f32(((const uint16_t *)p)[i]);
    case MBD_DTYPE_F16: return mbd_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
  }
}

/* ---- micro-kernels: out[i][j] = sum_k ap[k][i] * bp[k][j], fma chain ---- */

static void ukr_portable(int64_t K, const float *ap, const void *bp, mbd_dtype bdt,
                         float out[MR][NR]) {
  float acc[MR][NR];
  memset(acc, 0, sizeof(acc));
  for (int64_t k = 0; k < K; k++) {
    float b[NR];
    for (int j = 0; j < NR; j++) b[j] = widen(bdt, bp, k * NR + j);
    for (int i = 0; i < MR; i++) {
      float a = ap[k * MR + i];
      for (int j = 0; j < NR; j++) acc[i][j] = fmaf(a, b[j], acc[i][j]);
    }
  }
  memcpy(out, acc, sizeof(acc));
}

#ifdef MBD_GEMM_HAVE_AVX2
#define UKR_AVX2_BODY(LOAD)                                                         \
  for (int64_t k = 0; k < K; k++) {                                                 \
    __m256 b0, b1;                                                                  \
    LOAD;                                                                           \
    const float *a = ap + k * MR;                                                   \
    __m256 a0 = _mm256_broadcast_ss(a), a1 = _mm256_broadcast_ss(a + 1);            \
    __m256 a2 = _mm256_broadcast_ss(a + 2), a3 = _mm256_broadcast_ss(a + 3);        \
    c00 = _mm256_fmadd_ps(a0, b0, c00);                                             \
    c01 = _mm256_fmadd_ps(a0, b1, c01);                                             \
    c10 = _mm256_fmadd_ps(a1, b0, c10);                                             \
    c11 = _mm256_fmadd_ps(a1, b1, c11);                                             \
    c20 = _mm256_fmadd_ps(a2, b0, c20);                                             \
    c21 = _mm256_fmadd_ps(a2, b1, c21);                                             \
    c30 = _mm256_fmadd_ps(a3, b0, c30);                                             \
    c31 = _mm256_fmadd_ps(a3, b1, c31);                                             \
  }

__attribute__((target("avx2,fma,f16c"))) static void ukr_avx2(int64_t K, const float *ap,
                                                               const void *bp, mbd_dtype bdt,
                                                               float out[MR][NR]) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00;
  if (bdt == MBD_DTYPE_F32) {
    const float *b = bp;
    UKR_AVX2_BODY(b0 = _mm256_loadu_ps(b + k * NR); b1 = _mm256_loadu_ps(b + k * NR + 8))
  } else if (bdt == MBD_DTYPE_BF16) {
    const uint16_t *b = bp;
    UKR_AVX2_BODY(
        __m256i w = _mm256_loadu_si256((const __m256i *)(b + k * NR));
        b0 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(w)), 16));
        b1 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(w, 1)), 16)))
  } else {
    const uint16_t *b = bp;
    UKR_AVX2_BODY(b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + k * NR)));
                  b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + k * NR + 8))))
  }
  _mm256_storeu_ps(out[0], c00);
  _mm256_storeu_ps(out[0] + 8, c01);
  _mm256_storeu_ps(out[1], c10);
  _mm256_storeu_ps(out[1] + 8, c11);
  _mm256_storeu_ps(out[2], c20);
  _mm256_storeu_ps(out[2] + 8, c21);
  _mm256_storeu_ps(out[3], c30);
  _mm256_storeu_ps(out[3] + 8, c31);
}
#endif

/* ---- job description shared by the general and packed entry points ---- */

typedef struct gemm_job {
  int64_t M, N, K;
  mbd_dtype a_dtype;
  const void *A;
  int64_t lda;
  int a_trans;              /* op(A) = T */
  mbd_dtype b_dtype;        /* general path: B as given */
  const void *B;
  int64_t ldb;
  int b_trans;              /* op(B) = T (B stored [N,K]) */
  const mbd_cpu_wpack *W;   /* packed path when non-NULL */
  const float *bias;
  float *C;
  int64_t ldc;
  int64_t mc;               /* rows per task chunk (multiple of MR) */
  int64_t npanels, ngroups, group_size;
  mbd_cpu_ctx *ctx;
  int avx2;
} gemm_job;

static void pack_a(const gemm_job *j, int64_t m0, int64_t rows, float *ap) {
  int64_t K = j->K;
  int64_t nblocks = (rows + MR - 1) / MR;
  for (int64_t blk = 0; blk < nblocks; blk++) {
    float *dst = ap + blk * K * MR;
    for (int i = 0; i < MR; i++) {
      int64_t m = m0 + blk * MR + i;
      if (blk * MR + i >= rows) {
        for (int64_t k = 0; k < K; k++) dst[k * MR + i] = 0.0f;
      } else if (!j->a_trans) {
        for (int64_t k = 0; k < K; k++) dst[k * MR + i] = widen(j->a_dtype, j->A, m * j->lda + k);
      } else {
        for (int64_t k = 0; k < K; k++) dst[k * MR + i] = widen(j->a_dtype, j->A, k * j->lda + m);
      }
    }
  }
}

static void pack_b(const gemm_job *j, int64_t p, float *bp) {
  for (int jj = 0; jj < NR; jj++) {
    int64_t n = p * NR + jj;
    if (n >= j->N) {
      for (int64_t k = 0; k < j->K; k++) bp[k * NR + jj] = 0.0f;
    } else if (j->b_trans) {
      for (int64_t k = 0; k < j->K; k++) bp[k * NR + jj] = widen(j->b_dtype, j->B, n * j->ldb + k);
    } else {
      for (int64_t k = 0; k < j->K; k++) bp[k * NR + jj] = widen(j->b_dtype, j->B, k * j->ldb + n);
    }
  }
}

static void gemm_task(void *arg, int64_t task, int thread) {
  const gemm_job *j = arg;
  int64_t mc = task / j->ngroups, g = task % j->ngroups;
  int64_t m0 = mc * j->mc;
  int64_t rows = j->M - m0 < j->mc ? j->M - m0 : j->mc;
  int64_t p0 = g * j->group_size;
  int64_t p1 = p0 + j->group_size < j->npanels ? p0 + j->group_size : j->npanels;
  float *ap = mbd_cpu_ctx_scratch(j->ctx, thread);
  float *bscratch = ap + (size_t)j->mc * (size_t)j->K;
  pack_a(j, m0, rows, ap);
  float out[MR][NR];
  for (int64_t p = p0; p < p1; p++) {
    const void *bp;
    mbd_dtype bdt;
    if (j->W) {
      bp = (const char *)j->W->data + (size_t)p * (size_t)j->K * NR * j->W->esize;
      bdt = j->W->dtype;
    } else {
      pack_b(j, p, bscratch);
      bp = bscratch;
      bdt = MBD_DTYPE_F32;
    }
    int64_t ncols = j->N - p * NR < NR ? j->N - p * NR : NR;
    for (int64_t blk = 0; blk * MR < rows; blk++) {
      const float *a = ap + blk * j->K * MR;
#ifdef MBD_GEMM_HAVE_AVX2
      if (j->avx2)
        ukr_avx2(j->K, a, bp, bdt, out);
      else
#endif
        ukr_portable(j->K, a, bp, bdt, out);
      for (int i = 0; i < MR && blk * MR + i < rows; i++) {
        float *c = j->C + (m0 + blk * MR + i) * j->ldc + p * NR;
        if (j->bias) {
          const float *bias = j->bias + p * NR;
          for (int64_t jj = 0; jj < ncols; jj++) c[jj] = out[i][jj] + bias[jj];
        } else {
          for (int64_t jj = 0; jj < ncols; jj++) c[jj] = out[i][jj];
        }
      }
    }
  }
}

/* Rows per task: as many as fit A_CHUNK_BYTES packed, so each weight panel
 * is streamed from memory once per chunk rather than once per 4 rows. */
static int64_t chunk_rows(int64_t K) {
  int64_t mc = K > 0 ? (A_CHUNK_BYTES / (int64_t)sizeof(float)) / K : MC_MAX;
  if (mc > MC_MAX) mc = MC_MAX;
  mc -= mc % MR;
  return mc < MR ? MR : mc;
}

size_t mbd_cpu_gemm_scratch_bytes(int64_t K) {
  size_t k = K > 0 ? (size_t)K : 1;
  return ((size_t)chunk_rows(K) + NR) * k * sizeof(float);
}

static int run_job(mbd_cpu_ctx *ctx, gemm_job *j, mbd_error *err) {
  if (j->M == 0 || j->N == 0) return MBD_OK;
  j->ctx = ctx;
  j->avx2 = mbd_cpu_ctx_isa(ctx) == MBD_CPU_ISA_AVX2;
  j->npanels = (j->N + NR - 1) / NR;
  j->mc = chunk_rows(j->K);
  int64_t nmc = (j->M + j->mc - 1) / j->mc;
  /* Enough tasks for load balance; scheduling never changes the bits. */
  int64_t target = 8 * (int64_t)mbd_cpu_ctx_threads(ctx);
  int64_t ngroups = (target + nmc - 1) / nmc;
  if (ngroups > j->npanels) ngroups = j->npanels;
  if (ngroups < 1) ngroups = 1;
  j->group_size = (j->npanels + ngroups - 1) / ngroups;
  j->ngroups = (j->npanels + j->group_size - 1) / j->group_size;
  int rc = mbd_cpu_ctx_reserve(ctx, mbd_cpu_gemm_scratch_bytes(j->K), err);
  if (rc) return rc;
  mbd_cpu_ctx_run_sized(ctx, gemm_task, j, nmc * j->ngroups, j->M * j->N * j->K);
  return MBD_OK;
}

static int check_dtype(mbd_dtype dt, const char *what, mbd_error *err) {
  if (dt == MBD_DTYPE_F32 || dt == MBD_DTYPE_BF16 || dt == MBD_DTYPE_F16) return MBD_OK;
  return mbd_error_set(err, MBD_E_INVALID, "gemm: %s dtype %s is not f32, bf16 or f16", what,
                       mbd_dtype_name(dt));
}

int mbd_cpu_gemm(mbd_cpu_ctx *ctx, mbd_gemm_layout layout, int64_t M, int64_t N, int64_t K,
                 mbd_dtype a_dtype, const void *A, int64_t lda, mbd_dtype b_dtype,
                 const void *B, int64_t ldb, const float *bias, float *C, int64_t ldc,
                 mbd_error *err) {
  if (!ctx) return mbd_error_set(err, MBD_E_INVALID, "gemm: no CPU context");
  if (layout != MBD_GEMM_NN && layout != MBD_GEMM_TN && layout != MBD_GEMM_NT)
    return mbd_error_set(err, MBD_E_INVALID, "gemm: unknown layout %d (valid: NN, TN, NT)",
                         (int)layout);
  if (M < 0 || N < 0 || K < 0)
    return mbd_error_set(err, MBD_E_SHAPE, "gemm: negative size M=%lld N=%lld K=%lld",
                         (long long)M, (long long)N, (long long)K);
  int rc = check_dtype(a_dtype, "A", err);
  if (!rc) rc = check_dtype(b_dtype, "B", err);
  if (rc) return rc;
  int a_trans = layout == MBD_GEMM_TN, b_trans = layout == MBD_GEMM_NT;
  int64_t min_lda = a_trans ? M : K, min_ldb = b_trans ? K : N;
  if (lda < min_lda || ldb < min_ldb || ldc < N)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "gemm: leading dimensions too small (lda=%lld needs >= %lld, ldb=%lld "
                         "needs >= %lld, ldc=%lld needs >= %lld)",
                         (long long)lda, (long long)min_lda, (long long)ldb, (long long)min_ldb,
                         (long long)ldc, (long long)N);
  if (M > 0 && N > 0 && (!C || (K > 0 && (!A || !B))))
    return mbd_error_set(err, MBD_E_INVALID, "gemm: NULL operand");
  gemm_job j = {.M = M, .N = N, .K = K, .a_dtype = a_dtype, .A = A, .lda = lda,
                .a_trans = a_trans, .b_dtype = b_dtype, .B = B, .ldb = ldb,
                .b_trans = b_trans, .bias = bias, .C = C, .ldc = ldc};
  return run_job(ctx, &j, err);
}

int mbd_cpu_gemm_packed(mbd_cpu_ctx *ctx, int64_t M, const float *A, int64_t lda,
                        const mbd_cpu_wpack *W, const float *bias, float *C, int64_t ldc,
                        mbd_error *err) {
  if (!ctx || !W) return mbd_error_set(err, MBD_E_INVALID, "gemm: no CPU context or weight");
  if (M < 0 || lda < W->k || ldc < W->n)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "gemm: bad packed call (M=%lld, lda=%lld needs >= %lld, ldc=%lld "
                         "needs >= %lld)",
                         (long long)M, (long long)lda, (long long)W->k, (long long)ldc,
                         (long long)W->n);
  if (M > 0 && (!C || (W->k > 0 && !A)))
    return mbd_error_set(err, MBD_E_INVALID, "gemm: NULL operand");
  gemm_job j = {.M = M, .N = W->n, .K = W->k, .a_dtype = MBD_DTYPE_F32, .A = A, .lda = lda,
                .W = W, .bias = bias, .C = C, .ldc = ldc};
  return run_job(ctx, &j, err);
}

int mbd_cpu_wpack_new(mbd_dtype dtype, int64_t N, int64_t K, mbd_dtype src_dtype, const void *W,
                      int64_t ldw, mbd_cpu_wpack **out, mbd_error *err) {
  *out = NULL;
  int rc = check_dtype(dtype, "storage", err);
  if (!rc) rc = check_dtype(src_dtype, "source", err);
  if (rc) return rc;
  if (N < 0 || K < 0 || ldw < K || (N > 0 && K > 0 && !W))
    return mbd_error_set(err, MBD_E_SHAPE, "weight pack: bad shape [%lld,%lld] or stride %lld",
                         (long long)N, (long long)K, (long long)ldw);
  mbd_cpu_wpack *w = calloc(1, sizeof(*w));
  if (!w) return mbd_error_set(err, MBD_E_NOMEM, "weight pack: out of memory");
  w->dtype = dtype;
  w->n = N;
  w->k = K;
  w->npanels = (N + NR - 1) / NR;
  w->esize = mbd_dtype_size(dtype);
  size_t bytes = (size_t)w->npanels * (size_t)K * NR * w->esize;
  if (K != 0 && bytes / (size_t)K / NR / w->esize != (size_t)w->npanels) {
    free(w);
    return mbd_error_set(err, MBD_E_TOO_LARGE, "weight pack: [%lld,%lld] overflows", (long long)N,
                         (long long)K);
  }
  w->data = aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
  if (!w->data) {
    free(w);
    return mbd_error_set(err, MBD_E_NOMEM, "weight pack: cannot allocate %zu bytes", bytes);
  }
  memset(w->data, 0, bytes);
  size_t ss = mbd_dtype_size(src_dtype);
  for (int64_t n = 0; n < N; n++) {
    int64_t p = n / NR, jj = n % NR;
    for (int64_t k = 0; k < K; k++) {
      size_t di = ((size_t)p * (size_t)K + (size_t)k) * NR + (size_t)jj;
      const char *src = (const char *)W + ((size_t)n * (size_t)ldw + (size_t)k) * ss;
      if (src_dtype == dtype) {
        memcpy((char *)w->data + di * w->esize, src, w->esize);
        continue;
      }
      float v = widen(src_dtype, src, 0);
      if (dtype == MBD_DTYPE_F32)
        ((float *)w->data)[di] = v;
      else if (dtype == MBD_DTYPE_BF16)
        ((uint16_t *)w->data)[di] = mbd_f32_to_bf16(v);
      else
        ((uint16_t *)w->data)[di] = mbd_f32_to_f16(v);
    }
  }
  *out = w;
  return MBD_OK;
}

void mbd_cpu_wpack_destroy(mbd_cpu_wpack **pw) {
  if (!pw || !*pw) return;
  free((*pw)->data);
  free(*pw);
  *pw = NULL;
}

int64_t mbd_cpu_wpack_rows(const mbd_cpu_wpack *w) { return w->n; }
int64_t mbd_cpu_wpack_cols(const mbd_cpu_wpack *w) { return w->k; }
mbd_dtype mbd_cpu_wpack_dtype(const mbd_cpu_wpack *w) { return w->dtype; }
size_t mbd_cpu_wpack_nbytes(const mbd_cpu_wpack *w) {
  return (size_t)w->npanels * (size_t)w->k * NR * w->esize;
}

void mbd_cpu_wpack_row(const mbd_cpu_wpack *w, int64_t n, float *out) {
  int64_t p = n / NR, jj = n % NR;
  for (int64_t k = 0; k < w->k; k++)
    out[k] = widen(w->dtype, w->data, (p * w->k + k) * NR + jj);
}
