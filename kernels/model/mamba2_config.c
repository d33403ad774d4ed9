/* config.json of model_type "mamba2" (see mamba2.h). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/model/config_json.h"
#include "kernels/model/mamba2.h"

/* An integer key, or `def` when absent. */
static int get_int(const json_t *root, const char *label, const char *key, int def, int *out,
                   mbd_error *err) {
  const json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return MBD_OK;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: %s must be a positive integer", label, key);
  *out = (int)json_integer_value(v);
  return MBD_OK;
}

static int get_bool(const json_t *root, const char *label, const char *key, bool def, bool *out,
                    mbd_error *err) {
  const json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return MBD_OK;
  }
  if (!json_is_boolean(v))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: %s must be true or false", label, key);
  *out = json_is_true(v);
  return MBD_OK;
}

/* A number, or transformers' {"__float__": "Infinity"} for non-finite ones. */
static int get_float_value(const json_t *v, const char *label, const char *key, double *out,
                           mbd_error *err) {
  if (json_is_number(v)) {
    *out = json_number_value(v);
    return MBD_OK;
  }
  const json_t *s = json_is_object(v) ? json_object_get(v, "__float__") : NULL;
  const char *t = json_is_string(s) ? json_string_value(s) : NULL;
  if (t && !strcmp(t, "NaN"))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: %s must not be NaN", label, key);
  if (t && (!strcmp(t, "Infinity") || !strcmp(t, "inf"))) {
    *out = INFINITY;
    return MBD_OK;
  }
  if (t && (!strcmp(t, "-Infinity") || !strcmp(t, "-inf"))) {
    *out = -INFINITY;
    return MBD_OK;
  }
  return mbd_error_set(err, MBD_E_FORMAT, "%s: %s must be a number", label, key);
}

static int parse_root(const json_t *root, const char *label, mbd_mamba2_config *c,
                      mbd_error *err) {
  memset(c, 0, sizeof *c);
  const json_t *mt = json_object_get(root, "model_type");
  if (json_is_string(mt) && strcmp(json_string_value(mt), "mamba2"))
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: model_type '%s' is not mamba2", label,
                         json_string_value(mt));
  if (!mt && json_object_get(root, "ssm_cfg"))
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "%s: a state-spaces (mamba_ssm) config; this loader reads the Hugging "
                         "Face layout (model_type mamba2, e.g. the *-hf conversions)",
                         label);
  int rc;
  /* defaults: transformers' Mamba2Config */
  if ((rc = get_int(root, label, "hidden_size", 4096, &c->d_model, err)) ||
      (rc = get_int(root, label, "num_hidden_layers", 64, &c->n_layer, err)) ||
      (rc = get_int(root, label, "vocab_size", 32768, &c->vocab_size, err)) ||
      (rc = get_int(root, label, "state_size", 128, &c->d_state, err)) ||
      (rc = get_int(root, label, "conv_kernel", 4, &c->d_conv, err)) ||
      (rc = get_int(root, label, "expand", 2, &c->expand, err)) ||
      (rc = get_int(root, label, "num_heads", 128, &c->n_heads, err)) ||
      (rc = get_int(root, label, "head_dim", 64, &c->head_dim, err)) ||
      (rc = get_int(root, label, "n_groups", 8, &c->n_groups, err)) ||
      (rc = get_int(root, label, "chunk_size", 256, &c->chunk_size, err)) ||
      (rc = get_bool(root, label, "use_conv_bias", true, &c->conv_bias, err)) ||
      (rc = get_bool(root, label, "use_bias", false, &c->proj_bias, err)) ||
      (rc = get_bool(root, label, "norm_before_gate", false, &c->norm_before_gate, err)) ||
      (rc = get_bool(root, label, "tie_word_embeddings", false, &c->tie_embeddings, err)))
    return rc;
  const json_t *eps = json_object_get(root, "layer_norm_epsilon");
  c->norm_eps = 1e-5f;
  if (eps) {
    /* A value past FLT_MAX would become inf, one below the smallest float 0. */
    float v = json_is_number(eps) ? (float)json_number_value(eps) : -1.0f;
    if (!(v > 0) || !isfinite(v))
      return mbd_error_set(err, MBD_E_FORMAT,
                           "%s: layer_norm_epsilon must be a number > 0 that a float holds",
                           label);
    c->norm_eps = v;
  }
  c->dt_min = 0.0f;
  c->dt_max = INFINITY;
  const json_t *lim = json_object_get(root, "time_step_limit");
  if (lim && !json_is_null(lim)) {
    double lo, hi;
    if (!json_is_array(lim) || json_array_size(lim) != 2)
      return mbd_error_set(err, MBD_E_FORMAT, "%s: time_step_limit must be [min, max]", label);
    if ((rc = get_float_value(json_array_get(lim, 0), label, "time_step_limit[0]", &lo, err)) ||
        (rc = get_float_value(json_array_get(lim, 1), label, "time_step_limit[1]", &hi, err)))
      return rc;
    if (!(lo <= hi) || lo < 0 || !isfinite((float)lo))
      return mbd_error_set(err, MBD_E_FORMAT,
                           "%s: time_step_limit must be 0 <= min <= max, min a finite float",
                           label);
    c->dt_min = (float)lo;
    c->dt_max = (float)hi;
  }
  const json_t *act = json_object_get(root, "hidden_act");
  if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: hidden_act must be silu", label);
  c->eos_token_id = -1;
  const json_t *eos = json_object_get(root, "eos_token_id");
  if (json_is_integer(eos) && json_integer_value(eos) >= 0 && json_integer_value(eos) < INT32_MAX)
    c->eos_token_id = (int)json_integer_value(eos);
  c->d_inner = c->expand * c->d_model;
  if ((int64_t)c->n_heads * c->head_dim != c->d_inner)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "%s: num_heads %d x head_dim %d != expand %d x hidden_size %d", label,
                         c->n_heads, c->head_dim, c->expand, c->d_model);
  if (c->n_heads % c->n_groups)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: num_heads %d is not a multiple of n_groups %d",
                         label, c->n_heads, c->n_groups);
  return MBD_OK;
}

int mbd_mamba2_config_parse(const char *json, size_t len, const char *label,
                            mbd_mamba2_config *out, mbd_error *err) {
  if (!label) label = "config";
  if (!json) return mbd_error_set(err, MBD_E_FORMAT, "%s: no text", label);
  json_error_t je;
  json_t *root = json_loadb(json, len, 0, &je);
  if (!json_is_object(root)) {
    json_decref(root);
    return mbd_error_set(err, MBD_E_FORMAT, "%s: not a JSON object (%s)", label, je.text);
  }
  int rc = parse_root(root, label, out, err);
  json_decref(root);
  return rc;
}

int mbd_mamba2_config_load(const char *path, mbd_mamba2_config *out, mbd_error *err) {
  char file[4096];
  size_t n = strlen(path);
  if (n >= 5 && !strcmp(path + n - 5, ".json"))
    snprintf(file, sizeof file, "%s", path);
  else
    snprintf(file, sizeof file, "%s/config.json", path);
  json_error_t je;
  json_t *root = mbd_config_json_load(file, &je);
  if (!root) return mbd_error_set(err, MBD_E_IO, "%s: cannot read (%s)", file, je.text);
  int rc = json_is_object(root) ? parse_root(root, file, out, err)
                                : mbd_error_set(err, MBD_E_FORMAT, "%s: not a JSON object", file);
  json_decref(root);
  return rc;
}
