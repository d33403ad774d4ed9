/* POST /v1/completions and /v1/chat/completions: a parsed request becomes
 * one generation per (prompt, choice) on the broker, each in its own
 * session: OPEN on a route, PREFILL the prompt, GENERATE in chunks of
 * chunk_tokens (so a stop string or a client that went away ends the work
 * within a chunk), CLOSE. Text comes from the incremental detokenizer
 * through the stop-string matcher. Choices after the first are pinned to
 * the first one's route, whose id is the response's system_fingerprint.
 *
 * Sampling seeds: choice j of a prompt uses seed + j; its k-th chunk uses
 * that seed for k = 0 and a SplitMix64 mix of (seed, k) after, so the text
 * depends only on the request and the route. */
#ifndef MBD_GW_COMPLETIONS_H
#define MBD_GW_COMPLETIONS_H

#include "client/gateway/gateway.h"
#include "client/gateway/request.h"
#include "client/gateway/sse.h"

typedef struct gw_job gw_job;

/* Checks the model, renders and tokenizes the prompts, takes a generation
 * slot and (for streams) opens the first session, so that every failure a
 * client can cause is answered before any byte of a stream: *out owns req's
 * contents afterwards (req is zeroed). t0: arrival (gw_now_s). */
int gw_job_prepare(gw_ctx *g, gw_request *req, double t0, gw_job **out, gw_err *e);
int gw_job_model(const gw_job *j); /* model index for metrics */
/* The client's socket, watched during a buffered job: a client that hangs up
 * stops the generation at the next token's chunk end (answer: 499). */
void gw_job_watch(gw_job *j, int fd);
/* Runs a non-streamed job: *body is the JSON response (malloc'd). */
int gw_job_run(gw_job *j, char **body, gw_err *e);
/* Runs a streamed job, writing chunks (and `data: [DONE]`) to s. Errors
 * after the first byte are sent as a `data: {"error": ...}` event. */
void gw_job_stream(gw_job *j, gw_sse *s);
/* Releases the slot, open sessions and everything else. NULL-safe. */
void gw_job_destroy(gw_job **j);

#endif
