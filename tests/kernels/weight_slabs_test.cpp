// WeightSlabs (runtime/backend/weight_slabs.h): the CPU backend's packed-weight memory; and its
// KV cache memory (map_huge_pages, CpuBackend::alloc_kv_cache).
#include "runtime/backend/weight_slabs.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/backend/cpu_backend.h"

namespace ltm {
namespace {

uintptr_t addr(const DeviceBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); }

bool mapped(uintptr_t page) {
  // msync on an unmapped range fails with ENOMEM.
  return msync(reinterpret_cast<void*>(page), 4096, MS_ASYNC) == 0 || errno != ENOMEM;
}

// The line of the mapping holding `a` in /proc/self/smaps that starts with `key` ("" if none).
std::string smaps_line(uintptr_t a, const std::string& key) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind(key, 0) == 0) return line;
  }
  return "";
}

// Its VmFlags line, and its Rss in bytes (-1 if none).
std::string vm_flags(uintptr_t a) { return smaps_line(a, "VmFlags:"); }
int64_t rss_bytes(uintptr_t a) {
  const std::string line = smaps_line(a, "Rss:");
  if (line.empty()) return -1;
  std::istringstream v(line.substr(4));
  int64_t kb = -1;
  v >> kb;
  return kb * 1024;
}

TEST(WeightSlabs, PiecesArePageAlignedZeroedAndDisjoint) {
  WeightSlabs slabs;
  const std::vector<size_t> sizes = {1, 4096, 4097, 1 << 20, (2 << 20) + 5, 300000, 64};
  std::vector<DeviceBuffer> pieces;
  for (size_t s : sizes) pieces.push_back(slabs.take(s));
  for (size_t i = 0; i < pieces.size(); ++i) {
    ASSERT_EQ(pieces[i].bytes(), sizes[i]);
    EXPECT_EQ(addr(pieces[i]) % WeightSlabs::kPieceAlign, 0u);
    const auto* p = static_cast<const unsigned char*>(pieces[i].data());
    EXPECT_TRUE(std::all_of(p, p + sizes[i], [](unsigned char c) { return c == 0; })) << i;
    std::memset(pieces[i].data(), static_cast<int>(i + 1), sizes[i]);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {  // no piece wrote over another
    const auto* p = static_cast<const unsigned char*>(pieces[i].data());
    EXPECT_TRUE(std::all_of(p, p + sizes[i], [&](unsigned char c) { return c == i + 1; })) << i;
  }
}

TEST(WeightSlabs, SmallPiecesShareA2MiBAlignedHugePageSlab) {
  WeightSlabs slabs;
  DeviceBuffer a = slabs.take(1 << 20), b = slabs.take(1 << 20), c = slabs.take(1 << 20);
  // End to end in one slab, the first at a huge page boundary (a 1.9 MiB tensor alone would
  // never fill one huge page).
  EXPECT_EQ(addr(a) % WeightSlabs::kHugePage, 0u);
  EXPECT_EQ(addr(b), addr(a) + (1 << 20));
  EXPECT_EQ(addr(c), addr(b) + (1 << 20));
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const std::string flags = vm_flags(addr(a));
  ASSERT_FALSE(flags.empty());
  EXPECT_NE(flags.find(" hg"), std::string::npos) << "no MADV_HUGEPAGE: " << flags;
}

TEST(WeightSlabs, APieceLargerThanASlabHasItsOwnAndTheSharedOneGoesOn) {
  WeightSlabs slabs;
  DeviceBuffer small = slabs.take(4096);
  DeviceBuffer big = slabs.take(WeightSlabs::kSlabBytes + 1);
  DeviceBuffer next = slabs.take(4096);
  EXPECT_EQ(addr(big) % WeightSlabs::kHugePage, 0u);
  EXPECT_EQ(addr(next), addr(small) + 4096);
  static_cast<unsigned char*>(big.data())[WeightSlabs::kSlabBytes] = 7;  // all of it is there
}

TEST(WeightSlabs, ASlabIsUnmappedWithItsLastPiece) {
  WeightSlabs slabs;
  DeviceBuffer a = slabs.take(4096);
  DeviceBuffer b = slabs.take(8192);
  const uintptr_t at = addr(a);
  std::memset(a.data(), 0xff, 4096);
  a = DeviceBuffer();
  EXPECT_TRUE(mapped(at));  // b still holds the slab
  b = DeviceBuffer();
  EXPECT_FALSE(mapped(at));
  DeviceBuffer c = slabs.take(4096);  // a fresh slab, zeroed
  const auto* p = static_cast<const unsigned char*>(c.data());
  EXPECT_TRUE(std::all_of(p, p + 4096, [](unsigned char x) { return x == 0; }));
}

TEST(KvCacheMemory, TheCpuBackendsCacheIsZeroOnHugePages) {
  CpuBackend backend(1);
  const size_t bytes = size_t{8} << 20;  // a layer's K of [256 blocks, 8 heads, 16, 64] f32
  DeviceBuffer k = backend.alloc_kv_cache(bytes), v = backend.alloc_kv_cache(bytes);
  for (const DeviceBuffer* b : {&k, &v}) {
    ASSERT_EQ(b->bytes(), bytes);
    EXPECT_EQ(addr(*b) % WeightSlabs::kHugePage, 0u);
    const auto* c = static_cast<const unsigned char*>(b->data());
    EXPECT_TRUE(std::all_of(c, c + bytes, [](unsigned char x) { return x == 0; }));
    if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) continue;
    const std::string flags = vm_flags(addr(*b));
    ASSERT_FALSE(flags.empty());
    EXPECT_NE(flags.find(" hg"), std::string::npos) << "no MADV_HUGEPAGE: " << flags;
  }
  // One under a huge page: the plain zeroed path.
  DeviceBuffer small = backend.alloc_kv_cache(4096);
  const auto* c = static_cast<const unsigned char*>(small.data());
  EXPECT_TRUE(std::all_of(c, c + 4096, [](unsigned char x) { return x == 0; }));
}

// --kv-resident (CpuBackend::make_resident, populate_pages): the cache's memory is resident
// whole, still zero, and what was written before stays.
TEST(KvCacheMemory, MakeResidentFaultsTheWholeCacheInAndKeepsItsContents) {
  CpuBackend backend(1);
  const size_t bytes = size_t{8} << 20;
  DeviceBuffer k = backend.alloc_kv_cache(bytes);
  auto* c = static_cast<unsigned char*>(k.data());
  c[5 << 20] = 7;  // one page in use before
  const int64_t before = rss_bytes(addr(k));
  ASSERT_GE(before, 0);
  EXPECT_LT(before, static_cast<int64_t>(bytes));  // faulted in as used, so far
  backend.make_resident(k);
  EXPECT_GE(rss_bytes(addr(k)), static_cast<int64_t>(bytes));
  EXPECT_EQ(c[5 << 20], 7);
  c[5 << 20] = 0;
  EXPECT_TRUE(std::all_of(c, c + bytes, [](unsigned char x) { return x == 0; }));
  // A range that starts and ends inside pages, under a huge page.
  DeviceBuffer small = backend.alloc_kv_cache(3 * 4096);
  populate_pages(static_cast<unsigned char*>(small.data()) + 100, 2 * 4096);
  EXPECT_GE(rss_bytes(addr(small)), 3 * 4096);
}

TEST(KvCacheMemory, MapHugePagesRoundsUpAndKeepsTheAskedSize) {
  DeviceBuffer b = map_huge_pages(3 << 20);
  EXPECT_EQ(b.bytes(), size_t{3} << 20);
  EXPECT_EQ(addr(b) % WeightSlabs::kHugePage, 0u);
  static_cast<unsigned char*>(b.data())[(4 << 20) - 1] = 1;  // the rounded-up tail is mapped
  const uintptr_t at = addr(b);
  b = DeviceBuffer();
  EXPECT_FALSE(mapped(at));
}

}  // namespace
}  // namespace ltm
