#include "kernels/cpu/cpu_isa.h"

#include <spdlog/spdlog.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string_view>

#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu {
namespace {

#define LTM_ISA_TABLE(ns)                                                                       \
  KernelTable {                                                                                 \
    ns::panel_gemm, ns::bias_gelu, ns::layer_norm_row, ns::add, ns::add_bias, ns::attend_tile, \
        ns::exp_shift_sum, ns::panel_gemm_bf16, ns::panel_gemm_f16, ns::attend_tile_bf16,      \
        ns::attend_tile_f16, ns::bf16_to_f32_n, ns::f16_to_f32_n, ns::f32_to_bf16_n,            \
        ns::f32_to_f16_n, ns::rms_norm_row, ns::silu_mul_row, ns::rope_row, ns::dot_rows       \
  }

const KernelTable kPortableTable = LTM_ISA_TABLE(portable);
#ifdef LTM_CPU_X86
const KernelTable kAvx2Table = LTM_ISA_TABLE(avx2);
const KernelTable kAvx512Table = LTM_ISA_TABLE(avx512);
#endif

const KernelTable& table_for(Isa isa) {
  switch (isa) {
#ifdef LTM_CPU_X86
    case Isa::kAvx512: return kAvx512Table;
    case Isa::kAvx2: return kAvx2Table;
#endif
    default: return kPortableTable;
  }
}

struct Feature {
  const char* name;
  bool present;
};

#ifdef LTM_CPU_X86
// What each path's units are compiled for (kernels/CMakeLists.txt). __builtin_cpu_supports also
// checks that the OS saves the registers (XCR0).
std::vector<Feature> features_of(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kAvx512:
      return {{"avx512f", __builtin_cpu_supports("avx512f") != 0},
              {"avx512bw", __builtin_cpu_supports("avx512bw") != 0},
              {"avx512vl", __builtin_cpu_supports("avx512vl") != 0},
              {"avx512dq", __builtin_cpu_supports("avx512dq") != 0},
              {"avx2", __builtin_cpu_supports("avx2") != 0},
              {"fma", __builtin_cpu_supports("fma") != 0},
              {"f16c", __builtin_cpu_supports("f16c") != 0}};
    case Isa::kAvx2:
      return {{"avx2", __builtin_cpu_supports("avx2") != 0},
              {"fma", __builtin_cpu_supports("fma") != 0},
              {"f16c", __builtin_cpu_supports("f16c") != 0}};
    default: return {};
  }
}
#else
std::vector<Feature> features_of(Isa) { return {}; }
#endif

std::string join(const std::vector<Feature>& fs, bool present) {
  std::string out;
  for (const Feature& f : fs)
    if (f.present == present) {
      if (!out.empty()) out += ' ';
      out += f.name;
    }
  return out;
}

std::atomic<const KernelTable*> g_table{nullptr};
std::atomic<Isa> g_isa{Isa::kPortable};
std::once_flag g_chosen;

// OpenBLAS's kernels to the forced path's (blas_core.h), unless OPENBLAS_CORETYPE chose them.
void match_blas(Isa chosen, const char* env) {
  const char* want = blas_core_for(chosen);
  const std::string before = blas_core();
  if (want == nullptr || before.empty() || std::getenv("OPENBLAS_CORETYPE") != nullptr ||
      strcasecmp(before.c_str(), want) == 0)
    return;
  const std::string after = select_blas_core(want);
  if (strcasecmp(after.c_str(), want) == 0) {
    spdlog::info("cpu kernels: OpenBLAS switched from its {} to its {} kernels (LTM_CPU_ISA={})",
                 before, after, env);
  } else {
    spdlog::warn("cpu kernels: OpenBLAS still runs its {} kernels (it did not take {}); set "
                 "OPENBLAS_CORETYPE={} for a path that is {} throughout",
                 after, want, want, isa_name(chosen));
  }
}

void choose_once() {
  std::call_once(g_chosen, [] {
    const char* env = std::getenv("LTM_CPU_ISA");
    const Isa chosen = choose_isa(env);  // throws: the flag stays unset, the next call throws too
    g_isa.store(chosen);
    g_table.store(&table_for(chosen));
    const std::string feats = join(features_of(chosen), true);
    spdlog::info("cpu kernels: {}{}{}{}", isa_name(chosen), feats.empty() ? "" : " (",
                 feats.empty() ? "" : feats, feats.empty() ? "" : ")");
    if (env != nullptr && *env != '\0') {
      spdlog::info("cpu kernels: forced by LTM_CPU_ISA={}", env);
      if (chosen != supported_isas().front()) match_blas(chosen, env);
    }
  });
}

}  // namespace

namespace {
// The switch of the bf16 dot-product paths (AMX or AVX512-BF16): -1 not decided yet, 0 off, 1 on.
std::atomic<int> g_amx{-1};

bool amx_hardware() {
#ifdef LTM_CPU_X86
  static const bool ok = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16") ||
        !__builtin_cpu_supports("avx512bf16") || !isa_supported(Isa::kAvx512))
      return false;
    return amx::request_amx();
  }();
  return ok;
#else
  return false;
#endif
}

bool dpbf16_hardware() {
#ifdef LTM_CPU_X86
  static const bool ok = [] {
    __builtin_cpu_init();
    return !amx_hardware() && __builtin_cpu_supports("avx512bf16") &&
           isa_supported(Isa::kAvx512);
  }();
  return ok;
#else
  return false;
#endif
}

// The switch, decided once from LTM_AMX and the hardware; says which path on the first use.
bool bf16_dot_on() {
  int v = g_amx.load();
  if (v < 0) {
    const char* env = std::getenv("LTM_AMX");
    const bool want = !(env != nullptr && std::string_view(env) == "0");
    v = want && (amx_hardware() || dpbf16_hardware()) ? 1 : 0;
    int expected = -1;
    if (g_amx.compare_exchange_strong(expected, v) && v == 1)
      spdlog::info("cpu kernels: {} for bf16 GEMMs of {}+ rows (activations rounded to bf16; "
                   "LTM_AMX=0 turns it off)",
                   amx_hardware() ? "amx-bf16" : "avx512-bf16 (vdpbf16ps)", kAmxMinRows);
    v = g_amx.load();
  }
  return v == 1 && isa() == Isa::kAvx512;
}
}  // namespace

bool amx_available() { return amx_hardware(); }

bool amx_enabled() { return amx_hardware() && bf16_dot_on(); }

bool dpbf16_available() { return dpbf16_hardware(); }

bool dpbf16_enabled() { return dpbf16_hardware() && bf16_dot_on(); }

void set_amx(bool on) { g_amx.store(on && (amx_hardware() || dpbf16_hardware()) ? 1 : 0); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kPortable: return "portable";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa i : {Isa::kAvx512, Isa::kAvx2, Isa::kPortable})
    if (name == isa_name(i)) return i;
  return std::nullopt;
}

bool isa_supported(Isa isa) {
  if (isa == Isa::kPortable) return true;
  const std::vector<Feature> fs = features_of(isa);
  if (fs.empty()) return false;  // not an x86 build
  for (const Feature& f : fs)
    if (!f.present) return false;
  return true;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kAvx512, Isa::kAvx2, Isa::kPortable})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

Isa choose_isa(const char* env_value) {
  if (env_value == nullptr || *env_value == '\0') return supported_isas().front();
  const std::optional<Isa> asked = parse_isa(env_value);
  if (!asked)
    throw std::runtime_error(std::string("LTM_CPU_ISA=") + env_value +
                             ": unknown CPU kernel path (expected avx512, avx2 or portable)");
  if (!isa_supported(*asked)) {
    const std::vector<Feature> fs = features_of(*asked);
    throw std::runtime_error(
        std::string("LTM_CPU_ISA=") + env_value + ": this CPU cannot run the " + isa_name(*asked) +
        " kernels (" + (fs.empty() ? "not an x86 build" : "lacks " + join(fs, false)) +
        "); it supports: " + [] {
          std::string s;
          for (Isa i : supported_isas()) s += std::string(s.empty() ? "" : ", ") + isa_name(i);
          return s;
        }());
  }
  return *asked;
}

std::string cpu_feature_list() { return join(features_of(Isa::kAvx512), true); }

unsigned amd_cpu_family() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) != 0 && ebx == 0x68747541u && edx == 0x69746e65u &&
      ecx == 0x444d4163u && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0)  // AuthenticAMD
    return ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff);
#endif
  return 0;
}

TuningChoice tuning_choice(const char* env_name, std::initializer_list<int64_t> allowed,
                           int64_t cpu_default) {
  const char* e = std::getenv(env_name);
  if (e == nullptr || *e == '\0') return {cpu_default, "this CPU"};
  for (const int64_t v : allowed)
    if (std::to_string(v) == e) return {v, env_name};
  std::string list;
  for (const int64_t v : allowed) list += (list.empty() ? "" : ", ") + std::to_string(v);
  spdlog::warn("{}='{}' ignored: it must be one of {}", env_name, e, list);
  return {cpu_default, "this CPU"};
}

Isa isa() {
  choose_once();
  return g_isa.load();
}

const char* isa_name() { return isa_name(isa()); }

bool set_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  choose_once();
  g_isa.store(isa);
  g_table.store(&table_for(isa));
  spdlog::debug("cpu kernels: switched to {}", isa_name(isa));
  return true;
}

const KernelTable& kernel_table() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t != nullptr) return *t;
  choose_once();
  return *g_table.load();
}

}  // namespace ltm::kernels::cpu
