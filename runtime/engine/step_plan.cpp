#include "runtime/engine/step_plan.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ltm {
namespace {

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void put_vec(const std::vector<int32_t>& v) {
    put<int32_t>(static_cast<int32_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  }
  void put_str(const std::string& v) {
    put<int32_t>(static_cast<int32_t>(v.size()));
    out_.append(v);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T>
  bool get(T* v) {
    if (pos_ + sizeof(T) > s_.size()) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_vec(std::vector<int32_t>* v) {
    int32_t n = 0;
    if (!get(&n) || n < 0 || pos_ + static_cast<size_t>(n) * 4 > s_.size()) return false;
    v->resize(n);
    // An empty vector's data() may be null, and memcpy from or to null is undefined even for 0
    // bytes (found by fuzz/step_plan_fuzz.cpp on a Shutdown plan).
    if (n > 0) std::memcpy(v->data(), s_.data() + pos_, static_cast<size_t>(n) * 4);
    pos_ += static_cast<size_t>(n) * 4;
    return true;
  }
  bool get_str(std::string* v) {
    int32_t n = 0;
    if (!get(&n) || n < 0 || pos_ + static_cast<size_t>(n) > s_.size()) return false;
    v->assign(s_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }
  bool done() const { return pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

// "LTM4" (LTM3 had no target/top_n, LTM2 no want_logprob, LTM1 no adapters)
constexpr uint32_t kMagic = 0x4c544d34;

}  // namespace

std::string encode_plan(const StepPlan& p) {
  Writer w;
  w.put(kMagic);
  w.put(static_cast<int32_t>(p.kind));
  w.put<int32_t>(p.want_logits ? 1 : 0);
  const StepInput& in = p.input;
  w.put_vec(in.token_ids);
  w.put_vec(in.positions);
  w.put_vec(in.slot_mapping);
  w.put_vec(in.token_offsets);
  w.put_vec(in.context_lens);
  w.put_vec(in.block_tables);
  w.put(in.max_blocks_per_seq);
  w.put_vec(in.logit_rows);
  w.put_vec(in.adapter_ids);
  w.put(p.adapter_id);
  w.put(p.adapter_max_rank);
  w.put_str(p.adapter_dir);
  w.put<int32_t>(static_cast<int32_t>(p.sampling.size()));
  for (const RowSampling& s : p.sampling) {
    w.put(s.params.temperature);
    w.put(s.params.top_k);
    w.put(s.params.top_p);
    w.put(s.params.repetition_penalty);
    w.put(s.params.seed);
    w.put(s.token_index);
    w.put_vec(s.history);
    w.put<int32_t>(s.want_logprob ? 1 : 0);
    w.put(s.target);
    w.put(s.top_n);
  }
  return w.take();
}

absl::StatusOr<StepPlan> decode_plan(const std::string& bytes) {
  Reader r(bytes);
  StepPlan p;
  uint32_t magic = 0;
  int32_t kind = 0, want = 0, n_sampling = 0;
  StepInput& in = p.input;
  bool ok = r.get(&magic) && magic == kMagic && r.get(&kind) && r.get(&want) &&
            r.get_vec(&in.token_ids) && r.get_vec(&in.positions) && r.get_vec(&in.slot_mapping) &&
            r.get_vec(&in.token_offsets) && r.get_vec(&in.context_lens) &&
            r.get_vec(&in.block_tables) && r.get(&in.max_blocks_per_seq) &&
            r.get_vec(&in.logit_rows) && r.get_vec(&in.adapter_ids) && r.get(&p.adapter_id) &&
            r.get(&p.adapter_max_rank) && r.get_str(&p.adapter_dir) && r.get(&n_sampling) &&
            n_sampling >= 0;
  for (int32_t i = 0; ok && i < n_sampling; ++i) {
    RowSampling s;
    int32_t want_logprob = 0;
    ok = r.get(&s.params.temperature) && r.get(&s.params.top_k) && r.get(&s.params.top_p) &&
         r.get(&s.params.repetition_penalty) && r.get(&s.params.seed) && r.get(&s.token_index) &&
         r.get_vec(&s.history) && r.get(&want_logprob) && (want_logprob == 0 || want_logprob == 1) &&
         r.get(&s.target) && s.target >= -1 && r.get(&s.top_n) && s.top_n >= -1 &&
         s.top_n <= kMaxTopLogprobs;
    s.want_logprob = want_logprob != 0;
    p.sampling.push_back(std::move(s));
  }
  ok = ok && kind >= static_cast<int32_t>(PlanKind::kStep) &&
       kind <= static_cast<int32_t>(PlanKind::kUnloadAdapter);
  if (!ok || !r.done())
    return absl::DataLossError(absl::StrCat("malformed step plan (", bytes.size(), " bytes)"));
  p.kind = static_cast<PlanKind>(kind);
  p.want_logits = want != 0;
  return p;
}

}  // namespace ltm
