#include "runtime/backend/cuda_lt_gemm.h"

#include <cublas_v2.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/cuda_check.h"
#include "runtime/backend/gemm_alignment.h"

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
uint32_t alignment(const void* p) { return pow2_alignment(reinterpret_cast<uintptr_t>(p)); }
// The same for every column of an operand with leading dimension `ld` (gemm_alignment.h).
uint32_t alignment(const void* p, int64_t ld, uint32_t element_bytes) {
  return operand_alignment(reinterpret_cast<uintptr_t>(p), ld, element_bytes);
}

const char* type_name(cudaDataType_t t) {
  return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "fp16" : "f32";
}

const char* epilogue_name(LtEpilogue e) {
  return e == LtEpilogue::kBias ? ", bias" : e == LtEpilogue::kGeluBias ? ", bias + GELU" : "";
}

}  // namespace

LtGemm::LtGemm(int device) : device_(device) {
  LTM_LT_CHECK(cublasLtCreate(&handle_));
  LTM_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    if (!p.desc) continue;
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

LtGemm::Plan& LtGemm::plan(const Key& key, const void* bias) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  const auto [m, n, k, type_i, a_trans, accumulate, d_type_i, epilogue_i, align_a, align_b,
              align_d, align_bias] = key;
  const auto type = static_cast<cudaDataType_t>(type_i);
  const auto d_type = static_cast<cudaDataType_t>(d_type_i);
  const auto epilogue = static_cast<LtEpilogue>(epilogue_i);
  Plan p;
  LTM_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (epilogue != LtEpilogue::kNone) {
    const cublasLtEpilogue_t e =
        epilogue == LtEpilogue::kBias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e,
                                                sizeof(e)));
    const int32_t bias_type = d_type;  // cuBLASLt's bias is of D's type
    LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)));
    // The heuristic reads the bias pointer's alignment (run() sets the actual one each call).
    LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  }
  const cublasOperation_t op_a = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                              sizeof(op_a)));
  LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                              sizeof(op_b)));
  const int64_t lda = a_trans ? k : m;
  LTM_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, a_trans ? k : m, a_trans ? m : k, lda));
  LTM_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, k, n, k));
  LTM_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, d_type, m, n, m));

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
    if (epilogue != LtEpilogue::kNone) {  // the caller falls back to a plain GEMM + a kernel
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.d);
      cublasLtMatmulDescDestroy(p.desc);
      return plans_.emplace(key, Plan{}).first->second;
    }
    char msg[512];
    std::snprintf(msg, sizeof(msg),
                  "no %s GEMM algorithm for m=%lld n=%lld k=%lld (A %s, lda %lld, ldb %lld, "
                  "ldd %lld, D %s; pointer alignment A %u, B %u, D %u bytes%s%s): %s",
                  type_name(type), static_cast<long long>(m), static_cast<long long>(n),
                  static_cast<long long>(k), a_trans ? "transposed" : "as stored",
                  static_cast<long long>(lda), static_cast<long long>(k),
                  static_cast<long long>(m), type_name(d_type), align_a, align_b, align_d,
                  accumulate ? ", beta 1" : "", epilogue_name(epilogue),
                  s != CUBLAS_STATUS_SUCCESS ? cublasGetStatusName(s) : "none returned");
    lt_fail(msg);
  }
  (void)align_bias;  // part of the key: the heuristic saw the bias pointer itself
  p.algo = result.algo;
  p.found = true;
  return plans_.emplace(key, p).first->second;
}

bool LtGemm::run(const void* a, bool a_trans, const void* b, void* d, cudaDataType_t d_type,
                 int64_t m, int64_t n, int64_t k, cudaDataType_t type, float beta,
                 LtEpilogue epilogue, const void* bias, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0) lt_fail("empty GEMM reached LtGemm::run");
  if (d_type != CUDA_R_32F && d_type != type) lt_fail("LtGemm::run: D is neither f32 nor A's type");
  if ((epilogue == LtEpilogue::kNone) != (bias == nullptr))
    lt_fail("LtGemm::run: a bias goes with a bias epilogue, and only with one");
  const uint32_t d_elem = d_type == CUDA_R_32F ? 4 : 2;
  // Pointer and leading dimension together (ld: A m or k, B k, D m; see the header).
  const uint32_t align_a = alignment(a, a_trans ? k : m, 2), align_b = alignment(b, k, 2);
  const uint32_t align_d = alignment(d, m, d_elem);
  const uint32_t align_bias = bias ? alignment(bias) : 0;
  if (align_a < 2 || align_b < 2 || align_d < d_elem || (bias && align_bias < d_elem)) {
    char msg[320];
    std::snprintf(msg, sizeof(msg),
                  "%s GEMM m=%lld n=%lld k=%lld: operands not aligned to their elements "
                  "(A %u, B %u bytes: need 2; D %u, bias %u: need %u)",
                  type_name(type), static_cast<long long>(m), static_cast<long long>(n),
                  static_cast<long long>(k), align_a, align_b, align_d, align_bias, d_elem);
    lt_fail(msg);
  }
  Plan& p = plan(Key{m, n, k, static_cast<int>(type), a_trans, beta != 0.0f,
                     static_cast<int>(d_type), static_cast<int>(epilogue), align_a, align_b,
                     align_d, align_bias},
                 bias);
  if (!p.found) return false;
  if (bias) {
    LTM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  }
  const float alpha = 1.0f;
  LTM_LT_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d,
                              &p.algo, workspace_, workspace_bytes_, stream));
  return true;
}

}  // namespace ltm
