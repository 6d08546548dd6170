// The step-plan decoder (runtime/engine/step_plan.h) on arbitrary bytes: decode_plan answers
// DataLoss or a plan, and a plan it accepts encodes back to bytes that decode to the same plan.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/engine/step_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ltm::StepPlan> plan = ltm::decode_plan(bytes);
  if (!plan.ok()) return 0;
  const std::string again = ltm::encode_plan(*plan);
  absl::StatusOr<ltm::StepPlan> round = ltm::decode_plan(again);
  if (!round.ok()) std::abort();
  if (ltm::encode_plan(*round) != again) std::abort();
  return 0;
}
