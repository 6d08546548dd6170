#include "runtime/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/json_parse.h"
#include "nlohmann/json.hpp"

namespace ltm {
namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we (a header that large is a
// corrupt length field, and parsing it would only waste memory).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct DTypeInfo {
  std::string_view name;
  int64_t size;
};
constexpr DTypeInfo kSafetensorsDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
    {"F64", 8},  {"I64", 8}, {"U64", 8},
};

std::string known_dtype_list() {
  std::vector<absl::string_view> names;  // Debian's abseil: absl::string_view != std::string_view
  for (const DTypeInfo& info : kSafetensorsDTypes) {
    names.emplace_back(info.name.data(), info.name.size());
  }
  return absl::StrJoin(names, ", ");
}

absl::Status corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

absl::Status bad_entry(const std::string& path, const std::string& name, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": tensor \"", name, "\": ", what));
}

// A non-negative JSON integer that fits int64.
std::optional<uint64_t> as_index(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(INT64_MAX)) return u;
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  }
  return std::nullopt;
}

absl::StatusOr<SafetensorsTensor> parse_entry(const std::string& path, const std::string& name,
                                              const json& entry, uint64_t data_size) {
  SafetensorsTensor t;
  t.name = name;
  if (!entry.is_object()) {
    return bad_entry(path, name,
                     absl::StrCat("header entry must be an object with dtype, shape and "
                                  "data_offsets, found ",
                                  entry.type_name()));
  }
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return bad_entry(path, name, "header entry has no \"dtype\" string");
  }
  t.dtype_name = dtype_it->get<std::string>();
  const int64_t element_size = safetensors_dtype_size(t.dtype_name);
  if (element_size == 0) {
    return bad_entry(path, name,
                     absl::StrCat("unknown dtype \"", t.dtype_name,
                                  "\" (safetensors defines ", known_dtype_list(), ")"));
  }
  t.dtype = dtype_from_name(t.dtype_name);

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return bad_entry(path, name, "header entry has no \"shape\" array");
  }
  t.numel = 1;
  for (const json& dim : *shape_it) {
    const std::optional<uint64_t> d = as_index(dim);
    if (!d) {
      return bad_entry(path, name,
                       absl::StrCat("shape ", shape_it->dump(),
                                    " must hold non-negative integers"));
    }
    t.shape.push_back(static_cast<int64_t>(*d));
    if (*d != 0 && t.numel > (INT64_MAX / element_size) / static_cast<int64_t>(*d)) {
      return bad_entry(path, name, absl::StrCat("shape ", shape_it->dump(), " is too large"));
    }
    t.numel *= static_cast<int64_t>(*d);
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !as_index((*offsets_it)[0]) || !as_index((*offsets_it)[1])) {
    return bad_entry(path, name,
                     absl::StrCat("\"data_offsets\" must be [begin, end] with non-negative "
                                  "integers, found ",
                                  offsets_it == entry.end() ? "nothing" : offsets_it->dump()));
  }
  t.data_begin = *as_index((*offsets_it)[0]);
  t.data_end = *as_index((*offsets_it)[1]);
  const std::string offsets = absl::StrCat("data_offsets [", t.data_begin, ", ", t.data_end, "]");
  if (t.data_end < t.data_begin) {
    return bad_entry(path, name, absl::StrCat(offsets, " end before they begin"));
  }
  const uint64_t expected_bytes = static_cast<uint64_t>(t.numel) * element_size;
  if (t.bytes() != expected_bytes) {
    return bad_entry(path, name,
                     absl::StrCat(offsets, " hold ", t.bytes(), " bytes, but shape ",
                                  shape_string(t.shape), " of ", t.dtype_name, " needs ",
                                  t.numel, " x ", element_size, " = ", expected_bytes,
                                  " bytes"));
  }
  if (t.data_end > data_size) {
    return bad_entry(path, name,
                     absl::StrCat(offsets, " reach past the end of the data section (",
                                  data_size,
                                  " bytes): the file is truncated or its header is corrupt"));
  }
  return t;
}

}  // namespace

int64_t safetensors_dtype_size(std::string_view name) {
  for (const DTypeInfo& info : kSafetensorsDTypes) {
    if (info.name == name) return info.size;
  }
  return 0;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// ---------------------------------------------------------------------------------------------
// MappedFile

absl::StatusOr<MappedFile> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::NotFoundError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<uint64_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap of ", file.size_,
                                              " bytes failed: ", std::strerror(err)));
    }
    file.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return file;
}

MappedFile MappedFile::from_bytes(std::string path, std::vector<uint8_t> bytes) {
  MappedFile file;
  file.path_ = std::move(path);
  file.owned_ = std::move(bytes);
  file.size_ = file.owned_.size();
  file.data_ = file.owned_.empty() ? nullptr : file.owned_.data();
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owned_(std::move(other.owned_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (data_ != nullptr && owned_.empty()) ::munmap(const_cast<uint8_t*>(data_), size_);
  owned_ = {};
  data_ = nullptr;
  size_ = 0;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  LTM_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  return parse(std::move(file));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::parse(MappedFile file) {
  SafetensorsFile result;
  result.file_ = std::move(file);
  const std::string path = result.file_.path();
  const uint64_t file_size = result.file_.size();
  if (file_size < 8) {
    return corrupt(path, absl::StrCat("is ", file_size,
                                      " bytes, too short for a safetensors file (it starts with "
                                      "an 8-byte header length)"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | result.file_.data()[i];
  if (header_len > file_size - 8) {
    return corrupt(path, absl::StrCat("header length ", header_len,
                                      " (first 8 bytes) is larger than the file (", file_size,
                                      " bytes): truncated or not a safetensors file"));
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return corrupt(path, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                      kMaxSafetensorsHeaderBytes, " bytes: corrupt header length"));
  }
  result.data_offset_ = 8 + header_len;
  const uint64_t data_size = file_size - result.data_offset_;

  absl::StatusOr<json> parsed = parse_json(std::string_view(
      reinterpret_cast<const char*>(result.file_.data()) + 8, static_cast<size_t>(header_len)));
  if (!parsed.ok())
    return corrupt(path, absl::StrCat("invalid JSON header: ", parsed.status().message()));
  const json& header = *parsed;
  if (!header.is_object()) {
    return corrupt(path, absl::StrCat("the JSON header must be an object of tensors, found ",
                                      header.type_name()));
  }
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    LTM_ASSIGN_OR_RETURN(SafetensorsTensor t, parse_entry(path, name, entry, data_size));
    result.tensors_.push_back(std::move(t));
  }

  // The tensors must tile the data section: sorted by offset, each begins where the previous
  // one ended, and the last ends at the end of the file.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : result.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return std::pair(a->data_begin, a->data_end) < std::pair(b->data_begin, b->data_end);
  });
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor* t : by_offset) {
    if (t->data_begin != covered) {
      const std::string prev = previous == nullptr ? std::string("the data section begins")
                                                   : absl::StrCat("tensor \"", previous->name,
                                                                  "\" ends");
      return bad_entry(path, t->name,
                       absl::StrCat("data_offsets [", t->data_begin, ", ", t->data_end,
                                    "] begin at ", t->data_begin, " but ", prev, " at ",
                                    covered, " (tensors must tile the data section: ",
                                    t->data_begin < covered ? "overlap" : "gap", ")"));
    }
    covered = t->data_end;
    previous = t;
  }
  if (covered != data_size) {
    return corrupt(path, absl::StrCat("the data section has ", data_size,
                                      " bytes but the tensors of the header cover ", covered,
                                      " (trailing bytes: corrupt header or wrong file)"));
  }
  std::sort(result.tensors_.begin(), result.tensors_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return result;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const SafetensorsTensor& t, std::string_view n) {
                               return t.name < n;
                             });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

// ---------------------------------------------------------------------------------------------
// Writer

absl::Status write_safetensors(const std::string& path,
                               const std::vector<SafetensorsWriteTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const SafetensorsWriteTensor& t : tensors) {
    const int64_t element_size = safetensors_dtype_size(t.dtype_name);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (element_size == 0 || static_cast<uint64_t>(numel * element_size) != t.bytes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("write_safetensors ", path, ": tensor \"", t.name, "\" of ", t.dtype_name,
                       " ", shape_string(t.shape), " needs ", numel * element_size,
                       " bytes, given ", t.bytes.size()));
    }
    header[t.name] = {{"dtype", t.dtype_name},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const SafetensorsWriteTensor& t : tensors) {
    out.write(t.bytes.data(), static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("write_safetensors: cannot write ", path));
  return absl::OkStatus();
}

}  // namespace ltm
