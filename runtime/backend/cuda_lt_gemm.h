// 16-bit GEMMs with float32 accumulation on tensor cores, through cuBLASLt (the CUDA backend's
// bf16 / fp16 weights).
//
// Column-major, as cuBLASLt sees it: D[M, N] = op(A)[M, K] * B[K, N] + beta * D, where A and B
// hold 16-bit elements of one type and D is float32 (read when beta != 0). A is stored [M, K]
// with leading dimension M (a_trans false) or [K, M] with leading dimension K (a_trans true); B
// is [K, N] with leading dimension K; D is [M, N] with leading dimension M. The CUDA backend's
// row-major C = X W is the column-major C^T = W^T X^T, i.e. A = W (not transposed), B = X.
//
// The algorithm is chosen once per (shape, type, transposition, pointer alignment) by
// cublasLtMatmulAlgoGetHeuristic, with the pointers' actual alignment as the heuristic's minimum,
// and cached with its descriptors; later calls of that shape only enqueue cublasLtMatmul. A
// shape for which cuBLASLt offers no algorithm, or a pointer not aligned to its element, aborts
// with a message naming the shape, the leading dimensions and the alignments.
// Threading: one thread at a time (the backend's). The workspace (32 MiB, allocated at
// construction) is used in stream order on the one stream given to run().
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace ltm {

class LtGemm {
 public:
  explicit LtGemm(int device);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // type: CUDA_R_16BF or CUDA_R_16F.
  void run(const void* a, bool a_trans, const void* b, float* d, int64_t m, int64_t n, int64_t k,
           cudaDataType_t type, float beta, cudaStream_t stream);

  // Shapes planned so far (tests: a repeated shape must not plan again).
  size_t cached_plans() const { return plans_.size(); }

 private:
  // m, n, k, type, a_trans, beta != 0, alignment of a, b, d (bytes, powers of two <= 16).
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, bool, uint32_t, uint32_t,
                         uint32_t>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(const Key& key);

  int device_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace ltm
