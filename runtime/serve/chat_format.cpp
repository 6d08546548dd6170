#include "runtime/serve/chat_format.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/json_parse.h"
#include "runtime/serve/chat_template_engine.h"

namespace ltm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// End-of-turn tokens of the common chat formats (ChatML, Llama 3, Phi 3, Gemma, Command R).
constexpr const char* kEndOfTurnTokens[] = {"<|im_end|>", "<|eot_id|>",   "<|eom_id|>",
                                            "<|end|>",    "<end_of_turn>", "<|END_OF_TURN_TOKEN|>"};

absl::StatusOr<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot be read"));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read failed"));
  return s.str();
}

// An optional JSON object file: nullopt when absent.
absl::StatusOr<std::optional<json>> read_json_object(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<json>();
  LTM_ASSIGN_OR_RETURN(std::string text, read_text(path));
  absl::StatusOr<json> j = parse_json<json>(text);
  if (!j.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": not valid JSON: ", j.status().message()));
  if (!j->is_object())
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": must be a JSON object"));
  return std::optional<json>(std::move(*j));
}

absl::Status field_error(const fs::path& path, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path.string(), ": \"", key, "\" ", what));
}

// A special token as tokenizer_config.json writes it: a string, or an AddedToken object with
// "content"; null or absent: none.
absl::StatusOr<std::string> token_text(const json& cfg, const fs::path& path,
                                       const std::string& key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return field_error(path, key, "must be a string or an object with a string \"content\"");
}

absl::Status read_tokenizer_config(const fs::path& dir, ChatFormatSpec& spec,
                                   int64_t vocab_size) {
  const fs::path path = dir / "tokenizer_config.json";
  LTM_ASSIGN_OR_RETURN(std::optional<json> cfg, read_json_object(path));
  if (cfg) {
    LTM_ASSIGN_OR_RETURN(spec.bos_token, token_text(*cfg, path, "bos_token"));
    LTM_ASSIGN_OR_RETURN(spec.eos_token, token_text(*cfg, path, "eos_token"));
    LTM_ASSIGN_OR_RETURN(spec.unk_token, token_text(*cfg, path, "unk_token"));
    LTM_ASSIGN_OR_RETURN(spec.pad_token, token_text(*cfg, path, "pad_token"));
    if (auto it = cfg->find("chat_template"); it != cfg->end() && !it->is_null()) {
      if (it->is_string()) {
        spec.template_source = it->get<std::string>();
      } else if (it->is_array()) {  // named templates: the "default" one
        for (const json& t : *it) {
          if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
              t["template"].is_string())
            spec.template_source = t["template"].get<std::string>();
        }
        if (spec.template_source.empty())
          return field_error(path, "chat_template", "lists no template named \"default\"");
      } else {
        return field_error(path, "chat_template", "must be a string or a list of templates");
      }
      spec.template_origin = path.string();
    }
    if (auto it = cfg->find("added_tokens_decoder"); it != cfg->end() && !it->is_null()) {
      if (!it->is_object()) return field_error(path, "added_tokens_decoder", "must be an object");
      for (const auto& [key, tok] : it->items()) {
        int64_t id = -1;
        try {
          size_t used = 0;
          id = std::stoll(key, &used);
          if (used != key.size()) id = -1;
        } catch (const std::exception&) {
          id = -1;
        }
        if (id < 0 || id >= vocab_size)
          return field_error(path, absl::StrCat("added_tokens_decoder.", key),
                             absl::StrCat("is not a token id in [0, ", vocab_size, ")"));
        if (!tok.is_object() || !tok.contains("content") || !tok["content"].is_string() ||
            tok["content"].get<std::string>().empty())
          return field_error(path, absl::StrCat("added_tokens_decoder.", key),
                             "must be an object with a non-empty string \"content\"");
        spec.special_tokens.emplace_back(tok["content"].get<std::string>(),
                                         static_cast<int32_t>(id));
      }
    }
  }
  if (spec.template_source.empty()) {
    const fs::path jinja = dir / "chat_template.jinja";
    std::error_code ec;
    if (fs::exists(jinja, ec)) {
      LTM_ASSIGN_OR_RETURN(spec.template_source, read_text(jinja));
      spec.template_origin = jinja.string();
    }
  }
  return absl::OkStatus();
}

absl::Status read_generation_config(const fs::path& dir, ChatFormatSpec& spec,
                                    int64_t vocab_size) {
  const fs::path path = dir / "generation_config.json";
  LTM_ASSIGN_OR_RETURN(std::optional<json> cfg, read_json_object(path));
  if (!cfg) return absl::OkStatus();
  auto it = cfg->find("eos_token_id");
  if (it == cfg->end() || it->is_null()) return absl::OkStatus();
  const json ids = it->is_array() ? *it : json::array({*it});
  for (const json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
      return field_error(path, "eos_token_id",
                         absl::StrCat("must be a token id in [0, ", vocab_size,
                                      ") or a list of them, got ", json_brief(id)));
    spec.generation_eos_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

void add_unique(std::vector<int32_t>& v, int32_t id) {
  if (std::find(v.begin(), v.end(), id) == v.end()) v.push_back(id);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ChatFormat>> ChatFormat::load(
    const std::string& tokenizer_dir, const std::string& model_dir,
    const std::string& template_file, const Tokenizer& tokenizer, int64_t vocab_size) {
  ChatFormatSpec spec;
  if (!tokenizer_dir.empty())
    LTM_RETURN_IF_ERROR(read_tokenizer_config(tokenizer_dir, spec, vocab_size));
  std::error_code ec;
  if (!model_dir.empty() && fs::is_directory(model_dir, ec))
    LTM_RETURN_IF_ERROR(read_generation_config(model_dir, spec, vocab_size));
  if (!template_file.empty()) {
    LTM_ASSIGN_OR_RETURN(spec.template_source, read_text(template_file));
    spec.template_origin = template_file;
    if (spec.template_source.empty())
      return absl::InvalidArgumentError(absl::StrCat(template_file, ": the template is empty"));
  }
  return create(std::move(spec), nullptr, tokenizer, vocab_size);
}

absl::StatusOr<std::shared_ptr<const ChatFormat>> ChatFormat::create(ChatFormatSpec spec,
                                                                     Renderer renderer,
                                                                     const Tokenizer& tokenizer,
                                                                     int64_t vocab_size) {
  if (!renderer && !spec.template_source.empty()) {
    absl::StatusOr<Renderer> r = compile_chat_template(spec.template_source);
    if (!r.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          spec.template_origin.empty() ? "the chat template" : spec.template_origin,
          ": the chat template does not parse: ", r.status().message()));
    renderer = std::move(*r);
  }
  // bos/eos text that is one token of the vocabulary is special too (GPT-2's <|endoftext|>).
  for (const std::string* t : {&spec.bos_token, &spec.eos_token, &spec.unk_token,
                               &spec.pad_token}) {
    if (t->empty()) continue;
    const bool listed = std::any_of(spec.special_tokens.begin(), spec.special_tokens.end(),
                                    [&](const auto& s) { return s.first == *t; });
    if (listed) continue;
    if (std::optional<int32_t> id = tokenizer.token_id(*t); id && *id < vocab_size)
      spec.special_tokens.emplace_back(*t, *id);
  }
  return std::shared_ptr<const ChatFormat>(
      new ChatFormat(std::move(spec), std::move(renderer), tokenizer));
}

ChatFormat::ChatFormat(ChatFormatSpec spec, Renderer renderer, const Tokenizer& tokenizer)
    : spec_(std::move(spec)), renderer_(std::move(renderer)), tokenizer_(&tokenizer) {
  specials_ = spec_.special_tokens;
  std::stable_sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) {
    return a.first.size() > b.first.size();
  });
  for (const auto& [text, id] : specials_) first_byte_[static_cast<unsigned char>(text[0])] = true;
  auto special_id = [&](const std::string& text) -> std::optional<int32_t> {
    for (const auto& [t, id] : specials_)
      if (t == text) return id;
    return std::nullopt;
  };
  for (int32_t id : spec_.generation_eos_ids) add_unique(chat_end_ids_, id);
  if (!spec_.eos_token.empty())
    if (std::optional<int32_t> id = special_id(spec_.eos_token)) add_unique(chat_end_ids_, *id);
  for (const char* eot : kEndOfTurnTokens) {
    if (spec_.template_source.find(eot) == std::string::npos) continue;
    std::optional<int32_t> id = special_id(eot);
    if (!id) id = tokenizer_->token_id(eot);
    if (id) add_unique(chat_end_ids_, *id);
  }
}

absl::StatusOr<std::string> ChatFormat::render(const nlohmann::json& messages) const {
  json context = {{"messages", messages}, {"add_generation_prompt", true}};
  context["bos_token"] = spec_.bos_token;
  context["eos_token"] = spec_.eos_token;
  if (!spec_.unk_token.empty()) context["unk_token"] = spec_.unk_token;
  if (!spec_.pad_token.empty()) context["pad_token"] = spec_.pad_token;
  absl::StatusOr<std::string> text = renderer_(context);
  if (!text.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the model's chat template refused them: ",
                     text.status().message()));
  return text;
}

std::vector<int32_t> ChatFormat::encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t start = 0;  // of the text not yet encoded
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& s : specials_) {
      if (text.substr(i, s.first.size()) == s.first) {
        hit = &s;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start) {
      // Text after a special token does not start the text (Metaspace "first" tokenizers).
      std::vector<int32_t> part = tokenizer_->encode(text.substr(start, i - start), start == 0);
      out.insert(out.end(), part.begin(), part.end());
    }
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  if (start < text.size()) {
    std::vector<int32_t> part = tokenizer_->encode(text.substr(start), start == 0);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

}  // namespace ltm
