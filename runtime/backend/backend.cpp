#include "runtime/backend/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

#include <algorithm>

#include "common/check.h"

namespace ltm {

size_t precision_size(Precision p) {
  return p == Precision::kF32 ? 4 : p == Precision::kInt8 ? 1 : 2;
}

double weight_element_bytes(Precision p) {
  return p == Precision::kInt8 ? 1.0 + 2.0 / 32.0 : static_cast<double>(precision_size(p));
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
    case Precision::kF16: return "fp16";
    case Precision::kInt8: return "int8";
  }
  return "?";
}

bool parse_precision(std::string_view name, Precision* out) {
  if (name == "f32" || name == "fp32") *out = Precision::kF32;
  else if (name == "bf16") *out = Precision::kBF16;
  else if (name == "fp16" || name == "f16") *out = Precision::kF16;
  else if (name == "int8") *out = Precision::kInt8;
  else return false;
  return true;
}

Precision device_activation_precision(Precision weights) {
  return weights == Precision::kInt8 ? Precision::kF16 : weights;
}

Precision default_kv_precision(Precision weights, Precision activations) {
  if (activations != Precision::kF32) return activations;
  return weights == Precision::kF32 ? Precision::kF32 : Precision::kF16;
}

float* Act::f32() const {
  LTM_ASSERT(type == Precision::kF32, "fp32 activations expected, got ", precision_name(type));
  return static_cast<float*>(data);
}

void Backend::matmul_act(Act a, const DeviceBuffer& w, Act c, int64_t m, int64_t n, int64_t k,
                         float beta, const float* bias, Epilogue epilogue, const void* bias_act) {
  (void)bias_act;  // fp32 C: the fp32 bias
  matmul(a.f32(), w, c.f32(), m, n, k, beta);
  if (epilogue == Epilogue::kBias) add_bias(c.f32(), bias, m, n);
  if (epilogue == Epilogue::kBiasGelu) bias_gelu(c.f32(), bias, m, n);
}

void Backend::layer_norm_act(const float* x, const float* gamma, const float* beta, Act y,
                             int64_t rows, int64_t cols, float eps) {
  layer_norm(x, gamma, beta, y.f32(), rows, cols, eps);
}

void Backend::add_bias_residual_layer_norm_act(float* x, float* residual, const float* bias,
                                               const float* gamma, const float* beta, Act y,
                                               int64_t rows, int64_t cols, float eps) {
  add_bias_residual_layer_norm(x, residual, bias, gamma, beta, y.f32(), rows, cols, eps);
}

void Backend::add_bias_act(Act x, const float* bias, int64_t rows, int64_t cols) {
  add_bias(x.f32(), bias, rows, cols);
}

void Backend::bias_gelu_act(Act x, const float* bias, int64_t rows, int64_t cols) {
  bias_gelu(x.f32(), bias, rows, cols);
}

void Backend::act_to_f32(Act x, float* out, int64_t n) {
  // fp32 already: a device-to-device copy through the host would be wasteful, but no fp32
  // caller needs it (the model widens only 16-bit activations).
  float* src = x.f32();
  if (src == out || n <= 0) return;
  fill_zero(out, static_cast<size_t>(n) * sizeof(float));
  add(out, src, n);
}

void Backend::add_f32_to_act(Act x, const float* y, int64_t n) { add(x.f32(), y, n); }

namespace {
[[noreturn]] void no_llama(const Backend& b, const char* op) {
  LTM_ASSERT(false, op, " on ", b.describe(), ", which has no Llama-family ops (supports_llama())");
  __builtin_unreachable();
}
}  // namespace

void Backend::rms_norm(const float*, const float*, float*, int64_t, int64_t, float) {
  no_llama(*this, "rms_norm");
}
void Backend::add_residual_rms_norm(float*, const float*, const float*, const float*, float*,
                                    int64_t, int64_t, float) {
  no_llama(*this, "add_residual_rms_norm");
}
void Backend::rope(float*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t) {
  no_llama(*this, "rope");
}
void Backend::silu_mul(const float*, float*, int64_t, int64_t) { no_llama(*this, "silu_mul"); }
void Backend::rms_norm_act(const float* x, const float* w, Act y, int64_t rows, int64_t cols,
                           float eps) {
  rms_norm(x, w, y.f32(), rows, cols, eps);
}
void Backend::add_residual_rms_norm_act(float* x, const float* residual, const float* bias,
                                        const float* w, Act y, int64_t rows, int64_t cols,
                                        float eps) {
  add_residual_rms_norm(x, residual, bias, w, y.f32(), rows, cols, eps);
}
void Backend::rope_act(Act x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
                       int64_t n_heads, int64_t row_stride, int64_t head_dim) {
  rope(x.f32(), positions, inv_freq, n_tokens, n_heads, row_stride, head_dim);
}
void Backend::silu_mul_act(Act gate_up, Act out, int64_t rows, int64_t cols) {
  silu_mul(gate_up.f32(), out.f32(), rows, cols);
}

DeviceBuffer Backend::alloc_weight(int64_t k, int64_t n, Precision p) {
  LTM_ASSERT(p == Precision::kF32, describe(), " holds f32 weights only, not ", precision_name(p));
  return alloc(static_cast<size_t>(k * n) * sizeof(float));
}

void Backend::write_weight_rows(DeviceBuffer& w, const float* rows, int64_t row_begin,
                                int64_t row_end, int64_t k, int64_t n) {
  LTM_ASSERT(0 <= row_begin && row_begin <= row_end && row_end <= k);
  copy_to_device(w.f32() + row_begin * n, rows, static_cast<size_t>((row_end - row_begin) * n) * sizeof(float));
}

DeviceBuffer Backend::alloc_embedding(int64_t rows, int64_t d, Precision p) {
  return alloc_weight(rows, d, p);
}

void Backend::write_embedding_rows(DeviceBuffer& table, const float* e_rows, int64_t row_begin,
                                   int64_t row_end, int64_t rows, int64_t d) {
  write_weight_rows(table, e_rows, row_begin, row_end, rows, d);
}

const void* Backend::read_on_host(const void* src, size_t bytes,
                                  std::vector<unsigned char>& staging) {
  if (staging.size() < bytes) staging.resize(bytes);
  copy_to_host(staging.data(), src, bytes);
  synchronize();
  return staging.data();
}

const int32_t* Backend::stage_i32(const int32_t* host, size_t n, DeviceBuffer& staging) {
  return static_cast<const int32_t*>(stage_bytes(host, n * sizeof(int32_t), staging));
}

const void* Backend::stage_bytes(const void* host, size_t bytes, DeviceBuffer& staging) {
  const size_t need = std::max<size_t>(bytes, 1);
  if (staging.bytes() < need) staging = alloc(std::max(need, staging.bytes() * 2));
  copy_to_device(staging.data(), host, bytes);
  return staging.data();
}

void Backend::sample_rows(const SampleRowsArgs& a) {
  if (a.rows <= 0) return;
  std::vector<unsigned char> params_bytes, logits_bytes, history_bytes;
  const size_t m = static_cast<size_t>(a.rows);
  const auto* params = static_cast<const SampleRowParams*>(
      read_on_host(a.params, m * sizeof(SampleRowParams), params_bytes));
  std::vector<SampleRowParams> host_params(params, params + m);
  int64_t history = 0;
  for (const SampleRowParams& p : host_params)
    if (p.history_count > 0)
      history = std::max<int64_t>(history, int64_t{p.history_offset} + p.history_count);
  SampleRowsArgs h = a;
  h.params = host_params.data();
  const size_t logit_floats = (m - 1) * static_cast<size_t>(a.stride) + a.vocab;
  std::vector<float> logits(logit_floats);
  std::memcpy(logits.data(), read_on_host(a.logits, logit_floats * sizeof(float), logits_bytes),
              logit_floats * sizeof(float));
  h.logits = logits.data();
  std::vector<int32_t> ids(static_cast<size_t>(history));
  if (history > 0) {
    std::memcpy(ids.data(), read_on_host(a.history, ids.size() * 4, history_bytes),
                ids.size() * 4);
    h.history = ids.data();
  }
  std::vector<int32_t> tokens(m);
  std::vector<float> logprobs(a.logprobs ? m : 0);
  h.tokens = tokens.data();
  h.logprobs = a.logprobs ? logprobs.data() : nullptr;
  sample_rows_host(h, host_threads());
  copy_to_device(a.tokens, tokens.data(), m * sizeof(int32_t));
  if (a.logprobs) copy_to_device(a.logprobs, logprobs.data(), m * sizeof(float));
  synchronize();  // the host vectors go out of scope
}

void Backend::select_candidates(const CandidateRowsArgs& a) {
  if (a.rows <= 0) return;
  std::vector<unsigned char> params_bytes, logits_bytes, history_bytes;
  const size_t m = static_cast<size_t>(a.rows);
  const auto* params = static_cast<const SampleRowParams*>(
      read_on_host(a.params, m * sizeof(SampleRowParams), params_bytes));
  std::vector<SampleRowParams> host_params(params, params + m);
  int64_t history = 0;
  for (const SampleRowParams& p : host_params)
    if (p.history_count > 0)
      history = std::max<int64_t>(history, int64_t{p.history_offset} + p.history_count);
  CandidateRowsArgs h = a;
  h.params = host_params.data();
  const size_t logit_floats = (m - 1) * static_cast<size_t>(a.stride) + a.valid;
  std::vector<float> logits(logit_floats);
  std::memcpy(logits.data(), read_on_host(a.logits, logit_floats * sizeof(float), logits_bytes),
              logit_floats * sizeof(float));
  h.logits = logits.data();
  std::vector<int32_t> ids(static_cast<size_t>(history));
  if (history > 0) {
    std::memcpy(ids.data(), read_on_host(a.history, ids.size() * 4, history_bytes),
                ids.size() * 4);
    h.history = ids.data();
  }
  std::vector<unsigned char> out(
      static_cast<size_t>(candidate_rows_bytes(host_params.data(), a.rows, a.valid)));
  h.out = out.data();
  select_candidates_host(h, host_threads());
  copy_to_device(a.out, out.data(), out.size());
  synchronize();  // the host vectors go out of scope
}

std::unique_ptr<BackendGraph> Backend::capture(const std::function<void()>&) {
  LTM_ASSERT(false, "capture() on ", describe(), ", which has no graphs (supports_graphs())");
  return nullptr;
}

void Backend::replay(BackendGraph&) {
  LTM_ASSERT(false, "replay() on ", describe(), ", which has no graphs (supports_graphs())");
}

#ifndef LTM_CUDA_PLUGIN
namespace {

// The directory of this process's executable, with a trailing '/' ("" when unknown).
std::string executable_dir() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  std::string s(path, static_cast<size_t>(n));
  return s.substr(0, s.rfind('/') + 1);
}

}  // namespace

// The CUDA backend lives in a plugin (cuda_backend.cpp) loaded on first use: CPU ranks never map
// the CUDA libraries. Looked for at $LTM_CUDA_BACKEND, then <executable dir>/../lib/, then on the
// library search path.
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* error) {
  using Create = Backend* (*)(int, std::string*);
  static Create create = nullptr;
  static std::string load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("LTM_CUDA_BACKEND"); env && *env) candidates.push_back(env);
    candidates.push_back(executable_dir() + "../lib/libltm_backend_cuda.so");
    candidates.push_back("libltm_backend_cuda.so");
    for (const std::string& path : candidates) {
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        absl::StrAppend(&load_error, load_error.empty() ? "" : "; ", dlerror());
        continue;
      }
      create = reinterpret_cast<Create>(dlsym(handle, "ltm_cuda_backend_create"));
      if (create != nullptr) return;  // the plugin stays loaded: its buffers' deleters live there
      absl::StrAppend(&load_error, "; ", path, " has no ltm_cuda_backend_create");
    }
  });
  if (create == nullptr) {
#ifdef LTM_HAVE_CUDA
    if (error) *error = absl::StrCat("cannot load the CUDA backend plugin: ", load_error);
#else
    if (error) *error = "this ltm was built without CUDA (configure with -DLTM_CUDA=ON)";
#endif
    return nullptr;
  }
  return std::unique_ptr<Backend>(create(device, error));
}
#endif

}  // namespace ltm
