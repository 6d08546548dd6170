// 16-bit GEMMs with float32 accumulation on tensor cores, through cuBLASLt (the CUDA backend's
// bf16 / fp16 weights).
//
// Column-major, as cuBLASLt sees it: D[M, N] = epilogue(op(A)[M, K] * B[K, N] + beta * D), where
// A and B hold 16-bit elements of one type and D is float32 or of A's type (read when beta != 0);
// the epilogue adds a bias [M] (of D's type, as cuBLASLt requires) and may apply GELU before D is
// rounded once (cuBLASLt documents its GELU by name only; GPT-2's tanh form and the erf form
// differ by under 5e-4, below bf16's rounding of the result). A is stored [M, K]
// with leading dimension M (a_trans false) or [K, M] with leading dimension K (a_trans true); B
// is [K, N] with leading dimension K; D is [M, N] with leading dimension M. The CUDA backend's
// row-major C = X W is the column-major C^T = W^T X^T, i.e. A = W (not transposed), B = X.
//
// The algorithm is chosen once per (shape, types, transposition, epilogue, pointer alignment) by
// cublasLtMatmulAlgoGetHeuristic, with the alignment every column of each operand offers (its
// pointer's and its leading dimension's, gemm_alignment.h) as the heuristic's minimum,
// and cached with its descriptors; later calls of that shape only enqueue cublasLtMatmul. A
// shape for which cuBLASLt offers no algorithm, or a pointer not aligned to its element, aborts
// with a message naming the shape, the leading dimensions and the alignments; with an epilogue,
// run() returns false instead (remembered too), and the caller runs the GEMM without it and the
// epilogue as a kernel.
// Threading: one thread at a time (the backend's). The workspace (32 MiB, allocated at
// construction) is used in stream order on the one stream given to run().
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace ltm {

// What cuBLASLt applies to the product before storing D.
enum class LtEpilogue : uint8_t { kNone = 0, kBias = 1, kGeluBias = 2 };

class LtGemm {
 public:
  explicit LtGemm(int device);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // type: CUDA_R_16BF or CUDA_R_16F (A and B); d_type: CUDA_R_32F or `type`. bias: [m] of
  // d_type, null for kNone. False only when an epilogue was asked for and no algorithm does it
  // (nothing was enqueued).
  bool run(const void* a, bool a_trans, const void* b, void* d, cudaDataType_t d_type, int64_t m,
           int64_t n, int64_t k, cudaDataType_t type, float beta, LtEpilogue epilogue,
           const void* bias, cudaStream_t stream);
  // The former float32-output form (no epilogue).
  void run(const void* a, bool a_trans, const void* b, float* d, int64_t m, int64_t n, int64_t k,
           cudaDataType_t type, float beta, cudaStream_t stream) {
    run(a, a_trans, b, d, CUDA_R_32F, m, n, k, type, beta, LtEpilogue::kNone, nullptr, stream);
  }

  // Shapes planned so far (tests: a repeated shape must not plan again).
  size_t cached_plans() const { return plans_.size(); }

 private:
  // m, n, k, type, a_trans, beta != 0, d_type, epilogue, alignment of a, b, d, bias (bytes,
  // powers of two <= 16; the bias's 0 without one).
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, bool, int, int, uint32_t, uint32_t,
                         uint32_t, uint32_t>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // false: no algorithm does this epilogue (run() returns false)
  };
  // bias: the pointer whose alignment the heuristic assumes (null without an epilogue).
  Plan& plan(const Key& key, const void* bias);

  int device_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace ltm
