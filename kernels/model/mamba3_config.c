/* config.json of a state-spaces Mamba-3 SISO checkpoint (see mamba3.h):
 * ssm_cfg.layer "Mamba3", the defaults of state-spaces/mamba's Mamba3. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/model/mamba3.h"

#define NORM_EPS 1e-5f

static int cfg_int(const char *path, const json_t *obj, const char *key, long long def,
                   long long lo, long long hi, int *out, mbd_error *err) {
  const json_t *v = json_object_get(obj, key);
  long long x = def;
  if (v && !json_is_null(v)) {
    if (json_is_integer(v))
      x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 1e15)
      x = (long long)json_real_value(v);
    else
      return mbd_error_set(err, MBD_E_FORMAT, "%s: %s must be an integer", path, key);
  }
  if (x < lo || x > hi)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: %s = %lld outside [%lld, %lld]", path, key, x,
                         lo, hi);
  *out = (int)x;
  return MBD_OK;
}

static int cfg_real(const char *path, const json_t *obj, const char *key, double def,
                    double *out, mbd_error *err) {
  const json_t *v = json_object_get(obj, key);
  *out = def;
  if (!v || json_is_null(v)) return MBD_OK;
  if (!json_is_number(v))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: %s must be a number", path, key);
  *out = json_number_value(v);
  return MBD_OK;
}

static int cfg_bool(const char *path, const json_t *obj, const char *key, int def, int *out,
                    mbd_error *err) {
  const json_t *v = json_object_get(obj, key);
  *out = def;
  if (!v || json_is_null(v)) return MBD_OK;
  if (!json_is_boolean(v))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: %s must be true or false", path, key);
  *out = json_is_true(v);
  return MBD_OK;
}

static int parse_config(const char *path, const json_t *root, mbd_mamba3_config *c,
                        mbd_error *err) {
  const json_t *ssm = json_object_get(root, "ssm_cfg");
  if (!json_is_object(ssm))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: ssm_cfg must be an object", path);
  const json_t *layer = json_object_get(ssm, "layer");
  if (!json_is_string(layer) || strcmp(json_string_value(layer), "Mamba3"))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: ssm_cfg.layer must be \"Mamba3\"", path);
  int rc, d_inter, pad, rms, mimo;
  double expand, rope, a_floor;
  if ((rc = cfg_int(path, root, "d_model", -1, 1, 1 << 20, &c->d_model, err)) ||
      (rc = cfg_int(path, root, "n_layer", -1, 1, 4096, &c->n_layer, err)) ||
      (rc = cfg_int(path, root, "vocab_size", -1, 1, 1 << 24, &c->vocab_size, err)) ||
      (rc = cfg_int(path, root, "d_intermediate", 0, 0, 0, &d_inter, err)) ||
      (rc = cfg_int(path, root, "pad_vocab_size_multiple", 1, 1, 1 << 16, &pad, err)) ||
      (rc = cfg_bool(path, root, "rms_norm", 1, &rms, err)) ||
      (rc = cfg_bool(path, root, "tie_embeddings", 1, &c->tie_embeddings, err)) ||
      (rc = cfg_int(path, ssm, "d_state", 128, 2, 1 << 12, &c->d_state, err)) ||
      (rc = cfg_real(path, ssm, "expand", 2.0, &expand, err)) ||
      (rc = cfg_int(path, ssm, "headdim", 64, 1, 1 << 12, &c->headdim, err)) ||
      (rc = cfg_int(path, ssm, "ngroups", 1, 1, 1 << 12, &c->ngroups, err)) ||
      (rc = cfg_real(path, ssm, "rope_fraction", 0.5, &rope, err)) ||
      (rc = cfg_real(path, ssm, "A_floor", 1e-4, &a_floor, err)) ||
      (rc = cfg_bool(path, ssm, "is_outproj_norm", 0, &c->outproj_norm, err)) ||
      (rc = cfg_bool(path, ssm, "is_mimo", 0, &mimo, err)))
    return rc;
  const json_t *attn = json_object_get(root, "attn_layer_idx");
  if (attn && !json_is_null(attn) && !(json_is_array(attn) && json_array_size(attn) == 0))
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: attention layers are not supported", path);
  if (!rms)
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: rms_norm false (LayerNorm) is not supported",
                         path);
  if (mimo)
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: Mamba-3 MIMO is not supported (SISO only)",
                         path);
  if (rope != 0.5 && rope != 1.0)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: rope_fraction must be 0.5 or 1.0", path);
  if (!(expand > 0) || expand * c->d_model > (double)(1 << 24))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: bad expand", path);
  if (!(a_floor >= 0) || !isfinite(a_floor))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: bad A_floor", path);
  c->d_inner = (int64_t)(expand * c->d_model); /* int(expand * d_model), as upstream */
  if (c->d_inner < 1 || c->d_inner % c->headdim)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: d_inner %lld is not a multiple of headdim %d",
                         path, (long long)c->d_inner, c->headdim);
  c->heads = (int)(c->d_inner / c->headdim);
  if (c->heads % c->ngroups)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: %d heads do not split into %d groups", path,
                         c->heads, c->ngroups);
  if (c->d_state % 2)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: d_state must be even (rotary pairs)", path);
  int split = (int)(c->d_state * rope);
  if (split % 2) split--;
  c->angles = split / 2;
  if (c->angles < 1)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: no rotary angles (d_state too small)", path);
  c->rope_fraction = (float)rope;
  c->a_floor = (float)a_floor;
  c->eps = NORM_EPS;
  c->vocab_padded = (int)(((int64_t)c->vocab_size + pad - 1) / pad * pad);
  c->d_in_proj = 2 * c->d_inner + 2 * (int64_t)c->ngroups * c->d_state + 3 * c->heads + c->angles;
  return MBD_OK;
}

/* root as jansson loaded it from label (NULL: jerr says why), then freed. */
static int parse_loaded(json_t *root, const json_error_t *jerr, const char *label,
                        mbd_mamba3_config *out, mbd_error *err) {
  memset(out, 0, sizeof(*out));
  if (!root) return mbd_error_set(err, MBD_E_FORMAT, "%s: %s", label, jerr->text);
  int rc = json_is_object(root) ? parse_config(label, root, out, err)
                                : mbd_error_set(err, MBD_E_FORMAT, "%s: not a JSON object", label);
  json_decref(root);
  return rc;
}

int mbd_mamba3_config_parse(const char *json, size_t len, const char *label,
                            mbd_mamba3_config *out, mbd_error *err) {
  if (!label) label = "config";
  if (!json) {
    memset(out, 0, sizeof(*out));
    return mbd_error_set(err, MBD_E_FORMAT, "%s: no text", label);
  }
  json_error_t jerr;
  return parse_loaded(json_loadb(json, len, 0, &jerr), &jerr, label, out, err);
}

int mbd_mamba3_config_load(const char *dir, mbd_mamba3_config *out, mbd_error *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_error_t jerr;
  return parse_loaded(json_load_file(path, 0, &jerr), &jerr, path, out, err);
}
