/* CPU compute context: pthread pool with a shared atomic task counter (tasks
 * are claimed dynamically; results never depend on who runs what) and
 * per-thread scratch grown only by the owner between runs. */
#include "kernels/cpu/cpu_ctx.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#define MBD_CPU_MAX_THREADS 256

struct mbd_cpu_ctx {
  int threads;                /* total, including the caller */
  mbd_cpu_isa isa;            /* resolved level, never AUTO */
  pthread_t *tids;            /* threads-1 workers */
  int started;                /* workers actually started */
  pthread_mutex_t mu;
  pthread_cond_t wake;        /* workers wait for a new generation */
  pthread_cond_t done;        /* caller waits for all workers to finish */
  uint64_t generation;        /* bumped per run */
  int stop;                   /* set at destroy */
  int busy;                   /* workers still inside the current run */
  mbd_cpu_task_fn fn;         /* current run */
  void *arg;
  int64_t ntasks;
  atomic_llong next;          /* next unclaimed task */
  void **scratch;             /* per-thread, 64-byte aligned */
  size_t scratch_bytes;       /* size of each */
};

struct worker_arg {
  mbd_cpu_ctx *ctx;
  int thread;
};

static void drain(mbd_cpu_ctx *ctx, int thread) {
  for (;;) {
    long long t = atomic_fetch_add(&ctx->next, 1);
    if (t >= ctx->ntasks) break;
    ctx->fn(ctx->arg, (int64_t)t, thread);
  }
}

static void *worker_main(void *p) {
  struct worker_arg wa = *(struct worker_arg *)p;
  free(p);
  mbd_cpu_ctx *ctx = wa.ctx;
  uint64_t seen = 0;
  pthread_mutex_lock(&ctx->mu);
  for (;;) {
    while (!ctx->stop && ctx->generation == seen) pthread_cond_wait(&ctx->wake, &ctx->mu);
    if (ctx->stop) break;
    seen = ctx->generation;
    pthread_mutex_unlock(&ctx->mu);
    drain(ctx, wa.thread);
    pthread_mutex_lock(&ctx->mu);
    if (--ctx->busy == 0) pthread_cond_signal(&ctx->done);
  }
  pthread_mutex_unlock(&ctx->mu);
  return NULL;
}

mbd_cpu_isa mbd_cpu_isa_detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  /* F16C from CPUID.1:ECX: clang before 16 rejects "f16c" in __builtin_cpu_supports. */
  unsigned a = 0, b = 0, c = 0, d = 0;
  int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
    return MBD_CPU_ISA_AVX2;
#endif
  return MBD_CPU_ISA_PORTABLE;
}

const char *mbd_cpu_isa_name(mbd_cpu_isa isa) {
  switch (isa) {
    case MBD_CPU_ISA_AVX2: return "x86-64-v3";
    case MBD_CPU_ISA_PORTABLE: return "portable";
    default: return "auto";
  }
}

int mbd_cpu_ctx_new(int threads, mbd_cpu_isa isa, mbd_cpu_ctx **out, mbd_error *err) {
  *out = NULL;
  if (threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    threads = n > 0 ? (int)n : 1;
  }
  if (threads > MBD_CPU_MAX_THREADS)
    return mbd_error_set(err, MBD_E_INVALID, "cpu context: %d threads requested, at most %d",
                         threads, MBD_CPU_MAX_THREADS);
  mbd_cpu_isa best = mbd_cpu_isa_detect();
  if (isa == MBD_CPU_ISA_AUTO) isa = best;
  if (isa == MBD_CPU_ISA_AVX2 && best != MBD_CPU_ISA_AVX2)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "cpu context: AVX2/FMA/F16C kernels requested but this CPU or build "
                         "lacks them; use the portable ISA");
  if (isa != MBD_CPU_ISA_AVX2 && isa != MBD_CPU_ISA_PORTABLE)
    return mbd_error_set(err, MBD_E_INVALID, "cpu context: unknown ISA level %d", (int)isa);

  mbd_cpu_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return mbd_error_set(err, MBD_E_NOMEM, "cpu context: out of memory");
  ctx->threads = threads;
  ctx->isa = isa;
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_cond_init(&ctx->wake, NULL);
  pthread_cond_init(&ctx->done, NULL);
  atomic_init(&ctx->next, 0);
  ctx->scratch = calloc((size_t)threads, sizeof(void *));
  ctx->tids = calloc((size_t)threads, sizeof(pthread_t));
  if (!ctx->scratch || !ctx->tids) {
    mbd_error_set(err, MBD_E_NOMEM, "cpu context: out of memory");
    goto fail;
  }
  for (int i = 1; i < threads; i++) {
    struct worker_arg *wa = malloc(sizeof(*wa));
    if (!wa) {
      mbd_error_set(err, MBD_E_NOMEM, "cpu context: out of memory");
      goto fail;
    }
    wa->ctx = ctx;
    wa->thread = i;
    if (pthread_create(&ctx->tids[i - 1], NULL, worker_main, wa) != 0) {
      free(wa);
      mbd_error_set(err, MBD_E_INTERNAL, "cpu context: could not start worker thread %d", i);
      goto fail;
    }
    ctx->started++;
  }
  *out = ctx;
  return MBD_OK;
fail:
  mbd_cpu_ctx_destroy(&ctx);
  return err ? err->code : MBD_E_NOMEM;
}

void mbd_cpu_ctx_destroy(mbd_cpu_ctx **pctx) {
  if (!pctx || !*pctx) return;
  mbd_cpu_ctx *ctx = *pctx;
  pthread_mutex_lock(&ctx->mu);
  ctx->stop = 1;
  pthread_cond_broadcast(&ctx->wake);
  pthread_mutex_unlock(&ctx->mu);
  for (int i = 0; i < ctx->started; i++) pthread_join(ctx->tids[i], NULL);
  if (ctx->scratch)
    for (int i = 0; i < ctx->threads; i++) free(ctx->scratch[i]);
  free(ctx->scratch);
  free(ctx->tids);
  pthread_cond_destroy(&ctx->done);
  pthread_cond_destroy(&ctx->wake);
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
  *pctx = NULL;
}

int mbd_cpu_ctx_threads(const mbd_cpu_ctx *ctx) { return ctx->threads; }
mbd_cpu_isa mbd_cpu_ctx_isa(const mbd_cpu_ctx *ctx) { return ctx->isa; }

void mbd_cpu_ctx_run(mbd_cpu_ctx *ctx, mbd_cpu_task_fn fn, void *arg, int64_t ntasks) {
  if (ntasks <= 0) return;
  if (ctx->started == 0 || ntasks == 1) {
    for (int64_t t = 0; t < ntasks; t++) fn(arg, t, 0);
    return;
  }
  pthread_mutex_lock(&ctx->mu);
  ctx->fn = fn;
  ctx->arg = arg;
  ctx->ntasks = ntasks;
  atomic_store(&ctx->next, 0);
  ctx->busy = ctx->started;
  ctx->generation++;
  pthread_cond_broadcast(&ctx->wake);
  pthread_mutex_unlock(&ctx->mu);
  drain(ctx, 0);
  pthread_mutex_lock(&ctx->mu);
  while (ctx->busy > 0) pthread_cond_wait(&ctx->done, &ctx->mu);
  pthread_mutex_unlock(&ctx->mu);
}

void mbd_cpu_ctx_run_sized(mbd_cpu_ctx *ctx, mbd_cpu_task_fn fn, void *arg, int64_t ntasks,
                           int64_t work) {
  if (work < MBD_CPU_INLINE_WORK) {
    for (int64_t t = 0; t < ntasks; t++) fn(arg, t, 0);
    return;
  }
  mbd_cpu_ctx_run(ctx, fn, arg, ntasks);
}

int mbd_cpu_ctx_reserve(mbd_cpu_ctx *ctx, size_t bytes, mbd_error *err) {
  if (bytes <= ctx->scratch_bytes) return MBD_OK;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  for (int i = 0; i < ctx->threads; i++) {
    void *p = aligned_alloc(64, rounded);
    if (!p)
      return mbd_error_set(err, MBD_E_NOMEM, "cpu context: cannot allocate %zu bytes of scratch",
                           rounded);
    free(ctx->scratch[i]);
    ctx->scratch[i] = p;
  }
  ctx->scratch_bytes = rounded;
  return MBD_OK;
}

void *mbd_cpu_ctx_scratch(mbd_cpu_ctx *ctx, int thread) { return ctx->scratch[thread]; }
