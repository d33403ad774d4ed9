/* Fuzz target: the Mamba-2 config.json parser. Accepted configs must satisfy
 * the invariants the model code relies on: positive sizes, heads that tile
 * d_inner, groups that divide the heads, sane limits. */
#include <math.h>
#include <string.h>

#include "kernels/model/mamba2.h"
#include "mbd_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mbd_mamba2_config c;
  mbd_error err = {0};
  int rc = mbd_mamba2_config_parse((const char *)data, size, "fuzz", &c, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.code == rc && err.msg[0]);
    return 0;
  }
  MBD_FUZZ_CHECK(c.d_model > 0 && c.n_layer > 0 && c.vocab_size > 0 && c.d_state > 0);
  MBD_FUZZ_CHECK(c.d_conv > 0 && c.expand > 0 && c.chunk_size > 0);
  MBD_FUZZ_CHECK(c.n_heads > 0 && c.head_dim > 0 && c.n_groups > 0);
  MBD_FUZZ_CHECK((long long)c.n_heads * c.head_dim == c.d_inner);
  MBD_FUZZ_CHECK(c.n_heads % c.n_groups == 0);
  MBD_FUZZ_CHECK(isfinite(c.norm_eps) && c.norm_eps > 0);
  MBD_FUZZ_CHECK(!isnan(c.dt_min) && !isnan(c.dt_max) && c.dt_min <= c.dt_max);
  MBD_FUZZ_CHECK(c.eos_token_id >= -1 && c.eos_token_id < c.vocab_size);
  return 0;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
#define S(txt) {(const uint8_t *)(txt), sizeof(txt) - 1}
  static const mbd_fuzz_seed seeds[] = {
      S("{\"model_type\":\"mamba2\",\"hidden_size\":768,\"num_hidden_layers\":24,"
        "\"vocab_size\":50288,\"state_size\":128,\"conv_kernel\":4,\"expand\":2,"
        "\"num_heads\":24,\"head_dim\":64,\"n_groups\":1,\"chunk_size\":256,"
        "\"layer_norm_epsilon\":1e-05,\"time_step_limit\":[0.0,1e30],\"use_conv_bias\":true,"
        "\"use_bias\":false,\"norm_before_gate\":false,\"tie_word_embeddings\":true,"
        "\"eos_token_id\":0}"),
      S("{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_hidden_layers\":2,"
        "\"vocab_size\":512,\"state_size\":16,\"num_heads\":4,\"head_dim\":32,\"n_groups\":2,"
        "\"chunk_size\":8,\"time_step_limit\":[0.001,0.1],\"eos_token_id\":[0,2]}"),
      /* values a double holds and a float does not: refused, not rounded to 0 or inf */
      S("{\"model_type\":\"mamba2\",\"hidden_size\":64,\"num_hidden_layers\":2,"
        "\"vocab_size\":512,\"num_heads\":4,\"head_dim\":32,\"layer_norm_epsilon\":1e-95,"
        "\"time_step_limit\":[1e300,1e301]}"),
  };
#undef S
  *out = seeds;
  return sizeof seeds / sizeof seeds[0];
}
