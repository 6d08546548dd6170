// ltm-worker's command line (Boost.program_options). Flags are a stable interface: scripts and
// job files depend on them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ltm {

struct WorkerOptions {
  // Model
  std::string model;            // HF GPT-2 folder, or a config .json (random weights)
  std::string init;             // --init: "" (a folder's weights, a config's random ones), "checkpoint", "random"
  uint64_t init_seed = 1;       // random weights: seed
  float init_std = 0.02f;       // random weights: std
  std::string tokenizer;        // folder with tokenizer.json or vocab.json (default: model folder)
  std::string chat_template;    // --chat-template FILE (default: tokenizer_config.json's)
  // One-shot generation
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  bool has_prompt = false, has_prompt_ids = false;
  int32_t max_new_tokens = 32;
  float temperature = 0.0f;     // one-shot default: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string output = "text";  // text | json
  std::string dump_logits;
  std::string dump_prompt_logits;
  std::string perplexity;        // --perplexity FILE: score FILE instead of generating
  int64_t perplexity_window = 0; // tokens per window (0: n_positions)
  // Layout and resources
  int tp = 1;
  int pp = 1;
  int threads = 0;              // 0: all cores / ranks on this host
  std::string device = "cpu";   // cpu | cuda
  double collective_timeout_s = 300;
  int32_t block_size = 16;
  int64_t kv_memory_mb = 0;     // 0: one-shot sizes the cache for the request; server: 1024
                                // on the CPU, on a GPU what is left (gpu_memory_fraction)
  double gpu_memory_fraction = 0.9;  // of the GPU memory left after weights, activations, graphs
  bool kv_resident = false;     // CPU: the KV cache faulted in at start-up (Backend::make_resident)
  int32_t max_batch_tokens = 512;
  int32_t max_running = 64;
  int32_t micro_batches = 0;   // plans in flight; 0: pp (keeps every pipeline stage busy)
  std::string prefix_cache = "on";  // on | off: reuse cached KV blocks of shared prefixes
  // Speculative decoding (runtime/spec/proposer.h): off | ngram | draft, drafts per step at
  // most, and the most running sequences it is used with.
  std::string speculative = "off";
  int32_t spec_tokens = 5;
  int32_t spec_max_batch = 0;  // 0 on the command line: by mode (worker_options.cpp)
  double spec_token_cost = 0;  // 0: measured (SpecOptions::token_cost)
  std::string draft_model;  // --speculative draft: the draft model's folder (or config .json)
  std::string draft_device;  // "" | cpu: rank 0's CPU; device: rank 0's --device (its GPU)
  // on | off: decode steps as captured graphs (runtime/model/decode_graphs.h); "" = the default:
  // on where the backend has graphs (cuda, devsim), off on the CPU, where "on" is refused.
  std::string cuda_graphs;
  // Element types: "" = the default (weights: the checkpoint's dtype, f32 for a config-only
  // model; KV cache: f32 with f32 weights, fp16 with 16-bit weights), else f32 | bf16 | fp16.
  std::string weight_dtype;
  std::string kv_dtype;
  // Serving
  std::string listen;           // ADDR:PORT; empty = one-shot
  int32_t max_queue = 256;
  std::string admission = "deadline";  // deadline | off (runtime/sched/admission.h)
  double request_timeout_s = 0;        // deadline of requests that come without one; 0: none
  double drain_timeout_s = 30;
  double keepalive_s = 10;     // serving: rank 0 idle this long sends a keep-alive plan
  int64_t max_message_bytes = 0;  // 0: the largest valid request (GrpcServerOptions)
  bool verbose = false;
  // Hardening (serving): transport security, access, resources; weights checked at load.
  std::string tls_cert, tls_key, tls_client_ca;  // PEM files
  std::string api_key_file;     // bearer token required on every call but health
  bool reflection = false;      // serve grpc.reflection
  int32_t max_streams_per_connection = 256;
  int64_t request_memory_mb = 256;  // gRPC ResourceQuota
  bool check_weights = false;   // refuse NaN/Inf weights at load
  // A --listen or --http on an address other hosts can reach, with neither TLS nor an API key,
  // is refused unless this is set (then start-up logs a warning).
  bool insecure_public = false;
  // HTTP front door (OpenAI API, /health, /metrics) beside gRPC: ADDR:PORT, empty = none.
  std::string http;
  int http_threads = 2;
  int32_t http_max_connections = 0;  // 0: 1024, or less where the descriptor limit asks for it
  double http_idle_timeout_s = 60;    // a connection silent (or not reading) this long is closed
  // LoRA adapters (launcher/lora_setup.h)
  std::vector<std::string> lora;  // NAME=DIR, loaded at start-up (repeatable)
  bool lora_merge = false;      // fold the one --lora into the weights
  std::string lora_dir;         // LoadAdapter finds adapters here by name
  int32_t lora_max_rank = 64;
  int32_t lora_max_adapters = 16;
  std::string adapter;          // one-shot: the --lora adapter to generate with
};

enum class ParseResult { kOk, kHelp, kError };
ParseResult parse_worker_options(int argc, char** argv, WorkerOptions* out, std::string* error);
// Whether a --listen or --http address can only be reached from this host: 127.x.x.x,
// localhost, ::1 (bracketed or not), or a gRPC unix: socket.
bool is_loopback_address(const std::string& address);
std::string worker_usage();

}  // namespace ltm
