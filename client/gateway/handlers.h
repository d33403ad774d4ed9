/* The GET endpoints' bodies, each computed from the gateway context (the
 * cached STATUS): models.c, health.c and the metrics exposition. Each returns
 * the HTTP status and a malloc'd body. */
#ifndef MBD_GW_HANDLERS_H
#define MBD_GW_HANDLERS_H

#include "client/gateway/gateway.h"

/* GET /v1/models (id NULL) or /v1/models/{id}: OpenAI's list / model object
 * plus `digest`, `tokenizer_digest` and `routes` (route id -> workers). */
int gw_models(gw_ctx *g, const char *id, char **body);
/* GET /health/live: 200 while the process serves HTTP. */
int gw_health_live(gw_ctx *g, char **body);
/* GET /health/ready: 200 when every configured model has a live worker with
 * the same tokenizer, 503 naming what is missing otherwise. */
int gw_health_ready(gw_ctx *g, char **body);
/* GET /metrics: Prometheus text. */
int gw_metrics_page(gw_ctx *g, char **body);

#endif
