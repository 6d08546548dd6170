// mma.sync.m16n8k16 with float32 accumulators: D = A B + C on the tensor cores, 16-bit inputs
// (bf16 when kBf16, else fp16), for the kernels that multiply whole fragments in registers
// (attention_prefill_mma.cu, int8_gemm.cu's int8 x fp16 GEMM). The fragment layouts are PTX's
// ("Matrix fragments for mma.m16n8k16"), written out in attention_mma.h's header; the CPU tests
// emulate the instruction from them (tests/kernels/host_mma.h). Device code only.
#pragma once

#include <cstdint>

namespace ltm::kernels::cuda {

#if defined(__CUDACC__)
template <bool kBf16>
__device__ __forceinline__ void mma_16816(const uint32_t a[4], const uint32_t b[2], float c[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();  // the launchers never pick these kernels below compute capability 8.0
#endif
}

// A lane of a warp on the device, for warp code written over a lane type (attention_mma.h,
// int8_mma.h) that the CPU tests run with all 32 lanes of a warp (tests/kernels/host_mma.h's
// HostWarp): `each` runs f(lane state, lane index) on this lane, `mma` builds this lane's A and B
// fragments and multiplies into the accumulators c_fn returns.
template <class LaneT>
struct DeviceWarp {
  LaneT st;
  int lane;

  template <class F>
  __device__ __forceinline__ void each(F&& f) {
    f(st, lane);
  }
  template <bool kBf16, class A, class B, class C>
  __device__ __forceinline__ void mma(A&& a_fn, B&& b_fn, C&& c_fn) {
    uint32_t a[4], b[2];
    a_fn(st, lane, a);
    b_fn(st, lane, b);
    mma_16816<kBf16>(a, b, c_fn(st));
  }
};
#endif

}  // namespace ltm::kernels::cuda
