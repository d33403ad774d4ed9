/* config.json as Hugging Face writes it: JSON, except that Python's json
 * module (transformers before 5) writes non-finite floats as the bare
 * tokens Infinity, -Infinity and NaN (Mamba-2's time_step_limit is
 * [0.0, Infinity]). This loader accepts them, rewritten as transformers 5
 * writes them: {"__float__": "Infinity"} (and "-Infinity", "NaN"). */
#ifndef MBD_KERNELS_CONFIG_JSON_H
#define MBD_KERNELS_CONFIG_JSON_H

#include <jansson.h>

/* The parsed file (the caller json_decref's it), or NULL with e filled. */
json_t *mbd_config_json_load(const char *path, json_error_t *e);

#endif
