/* GET /v1/models: the configured models with what the broker says serves them. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "client/gateway/handlers.h"

typedef struct models_ctx {
  gw_ctx *g;
  const char *id;
  json_t *data;
} models_ctx;

static json_t *model_obj(const gw_model *m, const mbd_status_report *r) {
  json_t *routes = json_array();
  const char *digest = "";
  if (r)
    for (size_t i = 0; i < r->n_workers; i++) {
      const mbd_worker_info *w = &r->workers[i];
      if (!w->alive) continue;
      for (size_t k = 0; k < w->n_models; k++) {
        if (strcmp(w->models[k].name, m->name)) continue;
        if (!digest[0]) digest = w->models[k].digest;
        json_t *rt = NULL;
        size_t idx;
        json_t *x;
        json_array_foreach(routes, idx, x) {
          if (!strcmp(json_string_value(json_object_get(x, "route_id")), w->route_id)) rt = x;
        }
        if (!rt) {
          rt = json_pack("{s:s,s:[]}", "route_id", w->route_id, "workers");
          json_array_append_new(routes, rt);
        }
        json_array_append_new(json_object_get(rt, "workers"), json_string(w->name));
      }
    }
  return json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:o}", "id", m->name, "object", "model", "created",
                   (json_int_t)0, "owned_by", "mambad", "digest", digest, "tokenizer_digest",
                   mbd_tokenizer_digest(m->tok), "routes", routes);
}

static void models_fn(void *u, const mbd_status_report *r) {
  models_ctx *k = u;
  for (size_t i = 0; i < k->g->n_models; i++) {
    const gw_model *m = &k->g->models[i];
    if (k->id && strcmp(k->id, m->name)) continue;
    json_array_append_new(k->data, model_obj(m, r));
  }
}

int gw_models(gw_ctx *g, const char *id, char **body) {
  models_ctx k = {g, id, json_array()};
  gw_status_use(g, 1000, models_fn, &k);
  if (id) {
    json_t *one = json_array_get(k.data, 0);
    if (!one) {
      json_decref(k.data);
      gw_err e;
      gw_err_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                 "the model '%.200s' does not exist", id);
      *body = gw_err_json(&e);
      return 404;
    }
    *body = json_dumps(one, JSON_COMPACT);
  } else {
    json_t *o = json_pack("{s:s,s:o}", "object", "list", "data", k.data);
    *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return 200;
  }
  json_decref(k.data);
  return 200;
}
