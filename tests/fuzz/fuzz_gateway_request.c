/* Fuzz target: the HTTP gateway's request bodies (POST /v1/completions and
 * /v1/chat/completions; the first byte picks which) and its `route` strings,
 * as any HTTP client sends them. A rejection is a 4xx naming a reason; an
 * accepted request holds only values inside the documented limits. The
 * caller frees in both cases, as the gateway does. */
#include <math.h>
#include <string.h>

#include "client/gateway/request.h"
#include "mbd_fuzz.h"

static void check_route(const uint8_t *data, size_t size) {
  char s[256];
  size_t n = size < sizeof s - 1 ? size : sizeof s - 1;
  memcpy(s, data, n);
  s[n] = '\0';
  mbd_route_want w;
  gw_err e;
  memset(&e, 0, sizeof e);
  if (gw_route_parse(s, &w, &e)) MBD_FUZZ_CHECK(e.http >= 400 && e.http < 500 && e.msg[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  bool chat = data[0] & 1;
  gw_request r;
  gw_err e;
  memset(&e, 0, sizeof e);
  int rc = gw_request_parse((const char *)data + 1, size - 1, chat, &r, &e);
  if (rc) {
    MBD_FUZZ_CHECK(e.http >= 400 && e.http < 500 && e.msg[0] && e.type[0]);
  } else {
    MBD_FUZZ_CHECK(r.chat == chat && r.model[0] && memchr(r.model, 0, sizeof r.model));
    MBD_FUZZ_CHECK(r.max_tokens >= 1 && r.max_tokens <= GW_MAX_TOKENS_CAP);
    MBD_FUZZ_CHECK(r.temperature >= 0 && r.temperature <= 2);
    MBD_FUZZ_CHECK(r.top_p > 0 && r.top_p <= 1);
    MBD_FUZZ_CHECK(r.n >= 1 && r.n <= GW_MAX_N);
    MBD_FUZZ_CHECK((chat ? 1 : r.n_prompts) * (size_t)r.n <= GW_MAX_CHOICES);
    MBD_FUZZ_CHECK(chat ? r.n_msgs > 0 : (r.n_prompts > 0 && r.n_prompts <= GW_MAX_PROMPTS));
    MBD_FUZZ_CHECK(r.n_stop <= GW_MAX_STOP && r.n_stop_ids <= GW_MAX_STOP_IDS);
    MBD_FUZZ_CHECK(r.logprobs >= -1 && r.logprobs <= GW_MAX_LOGPROBS);
    volatile size_t sink = 0;
    for (size_t i = 0; i < r.n_prompts; i++) {
      const gw_prompt *p = &r.prompts[i];
      MBD_FUZZ_CHECK((p->text != NULL) != (p->ids != NULL));
      if (p->text) sink += strlen(p->text) + p->len;
      for (size_t k = 0; k < p->n_ids; k++) sink += (size_t)p->ids[k];
    }
    for (size_t i = 0; i < r.n_msgs; i++) sink += strlen(r.msgs[i].role);
    (void)sink;
  }
  gw_request_free(&r);
  check_route(data + 1, size - 1);
  return 0;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
#define S(txt) {(const uint8_t *)(txt), sizeof(txt) - 1}
  static const mbd_fuzz_seed seeds[] = {
      S("0{\"model\":\"mamba-130m\",\"prompt\":\"Hello\",\"max_tokens\":16,\"seed\":1}"),
      S("0{\"model\":\"m\",\"prompt\":[\"a\",\"b\"],\"n\":2,\"stop\":[\"\\n\"],\"logprobs\":2,"
        "\"echo\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"temperature\":0.8,\"top_p\":0.9,\"route\":\"backend=cpu,dtype=f32\"}"),
      S("0{\"model\":\"m\",\"prompt\":[[1,2,3],[4]],\"max_tokens\":4,\"ignore_eos\":true}"),
      S("1{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
        "\"max_completion_tokens\":8,\"logprobs\":true,\"top_logprobs\":3}"),
      S("1backend=cpu,dtype=bf16,state=f32,gemm_mode=deterministic,family=mamba2,device=0"),
  };
#undef S
  /* the request seeds take the accepting path, or they test nothing */
  for (size_t i = 0; i + 1 < sizeof seeds / sizeof seeds[0]; i++) {
    gw_request r;
    gw_err e;
    MBD_FUZZ_CHECK(gw_request_parse((const char *)seeds[i].data + 1, seeds[i].len - 1,
                                    seeds[i].data[0] & 1, &r, &e) == 0);
    gw_request_free(&r);
  }
  *out = seeds;
  return sizeof seeds / sizeof seeds[0];
}
