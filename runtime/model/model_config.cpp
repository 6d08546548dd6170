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

}  // namespace

int64_t ModelConfig::parameter_count() const {
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

  ModelConfig c;
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

absl::StatusOr<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the model config file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": error while reading"));
  return parse_model_config(text.str(), path);
}

}  // namespace ltm
