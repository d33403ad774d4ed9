/* Fuzz target: the Mamba config.json parser. Accepted configs must satisfy the
 * invariants the model code relies on (positive, bounded, consistent sizes). */
#include <string.h>

#include "common/mamba_config.h"
#include "mbd_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mbd_mamba_config c;
  mbd_error err = {0};
  int rc = mbd_mamba_config_parse((const char *)data, size, "fuzz", &c, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.code == rc && err.msg[0]);
    return 0;
  }
  MBD_FUZZ_CHECK(c.d_model > 0 && c.n_layer > 0 && c.vocab_size > 0 && c.d_state > 0);
  MBD_FUZZ_CHECK(c.d_conv > 0 && c.expand > 0 && c.dt_rank > 0);
  MBD_FUZZ_CHECK((long long)c.d_inner == (long long)c.expand * c.d_model);
  MBD_FUZZ_CHECK(c.norm_eps > 0 && c.norm_eps < 1);
  MBD_FUZZ_CHECK(c.eos_token_id >= -1 && c.eos_token_id < c.vocab_size);
  return 0;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
#define S(txt) {(const uint8_t *)(txt), sizeof(txt) - 1}
  static const mbd_fuzz_seed seeds[] = {
      S("{\"architectures\":[\"MambaForCausalLM\"],\"model_type\":\"mamba\",\"hidden_size\":64,"
        "\"num_hidden_layers\":2,\"vocab_size\":512,\"state_size\":16,\"conv_kernel\":4,"
        "\"expand\":2,\"intermediate_size\":128,\"time_step_rank\":4,\"layer_norm_epsilon\":1e-05,"
        "\"use_conv_bias\":true,\"use_bias\":false,\"residual_in_fp32\":true,"
        "\"tie_word_embeddings\":true,\"eos_token_id\":0}"),
      S("{\"model_type\":\"mamba\",\"hidden_size\":768,\"num_hidden_layers\":24,"
        "\"vocab_size\":50280,\"time_step_rank\":\"auto\",\"eos_token_id\":[0,1]}"),
      S("{\"d_model\":768,\"n_layer\":24,\"vocab_size\":50277,\"ssm_cfg\":{\"d_state\":16},"
        "\"rms_norm\":true,\"residual_in_fp32\":true,\"fused_add_norm\":true,"
        "\"pad_vocab_size_multiple\":8}"),
  };
#undef S
  *out = seeds;
  return sizeof seeds / sizeof seeds[0];
}
