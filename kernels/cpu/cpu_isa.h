// Which instruction set the CPU kernels run with, chosen at run time.
//
// One binary serves AVX-512 machines (Intel Xeon), AVX2 + FMA machines (AMD Zen 3) and anything
// older: the ISA-specific kernel bodies are compiled in their own translation units with their
// own target flags (kernels/cpu/*_avx512.cpp, *_avx2.cpp, *_portable.cpp; see
// kernels/CMakeLists.txt), and a table of function pointers is chosen once, at the first kernel
// call, from CPUID (__builtin_cpu_supports): the widest ISA the CPU has. The choice is logged once
// (spdlog info, "cpu kernels: avx512 (...)").
//
// LTM_CPU_ISA=avx512|avx2|portable forces a path; a value the CPU lacks, or an unknown one, is
// an error (std::runtime_error from the first kernel call or isa()). A path narrower than the
// CPU's widest switches OpenBLAS's kernels to match, unless OPENBLAS_CORETYPE is set
// (blas_core.h). Tests switch with set_isa(), which leaves OpenBLAS as it is.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ltm::kernels::cpu {

enum class Isa {
  kPortable,  // plain C++ for the build's baseline (x86-64-v2 by default): any x86-64 CPU
  kAvx2,      // AVX2 + FMA + F16C (Haswell, Zen 1-3)
  kAvx512,    // AVX-512 F/BW/VL/DQ + FMA + F16C (Skylake-SP and later, Zen 4)
};

// The path in use (selects it on the first call; throws std::runtime_error for a bad
// LTM_CPU_ISA).
Isa isa();
const char* isa_name();
const char* isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);  // "avx512" | "avx2" | "portable"

// Whether this CPU (and this build) can run `isa`.
bool isa_supported(Isa isa);
// Every ISA this CPU can run, widest first (always ends with kPortable).
std::vector<Isa> supported_isas();

// Switches the path for the whole process; false (and no change) if the CPU lacks it. Not to be
// called while kernels run on other threads.
bool set_isa(Isa isa);

// The ISA that LTM_CPU_ISA's value asks for: the widest supported one for null or empty; throws
// std::runtime_error with the reason for an unknown name or an ISA this CPU lacks.
Isa choose_isa(const char* env_value);

// AMX (Intel TMUL with bf16 tiles) for GEMMs of bf16 weights with at least kAmxMinRows rows of
// A (prefill, and decode batches of 16 or more sequences): A is rounded to bf16 (as oneDNN and llama.cpp do for bf16 weights; accumulation
// stays fp32), and the GEMM runs several times the AVX-512 rate. Used when the CPU has AMX-TILE
// and AMX-BF16, the OS grants the tile state, the AVX-512 path is in use, and LTM_AMX is not "0";
// a "cpu kernels: amx-bf16 ..." line says so once. amx_enabled() answers; set_amx(false) turns it
// off for the process (tests compare against the exact path), set_amx(true) back on if available.
// 16 rows (one tile): measured here, 1 thread, GPT-2 shapes, AMX against the AVX-512 bf16
// kernel: x1.8 at m = 16, x1.9-2.4 at m = 32, x3.2-4 at m = 64..512; decode of one to a few
// sequences (m < 16) streams the weights on the AVX-512 kernel, with fp32 activations.
// Without AMX, a CPU with AVX512-BF16 (AMD Zen 4/5, Intel Cooper Lake) takes the same rounding
// and GEMMs of >= kAmxMinRows rows with vdpbf16ps (twice the elements per instruction of fp32
// FMA): dpbf16_enabled() answers, and the same switch (LTM_AMX, set_amx) turns both off or on.
inline constexpr int64_t kAmxMinRows = 16;
bool amx_available();
bool amx_enabled();
bool dpbf16_available();
bool dpbf16_enabled();
void set_amx(bool on);

// The CPU features the paths test, e.g. "avx512f avx512bw avx512vl avx512dq avx2 fma f16c".
std::string cpu_feature_list();

// The CPU's family (CPUID leaf 1, base plus extended: 0x19 Zen 3/4, 0x1A Zen 5) when its vendor
// is AMD, else 0. Decode kernels choose their prefetch distance by it (int8_gemm.cpp,
// packed_gemm.cpp).
unsigned amd_cpu_family();

// A kernel tuning choice (a prefetch distance) that has a default for this CPU and that an
// environment variable may force to one of `allowed` (for measuring): another value is named in
// a warning and ignored. The value in force, and what set it ("this CPU" or the variable's name).
struct TuningChoice {
  int64_t value;
  const char* source;
};
TuningChoice tuning_choice(const char* env_name, std::initializer_list<int64_t> allowed,
                           int64_t cpu_default);

}  // namespace ltm::kernels::cpu
