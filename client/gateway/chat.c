/* Chat template recognition (markers, no Jinja) and fixed renderers. */
#include "client/gateway/chat.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      if (cap > (64u << 20)) break; /* a template file is small; stop at 64 MiB */
      cap = cap ? cap * 2 : 8192;
      char *q = realloc(buf, cap);
      if (!q) break;
      buf = q;
    }
    size_t n = fread(buf + len, 1, cap - len - 1, f);
    if (n == 0) break;
    len += n;
  }
  fclose(f);
  if (buf) buf[len] = '\0';
  return buf;
}

static void classify(const char *tpl, const char *where, gw_chat_template *t) {
  if (strstr(tpl, "<|im_start|>") && strstr(tpl, "<|im_end|>")) {
    t->kind = GW_CHAT_CHATML;
    return;
  }
  t->kind = GW_CHAT_NONE;
  snprintf(t->why, sizeof t->why,
           "the chat template in %s is not a form the gateway renders (supported: ChatML)", where);
}

void gw_chat_detect(const char *dir, gw_chat_template *t) {
  char path[1200];
  t->kind = GW_CHAT_NONE;
  snprintf(t->why, sizeof t->why,
           "the model directory has no chat template "
           "(tokenizer_config.json chat_template or chat_template.jinja)");
  snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
  char *s = read_file(path);
  if (s) {
    classify(s, "chat_template.jinja", t);
    free(s);
    return;
  }
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  json_error_t je;
  json_t *cfg = json_load_file(path, 0, &je);
  if (!cfg) return;
  json_t *ct = json_object_get(cfg, "chat_template");
  const char *tpl = json_is_string(ct) ? json_string_value(ct) : NULL;
  if (json_is_array(ct)) { /* [{name, template}]: the "default" one */
    size_t i;
    json_t *e;
    json_array_foreach(ct, i, e) {
      const char *nm = json_string_value(json_object_get(e, "name"));
      if (nm && !strcmp(nm, "default")) tpl = json_string_value(json_object_get(e, "template"));
    }
  }
  if (tpl) classify(tpl, "tokenizer_config.json", t);
  json_decref(cfg);
}

char *gw_chat_render(const gw_chat_template *t, const gw_chat_msg *msgs, size_t n,
                     const char **stop) {
  *stop = NULL;
  if (t->kind != GW_CHAT_CHATML) return NULL;
  size_t len = 64;
  for (size_t i = 0; i < n; i++) len += strlen(msgs[i].role) + strlen(msgs[i].content) + 32;
  char *s = malloc(len), *p = s;
  if (!s) return NULL;
  for (size_t i = 0; i < n; i++)
    p += sprintf(p, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role, msgs[i].content);
  strcpy(p, "<|im_start|>assistant\n");
  *stop = "<|im_end|>";
  return s;
}
