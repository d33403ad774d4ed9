/* Fuzz target: the Mamba-3 (state-spaces) config.json parser. Accepted
 * configs must satisfy the invariants the model code relies on: positive
 * sizes, heads that tile d_inner, groups that divide the heads, at least one
 * rotary pair within d_state, a padded vocabulary that holds the real one,
 * and the in_proj width the layer layout implies. */
#include <math.h>
#include <string.h>

#include "kernels/model/mamba3.h"
#include "mbd_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mbd_mamba3_config c;
  mbd_error err = {0};
  int rc = mbd_mamba3_config_parse((const char *)data, size, "fuzz", &c, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.code == rc && err.msg[0]);
    return 0;
  }
  MBD_FUZZ_CHECK(c.d_model > 0 && c.n_layer > 0 && c.vocab_size > 0);
  MBD_FUZZ_CHECK(c.vocab_padded >= c.vocab_size);
  MBD_FUZZ_CHECK(c.d_state >= 2 && c.d_state % 2 == 0 && c.headdim > 0 && c.ngroups > 0);
  MBD_FUZZ_CHECK(c.heads > 0 && (int64_t)c.heads * c.headdim == c.d_inner);
  MBD_FUZZ_CHECK(c.heads % c.ngroups == 0);
  MBD_FUZZ_CHECK(c.angles >= 1 && 2 * c.angles <= c.d_state);
  MBD_FUZZ_CHECK(c.d_in_proj ==
                 2 * c.d_inner + 2 * (int64_t)c.ngroups * c.d_state + 3 * c.heads + c.angles);
  MBD_FUZZ_CHECK(c.rope_fraction == 0.5f || c.rope_fraction == 1.0f);
  MBD_FUZZ_CHECK(isfinite(c.a_floor) && c.a_floor >= 0 && isfinite(c.eps) && c.eps > 0);
  return 0;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
#define S(txt) {(const uint8_t *)(txt), sizeof(txt) - 1}
  static const mbd_fuzz_seed seeds[] = {
      /* the fixtures' layout (state-spaces/mamba's config of a Mamba3 LM) */
      S("{\"d_model\":256,\"d_intermediate\":0,\"n_layer\":4,\"vocab_size\":1536,"
        "\"ssm_cfg\":{\"layer\":\"Mamba3\",\"d_state\":32,\"expand\":2,\"headdim\":32,"
        "\"ngroups\":1,\"rope_fraction\":0.5,\"A_floor\":0.0001,\"is_outproj_norm\":false,"
        "\"is_mimo\":false,\"chunk_size\":16},\"attn_layer_idx\":[],\"attn_cfg\":{},"
        "\"rms_norm\":true,\"residual_in_fp32\":true,\"fused_add_norm\":true,"
        "\"pad_vocab_size_multiple\":8,\"tie_embeddings\":true}"),
      S("{\"d_model\":64,\"n_layer\":2,\"vocab_size\":512,\"ssm_cfg\":{\"layer\":\"Mamba3\","
        "\"d_state\":16,\"headdim\":16,\"ngroups\":2,\"rope_fraction\":1.0,"
        "\"is_outproj_norm\":true},\"tie_embeddings\":false}"),
      /* refused: MIMO, attention layers, a fractional expand that leaves no head */
      S("{\"d_model\":64,\"n_layer\":2,\"vocab_size\":512,\"ssm_cfg\":{\"layer\":\"Mamba3\","
        "\"is_mimo\":true}}"),
      S("{\"d_model\":64,\"n_layer\":2,\"vocab_size\":512,\"ssm_cfg\":{\"layer\":\"Mamba3\"},"
        "\"attn_layer_idx\":[1]}"),
      S("{\"d_model\":64,\"n_layer\":2,\"vocab_size\":512,\"ssm_cfg\":{\"layer\":\"Mamba3\","
        "\"expand\":1e-300,\"headdim\":16}}"),
  };
#undef S
  *out = seeds;
  return sizeof seeds / sizeof seeds[0];
}
