/* The model registry's identities and loading: the digest of a checkpoint
 * directory, the tokenizer's digest, loading every --model onto the backend,
 * and lookup by name. See models.h. */
#include "worker/models.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sha256.h"
#include "worker/state.h"

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && !strcmp(s + n - m, suf);
}

int mbd_worker_model_digest(const char *dir, char out[65], mbd_error *err) {
  int rc = MBD_OK;
  char **names = NULL;
  size_t n = 0, cap = 0, nweights = 0;
  DIR *d = opendir(dir);
  if (!d)
    return mbd_error_set(err, MBD_E_NOT_FOUND, "model directory %s: %s", dir, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d))) {
    bool w = ends_with(e->d_name, ".safetensors");
    if (!w && strcmp(e->d_name, "config.json")) continue;
    nweights += w;
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 16;
      char **nn = realloc(names, nc * sizeof *nn);
      if (!nn) {
        rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory listing %s", dir);
        goto fail;
      }
      names = nn;
      cap = nc;
    }
    if (!(names[n] = strdup(e->d_name))) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory listing %s", dir);
      goto fail;
    }
    n++;
  }
  if (nweights == 0) {
    rc = mbd_error_set(err, MBD_E_NOT_FOUND, "model directory %s has no *.safetensors file", dir);
    goto fail;
  }
  qsort(names, n, sizeof *names, cmp_str);
  mbd_sha256_ctx all;
  mbd_sha256_init(&all);
  for (size_t i = 0; i < n; i++) {
    char path[MBD_WORKER_PATH_MAX + 256], hex[65];
    uint8_t h[32];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if ((rc = mbd_sha256_file(path, h, err))) goto fail;
    mbd_sha256_hex(h, hex);
    mbd_sha256_update(&all, names[i], strlen(names[i]));
    mbd_sha256_update(&all, "\n", 1);
    mbd_sha256_update(&all, hex, 64);
    mbd_sha256_update(&all, "\n", 1);
  }
  uint8_t dg[32];
  mbd_sha256_final(&all, dg);
  mbd_sha256_hex(dg, out);
fail:
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
  return rc;
}

int mbd_worker_tokenizer_digest(const char *dir, char out[65], mbd_error *err) {
  out[0] = '\0';
  char path[MBD_WORKER_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (access(path, F_OK)) return MBD_OK; /* no tokenizer: the field is left out */
  uint8_t h[32];
  int rc = mbd_sha256_file(path, h, err);
  if (rc) return rc;
  mbd_sha256_hex(h, out);
  return MBD_OK;
}

int mbd_wmodels_load(mbd_wstate *st, const mbd_worker_opts *o, mbd_error *err) {
  for (int i = 0; i < o->nmodels; i++) {
    const mbd_worker_model_opt *mo = &o->models[i];
    char digest[65], tdigest[65];
    mbd_bmodel *bm = NULL;
    int rc = mbd_worker_model_digest(mo->dir, digest, err);
    if (!rc) rc = mbd_worker_tokenizer_digest(mo->dir, tdigest, err);
    if (!rc) rc = st->be->ops->model_load(st->be, mo->dir, &bm, err);
    if (!rc) rc = mbd_wstate_add_model(st, mo->name, digest, tdigest, bm, err);
    if (rc) {
      mbd_error_prefix(err, "loading model '%s' from %s (check --model NAME=DIR)", mo->name,
                       mo->dir);
      return rc;
    }
  }
  return MBD_OK;
}

int mbd_wmodels_find(const mbd_wstate *st, const char *name, mbd_error *err) {
  for (int i = 0; i < st->nmodels; i++)
    if (!strcmp(st->models[i].name, name)) return i;
  char list[256] = "";
  size_t used = 0;
  for (int i = 0; i < st->nmodels && used < sizeof list; i++) {
    int n = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", st->models[i].name);
    if (n < 0) break;
    used += (size_t)n;
  }
  return mbd_error_set(err, MBD_E_NOT_FOUND, "model '%s' is not loaded on worker %s (loaded: %s)",
                       name, st->o.name, st->nmodels ? list : "none");
}
