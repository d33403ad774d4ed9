/* Service overhead on one GPU: aggregate decode tokens/s through the whole
 * service (one client DEALER -> mambad-broker -> mambad-worker --device
 * cuda:0, ipc:// endpoints) for 1, 8, 64, 256 concurrent generating sessions,
 * next to the in-process figure of mbd_mamba1_gpu_step at the same batch
 * (measured first, in this process, on the same checkpoint and route, over
 * runs of INPROC_STEPS consecutive steps:
 * "in-proc logits" downloads the [n,V] logits as the worker's step does,
 * "in-proc greedy" only the picked tokens, as bench_mamba1_gpu); then the
 * cost per GEMM request of CUDA IPC inputs vs inline frames for 4 KiB, 1 MiB
 * and 256 MiB operands (IPC: first request opens the handle, the rest hit
 * the worker's cache); last, the sessions table again from a worker started
 * with --overlap-steps 0 (each batched step's replies sent before the next
 * step is launched instead of while it computes), for comparison.
 * Usage: bench_service_gpu BIN_DIR MODEL_DIR [gen_tokens] (default 512: the
 * sessions' start and finish then weigh little against the steady state)
 * (MODEL_DIR: e.g. `mambad-model synth --shape 130m --dtype bf16 --out DIR`).
 * Medians of repeated runs; exits 77 without a device. */
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/mambad.h"
#include "kernels/cuda/mamba1_gpu.h"
#include "support/quantile.h"
#include "support/service_gpu.h"

static const int k_batches[4] = {1, 8, 64, 256};

/* Consecutive steps per timed in-process run, tokens fed back as a
 * GENERATE loop does. */
#define INPROC_STEPS 32

/* In-process tokens/s at each batch: [0] with logits to host, [1] greedy only. */
static int in_process(const char *dir, double out[4][2]) {
  mbd_error err = {0};
  mbd_gpu_ctx_config cc;
  mbd_gpu_ctx_config_default(&cc);
  cc.policy = MBD_POLICY_BF16;
  cc.state_capacity = 512 + 256; /* as the worker: sessions + forward slots */
  mbd_gpu_ctx *ctx = NULL;
  mbd_mamba1_gpu *m = NULL;
  if (mbd_gpu_ctx_new(&cc, &ctx, &err)) goto fail;
  mbd_mamba1_gpu_options o;
  mbd_mamba1_gpu_options_default(&o);
  o.dtype = MBD_DTYPE_BF16;
  o.max_batch = 256;
  if (mbd_mamba1_gpu_load(ctx, dir, &o, &m, &err)) goto fail;
  int V = mbd_mamba1_gpu_config(m)->vocab_size;
  float *logits = malloc((size_t)256 * (size_t)V * sizeof(float));
  int32_t tok[256], sl[256];
  for (int i = 0; i < 256; i++) tok[i] = (i * 131) % V, sl[i] = i;
  for (int k = 0; k < 4; k++) {
    int b = k_batches[k];
    for (int mode = 0; mode < 2; mode++) {
      double t[9];
      for (int r = -2; r < 9; r++) {
        double t0 = wh_now();
        for (int st = 0; st < INPROC_STEPS; st++)
          if (mbd_mamba1_gpu_step(m, b, tok, sl, NULL, mode ? tok : NULL, mode ? NULL : logits,
                                  &err))
            goto fail;
        if (r >= 0) t[r] = wh_now() - t0;
      }
      out[k][mode] = (double)b * INPROC_STEPS / quantile_of(t, 9, 0.5);
    }
  }
  free(logits);
  mbd_mamba1_gpu_destroy(&m);
  mbd_gpu_ctx_destroy(&ctx);
  return 0;
fail:
  fprintf(stderr, "in-process: %s\n", err.msg);
  mbd_mamba1_gpu_destroy(&m);
  mbd_gpu_ctx_destroy(&ctx);
  return -1;
}

static uint64_t send_gen(wh *h, const char *sid, int64_t n) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3);
  mbd_pack_kv_str(&p.pk, "session", sid);
  mbd_pack_kv_i64(&p.pk, "max_tokens", n);
  mbd_pack_kv_i64(&p.pk, "partial_every", 16);
  return wh_send(h, MBD_CMD_GENERATE, &p.sb, 0, NULL, NULL);
}

/* Aggregate tokens/s of n sessions generating G tokens each at once. */
static double service_tps(wh *h, int n, int G, int V) {
  char (*sid)[64] = calloc((size_t)n, 64);
  mbd_msg **r = calloc((size_t)n, sizeof *r);
  double t[3] = {0};
  uint64_t tg = h->next_tag;
  for (int i = 0; i < n; i++) wh_send_open(h);
  if (wh_collect(h, tg, (size_t)n, r, 60000)) return 0;
  for (int i = 0; i < n; i++) wh_str(r[i], "session", sid[i], 64);
  wh_free_all(r, (size_t)n);
  int64_t ids[8];
  tg = h->next_tag;
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 8; k++) ids[k] = (i * 8 + k * 977) % V;
    wh_send_prefill(h, sid[i], ids, 8, true);
  }
  if (wh_collect(h, tg, (size_t)n, r, 60000)) return 0;
  wh_free_all(r, (size_t)n);
  for (int rep = 0; rep < 3; rep++) {
    tg = h->next_tag;
    double t0 = wh_now();
    for (int i = 0; i < n; i++) send_gen(h, sid[i], G);
    size_t miss = wh_collect(h, tg, (size_t)n, r, 300000);
    t[rep] = wh_now() - t0;
    for (int i = 0; i < n; i++)
      if (!r[i] || wh_code(r[i])) miss++;
    wh_free_all(r, (size_t)n);
    if (miss) {
      fprintf(stderr, "service: %zu generate requests failed at n=%d\n", miss, n);
      return 0;
    }
  }
  for (int i = 0; i < n; i++) {
    wh_pack k;
    wh_pack_init(&k);
    msgpack_pack_map(&k.pk, 1);
    mbd_pack_kv_str(&k.pk, "session", sid[i]);
    wh_send(h, MBD_CMD_CLOSE, &k.sb, 0, NULL, NULL);
  }
  tg = h->next_tag - (uint64_t)n;
  wh_collect(h, tg, (size_t)n, r, 60000);
  wh_free_all(r, (size_t)n);
  free(sid);
  free(r);
  return (double)n * G / quantile_of(t, 3, 0.5);
}

/* Workers the broker lists (STATUS), or -1. */
static int worker_count(wh *h) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  mbd_msg *m = wh_call(h, MBD_CMD_STATUS, &p.sb, 0, NULL, NULL);
  int n = -1;
  if (m && mbd_msg_cmd(m) == MBD_CMD_FINAL) {
    mbd_body *b = wh_body(m);
    const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
    n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? (int)ws->via.array.size : 0;
    mbd_body_destroy(&b);
  }
  mbd_msg_destroy(&m);
  return n;
}

/* The sessions table: service tok/s at each batch next to in-process. */
static void sessions_table(wh *h, const mbd_mamba_config *cfg, int G, double inproc[4][2]) {
  printf("%8s | %14s | %14s | %14s | %9s | %9s\n", "sessions", "service tok/s", "in-proc logits",
         "in-proc greedy", "svc/logits", "svc/greedy");
  for (int k = 0; k < 4; k++) {
    double s = service_tps(h, k_batches[k], G, cfg->vocab_size);
    printf("%8d | %14.0f | %14.0f | %14.0f | %8.1f%% | %8.1f%%\n", k_batches[k], s, inproc[k][0],
           inproc[k][1], 100 * s / inproc[k][0], 100 * s / inproc[k][1]);
    fflush(stdout);
  }
}

/* Median seconds per GEMM request (A [M,1024] bf16, B [8,1024]) inline or
 * IPC; *first gets the IPC request that opened the handle. */
static double gemm_cost(wh *h, const char *host, int64_t M, bool ipc, int reps, double *first) {
  const int64_t K = 1024, N = 8;
  size_t na = (size_t)(M * K) * 2, nb = (size_t)(N * K) * 2;
  uint16_t *a = malloc(na), *b = malloc(nb);
  uint64_t s = 3;
  for (size_t i = 0; i < na / 2; i++) a[i] = (uint16_t)(0x3c00 | (sg_rng(&s) & 0x3ff)); /* ~1..2 */
  for (size_t i = 0; i < nb / 2; i++) b[i] = (uint16_t)(0x3c00 | (sg_rng(&s) & 0x3ff));
  void *dmem = NULL;
  mbd_tensor_ref ra, rb;
  int64_t as[2] = {M, K}, bs[2] = {N, K};
  if (ipc) {
    mbd_error e = {0};
    mbd_tensor_desc ad, bd;
    mbd_tensor_desc_make(&ad, MBD_DTYPE_BF16, 2, as, NULL);
    mbd_tensor_desc_make(&bd, MBD_DTYPE_BF16, 2, bs, NULL);
    if (cudaMalloc(&dmem, na + nb) != cudaSuccess) return 0;
    cudaMemcpy(dmem, a, na, cudaMemcpyHostToDevice);
    cudaMemcpy((char *)dmem + na, b, nb, cudaMemcpyHostToDevice);
    if (mbd_cuda_ipc_ref(dmem, na + nb, 0, &ad, "a", NULL, &ra, &e) ||
        mbd_cuda_ipc_ref(dmem, na + nb, na, &bd, "b", NULL, &rb, &e)) {
      fprintf(stderr, "ipc ref: %s\n", e.msg);
      return 0;
    }
  }
  double t[32];
  for (int r = -1; r < reps; r++) {
    wh_pack p;
    wh_pack_init(&p);
    msgpack_pack_map(&p.pk, ipc ? 3 : 2);
    mbd_pack_kv_str(&p.pk, "dtype", "bf16");
    if (ipc) mbd_pack_kv_str(&p.pk, "host_id", host);
    mbd_pack_str(&p.pk, "tensors");
    msgpack_pack_array(&p.pk, 2);
    double t0 = wh_now();
    mbd_msg *m;
    if (ipc) {
      mbd_pack_tensor_ref(&p.pk, &ra);
      mbd_pack_tensor_ref(&p.pk, &rb);
      m = wh_call(h, MBD_CMD_GEMM, &p.sb, 0, NULL, NULL);
    } else {
      wh_ref(&p.pk, "a", "bf16", 2, as, 0);
      wh_ref(&p.pk, "b", "bf16", 2, bs, 1);
      const void *pl[2] = {a, b};
      size_t lens[2] = {na, nb};
      m = wh_call(h, MBD_CMD_GEMM, &p.sb, 2, pl, lens);
    }
    double dt = wh_now() - t0;
    if (!m || wh_code(m)) {
      mbd_msg_destroy(&m);
      return 0;
    }
    mbd_msg_destroy(&m);
    if (r < 0) {
      if (first) *first = dt;
    } else {
      t[r] = dt;
    }
  }
  if (dmem) cudaFree(dmem);
  free(a);
  free(b);
  return quantile_of(t, reps, 0.5);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_service_gpu BIN_DIR MODEL_DIR [gen_tokens]\n");
    return 2;
  }
  if (sg_device_count() < 1) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  int G = argc > 3 ? atoi(argv[3]) : 512;
  double inproc[4][2];
  if (in_process(argv[2], inproc)) return 1;
  mbd_mamba_config cfg;
  char cp[1100];
  snprintf(cp, sizeof cp, "%s/config.json", argv[2]);
  mbd_error err = {0};
  if (mbd_mamba_config_load(cp, &cfg, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  wh h;
  memset(&h, 0, sizeof h);
  snprintf(h.bin, sizeof h.bin, "%s", argv[1]);
  snprintf(h.model_dir, sizeof h.model_dir, "%s", argv[2]);
  snprintf(h.dir, sizeof h.dir, "/tmp/mbd-bench-XXXXXX");
  if (!mkdtemp(h.dir)) return 1;
  snprintf(h.clients, sizeof h.clients, "ipc://%s/clients", h.dir);
  snprintf(h.workers, sizeof h.workers, "ipc://%s/workers", h.dir);
  h.next_tag = 1;
  h.client_inflight = "100000"; /* this one client sends the traffic of many */
  wh_start_broker(&h);
  wh_start_worker(&h, "gpu0", "--device", "cuda:0", "--dtype", "bf16", "--capacity", "512",
                  "--client-sessions", "512",
                  "--max-batch", "256", "--max-message-mb", "1024", NULL);
  if (wh_wait_workers(&h, 1, 120000)) {
    fprintf(stderr, "worker did not register\n");
    wh_fini(&h);
    return 1;
  }
  printf("Mamba-1 d%d L%d V%d bf16, deterministic, %d generated tokens per session\n",
         cfg.d_model, cfg.n_layer, cfg.vocab_size, G);
  sessions_table(&h, &cfg, G, inproc);
  char host[128];
  mbd_client_host_id(host, sizeof host);
  printf("\nGEMM request cost, A [M,1024] bf16 x B [8,1024]: inline frames vs CUDA IPC inputs\n");
  printf("%10s | %12s | %12s | %16s\n", "A bytes", "inline ms", "IPC ms", "IPC first (open)");
  const int64_t Ms[3] = {2, 512, 131072};
  const char *names[3] = {"4 KiB", "1 MiB", "256 MiB"};
  for (int k = 0; k < 3; k++) {
    int reps = k == 2 ? 5 : 30;
    double first = 0;
    double in = gemm_cost(&h, host, Ms[k], false, reps, NULL);
    double ip = gemm_cost(&h, host, Ms[k], true, reps, &first);
    printf("%10s | %12.3f | %12.3f | %16.3f\n", names[k], in * 1e3, ip * 1e3, first * 1e3);
    fflush(stdout);
  }
  /* The same worker without step overlap, alone on the device (the first
   * one gone from the broker's list before it starts). */
  wh_stop(h.procs[0], SIGTERM);
  h.procs[0] = 0;
  for (int i = 0; i < 100 && worker_count(&h) != 0; i++) ev_nap_ms(100);
  wh_start_worker(&h, "gpu1", "--device", "cuda:0", "--dtype", "bf16", "--capacity", "512",
                  "--client-sessions", "512", "--max-batch", "256", "--max-message-mb", "1024",
                  "--overlap-steps", "0", NULL);
  if (wh_wait_workers(&h, 1, 120000)) {
    fprintf(stderr, "the --overlap-steps 0 worker did not register\n");
    wh_fini(&h);
    return 1;
  }
  printf("\nThe same, worker --overlap-steps 0 (replies before the next step is launched)\n");
  sessions_table(&h, &cfg, G, inproc);
  wh_fini(&h);
  return 0;
}
