// LoRA adapters at start-up: checking the --lora flags, folding a --lora-merge adapter into the
// weights (model_setup.cpp), loading the others through the scheduler so that every rank holds
// them (Scheduler::load_adapter), and the scheduler's side of the adapter RPCs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/model_setup.h"
#include "launcher/worker_options.h"
#include "runtime/sched/engine_info.h"
#include "runtime/sched/scheduler.h"

namespace ltm {

struct LoraSpec {
  std::string name;
  std::string dir;
};

// "" when the LoRA flags make sense together, else the message for the usage error.
std::string check_lora_options(const WorkerOptions& o);
// The --lora NAME=DIR flags, parsed (check_lora_options has accepted them).
std::vector<LoraSpec> lora_specs(const WorkerOptions& o);
// Rank 0, step thread, before serving: the --lora adapters (unless merged), on every rank.
absl::Status load_startup_adapters(const WorkerOptions& o, Scheduler& scheduler);
// Serving: what GetModelInfo and the adapter RPCs reach (the merged adapter, the resident ones,
// the scheduler's adapter ops, --lora-dir). With --lora-merge no adapter can be loaded.
void add_lora_info(const WorkerOptions& o, const RankSetup& rs, Scheduler& scheduler,
                   EngineInfo& info);

}  // namespace ltm
