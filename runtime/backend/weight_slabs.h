// Host memory for packed weights: 2 MiB-aligned slabs that ask the kernel for transparent huge
// pages (madvise MADV_HUGEPAGE), carved into page-aligned pieces in order.
//
// Decode streams every weight once a token. On 4 KiB pages that is one TLB miss and page walk per
// 4 KiB read (a 124M-parameter int8 model: 33,000 a token); a 2 MiB page covers 512 of them. A
// huge page backs only a 2 MiB-aligned 2 MiB range wholly inside the mapping, so one mapping per
// tensor would leave every tensor under 2 MiB (GPT-2's QKV and attention projections) and the
// tail of each other on small pages: the slabs put the tensors end to end instead. Pieces are
// never reused: a slab's pages stay zero until a piece is written (alloc_weight's promise), and
// a slab is unmapped when the last piece cut from it is freed (the slabs hold no reference to
// themselves, so a model freed and loaded again does not keep the old one's memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "runtime/backend/backend.h"

namespace ltm {

// KV caches (CpuBackend::alloc_kv_cache): a fresh mapping of `bytes` (rounded up to a whole huge
// page) on a 2 MiB boundary, advised MADV_HUGEPAGE; zero, and nothing resident until touched.
// Throws std::bad_alloc.
DeviceBuffer map_huge_pages(size_t bytes);

// Faults in every page of [p, p + bytes) for writing (madvise MADV_POPULATE_WRITE, Linux 5.14
// and later), so that the memory is resident now and its use takes no page faults. The memory
// keeps its contents (a page already in use keeps its data; a fresh one is zero). Throws
// std::runtime_error naming the errno when the kernel cannot provide the memory (or, before
// 5.14, does not know the advice).
void populate_pages(void* p, size_t bytes);

class WeightSlabs {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kSlabBytes = size_t{64} << 20;  // a slab, unless one piece is larger
  static constexpr size_t kPieceAlign = 4096;

  // A zeroed, kPieceAlign-aligned piece of `bytes` (thread-safe). Throws std::bad_alloc.
  DeviceBuffer take(size_t bytes);

 private:
  std::mutex mu_;
  std::weak_ptr<void> slab_;  // the slab pieces are cut from; expired once all are freed
  uint8_t* next_ = nullptr;   // its first free byte
  uint8_t* end_ = nullptr;
};

}  // namespace ltm
