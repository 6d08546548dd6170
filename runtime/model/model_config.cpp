#include "runtime/model/model_config.h"

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/json_parse.h"
#include "nlohmann/json.hpp"

namespace ltm {
namespace {

using nlohmann::json;

// Upper bounds that keep every size product (parameter counts, byte sizes) far from int64
// overflow; the largest GPT-3 shapes are well inside them.
// Token ids are int32 everywhere (requests, step plans, samples), and the vocab is padded up to a
// multiple of tp: 2^30 keeps every padded id far inside int32.
constexpr int64_t kMaxVocab = int64_t{1} << 30;
constexpr int64_t kMaxPositions = int64_t{1} << 24;
constexpr int64_t kMaxEmbd = int64_t{1} << 20;
constexpr int64_t kMaxInner = int64_t{1} << 22;
constexpr int64_t kMaxLayer = int64_t{1} << 16;
constexpr int64_t kMaxHead = int64_t{1} << 16;
constexpr int64_t kDefaultTokenId = 50256;  // GPT-2's <|endoftext|>

std::string type_name(const json& v) { return v.type_name(); }

// Note: Debian's abseil has its own absl::string_view (not std::string_view), so message
// fragments are taken as absl::string_view and keys as std::string.
absl::Status key_error(const std::string& source, absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": key \"", key, "\" ", what));
}

// An integer key: absent -> nullopt; present must be an integer number (not 12.0, not "12").
absl::StatusOr<std::optional<int64_t>> get_int(const json& j, const std::string& source,
                                               const std::string& key) {
  auto it = j.find(key);
  if (it == j.end()) return std::optional<int64_t>();
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return key_error(source, key, absl::StrCat("is ", it->dump(), ", too large"));
    }
    return std::optional<int64_t>(static_cast<int64_t>(u));
  }
  if (it->is_number_integer()) return std::optional<int64_t>(it->get<int64_t>());
  return key_error(source, key,
                   absl::StrCat("must be an integer, found ", type_name(*it), " ", json_brief(*it)));
}

absl::StatusOr<int64_t> get_size(const json& j, const std::string& source, const std::string& key,
                                 int64_t max) {
  LTM_ASSIGN_OR_RETURN(std::optional<int64_t> v, get_int(j, source, key));
  if (!v) return key_error(source, key, "is missing (required for a GPT-2 model)");
  if (*v <= 0) return key_error(source, key, absl::StrCat("must be positive, found ", *v));
  if (*v > max) return key_error(source, key, absl::StrCat("is ", *v, ", larger than ltm's limit ", max));
  return *v;
}

// A boolean key that must have `required` value when present (absent is fine).
absl::Status check_bool(const json& j, const std::string& source, const std::string& key,
                        bool required, absl::string_view why) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return key_error(source, key, absl::StrCat("must be true or false, found ", it->dump()));
  }
  if (it->get<bool>() != required) {
    return key_error(source, key,
                     absl::StrCat("is ", it->dump(), " but ltm supports only ",
                                  required ? "true" : "false", " (", why, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> get_token_id(const json& j, const std::string& source,
                                     const std::string& key, int64_t vocab_size) {
  auto it = j.find(key);
  if (it == j.end()) return kDefaultTokenId < vocab_size ? kDefaultTokenId : -1;
  if (it->is_null()) return -1;
  LTM_ASSIGN_OR_RETURN(std::optional<int64_t> v, get_int(j, source, key));
  if (*v < 0 || *v >= vocab_size) {
    return key_error(source, key,
                     absl::StrCat("is ", *v, ", outside the vocabulary [0, ", vocab_size,
                                  ") of vocab_size"));
  }
  return *v;
}

// The Llama family (below): which member a config names ("" for none), and its parser.
std::string llama_kind(const json& j);
absl::StatusOr<ModelConfig> parse_llama(const json& j, const std::string& source);

}  // namespace

int64_t ModelConfig::parameter_count() const {
  if (is_llama()) {
    const int64_t d = n_embd, q = q_width(), kv = kv_width();
    const int64_t per_layer = 2 * d                           // input / post-attention norms
                              + d * (q + 2 * kv) + (qkv_bias ? q + 2 * kv : 0)
                              + q * d + (o_bias ? d : 0)      // o_proj
                              + 3 * d * n_inner;              // gate, up, down
    return vocab_size * d * (tied_lm_head ? 1 : 2) + n_layer * per_layer + d;
  }
  const int64_t d = n_embd;
  const int64_t d_ff = n_inner;
  int64_t embeddings = vocab_size * d;
  if (position_embedding == PositionEmbedding::kLearned) embeddings += n_positions * d;
  const int64_t per_layer = 2 * d                // ln_1
                            + d * 3 * d + 3 * d  // c_attn
                            + d * d + d          // attn c_proj
                            + 2 * d              // ln_2
                            + d * d_ff + d_ff    // c_fc
                            + d_ff * d + d;      // mlp c_proj
  return embeddings + n_layer * per_layer + 2 * d;  // + ln_f
}

absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text,
                                               const std::string& source) {
  absl::StatusOr<json> parsed = parse_json(json_text);
  if (!parsed.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", parsed.status().message()));
  const json& j = *parsed;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object with GPT-2 keys, found ", type_name(j)));
  }

  if (!llama_kind(j).empty()) return parse_llama(j, source);
  ModelConfig c;
  c.architecture = "GPT2LMHeadModel";
  {
    LTM_ASSIGN_OR_RETURN(std::optional<int64_t> v, get_int(j, source, "vocab_size"));
    if (v && *v > kMaxVocab)
      return key_error(source, "vocab_size",
                       absl::StrCat("is ", *v, ", larger than ltm's limit ", kMaxVocab,
                                    " (token ids are int32)"));
  }
  LTM_ASSIGN_OR_RETURN(c.vocab_size, get_size(j, source, "vocab_size", kMaxVocab));
  if (j.contains("n_positions")) {
    LTM_ASSIGN_OR_RETURN(c.n_positions, get_size(j, source, "n_positions", kMaxPositions));
  } else if (j.contains("n_ctx")) {
    LTM_ASSIGN_OR_RETURN(c.n_positions, get_size(j, source, "n_ctx", kMaxPositions));
  } else {
    return key_error(source, "n_positions", "is missing (and there is no n_ctx either)");
  }
  LTM_ASSIGN_OR_RETURN(c.n_embd, get_size(j, source, "n_embd", kMaxEmbd));
  LTM_ASSIGN_OR_RETURN(c.n_layer, get_size(j, source, "n_layer", kMaxLayer));
  LTM_ASSIGN_OR_RETURN(c.n_head, get_size(j, source, "n_head", kMaxHead));
  if (c.n_embd % c.n_head != 0) {
    return key_error(source, "n_embd",
                     absl::StrCat("is ", c.n_embd, ", not divisible by n_head = ", c.n_head,
                                  " (each head needs n_embd / n_head dimensions)"));
  }

  if (auto it = j.find("n_inner"); it == j.end() || it->is_null()) {
    c.n_inner = 4 * c.n_embd;
  } else {
    LTM_ASSIGN_OR_RETURN(c.n_inner, get_size(j, source, "n_inner", kMaxInner));
  }

  if (auto it = j.find("layer_norm_epsilon"); it != j.end()) {
    if (!it->is_number()) {
      return key_error(source, "layer_norm_epsilon",
                       absl::StrCat("must be a number, found ", it->dump()));
    }
    const double eps = it->get<double>();
    if (!(eps > 0.0) || !std::isfinite(eps) || eps >= 1.0) {
      return key_error(source, "layer_norm_epsilon",
                       absl::StrCat("must be a small positive number, found ", it->dump()));
    }
    c.layer_norm_epsilon = static_cast<float>(eps);
  }

  if (auto it = j.find("activation_function"); it != j.end()) {
    if (!it->is_string()) {
      return key_error(source, "activation_function",
                       absl::StrCat("must be a string, found ", it->dump()));
    }
    const std::string act = it->get<std::string>();
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast") {
      return key_error(source, "activation_function",
                       absl::StrCat("is \"", act,
                                    "\" but ltm supports only the tanh GELU (gelu_new, "
                                    "gelu_pytorch_tanh or gelu_fast)"));
    }
  }

  if (auto it = j.find("position_embedding_type"); it != j.end() && !it->is_null()) {
    const std::string type = it->is_string() ? it->get<std::string>() : it->dump();
    if (type == "learned" || type == "absolute") {
      c.position_embedding = PositionEmbedding::kLearned;
    } else if (type == "sinusoidal") {
      c.position_embedding = PositionEmbedding::kSinusoidal;
    } else {
      return key_error(source, "position_embedding_type",
                       absl::StrCat("is ", it->dump(),
                                    "; expected \"learned\" (or \"absolute\") or \"sinusoidal\""));
    }
  }

  LTM_ASSIGN_OR_RETURN(c.eos_token_id, get_token_id(j, source, "eos_token_id", c.vocab_size));
  LTM_ASSIGN_OR_RETURN(c.bos_token_id, get_token_id(j, source, "bos_token_id", c.vocab_size));

  LTM_RETURN_IF_ERROR(check_bool(j, source, "tie_word_embeddings", true,
                                 "the LM head is always the transposed wte"));
  LTM_RETURN_IF_ERROR(check_bool(j, source, "scale_attn_weights", true,
                                 "attention scores are always divided by sqrt(head_dim)"));
  LTM_RETURN_IF_ERROR(check_bool(j, source, "scale_attn_by_inverse_layer_idx", false,
                                 "no per-layer attention scaling"));
  LTM_RETURN_IF_ERROR(check_bool(j, source, "add_cross_attention", false,
                                 "decoder-only models have no cross-attention"));
  return c;
}

namespace {

constexpr const char* kLlamaArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                               "Qwen2ForCausalLM"};
constexpr const char* kLlamaModelTypes[] = {"llama", "mistral", "qwen2"};

// "llama" / "mistral" / "qwen2" from model_type, else from architectures; "" when neither names
// a Llama-family model.
std::string llama_kind(const json& j) {
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
    for (const char* t : kLlamaModelTypes)
      if (*it == t) return t;
  }
  if (auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    for (const json& a : *it)
      for (size_t i = 0; i < std::size(kLlamaArchitectures); ++i)
        if (a.is_string() && a == kLlamaArchitectures[i]) return kLlamaModelTypes[i];
  }
  return "";
}

absl::StatusOr<double> get_number(const json& j, const std::string& source,
                                  const std::string& key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number())
    return key_error(source, key, absl::StrCat("must be a number, found ", json_brief(*it)));
  const double v = it->get<double>();
  if (!std::isfinite(v)) return key_error(source, key, "must be finite");
  return v;
}

absl::StatusOr<bool> get_bool(const json& j, const std::string& source, const std::string& key,
                              bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return key_error(source, key, absl::StrCat("must be true or false, found ", it->dump()));
  return it->get<bool>();
}

// bos/eos: an id, a list of ids (its first is the model's; generation_config.json's list ends
// generation), or null / absent (none).
absl::StatusOr<int64_t> get_llama_token_id(const json& j, const std::string& source,
                                           const std::string& key, int64_t vocab_size) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  const json* v = &*it;
  if (v->is_array()) {
    if (v->empty()) return -1;
    v = &(*v)[0];
  }
  if (!v->is_number_integer())
    return key_error(source, key, absl::StrCat("must be a token id or a list of them, found ",
                                               json_brief(*it)));
  const int64_t id = v->get<int64_t>();
  if (id < 0 || id >= vocab_size)
    return key_error(source, key,
                     absl::StrCat("is ", id, ", outside the vocabulary [0, ", vocab_size, ")"));
  return id;
}

}  // namespace

bool is_llama_config_text(const std::string& json_text) {
  absl::StatusOr<json> parsed = parse_json(json_text);
  return parsed.ok() && parsed->is_object() && !llama_kind(*parsed).empty();
}

absl::StatusOr<ModelConfig> parse_llama_config(const std::string& json_text,
                                               const std::string& source) {
  absl::StatusOr<json> parsed = parse_json(json_text);
  if (!parsed.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", parsed.status().message()));
  if (!parsed->is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  return parse_llama(*parsed, source);
}

namespace {

absl::StatusOr<ModelConfig> parse_llama(const json& j, const std::string& source) {
  const std::string kind = llama_kind(j);
  if (kind.empty())
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": neither model_type (llama, mistral, qwen2) nor architectures "
                "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) names a Llama-family model"));
  ModelConfig c;
  c.family = Family::kLlama;
  c.position_embedding = PositionEmbedding::kRope;
  c.architecture = kind == "llama" ? "LlamaForCausalLM"
                   : kind == "mistral" ? "MistralForCausalLM" : "Qwen2ForCausalLM";
  auto size = [&](const std::string& key, int64_t max) -> absl::StatusOr<int64_t> {
    LTM_ASSIGN_OR_RETURN(std::optional<int64_t> v, get_int(j, source, key));
    if (!v) return key_error(source, key, absl::StrCat("is missing (required for ", c.architecture, ")"));
    if (*v <= 0) return key_error(source, key, absl::StrCat("must be positive, found ", *v));
    if (*v > max)
      return key_error(source, key, absl::StrCat("is ", *v, ", larger than ltm's limit ", max));
    return *v;
  };
  LTM_ASSIGN_OR_RETURN(c.vocab_size, size("vocab_size", kMaxVocab));
  LTM_ASSIGN_OR_RETURN(c.n_positions, size("max_position_embeddings", kMaxPositions));
  LTM_ASSIGN_OR_RETURN(c.n_embd, size("hidden_size", kMaxEmbd));
  LTM_ASSIGN_OR_RETURN(c.n_inner, size("intermediate_size", kMaxInner));
  LTM_ASSIGN_OR_RETURN(c.n_layer, size("num_hidden_layers", kMaxLayer));
  LTM_ASSIGN_OR_RETURN(c.n_head, size("num_attention_heads", kMaxHead));
  c.n_kv_head = c.n_head;
  if (auto it = j.find("num_key_value_heads"); it != j.end() && !it->is_null()) {
    LTM_ASSIGN_OR_RETURN(c.n_kv_head, size("num_key_value_heads", kMaxHead));
    if (c.n_head % c.n_kv_head != 0)
      return key_error(source, "num_key_value_heads",
                       absl::StrCat("is ", c.n_kv_head, ", which does not divide num_attention_heads ",
                                    c.n_head, " (each KV head serves a whole group of query heads)"));
  }
  if (auto it = j.find("head_dim"); it != j.end() && !it->is_null()) {
    LTM_ASSIGN_OR_RETURN(c.head_size, size("head_dim", 4096));
  } else if (c.n_embd % c.n_head != 0) {
    return key_error(source, "hidden_size",
                     absl::StrCat("is ", c.n_embd, ", not divisible by num_attention_heads ",
                                  c.n_head, ", and there is no head_dim"));
  }
  if (c.head_dim() % 2 != 0)
    return key_error(source, "head_dim",
                     absl::StrCat("is ", c.head_dim(), "; rotary embeddings need an even head_dim"));
  LTM_ASSIGN_OR_RETURN(double eps, get_number(j, source, "rms_norm_eps", 1e-6));
  if (!(eps > 0.0) || eps >= 1.0)
    return key_error(source, "rms_norm_eps", absl::StrCat("must be a small positive number, found ", eps));
  c.layer_norm_epsilon = static_cast<float>(eps);
  LTM_ASSIGN_OR_RETURN(double theta, get_number(j, source, "rope_theta", 10000.0));
  if (!(theta > 1.0)) return key_error(source, "rope_theta", absl::StrCat("must be > 1, found ", theta));
  c.rope_theta = static_cast<float>(theta);

  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "silu" && *it != "swish"))
      return key_error(source, "hidden_act",
                       absl::StrCat("is ", it->dump(), " but ltm's ", c.architecture,
                                    " runs only \"silu\" (SwiGLU)"));
  }
  LTM_ASSIGN_OR_RETURN(c.tied_lm_head, get_bool(j, source, "tie_word_embeddings", false));
  LTM_ASSIGN_OR_RETURN(bool attention_bias, get_bool(j, source, "attention_bias", false));
  c.qkv_bias = attention_bias || kind == "qwen2";
  c.o_bias = attention_bias;
  LTM_ASSIGN_OR_RETURN(c.mlp_bias, get_bool(j, source, "mlp_bias", false));
  if (c.mlp_bias)
    return key_error(source, "mlp_bias", "is true but ltm supports only MLPs without biases");

  // Sliding-window attention is not implemented: refuse a config that would use it.
  if (auto it = j.find("sliding_window"); it != j.end() && !it->is_null()) {
    LTM_ASSIGN_OR_RETURN(bool use, get_bool(j, source, "use_sliding_window", kind != "qwen2"));
    if (use)
      return key_error(source, "sliding_window",
                       absl::StrCat("is ", it->dump(),
                                    " but ltm has no sliding-window attention (set it to null to "
                                    "attend over the whole context)"));
  }

  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object())
      return key_error(source, "rope_scaling", absl::StrCat("must be an object or null, found ", json_brief(*it)));
    const json& r = *it;
    std::string type;
    for (const char* k : {"rope_type", "type"})
      if (auto t = r.find(k); t != r.end() && t->is_string()) {
        type = t->get<std::string>();
        break;
      }
    auto number = [&](const std::string& key, double fallback) -> absl::StatusOr<double> {
      absl::StatusOr<double> v = get_number(r, source, key, fallback);
      if (!v.ok())
        return absl::InvalidArgumentError(absl::StrCat(v.status().message(), " (in rope_scaling)"));
      if (!(*v > 0))
        return key_error(source, "rope_scaling", absl::StrCat("has ", key, " ", *v, "; expected > 0"));
      return *v;
    };
    if (type == "default") {
      c.rope_scaling = RopeScaling::kNone;
    } else if (type == "linear" || type == "llama3") {
      if (!r.contains("factor"))
        return key_error(source, "rope_scaling", absl::StrCat("of type ", type, " has no factor"));
      LTM_ASSIGN_OR_RETURN(double factor, number("factor", 1.0));
      c.rope_factor = static_cast<float>(factor);
      c.rope_scaling = type == "linear" ? RopeScaling::kLinear : RopeScaling::kLlama3;
      if (type == "llama3") {
        LTM_ASSIGN_OR_RETURN(double lo, number("low_freq_factor", 1.0));
        LTM_ASSIGN_OR_RETURN(double hi, number("high_freq_factor", 4.0));
        if (!(hi > lo))
          return key_error(source, "rope_scaling",
                           "has high_freq_factor <= low_freq_factor (llama3 needs hi > lo)");
        c.rope_low_freq_factor = static_cast<float>(lo);
        c.rope_high_freq_factor = static_cast<float>(hi);
        LTM_ASSIGN_OR_RETURN(std::optional<int64_t> orig,
                             get_int(r, source, "original_max_position_embeddings"));
        if (!orig || *orig <= 0)
          return key_error(source, "rope_scaling",
                           "of type llama3 needs a positive original_max_position_embeddings");
        c.rope_original_max_positions = *orig;
      }
    } else {
      return key_error(source, "rope_scaling",
                       absl::StrCat("has rope_type \"", type,
                                    "\"; ltm implements none, \"linear\" and \"llama3\""));
    }
  }
  LTM_ASSIGN_OR_RETURN(c.eos_token_id, get_llama_token_id(j, source, "eos_token_id", c.vocab_size));
  LTM_ASSIGN_OR_RETURN(c.bos_token_id, get_llama_token_id(j, source, "bos_token_id", c.vocab_size));
  return c;
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t hd = c.head_dim();
  std::vector<float> out(static_cast<size_t>(hd / 2));
  constexpr double kPi = 3.14159265358979323846;
  for (int64_t i = 0; i < hd / 2; ++i) {
    // HF: 1 / base^(arange(0, dim, 2).float() / dim), in fp32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(hd);
    float f = static_cast<float>(1.0 / std::pow(static_cast<double>(c.rope_theta), expo));
    if (c.rope_scaling == RopeScaling::kLinear) f /= c.rope_factor;
    if (c.rope_scaling == RopeScaling::kLlama3) {
      const double old_ctx = static_cast<double>(c.rope_original_max_positions);
      const double low_wavelen = old_ctx / c.rope_low_freq_factor;
      const double high_wavelen = old_ctx / c.rope_high_freq_factor;
      const double wavelen = 2 * kPi / f;
      if (wavelen > low_wavelen) {
        f /= c.rope_factor;
      } else if (wavelen >= high_wavelen) {  // medium: interpolate
        const double smooth = (old_ctx / wavelen - c.rope_low_freq_factor) /
                              (c.rope_high_freq_factor - c.rope_low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / c.rope_factor + smooth * f);
      }
    }
    out[static_cast<size_t>(i)] = f;
  }
  return out;
}

absl::StatusOr<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the model config file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": error while reading"));
  return parse_model_config(text.str(), path);
}

}  // namespace ltm
