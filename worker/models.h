/* Model identities and the model registry: what a checkpoint directory is
 * (its digest, its tokenizer's digest), loading every --model onto the
 * backend, and finding a model by name. */
#ifndef MBD_WORKER_MODELS_H
#define MBD_WORKER_MODELS_H

#include "common/status.h"
#include "worker/options.h"

struct mbd_wstate;

/* Model identity: SHA-256 (hex) over, in file-name order, "<file>\n<sha256 hex>\n"
 * for config.json and every *.safetensors file of dir. MBD_E_NOT_FOUND when dir
 * has no safetensors file. */
int mbd_worker_model_digest(const char *dir, char out[65], mbd_error *err);
/* Tokenizer identity: SHA-256 (hex) of dir/tokenizer.json, or "" when dir has
 * no tokenizer.json (not an error). MBD_E_IO when the file cannot be read. */
int mbd_worker_tokenizer_digest(const char *dir, char out[65], mbd_error *err);

/* Digests and loads every model of o onto st's backend, in flag order (fail
 * fast: the error names the model and the directory). */
int mbd_wmodels_load(struct mbd_wstate *st, const mbd_worker_opts *o, mbd_error *err);
/* Index of the model called name, or MBD_E_NOT_FOUND listing the loaded ones. */
int mbd_wmodels_find(const struct mbd_wstate *st, const char *name, mbd_error *err);

#endif
