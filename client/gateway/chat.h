/* Chat templates: which of a model directory's templates the gateway can
 * render, and rendering messages into a prompt. The gateway runs no Jinja:
 * it recognises template families by their markers and renders each family
 * with fixed code. Supported: ChatML (`<|im_start|>role\ncontent<|im_end|>\n`,
 * as Qwen, Hermes, Yi and many fine-tunes use). The template is read from
 * tokenizer_config.json's `chat_template` (a string, or the entry named
 * "default" of a list) or from chat_template.jinja. */
#ifndef MBD_GW_CHAT_H
#define MBD_GW_CHAT_H

#include <stddef.h>

#include "client/gateway/errors.h"

typedef enum gw_chat_kind {
  GW_CHAT_NONE = 0, /* no template, or one we cannot render */
  GW_CHAT_CHATML,
} gw_chat_kind;

typedef struct gw_chat_template {
  gw_chat_kind kind;
  char why[256]; /* GW_CHAT_NONE: what was found ("no chat_template in ..."); for the 400 */
} gw_chat_template;

/* Inspects dir (never fails: an unreadable or unknown template is GW_CHAT_NONE
 * with the reason in why). */
void gw_chat_detect(const char *dir, gw_chat_template *t);

/* A chat message of a parsed request (strings owned by the request). */
typedef struct gw_chat_msg {
  char *role;    /* "system" | "user" | "assistant" | "tool" ... */
  char *content; /* text parts joined */
} gw_chat_msg;

/* Renders msgs with the generation prompt for the assistant appended
 * (malloc'd text, caller frees). Also names the family's end-of-turn string
 * in *stop (static). */
char *gw_chat_render(const gw_chat_template *t, const gw_chat_msg *msgs, size_t n,
                     const char **stop);

#endif
