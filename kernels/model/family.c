/* The family table and config.json's family detection (see family.h). */
#include "kernels/model/family.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "kernels/model/config_json.h"
#include "kernels/model/mamba1.h"
#include "kernels/model/mamba2.h"
#include "kernels/model/mamba3.h"

static const mbd_model_family k_families[] = {
    {.name = "mamba1", .model_type = "mamba", .legacy_layer = "Mamba1",
     .cpu = &mbd_mamba1_cpu_ops},
    {.name = "mamba2", .model_type = "mamba2", .legacy_layer = "Mamba2", .cpu = &mbd_mamba2_cpu_ops},
    {.name = "mamba3", .model_type = "mamba3", .legacy_layer = "Mamba3", .cpu = &mbd_mamba3_cpu_ops},
};
#define NFAMILIES (sizeof k_families / sizeof k_families[0])

const mbd_model_family *mbd_model_family_find(const char *name) {
  for (size_t i = 0; name && i < NFAMILIES; i++)
    if (!strcmp(k_families[i].name, name)) return &k_families[i];
  return NULL;
}

/* "mamba1 (model_type mamba)" for each family, for messages. */
static void known(char *out, size_t cap) {
  size_t n = 0;
  out[0] = '\0';
  for (size_t i = 0; i < NFAMILIES && n < cap; i++) {
    int w = snprintf(out + n, cap - n, "%s%s (model_type '%s')", i ? ", " : "",
                     k_families[i].name, k_families[i].model_type);
    if (w < 0) break;
    n += (size_t)w;
  }
}

int mbd_model_family_detect(const char *dir, const mbd_model_family **out, mbd_error *err) {
  char path[4096], fams[256];
  *out = &k_families[0];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *root = mbd_config_json_load(path, NULL);
  if (!json_is_object(root)) {
    json_decref(root);
    return MBD_OK; /* the Mamba-1 loader reports what is wrong */
  }
  const json_t *mt = json_object_get(root, "model_type");
  const json_t *ssm = json_object_get(root, "ssm_cfg");
  const json_t *layer = json_is_object(ssm) ? json_object_get(ssm, "layer") : NULL;
  const char *want = json_is_string(mt) ? json_string_value(mt) : NULL;
  const char *lay = !mt && json_is_string(layer) ? json_string_value(layer) : NULL;
  int rc = MBD_OK;
  if (want || lay) {
    const mbd_model_family *f = NULL;
    for (size_t i = 0; i < NFAMILIES && !f; i++)
      if (want ? !strcmp(k_families[i].model_type, want)
               : !strcmp(k_families[i].legacy_layer, lay))
        f = &k_families[i];
    if (f) {
      *out = f;
    } else {
      known(fams, sizeof fams);
      *out = NULL;
      rc = mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "%s: %s '%s' is not a model family this build runs (it runs: %s)", path,
                         want ? "model_type" : "ssm_cfg.layer", want ? want : lay, fams);
    }
  }
  json_decref(root);
  return rc;
}
