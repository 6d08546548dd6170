#include "launcher/worker_options.h"

#include <filesystem>

#include "launcher/lora_setup.h"
#include "runtime/backend/backend.h"
#include "runtime/model/step_input.h"
#include "runtime/spec/proposer.h"

#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/version.h"

#include <boost/program_options.hpp>
#include "launcher/cli_parse.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ltm {
namespace po = boost::program_options;

namespace {

po::options_description describe(WorkerOptions* o) {
  po::options_description model("Model");
  model.add_options()
      ("model", po::value(&o->model), "HF GPT-2 folder (config.json, safetensors, tokenizer.json or vocab.json + merges.txt), or a config .json for random weights (GPT-3 shapes in configs/)")
      ("init", po::value(&o->init), "checkpoint | random: random weights of the model's shape even for a checkpoint folder (default: a folder's weights, random for a config .json)")
      ("init-seed", po::value(&o->init_seed)->default_value(1), "seed of random weights (config-only model)")
      ("init-std", po::value(&o->init_std)->default_value(0.02f), "std of random weights")
      ("tokenizer", po::value(&o->tokenizer), "folder with tokenizer.json, or vocab.json + merges.txt (default: the model folder)")
      ("chat-template", po::value(&o->chat_template), "Jinja chat template FILE for chat requests (default: chat_template of the tokenizer folder's tokenizer_config.json)");
  po::options_description gen("One-shot generation");
  gen.add_options()
      ("prompt", po::value<std::string>(), "prompt text")
      ("prompt-ids", po::value<std::string>(), "prompt token ids, comma-separated")
      ("max-new-tokens", po::value(&o->max_new_tokens)->default_value(32), "tokens to generate")
      ("temperature", po::value(&o->temperature)->default_value(0.0f), "0 = greedy")
      ("top-k", po::value(&o->top_k)->default_value(0), "0 = off")
      ("top-p", po::value(&o->top_p)->default_value(1.0f), "nucleus sampling, (0, 1]")
      ("repetition-penalty", po::value(&o->repetition_penalty)->default_value(1.0f), "HF-style, 1 = off")
      ("seed", po::value(&o->seed)->default_value(0), "sampling seed")
      ("stop", po::value(&o->stop)->composing(), "stop string (repeatable)")
      ("ignore-eos", po::bool_switch(&o->ignore_eos), "do not stop at the end-of-text token")
      ("output", po::value(&o->output)->default_value("text"), "text | json")
      ("dump-logits", po::value(&o->dump_logits), "write float32 .npy [generated, vocab]: the logits each new token was chosen from")
      ("dump-prompt-logits", po::value(&o->dump_prompt_logits), "write float32 .npy [prompt, vocab]: the logits at every prompt position")
      ("perplexity", po::value(&o->perplexity), "print the perplexity of the model on this text file (non-overlapping windows; launcher/perplexity.h) instead of generating")
      ("perplexity-window", po::value(&o->perplexity_window)->default_value(0), "tokens per --perplexity window (0: the model's context)");
  po::options_description run("Layout and resources");
  run.add_options()
      ("tp", po::value(&o->tp)->default_value(1), "tensor-parallel ranks per stage")
      ("pp", po::value(&o->pp)->default_value(1), "pipeline stages")
      ("threads", po::value(&o->threads)->default_value(0), "CPU threads per rank (0: cores / ranks on this host)")
      ("device", po::value(&o->device)->default_value("cpu"), "cpu | cuda")
      ("collective-timeout", po::value(&o->collective_timeout_s)->default_value(300.0), "seconds before a stuck collective takes the group down")
      ("block-size", po::value(&o->block_size)->default_value(16), "tokens per KV cache block")
      ("kv-memory-mb", po::value(&o->kv_memory_mb)->default_value(0), "KV cache budget per rank in MiB (0: one-shot fits the request; server: 1024 on the CPU, on a GPU --gpu-memory-fraction of what weights, activations and graphs leave)")
      ("kv-resident", po::bool_switch(&o->kv_resident), "CPU: make the whole KV cache resident at start-up (its pages faulted in, 2 MiB at a time) instead of as sequences first fill it: a host without the memory for it is refused at start-up with the numbers, not found out when the cache fills, and a fresh server's first requests take no page faults (ltm-plan --kv-resident counts it at start-up). No effect on a GPU, whose cache is device memory")
      ("gpu-memory-fraction", po::value(&o->gpu_memory_fraction)->default_value(0.9), "serving on a GPU with no --kv-memory-mb: the share of the device memory left after weights, activations and CUDA graphs that the KV cache takes")
      ("max-batch-tokens", po::value(&o->max_batch_tokens)->default_value(512), "new tokens per step (prefill chunk budget)")
      ("max-running", po::value(&o->max_running)->default_value(64), "sequences decoded together")
      ("micro-batches", po::value(&o->micro_batches)->default_value(0), "step plans in flight at once (0: --pp, so every pipeline stage has work)")
      ("prefix-cache", po::value(&o->prefix_cache)->default_value("on"), "on | off: keep finished requests' full KV blocks and reuse them for prompts that start the same")
      ("speculative", po::value(&o->speculative)->default_value("off"), "off | ngram | draft: speculative decoding; ngram (prompt lookup) guesses a decoding sequence's next tokens from its own prompt and output and the model verifies them in one step (same tokens as off, faster where the text repeats); draft: a small draft model (--draft-model)")
      ("spec-tokens", po::value(&o->spec_tokens)->default_value(5), "speculative decoding: drafts per sequence and step, at most (fewer while they are rejected)")
      ("spec-max-batch", po::value(&o->spec_max_batch)->default_value(0), "speculative decoding: only while at most this many sequences run; 0: by mode, every batch with ngram (the measured cost of a draft row stops it where it would lose), 4 with draft (whose KV cache holds that many + 1)")
      ("spec-token-cost", po::value(&o->spec_token_cost)->default_value(0.0), "speculative decoding: what a draft row costs against a decode step, for the draft length; 0: measured from the server's own decode steps")
      ("draft-model", po::value(&o->draft_model), "--speculative draft: the draft model, an HF folder (or a config .json: random weights) with the target's tokenizer; rank 0 runs it on its CPU (or --draft-device device); it proposes greedily at temperature 0 and samples its proposals at temperature > 0 (verified by the rejection-sampling rule)")
      ("draft-device", po::value(&o->draft_device), "--speculative draft: where rank 0 runs the draft model: cpu (its host cores; the default) or device (the target's --device: with --device cuda rank 0's GPU; its weights, KV cache and activations are then reserved on that GPU before the target's KV cache is sized)")
      ("cuda-graphs", po::value(&o->cuda_graphs), "on | off: decode steps replayed as CUDA graphs captured per padded batch size (default: on with --device cuda; the CPU has none)")
      ("weight-dtype", po::value(&o->weight_dtype), "f32 | bf16 | fp16 | int8: how weight matrices are held (default: the checkpoint's dtype; f32 for a config). int8: symmetric, a scale per 32 weights, quantized at load")
      ("kv-dtype", po::value(&o->kv_dtype), "f32 | bf16 | fp16: the KV cache's element type (default: f32 with f32 weights, bf16 with bf16 weights on CUDA, else fp16)");
  po::options_description serve("Serving");
  serve.add_options()
      ("listen", po::value(&o->listen), "serve the gRPC API on ADDR:PORT (rank 0)")
      ("max-queue", po::value(&o->max_queue)->default_value(256), "waiting requests before RESOURCE_EXHAUSTED")
      ("admission", po::value(&o->admission)->default_value("deadline"), "deadline: refuse (429 / RESOURCE_EXHAUSTED with a Retry-After) or shed a request the server projects cannot meet its deadline, and spare such requests from preemption; off: admit every request while the queue has room")
      ("request-timeout", po::value(&o->request_timeout_s)->default_value(0.0), "seconds: the deadline of a request that comes without one (an HTTP body without \"timeout\", a gRPC call without a deadline); 0: none")
      ("drain-timeout", po::value(&o->drain_timeout_s)->default_value(30.0), "seconds SIGTERM waits for running requests")
      ("keepalive-s", po::value(&o->keepalive_s)->default_value(10.0), "serving: seconds between keep-alive plans while idle; the other ranks take the group down when rank 0 sends nothing for --collective-timeout + 3 x this")
      ("max-message-bytes", po::value(&o->max_message_bytes)->default_value(0), "largest request message in bytes (0: the largest valid request for the model's context)")
      ("verbose,v", po::bool_switch(&o->verbose), "log every step")
      ("tls-cert", po::value(&o->tls_cert), "serve TLS with this PEM certificate (chain); needs --tls-key")
      ("tls-key", po::value(&o->tls_key), "PEM private key of --tls-cert")
      ("tls-client-ca", po::value(&o->tls_client_ca), "mutual TLS: require client certificates signed by this PEM CA")
      ("api-key-file", po::value(&o->api_key_file), "require \"authorization: Bearer <key>\" on every call but health; the key is this file's contents")
      ("reflection", po::bool_switch(&o->reflection), "serve gRPC server reflection (not checked against the API key)")
      ("max-streams-per-connection", po::value(&o->max_streams_per_connection)->default_value(256), "concurrent calls one client connection may have")
      ("request-memory-mb", po::value(&o->request_memory_mb)->default_value(256), "memory gRPC may spend on calls in flight (ResourceQuota), MiB")
      ("check-weights", po::bool_switch(&o->check_weights), "refuse weights that hold NaN or Inf (reads every weight once more at load)")
      ("insecure-public", po::bool_switch(&o->insecure_public), "allow --listen or --http on an address other hosts can reach with neither TLS nor --api-key-file (refused otherwise; start-up then logs a warning)")
      ("http", po::value(&o->http), "also serve the OpenAI completions API, /health and /metrics over HTTP on ADDR:PORT (rank 0; needs --listen)")
      ("http-threads", po::value(&o->http_threads)->default_value(2), "threads of the HTTP server (every connection shares them)")
      ("http-idle-timeout", po::value(&o->http_idle_timeout_s)->default_value(60.0), "seconds an HTTP connection may wait between requests, take to send one, or leave a response unread before it is closed")
      ("http-max-connections", po::value(&o->http_max_connections)->default_value(0), "open HTTP connections at most; when full, the longest-idle one is closed for a new one (0: 1024, or fewer where the descriptor limit needs it; one that does not fit the limit is refused)")
      ("help,h", "this help")
      ("version", "print the version and exit");
  po::options_description lora("LoRA adapters (PEFT folders)");
  lora.add_options()
      ("lora", po::value(&o->lora)->composing(), "NAME=DIR: load this adapter at start-up (repeatable)")
      ("lora-merge", po::bool_switch(&o->lora_merge), "fold the one --lora adapter into the weights at load (no cost per token)")
      ("lora-dir", po::value(&o->lora_dir), "serving: LoadAdapter loads adapters from the folders in DIR, by name")
      ("lora-max-rank", po::value(&o->lora_max_rank)->default_value(64), "adapters of a higher rank r are refused")
      ("lora-max-adapters", po::value(&o->lora_max_adapters)->default_value(16), "adapters resident at once (unmerged)")
      ("adapter", po::value(&o->adapter), "one-shot: generate with this --lora adapter (unmerged)");
  po::options_description all("ltm-worker options");
  all.add(model).add(gen).add(run).add(serve).add(lora);
  return all;
}

bool parse_ids(const std::string& s, std::vector<int32_t>* out, std::string* error) {
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      *error = absl::StrCat("--prompt-ids: '", part, "' is not an integer token id");
      return false;
    }
    out->push_back(id);
  }
  return true;
}

}  // namespace

std::string worker_usage() {
  WorkerOptions o;
  std::ostringstream s;
  s << "usage: ltm-worker --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
       "       ltm-worker --model DIR --perplexity FILE [--output json] [options]\n"
       "       mpirun -n N ltm-worker --model DIR --tp T --pp P --listen ADDR:PORT [options]\n\n"
    << describe(&o);
  return s.str();
}

bool is_loopback_address(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:"))
    return true;
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  for (const char* scheme : {"ipv4:", "ipv6:", "dns:///", "dns:"})
    if (absl::StartsWith(host, scheme)) host = host.substr(std::strlen(scheme));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad (a name that resolves there is not trusted to).
  int a = 0, b = 0, c = 0, d = 0;
  char tail = 0;
  return std::sscanf(host.c_str(), "%d.%d.%d.%d%c", &a, &b, &c, &d, &tail) == 4 && a == 127 &&
         b >= 0 && b <= 255 && c >= 0 && c <= 255 && d >= 0 && d <= 255;
}

ParseResult parse_worker_options(int argc, char** argv, WorkerOptions* o, std::string* error) {
  po::options_description desc = describe(o);
  po::variables_map vm;
  try {
    if (parse_cli(argc, argv, desc, worker_usage(), "ltm-worker", &vm) == CliStart::kDone)
      return ParseResult::kHelp;
  } catch (const std::exception& e) {
    *error = e.what();
    return ParseResult::kError;
  }
  if (vm.count("prompt")) {
    o->prompt = vm["prompt"].as<std::string>();
    o->has_prompt = true;
  }
  if (vm.count("prompt-ids")) {
    if (!parse_ids(vm["prompt-ids"].as<std::string>(), &o->prompt_ids, error))
      return ParseResult::kError;
    o->has_prompt_ids = true;
  }
  auto fail = [&](std::string msg) {
    *error = std::move(msg);
    return ParseResult::kError;
  };
  if (o->model.empty()) return fail("--model is required");
  if (o->has_prompt && o->has_prompt_ids) return fail("give --prompt or --prompt-ids, not both");
  if (!o->perplexity.empty() && (o->has_prompt || o->has_prompt_ids || !o->listen.empty()))
    return fail("--perplexity FILE is a mode of its own: give it without --prompt, --prompt-ids or --listen");
  if (o->perplexity_window < 0) return fail("--perplexity-window must be >= 0");
  if (o->listen.empty() && !o->has_prompt && !o->has_prompt_ids && o->perplexity.empty())
    return fail("give --prompt or --prompt-ids (one-shot), --perplexity FILE, or --listen ADDR:PORT (serve)");
  if (o->has_prompt_ids && o->prompt_ids.empty()) return fail("--prompt-ids: no ids given");
  if (o->max_new_tokens < 1) return fail("--max-new-tokens must be at least 1");
  if (o->output != "text" && o->output != "json")
    return fail(absl::StrCat("--output must be text or json, not '", o->output, "'"));
  if (o->tp < 1) return fail(absl::StrCat("--tp must be at least 1, not ", o->tp));
  if (o->pp < 1) return fail(absl::StrCat("--pp must be at least 1, not ", o->pp));
  if (o->threads < 0) return fail("--threads must be >= 0");
  // devsim: the emulated device of the tests (runtime/backend/devsim_backend.h), not in --help.
  if (o->device != "cpu" && o->device != "cuda" && o->device != "devsim")
    return fail(absl::StrCat("--device must be cpu or cuda, not '", o->device, "'"));
  if (!(o->collective_timeout_s > 0)) return fail("--collective-timeout must be > 0 seconds");
  if (!(o->keepalive_s > 0)) return fail("--keepalive-s must be > 0 seconds");
  if (o->block_size < 1 || o->block_size > 1024) return fail("--block-size must be in [1, 1024]");
  if (o->kv_memory_mb < 0) return fail("--kv-memory-mb must be >= 0");
  if (!(o->gpu_memory_fraction > 0 && o->gpu_memory_fraction <= 1))
    return fail("--gpu-memory-fraction must be in (0, 1]");
  if (o->max_batch_tokens < 1) return fail("--max-batch-tokens must be at least 1");
  if (o->max_running < 1) return fail("--max-running must be at least 1");
  if (o->max_queue < 1) return fail("--max-queue must be at least 1");
  if (o->admission != "deadline" && o->admission != "off")
    return fail(absl::StrCat("--admission must be deadline or off, not '", o->admission, "'"));
  if (!(o->request_timeout_s >= 0 && o->request_timeout_s <= 86400))
    return fail("--request-timeout must be in [0, 86400] seconds (0: none)");
  if (o->micro_batches < 0) return fail("--micro-batches must be >= 0");
  if (!o->cuda_graphs.empty() && o->cuda_graphs != "on" && o->cuda_graphs != "off")
    return fail(absl::StrCat("--cuda-graphs must be on or off, not '", o->cuda_graphs, "'"));
  if (o->speculative != "off" && o->speculative != "ngram" && o->speculative != "draft")
    return fail(absl::StrCat("--speculative must be off, ngram or draft, not '", o->speculative, "'"));
  if (o->speculative == "draft" && o->draft_model.empty())
    return fail("--speculative draft needs --draft-model DIR (a small model with the target's "
                "tokenizer)");
  if (o->speculative != "draft" && !o->draft_model.empty())
    return fail(absl::StrCat("--draft-model is used by --speculative draft only (this is "
                             "--speculative ", o->speculative, ")"));
  if (!o->draft_model.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(o->draft_model, ec) &&
        !std::filesystem::is_regular_file(o->draft_model, ec))
      return fail(absl::StrCat("--draft-model ", o->draft_model, ": no such folder or config file"));
  }
  if (!o->draft_device.empty() && o->draft_device != "cpu" && o->draft_device != "device")
    return fail(absl::StrCat("--draft-device must be cpu or device, not '", o->draft_device, "'"));
  if (!o->draft_device.empty() && o->speculative != "draft")
    return fail(absl::StrCat("--draft-device is used by --speculative draft only (this is "
                             "--speculative ", o->speculative, ")"));
  if (o->spec_tokens < 1 || o->spec_tokens > kMaxSpecTokens)
    return fail(absl::StrCat("--spec-tokens must be in [1, ", kMaxSpecTokens, "]"));
  if (o->spec_max_batch < 0) return fail("--spec-max-batch must be at least 1 (or 0: by mode)");
  if (o->spec_max_batch == 0)
    o->spec_max_batch = o->speculative == "draft" ? SpecOptions::kDraftMaxBatch : o->max_running;
  if (!(o->spec_token_cost >= 0 && o->spec_token_cost <= 10))
    return fail("--spec-token-cost must be in [0, 10] (0: measured)");
  if (o->prefix_cache != "on" && o->prefix_cache != "off")
    return fail(absl::StrCat("--prefix-cache must be on or off, not '", o->prefix_cache, "'"));
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--weight-dtype", &o->weight_dtype},
                                    {"--kv-dtype", &o->kv_dtype}}) {
    Precision p;
    const bool weights = std::string_view(flag) == "--weight-dtype";
    if (!value->empty() && (!parse_precision(*value, &p) || (!weights && p == Precision::kInt8)))
      return fail(absl::StrCat(flag, " must be ", weights ? "f32, bf16, fp16 or int8" : "f32, bf16 or fp16",
                               ", not '", *value, "'"));
  }
  if (o->micro_batches == 0) o->micro_batches = o->pp;
  if (!(o->init_std > 0)) return fail("--init-std must be > 0");
  if (!o->init.empty() && o->init != "checkpoint" && o->init != "random")
    return fail("--init must be checkpoint or random, not '" + o->init + "'");
  // An address without a host serves loopback only: every interface is an explicit 0.0.0.0.
  if (!o->listen.empty() && o->listen.find(':') == std::string::npos &&
      o->listen.find_first_not_of("0123456789") == std::string::npos)
    o->listen = "127.0.0.1:" + o->listen;
  else if (!o->listen.empty() && o->listen[0] == ':')
    o->listen = "127.0.0.1" + o->listen;
  if (o->max_message_bytes != 0 &&
      (o->max_message_bytes < 1024 || o->max_message_bytes > (int64_t{1} << 30)))
    return fail(absl::StrCat("--max-message-bytes must be 0 (automatic) or in [1024, 1073741824], not ",
                             o->max_message_bytes));
  if (o->max_streams_per_connection < 1 || o->max_streams_per_connection > 65536)
    return fail("--max-streams-per-connection must be in [1, 65536]");
  if (o->request_memory_mb < 16 || o->request_memory_mb > (int64_t{1} << 20))
    return fail("--request-memory-mb must be in [16, 1048576]");
  if (o->tls_cert.empty() != o->tls_key.empty()) return fail("give --tls-cert and --tls-key together");
  if (!o->http.empty()) {
    if (o->listen.empty()) return fail("--http needs --listen (the gRPC address) as well");
    if (o->http.find(':') == std::string::npos) o->http = "127.0.0.1:" + o->http;
    else if (o->http[0] == ':') o->http = "127.0.0.1" + o->http;
    const std::string host = o->http.substr(0, o->http.rfind(':'));
    if (!o->tls_cert.empty() && host != "127.0.0.1" && host != "localhost" && host != "[::1]")
      return fail("--http serves plaintext: with --tls-cert it may only listen on loopback "
                  "(put a TLS proxy in front of it)");
  }
  if (o->http_threads < 1 || o->http_threads > 64) return fail("--http-threads must be in [1, 64]");
  if (!(o->http_idle_timeout_s >= 1 && o->http_idle_timeout_s <= 86400))
    return fail("--http-idle-timeout must be in [1, 86400] seconds");
  if (o->http_max_connections < 0 || o->http_max_connections > (1 << 20))
    return fail("--http-max-connections must be 0 (automatic) or in [1, 1048576]");
  // Nobody gets in by default: a front door other hosts can reach needs TLS or an API key, or
  // the operator's explicit --insecure-public (docs/architecture.md "Hardening").
  if (!o->insecure_public) {
    const char* fix = "give --api-key-file FILE (or --tls-cert and --tls-key), listen on "
                      "127.0.0.1, or give --insecure-public to serve anyone who can connect";
    if (!o->listen.empty() && !is_loopback_address(o->listen) && o->tls_cert.empty() &&
        o->api_key_file.empty())
      return fail(absl::StrCat("--listen ", o->listen, " can be reached from other hosts with "
                               "neither TLS nor an API key: ", fix));
    if (!o->http.empty() && !is_loopback_address(o->http) && o->api_key_file.empty())
      return fail(absl::StrCat("--http ", o->http, " can be reached from other hosts without an "
                               "API key (it serves plaintext): ", fix));
  }
  if (!o->tls_client_ca.empty() && o->tls_cert.empty())
    return fail("--tls-client-ca needs --tls-cert and --tls-key");
  if (std::string e = check_lora_options(*o); !e.empty()) return fail(e);
  return ParseResult::kOk;
}

}  // namespace ltm
