// The safetensors parser (runtime/model/safetensors.h) on arbitrary files: open() must refuse
// what is malformed, and every tensor of a file it accepts must lie inside the file.
#include <cstdint>
#include <cstdlib>

#include "fuzz/fuzz_util.h"
#include "runtime/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ltm::fuzz::write_file("model.safetensors", data, size);
  absl::StatusOr<ltm::SafetensorsFile> f = ltm::SafetensorsFile::open(path);
  if (!f.ok()) return 0;
  uint64_t sum = 0;
  for (const ltm::SafetensorsTensor& t : f->tensors()) {
    if (t.data_end < t.data_begin || f->data_offset() + t.data_end > f->file_size()) std::abort();
    if (t.bytes() > 0) {  // touch the first and last byte: they must be mapped
      const uint8_t* p = f->tensor_data(t);
      sum += p[0] + p[t.bytes() - 1];
    }
    if (f->find(t.name) != &t) std::abort();
  }
  return static_cast<int>(sum & 0);
}
