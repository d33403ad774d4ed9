/* The HTTP server (libmicrohttpd, one thread per connection): routing,
 * request bodies (capped), connection limits and timeouts, JSON and SSE
 * responses, and the per-request metrics. */
#ifndef MBD_GW_HTTP_H
#define MBD_GW_HTTP_H

#include "client/gateway/gateway.h"

typedef struct gw_http gw_http;

/* Starts listening on g->opt.host:port (g must outlive the server). */
int gw_http_start(gw_ctx *g, gw_http **out, char *msg, size_t cap);
/* The port actually bound (for --port 0). */
int gw_http_port(const gw_http *h);
void gw_http_stop(gw_http **h);

#endif
