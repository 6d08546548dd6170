// Memory-mapped safetensors files.
//
// Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N
// bytes of JSON header, then the data section. The header maps tensor names to
//   {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}
// with offsets relative to the data section; the optional "__metadata__" entry is ignored.
//
// SafetensorsFile::open validates everything up front, so that reading a tensor afterwards
// cannot fail: the header length fits the file, the header is a JSON object of well-formed
// entries, every dtype is one the format defines, end - begin == numel * element size, and the
// tensors tile the data section exactly (no gaps, no overlaps, nothing missing at the end).
// Tensors of dtypes ltm does not compute with (F64, I8, BOOL, ...) are kept, with `dtype` unset,
// so that callers can ignore buffers they do not need and reject the rest with a clear message.
//
// Ownership: a SafetensorsFile owns its read-only private mapping (PROT_READ, MAP_PRIVATE) and
// unmaps it on destruction; pointers into it live as long as the object (moving it keeps them
// valid). Threading: all const methods are safe to call concurrently.
// Failure: open() returns NotFound (cannot open), DataLoss (corrupt or truncated file) or
// InvalidArgument, with a message naming the file and the tensor. If the file is truncated on
// disk after open(), touching the lost pages raises SIGBUS (a property of mmap); parse() of a
// MappedFile::from_bytes copy (what the LoRA loader reads) has no such failure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/dtype.h"

namespace ltm {

// Bytes per element of a dtype the safetensors format defines ("F64", "I8", "BOOL", ...);
// 0 for a name it does not define.
int64_t safetensors_dtype_size(std::string_view name);
// The DType of "F32" / "F16" / "BF16"; nullopt for any other name.
std::optional<DType> dtype_from_name(std::string_view name);

// "[768, 2304]"
std::string shape_string(const std::vector<int64_t>& shape);

struct SafetensorsTensor {
  std::string name;             // as stored, e.g. "transformer.h.0.attn.c_attn.weight"
  std::string dtype_name;       // as stored: "F32", "BF16", "F64", "I8", ...
  std::optional<DType> dtype;   // set for the dtypes ltm reads (F32, F16, BF16)
  std::vector<int64_t> shape;   // [] for a scalar
  int64_t numel = 0;
  uint64_t data_begin = 0;      // byte offsets within the data section, end - begin = bytes
  uint64_t data_end = 0;

  uint64_t bytes() const { return data_end - data_begin; }
};

// A whole file mapped read-only, or its bytes copied into memory (from_bytes). Movable, not
// copyable; unmapped (freed) on destruction.
class MappedFile {
 public:
  // NotFound when the file cannot be opened; InvalidArgument when it is not a regular file. Never
  // blocks on a FIFO (opened O_NONBLOCK, then refused as not a regular file).
  static absl::StatusOr<MappedFile> open(const std::string& path);
  // The bytes of a file read by the caller, held in memory: nothing that later happens to the file
  // on disk can reach them. `path` names it in messages.
  static MappedFile from_bytes(std::string path, std::vector<uint8_t> bytes);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::vector<uint8_t> owned_;  // from_bytes: data_ points into it (a move keeps the buffer)
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> open(const std::string& path);
  // The same checks on a file already in memory (or mapped); messages name file.path().
  static absl::StatusOr<SafetensorsFile> parse(MappedFile file);

  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return file_.path(); }
  uint64_t file_size() const { return file_.size(); }
  uint64_t data_offset() const { return data_offset_; }  // 8 + header length
  // Every tensor of the header (any defined dtype; "__metadata__" excluded), sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  // First byte of the tensor's data in the mapping (any alignment).
  const uint8_t* tensor_data(const SafetensorsTensor& tensor) const {
    return file_.data() + data_offset_ + tensor.data_begin;
  }

 private:
  MappedFile file_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsTensor> tensors_;
};

// One tensor to write: `bytes` must hold numel * element size bytes of little-endian data.
struct SafetensorsWriteTensor {
  std::string name;
  std::string dtype_name;  // "F32", "F16", "BF16", or any other safetensors dtype
  std::vector<int64_t> shape;
  std::string_view bytes;
};

// Writes a safetensors file: header padded with spaces to 8-byte alignment, tensors laid out in
// the given order (put wider dtypes first to keep every tensor aligned to its element size).
// For tests and tools. InvalidArgument when a tensor's byte count does not match its shape;
// Internal when the file cannot be written.
absl::Status write_safetensors(const std::string& path,
                               const std::vector<SafetensorsWriteTensor>& tensors);

}  // namespace ltm
