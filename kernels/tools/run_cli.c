/* mambad-run: runs a model in this process on a file of token ids, or on text.
 *   mambad-run --model DIR --input IN.safetensors --output OUT.safetensors
 *   mambad-run --model DIR (--prompt TEXT | --prompt-file F) [--tokenizer FILE|DIR]
 *              [--add-special-tokens] [--skip-special-tokens] [--quiet] [--output OUT]
 *              [--backend cpu|cuda|cuda:N] [--dtype f32|tf32|bf16|f16]
 *              [--gemm-mode deterministic|cublas-fast|cublas-pedantic]
 *              [--threads N] [--isa auto|portable|avx2]
 *              [--generate N] [--temperature T --top-k K --top-p P --seed S] [--stop ID]...
 * IN holds input_ids I64 [B,T]; OUT gets logits F32 [B,T,V] and, with
 * --generate, tokens I64 [B,T+N] (greedy unless --temperature > 0; every row
 * samples with the same seed, so a row's tokens do not depend on its slot;
 * after a --stop token the row is padded with -1). With --prompt the text is
 * encoded with DIR's tokenizer.json (or --tokenizer) as `mambad generate
 * --prompt` does (common/tokenizer/text_stream.h) and the generated text
 * streams to stdout as tokens are picked. Compute goes through the
 * backend interface (kernels/backend.h) only, as in the worker: the same
 * backend, model family and route for `--backend cpu` and `cuda:N`.
 * Exit 0 ok, 1 error, 2 usage. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/route.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/tokenizer/text_stream.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/model/sampler.h"

#define MAX_STOP 64
/* On cuda:N the context is sized like a default `mambad worker --device
 * cuda:N` (--capacity 64, --max-batch 64), so on the same device, build, GEMM
 * mode and dtype the route id is the worker's: its bits are the service's. */
#define RUN_CUDA_SESSIONS 64
#define RUN_CUDA_BATCH 64

static void usage(FILE *f) {
  fprintf(f,
          "usage: mambad-run --model DIR --input IN.safetensors --output OUT.safetensors\n"
          "       mambad-run --model DIR (--prompt TEXT | --prompt-file F) [--tokenizer FILE|DIR]\n"
          "                  [--add-special-tokens] [--skip-special-tokens] [--quiet]\n"
          "                  [--output OUT.safetensors]   (and the options below)\n"
          "                  [--backend cpu|cuda|cuda:N] [--dtype f32|tf32|bf16|f16]\n"
          "                  [--gemm-mode deterministic|cublas-fast|cublas-pedantic]\n"
          "                  [--state-dtype f32|bf16]\n"
          "                  [--threads N] [--isa auto|portable|avx2] [--generate N | --max-tokens N]\n"
          "                  [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop ID]...\n"
          "  IN:  input_ids I64 [B,T] (e.g. from `mambad-model prompt`)\n"
          "  OUT: logits F32 [B,T,V]; with --generate N also tokens I64 [B,T+N]\n"
          "       (greedy unless --temperature > 0; rows after a --stop token are padded with -1)\n"
          "  DIR: Hugging Face checkpoint (config.json + model.safetensors or its shards)\n"
          "  --prompt TEXT / --prompt-file F (its bytes as they are): encoded with DIR's\n"
          "       tokenizer.json (or --tokenizer); generates --generate N tokens (default 16)\n"
          "       and streams their text to stdout (--quiet: not); OUT as above, B = 1\n"
          "  cpu: --dtype f32|bf16|f16, --gemm-mode deterministic, --threads/--isa apply\n"
          "  cuda:N (cuda = cuda:0): every --dtype and --gemm-mode; greedy tokens are\n"
          "       picked on the device, sampled ones by the CPU sampler\n"
          "  --state-dtype bf16: Mamba-2 on cuda only, its own route (docs/route.md)\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_ll(const char *flag, const char *s, long long lo, long long hi, long long *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s ? s : "", &end, 10);
  if (!s || !*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "mambad-run: %s needs an integer in [%lld, %lld], got '%s'\n", flag, lo, hi,
            s ? s : "(nothing)");
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_f(const char *flag, const char *s, float *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s ? s : "", &end);
  if (!s || !*s || *end || errno || !isfinite(v)) {
    fprintf(stderr, "mambad-run: %s needs a number, got '%s'\n", flag, s ? s : "(nothing)");
    return -1;
  }
  *out = (float)v;
  return 0;
}


/* --backend cpu | cuda | cuda:N (cuda = cuda:0); -1 with a message when bad. */
static int parse_backend(const char *s, mbd_backend_kind *kind, int *device) {
  long long d = 0;
  mbd_error err = {0};
  if (s && !strncmp(s, "cuda:", 5)) {
    if (parse_ll("--backend cuda:N", s + 5, 0, 1023, &d)) return -1;
    *kind = MBD_BACKEND_CUDA;
  } else if (mbd_backend_parse(s, kind, &err)) {
    fprintf(stderr, "mambad-run: --backend must be cpu, cuda or cuda:N (got '%s')\n",
            s ? s : "(nothing)");
    return -1;
  }
  *device = (int)d;
  return 0;
}

/* What a run does after the prefill. */
typedef struct run_gen {
  int64_t n_new;         /* tokens per row; 0 = prefill only */
  mbd_sampling sampling; /* temperature <= 0: greedy */
  const int32_t *stop;   /* stop tokens (kept in the output) */
  int nstop;
  /* Optional: called with each token as it is picked (row, in step order). */
  void (*on_token)(void *user, int64_t row, int32_t tok);
  void *user;
} run_gen;

static int is_stop(const run_gen *g, int32_t tok) {
  for (int i = 0; i < g->nstop; i++)
    if (g->stop[i] == tok) return 1;
  return 0;
}

/* Scratch of one chunk's generation loop, indexed by position in the active
 * list (rows leave it at a stop token; the others' bits do not change). */
typedef struct gen_scratch {
  int64_t *row;        /* [chunk] chunk row of each active entry */
  mbd_bstate **st;     /* [chunk] its state */
  int64_t *feed;       /* [chunk] token fed by the next step */
  int64_t *next;       /* [chunk] device-picked tokens of the last step (greedy) */
  float *logits;       /* [chunk, V] last step's logits (when picked on the host) */
} gen_scratch;

/* Generates for the n rows of one chunk whose states st[n] are just past their
 * prompts; first[i * first_stride] are row i's next-token logits. Greedy rows
 * take the backend's own pick (step_greedy) where it has one; otherwise every
 * token is picked by the sampler from the step's logits, so the tokens are
 * the same on every backend whose logits are. */
static int gen_chunk(mbd_backend *b, mbd_bmodel *m, int64_t n, mbd_bstate *const *st,
                     const run_gen *g, const float *first, int64_t first_stride,
                     mbd_sampler *smp, gen_scratch *s, int32_t *gen, mbd_error *err) {
  const int64_t N = g->n_new, V = b->ops->model_vocab(m);
  const int device_pick = g->sampling.temperature <= 0.0f && b->ops->step_greedy;
  int64_t nact = n;
  int rc;
  for (int64_t i = 0; i < n; i++) {
    s->row[i] = i;
    s->st[i] = st[i];
  }
  for (int64_t step = 0; step < N && nact > 0; step++) {
    int64_t k = 0;
    for (int64_t i = 0; i < nact; i++) {
      int32_t tok;
      if (step == 0 || !device_pick) {
        const float *l = step == 0 ? first + s->row[i] * first_stride : s->logits + i * V;
        if ((rc = mbd_sampler_pick(smp, &g->sampling, (uint64_t)step, l, &tok, err))) return rc;
      } else {
        tok = (int32_t)s->next[i];
      }
      gen[s->row[i] * N + step] = tok;
      if (g->on_token) g->on_token(g->user, s->row[i], tok);
      if (is_stop(g, tok)) continue; /* the rest of the row stays -1 */
      s->row[k] = s->row[i];
      s->st[k] = s->st[i];
      s->feed[k++] = tok;
    }
    nact = k;
    if (step + 1 < N && nact > 0 &&
        (rc = device_pick ? b->ops->step_greedy(b, m, s->st, s->feed, nact, s->next, NULL, err)
                          : b->ops->step(b, m, s->st, s->feed, nact, s->logits, err)))
      return rc;
  }
  return MBD_OK;
}

/* Runs ids [B,T] from zero states in chunks of `chunk` rows (chunking changes
 * no bits: batch invariance): logits [B,T,V] and, when g->n_new > 0, gen
 * [B, n_new] (-1 after a stop token). */
static int run(mbd_backend *b, mbd_bmodel *m, int64_t B, int64_t T, int64_t chunk,
               const int64_t *ids, const run_gen *g, float *logits, int32_t *gen,
               double *t_prefill, double *t_gen, mbd_error *err) {
  const int64_t V = b->ops->model_vocab(m), N = g->n_new;
  int rc = MBD_OK;
  mbd_sampler *smp = NULL;
  mbd_bstate **st = calloc((size_t)chunk, sizeof *st); /* NULL entries are fine for state_free */
  gen_scratch s = {.row = malloc((size_t)chunk * sizeof *s.row),
                   .st = malloc((size_t)chunk * sizeof *s.st),
                   .feed = malloc((size_t)chunk * sizeof *s.feed),
                   .next = malloc((size_t)chunk * sizeof *s.next)};
  if (!st || !s.row || !s.st || !s.feed || !s.next) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld states", (long long)chunk);
    goto fail;
  }
  if (N > 0) {
    if ((rc = mbd_sampler_new(V, &smp, err))) goto fail;
    if (!(s.logits = malloc((size_t)chunk * (size_t)V * sizeof(float)))) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld x %lld step logits",
                         (long long)chunk, (long long)V);
      goto fail;
    }
    for (int64_t i = 0; i < B * N; i++) gen[i] = -1;
  }
  for (int64_t r0 = 0; r0 < B && !rc; r0 += chunk) {
    int64_t n = B - r0 < chunk ? B - r0 : chunk;
    float *lg = logits + r0 * T * V;
    double t0 = now_s();
    for (int64_t i = 0; i < n && !rc; i++) rc = b->ops->state_new(b, m, &st[i], err);
    if (!rc) rc = mbd_backend_prefill_batch(b, m, st, n, ids + r0 * T, T, false, lg, err);
    double t1 = now_s();
    *t_prefill += t1 - t0;
    if (!rc && N > 0)
      rc = gen_chunk(b, m, n, st, g, lg + (T - 1) * V, T * V, smp, &s, gen + r0 * N, err);
    *t_gen += now_s() - t1;
    for (int64_t i = 0; i < n; i++) {
      b->ops->state_free(b, st[i]);
      st[i] = NULL;
    }
  }
fail:
  free(s.logits);
  free(s.next);
  free(s.feed);
  free(s.st);
  free(s.row);
  free(st);
  mbd_sampler_destroy(&smp);
  return rc;
}

/* --prompt: each picked token's text, streamed (run_gen.on_token). */
static void stream_token(void *user, int64_t row, int32_t tok) {
  int64_t id = tok;
  mbd_error err = {0};
  (void)row;
  if (mbd_text_stream_push(user, &id, 1, &err)) fprintf(stderr, "mambad-run: %s\n", err.msg);
}

int main(int argc, char **argv) {
  const char *model_dir = NULL, *in_path = NULL, *out_path = NULL, *backend = "cpu";
  const char *dts = "f32", *sds = "f32", *isas = "auto", *modes = NULL;
  const char *prompt = NULL, *prompt_file = NULL, *tok_path = NULL;
  int add_special = 0, skip_special = 0, quiet = 0;
  long long threads = 0, n_gen = -1, top_k = 0, seed = 0;
  float temperature = 0.0f, top_p = 1.0f;
  int32_t stop[MAX_STOP];
  int nstop = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0, takes = 1;
    long long tmp;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--model")) model_dir = v;
    else if (!strcmp(a, "--input")) in_path = v;
    else if (!strcmp(a, "--output")) out_path = v;
    else if (!strcmp(a, "--backend")) backend = v;
    else if (!strcmp(a, "--dtype")) dts = v;
    else if (!strcmp(a, "--state-dtype")) sds = v;
    else if (!strcmp(a, "--gemm-mode")) modes = v;
    else if (!strcmp(a, "--isa")) isas = v;
    else if (!strcmp(a, "--threads")) bad = parse_ll(a, v, 0, 256, &threads);
    else if (!strcmp(a, "--generate") || !strcmp(a, "--max-tokens"))
      bad = parse_ll(a, v, 0, 1 << 20, &n_gen);
    else if (!strcmp(a, "--prompt")) prompt = v;
    else if (!strcmp(a, "--prompt-file")) prompt_file = v;
    else if (!strcmp(a, "--tokenizer")) tok_path = v;
    else if (!strcmp(a, "--add-special-tokens")) add_special = 1, takes = 0;
    else if (!strcmp(a, "--skip-special-tokens")) skip_special = 1, takes = 0;
    else if (!strcmp(a, "--quiet")) quiet = 1, takes = 0;
    else if (!strcmp(a, "--top-k")) bad = parse_ll(a, v, 0, 1 << 30, &top_k);
    else if (!strcmp(a, "--seed")) bad = parse_ll(a, v, 0, INT64_MAX, &seed);
    else if (!strcmp(a, "--temperature")) bad = parse_f(a, v, &temperature);
    else if (!strcmp(a, "--top-p")) bad = parse_f(a, v, &top_p);
    else if (!strcmp(a, "--stop")) {
      bad = parse_ll(a, v, 0, INT32_MAX, &tmp);
      if (!bad && nstop == MAX_STOP) {
        fprintf(stderr, "mambad-run: at most %d --stop tokens\n", MAX_STOP);
        bad = 1;
      }
      if (!bad) stop[nstop++] = (int32_t)tmp;
    } else {
      fprintf(stderr, "mambad-run: unknown argument '%s' (see --help)\n", a);
      return 2;
    }
    if (takes && !v && !bad) {
      fprintf(stderr, "mambad-run: %s needs a value\n", a);
      return 2;
    }
    if (bad) return 2;
    i += takes;
  }
  const int text = prompt || prompt_file;
  if (!model_dir || !in_path == !text || (prompt && prompt_file) || (in_path && !out_path)) {
    fprintf(stderr, "mambad-run: --model and either --input with --output, or one of --prompt, "
                    "--prompt-file are required (see --help)\n");
    return 2;
  }
  if (!text && (tok_path || add_special || skip_special || quiet)) {
    fprintf(stderr, "mambad-run: --tokenizer, --add-special-tokens, --skip-special-tokens and "
                    "--quiet go with --prompt or --prompt-file\n");
    return 2;
  }
  if (n_gen < 0) n_gen = text ? 16 : 0; /* as `mambad generate` */
  mbd_error err = {0};
  mbd_backend_kind kind = MBD_BACKEND_CPU;
  mbd_dtype_policy policy = MBD_POLICY_F32;
  mbd_gemm_mode mode = MBD_GEMM_DETERMINISTIC;
  int device = 0;
  if (parse_backend(backend, &kind, &device)) return 2;
  if (mbd_dtype_policy_parse(dts, &policy, &err)) {
    fprintf(stderr, "mambad-run: --dtype: %s\n", err.msg);
    return 2;
  }
  if (mbd_gemm_mode_resolve(modes, &mode, &err)) {
    fprintf(stderr, "mambad-run: %s\n", err.msg);
    return 2;
  }
  mbd_state_dtype sdt = MBD_STATE_F32;
  if (mbd_state_dtype_parse(sds, &sdt, &err)) {
    fprintf(stderr, "mambad-run: --state-dtype: %s\n", err.msg);
    return 2;
  }
  mbd_backend_opts opts = {.mode = mode, .policy = policy, .state = sdt, .device = device};
  if (kind == MBD_BACKEND_CUDA) {
#ifndef MBD_HAVE_CUDA
    fprintf(stderr, "mambad-run: this build has no CUDA backend (it was configured without the "
                    "CUDA toolkit; rebuild with -DMBD_CUDA=ON where nvcc exists) - use --backend "
                    "cpu\n");
    return 2;
#endif
  } else {
    if (mode != MBD_GEMM_DETERMINISTIC) {
      fprintf(stderr, "mambad-run: --gemm-mode %s needs --backend cuda: the cpu backend runs "
                      "only deterministic (valid: deterministic, cublas-fast, cublas-pedantic)\n",
              mbd_gemm_mode_name(mode));
      return 2;
    }
    if (policy == MBD_POLICY_TF32) {
      fprintf(stderr, "mambad-run: --dtype tf32 needs --backend cuda: the cpu backend runs f32, "
                      "bf16 or f16\n");
      return 2;
    }
  }
  if (!strcmp(isas, "auto")) opts.isa = MBD_CPU_ISA_AUTO;
  else if (!strcmp(isas, "portable")) opts.isa = MBD_CPU_ISA_PORTABLE;
  else if (!strcmp(isas, "avx2")) opts.isa = MBD_CPU_ISA_AVX2;
  else {
    fprintf(stderr, "mambad-run: --isa must be auto, portable or avx2 (got '%s')\n", isas);
    return 2;
  }
  opts.threads = (int)threads;
  mbd_progress_opts progress; /* large checkpoints: a line every 256 MiB or 5 s on stderr */
  mbd_progress_opts_init(&progress, mbd_progress_print, stderr);
  opts.progress = &progress;
  run_gen g = {.n_new = n_gen, .stop = stop, .nstop = nstop};
  g.sampling.temperature = temperature;
  g.sampling.top_k = (int)top_k;
  g.sampling.top_p = top_p;
  g.sampling.seed = (uint64_t)seed;
  if (mbd_sampling_check(&g.sampling, &err)) {
    fprintf(stderr, "mambad-run: %s\n", err.msg);
    return 2;
  }

  int rc = 1;
  mbd_tokenizer *tok = NULL;
  mbd_text_stream *text_out = NULL;
  int64_t *prompt_ids = NULL;
  size_t n_prompt = 0;
  const int64_t *src = NULL; /* input_ids [B,T], little-endian i64 (maybe unaligned) */
  mbd_safetensors *in = NULL;
  mbd_backend *be = NULL;
  mbd_bmodel *m = NULL;
  int64_t *ids = NULL, *tokens_out = NULL;
  int32_t *gen = NULL;
  float *logits = NULL;
  mbd_st_writer *w = NULL;
  int64_t B = 0, T = 0, V = 0, chunk = 0;
  char label[192] = "", devs[16] = "", route_id[65] = "";
  mbd_route_identity route;
  if (text) {
    const char *tp = tok_path ? tok_path : model_dir;
    if (mbd_tokenizer_load(tp, &tok, &err) ||
        mbd_text_prompt_ids(tok, prompt, prompt_file, add_special, &prompt_ids, &n_prompt, &err) ||
        mbd_text_stream_new(tok, skip_special, quiet ? NULL : stdout, &text_out, &err)) {
      fprintf(stderr, "mambad-run: %s%s\n", err.msg,
              tok || tok_path ? "" : "; give --tokenizer FILE|DIR");
      goto done;
    }
    B = 1;
    T = (int64_t)n_prompt;
    src = prompt_ids;
  } else {
    const mbd_st_entry *e = mbd_safetensors_open(in_path, &in, &err)
                                ? NULL : mbd_safetensors_find(in, "input_ids");
    if (!in) {
      fprintf(stderr, "mambad-run: %s\n", err.msg);
      goto done;
    }
    if (!e || e->desc.dtype != MBD_DTYPE_I64 || e->desc.ndim != 2 || e->desc.shape[0] < 1 ||
        e->desc.shape[1] < 1) {
      char d[96] = "absent";
      if (e) mbd_tensor_desc_format(&e->desc, d, sizeof(d));
      fprintf(stderr, "mambad-run: %s: need input_ids i64[B,T] with B, T >= 1, found %s\n",
              in_path, d);
      goto done;
    }
    B = e->desc.shape[0];
    T = e->desc.shape[1];
    src = e->data;
  }
  if (B > 1 << 16 || T > 1 << 28) {
    fprintf(stderr, "mambad-run: input_ids [%lld, %lld] too large (max batch 65536, max length "
                    "2^28)\n", (long long)B, (long long)T);
    goto done;
  }
  /* cpu: every row in one batch; cuda:N: the default worker's sizes. */
  chunk = kind == MBD_BACKEND_CPU ? B : RUN_CUDA_BATCH;
  opts.state_capacity = kind == MBD_BACKEND_CPU ? B : RUN_CUDA_SESSIONS;
  opts.max_batch = (int)chunk;
  double t0 = now_s();
  if (mbd_backend_new(kind, &opts, &be, &err) || be->ops->model_load(be, model_dir, &m, &err)) {
    fprintf(stderr, "mambad-run: %s\n", err.msg); /* a device error names cuda:N */
    goto done;
  }
  double t_load = now_s() - t0;
  V = be->ops->model_vocab(m);
  be->ops->route(be, &route);
  mbd_route_id_hex(&route, route_id);
  if (kind == MBD_BACKEND_CPU) {
    snprintf(label, sizeof label, "cpu %s %s", mbd_dtype_policy_name(policy), route.isa);
  } else {
    snprintf(devs, sizeof devs, "cuda:%d", device);
    snprintf(label, sizeof label, "%s (%s) %s %s, state %s, route %.12s", devs,
             route.device_name, mbd_dtype_policy_name(policy), mbd_gemm_mode_name(mode),
             mbd_state_dtype_name(route.state), route_id);
  }
  ids = malloc((size_t)(B * T) * sizeof *ids);
  logits = malloc((size_t)B * (size_t)T * (size_t)V * sizeof(float));
  if (!ids || !logits) {
    fprintf(stderr, "mambad-run: out of memory for batch %lld x %lld x vocab %lld logits\n",
            (long long)B, (long long)T, (long long)V);
    goto done;
  }
  for (int64_t i = 0; i < B * T; i++) {
    memcpy(&ids[i], (const char *)src + 8 * i, 8);
    if (ids[i] < 0 || ids[i] >= V) {
      fprintf(stderr, "mambad-run: input_ids[%lld][%lld] = %lld is outside the vocabulary [0, %lld)\n",
              (long long)(i / T), (long long)(i % T), (long long)ids[i], (long long)V);
      goto done;
    }
  }
  if (n_gen > 0) {
    gen = malloc((size_t)(B * n_gen) * sizeof(int32_t));
    tokens_out = malloc((size_t)(B * (T + n_gen)) * sizeof(int64_t));
    if (!gen || !tokens_out) {
      fprintf(stderr, "mambad-run: out of memory for generated tokens\n");
      goto done;
    }
  }
  double t_prefill = 0, t_gen = 0;
  if (text_out) {
    g.on_token = stream_token;
    g.user = text_out;
  }
  if (run(be, m, B, T, chunk, ids, &g, logits, gen, &t_prefill, &t_gen, &err)) {
    fprintf(stderr, "mambad-run: %s\n", err.msg);
    goto done;
  }
  if (text_out) {
    int stopped = n_gen > 0 && (gen[n_gen - 1] == -1 || is_stop(&g, gen[n_gen - 1]));
    if (mbd_text_stream_finish(text_out, &err)) fprintf(stderr, "mambad-run: %s\n", err.msg);
    if (!quiet) putchar('\n');
    fflush(stdout); /* the text ahead of the summary on stderr */
    fprintf(stderr, "(%s)\n", stopped ? "stop" : "length");
  }
  for (int64_t b = 0; b < B && n_gen > 0; b++) {
    for (int64_t t = 0; t < T; t++) tokens_out[b * (T + n_gen) + t] = ids[b * T + t];
    for (int64_t k = 0; k < n_gen; k++) tokens_out[b * (T + n_gen) + T + k] = gen[b * n_gen + k];
  }
  mbd_tensor_desc dl, dt;
  int64_t sl[3] = {B, T, V}, stok[2] = {B, T + n_gen};
  int werr = mbd_tensor_desc_make(&dl, MBD_DTYPE_F32, 3, sl, &err) || mbd_st_writer_new(&w, &err) ||
             mbd_st_writer_add(w, "logits", &dl, logits, &err) ||
             (n_gen > 0 && (mbd_tensor_desc_make(&dt, MBD_DTYPE_I64, 2, stok, &err) ||
                            mbd_st_writer_add(w, "tokens", &dt, tokens_out, &err))) ||
             mbd_st_writer_set_metadata(w, "backend", mbd_backend_name(kind), &err) ||
             mbd_st_writer_set_metadata(w, "dtype", mbd_dtype_policy_name(policy), &err) ||
             mbd_st_writer_set_metadata(w, "gemm_mode", mbd_gemm_mode_name(mode), &err);
  if (!werr && kind == MBD_BACKEND_CPU)
    werr = mbd_st_writer_set_metadata(w, "isa", route.isa, &err);
  if (!werr && kind == MBD_BACKEND_CUDA)
    werr = mbd_st_writer_set_metadata(w, "route_id", route_id, &err) ||
           mbd_st_writer_set_metadata(w, "device", devs, &err) ||
           mbd_st_writer_set_metadata(w, "device_name", route.device_name, &err);
  if (werr || (out_path && mbd_st_writer_write(w, out_path, &err))) {
    fprintf(stderr, "mambad-run: writing %s: %s\n", out_path, err.msg);
    goto done;
  }
  fprintf(stderr, "mambad-run: %s: load %.2fs, prefill %lldx%lld in %.3fs (%.1f tok/s)%s", label,
          t_load, (long long)B, (long long)T, t_prefill,
          (double)(B * T) / (t_prefill > 0 ? t_prefill : 1e-9), n_gen > 0 ? "" : "\n");
  if (n_gen > 0)
    fprintf(stderr, ", generated %lldx%lld in %.3fs (%.1f tok/s)\n", (long long)B,
            (long long)n_gen, t_gen, (double)(B * n_gen) / (t_gen > 0 ? t_gen : 1e-9));
  rc = 0;
done:
  mbd_st_writer_destroy(&w);
  free(logits);
  free(tokens_out);
  free(gen);
  free(ids);
  if (m) be->ops->model_destroy(be, m);
  mbd_backend_destroy(&be);
  mbd_safetensors_destroy(&in);
  mbd_text_stream_destroy(&text_out);
  mbd_tokenizer_destroy(&tok);
  free(prompt_ids);
  return rc;
}
