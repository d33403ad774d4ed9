/* Liveness, readiness and the metrics page. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "client/gateway/handlers.h"

int gw_health_live(gw_ctx *g, char **body) {
  (void)g;
  *body = strdup("{\"status\":\"ok\"}");
  return 200;
}

int gw_health_ready(gw_ctx *g, char **body) {
  json_t *why = json_object();
  for (size_t i = 0; i < g->n_models; i++) {
    gw_err e;
    memset(&e, 0, sizeof e);
    if (gw_model_check(g, &g->models[i], &e))
      json_object_set_new(why, g->models[i].name, json_string(e.msg));
  }
  bool ready = json_object_size(why) == 0;
  json_t *o = json_pack("{s:s,s:o}", "status", ready ? "ready" : "not_ready", "models", why);
  *body = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return ready ? 200 : 503;
}

typedef struct page_ctx {
  gw_ctx *g;
  char *text;
} page_ctx;

static void page_fn(void *u, const mbd_status_report *r) {
  page_ctx *k = u;
  k->text = gw_metrics_render(k->g->metrics, r);
}

int gw_metrics_page(gw_ctx *g, char **body) {
  page_ctx k = {g, NULL};
  gw_status_use(g, 0, page_fn, &k); /* a fresh STATUS every scrape */
  *body = k.text;
  return k.text ? 200 : 500;
}
