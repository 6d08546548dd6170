#include "runtime/model/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/json_parse.h"
#include "nlohmann/json.hpp"

namespace ltm {
namespace {

using nlohmann::json;

constexpr char kPrefix[] = "transformer.";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kLmHead[] = "lm_head.weight";

// Debian's abseil has its own absl::string_view; StrCat does not take a std::string_view.
absl::string_view av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string_view strip_prefix(std::string_view name) {
  const std::string_view prefix = kPrefix;
  if (name.substr(0, prefix.size()) == prefix) name.remove_prefix(prefix.size());
  return name;
}

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// "h.<i>.<rest>" (GPT-2) or "model.layers.<i>.<rest>" (Llama) -> i; nullopt when the name is
// not of that form.
std::optional<int64_t> layer_of(std::string_view name, std::string_view* rest = nullptr) {
  constexpr std::string_view kLlamaLayers = "model.layers.";
  if (name.substr(0, kLlamaLayers.size()) == kLlamaLayers) {
    name.remove_prefix(kLlamaLayers.size());
  } else if (name.substr(0, 2) == "h.") {
    name.remove_prefix(2);
  } else {
    return std::nullopt;
  }
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos) return std::nullopt;
  int64_t layer = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + dot, layer);
  if (ec != std::errc() || end != name.data() + dot) return std::nullopt;
  if (rest != nullptr) *rest = name.substr(dot + 1);
  return layer;
}

// HF's causal-mask buffers, saved by older GPT-2 exports; ltm builds its own mask.
bool is_ignored_buffer(std::string_view name) {
  std::string_view rest;
  if (!layer_of(name, &rest)) return false;
  return rest == "attn.bias" || rest == "attn.masked_bias" ||
         rest == "self_attn.rotary_emb.inv_freq";  // older Llama exports; ltm computes its own
}

std::string config_summary(const ModelConfig& c) {
  return absl::StrCat("config.json: vocab_size=", c.vocab_size, ", n_positions=", c.n_positions,
                      ", n_embd=", c.n_embd, ", n_layer=", c.n_layer, ", n_inner=", c.n_inner);
}

std::string read_text(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  std::ostringstream text;
  if (*ok) text << in.rdbuf();
  return text.str();
}

// weight_map of a sharded checkpoint: stored tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> parse_index(const std::string& path) {
  bool ok = false;
  const std::string text = read_text(path, &ok);
  if (!ok) return absl::NotFoundError(absl::StrCat(path, ": cannot open the shard index"));
  absl::StatusOr<json> parsed = parse_json(text);
  if (!parsed.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": invalid JSON: ", parsed.status().message()));
  json& index = *parsed;
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected an object with a \"weight_map\" object (tensor name -> "
                           "shard file)"));
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map entry for tensor \"", name,
                       "\" must be a shard file name (string), found ", json_brief(file)));
    }
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map names shard \"", shard, "\" for tensor \"", name,
                       "\"; expected a file name inside the checkpoint folder"));
    }
    weight_map.emplace(name, shard);
  }
  if (weight_map.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": weight_map is empty"));
  }
  return weight_map;
}

}  // namespace

std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& c) {
  const int64_t d = c.n_embd, q = c.q_width(), kv = c.kv_width(), ff = c.n_inner;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, d}, "[vocab_size, hidden_size]"});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = absl::StrCat("model.layers.", i, ".");
    specs.push_back({h + "input_layernorm.weight", {d}, "[hidden_size]"});
    specs.push_back({h + "self_attn.q_proj.weight", {q, d}, "[num_attention_heads*head_dim, hidden_size]"});
    specs.push_back({h + "self_attn.k_proj.weight", {kv, d}, "[num_key_value_heads*head_dim, hidden_size]"});
    specs.push_back({h + "self_attn.v_proj.weight", {kv, d}, "[num_key_value_heads*head_dim, hidden_size]"});
    if (c.qkv_bias) {
      specs.push_back({h + "self_attn.q_proj.bias", {q}, "[num_attention_heads*head_dim]"});
      specs.push_back({h + "self_attn.k_proj.bias", {kv}, "[num_key_value_heads*head_dim]"});
      specs.push_back({h + "self_attn.v_proj.bias", {kv}, "[num_key_value_heads*head_dim]"});
    }
    specs.push_back({h + "self_attn.o_proj.weight", {d, q}, "[hidden_size, num_attention_heads*head_dim]"});
    if (c.o_bias) specs.push_back({h + "self_attn.o_proj.bias", {d}, "[hidden_size]"});
    specs.push_back({h + "post_attention_layernorm.weight", {d}, "[hidden_size]"});
    specs.push_back({h + "mlp.gate_proj.weight", {ff, d}, "[intermediate_size, hidden_size]"});
    specs.push_back({h + "mlp.up_proj.weight", {ff, d}, "[intermediate_size, hidden_size]"});
    specs.push_back({h + "mlp.down_proj.weight", {d, ff}, "[hidden_size, intermediate_size]"});
  }
  specs.push_back({"model.norm.weight", {d}, "[hidden_size]"});
  if (!c.tied_lm_head) specs.push_back({"lm_head.weight", {c.vocab_size, d}, "[vocab_size, hidden_size]"});
  return specs;
}

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c) {
  return c.is_llama() ? llama_tensor_specs(c) : gpt2_tensor_specs(c);
}

std::vector<TensorSpec> gpt2_tensor_specs(const ModelConfig& c) {
  const int64_t d = c.n_embd;
  const int64_t d_ff = c.n_inner;
  std::vector<TensorSpec> specs;
  specs.push_back({"wte.weight", {c.vocab_size, d}, "[vocab_size, n_embd]"});
  if (c.position_embedding == PositionEmbedding::kLearned) {
    specs.push_back({"wpe.weight", {c.n_positions, d}, "[n_positions, n_embd]"});
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = absl::StrCat("h.", i, ".");
    specs.push_back({h + "ln_1.weight", {d}, "[n_embd]"});
    specs.push_back({h + "ln_1.bias", {d}, "[n_embd]"});
    specs.push_back({h + "attn.c_attn.weight", {d, 3 * d}, "[n_embd, 3*n_embd]"});
    specs.push_back({h + "attn.c_attn.bias", {3 * d}, "[3*n_embd]"});
    specs.push_back({h + "attn.c_proj.weight", {d, d}, "[n_embd, n_embd]"});
    specs.push_back({h + "attn.c_proj.bias", {d}, "[n_embd]"});
    specs.push_back({h + "ln_2.weight", {d}, "[n_embd]"});
    specs.push_back({h + "ln_2.bias", {d}, "[n_embd]"});
    specs.push_back({h + "mlp.c_fc.weight", {d, d_ff}, "[n_embd, n_inner]"});
    specs.push_back({h + "mlp.c_fc.bias", {d_ff}, "[n_inner]"});
    specs.push_back({h + "mlp.c_proj.weight", {d_ff, d}, "[n_inner, n_embd]"});
    specs.push_back({h + "mlp.c_proj.bias", {d}, "[n_embd]"});
  }
  specs.push_back({"ln_f.weight", {d}, "[n_embd]"});
  specs.push_back({"ln_f.bias", {d}, "[n_embd]"});
  return specs;
}

absl::StatusOr<Checkpoint> Checkpoint::open(const std::string& dir_arg) {
  std::string dir = dir_arg;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": checkpoint folder not found (expected a folder with config.json "
                          "and model.safetensors)"));
  }
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  LTM_ASSIGN_OR_RETURN(ckpt.config_, load_model_config(absl::StrCat(dir, "/config.json")));
  const ModelConfig& config = ckpt.config_;

  // --- which files -----------------------------------------------------------------------------
  const std::string single_path = absl::StrCat(dir, "/", kSingleFile);
  const std::string index_path = absl::StrCat(dir, "/", kIndexFile);
  std::optional<std::map<std::string, std::string>> weight_map;  // set when sharded
  std::vector<std::string> file_names;
  if (is_regular_file(single_path)) {
    file_names.emplace_back(kSingleFile);
  } else if (is_regular_file(index_path)) {
    LTM_ASSIGN_OR_RETURN(weight_map, parse_index(index_path));
    std::set<std::string> shards;
    for (const auto& [name, shard] : *weight_map) {
      if (shards.insert(shard).second && !is_regular_file(absl::StrCat(dir, "/", shard))) {
        return absl::NotFoundError(absl::StrCat(index_path, ": shard \"", shard,
                                                "\" (holding tensor \"", name,
                                                "\") is not in the checkpoint folder"));
      }
    }
    file_names.assign(shards.begin(), shards.end());
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": neither ", kSingleFile, " nor ", kIndexFile,
        " found (ltm reads safetensors checkpoints; convert pytorch_model.bin first)"));
  }
  for (const std::string& name : file_names) {
    LTM_ASSIGN_OR_RETURN(SafetensorsFile file,
                         SafetensorsFile::open(absl::StrCat(dir, "/", name)));
    ckpt.files_.push_back(std::move(file));
  }

  // --- every stored tensor must be expected, well-shaped and readable ----------------------------
  std::map<std::string, const TensorSpec*, std::less<>> expected;
  const std::vector<TensorSpec> specs = model_tensor_specs(config);
  for (const TensorSpec& spec : specs) expected.emplace(spec.name, &spec);
  const TensorSpec* wte_spec = expected.at(config.is_llama() ? "model.embed_tokens.weight" : "wte.weight");
  const bool lm_head_tied = expected.count(kLmHead) == 0;  // a stored lm_head is wte's copy

  for (size_t f = 0; f < ckpt.files_.size(); ++f) {
    const SafetensorsFile& file = ckpt.files_[f];
    for (const SafetensorsTensor& t : file.tensors()) {
      auto fail = [&](absl::StatusCode code, absl::string_view what) {
        return absl::Status(code, absl::StrCat(file.path(), ": tensor \"", t.name, "\" ", what));
      };
      if (weight_map) {
        auto it = weight_map->find(t.name);
        if (it == weight_map->end()) {
          return fail(absl::StatusCode::kInvalidArgument,
                      absl::StrCat("is not listed in ", index_path,
                                   " (index and shards do not match)"));
        }
        if (absl::StrCat(dir, "/", it->second) != file.path()) {
          return fail(absl::StatusCode::kInvalidArgument,
                      absl::StrCat("is listed in ", index_path, " as being in shard \"",
                                   it->second, "\" (index and shards do not match)"));
        }
      }
      const std::string_view name =
          t.name == kLmHead ? std::string_view(kLmHead) : strip_prefix(t.name);
      if (is_ignored_buffer(name)) continue;
      if (name == kLmHead && lm_head_tied) {
        if (t.shape != wte_spec->shape) {
          return fail(absl::StatusCode::kInvalidArgument,
                      absl::StrCat("has shape ", shape_string(t.shape), ", expected ",
                                   shape_string(wte_spec->shape),
                                   " (the LM head is tied to wte: [vocab_size, n_embd], ",
                                   config_summary(config), ")"));
        }
        continue;
      }
      auto spec_it = expected.find(name);
      if (spec_it == expected.end()) {
        if (std::optional<int64_t> layer = layer_of(name); layer && *layer >= config.n_layer) {
          return fail(absl::StatusCode::kInvalidArgument,
                      absl::StrCat("belongs to layer ", *layer, ", but config.json has n_layer=",
                                   config.n_layer, " (layers 0..", config.n_layer - 1, ")"));
        }
        if (name == "wpe.weight") {
          return fail(absl::StatusCode::kInvalidArgument,
                      "is a learned position embedding, but config.json sets "
                      "position_embedding_type \"sinusoidal\"");
        }
        if (config.is_llama())
          return fail(absl::StatusCode::kInvalidArgument,
                      absl::StrCat("is unexpected: not a tensor of this ", config.architecture,
                                   " (expected model.embed_tokens, model.norm, lm_head unless "
                                   "tied, and model.layers.<i>.{input_layernorm, "
                                   "self_attn.{q,k,v,o}_proj, post_attention_layernorm, "
                                   "mlp.{gate,up,down}_proj}.weight; biases only as config.json's "
                                   "attention_bias / model type says)"));
        return fail(absl::StatusCode::kInvalidArgument,
                    "is unexpected: not a GPT-2 tensor (expected wte, wpe, ln_f and "
                    "h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}"
                    ".{weight, bias}, with or without the \"transformer.\" prefix)");
      }
      if (auto dup = ckpt.tensors_.find(name); dup != ckpt.tensors_.end()) {
        return fail(absl::StatusCode::kInvalidArgument,
                    absl::StrCat("duplicates \"", dup->second.tensor->name, "\" in ",
                                 ckpt.files_[dup->second.file].path(),
                                 " (stored both with and without the prefix)"));
      }
      ckpt.tensors_.emplace(std::string(name), TensorRef{f, &t, DType::kF32});  // dtype: below
    }
  }

  if (weight_map) {
    for (const auto& [name, shard] : *weight_map) {
      const std::string shard_path = absl::StrCat(dir, "/", shard);
      auto file = std::find_if(ckpt.files_.begin(), ckpt.files_.end(),
                               [&](const SafetensorsFile& sf) { return sf.path() == shard_path; });
      LTM_ASSERT(file != ckpt.files_.end());
      if (file->find(name) == nullptr) {
        return absl::NotFoundError(absl::StrCat(index_path, ": tensor \"", name,
                                                "\" is listed in shard \"", shard,
                                                "\", but ", shard_path, " has no such tensor"));
      }
    }
  }

  // --- every expected tensor is there, readable and shaped as config.json says (model order) ---
  for (const TensorSpec& spec : specs) {
    auto it = ckpt.tensors_.find(spec.name);
    if (it == ckpt.tensors_.end()) {
      const std::string where =
          weight_map ? absl::StrCat(index_path, " (and its shards)") : single_path;
      const std::string alias =
          config.is_llama() ? "" : absl::StrCat(" (or \"", kPrefix, spec.name, "\")");
      return absl::NotFoundError(absl::StrCat(
          where, ": tensor \"", spec.name, "\"", alias, " is missing; expected shape ", shape_string(spec.shape), " = ",
          spec.symbolic_shape, " (", config_summary(config), ")"));
    }
    TensorRef& r = it->second;
    const SafetensorsTensor& t = *r.tensor;
    const std::string where =
        absl::StrCat(ckpt.files_[r.file].path(), ": tensor \"", t.name, "\" ");
    if (!t.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "has dtype ", t.dtype_name, "; ltm reads only F32, F16 and BF16 tensors"));
    }
    if (t.shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "has shape ", shape_string(t.shape), ", expected ", shape_string(spec.shape),
          " = ", spec.symbolic_shape, " (", config_summary(config), ")"));
    }
    r.dtype = *t.dtype;
    ckpt.names_.push_back(spec.name);
  }
  return ckpt;
}

const Checkpoint::TensorRef& Checkpoint::ref(std::string_view name) const {
  auto it = tensors_.find(strip_prefix(name));
  LTM_ASSERT(it != tensors_.end(), "Checkpoint: no tensor \"", av(name), "\" in ", dir_);
  return it->second;
}

DType Checkpoint::dtype(std::string_view name) const { return ref(name).dtype; }

std::vector<int64_t> Checkpoint::shape(std::string_view name) const {
  return ref(name).tensor->shape;
}

const std::string& Checkpoint::file_of(std::string_view name) const {
  return files_[ref(name).file].path();
}

namespace {
// Tells the kernel that these pages of a read-only mapping are not needed for now (a later
// access reads them again from the file). Rounded inward to whole pages.
void release_pages(const uint8_t* begin, int64_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(begin) + static_cast<uintptr_t>(bytes)) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}
}  // namespace

const float* Checkpoint::f32_in_place(std::string_view name) const {
  const TensorRef& r = ref(name);
  if (r.dtype != DType::kF32) return nullptr;
  const uint8_t* data = files_[r.file].tensor_data(*r.tensor);
  if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) return nullptr;
  bytes_read_->fetch_add(r.tensor->bytes(), std::memory_order_relaxed);
  return reinterpret_cast<const float*>(data);
}

void Checkpoint::read_f32(std::string_view name, const SliceSpec& s, float* out) const {
  const TensorRef& r = ref(name);
  const std::vector<int64_t>& shape = r.tensor->shape;
  LTM_ASSERT(shape.size() == 1 || shape.size() == 2);
  const int64_t rows = shape[0];
  const int64_t cols = shape.size() == 2 ? shape[1] : 1;
  LTM_ASSERT(0 <= s.row_begin && s.row_begin <= s.row_end && s.row_end <= rows &&
                 0 <= s.col_begin && s.col_begin <= s.col_end && s.col_end <= cols,
             "Checkpoint::read_f32: slice rows [", s.row_begin, ", ", s.row_end, ") cols [",
             s.col_begin, ", ", s.col_end, ") outside \"", av(name), "\" ", shape_string(shape));
  const int64_t slice_rows = s.row_end - s.row_begin;
  const int64_t slice_cols = s.col_end - s.col_begin;
  const int64_t element_size = dtype_size(r.dtype);
  const uint8_t* data = files_[r.file].tensor_data(*r.tensor);
  if (slice_cols == cols) {  // whole rows: one contiguous run
    convert_to_f32(r.dtype, data + s.row_begin * cols * element_size, slice_rows * cols, out);
  } else {
    for (int64_t i = 0; i < slice_rows; ++i) {
      const int64_t offset = ((s.row_begin + i) * cols + s.col_begin) * element_size;
      convert_to_f32(r.dtype, data + offset, slice_cols, out + i * slice_cols);
    }
  }
  bytes_read_->fetch_add(static_cast<uint64_t>(slice_rows * slice_cols * element_size),
                         std::memory_order_relaxed);
  // The slice has been copied out: drop its pages from this process (they stay in the page
  // cache), so that loading does not hold the mapped checkpoint resident beside the weights.
  release_pages(data + s.row_begin * cols * element_size, slice_rows * cols * element_size);
}

std::vector<std::string> Checkpoint::tensor_names() const { return names_; }

}  // namespace ltm
