// Reading Hugging Face tokenizers' tokenizer.json (Tokenizer::from_tokenizer_json) and a
// folder's tokenizer_config.json (add_bos_token / add_eos_token). What is read:
//   model          BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), unk_token, fuse_unk,
//                  byte_fallback, ignore_merges; dropout, continuing_subword_prefix and
//                  end_of_word_suffix only when unset. Other model types are refused.
//   added_tokens   id, content, lstrip, rstrip, normalized (single_word must be false).
//   normalizer     null, Prepend, Replace (String or Regex pattern), NFC/NFD/NFKC/NFKD (ICU's),
//                  Sequence of those.
//   pre_tokenizer  null, ByteLevel (last), Split (Regex or String; any behavior; invert),
//                  Metaspace (replacement, prepend_scheme or the older add_prefix_space, split),
//                  Sequence of those.
//   decoder        ByteLevel (byte-level vocabularies), or a Sequence of Replace (String),
//                  ByteFallback, Fuse, Strip, Metaspace (SentencePiece-style ones).
//   post_processor null, ByteLevel, TemplateProcessing (its "single" template: special tokens
//                  before and after $A), Sequence of those.
//   truncation, padding: ignored (the server neither truncates nor pads).
// Anything else is refused with an error that names the field.
#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#if LTM_HAVE_ICU
#include <unicode/normalizer2.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/json_parse.h"
#include "nlohmann/json.hpp"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_pipeline.h"

namespace ltm {

using json = nlohmann::json;
using text_detail::quote_for_message;

// How the decoder turns one token's spelling into text (SentencePiece-style vocabularies).
struct DecoderPlan {
  struct Step {
    enum class Kind { kReplace, kByteFallback, kStrip } kind;
    std::string pattern, content;  // kReplace; kStrip: content is the stripped character
    size_t start = 0, stop = 0;    // kStrip
  };
  std::vector<Step> per_token;     // before Fuse (or with no Fuse)
  size_t strip_start = 0, strip_stop = 0;  // on the whole text (a Strip after Fuse, Metaspace)
  bool byte_level = false;
};

struct TokenizerJsonReader {
  std::string source;

  absl::Status error(const std::string& path, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", path, ": ", what));
  }

  absl::StatusOr<const json*> object(const json& parent, const std::string& key,
                                     const std::string& path, bool required) const {
    auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) {
      if (required) return error(path, "is missing");
      return static_cast<const json*>(nullptr);
    }
    if (!it->is_object())
      return error(path, absl::StrCat("must be an object, got ", json_brief(*it)));
    return &*it;
  }

  absl::StatusOr<bool> get_bool(const json& obj, const std::string& key, const std::string& path,
                                bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean())
      return error(absl::StrCat(path, ".", key), absl::StrCat("must be true or false, got ",
                                                              json_brief(*it)));
    return it->get<bool>();
  }

  absl::StatusOr<std::string> get_string(const json& obj, const std::string& key,
                                         const std::string& path, bool required) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (required) return error(absl::StrCat(path, ".", key), "is missing");
      return std::string();
    }
    if (!it->is_string())
      return error(absl::StrCat(path, ".", key), absl::StrCat("must be a string, got ",
                                                              json_brief(*it)));
    return it->get<std::string>();
  }

  absl::StatusOr<std::string> type_of(const json& obj, const std::string& path) const {
    if (!obj.is_object())
      return error(path, absl::StrCat("must be an object, got ", json_brief(obj)));
    return get_string(obj, "type", path, /*required=*/true);
  }

  absl::Status unsupported(const std::string& path, const std::string& type,
                           const std::string& supported) const {
    return error(absl::StrCat(path, ".type"), absl::StrCat(quote_for_message(type),
                                                          " is not supported (ltm reads ",
                                                          supported, ")"));
  }

  // A Split's or Replace's pattern: {"Regex": "..."} or {"String": "..."}.
  absl::Status read_pattern(const json& obj, const std::string& path, std::string& literal,
                            std::shared_ptr<const TextRegex>& regex) const {
    auto it = obj.find("pattern");
    if (it == obj.end() || !it->is_object() || it->size() != 1)
      return error(absl::StrCat(path, ".pattern"),
                   "must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    const std::string kind = it->begin().key();
    const json& value = it->begin().value();
    if (!value.is_string() || (kind != "Regex" && kind != "String"))
      return error(absl::StrCat(path, ".pattern"),
                   "must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    if (kind == "String") {
      literal = value.get<std::string>();
      return absl::OkStatus();
    }
    absl::StatusOr<std::shared_ptr<const TextRegex>> re =
        TextRegex::compile(value.get<std::string>());
    if (!re.ok())
      return error(absl::StrCat(path, ".pattern.Regex"), std::string(re.status().message()));
    regex = *std::move(re);
    return absl::OkStatus();
  }

  absl::Status read_normalizer(const json& n, const std::string& path,
                               std::vector<NormalizerStep>& out) const {
    LTM_ASSIGN_OR_RETURN(std::string type, type_of(n, path));
    if (type == "Sequence") {
      auto it = n.find("normalizers");
      if (it == n.end() || !it->is_array()) return error(path + ".normalizers", "must be a list");
      for (size_t i = 0; i < it->size(); ++i)
        LTM_RETURN_IF_ERROR(
            read_normalizer((*it)[i], absl::StrCat(path, ".normalizers[", i, "]"), out));
      return absl::OkStatus();
    }
    NormalizerStep step;
    if (type == "Prepend") {
      step.kind = NormalizerStep::Kind::kPrepend;
      LTM_ASSIGN_OR_RETURN(step.text, get_string(n, "prepend", path, true));
    } else if (type == "Replace") {
      step.kind = NormalizerStep::Kind::kReplace;
      LTM_RETURN_IF_ERROR(read_pattern(n, path, step.text, step.regex));
      LTM_ASSIGN_OR_RETURN(step.content, get_string(n, "content", path, true));
    } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      step.kind = NormalizerStep::Kind::kUnicode;
#if !LTM_HAVE_ICU
      return error(path + ".type", absl::StrCat("\"", type, "\" needs ICU, which this build "
                                                "(the GPU-only build) does without"));
#else
      UErrorCode err = U_ZERO_ERROR;
      step.unicode_form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(err)
                          : type == "NFD"  ? icu::Normalizer2::getNFDInstance(err)
                          : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(err)
                                           : icu::Normalizer2::getNFKDInstance(err);
      if (U_FAILURE(err) || step.unicode_form == nullptr)
        return error(path, absl::StrCat("ICU has no ", type, " data (", u_errorName(err), ")"));
#endif
    } else {
      return unsupported(path, type,
                         "Prepend, Replace, NFC, NFD, NFKC, NFKD and Sequence normalizers");
    }
    out.push_back(std::move(step));
    return absl::OkStatus();
  }

  absl::Status read_pre_tokenizer(const json& p, const std::string& path,
                                  std::vector<PreTokenizerStep>& out) const {
    LTM_ASSIGN_OR_RETURN(std::string type, type_of(p, path));
    if (type == "Sequence") {
      auto it = p.find("pretokenizers");
      if (it == p.end() || !it->is_array()) return error(path + ".pretokenizers", "must be a list");
      for (size_t i = 0; i < it->size(); ++i)
        LTM_RETURN_IF_ERROR(
            read_pre_tokenizer((*it)[i], absl::StrCat(path, ".pretokenizers[", i, "]"), out));
      return absl::OkStatus();
    }
    PreTokenizerStep step;
    if (type == "ByteLevel") {
      step.kind = PreTokenizerStep::Kind::kByteLevel;
      LTM_ASSIGN_OR_RETURN(step.add_prefix_space, get_bool(p, "add_prefix_space", path, true));
      LTM_ASSIGN_OR_RETURN(step.use_regex, get_bool(p, "use_regex", path, true));
    } else if (type == "Split") {
      step.kind = PreTokenizerStep::Kind::kSplit;
      LTM_RETURN_IF_ERROR(read_pattern(p, path, step.literal, step.regex));
      LTM_ASSIGN_OR_RETURN(std::string behavior, get_string(p, "behavior", path, true));
      static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
          {"Removed", SplitBehavior::kRemoved},
          {"Isolated", SplitBehavior::kIsolated},
          {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
          {"MergedWithNext", SplitBehavior::kMergedWithNext},
          {"Contiguous", SplitBehavior::kContiguous}};
      bool known = false;
      for (const auto& [name, b] : kBehaviors) {
        if (behavior == name) step.behavior = b, known = true;
      }
      if (!known)
        return error(path + ".behavior", absl::StrCat(quote_for_message(behavior),
                                                      " is not a split behavior"));
      LTM_ASSIGN_OR_RETURN(step.invert, get_bool(p, "invert", path, false));
    } else if (type == "Metaspace") {
      step.kind = PreTokenizerStep::Kind::kMetaspace;
      LTM_ASSIGN_OR_RETURN(step.replacement, get_string(p, "replacement", path, true));
      if (step.replacement.empty() ||
          text_detail::utf8_length(step.replacement, 0) != step.replacement.size())
        return error(path + ".replacement", "must be one character");
      LTM_ASSIGN_OR_RETURN(step.prepend, read_prepend_scheme(p, path));
      LTM_ASSIGN_OR_RETURN(step.split, get_bool(p, "split", path, true));
    } else {
      return unsupported(path, type, "ByteLevel, Split, Metaspace and Sequence pre-tokenizers");
    }
    out.push_back(std::move(step));
    return absl::OkStatus();
  }

  // Metaspace's prepend_scheme, or the older add_prefix_space (true: always).
  absl::StatusOr<PreTokenizerStep::Prepend> read_prepend_scheme(const json& p,
                                                                const std::string& path) const {
    LTM_ASSIGN_OR_RETURN(std::string scheme, get_string(p, "prepend_scheme", path, false));
    if (scheme.empty()) {
      LTM_ASSIGN_OR_RETURN(bool add, get_bool(p, "add_prefix_space", path, true));
      return add ? PreTokenizerStep::Prepend::kAlways : PreTokenizerStep::Prepend::kNever;
    }
    if (scheme == "always") return PreTokenizerStep::Prepend::kAlways;
    if (scheme == "first") return PreTokenizerStep::Prepend::kFirst;
    if (scheme == "never") return PreTokenizerStep::Prepend::kNever;
    return error(path + ".prepend_scheme",
                 absl::StrCat(quote_for_message(scheme), " is not always, first or never"));
  }

  absl::Status read_decoder(const json& d, const std::string& path, DecoderPlan& plan,
                            bool& fused) const {
    LTM_ASSIGN_OR_RETURN(std::string type, type_of(d, path));
    using Step = DecoderPlan::Step;
    if (type == "Sequence") {
      auto it = d.find("decoders");
      if (it == d.end() || !it->is_array()) return error(path + ".decoders", "must be a list");
      for (size_t i = 0; i < it->size(); ++i)
        LTM_RETURN_IF_ERROR(
            read_decoder((*it)[i], absl::StrCat(path, ".decoders[", i, "]"), plan, fused));
      return absl::OkStatus();
    }
    if (type == "ByteLevel") {
      plan.byte_level = true;
      return absl::OkStatus();
    }
    if (type == "Fuse") {
      fused = true;
      return absl::OkStatus();
    }
    if (type == "Strip") {
      LTM_ASSIGN_OR_RETURN(std::string content, get_string(d, "content", path, true));
      const auto count = [&](const char* key) -> absl::StatusOr<size_t> {
        auto it = d.find(key);
        if (it == d.end() || it->is_null()) return size_t{0};
        if (!it->is_number_unsigned() || it->get<uint64_t>() > 1024)
          return error(absl::StrCat(path, ".", key), "must be a small non-negative integer");
        return static_cast<size_t>(it->get<uint64_t>());
      };
      LTM_ASSIGN_OR_RETURN(size_t start, count("start"));
      LTM_ASSIGN_OR_RETURN(size_t stop, count("stop"));
      if (fused) {
        if (content != " ")
          return error(path + ".content", "only \" \" is supported for a Strip after Fuse");
        plan.strip_start += start;
        plan.strip_stop += stop;
      } else {
        if (text_detail::utf8_length(content, 0) != content.size() || content.empty())
          return error(path + ".content", "must be one character");
        plan.per_token.push_back({Step::Kind::kStrip, "", content, start, stop});
      }
      return absl::OkStatus();
    }
    if (fused)
      return error(absl::StrCat(path, ".type"),
                   absl::StrCat(quote_for_message(type), " after Fuse is not supported"));
    if (type == "Replace") {
      std::string literal;
      std::shared_ptr<const TextRegex> regex;
      LTM_RETURN_IF_ERROR(read_pattern(d, path, literal, regex));
      if (regex) return error(path + ".pattern", "a Regex pattern is not supported in a decoder");
      LTM_ASSIGN_OR_RETURN(std::string content, get_string(d, "content", path, true));
      plan.per_token.push_back({Step::Kind::kReplace, literal, content, 0, 0});
      return absl::OkStatus();
    }
    if (type == "ByteFallback") {
      plan.per_token.push_back({Step::Kind::kByteFallback, "", "", 0, 0});
      return absl::OkStatus();
    }
    if (type == "Metaspace") {
      LTM_ASSIGN_OR_RETURN(std::string replacement, get_string(d, "replacement", path, true));
      LTM_ASSIGN_OR_RETURN(PreTokenizerStep::Prepend prepend, read_prepend_scheme(d, path));
      plan.per_token.push_back({Step::Kind::kReplace, replacement, " ", 0, 0});
      if (prepend != PreTokenizerStep::Prepend::kNever) plan.strip_start += 1;
      return absl::OkStatus();
    }
    return unsupported(path, type,
                       "ByteLevel, or Replace, ByteFallback, Fuse, Strip and Metaspace decoders");
  }

  // The ids TemplateProcessing's "single" template puts before and after the text.
  absl::Status read_post_processor(const json& p, const std::string& path,
                                   std::vector<int32_t>& prefix,
                                   std::vector<int32_t>& suffix) const {
    LTM_ASSIGN_OR_RETURN(std::string type, type_of(p, path));
    if (type == "ByteLevel") return absl::OkStatus();  // offsets only
    if (type == "Sequence") {
      auto it = p.find("processors");
      if (it == p.end() || !it->is_array()) return error(path + ".processors", "must be a list");
      for (size_t i = 0; i < it->size(); ++i)
        LTM_RETURN_IF_ERROR(read_post_processor(
            (*it)[i], absl::StrCat(path, ".processors[", i, "]"), prefix, suffix));
      return absl::OkStatus();
    }
    if (type != "TemplateProcessing")
      return unsupported(path, type, "TemplateProcessing, ByteLevel and Sequence post-processors");
    LTM_ASSIGN_OR_RETURN(const json* specials, object(p, "special_tokens", path + ".special_tokens",
                                                      false));
    auto single = p.find("single");
    if (single == p.end() || !single->is_array()) return error(path + ".single", "must be a list");
    bool seen_text = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const std::string at = absl::StrCat(path, ".single[", i, "]");
      const json& item = (*single)[i];
      if (!item.is_object() || item.size() != 1)
        return error(at, "must be {\"SpecialToken\": {...}} or {\"Sequence\": {...}}");
      const std::string kind = item.begin().key();
      const json& value = item.begin().value();
      if (!value.is_object() || !value.contains("id") || !value["id"].is_string())
        return error(at, "must have an \"id\" string");
      const std::string id = value["id"].get<std::string>();
      if (kind == "Sequence") {
        if (id != "A" || seen_text) return error(at, "a single-sequence template holds $A once");
        seen_text = true;
        continue;
      }
      if (kind != "SpecialToken")
        return error(at, "must be {\"SpecialToken\": {...}} or {\"Sequence\": {...}}");
      // find, not operator[]: a const json's operator[] on a missing key reads past the map.
      const json* entry = nullptr;
      if (specials) {
        auto found = specials->find(id);
        if (found != specials->end()) entry = &*found;
      }
      if (entry == nullptr || !entry->is_object() || !entry->contains("ids") ||
          !(*entry)["ids"].is_array())
        return error(at, absl::StrCat("special token ", quote_for_message(id),
                                      " has no \"ids\" in special_tokens"));
      for (const json& v : (*entry)["ids"]) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() >= uint64_t{text_detail::kMaxId})
          return error(path + ".special_tokens", absl::StrCat("id ", json_brief(v),
                                                              " of ", quote_for_message(id),
                                                              " is not a token id"));
        (seen_text ? suffix : prefix).push_back(static_cast<int32_t>(v.get<uint64_t>()));
      }
    }
    if (!seen_text) return error(path + ".single", "does not hold $A");
    return absl::OkStatus();
  }

  absl::StatusOr<Tokenizer> read(std::string_view text) const;
};

namespace {

bool parse_byte_token(std::string_view t, uint8_t* byte) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return false;
  int v = 0;
  for (const char c : t.substr(3, 2)) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = v * 16 + d;
  }
  *byte = static_cast<uint8_t>(v);
  return true;
}

// One token's text through the decoder steps before Fuse.
std::string decode_token(const DecoderPlan& plan, const std::string& spelling) {
  std::string s = spelling;
  for (const DecoderPlan::Step& step : plan.per_token) {
    switch (step.kind) {
      case DecoderPlan::Step::Kind::kReplace: {
        if (step.pattern.empty()) break;
        std::string out;
        size_t prev = 0;
        for (size_t at = s.find(step.pattern); at != std::string::npos;
             at = s.find(step.pattern, prev)) {
          out.append(s, prev, at - prev);
          out += step.content;
          prev = at + step.pattern.size();
        }
        out.append(s, prev);
        s = std::move(out);
        break;
      }
      case DecoderPlan::Step::Kind::kByteFallback: {
        uint8_t b;
        if (parse_byte_token(s, &b)) s = std::string(1, static_cast<char>(b));
        break;
      }
      case DecoderPlan::Step::Kind::kStrip: {
        const std::string& c = step.content;
        for (size_t k = 0; k < step.start && s.starts_with(c); ++k) s.erase(0, c.size());
        for (size_t k = 0; k < step.stop && s.ends_with(c); ++k) s.resize(s.size() - c.size());
        break;
      }
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<Tokenizer> TokenizerJsonReader::read(std::string_view text) const {
  absl::StatusOr<json> parsed = parse_json(text);
  if (!parsed.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", parsed.status().message()));
  const json& root = *parsed;
  if (!root.is_object()) return error("(top level)", "must be a JSON object");
  auto pipeline = std::make_shared<TokenizerPipeline>();
  TokenizerPipeline& p = *pipeline;

  // The model.
  LTM_ASSIGN_OR_RETURN(const json* model, object(root, "model", "model", true));
  LTM_ASSIGN_OR_RETURN(std::string model_type, get_string(*model, "type", "model", false));
  if (!model_type.empty() && model_type != "BPE")
    return unsupported("model", model_type, "BPE models");
  if (auto it = model->find("dropout");
      it != model->end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0))
    return error("model.dropout", "BPE dropout is not supported (must be null)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    LTM_ASSIGN_OR_RETURN(std::string v, get_string(*model, key, "model", false));
    if (!v.empty())
      return error(absl::StrCat("model.", key), "is not supported (must be null or empty)");
  }
  LTM_ASSIGN_OR_RETURN(p.byte_fallback, get_bool(*model, "byte_fallback", "model", false));
  LTM_ASSIGN_OR_RETURN(p.fuse_unk, get_bool(*model, "fuse_unk", "model", false));
  LTM_ASSIGN_OR_RETURN(p.ignore_merges, get_bool(*model, "ignore_merges", "model", false));
  LTM_ASSIGN_OR_RETURN(std::string unk, get_string(*model, "unk_token", "model", false));

  LTM_ASSIGN_OR_RETURN(const json* vocab_json, object(*model, "vocab", "model.vocab", true));
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_json->size());
  for (const auto& [token, value] : vocab_json->items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= uint64_t{text_detail::kMaxId})
      return error("model.vocab", absl::StrCat("token ", quote_for_message(token), " has id ",
                                               json_brief(value), ", expected an integer in [0, ",
                                               text_detail::kMaxId, ")"));
    vocab.emplace_back(token, static_cast<int32_t>(value.get<uint64_t>()));
  }
  auto merges_it = model->find("merges");
  if (merges_it == model->end() || !merges_it->is_array())
    return error("model.merges", "must be a list");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_it->size());
  for (size_t i = 0; i < merges_it->size(); ++i) {
    const json& m = (*merges_it)[i];
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string::npos)
        return error(absl::StrCat("model.merges[", i, "]"),
                     absl::StrCat("expected two tokens separated by one space, got ",
                                  quote_for_message(line)));
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return error(absl::StrCat("model.merges[", i, "]"),
                   absl::StrCat("expected \"a b\" or [\"a\", \"b\"], got ", json_brief(m)));
    }
  }

  // Normalizer and pre-tokenizer.
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null())
    LTM_RETURN_IF_ERROR(read_normalizer(*it, "normalizer", p.normalizer));
  if (auto it = root.find("pre_tokenizer"); it != root.end() && !it->is_null())
    LTM_RETURN_IF_ERROR(read_pre_tokenizer(*it, "pre_tokenizer", p.pre_tokenizer));
  for (size_t i = 0; i < p.pre_tokenizer.size(); ++i) {
    if (p.pre_tokenizer[i].kind != PreTokenizerStep::Kind::kByteLevel) continue;
    if (i + 1 != p.pre_tokenizer.size())
      return error("pre_tokenizer", "ByteLevel must be the last pre-tokenizer step");
  }
  p.byte_units = !p.pre_tokenizer.empty() &&
                 p.pre_tokenizer.back().kind == PreTokenizerStep::Kind::kByteLevel;

  // The decoder must undo what the model's spelling does.
  DecoderPlan plan;
  {
    auto it = root.find("decoder");
    if (it == root.end() || it->is_null())
      return error("decoder", "is missing (ltm needs a ByteLevel or SentencePiece-style decoder)");
    bool fused = false;
    LTM_RETURN_IF_ERROR(read_decoder(*it, "decoder", plan, fused));
    if (p.byte_units && (!plan.byte_level || !plan.per_token.empty() || plan.strip_start ||
                         plan.strip_stop))
      return error("decoder", "a ByteLevel pre-tokenizer needs the ByteLevel decoder alone");
    if (!p.byte_units && plan.byte_level)
      return error("decoder", "the ByteLevel decoder needs a ByteLevel pre-tokenizer");
  }

  absl::StatusOr<Tokenizer> built = Tokenizer::build(
      vocab, merges, source,
      [&](size_t rank) { return absl::StrCat(source, ": model.merges[", rank, "]"); },
      p.byte_units);
  if (!built.ok()) return built.status();
  Tokenizer tok = *std::move(built);

  // Model keys, byte fallback, unk.
  p.key_to_id.reserve(vocab.size());
  for (const auto& [spelling, id] : vocab)
    p.key_to_id.emplace(p.byte_units ? tok.id_to_bytes_[id] : spelling, id);
  std::fill(std::begin(p.byte_fallback_id), std::end(p.byte_fallback_id), -1);
  for (int b = 0; b < 256; ++b) {
    if (std::optional<int32_t> id = tok.token_id(absl::StrFormat("<0x%02X>", b)))
      p.byte_fallback_id[b] = *id;
  }
  if (!unk.empty()) {
    std::optional<int32_t> id = tok.token_id(unk);
    if (!id)
      return error("model.unk_token", absl::StrCat(quote_for_message(unk),
                                                   " is not in model.vocab"));
    p.unk_id = *id;
  }
  if (!p.byte_units) {
    for (const auto& [spelling, id] : vocab) tok.id_to_bytes_[id] = decode_token(plan, spelling);
  }
  tok.decode_strip_start_ = plan.strip_start;
  tok.decode_strip_stop_ = plan.strip_stop;

  // Added tokens: in the vocab (growing it when their ids are beyond the model's), matched whole.
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) return error("added_tokens", "must be a list");
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string at = absl::StrCat("added_tokens[", i, "]");
      const json& a = (*it)[i];
      if (!a.is_object()) return error(at, "must be an object");
      AddedTokenSpec spec;
      auto idv = a.find("id");
      if (idv == a.end() || !idv->is_number_unsigned() ||
          idv->get<uint64_t>() >= uint64_t{text_detail::kMaxId})
        return error(at + ".id", absl::StrCat("must be a token id in [0, ", text_detail::kMaxId,
                                              ")"));
      spec.id = static_cast<int32_t>(idv->get<uint64_t>());
      LTM_ASSIGN_OR_RETURN(spec.content, get_string(a, "content", at, true));
      if (spec.content.empty() || !is_valid_utf8(spec.content))
        return error(at + ".content", "must be a non-empty UTF-8 string");
      LTM_ASSIGN_OR_RETURN(bool single_word, get_bool(a, "single_word", at, false));
      if (single_word) return error(at + ".single_word", "true is not supported");
      LTM_ASSIGN_OR_RETURN(spec.lstrip, get_bool(a, "lstrip", at, false));
      LTM_ASSIGN_OR_RETURN(spec.rstrip, get_bool(a, "rstrip", at, false));
      LTM_ASSIGN_OR_RETURN(bool special, get_bool(a, "special", at, false));
      LTM_ASSIGN_OR_RETURN(spec.normalized, get_bool(a, "normalized", at, !special));
      const size_t id = static_cast<size_t>(spec.id);
      if (id >= tok.id_to_bytes_.size()) {
        tok.id_to_bytes_.resize(id + 1);
        tok.id_present_.resize(id + 1, false);
      }
      // Decoded as the decoder would: a byte-level spelling is undone when it is one.
      std::string bytes = spec.content;
      if (p.byte_units) {
        if (absl::StatusOr<std::string> b = text_detail::spelling_to_bytes(spec.content); b.ok())
          bytes = *std::move(b);
      } else {
        bytes = decode_token(plan, spec.content);
      }
      tok.id_to_bytes_[id] = std::move(bytes);
      tok.id_present_[id] = true;
      tok.text_to_id_[spec.content] = spec.id;
      if (spec.normalized && !p.normalizer.empty())
        spec.content = text_detail::normalize(p, spec.content);
      p.added.push_back(std::move(spec));
    }
  }
  std::stable_sort(p.added.begin(), p.added.end(), [](const auto& a, const auto& b) {
    return a.content.size() > b.content.size();
  });
  for (uint32_t k = 0; k < p.added.size(); ++k) {
    if (p.added[k].content.empty()) continue;  // normalized away: it can never match
    const int cls = p.added[k].normalized ? 1 : 0;
    p.added_by_byte[cls][static_cast<uint8_t>(p.added[k].content[0])].push_back(k);
    p.any_added[cls] = true;
  }

  // The post-processor's tokens around a prompt.
  if (auto it = root.find("post_processor"); it != root.end() && !it->is_null())
    LTM_RETURN_IF_ERROR(
        read_post_processor(*it, "post_processor", tok.prompt_prefix_, tok.prompt_suffix_));
  for (const auto* ids : {&tok.prompt_prefix_, &tok.prompt_suffix_}) {
    for (const int32_t id : *ids)
      if (!tok.valid_id(id))
        return error("post_processor", absl::StrCat("id ", id, " is not a token"));
  }

  tok.pipeline_ = std::move(pipeline);
  return tok;
}

absl::StatusOr<Tokenizer> Tokenizer::from_tokenizer_json(std::string_view json_text,
                                                         const std::string& source) {
  return TokenizerJsonReader{source}.read(json_text);
}

// tokenizer_config.json: add_bos_token / add_eos_token (when given) decide what encode_prompt()
// adds, with bos_token / eos_token (a string, or an object with "content").
absl::Status Tokenizer::read_tokenizer_config(const std::string& dir) {
  const std::string path = dir + "/tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::OkStatus();
  LTM_ASSIGN_OR_RETURN(std::string text, text_detail::read_file(path));
  absl::StatusOr<json> cfg = parse_json(text);
  if (!cfg.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ",
                                                   cfg.status().message()));
  if (!cfg->is_object()) return absl::InvalidArgumentError(path + ": must be a JSON object");
  const TokenizerJsonReader r{path};
  const auto side = [&](const char* flag, const char* token,
                        std::vector<int32_t>& ids) -> absl::Status {
    auto f = cfg->find(flag);
    if (f == cfg->end() || f->is_null()) return absl::OkStatus();
    if (!f->is_boolean()) return r.error(flag, "must be true or false");
    ids.clear();
    if (!f->get<bool>()) return absl::OkStatus();
    auto t = cfg->find(token);
    std::string content;
    if (t != cfg->end() && t->is_string()) content = t->get<std::string>();
    if (t != cfg->end() && t->is_object() && t->contains("content") && (*t)["content"].is_string())
      content = (*t)["content"].get<std::string>();
    if (content.empty())
      return r.error(token, absl::StrCat("must name a token (", flag, " is true)"));
    std::optional<int32_t> id = token_id(content);
    if (!id) return r.error(token, absl::StrCat(quote_for_message(content),
                                                " is not a token of the vocabulary"));
    ids.push_back(*id);
    return absl::OkStatus();
  };
  LTM_RETURN_IF_ERROR(side("add_bos_token", "bos_token", prompt_prefix_));
  LTM_RETURN_IF_ERROR(side("add_eos_token", "eos_token", prompt_suffix_));
  return absl::OkStatus();
}

}  // namespace ltm
