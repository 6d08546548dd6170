// ltm-plan: capacity planner. For a model, a device kind, a weight dtype and a world size, prints
// what every tp x pp layout holds per rank (weights, KV cache per token, the batch x context that
// fits), the FLOPs and all-reduce bytes per token, the estimated decode and prefill time per token,
// and a recommended layout with the reason (runtime/model/capacity_plan.h has the model).
//
//   ltm-plan --model configs/gpt3-175b.json --device h100-sxm --world-size 16 --weight-dtype bf16
//   ltm-plan --model gpt3-6.7b --device cpu --world-size 2 --weight-dtype bf16 --json
//   ltm-plan --model DIR --memory-gb 48 --bandwidth-gbs 900 --tflops 90 --link-gbs 64 -n 4
//   ltm-plan --model models/kjv-small --device cpu --speculative draft --draft-model DRAFT_DIR
//   ltm-plan --list-devices
// Exit codes: 0 done; 2 bad command line, model or device.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <boost/program_options.hpp>

#include "absl/strings/str_cat.h"
#include "launcher/cli_parse.h"
#include "common/version.h"
#include "runtime/model/capacity_plan.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/model_config.h"
#include "runtime/model/step_input.h"
#include "runtime/spec/proposer.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "ltm-plan: %s\n", message.c_str());
  return 2;
}

// A checkpoint folder (its config.json), a config file, or the name of one in configs/.
absl::StatusOr<ltm::ModelConfig> load_model(const std::string& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(model, ec)) return ltm::load_model_config((fs::path(model) / "config.json").string());
  if (fs::is_regular_file(model, ec)) return ltm::load_model_config(model);
  const fs::path bundled = fs::path(LTM_SOURCE_DIR) / "configs" / (model + ".json");
  if (model.find('/') == std::string::npos && fs::is_regular_file(bundled, ec))
    return ltm::load_model_config(bundled.string());
  return absl::NotFoundError(absl::StrCat("--model ", model,
                                          ": no such folder, config file or configs/ name"));
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string model, device, weight_dtype = "f32", kv_dtype, speculative = "off", draft_model,
      draft_device;
  int world = 1, batch = 32, devices_per_node = 0, max_running = 64,
      spec_max_batch = ltm::SpecOptions::kDraftMaxBatch,
      spec_tokens = 5;
  double gpu_memory_fraction = 0.9;
  int64_t context = 0, prefill_chunk = 512, kv_memory_mb = 0;
  int32_t block_size = 16;
  double memory_gb = 0, bandwidth_gbs = 0, tflops = 0, tflops16 = 0, link_gbs = 0,
         link_latency_us = -1, network_gbs = 0, network_latency_us = -1, overhead_mb = -1;
  bool json = false, one_shot = false, list = false, kv_resident = false;
  po::options_description desc(
      "usage: ltm-plan --model MODEL (--device KIND | --memory-gb ... ) [--world-size N] [options]\n\n"
      "ltm-plan options");
  desc.add_options()
      ("model", po::value(&model), "checkpoint folder, config .json, or a name in configs/ (gpt3-175b)")
      ("device", po::value(&device), "cpu | a100-80gb | h100-sxm | h200 (--list-devices); the figure flags below override its figures")
      ("world-size,n", po::value(&world)->default_value(1), "ranks (tp x pp)")
      ("weight-dtype", po::value(&weight_dtype)->default_value("f32"), "f32 | bf16 | fp16 | int8")
      ("kv-dtype", po::value(&kv_dtype), "f32 | bf16 | fp16 (default: f32 with f32 weights, bf16 with bf16 weights on a GPU, else fp16, as ltm-worker)")
      ("context", po::value(&context)->default_value(0), "tokens of context per sequence (0: the model's)")
      ("batch", po::value(&batch)->default_value(32), "sequences decoded together for the throughput estimate and the recommendation")
      ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per prefill step (--max-batch-tokens)")
      ("kv-memory-mb", po::value(&kv_memory_mb)->default_value(0), "ltm-worker's --kv-memory-mb (0: its default)")
      ("block-size", po::value(&block_size)->default_value(16), "ltm-worker's --block-size")
      ("gpu-memory-fraction", po::value(&gpu_memory_fraction)->default_value(0.9), "ltm-worker's --gpu-memory-fraction (a GPU's default KV budget)")
      ("max-running", po::value(&max_running)->default_value(64), "ltm-worker's --max-running (a GPU's activations)")
      ("speculative", po::value(&speculative)->default_value("off"), "ltm-worker's --speculative: off | ngram | draft (draft: rank 0 also holds --draft-model, counted in its memory)")
      ("draft-model", po::value(&draft_model), "ltm-worker's --draft-model (with --speculative draft): its folder or config .json")
      ("draft-device", po::value(&draft_device), "ltm-worker's --draft-device: cpu (the default) or device (on a GPU the draft then counts against rank 0's GPU memory, reserved before the KV cache)")
      ("spec-max-batch", po::value(&spec_max_batch)->default_value(ltm::SpecOptions::kDraftMaxBatch), "ltm-worker's --spec-max-batch (the draft keeps a context of KV for this many sequences + 1)")
      ("spec-tokens", po::value(&spec_tokens)->default_value(5), "ltm-worker's --spec-tokens (accepted; does not change memory)")
      ("kv-resident", po::bool_switch(&kv_resident), "ltm-worker's --kv-resident: the CPU KV cache resident from start-up (counted in the start-up figure)")
      ("one-shot", po::bool_switch(&one_shot), "size the KV cache as the one-shot command does (default: as a server)")
      ("memory-gb", po::value(&memory_gb), "device memory, GB (10^9 bytes)")
      ("bandwidth-gbs", po::value(&bandwidth_gbs), "memory read bandwidth, GB/s")
      ("tflops", po::value(&tflops), "GEMM rate with f32 weights, TFLOP/s")
      ("tflops16", po::value(&tflops16), "GEMM rate with 16-bit weights, TFLOP/s (default: --tflops)")
      ("link-gbs", po::value(&link_gbs), "link bandwidth between devices of a node, GB/s per direction")
      ("link-latency-us", po::value(&link_latency_us), "latency of one collective on that link, us")
      ("network-gbs", po::value(&network_gbs), "bandwidth between nodes per device, GB/s (default: --link-gbs)")
      ("network-latency-us", po::value(&network_latency_us), "latency between nodes, us (default: --link-latency-us)")
      ("devices-per-node", po::value(&devices_per_node), "devices sharing a node's fast link (default: the device's, 8 for GPUs)")
      ("overhead-mb", po::value(&overhead_mb), "per-rank memory besides weights and KV cache, MiB")
      ("json", po::bool_switch(&json), "print one JSON object")
      ("list-devices", po::bool_switch(&list), "print the built-in device table with its sources")
      ("help,h", "this help")
      ("version", "print the version and exit");
  po::variables_map vm;
  try {
    if (ltm::parse_cli(argc, argv, desc, "", "ltm-plan", &vm) == ltm::CliStart::kDone)
      return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ltm-plan: %s\n\n", e.what());
    std::cerr << desc;
    return 2;
  }
  if (list) {
    for (const ltm::DeviceSpec& d : ltm::builtin_devices())
      std::printf("%-10s %6.1f GB, %6.0f GB/s, f32 %.3g FLOP/s, 16-bit %.3g FLOP/s, link %.0f GB/s, "
                  "network %.0f GB/s\n           source: %s\n",
                  d.name.c_str(), d.memory_bytes / 1e9, d.memory_bandwidth / 1e9, d.flops_f32,
                  d.flops_16, d.link_bandwidth / 1e9, d.network_bandwidth / 1e9, d.source.c_str());
    return 0;
  }
  if (model.empty()) return fail("--model is required");

  ltm::PlanInput in;
  auto config = load_model(model);
  if (!config.ok()) return fail(std::string(config.status().message()));
  in.config = *config;
  if (!device.empty()) {
    auto d = ltm::find_device(device);
    if (!d) {
      std::string names;
      for (const ltm::DeviceSpec& s : ltm::builtin_devices()) absl::StrAppend(&names, " ", s.name);
      return fail(absl::StrCat("--device '", device, "' is not in the table (", names.substr(1),
                               "); give its figures with --memory-gb, --bandwidth-gbs, --tflops and --link-gbs"));
    }
    in.device = *d;
  } else {
    in.device.name = "custom";
    in.device.source = "command-line flags";
    in.device.usable_fraction = 0.95;
    in.device.link_latency_s = 10e-6;
  }
  ltm::DeviceSpec& dev = in.device;
  if (vm.count("memory-gb")) dev.memory_bytes = static_cast<int64_t>(memory_gb * 1e9);
  if (vm.count("bandwidth-gbs")) dev.memory_bandwidth = bandwidth_gbs * 1e9;
  if (vm.count("tflops")) {
    dev.flops_f32 = tflops * 1e12;
    if (!vm.count("tflops16") && device.empty()) dev.flops_16 = dev.flops_f32;
  }
  if (vm.count("tflops16")) dev.flops_16 = tflops16 * 1e12;
  if (vm.count("link-gbs")) dev.link_bandwidth = link_gbs * 1e9;
  if (vm.count("link-latency-us")) dev.link_latency_s = link_latency_us * 1e-6;
  if (vm.count("network-gbs")) dev.network_bandwidth = network_gbs * 1e9;
  else if (device.empty()) dev.network_bandwidth = dev.link_bandwidth;
  if (vm.count("network-latency-us")) dev.network_latency_s = network_latency_us * 1e-6;
  else if (device.empty()) dev.network_latency_s = dev.link_latency_s;
  if (vm.count("devices-per-node")) dev.devices_per_node = devices_per_node;
  if (vm.count("overhead-mb")) dev.overhead_bytes = static_cast<int64_t>(overhead_mb * 1048576);
  if (dev.devices_per_node < 1) return fail("--devices-per-node must be >= 1");
  if (dev.link_latency_s < 0 || dev.network_latency_s < 0 || dev.overhead_bytes < 0)
    return fail("latencies and --overhead-mb must be >= 0");

  if (!ltm::parse_precision(weight_dtype, &in.weights))
    return fail(absl::StrCat("--weight-dtype '", weight_dtype, "' (f32, bf16, fp16 or int8)"));
  if (kv_dtype.empty()) {  // as ltm-worker: a GPU kind computes in the weights' 16 bits
    const bool gpu = !device.empty() && device != "cpu";
    in.kv = ltm::default_kv_precision(
        in.weights, gpu ? ltm::device_activation_precision(in.weights) : ltm::Precision::kF32);
  } else if (!ltm::parse_precision(kv_dtype, &in.kv) || in.kv == ltm::Precision::kInt8) {
    return fail(absl::StrCat("--kv-dtype '", kv_dtype, "' (f32, bf16 or fp16)"));
  }
  in.world_size = world;
  in.context = context;
  in.batch = batch;
  in.prefill_chunk = prefill_chunk;
  in.kv_memory_mb = kv_memory_mb;
  in.block_size = block_size;
  in.serving = !one_shot;
  in.kv_resident = kv_resident;
  in.gpu_memory_fraction = gpu_memory_fraction;
  in.max_running = max_running;
  if (kv_memory_mb < 0) return fail("--kv-memory-mb must be >= 0");
  if (!(gpu_memory_fraction > 0 && gpu_memory_fraction <= 1))
    return fail("--gpu-memory-fraction must be in (0, 1]");
  if (max_running < 1) return fail("--max-running must be >= 1");
  if (speculative != "off" && speculative != "ngram" && speculative != "draft")
    return fail(absl::StrCat("--speculative must be off, ngram or draft, not '", speculative, "'"));
  if (speculative == "draft" && draft_model.empty())
    return fail("--speculative draft needs --draft-model DIR (as ltm-worker)");
  if (speculative != "draft" && !draft_model.empty())
    return fail(absl::StrCat("--draft-model is used by --speculative draft only (this is --speculative ",
                             speculative, ")"));
  if (!draft_device.empty() && draft_device != "cpu" && draft_device != "device")
    return fail(absl::StrCat("--draft-device must be cpu or device, not '", draft_device, "'"));
  if (!draft_device.empty() && speculative != "draft")
    return fail("--draft-device is used by --speculative draft only (as ltm-worker)");
  if (spec_max_batch < 1) return fail("--spec-max-batch must be >= 1");
  if (spec_tokens < 1 || spec_tokens > ltm::kMaxSpecTokens)  // as ltm-worker
    return fail(absl::StrCat("--spec-tokens must be in [1, ", ltm::kMaxSpecTokens, "]"));
  if (speculative == "draft") {
    std::error_code ec;
    if (!std::filesystem::is_directory(draft_model, ec) &&
        !std::filesystem::is_regular_file(draft_model, ec))
      return fail(absl::StrCat("--draft-model ", draft_model, ": no such folder or config file"));
    auto dc = load_model(draft_model);
    if (!dc.ok()) return fail(absl::StrCat("--draft-model ", draft_model, ": ", dc.status().message()));
    auto dw = ltm::draft_weight_precision(draft_model, *dc);
    if (!dw.ok()) return fail(std::string(dw.status().message()));
    in.draft = true;
    in.draft_config = *dc;
    in.draft_weights = *dw;
    in.draft_on_device = draft_device == "device";
    in.spec_max_batch = spec_max_batch;
  }
  auto plan = ltm::make_plan(in);
  if (!plan.ok()) return fail(std::string(plan.status().message()));
  if (json) {
    std::printf("%s\n", ltm::plan_json(*plan).c_str());
  } else {
    std::printf("%s", ltm::plan_text(*plan).c_str());
  }
  return 0;
}
