// This process's resident memory, as the kernel counts it (/proc/self/status): what a rank's
// memory report and ltm-bench print beside the weight and KV cache bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace ltm {

namespace memory_detail {
// A "Vm...:   123 kB" field of /proc/self/status in bytes; 0 where it cannot be read.
inline uint64_t status_field(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      unsigned long long v = 0;
      if (std::sscanf(line + n + 1, "%llu", &v) == 1) kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}
}  // namespace memory_detail

// Resident set size now (VmRSS) and its peak over the process's life (VmHWM), in bytes.
inline uint64_t resident_bytes() { return memory_detail::status_field("VmRSS"); }
inline uint64_t peak_resident_bytes() { return memory_detail::status_field("VmHWM"); }

}  // namespace ltm
