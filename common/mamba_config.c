/* Hugging Face Mamba-1 config.json reader and writer (jansson).
 *
 * Reads `model_type: mamba` configs as transformers' MambaConfig does (same
 * defaults, intermediate_size = expand * hidden_size, time_step_rank "auto" =
 * ceil(hidden_size / 16)) and the older state-spaces layout (d_model, n_layer,
 * ssm_cfg, vocab padded to pad_vocab_size_multiple). Every size is bounded so
 * products computed later by the model code cannot overflow. */
#include "common/mamba_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CFG_MAX_BYTES (16 * 1024 * 1024)

/* Looks `key` up in obj, then in alt (the older spelling), then in sub (ssm_cfg). */
static json_t *lookup(const json_t *obj, const char *key, const char *alt, const json_t *sub,
                      const char *subkey) {
  json_t *v = json_object_get(obj, key);
  if (!v && alt) v = json_object_get(obj, alt);
  if (!v && sub && subkey) v = json_object_get(sub, subkey);
  return v;
}

/* Integer field in [lo, hi]; integral reals (2.0) accepted, as Python writes them
 * sometimes. `def` < lo means the field is required. */
static int get_int(const char *label, const char *name, const json_t *v, long long def, long long lo,
                   long long hi, int *out, mbd_error *err) {
  long long x;
  if (!v || json_is_null(v)) {
    if (def < lo)
      return mbd_error_set(err, MBD_E_FORMAT, "%s: required field '%s' is missing", label, name);
    *out = (int)def;
    return MBD_OK;
  }
  if (json_is_integer(v)) {
    x = json_integer_value(v);
  } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 1e15) {
    x = (long long)json_real_value(v);
  } else {
    return mbd_error_set(err, MBD_E_FORMAT, "%s: field '%s' must be an integer", label, name);
  }
  if (x < lo || x > hi)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: field '%s' is %lld, must be in [%lld, %lld]",
                         label, name, x, lo, hi);
  *out = (int)x;
  return MBD_OK;
}

static int get_bool(const char *label, const char *name, const json_t *v, bool def, bool *out,
                    mbd_error *err) {
  if (!v || json_is_null(v)) {
    *out = def;
    return MBD_OK;
  }
  if (!json_is_boolean(v))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: field '%s' must be true or false", label, name);
  *out = json_is_true(v);
  return MBD_OK;
}

int mbd_mamba_config_parse(const char *json, size_t len, const char *label, mbd_mamba_config *out,
                           mbd_error *err) {
  int rc = MBD_OK;
  json_error_t jerr;
  if (!label) label = "config.json";
  json_t *root = json ? json_loadb(json, len, 0, &jerr) : NULL;
  if (!root)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", label,
                         json ? jerr.text : "no text", json ? jerr.line : 0,
                         json ? jerr.column : 0);
  mbd_mamba_config c;
  memset(&c, 0, sizeof c);
  if (!json_is_object(root)) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: top level must be a JSON object", label);
    goto fail;
  }
  const json_t *mt = json_object_get(root, "model_type");
  bool legacy = false;
  if (mt) {
    if (!json_is_string(mt) || strcmp(json_string_value(mt), "mamba")) {
      char shown[64] = "(not a string)";
      if (json_is_string(mt)) snprintf(shown, sizeof shown, "%s", json_string_value(mt));
      rc = mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "%s: model_type '%s' is not supported; only 'mamba' (Mamba-1) models "
                         "can be served",
                         label, shown);
      goto fail;
    }
  } else if (json_object_get(root, "d_model")) {
    legacy = true; /* state-spaces/mamba config: no model_type */
  } else {
    rc = mbd_error_set(err, MBD_E_FORMAT,
                       "%s: no 'model_type' (expected \"mamba\"); is this a Mamba config.json?",
                       label);
    goto fail;
  }
  const json_t *ssm = json_object_get(root, "ssm_cfg");
  if (ssm && !json_is_null(ssm) && !json_is_object(ssm)) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: 'ssm_cfg' must be an object", label);
    goto fail;
  }
  if (ssm && json_is_object(ssm)) {
    const json_t *layer = json_object_get(ssm, "layer");
    if (layer && (!json_is_string(layer) || strcmp(json_string_value(layer), "Mamba1"))) {
      rc = mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: ssm_cfg.layer is not 'Mamba1'", label);
      goto fail;
    }
  } else {
    ssm = NULL;
  }
  if (legacy) {
    const json_t *rms = json_object_get(root, "rms_norm");
    if (rms && json_is_false(rms)) {
      rc = mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: rms_norm=false (LayerNorm) is not supported",
                         label);
      goto fail;
    }
  }
  if ((rc = get_int(label, "hidden_size", lookup(root, "hidden_size", "d_model", NULL, NULL), -1, 1,
                    1 << 20, &c.d_model, err)) ||
      (rc = get_int(label, "num_hidden_layers",
                    lookup(root, "num_hidden_layers", "n_layer", NULL, NULL), -1, 1, 4096,
                    &c.n_layer, err)) ||
      (rc = get_int(label, "vocab_size", lookup(root, "vocab_size", NULL, NULL, NULL), -1, 1,
                    1 << 26, &c.vocab_size, err)) ||
      (rc = get_int(label, "state_size", lookup(root, "state_size", NULL, ssm, "d_state"), 16, 1,
                    4096, &c.d_state, err)) ||
      (rc = get_int(label, "conv_kernel", lookup(root, "conv_kernel", NULL, ssm, "d_conv"), 4, 1,
                    256, &c.d_conv, err)) ||
      (rc = get_int(label, "expand", lookup(root, "expand", NULL, ssm, "expand"), 2, 1, 64,
                    &c.expand, err)))
    goto fail;
  if (legacy) {
    int mult = 1;
    if ((rc = get_int(label, "pad_vocab_size_multiple",
                      json_object_get(root, "pad_vocab_size_multiple"), 1, 1, 1 << 16, &mult,
                      err)))
      goto fail;
    if (c.vocab_size % mult) c.vocab_size += mult - c.vocab_size % mult;
  }
  long long inner = (long long)c.expand * c.d_model;
  if (inner > (1 << 22)) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: expand * hidden_size = %lld is too large", label,
                       inner);
    goto fail;
  }
  /* transformers ignores intermediate_size and recomputes it; a file whose
   * value disagrees would load differently there, so it is refused here. */
  int given_inner = 0;
  if ((rc = get_int(label, "intermediate_size", json_object_get(root, "intermediate_size"), inner,
                    1, 1 << 22, &given_inner, err)))
    goto fail;
  if (given_inner != inner) {
    rc = mbd_error_set(err, MBD_E_FORMAT,
                       "%s: intermediate_size %d != expand * hidden_size (%d * %d)", label,
                       given_inner, c.expand, c.d_model);
    goto fail;
  }
  c.d_inner = (int)inner;
  const json_t *tsr = lookup(root, "time_step_rank", NULL, ssm, "dt_rank");
  if (!tsr || json_is_null(tsr) ||
      (json_is_string(tsr) && !strcmp(json_string_value(tsr), "auto"))) {
    c.dt_rank = (c.d_model + 15) / 16;
  } else if (json_is_string(tsr)) {
    rc = mbd_error_set(err, MBD_E_FORMAT,
                       "%s: field 'time_step_rank' must be an integer or \"auto\"", label);
    goto fail;
  } else if ((rc = get_int(label, "time_step_rank", tsr, 0, 1, 1 << 20, &c.dt_rank, err))) {
    goto fail;
  }
  const json_t *eps = lookup(root, "layer_norm_epsilon", "norm_epsilon", NULL, NULL);
  double e = 1e-5;
  if (eps && !json_is_null(eps)) {
    /* Checked as the float the model uses: 1e-51 is positive in double but 0 in float. */
    float fe = json_is_number(eps) ? (float)json_number_value(eps) : 0.0f;
    if (!json_is_number(eps) || !(fe > 0.0f) || !(fe < 1.0f)) {
      rc = mbd_error_set(err, MBD_E_FORMAT, "%s: field 'layer_norm_epsilon' must be a number in (0, 1)",
                         label);
      goto fail;
    }
    e = json_number_value(eps);
  }
  c.norm_eps = (float)e;
  if ((rc = get_bool(label, "use_conv_bias", lookup(root, "use_conv_bias", NULL, ssm, "conv_bias"),
                     true, &c.conv_bias, err)) ||
      (rc = get_bool(label, "use_bias", lookup(root, "use_bias", NULL, ssm, "bias"), false,
                     &c.proj_bias, err)) ||
      (rc = get_bool(label, "residual_in_fp32", json_object_get(root, "residual_in_fp32"), true,
                     &c.residual_in_fp32, err)) ||
      (rc = get_bool(label, "tie_word_embeddings",
                     lookup(root, "tie_word_embeddings", "tie_embeddings", NULL, NULL), true,
                     &c.tie_embeddings, err)))
    goto fail;
  const json_t *eos = json_object_get(root, "eos_token_id");
  if (json_is_array(eos)) eos = json_array_get(eos, 0); /* generation configs allow a list */
  c.eos_token_id = -1;
  if (eos && !json_is_null(eos) &&
      (rc = get_int(label, "eos_token_id", eos, -1, 0, c.vocab_size - 1, &c.eos_token_id, err)))
    goto fail;
  *out = c;
fail:
  json_decref(root);
  return rc;
}

/* DIR -> DIR/config.json; anything else is used as given. Caller frees. */
static char *config_path(const char *path) {
  struct stat sb;
  size_t n = strlen(path);
  bool dir = !stat(path, &sb) && S_ISDIR(sb.st_mode);
  char *p = malloc(n + sizeof "/config.json");
  if (p) snprintf(p, n + sizeof "/config.json", dir ? "%s/config.json" : "%s", path);
  return p;
}

int mbd_mamba_config_load(const char *path, mbd_mamba_config *out, mbd_error *err) {
  int rc = MBD_OK;
  char *text = NULL;
  FILE *f = NULL;
  char *p = config_path(path);
  if (!p) return mbd_error_set(err, MBD_E_NOMEM, "out of memory");
  if (!(f = fopen(p, "rb"))) {
    rc = mbd_error_set(err, MBD_E_IO, "cannot open model config '%s': %s", p, strerror(errno));
    goto fail;
  }
  if (!(text = malloc(CFG_MAX_BYTES + 1))) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading '%s'", p);
    goto fail;
  }
  size_t n = fread(text, 1, CFG_MAX_BYTES + 1, f);
  if (ferror(f)) {
    rc = mbd_error_set(err, MBD_E_IO, "error reading '%s'", p);
    goto fail;
  }
  if (n > CFG_MAX_BYTES) {
    rc = mbd_error_set(err, MBD_E_TOO_LARGE, "'%s' is larger than %d bytes; not a config.json", p,
                       CFG_MAX_BYTES);
    goto fail;
  }
  rc = mbd_mamba_config_parse(text, n, p, out, err);
fail:
  if (f) fclose(f);
  free(text);
  free(p);
  return rc;
}

/* Smallest %g precision that reads back as the same float, so 1e-5f is
 * written "1e-05" rather than "9.99999975e-06". */
static int float_precision(float v) {
  char buf[64];
  for (int p = 1; p < 9; p++) {
    snprintf(buf, sizeof buf, "%.*g", p, (double)v);
    if ((float)strtod(buf, NULL) == v) return p;
  }
  return 9;
}

int mbd_mamba_config_write(const mbd_mamba_config *cfg, const char *path, mbd_error *err) {
  int rc = MBD_OK;
  char *p = NULL, *tmp = NULL;
  FILE *f = NULL;
  json_t *root = json_pack(
      "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:b,s:b,s:b,s:s}", "architectures",
      "MambaForCausalLM", "model_type", "mamba", "hidden_size", cfg->d_model, "num_hidden_layers",
      cfg->n_layer, "vocab_size", cfg->vocab_size, "state_size", cfg->d_state, "conv_kernel",
      cfg->d_conv, "expand", cfg->expand, "intermediate_size", cfg->d_inner, "time_step_rank",
      cfg->dt_rank, "layer_norm_epsilon", (double)cfg->norm_eps, "use_conv_bias",
      (int)cfg->conv_bias, "use_bias", (int)cfg->proj_bias, "residual_in_fp32",
      (int)cfg->residual_in_fp32, "tie_word_embeddings", (int)cfg->tie_embeddings, "hidden_act",
      "silu");
  if (!root) return mbd_error_set(err, MBD_E_NOMEM, "out of memory building config.json");
  if (json_object_set_new(root, "eos_token_id",
                          cfg->eos_token_id >= 0 ? json_integer(cfg->eos_token_id) : json_null())) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory building config.json");
    goto fail;
  }
  p = config_path(path);
  size_t n = p ? strlen(p) + 16 : 0;
  tmp = p ? malloc(n) : NULL;
  if (!tmp) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory");
    goto fail;
  }
  snprintf(tmp, n, "%s.tmp.XXXXXX", p);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    rc = mbd_error_set(err, MBD_E_IO, "cannot create a temporary file next to '%s': %s", p,
                       strerror(errno));
    tmp[0] = '\0';
    goto fail;
  }
  if (fchmod(fd, 0644) || !(f = fdopen(fd, "w"))) {
    close(fd);
    rc = mbd_error_set(err, MBD_E_IO, "cannot write '%s': %s", tmp, strerror(errno));
    goto fail;
  }
  size_t flags = JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(float_precision(cfg->norm_eps));
  int bad = json_dumpf(root, f, flags) || fputc('\n', f) == EOF || fflush(f) || fsync(fileno(f));
  bad = fclose(f) || bad;
  f = NULL;
  if (bad || rename(tmp, p)) {
    rc = mbd_error_set(err, MBD_E_IO, "cannot write '%s': %s", p, strerror(errno));
    goto fail;
  }
  tmp[0] = '\0';
fail:
  if (f) fclose(f);
  if (tmp && tmp[0]) unlink(tmp);
  free(tmp);
  free(p);
  json_decref(root);
  return rc;
}
