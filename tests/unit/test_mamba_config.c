/* Mamba config.json: the fixture configs, the older state-spaces layout,
 * defaults as transformers applies them, rejections naming the field, and a
 * write -> load round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mamba_config.h"

static int parse(const char *json, mbd_mamba_config *c, mbd_error *err) {
  return mbd_mamba_config_parse(json, strlen(json), "cfg.json", c, err);
}

static void test_fixtures(void **state) {
  (void)state;
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char dir[512];
  snprintf(dir, sizeof dir, "%s/mamba1/tiny-d64", fx ? fx : "");
  if (!fx || access(dir, R_OK)) {
    print_message("fixtures not found (%s); set MBD_FIXTURES_DIR\n", dir);
    skip();
  }
  mbd_mamba_config c;
  mbd_error err = {0};
  assert_int_equal(mbd_mamba_config_load(dir, &c, &err), MBD_OK); /* directory form */
  assert_int_equal(c.d_model, 64);
  assert_int_equal(c.n_layer, 2);
  assert_int_equal(c.vocab_size, 512);
  assert_int_equal(c.d_state, 16);
  assert_int_equal(c.d_conv, 4);
  assert_int_equal(c.expand, 2);
  assert_int_equal(c.d_inner, 128);
  assert_int_equal(c.dt_rank, 4);
  assert_true(c.norm_eps == 1e-5f);
  assert_true(c.conv_bias);
  assert_false(c.proj_bias);
  assert_true(c.residual_in_fp32);
  assert_true(c.tie_embeddings);
  assert_int_equal(c.eos_token_id, 0);


  /* The file form gives the same config as the directory form. */
  mbd_mamba_config f;
  char file[600];
  snprintf(file, sizeof file, "%s/config.json", dir);
  assert_int_equal(mbd_mamba_config_load(file, &f, &err), MBD_OK);
  assert_memory_equal(&f, &c, sizeof f);
}

/* small-d256 lives only in the shared fixtures (not in tests/fixtures). */
static void test_fixture_small(void **state) {
  (void)state;
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char dir[512];
  snprintf(dir, sizeof dir, "%s/mamba1/small-d256/config.json", fx ? fx : "");
  if (!fx || access(dir, R_OK)) {
    print_message("small-d256 fixture not found (%s): only the shared fixtures have it\n", dir);
    skip();
  }
  mbd_mamba_config c;
  mbd_error err = {0};
  assert_int_equal(mbd_mamba_config_load(dir, &c, &err), MBD_OK);
  assert_int_equal(c.d_model, 256);
  assert_int_equal(c.n_layer, 4);
  assert_int_equal(c.vocab_size, 2048);
  assert_int_equal(c.d_inner, 512);
  assert_int_equal(c.dt_rank, 16);
}

static void test_defaults_and_auto(void **state) {
  (void)state;
  mbd_mamba_config c;
  mbd_error err = {0};
  assert_int_equal(parse("{\"model_type\":\"mamba\",\"hidden_size\":100,\"num_hidden_layers\":3,"
                         "\"vocab_size\":1000,\"time_step_rank\":\"auto\"}",
                         &c, &err),
                   MBD_OK);
  assert_int_equal(c.dt_rank, 7); /* ceil(100 / 16) */
  assert_int_equal(c.d_state, 16);
  assert_int_equal(c.d_conv, 4);
  assert_int_equal(c.expand, 2);
  assert_int_equal(c.d_inner, 200);
  assert_true(c.norm_eps == 1e-5f);
  assert_true(c.conv_bias);
  assert_false(c.proj_bias);
  assert_true(c.residual_in_fp32);
  assert_true(c.tie_embeddings);
  assert_int_equal(c.eos_token_id, -1);
  /* Missing time_step_rank is "auto" too; eos as a list takes the first. */
  assert_int_equal(parse("{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                         "\"vocab_size\":10,\"eos_token_id\":[3,4],\"tie_word_embeddings\":false,"
                         "\"use_bias\":true,\"expand\":2.0}",
                         &c, &err),
                   MBD_OK);
  assert_int_equal(c.dt_rank, 4);
  assert_int_equal(c.eos_token_id, 3);
  assert_false(c.tie_embeddings);
  assert_true(c.proj_bias);
}

static void test_legacy_layout(void **state) {
  (void)state;
  mbd_mamba_config c;
  mbd_error err = {0};
  assert_int_equal(parse("{\"d_model\":768,\"n_layer\":24,\"vocab_size\":50277,"
                         "\"ssm_cfg\":{\"d_state\":8,\"d_conv\":3},\"rms_norm\":true,"
                         "\"residual_in_fp32\":true,\"fused_add_norm\":true,"
                         "\"pad_vocab_size_multiple\":8}",
                         &c, &err),
                   MBD_OK);
  assert_int_equal(c.d_model, 768);
  assert_int_equal(c.n_layer, 24);
  assert_int_equal(c.vocab_size, 50280); /* padded like the checkpoint's embedding */
  assert_int_equal(c.d_state, 8);
  assert_int_equal(c.d_conv, 3);
  assert_int_equal(c.d_inner, 1536);
  assert_int_equal(c.dt_rank, 48);
  assert_int_equal(parse("{\"d_model\":64,\"n_layer\":1,\"vocab_size\":8,\"rms_norm\":false}", &c,
                         &err),
                   MBD_E_UNSUPPORTED);
  assert_int_equal(parse("{\"d_model\":64,\"n_layer\":1,\"vocab_size\":8,"
                         "\"ssm_cfg\":{\"layer\":\"Mamba2\"}}",
                         &c, &err),
                   MBD_E_UNSUPPORTED);
}

static void test_rejections(void **state) {
  (void)state;
  static const struct {
    const char *json;
    int code;
    const char *needle;
  } bad[] = {
      {"", MBD_E_FORMAT, "not valid JSON"},
      {"{\"model_type\":\"mamba\",", MBD_E_FORMAT, "not valid JSON"},
      {"[1,2]", MBD_E_FORMAT, "object"},
      {"{\"model_type\":\"mamba2\",\"hidden_size\":64}", MBD_E_UNSUPPORTED, "'mamba2'"},
      {"{\"model_type\":\"llama\"}", MBD_E_UNSUPPORTED, "only 'mamba'"},
      {"{\"model_type\":7}", MBD_E_UNSUPPORTED, "model_type"},
      {"{\"hidden_size\":64}", MBD_E_FORMAT, "model_type"},
      {"{\"model_type\":\"mamba\",\"num_hidden_layers\":2,\"vocab_size\":5}", MBD_E_FORMAT,
       "'hidden_size' is missing"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"vocab_size\":5}", MBD_E_FORMAT,
       "'num_hidden_layers' is missing"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2}", MBD_E_FORMAT,
       "'vocab_size' is missing"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":0,\"num_hidden_layers\":2,\"vocab_size\":5}",
       MBD_E_FORMAT, "'hidden_size' is 0"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":-64,\"num_hidden_layers\":2,\"vocab_size\":5}",
       MBD_E_FORMAT, "'hidden_size'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":\"64\",\"num_hidden_layers\":2,\"vocab_size\":5}",
       MBD_E_FORMAT, "'hidden_size' must be an integer"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64.5,\"num_hidden_layers\":2,\"vocab_size\":5}",
       MBD_E_FORMAT, "'hidden_size'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":99999999999,\"num_hidden_layers\":2,"
       "\"vocab_size\":5}",
       MBD_E_FORMAT, "'hidden_size'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"state_size\":0}",
       MBD_E_FORMAT, "'state_size'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"intermediate_size\":100}",
       MBD_E_FORMAT, "intermediate_size 100"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"time_step_rank\":\"big\"}",
       MBD_E_FORMAT, "'time_step_rank'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"time_step_rank\":0}",
       MBD_E_FORMAT, "'time_step_rank'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"layer_norm_epsilon\":-1}",
       MBD_E_FORMAT, "'layer_norm_epsilon'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"layer_norm_epsilon\":1e-51}", /* found by the fuzzer: 0 as a float */
       MBD_E_FORMAT, "'layer_norm_epsilon'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"layer_norm_epsilon\":0.999999999}",
       MBD_E_FORMAT, "'layer_norm_epsilon'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"layer_norm_epsilon\":\"x\"}",
       MBD_E_FORMAT, "'layer_norm_epsilon'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"use_bias\":1}",
       MBD_E_FORMAT, "'use_bias' must be true or false"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"eos_token_id\":5}",
       MBD_E_FORMAT, "'eos_token_id'"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":1048576,\"num_hidden_layers\":2,"
       "\"vocab_size\":5,\"expand\":64}",
       MBD_E_FORMAT, "too large"},
      {"{\"model_type\":\"mamba\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":5,"
       "\"ssm_cfg\":3}",
       MBD_E_FORMAT, "'ssm_cfg'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mbd_mamba_config c;
    mbd_error err = {0};
    int rc = parse(bad[i].json, &c, &err);
    if (rc != bad[i].code || err.code != rc || !strstr(err.msg, "cfg.json") ||
        !strstr(err.msg, bad[i].needle))
      fail_msg("case %zu (%s): rc %d want %d; msg '%s' want '%s'", i, bad[i].json, rc, bad[i].code,
               err.msg, bad[i].needle);
  }
  mbd_mamba_config c;
  mbd_error err = {0};
  assert_int_equal(mbd_mamba_config_parse(NULL, 0, NULL, &c, &err), MBD_E_FORMAT);
  assert_int_equal(mbd_mamba_config_load("/nonexistent/dir", &c, &err), MBD_E_IO);
  assert_non_null(strstr(err.msg, "/nonexistent/dir"));
}

static void test_write_round_trip(void **state) {
  (void)state;
  char dir[] = "/tmp/mbd_cfg_test_XXXXXX";
  assert_non_null(mkdtemp(dir));
  mbd_mamba_config in = {.d_model = 96, .n_layer = 5, .vocab_size = 777, .d_state = 8,
                         .d_conv = 3, .expand = 3, .d_inner = 288, .dt_rank = 6,
                         .norm_eps = 1e-6f, .conv_bias = false, .proj_bias = true,
                         .residual_in_fp32 = false, .tie_embeddings = false,
                         .eos_token_id = 2};
  mbd_error err = {0};
  assert_int_equal(mbd_mamba_config_write(&in, dir, &err), MBD_OK); /* DIR -> DIR/config.json */
  mbd_mamba_config out;
  assert_int_equal(mbd_mamba_config_load(dir, &out, &err), MBD_OK);
  assert_memory_equal(&in, &out, sizeof in);
  char path[128];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char text[4096] = {0};
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  assert_true(n > 0);
  /* What transformers needs to build MambaForCausalLM, in its spelling. */
  assert_non_null(strstr(text, "\"model_type\": \"mamba\""));
  assert_non_null(strstr(text, "\"MambaForCausalLM\""));
  assert_non_null(strstr(text, "\"layer_norm_epsilon\": 1e-6"));
  assert_non_null(strstr(text, "\"intermediate_size\": 288"));
  assert_non_null(strstr(text, "\"time_step_rank\": 6"));
  /* No eos: written as null, read back as -1. */
  in.eos_token_id = -1;
  assert_int_equal(mbd_mamba_config_write(&in, path, &err), MBD_OK);
  assert_int_equal(mbd_mamba_config_load(path, &out, &err), MBD_OK);
  assert_int_equal(out.eos_token_id, -1);
  unlink(path);
  assert_int_equal(rmdir(dir), 0); /* no temp file left behind */
  assert_int_equal(mbd_mamba_config_write(&in, "/nonexistent/dir/config.json", &err), MBD_E_IO);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixtures),   cmocka_unit_test(test_fixture_small),
      cmocka_unit_test(test_defaults_and_auto),
      cmocka_unit_test(test_legacy_layout), cmocka_unit_test(test_rejections),
      cmocka_unit_test(test_write_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
