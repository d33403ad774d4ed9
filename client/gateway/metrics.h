/* The gateway's Prometheus metrics: request counters by endpoint, model and
 * HTTP status, token counters, latency histograms, running/waiting gauges,
 * and (rendered from the broker's STATUS at scrape time) per-worker gauges.
 * docs/http.md lists every metric. All calls are thread-safe. */
#ifndef MBD_GW_METRICS_H
#define MBD_GW_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "client/mambad.h"

typedef struct gw_metrics gw_metrics;

typedef enum gw_hist {
  GW_H_TTFT = 0, /* arrival -> first generated token, seconds */
  GW_H_ITL,      /* between two generated tokens, seconds (per token) */
  GW_H_E2E,      /* arrival -> response complete, seconds */
  GW_H_QUEUE,    /* arrival -> generation session open on a worker, seconds */
  GW_H_BATCH,    /* per GENERATE: most rows of any batched model step it ran in */
  GW_H_COUNT
} gw_hist;

/* names[0..n) are the configured models (copied). NULL on out of memory. */
gw_metrics *gw_metrics_new(size_t n, const char *const *names);
void gw_metrics_destroy(gw_metrics **m);

/* One answered request: model index (-1: none or unknown), endpoint path and
 * HTTP status. */
void gw_metrics_request(gw_metrics *m, int model, const char *endpoint, int http);
void gw_metrics_tokens(gw_metrics *m, int model, int64_t prompt, int64_t generated);
void gw_metrics_observe(gw_metrics *m, int model, gw_hist h, double value);
/* A finished generation (one choice) and why: "stop", "length", "cancelled", "error". */
void gw_metrics_finished(gw_metrics *m, int model, const char *reason);
/* Gauges: requests generating now / waiting for a generation slot. */
void gw_metrics_running(gw_metrics *m, int delta);
void gw_metrics_waiting(gw_metrics *m, int delta);
int64_t gw_metrics_waiting_now(gw_metrics *m);

/* The text exposition (malloc'd, caller frees); r (may be NULL) adds the
 * per-worker gauges. NULL on out of memory. */
char *gw_metrics_render(gw_metrics *m, const mbd_status_report *r);

#endif
