/* CPU compute context: a small pthread pool plus the instruction-set level the
 * kernels run with. Passed explicitly to every CPU kernel (no globals), so two
 * contexts in one process can differ (tests compare the portable path with the
 * AVX2 path bit for bit). Which thread computes what is pure scheduling: every
 * kernel's output bits are fixed by its own arithmetic order, not by threads. */
#ifndef MBD_CPU_CTX_H
#define MBD_CPU_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum mbd_cpu_isa {
  MBD_CPU_ISA_AUTO = 0,     /* best level this machine supports */
  MBD_CPU_ISA_PORTABLE = 1, /* plain C with fmaf: runs anywhere */
  MBD_CPU_ISA_AVX2 = 2,     /* x86-64-v3: AVX2 + FMA + F16C intrinsics */
} mbd_cpu_isa;

typedef struct mbd_cpu_ctx mbd_cpu_ctx;

/* A task body: runs task index `task` on worker `thread` (0..threads-1). */
typedef void (*mbd_cpu_task_fn)(void *arg, int64_t task, int thread);

/* Starts threads-1 worker threads (the caller is thread 0). threads <= 0 means
 * one per online CPU. Asking for AVX2 on a machine without it is
 * MBD_E_UNSUPPORTED. */
int mbd_cpu_ctx_new(int threads, mbd_cpu_isa isa, mbd_cpu_ctx **out, mbd_error *err);
/* Joins the workers and frees; NULL-safe; nulls *ctx. */
void mbd_cpu_ctx_destroy(mbd_cpu_ctx **ctx);

int mbd_cpu_ctx_threads(const mbd_cpu_ctx *ctx);
mbd_cpu_isa mbd_cpu_ctx_isa(const mbd_cpu_ctx *ctx);
/* Route-identity name of the ISA level in use: "x86-64-v3" or "portable". */
const char *mbd_cpu_isa_name(mbd_cpu_isa isa);
/* Best level this machine and build support (never AUTO). */
mbd_cpu_isa mbd_cpu_isa_detect(void);

/* Runs fn for task = 0..ntasks-1 spread over the pool and returns when all are
 * done. Not reentrant: one run at a time per context. */
void mbd_cpu_ctx_run(mbd_cpu_ctx *ctx, mbd_cpu_task_fn fn, void *arg, int64_t ntasks);

/* As mbd_cpu_ctx_run, but runs everything on the calling thread when `work`
 * (any cost unit: ~multiply-adds) is below MBD_CPU_INLINE_WORK: waking
 * workers costs more than such jobs, especially on oversubscribed cores. */
#define MBD_CPU_INLINE_WORK (1 << 18)
void mbd_cpu_ctx_run_sized(mbd_cpu_ctx *ctx, mbd_cpu_task_fn fn, void *arg, int64_t ntasks,
                           int64_t work);

/* Per-thread scratch of at least `bytes` (64-byte aligned), kept across calls.
 * Call mbd_cpu_ctx_reserve from the owning thread before mbd_cpu_ctx_run; tasks
 * then read their slot with mbd_cpu_ctx_scratch without allocating. */
int mbd_cpu_ctx_reserve(mbd_cpu_ctx *ctx, size_t bytes, mbd_error *err);
void *mbd_cpu_ctx_scratch(mbd_cpu_ctx *ctx, int thread);

#endif
