/* config.json loading with Python's non-finite float tokens (see
 * config_json.h). */
#include "kernels/model/config_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIG (16u << 20)

/* Copies text[0..n) into a new string with Infinity / -Infinity / NaN
 * outside strings replaced by {"__float__": "..."}. */
static char *rewrite(const char *text, size_t n) {
  static const char *const toks[] = {"-Infinity", "Infinity", "NaN"};
  size_t cap = 2 * n + 64, o = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  int in_str = 0;
  for (size_t i = 0; i < n;) {
    const char ch = text[i];
    if (in_str) {
      out[o++] = ch;
      if (ch == '\\' && i + 1 < n) out[o++] = text[++i];
      else if (ch == '"') in_str = 0;
      i++;
    } else if (ch == '"') {
      in_str = 1;
      out[o++] = text[i++];
    } else {
      size_t k = 0;
      for (; k < 3; k++)
        if (!strncmp(text + i, toks[k], strlen(toks[k]))) break;
      if (k < 3) {
        const size_t need = strlen(toks[k]) + 20;
        if (o + need >= cap) {
          char *g = realloc(out, cap = 2 * cap + need);
          if (!g) {
            free(out);
            return NULL;
          }
          out = g;
        }
        o += (size_t)snprintf(out + o, cap - o, "{\"__float__\":\"%s\"}", toks[k]);
        i += strlen(toks[k]);
      } else {
        out[o++] = text[i++];
      }
    }
    if (o + 32 >= cap) {
      char *g = realloc(out, cap *= 2);
      if (!g) {
        free(out);
        return NULL;
      }
      out = g;
    }
  }
  out[o] = '\0';
  return out;
}

json_t *mbd_config_json_load(const char *path, json_error_t *e) {
  json_t *root = json_load_file(path, 0, e);
  if (root) return root;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL; /* e says why */
  char *text = malloc(MAX_CONFIG + 1);
  size_t n = text ? fread(text, 1, MAX_CONFIG, f) : 0;
  fclose(f);
  if (!text) return NULL;
  char *fixed = rewrite(text, n);
  free(text);
  if (!fixed) return NULL;
  json_error_t e2;
  root = json_loads(fixed, 0, &e2);
  free(fixed);
  return root; /* on failure e keeps the first parse's error */
}
