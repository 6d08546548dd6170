// Element types of the tensors the CUDA kernels read and write besides float32 activations:
// weights, embedding tables and KV caches may be 16-bit; arithmetic is float32 whatever they are.
// Plain C++ (no CUDA headers), so host code may name the types.
#pragma once

#include <cstdint>

namespace ltm::kernels::cuda {

enum class ElemType : uint8_t { kF32, kBF16, kF16 };

inline constexpr int elem_size(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }

}  // namespace ltm::kernels::cuda
