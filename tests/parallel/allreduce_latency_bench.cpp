// All-reduce latency: MpiCommunicator (non-blocking + watchdog polling) against a plain blocking
// MPI_Allreduce, for one GPT-2 small activation row (768 floats) by default.
//
//   mpirun -n 2 allreduce_latency_bench [floats=768] [iterations=20000]
//
// Prints, on rank 0, the median and 99th percentile per call for each variant. Both sides of the
// comparison alternate in blocks so that drift in machine load affects them alike.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "parallel/world.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median_us;
  double p99_us;
};

Stats stats(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return Stats{samples[samples.size() / 2], samples[samples.size() * 99 / 100]};
}

}  // namespace

int main(int argc, char** argv) {
  ltm::parallel::MpiWorld world(&argc, &argv);
  const size_t count = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 768;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 20000;
  std::vector<float> data(count, 1.0f);

  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  struct Variant {
    std::string name;
    std::function<void()> run;
    std::vector<double> samples;
  };
  std::vector<Variant> variants;
  variants.push_back({"MPI_Allreduce (blocking, no watchdog)",
                      [&] {
                        MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT,
                                      MPI_SUM, raw);
                      },
                      {}});
  std::vector<std::unique_ptr<ltm::parallel::MpiCommunicator>> comms;
  for (double spin_us : {50.0, 200.0, 1000.0, 5000.0}) {
    ltm::parallel::WatchdogOptions options;
    options.spin_s = spin_us * 1e-6;
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    comms.push_back(std::make_unique<ltm::parallel::MpiCommunicator>(comm, "world", options));
    auto* c = comms.back().get();
    variants.push_back(
        {"MpiCommunicator, spin " + std::to_string(static_cast<int>(spin_us)) + " us",
         [&, c] { c->all_reduce_sum(data.data(), count); },
         {}});
  }

  constexpr int kBlock = 500;
  for (int done = 0; done < iterations; done += kBlock) {
    for (auto& v : variants) {
      MPI_Barrier(raw);
      for (int i = 0; i < kBlock; ++i) {
        const auto t0 = Clock::now();
        v.run();
        v.samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        std::fill(data.begin(), data.end(), 1.0f);
      }
    }
  }
  if (world.rank() == 0) {
    std::printf("all-reduce of %zu floats on %d ranks, %d calls each\n", count, world.size(),
                iterations);
    for (auto& v : variants) {
      const Stats s = stats(v.samples);
      std::printf("  %-40s median %8.2f us   p99 %8.2f us\n", v.name.c_str(), s.median_us,
                  s.p99_us);
    }
  }
  comms.clear();
  MPI_Comm_free(&raw);
  return 0;
}
