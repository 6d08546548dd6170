// RngCore (runtime/sampling/rng_core.h), the generator the host sampler and the GPU sampler share:
// its host instantiation must give exactly the stream ltm has always drawn (fixed values below,
// taken from the generator before it moved into the shared header), and ltm::Rng must be it.
#include "runtime/sampling/rng_core.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "runtime/engine/engine.h"
#include "runtime/sampling/sampler.h"

namespace ltm {
namespace {

struct Golden {
  uint64_t seed;
  int64_t token_index;
  uint64_t draws[3];  // the first three next_u64() of Rng::for_token(seed, token_index)
};

constexpr Golden kGolden[] = {
    {0x0000000000000000ull, 0, {0x99ec5f36cb75f2b4ull, 0xbf6e1f784956452aull, 0x1a5f849d4933e6e0ull}},
    {0x0000000000000000ull, 1, {0xfc72158253f7415eull, 0x1fdd9141b20d58b1ull, 0x01e47fb3be09449eull}},
    {0x0000000000000000ull, 7, {0x52220081a673dac9ull, 0x4e5d520fdb13e1b4ull, 0x43ec5fe6bb8ec5f0ull}},
    {0x0000000000000000ull, 1000000,
     {0x14d608399dd6873cull, 0x09dd672e6eabeabcull, 0x5706092e38b13db5ull}},
    {0x0000000000000001ull, 0, {0xbed39bb864d51ef8ull, 0x2570d86f5d876711ull, 0xb4074c4963953840ull}},
    {0x0000000000000001ull, 1, {0xd3c0b77ee810f309ull, 0xfd1764a90978782full, 0x3807cd862f84671full}},
    {0x0000000000000001ull, 7, {0x19eb3585a34a579bull, 0x2eea34e0927123d7ull, 0x7bfe5badb13e0f17ull}},
    {0x0000000000000001ull, 1000000,
     {0xeef92377c205cfe3ull, 0x6d3c7a8f86807263ull, 0xb803f7a4623d2dfbull}},
    {0x000000000000002aull, 0, {0xa079be94a9a52920ull, 0xefcbdb5ddc36f0b2ull, 0xadc037b39358fe9aull}},
    {0x000000000000002aull, 1, {0x9decee091fd40470ull, 0xed0f13ae6a7f8f77ull, 0x01acef379802af21ull}},
    {0x000000000000002aull, 7, {0x14272375a85d05e4ull, 0xa70bc9f08ead23ceull, 0xbd917460e1505a4cull}},
    {0x000000000000002aull, 1000000,
     {0xf9acd64df4d30b3cull, 0xab841b32cb16aa71ull, 0x8d5ee5a138805bfdull}},
    {0xdeadbeefcafef00dull, 0, {0xb97eccea85a713cfull, 0x4e1fb73a7c6bca3cull, 0xfaefc5d151a754d0ull}},
    {0xdeadbeefcafef00dull, 1, {0x619b56c481d99088ull, 0x062c4cf2882851d5ull, 0xb0f2aef5848e3f89ull}},
    {0xdeadbeefcafef00dull, 7, {0xf0f80dcea646c3dcull, 0xcb7148ee4ba78f72ull, 0x3f0a7685d0aeeceeull}},
    {0xdeadbeefcafef00dull, 1000000,
     {0xe8a0b772608cb1ecull, 0x9adeb85547a98391ull, 0x126f017e4d278cfaull}},
};

TEST(RngCore, DrawsTheFixedStream) {
  for (const Golden& g : kGolden) {
    RngCore r = RngCore::for_token(g.seed, g.token_index);
    for (uint64_t want : g.draws)
      EXPECT_EQ(r.next_u64(), want) << "seed " << g.seed << " token " << g.token_index;
  }
}

TEST(RngCore, IsTheHostSamplersGenerator) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{3}, uint64_t{0x123456789abcdefull}}) {
    for (int64_t token = 0; token < 50; ++token) {
      Rng host = Rng::for_token(seed, token);
      RngCore core = RngCore::for_token(seed, token);
      for (int i = 0; i < 20; ++i) {
        const double u = host.uniform();
        EXPECT_EQ(u, core.uniform());
        EXPECT_GE(u, 0.0);
        EXPECT_LT(u, 1.0);
      }
    }
  }
  // Seeding directly, as a request's own Rng does.
  Rng host(77);
  RngCore core = RngCore::seeded(77);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(host.next_u64(), core.next_u64());
}

// RngCore::for_step is the engine's per-token stream (token_rng), which the CUDA sampler derives
// on the device: the reference is the engine's formula as it was written before it moved.
TEST(RngCore, ForStepIsTheEnginesTokenStream) {
  const auto reference = [](uint64_t seed, int32_t token_index) {
    uint64_t x = seed ^ (0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(token_index) + 1));
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return Rng(x ^ (x >> 31));
  };
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, uint64_t{0xdeadbeefcafef00dull}}) {
    for (int32_t token : {0, 1, 7, 1000000, -1}) {
      Rng want = reference(seed, token);
      Rng host = Rng::for_step(seed, token);
      Rng engine = token_rng(seed, token);
      RngCore core = RngCore::for_step(seed, token);
      for (int i = 0; i < 10; ++i) {
        const uint64_t w = want.next_u64();
        EXPECT_EQ(host.next_u64(), w) << "seed " << seed << " token " << token;
        EXPECT_EQ(engine.next_u64(), w);
        EXPECT_EQ(core.next_u64(), w);
      }
    }
  }
}

TEST(RngCore, UniformUsesTheTop53Bits) {
  RngCore a = RngCore::for_token(5, 9);
  RngCore b = a;
  const uint64_t bits = a.next_u64();
  EXPECT_EQ(b.uniform(), static_cast<double>(bits >> 11) / 9007199254740992.0);
}

}  // namespace
}  // namespace ltm
