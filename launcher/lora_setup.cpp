#include "launcher/lora_setup.h"

#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "runtime/model/lora.h"

namespace ltm {

std::vector<LoraSpec> lora_specs(const WorkerOptions& o) {
  std::vector<LoraSpec> out;
  for (const std::string& s : o.lora) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos) continue;
    out.push_back({s.substr(0, eq), s.substr(eq + 1)});
  }
  return out;
}

std::string check_lora_options(const WorkerOptions& o) {
  std::set<std::string> names;
  for (const std::string& s : o.lora) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      return absl::StrCat("--lora '", s, "': expected NAME=DIR (a PEFT adapter folder)");
    const std::string name = s.substr(0, eq);
    if (name.size() > kMaxAdapterNameBytes)
      return absl::StrCat("--lora '", s, "': the name is over ", kMaxAdapterNameBytes, " bytes");
    if (!names.insert(name).second) return absl::StrCat("--lora: the name '", name, "' is given twice");
  }
  if (o.lora_max_rank < 1 || o.lora_max_rank > kMaxLoraRank)
    return absl::StrCat("--lora-max-rank must be in [1, ", kMaxLoraRank, "]");
  if (o.lora_max_adapters < 1) return "--lora-max-adapters must be at least 1";
  if (o.lora_merge && o.lora.size() != 1)
    return "--lora-merge folds exactly one adapter into the weights: give one --lora NAME=DIR";
  if (!o.lora_merge && static_cast<int32_t>(o.lora.size()) > o.lora_max_adapters)
    return absl::StrCat(o.lora.size(), " --lora adapters are more than --lora-max-adapters (",
                        o.lora_max_adapters, ")");
  if (!o.adapter.empty()) {
    if (!o.listen.empty()) return "--adapter is for one-shot generation; a server's requests name their adapter";
    if (o.lora_merge) return "--adapter: with --lora-merge the adapter is in the weights already";
    if (!names.count(o.adapter))
      return absl::StrCat("--adapter '", o.adapter, "' is not one of the --lora adapters");
  }
  if (!o.lora_dir.empty() && o.listen.empty()) return "--lora-dir is for serving (--listen)";
  return "";
}

absl::Status load_startup_adapters(const WorkerOptions& o, Scheduler& scheduler) {
  if (o.lora_merge) return absl::OkStatus();
  for (const LoraSpec& spec : lora_specs(o)) {
    LTM_RETURN_IF_ERROR(scheduler.load_adapter(spec.name, spec.dir));
    if (!o.listen.empty() || o.verbose)
      std::fprintf(stderr, "ltm-worker: LoRA adapter %s loaded from %s\n", spec.name.c_str(),
                   spec.dir.c_str());
  }
  return absl::OkStatus();
}

void add_lora_info(const WorkerOptions& o, const RankSetup& rs, Scheduler& scheduler,
                   EngineInfo& info) {
  if (rs.merged_lora) {
    const LoraSpec spec = lora_specs(o).front();
    AdapterStatus merged;
    merged.name = spec.name;
    merged.dir = spec.dir;
    merged.rank = rs.merged_lora->rank;
    merged.alpha = rs.merged_lora->alpha;
    merged.target_modules = rs.merged_lora->modules;
    scheduler.set_merged_adapter(merged);
  }
  info.adapters = [&scheduler] { return scheduler.adapters(); };
  if (!o.lora_merge) {
    info.adapter_op = [&scheduler](AdapterOp op) { scheduler.submit_adapter_op(std::move(op)); };
    info.lora_dir = o.lora_dir;
  }
}

}  // namespace ltm
