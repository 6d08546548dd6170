// The Llama family's tensors (HF LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM names)
// read into the layout Model::forward runs for both families (model.h's LayerWeights):
//   q_proj | k_proj | v_proj  -> attn_qkv_w [d, q + 2 kv]: this rank's Q heads, then its KV heads
//   o_proj                    -> attn_proj_w [q, d]: the input columns of this rank's Q heads
//   gate_proj | up_proj       -> mlp_fc_w [d, 2 d_ff_local]: this rank's FFN columns of each
//   down_proj                 -> mlp_proj_w [d_ff_local, d]
//   input_layernorm, post_attention_layernorm, model.norm -> ln_1_g, ln_2_g, ln_f_g
//   embed_tokens (and lm_head when untied) -> vocab rows, as GPT-2's wte.
// nn.Linear stores [out, in]; the matmul weights are [in, out], so each is read transposed.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "runtime/model/model.h"

namespace ltm {

using parallel::Range;

DeviceBuffer Model::load_linear(const WeightSource& source, const std::vector<LinearPart>& parts,
                                Range in_range, const LoraSlice* merge) {
  const int64_t in = in_range.size();
  constexpr int64_t kChunkBytes = 8 << 20;
  int64_t cols = 0;
  for (const LinearPart& p : parts) cols += p.out_end - p.out_begin;
  weight_bytes_ += static_cast<uint64_t>(static_cast<double>(in * cols) *
                                         weight_element_bytes(weight_precision_));
  DeviceBuffer out = backend_.alloc_weight(in, cols, weight_precision_);
  // Whole groups of 32 rows per chunk (int8 weights: a scale per 32 rows of a column).
  const int64_t chunk =
      std::max<int64_t>(32, kChunkBytes / (cols * int64_t{sizeof(float)}) / 32 * 32);
  std::vector<float> host, tmp;
  for (int64_t r0 = 0; r0 < in; r0 += chunk) {
    const int64_t r1 = std::min(in, r0 + chunk), rows = r1 - r0;
    host.resize(static_cast<size_t>(rows * cols));
    int64_t col0 = 0;
    for (const LinearPart& p : parts) {
      const int64_t pc = p.out_end - p.out_begin;
      // Stored rows [out_begin, out_end) x columns [r0, r1): W's rows r0..r1, transposed.
      tmp.resize(static_cast<size_t>(pc * rows));
      source.read_f32(p.name, {p.out_begin, p.out_end, in_range.begin + r0, in_range.begin + r1},
                      tmp.data());
      // Transposed in 32 x 32 tiles (a plain double loop misses the cache on every store).
      constexpr int64_t kTile = 32;
#pragma omp parallel for schedule(static) if (pc * rows > (1 << 16))
      for (int64_t o0 = 0; o0 < pc; o0 += kTile)
        for (int64_t r0t = 0; r0t < rows; r0t += kTile)
          for (int64_t o = o0; o < std::min(pc, o0 + kTile); ++o)
            for (int64_t r = r0t; r < std::min(rows, r0t + kTile); ++r)
              host[r * cols + col0 + o] = tmp[o * rows + r];
      col0 += pc;
    }
    if (merge != nullptr) {
      LTM_ASSERT(merge->in == in && merge->out == cols);
      absl::Status st = merge_lora_rows(*merge, host.data(), r0, r1);
      if (!st.ok() && merge_status_.ok())
        merge_status_ = absl::InvalidArgumentError(absl::StrCat(
            "--lora-merge of ", merge_->dir(), " into ", parts[0].name, ": ", st.message()));
    }
    backend_.write_weight_rows(out, host.data(), r0, r1, in, cols);
  }
  return out;
}

absl::Status Model::load_llama_weights(const WeightSource& source) {
  const ModelConfig& c = config_;
  const int64_t d = d_, hd = head_dim_, V = c.vocab_size;
  const bool whole = shard_.tp == 1;
  auto vec = [&](const std::string& name, int64_t n) {  // a replicated vector
    return load_tensor(source, name, {{0, n, 0, 1}}, n, 1, true);
  };
  // Rows of the stored Q and K/V projections (and biases) that are this rank's heads.
  const int64_t q0 = heads_.begin * hd, q1 = heads_.end * hd;
  const int64_t kv0 = kv_heads_.begin * hd, kv1 = kv_heads_.end * hd;
  const int64_t f0 = ffn_.begin, f1 = ffn_.end;

  inv_freq_ = [&] {
    const std::vector<float> f = rope_inv_freq(c);
    return backend_.upload(f.data(), f.size() * sizeof(float), false);
  }();
  const int64_t real = parallel::valid_rows(vocab_, V);
  const SliceSpec vocab_rows{vocab_.begin, vocab_.begin + real, 0, d};
  if (shard_.is_first_stage() || (shard_.is_last_stage() && c.tied_lm_head))
    wte_ = load_tensor(source, "model.embed_tokens.weight", {vocab_rows}, vocab_.size(), d, whole,
                       TensorUse::kEmbedding);
  if (shard_.is_last_stage()) {
    if (!c.tied_lm_head)
      lm_head_ = load_tensor(source, "lm_head.weight", {vocab_rows}, vocab_.size(), d, whole,
                             TensorUse::kEmbedding);
    ln_f_g_ = vec("model.norm.weight", d);
  }
  for (int64_t l = layers_.begin; l < layers_.end; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const LayerMerge fold = merge_slices(l);
    LayerWeights w;
    w.ln_1_g = vec(p + "input_layernorm.weight", d);
    w.attn_qkv_w = load_linear(source,
                               {{p + "self_attn.q_proj.weight", q0, q1},
                                {p + "self_attn.k_proj.weight", kv0, kv1},
                                {p + "self_attn.v_proj.weight", kv0, kv1}},
                               {0, d}, fold(LoraModule::kAttnQkv));
    if (c.qkv_bias) {
      std::vector<float> bias(static_cast<size_t>(qkv_cols_));
      source.read_f32(p + "self_attn.q_proj.bias", {q0, q1, 0, 1}, bias.data());
      source.read_f32(p + "self_attn.k_proj.bias", {kv0, kv1, 0, 1}, bias.data() + d_local_);
      source.read_f32(p + "self_attn.v_proj.bias", {kv0, kv1, 0, 1},
                      bias.data() + d_local_ + kv_local_);
      weight_bytes_ += bias.size() * sizeof(float);
      w.attn_qkv_b = backend_.upload(bias.data(), bias.size() * sizeof(float), false);
    }
    // o_proj [d, q]: W = o_proj^T [q, d], rows of this rank's heads = stored columns q0..q1.
    w.attn_proj_w = load_linear(source, {{p + "self_attn.o_proj.weight", 0, d}}, {q0, q1},
                                fold(LoraModule::kAttnProj));
    if (c.o_bias) w.attn_proj_b = vec(p + "self_attn.o_proj.bias", d);
    w.ln_2_g = vec(p + "post_attention_layernorm.weight", d);
    w.mlp_fc_w = load_linear(source,
                             {{p + "mlp.gate_proj.weight", f0, f1}, {p + "mlp.up_proj.weight", f0, f1}},
                             {0, d}, fold(LoraModule::kMlpFc));
    // down_proj [d, d_ff]: rows f0..f1 of its transpose.
    w.mlp_proj_w = load_linear(source, {{p + "mlp.down_proj.weight", 0, d}}, {f0, f1},
                               fold(LoraModule::kMlpProj));
    layer_.push_back(std::move(w));
  }
  return merge_status_;
}

}  // namespace ltm
