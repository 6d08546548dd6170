// A verify step's rows have the bits of plain decoding (CPU backend, the whole model): greedy
// speculative decoding keeps a drafted token only where the target's logits, computed in one step
// beside the sequence's other drafts and other sequences' rows, pick it, so those logits must be
// the ones a one-row decode step computes for the same token, bit for bit; a difference in the
// last place flips a near tie (the int8 kernels' activation rounding turns such a difference into
// a larger one). The packed and int8 GEMMs promise it row by row (packed_gemm_test,
// int8_gemm_test, ARowHasTheSameBitsAtEveryRowCount); this checks the model around them too:
// attention over the paged cache, the norms, and a LoRA adapter's low-rank update, which must not
// take another path for one row than for several.
//
// Two copies of the margin checkpoint (greedy_run.h) with their own caches: on the first, two
// sequences prefill, then decode `drafts` + 1 tokens one row at a time; on the second they
// prefill the same, then feed `drafts` of those tokens in one step of both sequences' rows,
// every row's logits asked for (the model then marks the rows as verify rows: upload_step).
// Every weight type, with the adapter and without; 5 drafts (the default --spec-tokens), 16
// (from which a prefill chunk's attention takes its matrix form) and 64 (the most).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "runtime/backend/cpu_backend.h"
#include "runtime/model/lora.h"
#include "tests/model/greedy_run.h"

namespace ltm {
namespace {

// One step in which each sequence feeds its next n[i] tokens; the logits of every row fed.
std::vector<std::vector<float>> step_rows(greedy::ModelRun& run,
                                          const std::vector<greedy::GreedySeq*>& seqs,
                                          const std::vector<int32_t>& n) {
  return greedy::run_step(*run.model, *run.backend, *run.cache, seqs, n, true);
}

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

struct Pair {
  greedy::GreedySeq a, b;
  explicit Pair(int32_t adapter) {
    a.tokens = {17, 31, 45, 9, 50, 77, 3, 28, 64, 11, 90};
    b.tokens = {5, 6, 7, 8, 60, 61, 62, 13, 14, 15, 16, 20, 21};
    a.blocks = {10, 0, 2, 4, 8, 6};  // scattered, interleaved; room for 96 tokens
    b.blocks = {1, 5, 3, 7, 11, 9};
    a.adapter = b.adapter = adapter;
  }
};

// One weight type and adapter on the ISA path in force; how many verify rows differed.
int differing_rows(Precision p, bool with_adapter, int drafts) {
  const ModelConfig c = greedy::margin_config(4);
  greedy::ModelRun plain(make_cpu_backend(2), c, p), verify(make_cpu_backend(2), c, p);
  int32_t adapter = 0;
  if (with_adapter) {
    const std::string dir = greedy::write_adapter(c, 8);
    EXPECT_FALSE(dir.empty());
    absl::StatusOr<LoraAdapter> lora = LoraAdapter::open(dir, c, 16);
    std::filesystem::remove_all(dir);
    EXPECT_TRUE(lora.ok()) << lora.status();
    if (!lora.ok()) return -1;
    EXPECT_TRUE(plain.model->add_adapter(1, *lora).ok());
    EXPECT_TRUE(verify.model->add_adapter(1, *lora).ok());
    adapter = 1;
  }
  // Plain decoding: each sequence's prompt, then `drafts` + 1 one-row steps, greedy.
  Pair x(adapter);
  std::vector<std::vector<float>> want_a, want_b, first;
  for (auto [s, want] : {std::pair{&x.a, &want_a}, std::pair{&x.b, &want_b}}) {
    const int32_t prompt = static_cast<int32_t>(s->tokens.size());
    std::vector<std::vector<float>> rows = step_rows(plain, {s}, {prompt});
    s->tokens.push_back(argmax(rows.back()));
    first.push_back(std::move(rows.back()));
    for (int i = 0; i < drafts; ++i) {
      rows = step_rows(plain, {s}, {1});
      s->tokens.push_back(argmax(rows.back()));
      want->push_back(std::move(rows.back()));
    }
  }
  // The same prompts, then both sequences' `drafts` tokens in one step (the verify step of drafts
  // that are all right): row i of a sequence is the one-row step i + 1's.
  Pair y(adapter);
  for (greedy::GreedySeq* s : {&y.a, &y.b})
    step_rows(verify, {s}, {static_cast<int32_t>(s->tokens.size())});
  y.a.tokens = x.a.tokens;
  y.b.tokens = x.b.tokens;
  const std::vector<std::vector<float>> got = step_rows(verify, {&y.a, &y.b}, {drafts, drafts});
  EXPECT_EQ(got.size(), 2u * drafts);
  int differ = 0;
  for (int i = 0; i < 2 * drafts && i < static_cast<int>(got.size()); ++i) {
    const std::vector<float>& want = i < drafts ? want_a[i] : want_b[i - drafts];
    differ += std::memcmp(want.data(), got[i].data(), want.size() * sizeof(float)) != 0;
  }
  if (with_adapter) {  // the adapter is really applied: a's prompt without it gives other logits
    greedy::GreedySeq z;
    z.tokens = Pair(0).a.tokens;
    z.blocks = {12, 13};
    const std::vector<std::vector<float>> rows =
        step_rows(verify, {&z}, {static_cast<int32_t>(z.tokens.size())});
    EXPECT_NE(0, std::memcmp(first[0].data(), rows.back().data(), first[0].size() * sizeof(float)))
        << "the adapter changed nothing";
  }
  return differ;
}

class VerifyRows : public ::testing::TestWithParam<std::tuple<Precision, bool, int>> {};

// On the AVX-512 and AVX2 paths where the CPU has them (the portable path's GEMMs do not promise
// the property; packed_gemm_test). bf16 weights with 16 rows or more in a step run with AMX and
// AVX512-BF16 off: with them, such a step rounds its activations to bf16 by design (cpu_isa.h,
// set_amx), so its rows are not one-row steps' (docs/architecture.md, "Speculative decoding").
TEST_P(VerifyRows, HaveTheBitsOfOneRowDecodeSteps) {
  const auto [p, with_adapter, drafts] = GetParam();
  const kernels::cpu::Isa saved = kernels::cpu::isa();
  int paths = 0;
  const bool rounding = p == Precision::kBF16 && 2 * drafts >= 16;
  if (rounding) kernels::cpu::set_amx(false);
  for (kernels::cpu::Isa i : kernels::cpu::supported_isas()) {
    if (i == kernels::cpu::Isa::kPortable) continue;
    ASSERT_TRUE(kernels::cpu::set_isa(i));
    const int differ = differing_rows(p, with_adapter, drafts);
    std::printf("%s path, %s weights, %s, %d drafts: %d of %d verify rows differ from one-row "
                "decoding\n",
                kernels::cpu::isa_name(i), precision_name(p),
                with_adapter ? "LoRA rank 8" : "no adapter", drafts, differ, 2 * drafts);
    EXPECT_EQ(differ, 0) << kernels::cpu::isa_name(i) << " path: verify rows whose logits are not "
                         << "the one-row steps'";
    ++paths;
  }
  kernels::cpu::set_isa(saved);
  if (rounding) kernels::cpu::set_amx(true);
  if (paths == 0) GTEST_SKIP() << "no vector path on this CPU";
}

INSTANTIATE_TEST_SUITE_P(EveryWeightType, VerifyRows,
                         ::testing::Combine(::testing::Values(Precision::kF32, Precision::kBF16,
                                                              Precision::kF16, Precision::kInt8),
                                            ::testing::Bool(), ::testing::Values(5, 16, 64)));

}  // namespace
}  // namespace ltm
