#include "runtime/model/model.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ltm {

using parallel::Range;

Model::Model(const ModelConfig& config, const ShardSpec& shard, Backend& backend,
             parallel::Communicator& tp_comm)
    : config_(config), shard_(shard), backend_(backend), tp_comm_(tp_comm) {}

absl::StatusOr<std::unique_ptr<Model>> Model::load(const WeightSource& source, Backend& backend,
                                                   const ShardSpec& shard,
                                                   parallel::Communicator& tp_comm,
                                                   const ModelOptions& options) {
  const ModelConfig& c = source.config();
  LTM_RETURN_IF_ERROR(parallel::validate_layout(shard.tp * shard.pp, shard.tp, shard.pp, c.n_head,
                                                c.kv_heads(), c.n_layer, c.n_inner));
  if (c.is_llama() && !backend.supports_llama())
    return absl::InvalidArgumentError(absl::StrCat(
        c.architecture, " (a Llama-family model) runs on the CPU backend only for now; ",
        backend.describe(), " has no RMSNorm/RoPE/SwiGLU kernels (use --device cpu)"));
  if (tp_comm.size() != shard.tp)
    return absl::InternalError(absl::StrCat("TP communicator has ", tp_comm.size(),
                                            " ranks but --tp is ", shard.tp));
  if (!backend.supports(options.weights, Precision::kF32))
    return absl::InvalidArgumentError(absl::StrCat("--weight-dtype ", precision_name(options.weights),
                                                   ": ", backend.describe(),
                                                   " does not hold weights of that type"));
  std::unique_ptr<Model> m(new Model(c, shard, backend, tp_comm));
  m->weight_precision_ = options.weights;
  m->act_ = backend.activation_precision(options.weights);
  m->d_ = c.n_embd;
  m->head_dim_ = c.head_dim();
  m->layers_ = parallel::stage_layers(c.n_layer, c.vocab_size, c.n_embd, shard.pp, shard.pp_rank);
  m->heads_ = parallel::head_range(c.n_head, shard.tp, shard.tp_rank);
  m->kv_heads_ = c.is_llama() ? parallel::kv_head_range(c.kv_heads(), shard.tp, shard.tp_rank)
                              : m->heads_;
  m->ffn_ = parallel::ffn_range(c.n_inner, shard.tp, shard.tp_rank);
  m->vocab_ = parallel::vocab_range(c.vocab_size, shard.tp, shard.tp_rank);
  m->n_head_local_ = m->heads_.size();
  m->n_kv_local_ = m->kv_heads_.size();
  m->d_local_ = m->n_head_local_ * m->head_dim_;
  m->kv_local_ = m->n_kv_local_ * m->head_dim_;
  m->qkv_cols_ = m->d_local_ + 2 * m->kv_local_;
  m->d_ff_local_ = m->ffn_.size();
  m->lora_ranges_ = lora_shard_ranges(c, m->heads_, m->ffn_, m->kv_heads_);
  m->merge_ = options.merge;
  LTM_RETURN_IF_ERROR(m->load_weights(source));
  m->merge_ = nullptr;
  for (LayerWeights& w : m->layer_) {  // the fused epilogues' biases, made once (LayerWeights)
    w.attn_qkv_b_act = backend.epilogue_bias(w.attn_qkv_b, m->qkv_cols_, m->act_);
    w.mlp_fc_b_act = backend.epilogue_bias(w.mlp_fc_b, m->d_ff_local_, m->act_);
  }
  return m;
}

// Loads the local [rows, cols] tensor made of `parts` (slices of the HF tensor) side by side
// along columns; rows a part lacks (vocab padding) are zero. Every tensor is copied into the
// backend's memory (packed for matmul weights), never used in place from the checkpoint's
// mapping: the rank's memory is then its weights alone once the checkpoint is closed, and a file
// rewritten under a serving rank cannot reach it. Matrices and the embedding go in by ranges of
// rows of at most kChunkBytes of fp32, converted to the weight precision as they are packed, so
// loading holds no whole fp32 copy of a tensor. `whole`: the one part is the whole tensor.
DeviceBuffer Model::load_tensor(const WeightSource& source, const std::string& name,
                                const std::vector<SliceSpec>& parts, int64_t rows, int64_t cols,
                                bool whole, TensorUse use, const LoraSlice* merge) {
  constexpr int64_t kChunkBytes = 8 << 20;
  if (whole)
    LTM_ASSERT(parts.size() == 1 && parts[0].row_begin == 0 && parts[0].col_begin == 0 &&
               parts[0].row_end == rows && parts[0].col_end == cols);
  const Precision p = use == TensorUse::kPlain ? Precision::kF32 : weight_precision_;
  weight_bytes_ += static_cast<uint64_t>(static_cast<double>(rows * cols) * weight_element_bytes(p));
  DeviceBuffer out;
  if (use == TensorUse::kMatrix) out = backend_.alloc_weight(rows, cols, p);
  if (use == TensorUse::kEmbedding) out = backend_.alloc_embedding(rows, cols, p);
  // Whole groups of 32 rows per chunk: int8 weights take a scale per 32 rows of a column.
  const int64_t chunk = use == TensorUse::kPlain
                            ? rows
                            : std::max<int64_t>(32, kChunkBytes / (cols * int64_t{sizeof(float)}) / 32 * 32);
  std::vector<float> host, tmp;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    host.assign(static_cast<size_t>((r1 - r0) * cols), 0.0f);
    int64_t col0 = 0;
    for (const SliceSpec& part : parts) {
      const int64_t pr = part.row_end - part.row_begin;
      const int64_t pc = part.col_end - part.col_begin;
      const int64_t lo = std::min(r0, pr), hi = std::min(r1, pr);  // rows of this part in the chunk
      if (hi > lo) {
        const SliceSpec piece{part.row_begin + lo, part.row_begin + hi, part.col_begin,
                              part.col_end};
        if (parts.size() == 1) {
          source.read_f32(name, piece, host.data());
        } else {
          tmp.resize(static_cast<size_t>((hi - lo) * pc));
          source.read_f32(name, piece, tmp.data());
          for (int64_t r = 0; r < hi - lo; ++r)
            std::copy_n(tmp.data() + r * pc, pc, host.data() + (lo - r0 + r) * cols + col0);
        }
      }
      col0 += pc;
    }
    if (merge != nullptr) {
      LTM_ASSERT(use == TensorUse::kMatrix && merge->in == rows && merge->out == cols);
      // fp32, before rounding and packing; an overflow fails the load (load_weights).
      absl::Status st = merge_lora_rows(*merge, host.data(), r0, r1);
      if (!st.ok() && merge_status_.ok())
        merge_status_ = absl::InvalidArgumentError(absl::StrCat(
            "--lora-merge of ", merge_->dir(), " into ", name, ": ", st.message()));
    }
    switch (use) {
      case TensorUse::kMatrix:
        backend_.write_weight_rows(out, host.data(), r0, r1, rows, cols);
        break;
      case TensorUse::kEmbedding:
        backend_.write_embedding_rows(out, host.data(), r0, r1, rows, cols);
        break;
      case TensorUse::kPlain:
        out = backend_.upload(host.data(), host.size() * sizeof(float), false);
        break;
    }
  }
  return out;
}

absl::Status Model::load_weights(const WeightSource& source) {
  if (config_.is_llama()) return load_llama_weights(source);
  const int64_t d = d_, dl = d_local_, V = config_.vocab_size;
  const bool whole = shard_.tp == 1;  // a TP rank of one holds every tensor whole
  constexpr TensorUse kMat = TensorUse::kMatrix;
  auto vec = [&](const std::string& name, int64_t n) {  // a replicated vector
    return load_tensor(source, name, {{0, n, 0, 1}}, n, 1, true);
  };
  // Q, K and V columns of this rank's heads, from the fused [d, 3d] weight / [3d] bias.
  const int64_t h0 = heads_.begin * head_dim_, h1 = heads_.end * head_dim_;
  auto qkv_cols = [&](int64_t rows) {
    std::vector<SliceSpec> parts;
    for (int64_t part = 0; part < 3; ++part) parts.push_back({0, rows, part * d + h0, part * d + h1});
    return parts;
  };
  auto qkv_bias = [&] {
    std::vector<SliceSpec> parts;
    for (int64_t part = 0; part < 3; ++part) parts.push_back({part * d + h0, part * d + h1, 0, 1});
    return parts;
  };

  if (shard_.is_first_stage() || shard_.is_last_stage()) {
    // Vocab rows [begin, end) of the padded vocab; the real rows are those below V.
    const int64_t real = parallel::valid_rows(vocab_, V);
    wte_ = load_tensor(source, "wte.weight", {{vocab_.begin, vocab_.begin + real, 0, d}},
                       vocab_.size(), d, whole, TensorUse::kEmbedding);
  }
  if (shard_.is_first_stage() && config_.position_embedding == PositionEmbedding::kLearned)
    wpe_ = load_tensor(source, "wpe.weight", {{0, config_.n_positions, 0, d}},
                       config_.n_positions, d, true);
  if (shard_.is_last_stage()) {
    ln_f_g_ = vec("ln_f.weight", d);
    ln_f_b_ = vec("ln_f.bias", d);
  }
  for (int64_t l = layers_.begin; l < layers_.end; ++l) {
    const std::string p = absl::StrCat("h.", l, ".");
    LayerWeights w;
    const LayerMerge fold = merge_slices(l);
    w.ln_1_g = vec(p + "ln_1.weight", d);
    w.ln_1_b = vec(p + "ln_1.bias", d);
    if (shard_.tp == 1) {
      w.attn_qkv_w =
          load_tensor(source, p + "attn.c_attn.weight", {{0, d, 0, 3 * d}}, d, 3 * d, true, kMat,
                      fold(LoraModule::kAttnQkv));
      w.attn_qkv_b = vec(p + "attn.c_attn.bias", 3 * d);
    } else {
      w.attn_qkv_w =
          load_tensor(source, p + "attn.c_attn.weight", qkv_cols(d), d, 3 * dl, false, kMat,
                      fold(LoraModule::kAttnQkv));
      // A 1-D tensor's parts are row ranges; side by side they form one row of 3 * dl.
      std::vector<float> b(3 * dl);
      int64_t off = 0;
      for (const SliceSpec& s : qkv_bias()) {
        source.read_f32(p + "attn.c_attn.bias", s, b.data() + off);
        off += s.row_end - s.row_begin;
      }
      weight_bytes_ += b.size() * sizeof(float);
      w.attn_qkv_b = backend_.upload(b.data(), b.size() * sizeof(float), false);
    }
    w.attn_proj_w =
        load_tensor(source, p + "attn.c_proj.weight", {{h0, h1, 0, d}}, dl, d, whole, kMat,
                    fold(LoraModule::kAttnProj));
    w.attn_proj_b = vec(p + "attn.c_proj.bias", d);
    w.ln_2_g = vec(p + "ln_2.weight", d);
    w.ln_2_b = vec(p + "ln_2.bias", d);
    w.mlp_fc_w = load_tensor(source, p + "mlp.c_fc.weight", {{0, d, ffn_.begin, ffn_.end}}, d,
                             d_ff_local_, whole, kMat, fold(LoraModule::kMlpFc));
    w.mlp_fc_b = load_tensor(source, p + "mlp.c_fc.bias", {{ffn_.begin, ffn_.end, 0, 1}},
                             d_ff_local_, 1, whole);
    w.mlp_proj_w = load_tensor(source, p + "mlp.c_proj.weight", {{ffn_.begin, ffn_.end, 0, d}},
                               d_ff_local_, d, whole, kMat, fold(LoraModule::kMlpProj));
    w.mlp_proj_b = vec(p + "mlp.c_proj.bias", d);
    layer_.push_back(std::move(w));
  }
  return merge_status_;
}

Model::LayerMerge Model::merge_slices(int64_t layer) const {
  LayerMerge m;
  if (merge_ != nullptr)
    for (int mod = 0; mod < kLoraModules; ++mod)
      m.slices[mod] = read_lora_slice(*merge_, lora_ranges_, layer, static_cast<LoraModule>(mod));
  return m;
}

void Model::ensure_workspace(Workspace& ws, int64_t n) {
  if (n <= ws.tokens) return;
  n = std::max<int64_t>(n, 16);
  const size_t a = precision_size(act_);
  ws.ln_out = backend_.alloc(n * d_ * a);
  ws.qkv = backend_.alloc(n * qkv_cols_ * a);
  ws.attn_out = backend_.alloc(n * d_local_ * a);
  ws.proj_out = backend_.alloc(n * d_ * sizeof(float));
  ws.ff = backend_.alloc(n * d_ff_local_ * a);
  if (config_.is_llama()) ws.gate_up = backend_.alloc(n * 2 * d_ff_local_ * a);
  ws.tokens = n;
}

// The step's int32 arrays go to the device as one piece (one pinned copy on a GPU), each at a
// 16-byte aligned offset of it: offsets, contexts, block tables, slots, ids, positions, the
// logit rows (compute_logits takes its view when handed the same rows) and which sequences' rows
// are verify rows.
void Model::upload_step(const StepInput& step) {
  // A sequence whose every new row (2 to kMaxSpecTokens + 1 of them) asks for logits is a verify
  // step's (a prefill chunk asks for its last row's, a decode row is one): its attention must
  // give the bits of one-row decode steps however many rows it has (AttentionArgs::exact_rows).
  step_exact_.assign(static_cast<size_t>(step.n_seqs()), 0);
  bool any_exact = false;
  for (int32_t r : step.logit_rows) {
    const auto it = std::upper_bound(step.token_offsets.begin(), step.token_offsets.end(), r);
    const auto s = static_cast<size_t>(it - step.token_offsets.begin() - 1);
    if (s < step_exact_.size()) ++step_exact_[s];
  }
  for (size_t s = 0; s < step_exact_.size(); ++s) {
    const int32_t n_new = step.token_offsets[s + 1] - step.token_offsets[s];
    step_exact_[s] = n_new > 1 && n_new <= kMaxSpecTokens + 1 && step_exact_[s] == n_new;
    any_exact = any_exact || step_exact_[s] != 0;
  }
  const std::vector<int32_t>* parts[kStepArrays] = {
      &step.token_offsets, &step.slot_mapping, &step.context_lens, &step.block_tables,
      &step.token_ids, &step.positions, &step.logit_rows, &step_exact_};
  size_t at[kStepArrays];
  size_t total = 0;
  for (size_t i = 0; i < kStepArrays; ++i) {
    at[i] = total;
    total += (parts[i]->size() + 3) / 4 * 4;
  }
  step_host_.assign(total, 0);
  for (size_t i = 0; i < kStepArrays; ++i)
    std::copy(parts[i]->begin(), parts[i]->end(), step_host_.begin() + static_cast<int64_t>(at[i]));
  const int32_t* base = backend_.stage_i32(step_host_.data(), step_host_.size(), d_step_);
  staged_logit_rows_ = base + at[6];
  staged_logit_host_ = step_host_.data() + at[6];
  staged_logit_count_ = step.logit_rows.size();

  AttentionArgs& a = attn_args_;
  a.n_seqs = step.n_seqs();
  a.n_tokens = step.n_tokens();
  a.token_offsets = base + at[0];
  a.slot_mapping = base + at[1];
  a.context_lens = base + at[2];
  a.block_tables = base + at[3];
  staged_token_ids_ = base + at[4];
  staged_positions_ = base + at[5];
  a.exact_rows = any_exact ? base + at[7] : nullptr;
  a.max_blocks_per_seq = step.max_blocks_per_seq;
  a.max_context_len = 0;
  a.max_new_tokens = 0;
  for (int32_t s = 0; s < a.n_seqs; ++s) {
    a.max_context_len = std::max(a.max_context_len, step.context_lens[s]);
    a.max_new_tokens =
        std::max(a.max_new_tokens, step.token_offsets[s + 1] - step.token_offsets[s]);
  }
  a.n_head = static_cast<int>(n_head_local_);
  a.n_kv_head = static_cast<int>(n_kv_local_);
  a.head_dim = static_cast<int>(head_dim_);
}

void Model::norm_act(const float* x, const DeviceBuffer& g, const DeviceBuffer& b, Act y,
                     int64_t n) {
  const float eps = config_.layer_norm_epsilon;
  if (config_.is_llama())
    backend_.rms_norm_act(x, g.f32(), y, n, d_, eps);
  else
    backend_.layer_norm_act(x, g.f32(), b.f32(), y, n, d_, eps);
}

void Model::end_block_norm(float* x, float* residual, const DeviceBuffer& bias,
                           const DeviceBuffer& g, const DeviceBuffer& b, Act y, int64_t n) {
  const float eps = config_.layer_norm_epsilon;
  const float* bias_or_null = bias.empty() ? nullptr : bias.f32();
  if (config_.is_llama())
    backend_.add_residual_rms_norm_act(x, residual, bias_or_null, g.f32(), y, n, d_, eps);
  else
    backend_.add_bias_residual_layer_norm_act(x, residual, bias.f32(), g.f32(), b.f32(), y, n, d_,
                                              eps);
}

void Model::all_reduce(float* data, int64_t count) {
  if (shard_.tp <= 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  tp_comm_.all_reduce_sum(data, static_cast<size_t>(count));
  allreduce_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Model::run_stage(const StepInput& step, float* hidden, KvCache& cache) {
  const int64_t n = step.n_tokens();
  if (n == 0) return;
  const auto t_start = std::chrono::steady_clock::now();
  LTM_ASSERT(static_cast<int64_t>(step.token_offsets.size()) == step.n_seqs() + 1);
  upload_step(step);
  attn_args_.block_size = cache.block_size();
  attn_args_.kv = cache.precision();
  attn_args_.act = act_;
  ensure_workspace(ws_, n);
  StagedStep staged;
  staged.attn = attn_args_;
  staged.token_ids = staged_token_ids_;
  staged.positions = staged_positions_;
  staged.lora = true;
  plan_lora_runs(step);
  forward(staged, hidden, cache, ws_);
  stage_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
}

void Model::forward(const StagedStep& step, float* hidden, KvCache& cache, Workspace& ws) {
  const AttentionArgs& args = step.attn;
  const int64_t n = args.n_tokens;
  if (n == 0) return;
  LTM_ASSERT(ws.tokens >= n, "forward of ", n, " rows in a workspace of ", ws.tokens);
  const int64_t d = d_, dl = d_local_, dff = d_ff_local_;
  const bool llama = config_.is_llama();
  Backend& b = backend_;
  const int32_t* ids = step.token_ids;
  const int32_t* pos = step.positions;

  if (shard_.is_first_stage()) {
    // x = E[token] (+ E_pos[position] for GPT-2); the vocab-parallel lookup is summed over TP.
    b.embed(ids, wte_, vocab_.begin, vocab_.end, hidden, n, d);
    all_reduce(hidden, n * d);
    if (!llama) b.add_position_embedding(hidden, wpe_.empty() ? nullptr : wpe_.f32(), pos, n, d);
  }

  const Act ln(ws.ln_out.data(), act_), qkv(ws.qkv.data(), act_), attn(ws.attn_out.data(), act_),
      ff(ws.ff.data(), act_), gate_up(ws.gate_up.data(), act_);
  float* proj = ws.proj_out.f32();
  const bool tp = shard_.tp > 1;
  // Biases go into the GEMM's epilogue (fused on a GPU) unless a LoRA update must come between
  // the product and the bias (the CPU order: product, LoRA, bias). LoRA only on run_stage's
  // steps (a graph's step has no adapter; lora_runs_ may be an earlier step's).
  const bool lora = step.lora && !lora_runs_.empty();
  auto apply_lora = [&](size_t l, LoraModule m, Act x, Act out) {
    if (lora) this->apply_lora(l, m, x, out);
  };
  // Each residual block's end (bias, residual add) and the norm after it are one backend op
  // (one pass over hidden on a GPU); only the stage's first norm and its last block's end stand
  // alone.
  for (size_t l = 0; l < layer_.size(); ++l) {
    const LayerWeights& w = layer_[l];
    const LayerWeights* next = l + 1 < layer_.size() ? &layer_[l + 1] : nullptr;
    // O = X + Attn(Norm1(X))
    if (l == 0) norm_act(hidden, w.ln_1_g, w.ln_1_b, ln, n);
    // column-parallel: this rank's Q heads, then its K and V heads
    const bool qkv_bias = !w.attn_qkv_b.empty();
    const bool fuse_bias = qkv_bias && !lora;
    b.matmul_act(ln, w.attn_qkv_w, qkv, n, qkv_cols_, d, 0.0f,
                 fuse_bias ? w.attn_qkv_b.f32() : nullptr,
                 fuse_bias ? Epilogue::kBias : Epilogue::kNone,
                 fuse_bias && !w.attn_qkv_b_act.empty() ? w.attn_qkv_b_act.data() : nullptr);
    if (lora) {
      apply_lora(l, LoraModule::kAttnQkv, ln, qkv);
      if (qkv_bias) b.add_bias_act(qkv, w.attn_qkv_b.f32(), n, qkv_cols_);
    }
    // Llama: rotary positions on the Q and K heads (they are consecutive in a row)
    if (llama)
      b.rope_act(qkv, pos, inv_freq_.f32(), n, n_head_local_ + n_kv_local_, qkv_cols_, head_dim_);
    b.kv_cache_write(args, qkv.data, cache.k(l), cache.v(l));
    b.paged_attention(args, qkv.data, cache.k(l), cache.v(l), attn.data);
    if (tp) {
      b.matmul_act(attn, w.attn_proj_w, proj, n, d, dl, 0.0f, nullptr, Epilogue::kNone);
      apply_lora(l, LoraModule::kAttnProj, attn, proj);  // partial update: summed below
      all_reduce(proj, n * d);
    } else {  // residual in the GEMM
      b.matmul_act(attn, w.attn_proj_w, hidden, n, d, dl, 1.0f, nullptr, Epilogue::kNone);
      apply_lora(l, LoraModule::kAttnProj, attn, hidden);
    }
    // H = O + MLP(Norm2(O)): O's bias (and the TP partial sums), then Norm2.
    end_block_norm(hidden, tp ? proj : nullptr, w.attn_proj_b, w.ln_2_g, w.ln_2_b, ln, n);
    if (llama) {  // SwiGLU: silu(gate) * up, gate | up column-parallel in one GEMM
      b.matmul_act(ln, w.mlp_fc_w, gate_up, n, 2 * dff, d, 0.0f, nullptr, Epilogue::kNone);
      apply_lora(l, LoraModule::kMlpFc, ln, gate_up);
      b.silu_mul_act(gate_up, ff, n, dff);
    } else {  // column-parallel; bias + GELU fused into the GEMM when no LoRA update comes between
      b.matmul_act(ln, w.mlp_fc_w, ff, n, dff, d, 0.0f, lora ? nullptr : w.mlp_fc_b.f32(),
                   lora ? Epilogue::kNone : Epilogue::kBiasGelu,
                   lora || w.mlp_fc_b_act.empty() ? nullptr : w.mlp_fc_b_act.data());
      if (lora) {
        apply_lora(l, LoraModule::kMlpFc, ln, ff);
        b.bias_gelu_act(ff, w.mlp_fc_b.f32(), n, dff);
      }
    }
    if (tp) {
      b.matmul_act(ff, w.mlp_proj_w, proj, n, d, dff, 0.0f, nullptr, Epilogue::kNone);
      apply_lora(l, LoraModule::kMlpProj, ff, proj);
      all_reduce(proj, n * d);
    } else {
      b.matmul_act(ff, w.mlp_proj_w, hidden, n, d, dff, 1.0f, nullptr, Epilogue::kNone);
      apply_lora(l, LoraModule::kMlpProj, ff, hidden);
    }
    float* residual = tp ? proj : nullptr;
    const bool bias = !w.mlp_proj_b.empty();
    if (next) {  // H's bias (and partial sums), then the next layer's norm
      end_block_norm(hidden, residual, w.mlp_proj_b, next->ln_1_g, next->ln_1_b, ln, n);
    } else if (residual) {
      if (bias) b.add_bias(proj, w.mlp_proj_b.f32(), n, d);
      b.add(hidden, proj, n * d);
    } else if (bias) {
      b.add_bias(hidden, w.mlp_proj_b.f32(), n, d);
    }
  }
}

absl::Status Model::add_adapter(int32_t id, const LoraAdapter& adapter) {
  if (id <= 0 || adapters_.count(id))
    return absl::InternalError(absl::StrCat("LoRA adapter id ", id, " is in use or not positive"));
  LoraWeights w;
  for (int64_t l = layers_.begin; l < layers_.end; ++l) {
    std::array<LoraModuleWeights, kLoraModules> mods;
    for (int mod = 0; mod < kLoraModules; ++mod) {
      LoraSlice s = read_lora_slice(adapter, lora_ranges_, l, static_cast<LoraModule>(mod));
      if (s.empty()) continue;
      LoraModuleWeights& mw = mods[mod];
      mw.rank = s.rank;
      mw.in = s.in;
      mw.out = s.out;
      mw.a = backend_.upload(s.a.data(), s.a.size() * sizeof(float), false);
      // B^T [rank, out] as a weight: the product then runs on the backend's matmul (the CPU's
      // packed GEMM, whose rows do not depend on the row count).
      std::vector<float> bt(s.b.size());
      for (int64_t o = 0; o < s.out; ++o)
        for (int64_t j = 0; j < s.rank; ++j) bt[j * s.out + o] = s.b[o * s.rank + j];
      mw.b = backend_.upload_weight(bt.data(), s.rank, s.out, Precision::kF32);
      w.bytes += mw.a.bytes() + mw.b.bytes();
    }
    w.layer.push_back(std::move(mods));
  }
  adapters_.emplace(id, std::move(w));
  return absl::OkStatus();
}

void Model::remove_adapter(int32_t id) {
  backend_.synchronize();  // no op still reads it
  adapters_.erase(id);
}

uint64_t Model::adapter_bytes() const {
  uint64_t total = 0;
  for (const auto& [id, w] : adapters_) total += w.bytes;
  return total;
}

// Runs of consecutive sequences with the same adapter: each is a contiguous block of batch rows,
// so its update is two plain GEMMs on that block. The scheduler orders a batch by adapter, so a
// step has one run per adapter in it (segmented GEMM; no gather, no per-request loop).
void Model::plan_lora_runs(const StepInput& step) {
  lora_runs_.clear();
  if (step.adapter_ids.empty()) return;
  LTM_ASSERT(static_cast<int32_t>(step.adapter_ids.size()) == step.n_seqs());
  int max_rank = 0;
  for (int32_t s = 0; s < step.n_seqs(); ++s) {
    const int32_t id = step.adapter_ids[s];
    if (id == 0) continue;
    auto it = adapters_.find(id);
    LTM_ASSERT(it != adapters_.end(), "step names LoRA adapter id ", id, ", which this rank does not hold");
    const int64_t r0 = step.token_offsets[s], r1 = step.token_offsets[s + 1];
    if (!lora_runs_.empty() && lora_runs_.back().w == &it->second && lora_runs_.back().row1 == r0)
      lora_runs_.back().row1 = r1;
    else
      lora_runs_.push_back({r0, r1, &it->second});
    for (const auto& mods : it->second.layer)
      for (const LoraModuleWeights& mw : mods) max_rank = std::max(max_rank, mw.rank);
  }
  const int64_t need = static_cast<int64_t>(step.n_tokens()) * max_rank;
  if (need > lora_t_elems_) {
    lora_t_ = backend_.alloc(static_cast<size_t>(need) * sizeof(float));
    lora_t_elems_ = need;
  }
}

void Model::apply_lora(size_t l, LoraModule m, Act x, Act out) {
  if (lora_runs_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (const LoraRun& run : lora_runs_) {
    const LoraModuleWeights& mw = run.w->layer[l][static_cast<int>(m)];
    if (mw.rank == 0) continue;
    const int64_t rows = run.row1 - run.row0;
    float* t = lora_t_.f32();
    // 16-bit activations: the fp32 GEMMs read x widened and write the update to fp32 scratch,
    // which is then added into out (rounded once).
    const float* x32 = nullptr;
    if (x.type == Precision::kF32) {
      x32 = x.f32() + run.row0 * mw.in;
    } else {
      const int64_t elems = rows * mw.in;
      if (elems > lora_x32_elems_) {
        lora_x32_ = backend_.alloc(static_cast<size_t>(elems) * sizeof(float));
        lora_x32_elems_ = elems;
      }
      backend_.act_to_f32(x.at(run.row0 * mw.in), lora_x32_.f32(), elems);
      x32 = lora_x32_.f32();
    }
    // t = x A^T  [rows, r];  out += t B^T  [rows, out_local]  (B carries the scale). Both row by
    // row on the CPU: a verify step's rows must have the bits of one-row decode steps (with
    // OpenBLAS, one row took sgemv and several sgemm, which sum in other orders).
    backend_.gemm_rows_nt(x32, mw.a.f32(), t, rows, mw.rank, mw.in);
    if (out.type == Precision::kF32) {
      backend_.matmul(t, mw.b, out.f32() + run.row0 * mw.out, rows, mw.out, mw.rank, 1.0f);
    } else {
      const int64_t elems = rows * mw.out;
      if (elems > lora_y32_elems_) {
        lora_y32_ = backend_.alloc(static_cast<size_t>(elems) * sizeof(float));
        lora_y32_elems_ = elems;
      }
      backend_.matmul(t, mw.b, lora_y32_.f32(), rows, mw.out, mw.rank, 0.0f);
      backend_.add_f32_to_act(out.at(run.row0 * mw.out), lora_y32_.f32(), elems);
    }
  }
  lora_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Model::compute_logits(const StepInput& step, const float* hidden, float* logits) {
  const int64_t m = static_cast<int64_t>(step.logit_rows.size());
  if (m == 0) return;
  ensure_workspace(ws_, m);
  // The rows run_stage staged with the step's other arrays, unless this step's differ (a caller
  // that asks for other rows, or run_stage had no tokens to run).
  const bool staged = staged_logit_rows_ != nullptr && staged_logit_count_ == step.logit_rows.size() &&
                      std::equal(step.logit_rows.begin(), step.logit_rows.end(), staged_logit_host_);
  const int32_t* rows =
      staged ? staged_logit_rows_
             : backend_.stage_i32(step.logit_rows.data(), step.logit_rows.size(), d_logit_rows_);
  logits_from(rows, m, hidden, logits, ws_);
}

void Model::logits_from(const int32_t* rows, int64_t m, const float* hidden, float* logits,
                        Workspace& ws) {
  if (m == 0) return;
  LTM_ASSERT(ws.tokens >= m, "logits of ", m, " rows in a workspace of ", ws.tokens);
  float* x = ws.proj_out.f32();  // fp32 whatever act_ is: LN_f's rows go to lm_head as fp32
  backend_.gather_rows(hidden, rows, x, m, d_);
  if (config_.is_llama())
    backend_.rms_norm(x, ln_f_g_.f32(), x, m, d_, config_.layer_norm_epsilon);
  else
    backend_.layer_norm(x, ln_f_g_.f32(), ln_f_b_.f32(), x, m, d_, config_.layer_norm_epsilon);
  // logits = Norm_f(h) E^T over this rank's vocab rows (tied embedding, or the untied head).
  backend_.lm_head(x, lm_head_.empty() ? wte_ : lm_head_, logits, m, vocab_.size(), d_);
}

}  // namespace ltm
