/* Completion and chat-completion requests: the JSON body (OpenAI's fields
 * plus the `route` extension) parsed and checked into plain data. Every
 * rejection is a 400 naming the field. Token ids are range-checked against
 * the vocabulary later, once the model is known. */
#ifndef MBD_GW_REQUEST_H
#define MBD_GW_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/gateway/chat.h"
#include "client/gateway/errors.h"
#include "common/route.h"

#define GW_MAX_PROMPTS 64  /* prompts in one request */
#define GW_MAX_N 16        /* choices per prompt */
#define GW_MAX_CHOICES 128 /* prompts x n */
#define GW_MAX_STOP 4      /* stop strings (OpenAI's limit) */
#define GW_MAX_STOP_IDS 32 /* stop token ids (extension) */
#define GW_MAX_TOKENS_CAP 65536
#define GW_MAX_LOGPROBS 5

typedef struct gw_prompt {
  char *text;   /* UTF-8 prompt (owned), NULL when given as token ids */
  size_t len;   /* bytes of text */
  int64_t *ids; /* token-id prompt (owned), NULL when given as text */
  size_t n_ids;
} gw_prompt;

typedef struct gw_request {
  bool chat; /* /v1/chat/completions */
  char model[64];
  size_t n_prompts; /* completions */
  gw_prompt *prompts;
  size_t n_msgs; /* chat */
  gw_chat_msg *msgs;
  int64_t max_tokens; /* 1..GW_MAX_TOKENS_CAP */
  double temperature; /* 0..2, default 1 */
  double top_p;       /* (0,1], default 1 */
  uint64_t seed;      /* default 0: requests are reproducible unless seeds differ */
  int n;              /* choices per prompt */
  size_t n_stop;
  char *stop[GW_MAX_STOP]; /* owned stop strings */
  size_t n_stop_ids;
  int64_t stop_ids[GW_MAX_STOP_IDS];
  bool stream;
  bool include_usage; /* stream_options.include_usage */
  int logprobs;       /* top-k per token, -1 = none (completions: 0..5) */
  bool echo;
  bool ignore_eos; /* extension (as vLLM's): do not stop at the end-of-text token */
  bool has_route;  /* `route` given */
  mbd_route_want route;
} gw_request;

/* Parses body[0..len) into *r (zeroed first). chat selects the chat shape. */
int gw_request_parse(const char *body, size_t len, bool chat, gw_request *r, gw_err *e);
void gw_request_free(gw_request *r);

/* Parses a `route` string: an id (>= 8 hex digits) or constraints
 * "backend=cpu,dtype=f32,state=f32,gemm_mode=...,family=...,device=...,route_id=...". */
int gw_route_parse(const char *s, mbd_route_want *w, gw_err *e);

#endif
