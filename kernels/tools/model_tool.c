/* mambad-model: synthetic Mamba-1 checkpoints and prompt files.
 *   mambad-model synth --shape 130m|370m|1.4b|2.8b|custom --out DIR
 *                      [--dtype f32|bf16|f16] [--seed S] [--d-model D --layers L --vocab V]
 *   mambad-model synth --family mamba2 --shape 130m|370m|780m|1.3b|2.7b|custom ...
 *   mambad-model prompt --out IN.safetensors --batch B --len T --vocab V [--seed S]
 * A tool: fails fast with a message and exit code 2 (usage) or 1 (error). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/model/mamba2.h"
#include "kernels/model/mamba3_synth.h"
#include "kernels/model/synth.h"
#include "kernels/model/synth_tokenizer.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage:\n"
          "  mambad-model synth --shape 130m|370m|1.4b|2.8b|custom --out DIR\n"
          "                     [--dtype f32|bf16|f16] [--seed S]\n"
          "                     [--d-model D --layers L --vocab V]   (custom, or overrides)\n"
          "      writes DIR/config.json + DIR/model.safetensors (Hugging Face layout,\n"
          "      seeded random weights initialised like MambaForCausalLM)\n"
          "  mambad-model synth --family mamba2 --shape 130m|370m|780m|1.3b|2.7b|custom\n"
          "                     --out DIR [--dtype D] [--seed S]\n"
          "                     [--d-model D --layers L --vocab V]\n"
          "      the same for Mamba2ForCausalLM (model_type mamba2)\n"
          "  mambad-model synth --family mamba3 --shape 130m|1.3b|custom --out DIR [...]\n"
          "      a Mamba-3 SISO checkpoint (state-spaces layout, ssm_cfg.layer Mamba3)\n"
          "  mambad-model prompt --out IN.safetensors --batch B --len T --vocab V [--seed S]\n"
          "      writes input_ids I64 [B,T] of seeded random tokens in [0, V)\n");
}

static int parse_i64(const char *flag, const char *s, long long lo, long long hi,
                     long long *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s ? s : "", &end, 10);
  if (!s || !*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "mambad-model: %s needs an integer in [%lld, %lld], got '%s'\n", flag, lo, hi,
            s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* synth --family mamba2 (the other arguments already parsed). */
static int synth_mamba2(const char *shape, const char *out, mbd_dtype dt, long long seed,
                        long long dm, long long layers, long long vocab) {
  mbd_error err = {0};
  mbd_mamba2_config cfg;
  if (!strcmp(shape, "custom")) {
    if (!dm || !layers || !vocab) {
      fprintf(stderr, "mambad-model synth: --shape custom needs --d-model, --layers and --vocab\n");
      return 2;
    }
    mbd_mamba2_synth_custom((int)dm, (int)layers, (int)vocab, &cfg);
  } else if (mbd_mamba2_synth_shape(shape, &cfg, &err)) {
    fprintf(stderr, "mambad-model synth: %s\n", err.msg);
    return 2;
  } else if (dm || layers || vocab) {
    mbd_mamba2_synth_custom(dm ? (int)dm : cfg.d_model, layers ? (int)layers : cfg.n_layer,
                            vocab ? (int)vocab : cfg.vocab_size, &cfg);
  }
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "mambad-model synth: cannot create directory %s: %s\n", out, strerror(errno));
    return 1;
  }
  if (mbd_mamba2_synth_write(&cfg, dt, (uint64_t)seed, out, &err) ||
      mbd_synth_tokenizer_write(cfg.vocab_size, out, &err)) {
    fprintf(stderr, "mambad-model synth: %s\n", err.msg);
    return 1;
  }
  fprintf(stderr,
          "wrote %s: mamba2, d_model %d, layers %d, vocab %d, %d heads x %d, d_state %d, %s\n", out,
          cfg.d_model, cfg.n_layer, cfg.vocab_size, cfg.n_heads, cfg.head_dim, cfg.d_state,
          mbd_dtype_name(dt));
  return 0;
}

/* --family mamba3: a Mamba-3 SISO checkpoint (kernels/model/mamba3_synth.h). */
static int synth_mamba3(const char *shape, const char *out, const char *dts, long long seed,
                        long long dm, long long layers, long long vocab) {
  mbd_error err = {0};
  mbd_mamba3_config c;
  mbd_dtype dt;
  if (mbd_mamba3_synth_shape(shape, (int)dm, (int)layers, (int)vocab, &c, &err) ||
      mbd_dtype_parse(dts, &dt, &err) || dt == MBD_DTYPE_I64) {
    fprintf(stderr, "mambad-model synth: %s\n", err.msg[0] ? err.msg : "bad --dtype");
    return 2;
  }
  if ((mkdir(out, 0755) != 0 && errno != EEXIST) ||
      mbd_mamba3_synth_write(&c, dt, (uint64_t)seed, out, &err) ||
      mbd_synth_tokenizer_write(c.vocab_padded, out, &err)) {
    fprintf(stderr, "mambad-model synth: %s: %s\n", out, err.msg[0] ? err.msg : strerror(errno));
    return 1;
  }
  fprintf(stderr, "wrote %s: Mamba-3 SISO, d_model %d, layers %d, vocab %d, heads %d x %d, "
          "d_state %d, %s\n", out, c.d_model, c.n_layer, c.vocab_padded, c.heads, c.headdim,
          c.d_state, mbd_dtype_name(dt));
  return 0;
}

static int cmd_synth(int argc, char **argv) {
  const char *shape = NULL, *out = NULL, *dts = "f32", *family = "mamba1";
  long long seed = 0, dm = 0, layers = 0, vocab = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "--shape")) shape = v, i++;
    else if (!strcmp(a, "--out")) out = v, i++;
    else if (!strcmp(a, "--family")) family = v, i++;
    else if (!strcmp(a, "--dtype")) dts = v, i++;
    else if (!strcmp(a, "--seed")) bad = parse_i64(a, v, 0, INT64_MAX, &seed), i++;
    else if (!strcmp(a, "--d-model")) bad = parse_i64(a, v, 1, 1 << 16, &dm), i++;
    else if (!strcmp(a, "--layers")) bad = parse_i64(a, v, 1, 1024, &layers), i++;
    else if (!strcmp(a, "--vocab")) bad = parse_i64(a, v, 1, 1 << 24, &vocab), i++;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
    else {
      fprintf(stderr, "mambad-model synth: unknown argument '%s'\n", a);
      bad = 1;
    }
    if (bad) return 2;
  }
  if (!shape || !out || !dts) {
    fprintf(stderr, "mambad-model synth: --shape and --out are required (see --help)\n");
    return 2;
  }
  mbd_error err = {0};
  if (family && !strcmp(family, "mamba3")) return synth_mamba3(shape, out, dts, seed, dm, layers, vocab);
  mbd_dtype dt;
  if (!family || (strcmp(family, "mamba1") && strcmp(family, "mamba2"))) {
    fprintf(stderr, "mambad-model synth: --family must be mamba1, mamba2 or mamba3\n");
    return 2;
  }
  if (mbd_dtype_parse(dts, &dt, &err) || dt == MBD_DTYPE_I64) {
    fprintf(stderr, "mambad-model synth: --dtype must be f32, bf16 or f16\n");
    return 2;
  }
  if (!strcmp(family, "mamba2")) return synth_mamba2(shape, out, dt, seed, dm, layers, vocab);
  mbd_mamba_config cfg;
  if (!strcmp(shape, "custom")) {
    if (!dm || !layers || !vocab) {
      fprintf(stderr, "mambad-model synth: --shape custom needs --d-model, --layers and --vocab\n");
      return 2;
    }
    mbd_synth_custom((int)dm, (int)layers, (int)vocab, &cfg);
  } else {
    if (mbd_synth_shape(shape, &cfg, &err)) {
      fprintf(stderr, "mambad-model synth: %s\n", err.msg);
      return 2;
    }
    if (dm || layers || vocab) {
      mbd_synth_custom(dm ? (int)dm : cfg.d_model, layers ? (int)layers : cfg.n_layer,
                       vocab ? (int)vocab : cfg.vocab_size, &cfg);
    }
  }
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "mambad-model synth: cannot create directory %s: %s\n", out, strerror(errno));
    return 1;
  }
  mbd_progress_opts progress; /* large checkpoints: a line every 256 MiB or 5 s on stderr */
  mbd_progress_opts_init(&progress, mbd_progress_print, stderr);
  if (mbd_synth_write_progress(&cfg, dt, (uint64_t)seed, out, &progress, &err) ||
      mbd_synth_tokenizer_write(cfg.vocab_size, out, &err)) {
    fprintf(stderr, "mambad-model synth: %s\n", err.msg);
    return 1;
  }
  fprintf(stderr, "wrote %s: d_model %d, layers %d, vocab %d, d_inner %d, dt_rank %d, %s\n", out,
          cfg.d_model, cfg.n_layer, cfg.vocab_size, cfg.d_inner, cfg.dt_rank, mbd_dtype_name(dt));
  return 0;
}

static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int cmd_prompt(int argc, char **argv) {
  const char *out = NULL;
  long long batch = 0, len = 0, vocab = 0, seed = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "--out")) out = v, i++;
    else if (!strcmp(a, "--batch")) bad = parse_i64(a, v, 1, 1 << 20, &batch), i++;
    else if (!strcmp(a, "--len")) bad = parse_i64(a, v, 1, 1 << 24, &len), i++;
    else if (!strcmp(a, "--vocab")) bad = parse_i64(a, v, 1, 1 << 30, &vocab), i++;
    else if (!strcmp(a, "--seed")) bad = parse_i64(a, v, 0, INT64_MAX, &seed), i++;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
    else {
      fprintf(stderr, "mambad-model prompt: unknown argument '%s'\n", a);
      bad = 1;
    }
    if (bad) return 2;
  }
  if (!out || !batch || !len || !vocab) {
    fprintf(stderr, "mambad-model prompt: --out, --batch, --len and --vocab are required\n");
    return 2;
  }
  if ((unsigned long long)batch * (unsigned long long)len > (1ull << 28)) {
    fprintf(stderr, "mambad-model prompt: batch x len too large (max 2^28 tokens)\n");
    return 2;
  }
  int64_t *ids = malloc((size_t)(batch * len) * sizeof(int64_t));
  if (!ids) {
    fprintf(stderr, "mambad-model prompt: out of memory\n");
    return 1;
  }
  for (long long i = 0; i < batch * len; i++)
    ids[i] = (int64_t)(mix((uint64_t)seed * 0x100000001b3ull + (uint64_t)i) % (uint64_t)vocab);
  mbd_error err = {0};
  mbd_st_writer *w = NULL;
  mbd_tensor_desc d;
  int64_t shape[2] = {batch, len};
  int rc = mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 2, shape, &err);
  if (!rc) rc = mbd_st_writer_new(&w, &err);
  if (!rc) rc = mbd_st_writer_add(w, "input_ids", &d, ids, &err);
  if (!rc) rc = mbd_st_writer_write(w, out, &err);
  mbd_st_writer_destroy(&w);
  free(ids);
  if (rc) {
    fprintf(stderr, "mambad-model prompt: %s\n", err.msg);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "synth")) return cmd_synth(argc - 2, argv + 2);
  if (!strcmp(argv[1], "prompt")) return cmd_prompt(argc - 2, argv + 2);
  fprintf(stderr, "mambad-model: unknown command '%s' (valid: synth, prompt)\n", argv[1]);
  return 2;
}
