#include "runtime/text/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/json_parse.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "runtime/text/tokenizer_pipeline.h"
#include "runtime/text/unicode_tables.h"

namespace ltm {
namespace {

using unicode::CodePointClass;

// ---- UTF-8 --------------------------------------------------------------------------------------

enum class Utf8Kind : uint8_t { kOk, kInvalid, kIncomplete };

struct Utf8Step {
  char32_t cp;   // the code point when kOk
  uint32_t len;  // bytes consumed: the sequence, or its maximal invalid/incomplete subpart (>= 1)
  Utf8Kind kind;
};

// Decodes the sequence at p[0..n), n >= 1, following Unicode's table of well-formed byte
// sequences. An ill-formed sequence consumes its maximal subpart (a lead byte and the
// continuation bytes that fit it); kIncomplete means that subpart runs to the end of the input
// and more bytes could still complete it.
Utf8Step next_code_point(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {b0, 1, Utf8Kind::kOk};
  uint32_t need;                       // continuation bytes
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {0, 1, Utf8Kind::kInvalid};  // continuation byte, C0/C1 or F5..FF
  }
  for (uint32_t k = 1; k <= need; ++k) {
    if (k >= n) return {0, k, Utf8Kind::kIncomplete};
    const unsigned char b = p[k];
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return {0, k, Utf8Kind::kInvalid};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, Utf8Kind::kOk};
}

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

// ---- byte-level alphabet (GPT-2's bytes_to_unicode) ---------------------------------------------
// vocab.json spells every byte as a printable code point: the bytes '!'..'~', 0xA1..0xAC and
// 0xAE..0xFF as themselves, the other 68 bytes (controls, space, 0x7F..0xA0, 0xAD) in byte order as
// U+0100, U+0101, ... U+0143.

struct ByteAlphabet {
  char32_t byte_to_cp[256];
  int16_t cp_to_byte[0x144];  // -1: not in the alphabet

  ByteAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    char32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : next_extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
    LTM_ASSERT(next_extra == 0x144);
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

std::string byte_spelling(unsigned char b) {
  std::string s;
  append_utf8(s, byte_alphabet().byte_to_cp[b]);
  return s;
}

}  // namespace

// Raw bytes of a vocab.json spelling; fails on a code point outside the alphabet.
absl::StatusOr<std::string> text_detail::spelling_to_bytes(std::string_view text) {
  const ByteAlphabet& alphabet = byte_alphabet();
  std::string bytes;
  bytes.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const Utf8Step s = next_code_point(p + i, text.size() - i);
    if (s.kind != Utf8Kind::kOk) return absl::InvalidArgumentError("is not valid UTF-8");
    if (s.cp >= 0x144 || alphabet.cp_to_byte[s.cp] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "contains U+%04X, which is not in GPT-2's byte-level alphabet (U+0021..U+0143)",
          static_cast<uint32_t>(s.cp)));
    }
    bytes += static_cast<char>(alphabet.cp_to_byte[s.cp]);
    i += s.len;
  }
  return bytes;
}

namespace {
using text_detail::spelling_to_bytes;

// ---- pre-tokenization ---------------------------------------------------------------------------
// OpenAI's GPT-2 pattern, applied left to right, first alternative that matches wins:
//   's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
// The scanner below implements it over code points; an invalid UTF-8 byte is one code point of
// class kOther (so it lands in a "punctuation" run and is encoded through its byte token).

struct CodePoint {
  size_t offset;    // byte offset in the text
  char32_t cp;      // 0xFFFFFFFF for an invalid byte
  CodePointClass cls;
};

constexpr char32_t kInvalidCodePoint = 0xFFFFFFFF;

void split_code_points(std::string_view text, std::vector<CodePoint>& out) {
  out.clear();
  out.reserve(text.size() + 1);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const Utf8Step s = next_code_point(p + i, text.size() - i);
    if (s.kind == Utf8Kind::kOk) {
      out.push_back({i, s.cp, unicode::classify(s.cp)});
      i += s.len;
    } else {
      out.push_back({i, kInvalidCodePoint, CodePointClass::kOther});
      i += 1;  // each invalid byte on its own
    }
  }
  out.push_back({text.size(), 0, CodePointClass::kOther});  // sentinel
}

// End (exclusive, in code points) of the pre-token that starts at i < n.
size_t match_pre_token(const std::vector<CodePoint>& cps, size_t i, size_t n) {
  const char32_t c = cps[i].cp;
  // 's|'t|'re|'ve|'m|'ll|'d
  if (c == '\'' && i + 1 < n) {
    const char32_t c1 = cps[i + 1].cp;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if (i + 2 < n) {
      const char32_t c2 = cps[i + 2].cp;
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        return i + 3;
      }
    }
  }
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the classes are disjoint, so the class of the
  // first code point after the optional space picks the alternative.
  size_t start = i;
  if (c == ' ' && i + 1 < n && cps[i + 1].cls != CodePointClass::kSpace) start = i + 1;
  const CodePointClass cls = cps[start].cls;
  if (cls != CodePointClass::kSpace) {
    size_t j = start + 1;
    while (j < n && cps[j].cls == cls) ++j;
    return j;
  }
  // `\s+(?!\S)` then `\s+`: a whitespace run at the end of the text is one token; one followed by
  // non-space gives all but its last code point (which then prefixes the next token), unless it
  // is a single code point, which `\s+` takes alone.
  size_t j = i + 1;
  while (j < n && cps[j].cls == CodePointClass::kSpace) ++j;
  if (j == n || j - i == 1) return j;
  return j - 1;
}

// ---- BPE scratch --------------------------------------------------------------------------------

struct Symbol {
  int32_t id;    // -1 once merged into its left neighbour
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
};

struct Candidate {
  int32_t rank;
  int32_t pos;  // index of the left symbol
  // Min-heap on (rank, pos) through std::*_heap, which build max-heaps.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct Scratch {
  std::vector<CodePoint> cps;
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<Candidate> round;
  std::vector<int32_t> touched;
  std::vector<int32_t> units;  // a pre-token's symbols before merging
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Frees scratch buffers that a very long text grew, so that a thread does not keep them.
void trim_thread_scratch() {
  constexpr size_t kKeep = size_t{1} << 16;  // elements
  Scratch& s = thread_scratch();
  if (s.cps.capacity() > kKeep) std::vector<CodePoint>().swap(s.cps);
  if (s.symbols.capacity() > kKeep) std::vector<Symbol>().swap(s.symbols);
  if (s.heap.capacity() > kKeep) std::vector<Candidate>().swap(s.heap);
  if (s.round.capacity() > kKeep) std::vector<Candidate>().swap(s.round);
  if (s.touched.capacity() > kKeep) std::vector<int32_t>().swap(s.touched);
  if (s.units.capacity() > kKeep) std::vector<int32_t>().swap(s.units);
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// ---- loading ------------------------------------------------------------------------------------

}  // namespace

absl::StatusOr<std::string> text_detail::read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(err)));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return std::move(buf).str();
}

// `s` in quotes for an error message, cut after about 60 bytes (at a UTF-8 character boundary).
std::string text_detail::quote_for_message(std::string_view s) {
  size_t keep = std::min<size_t>(s.size(), 60);
  while (keep > 0 && keep < s.size() && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80)
    --keep;
  std::string out = "\"";
  out.append(s.substr(0, keep));
  if (keep < s.size()) out += "...";
  out += "\"";
  return out;
}

bool text_detail::is_space(char32_t cp) {
  return unicode::classify(cp) == CodePointClass::kSpace;
}

size_t text_detail::utf8_length(std::string_view s, size_t i) {
  const Utf8Step step =
      next_code_point(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
  return step.kind == Utf8Kind::kOk ? step.len : 1;
}

char32_t text_detail::code_point_at(std::string_view s, size_t i, size_t* len) {
  const Utf8Step step =
      next_code_point(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
  *len = step.kind == Utf8Kind::kOk ? step.len : 1;
  return step.kind == Utf8Kind::kOk ? step.cp : kInvalidCodePoint;
}

void text_detail::gpt2_pre_tokens(std::string_view text,
                                  std::vector<std::pair<size_t, size_t>>& out) {
  std::vector<CodePoint> cps;
  split_code_points(text, cps);
  const size_t n = cps.size() - 1;
  for (size_t i = 0; i < n;) {
    const size_t j = match_pre_token(cps, i, n);
    out.emplace_back(cps[i].offset, cps[j].offset);
    i = j;
  }
}

using text_detail::kMaxId;
using text_detail::quote_for_message;
using text_detail::read_file;

// ---- Tokenizer ----------------------------------------------------------------------------------

bool Tokenizer::folder_has_tokenizer(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json", ec) ||
         std::filesystem::exists(std::filesystem::path(dir) / "vocab.json", ec);
}

absl::StatusOr<Tokenizer> Tokenizer::load(const std::string& dir) {
  std::error_code ec;
  const std::string json_path = dir + "/tokenizer.json";
  if (std::filesystem::exists(json_path, ec)) {
    LTM_ASSIGN_OR_RETURN(std::string text, read_file(json_path));
    LTM_ASSIGN_OR_RETURN(Tokenizer tok, from_tokenizer_json(text, json_path));
    LTM_RETURN_IF_ERROR(tok.read_tokenizer_config(dir));
    return tok;
  }
  LTM_ASSIGN_OR_RETURN(Tokenizer tok, load_vocab_merges(dir));
  LTM_RETURN_IF_ERROR(tok.read_tokenizer_config(dir));
  return tok;
}

absl::StatusOr<Tokenizer> Tokenizer::load_vocab_merges(const std::string& dir) {
  const std::string vocab_path = dir + "/vocab.json";
  const std::string merges_path = dir + "/merges.txt";
  LTM_ASSIGN_OR_RETURN(std::string vocab_text, read_file(vocab_path));
  LTM_ASSIGN_OR_RETURN(std::string merges_text, read_file(merges_path));

  absl::StatusOr<nlohmann::json> parsed = parse_json(vocab_text);
  if (!parsed.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(vocab_path, ": invalid JSON: ", parsed.status().message()));
  const nlohmann::json& json = *parsed;
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(vocab_path, ": expected a JSON object mapping token strings to ids, got ",
                     json.type_name()));
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(json.size());
  for (const auto& [text, value] : json.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kMaxId) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": token ", quote_for_message(text), " has id ", json_brief(value),
                       ", expected an integer in [0, ", kMaxId, ")"));
    }
    vocab.emplace_back(text, value.get<int32_t>());
  }

  // merges.txt: an optional "#version..." first line, then one "LEFT RIGHT" pair per line in rank
  // order; blank lines are allowed only at the end.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<int> merge_lines;  // 1-based line number of each merge, for messages
  {
    std::vector<std::string_view> lines;
    std::string_view rest = merges_text;
    while (!rest.empty()) {
      const size_t eol = rest.find('\n');
      std::string_view line = rest.substr(0, eol);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      lines.push_back(line);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
    }
    while (!lines.empty() && lines.back().empty()) lines.pop_back();
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string_view line = lines[i];
      if (i == 0 && line.starts_with("#version")) continue;
      const size_t space = line.find(' ');
      if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            merges_path, ":", i + 1, ": expected two tokens separated by one space, got ",
            quote_for_message(line)));
      }
      merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
      merge_lines.push_back(static_cast<int>(i + 1));
    }
  }

  return build(vocab, merges, vocab_path,
               [&](size_t rank) { return absl::StrCat(merges_path, ":", merge_lines[rank]); },
               /*byte_level=*/true);
}

absl::StatusOr<Tokenizer> Tokenizer::from_tables(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, const std::string& source) {
  return build(vocab, merges, source,
               [&](size_t rank) { return absl::StrCat(source, ": merge #", rank); },
               /*byte_level=*/true);
}

absl::StatusOr<Tokenizer> Tokenizer::build(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, const std::string& source,
    const std::function<std::string(size_t rank)>& merge_location, bool byte_level) {
  Tokenizer tok;
  int32_t max_id = -1;
  for (const auto& [text, id] : vocab) {
    if (id < 0 || id >= kMaxId) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": token ", quote_for_message(text),
                                                     " has id ", id, ", out of range"));
    }
    max_id = std::max(max_id, id);
  }
  tok.id_to_bytes_.resize(static_cast<size_t>(max_id + 1));
  tok.id_present_.assign(static_cast<size_t>(max_id + 1), false);
  tok.text_to_id_.reserve(vocab.size());
  std::vector<const std::string*> id_text(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& [text, id] : vocab) {
    absl::StatusOr<std::string> bytes =
        byte_level ? spelling_to_bytes(text)
        : is_valid_utf8(text) ? absl::StatusOr<std::string>(text)
                              : absl::InvalidArgumentError("is not valid UTF-8");
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": token ", quote_for_message(text),
                                                     " (id ", id, ") ", bytes.status().message()));
    }
    if (bytes->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": empty token with id ", id));
    }
    if (tok.id_present_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": id ", id, " is used by both ",
                                                     quote_for_message(*id_text[id]), " and ",
                                                     quote_for_message(text)));
    }
    if (!tok.text_to_id_.emplace(text, id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": token ", quote_for_message(text), " appears twice"));
    }
    tok.id_present_[id] = true;
    id_text[id] = &text;
    tok.id_to_bytes_[id] = *std::move(bytes);
  }
  for (int b = 0; b < 256 && byte_level; ++b) {
    const std::string spelling = byte_spelling(static_cast<unsigned char>(b));
    auto it = tok.text_to_id_.find(spelling);
    if (it == tok.text_to_id_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: no token for byte 0x%02X (spelled \"%s\"); a byte-level BPE vocab needs all 256",
          source, b, spelling));
    }
    tok.byte_to_id_[b] = it->second;
  }

  tok.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const std::string where = absl::StrCat(merge_location(rank), ": ");
    auto l = tok.text_to_id_.find(left);
    if (l == tok.text_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "left part ", quote_for_message(left), " is not in the vocab"));
    }
    auto r = tok.text_to_id_.find(right);
    if (r == tok.text_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "right part ", quote_for_message(right), " is not in the vocab"));
    }
    auto m = tok.text_to_id_.find(left + right);
    if (m == tok.text_to_id_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "result ", quote_for_message(left + right), " of ", quote_for_message(left), " + ",
          quote_for_message(right), " is not in the vocab"));
    }
    // A repeated pair keeps its last rank, as the reference's dict(zip(merges, range(...))) does.
    tok.merges_[pair_key(l->second, r->second)] = Merge{static_cast<int32_t>(rank), m->second};
  }
  return tok;
}

const Tokenizer::Merge* Tokenizer::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

// BPE of one pre-token, with the reference's semantics: repeatedly take the adjacent pair of
// lowest rank and merge all its occurrences left to right, until no pair has a rank. A heap of
// (rank, position) candidates makes this O(n log n) for long words; one "round" pops every
// candidate of the lowest rank (in position order) before pushing the pairs its merges created,
// so that the order of merges is exactly the reference's even for unusual merge tables.
void Tokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  const auto* bytes = reinterpret_cast<const unsigned char*>(word.data());
  LTM_ASSERT(word.size() < (size_t{1} << 31), "pre-token of ", word.size(), " bytes");
  if (word.size() == 1) {
    out.push_back(byte_to_id_[bytes[0]]);
    return;
  }
  std::vector<int32_t>& units = thread_scratch().units;
  units.resize(word.size());
  for (size_t i = 0; i < word.size(); ++i) units[i] = byte_to_id_[bytes[i]];
  bpe_symbols(units, out);
}

void Tokenizer::bpe_symbols(std::span<const int32_t> syms, std::vector<int32_t>& out) const {
  LTM_ASSERT(syms.size() < (size_t{1} << 31), "pre-token of ", syms.size(), " symbols");
  const int32_t n = static_cast<int32_t>(syms.size());
  if (n <= 1) {
    if (n == 1) out.push_back(syms[0]);
    return;
  }
  Scratch& s = thread_scratch();
  std::vector<Symbol>& sym = s.symbols;
  std::vector<Candidate>& heap = s.heap;
  sym.resize(static_cast<size_t>(n));
  heap.clear();
  for (int32_t i = 0; i < n; ++i) sym[i] = {syms[i], i - 1, i + 1 < n ? i + 1 : -1};
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = find_merge(sym[i].id, sym[i + 1].id)) heap.push_back({m->rank, i});
  }
  std::make_heap(heap.begin(), heap.end());

  while (!heap.empty()) {
    const int32_t rank = heap.front().rank;
    s.round.clear();
    while (!heap.empty() && heap.front().rank == rank) {
      std::pop_heap(heap.begin(), heap.end());
      s.round.push_back(heap.back());
      heap.pop_back();
    }
    s.touched.clear();
    for (const Candidate& c : s.round) {
      Symbol& left = sym[c.pos];
      if (left.id < 0 || left.next < 0) continue;  // merged away meanwhile
      Symbol& right = sym[left.next];
      const Merge* m = find_merge(left.id, right.id);
      if (m == nullptr || m->rank != rank) continue;  // the pair changed since it was pushed
      left.id = m->result;
      left.next = right.next;
      if (right.next >= 0) sym[right.next].prev = c.pos;
      right.id = -1;
      s.touched.push_back(c.pos);
    }
    // New pairs: (previous, merged) and (merged, next). Pushed after the round, as the reference
    // only looks at them in its next iteration.
    for (const int32_t pos : s.touched) {
      if (sym[pos].id < 0) continue;  // merged into its left neighbour later in the round
      if (sym[pos].next >= 0) {
        if (const Merge* m = find_merge(sym[pos].id, sym[sym[pos].next].id)) {
          heap.push_back({m->rank, pos});
          std::push_heap(heap.begin(), heap.end());
        }
      }
      const int32_t prev = sym[pos].prev;
      if (prev >= 0) {
        if (const Merge* m = find_merge(sym[prev].id, sym[pos].id)) {
          heap.push_back({m->rank, prev});
          std::push_heap(heap.begin(), heap.end());
        }
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

std::vector<int32_t> Tokenizer::encode(std::string_view utf8, bool at_text_start) const {
  std::vector<int32_t> ids;
  if (utf8.empty()) return ids;
  if (pipeline_) {
    encode_with_pipeline(utf8, at_text_start, ids);
    trim_thread_scratch();
    return ids;
  }
  ids.reserve(utf8.size() / 3 + 4);
  std::vector<CodePoint>& cps = thread_scratch().cps;  // bpe() uses the other scratch vectors
  split_code_points(utf8, cps);
  const size_t n = cps.size() - 1;  // without the sentinel
  for (size_t i = 0; i < n;) {
    const size_t j = match_pre_token(cps, i, n);
    bpe(utf8.substr(cps[i].offset, cps[j].offset - cps[i].offset), ids);
    i = j;
  }
  trim_thread_scratch();
  return ids;
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view utf8) const {
  std::vector<int32_t> ids = prompt_prefix_;
  const std::vector<int32_t> body = encode(utf8);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), prompt_suffix_.begin(), prompt_suffix_.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  size_t size = 0;
  for (const int32_t id : ids) {
    LTM_ASSERT(valid_id(id), "token id ", id, " is not in the vocab (size ", vocab_size(), ")");
    size += id_to_bytes_[id].size();
  }
  std::string out;
  out.reserve(size);
  for (const int32_t id : ids) out += id_to_bytes_[id];
  size_t cut = 0;
  while (cut < decode_strip_start_ && cut < out.size() && out[cut] == ' ') ++cut;
  out.erase(0, cut);
  for (size_t k = 0; k < decode_strip_stop_ && !out.empty() && out.back() == ' '; ++k)
    out.pop_back();
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  LTM_ASSERT(valid_id(id), "token id ", id, " is not in the vocab (size ", vocab_size(), ")");
  return id_to_bytes_[id];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token_text) const {
  // Debian's abseil has its own string_view type.
  auto it = text_to_id_.find(absl::string_view(token_text.data(), token_text.size()));
  if (it == text_to_id_.end()) return std::nullopt;
  return it->second;
}

// ---- StreamingDecoder ---------------------------------------------------------------------------

std::string StreamingDecoder::push(int32_t id) {
  // An id the vocab has no token for (a model whose vocab_size is larger than vocab.json's, or a
  // gap in vocab.json's ids): what is held back, then the id itself, each one U+FFFD.
  if (!tokenizer_->valid_id(id)) return flush() + kReplacementChar;
  pending_ += tokenizer_->token_bytes(id);
  std::string out;
  out.reserve(pending_.size());
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const Utf8Step s = next_code_point(p + i, n - i);
    if (s.kind == Utf8Kind::kIncomplete) break;  // hold back until more bytes come
    if (s.kind == Utf8Kind::kOk) {
      out.append(pending_, i, s.len);
    } else {
      out += kReplacementChar;
    }
    i += s.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamingDecoder::flush() {
  // What is held back is one incomplete sequence: one replacement character.
  std::string out = pending_.empty() ? std::string() : std::string(kReplacementChar);
  pending_.clear();
  return out;
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step step = next_code_point(p + i, s.size() - i);
    if (step.kind != Utf8Kind::kOk) return false;
    i += step.len;
  }
  return true;
}

}  // namespace ltm
