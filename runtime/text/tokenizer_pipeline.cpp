// Tokenizer::encode for tokenizer.json files: added tokens, normalizer, pre-tokenizer, model
// (tokenizer_pipeline.h). The semantics are those of Hugging Face tokenizers, written from its
// documented behaviour and checked against it (tests/python/test_tokenizer_json.py).
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if LTM_HAVE_ICU
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#endif

#include "common/check.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_pipeline.h"

namespace ltm {
namespace {

using Ranges = std::vector<std::pair<size_t, size_t>>;

// A piece of text on its way through the pre-tokenizer.
struct Piece {
  std::string text;
  bool at_start;  // begins where the text given to encode() begins (Metaspace "first")
};

// Length of the whitespace code point that ends at text[end) (0 if none).
size_t space_before(std::string_view text, size_t begin, size_t end) {
  for (size_t len = 1; len <= 4 && len <= end - begin; ++len) {
    size_t cl = 0;
    const char32_t cp = text_detail::code_point_at(text, end - len, &cl);
    if (cl == len) return text_detail::is_space(cp) ? len : 0;
  }
  return 0;
}

size_t space_after(std::string_view text, size_t i) {
  if (i >= text.size()) return 0;
  size_t len = 0;
  const char32_t cp = text_detail::code_point_at(text, i, &len);
  return text_detail::is_space(cp) ? len : 0;
}

// Splits `text` at the added tokens of class `cls` (0: raw, 1: normalized): leftmost match,
// longest at that place; lstrip/rstrip take the whitespace around it. Calls on_text(begin, end)
// for each non-empty stretch between matches and on_token(id) for each match, in order.
template <class OnText, class OnToken>
void split_added(const TokenizerPipeline& p, int cls, std::string_view text, OnText on_text,
                 OnToken on_token) {
  size_t done = 0;  // end of the last match
  size_t i = 0;
  while (i < text.size()) {
    const std::vector<uint32_t>& candidates = p.added_by_byte[cls][static_cast<uint8_t>(text[i])];
    const AddedTokenSpec* hit = nullptr;
    for (const uint32_t k : candidates) {
      const AddedTokenSpec& a = p.added[k];
      if (text.substr(i, a.content.size()) == a.content) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->content.size();
    if (hit->lstrip) {
      while (size_t len = space_before(text, done, begin)) begin -= len;
    }
    if (hit->rstrip) {
      while (size_t len = space_after(text, end)) end += len;
    }
    if (begin > done) on_text(done, begin);
    on_token(hit->id);
    done = i = end;
  }
  if (done < text.size()) on_text(done, text.size());
}

void find_literal(std::string_view text, std::string_view pattern, Ranges& out) {
  if (pattern.empty()) return;
  for (size_t at = text.find(pattern); at != std::string_view::npos;
       at = text.find(pattern, at + pattern.size()))
    out.emplace_back(at, at + pattern.size());
}

// The pieces of `piece` that a split with these matches and behaviour leaves (HF's
// SplitDelimiterBehavior), appended to `out`; empty ones are dropped.
void split_piece(const Piece& piece, const Ranges& matches, SplitBehavior behavior, bool invert,
                 std::vector<Piece>& out) {
  struct Section {
    size_t begin, end;
    bool match;
  };
  std::vector<Section> sections;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) sections.push_back({prev, b, invert});
    sections.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < piece.text.size()) sections.push_back({prev, piece.text.size(), invert});

  std::vector<Section> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Section& s : sections)
        if (!s.match) kept.push_back(s);
      break;
    case SplitBehavior::kIsolated:
      kept = std::move(sections);  // moved: copying gave a false GCC 12 -Wfree-nonheap-object
      break;
    case SplitBehavior::kMergedWithPrevious:  // a delimiter ends the piece before it
      for (const Section& s : sections) {
        if (s.match && !previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:  // a delimiter starts the piece after it
      for (auto it = sections.rbegin(); it != sections.rend(); ++it) {
        if (it->match && !previous_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        previous_match = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:  // runs of delimiters, runs of the rest
      for (const Section& s : sections) {
        if (s.match == previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous_match = s.match;
      }
      break;
  }
  for (const Section& s : kept) {
    if (s.end <= s.begin) continue;
    out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  }
}

std::string replace_all(std::string_view text, std::string_view pattern, std::string_view with) {
  std::string out;
  if (pattern.empty()) return std::string(text);
  size_t prev = 0;
  for (size_t at = text.find(pattern); at != std::string_view::npos;
       at = text.find(pattern, prev)) {
    out.append(text.substr(prev, at - prev));
    out.append(with);
    prev = at + pattern.size();
  }
  out.append(text.substr(prev));
  return out;
}

void apply_pre_tokenizer(const PreTokenizerStep& step, Piece& piece, std::vector<Piece>& out) {
  Ranges matches;
  switch (step.kind) {
    case PreTokenizerStep::Kind::kSplit:
      if (step.regex) {
        step.regex->find_all(piece.text, matches);
      } else {
        find_literal(piece.text, step.literal, matches);
      }
      split_piece(piece, matches, step.behavior, step.invert, out);
      return;
    case PreTokenizerStep::Kind::kByteLevel:
      if (step.add_prefix_space && !piece.text.starts_with(' ')) piece.text.insert(0, 1, ' ');
      if (!step.use_regex) {
        out.push_back(std::move(piece));
        return;
      }
      text_detail::gpt2_pre_tokens(piece.text, matches);
      split_piece(piece, matches, SplitBehavior::kIsolated, false, out);
      return;
    case PreTokenizerStep::Kind::kMetaspace: {
      piece.text = replace_all(piece.text, " ", step.replacement);
      const bool prepend =
          step.prepend == PreTokenizerStep::Prepend::kAlways ||
          (step.prepend == PreTokenizerStep::Prepend::kFirst && piece.at_start);
      if (prepend && !piece.text.starts_with(step.replacement))
        piece.text.insert(0, step.replacement);
      if (!step.split) {
        out.push_back(std::move(piece));
        return;
      }
      find_literal(piece.text, step.replacement, matches);
      split_piece(piece, matches, SplitBehavior::kMergedWithNext, false, out);
      return;
    }
  }
}

}  // namespace

std::string text_detail::normalize(const TokenizerPipeline& p, std::string_view text) {
  std::string s(text);
  for (const NormalizerStep& step : p.normalizer) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.text);
        break;
      case NormalizerStep::Kind::kUnicode: {
#if LTM_HAVE_ICU
        // ASCII is the same in every form; text that is not UTF-8 is left as it is (HF's
        // library only ever sees valid text).
        if (std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; })) break;
        if (!is_valid_utf8(s)) break;
        const auto* form = static_cast<const icu::Normalizer2*>(step.unicode_form);
        UErrorCode err = U_ZERO_ERROR;
        std::string out;
        icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
        form->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink,
                            nullptr, err);
        if (U_SUCCESS(err)) s = std::move(out);
#endif
        break;
      }
      case NormalizerStep::Kind::kReplace:
        if (!step.regex) {
          s = replace_all(s, step.text, step.content);
        } else {
          Ranges matches;
          step.regex->find_all(s, matches);
          std::string out;
          size_t prev = 0;
          for (const auto& [b, e] : matches) {
            out.append(s, prev, b - prev);
            out += step.content;
            prev = e;
          }
          out.append(s, prev);
          s = std::move(out);
        }
        break;
    }
  }
  return s;
}

void Tokenizer::encode_with_pipeline(std::string_view text, bool at_start,
                                     std::vector<int32_t>& out) const {
  const TokenizerPipeline& p = *pipeline_;
  if (!p.any_added[0]) {
    encode_segment(text, at_start, out);
    return;
  }
  split_added(
      p, 0, text,
      [&](size_t b, size_t e) { encode_segment(text.substr(b, e - b), at_start && b == 0, out); },
      [&](int32_t id) { out.push_back(id); });
}

// One stretch of raw text between added tokens: normalized, split at the added tokens matched
// in normalized text, pre-tokenized, each pre-token through the model.
void Tokenizer::encode_segment(std::string_view text, bool at_start,
                               std::vector<int32_t>& out) const {
  const TokenizerPipeline& p = *pipeline_;
  const std::string normalized = p.normalizer.empty() ? std::string(text)
                                                      : text_detail::normalize(p, text);
  auto pre_tokenize = [&](std::string_view part, bool first) {
    std::vector<Piece> pieces{{std::string(part), first}};
    std::vector<Piece> next;
    for (const PreTokenizerStep& step : p.pre_tokenizer) {
      next.clear();
      for (Piece& piece : pieces) apply_pre_tokenizer(step, piece, next);
      pieces.swap(next);
    }
    for (const Piece& piece : pieces) encode_pre_token(piece.text, out);
  };
  if (!p.any_added[1]) {
    pre_tokenize(normalized, at_start);
    return;
  }
  const std::string_view n = normalized;
  split_added(
      p, 1, n, [&](size_t b, size_t e) { pre_tokenize(n.substr(b, e - b), at_start && b == 0); },
      [&](int32_t id) { out.push_back(id); });
}

// The model on one pre-token: its units (bytes, or code points with byte fallback and unk),
// then the merges.
void Tokenizer::encode_pre_token(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  const TokenizerPipeline& p = *pipeline_;
  if (p.ignore_merges) {
    auto it = p.key_to_id.find(absl::string_view(piece.data(), piece.size()));
    if (it != p.key_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (p.byte_units) {
    bpe(piece, out);
    return;
  }
  std::vector<int32_t> units;
  units.reserve(piece.size());
  bool last_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t len = text_detail::utf8_length(piece, i);
    const std::string_view unit = piece.substr(i, len);
    i += len;
    auto it = p.key_to_id.find(absl::string_view(unit.data(), unit.size()));
    if (it != p.key_to_id.end()) {
      units.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (p.byte_fallback) {
      bool all = true;
      for (const char c : unit) all = all && p.byte_fallback_id[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (const char c : unit) units.push_back(p.byte_fallback_id[static_cast<uint8_t>(c)]);
        last_unk = false;
        continue;
      }
    }
    if (p.unk_id < 0) continue;  // no unk token: the code point is dropped (as HF does)
    if (!(p.fuse_unk && last_unk)) units.push_back(p.unk_id);
    last_unk = true;
  }
  bpe_symbols(units, out);
}

}  // namespace ltm
