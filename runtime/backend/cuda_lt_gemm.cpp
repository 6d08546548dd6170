#include "runtime/backend/cuda_lt_gemm.h"

#include <cublas_v2.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/cuda_check.h"

namespace ltm {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what NVIDIA suggests for Hopper

[[noreturn]] void lt_fail(const char* what) {
  char host[256] = "unknown-host";
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "ltm: %s: cuBLASLt: %s\n", host, what);
  std::fflush(stderr);
  std::abort();
}

#define LTM_LT_CHECK(expr)                                                           \
  do {                                                                               \
    const cublasStatus_t _s = (expr);                                                \
    if (_s != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                                  \
      char _msg[512];                                                                \
      std::snprintf(_msg, sizeof(_msg), "%s (%s) at %s:%d", cublasGetStatusName(_s), \
                    #expr, __FILE__, __LINE__);                                      \
      lt_fail(_msg);                                                                 \
    }                                                                                \
  } while (0)

// The largest power of two (<= 16, the most any cuBLASLt kernel asks for) dividing the address.
uint32_t alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 1;
  while (a < 16 && v % (2 * a) == 0) a *= 2;
  return a;
}

const char* type_name(cudaDataType_t t) { return t == CUDA_R_16BF ? "bf16" : "fp16"; }

}  // namespace

LtGemm::LtGemm(int device) : device_(device) {
  LTM_LT_CHECK(cublasLtCreate(&handle_));
  LTM_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cudaSetDevice(device_);
  cudaDeviceSynchronize();  // the workspace may still be in use by enqueued GEMMs
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

const LtGemm::Plan& LtGemm::plan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  const auto [m, n, k, type_i, a_trans, accumulate, align_a, align_b, align_d] = key;
  const auto type = static_cast<cudaDataType_t>(type_i);
  Plan p;
  LTM_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                              sizeof(op_a)));
  LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                              sizeof(op_b)));
  const int64_t lda = a_trans ? k : m;
  LTM_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, a_trans ? k : m, a_trans ? m : k, lda));
  LTM_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, k, n, k));
  LTM_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, m, n, m));

  cublasLtMatmulPreference_t pref = nullptr;
  LTM_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  LTM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  LTM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  LTM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  LTM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  LTM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d,
                                                          pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    char msg[512];
    std::snprintf(msg, sizeof(msg),
                  "no %s GEMM algorithm for m=%lld n=%lld k=%lld (A %s, lda %lld, ldb %lld, "
                  "ldd %lld; pointer alignment A %u, B %u, D %u bytes%s): %s",
                  type_name(type), static_cast<long long>(m), static_cast<long long>(n),
                  static_cast<long long>(k), a_trans ? "transposed" : "as stored",
                  static_cast<long long>(lda), static_cast<long long>(k),
                  static_cast<long long>(m), align_a, align_b, align_d,
                  accumulate ? ", beta 1" : "",
                  s != CUBLAS_STATUS_SUCCESS ? cublasGetStatusName(s) : "none returned");
    lt_fail(msg);
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void LtGemm::run(const void* a, bool a_trans, const void* b, float* d, int64_t m, int64_t n,
                 int64_t k, cudaDataType_t type, float beta, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0) lt_fail("empty GEMM reached LtGemm::run");
  const uint32_t align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
  if (align_a < 2 || align_b < 2 || align_d < 4) {
    char msg[256];
    std::snprintf(msg, sizeof(msg),
                  "%s GEMM m=%lld n=%lld k=%lld: operands not aligned to their elements "
                  "(A %u, B %u bytes: need 2; D %u: need 4)",
                  type_name(type), static_cast<long long>(m), static_cast<long long>(n),
                  static_cast<long long>(k), align_a, align_b, align_d);
    lt_fail(msg);
  }
  const Plan& p =
      plan(Key{m, n, k, static_cast<int>(type), a_trans, beta != 0.0f, align_a, align_b, align_d});
  const float alpha = 1.0f;
  LTM_LT_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d,
                              &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace ltm
