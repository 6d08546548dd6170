#include "runtime/backend/weight_slabs.h"

#include <sys/mman.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (Debian 12 has 6.1); older kernels answer EINVAL
#endif

namespace ltm {

namespace {

// A fresh mapping of `bytes` (a multiple of kHugePage) starting on a kHugePage boundary: map
// kHugePage more, then unmap the unaligned head and the tail.
uint8_t* map_aligned(size_t bytes) {
  constexpr size_t kAlign = WeightSlabs::kHugePage;
  void* p = mmap(nullptr, bytes + kAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t raw = reinterpret_cast<uintptr_t>(p);
  const uintptr_t at = (raw + kAlign - 1) / kAlign * kAlign;
  if (at > raw) munmap(p, at - raw);
  if (const size_t tail = raw + bytes + kAlign - (at + bytes); tail > 0)
    munmap(reinterpret_cast<void*>(at + bytes), tail);
  // Advice only: where THP is off ("never") the slab is on 4 KiB pages, as before.
  madvise(reinterpret_cast<void*>(at), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<uint8_t*>(at);
}

// map_aligned(size), owned: the last owner's release unmaps it.
std::shared_ptr<void> owned_mapping(size_t size) {
  uint8_t* base = map_aligned(size);
  return std::shared_ptr<void>(base, [size](void* q) { munmap(q, size); });
}

}  // namespace

DeviceBuffer map_huge_pages(size_t bytes) {
  constexpr size_t kPage = WeightSlabs::kHugePage;
  std::shared_ptr<void> own =
      owned_mapping(std::max<size_t>(kPage, (bytes + kPage - 1) / kPage * kPage));
  void* at = own.get();
  return DeviceBuffer(at, bytes, std::move(own));
}

void populate_pages(void* p, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
  throw std::runtime_error("could not make " + std::to_string(bytes) +
                           " bytes of memory resident (madvise MADV_POPULATE_WRITE: " +
                           std::strerror(errno) + ")");
}

DeviceBuffer WeightSlabs::take(size_t bytes) {
  const size_t need = (bytes + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
  // A slab of its own; the current one goes on taking small pieces.
  if (need >= kSlabBytes) return map_huge_pages(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<void> slab = slab_.lock();
  if (!slab || need > static_cast<size_t>(end_ - next_)) {
    slab = owned_mapping(kSlabBytes);
    slab_ = slab;
    next_ = static_cast<uint8_t*>(slab.get());
    end_ = next_ + kSlabBytes;
  }
  uint8_t* piece = next_;
  next_ += need;
  // The piece keeps its slab mapped (an aliasing owner: the slab's count, the piece's address).
  return DeviceBuffer(piece, bytes, std::shared_ptr<void>(slab, piece));
}

}  // namespace ltm
