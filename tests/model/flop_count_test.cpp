// runtime/model/flop_count.h: the FLOPs ltm-bench and scripts/bench_serve divide by, checked
// against figures worked out by hand and against a token-by-token sum.
#include "runtime/model/flop_count.h"

#include "gtest/gtest.h"

namespace ltm {
namespace {

ModelConfig gpt2_124m() {
  ModelConfig c;
  c.vocab_size = 50257;
  c.n_positions = 1024;
  c.n_embd = 768;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_inner = 3072;
  return c;
}

// Qwen2-0.5B's shape: grouped-query attention (14 query heads, 2 KV heads of 64), SwiGLU.
ModelConfig qwen2_05b() {
  ModelConfig c;
  c.family = Family::kLlama;
  c.vocab_size = 151936;
  c.n_positions = 32768;
  c.n_embd = 896;
  c.n_layer = 24;
  c.n_head = 14;
  c.n_kv_head = 2;
  c.n_inner = 4864;
  return c;
}

TEST(FlopCount, Gpt2HandWorkedFigures) {
  const ModelConfig c = gpt2_124m();
  EXPECT_DOUBLE_EQ(layer_matrix_macs(c), 12.0 * 768 * 768);            // 7,077,888
  EXPECT_DOUBLE_EQ(matrix_flops_per_token(c), 169869312.0);             // 2 x 12 layers
  EXPECT_DOUBLE_EQ(lm_head_flops(c), 77194752.0);                       // 2 x 50257 x 768
  EXPECT_DOUBLE_EQ(attention_flops(c, 1), 36864.0);                     // 4 x 12 x 768
  // 32 prompt tokens: 32 x 169,869,312 + 36,864 x (1 + ... + 32 = 528) + 77,194,752.
  EXPECT_DOUBLE_EQ(prefill_flops(c, 32), 5532476928.0);
  EXPECT_DOUBLE_EQ(decode_step_flops(c, 40), 169869312.0 + 77194752.0 + 36864.0 * 40);
}

TEST(FlopCount, MatricesAndHeadAreTwiceTheMatrixParameters) {
  // GPT-2's parameters = V d + P d (positions) + L (12 d^2 + 13 d) + 2 d; the matrices and the
  // head are all of it but the positions, the biases and the norms.
  const ModelConfig c = gpt2_124m();
  const double d = 768, matrix_params = c.parameter_count() - 1024 * d - 12 * 13 * d - 2 * d;
  EXPECT_DOUBLE_EQ(matrix_flops_per_token(c) + lm_head_flops(c), 2 * matrix_params);
}

TEST(FlopCount, GroupedQueryAttentionAndSwiGlu) {
  const ModelConfig c = qwen2_05b();
  // Q 896x896, K and V 896x128, O 896x896, gate/up/down 896x4864.
  EXPECT_DOUBLE_EQ(layer_matrix_macs(c), 896.0 * 896 * 2 + 896.0 * 128 * 2 + 3.0 * 896 * 4864);
  // Attention scores against every query head: 4 x layers x q_width.
  EXPECT_DOUBLE_EQ(attention_flops(c, 10), 4.0 * 24 * 896 * 10);
}

TEST(FlopCount, RequestIsTheSumOfItsTokens) {
  for (const ModelConfig& c : {gpt2_124m(), qwen2_05b()}) {
    for (int64_t prompt : {1, 7, 32}) {
      for (int64_t fresh : {1, 2, 64}) {
        // Token by token: prompt tokens at positions 0..prompt-1, the head once; then each decode
        // step at positions prompt .. prompt + fresh - 2, with the head each time.
        double sum = 0;
        for (int64_t p = 0; p < prompt; ++p)
          sum += matrix_flops_per_token(c) + attention_flops(c, p + 1);
        sum += lm_head_flops(c);
        const double prefill = sum;
        for (int64_t p = prompt; p < prompt + fresh - 1; ++p) sum += decode_step_flops(c, p + 1);
        EXPECT_NEAR(prefill_flops(c, prompt), prefill, 1e-12 * prefill) << prompt;
        EXPECT_NEAR(decode_flops(c, prompt, fresh), sum - prefill, 1e-12 * sum + 1e-9)
            << prompt << " " << fresh;
        EXPECT_NEAR(request_flops(c, prompt, fresh), sum, 1e-12 * sum) << prompt << " " << fresh;
      }
    }
  }
}

}  // namespace
}  // namespace ltm
