// NumPy .npy float32 reader and writer (format spec: numpy.lib.format).
#include "runtime/model/npy.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace ltm {
namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;
constexpr int64_t kMaxNpyHeaderBytes = 1 << 20;

absl::Status io_error(const std::string& what, const std::string& path, int err) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err)));
}

absl::Status bad_file(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a float32 C-order .npy file: ", why));
}

uint32_t byteswap32(uint32_t x) {
  return (x >> 24) | ((x >> 8) & 0xFF00u) | ((x << 8) & 0xFF0000u) | (x << 24);
}

// Converts between host floats and little-endian bytes in place (a no-op on little-endian hosts).
void to_from_little_endian(float* v, size_t n) {
  if constexpr (std::endian::native == std::endian::big)
    for (size_t i = 0; i < n; ++i) v[i] = std::bit_cast<float>(byteswap32(std::bit_cast<uint32_t>(v[i])));
}

std::string shape_tuple(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// ---- Header parsing: the Python literal of a dict with three known keys ----

void skip_space(std::string_view s, size_t* i) {
  while (*i < s.size() && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n')) ++*i;
}

// The text right after `'key':` (or "key":), with leading spaces skipped; npos when absent.
size_t value_of(std::string_view h, std::string_view key) {
  for (const char quote : {'\'', '"'}) {
    std::string pattern;
    pattern.push_back(quote);
    pattern.append(key.data(), key.size());
    pattern.push_back(quote);
    size_t i = h.find(pattern);
    if (i == std::string_view::npos) continue;
    i += pattern.size();
    skip_space(h, &i);
    if (i >= h.size() || h[i] != ':') return std::string_view::npos;
    ++i;
    skip_space(h, &i);
    return i;
  }
  return std::string_view::npos;
}

absl::Status parse_header(std::string_view h, const std::string& path, std::vector<int64_t>* shape) {
  size_t i = value_of(h, "descr");
  if (i == std::string_view::npos) return bad_file(path, "header has no 'descr'");
  if (h.size() - i < 5 || (h[i] != '\'' && h[i] != '"') || h[i + 4] != h[i])
    return bad_file(path, "cannot parse 'descr'");
  const std::string_view descr = h.substr(i + 1, 3);
  if (descr != "<f4")
    return bad_file(path, absl::StrCat("dtype is '", std::string(descr), "', expected '<f4' (float32)"));

  i = value_of(h, "fortran_order");
  if (i == std::string_view::npos) return bad_file(path, "header has no 'fortran_order'");
  if (h.substr(i, 4) == "True") return bad_file(path, "Fortran order is not supported");
  if (h.substr(i, 5) != "False") return bad_file(path, "cannot parse 'fortran_order'");

  i = value_of(h, "shape");
  if (i == std::string_view::npos || i >= h.size() || h[i] != '(')
    return bad_file(path, "header has no 'shape' tuple");
  ++i;
  shape->clear();
  while (true) {
    skip_space(h, &i);
    if (i < h.size() && h[i] == ')') break;
    int64_t d = 0;
    size_t digits = 0;
    while (i < h.size() && h[i] >= '0' && h[i] <= '9') {
      if (d > (int64_t{1} << 56)) return bad_file(path, "dimension too large");
      d = d * 10 + (h[i++] - '0');
      ++digits;
    }
    if (digits == 0) return bad_file(path, "cannot parse 'shape'");
    shape->push_back(d);
    skip_space(h, &i);
    if (i < h.size() && h[i] == ',') {
      ++i;
      continue;
    }
    if (i < h.size() && h[i] == ')') break;
    return bad_file(path, "cannot parse 'shape'");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status write_npy_f32(const std::string& path, std::span<const float> data,
                           std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("write_npy_f32 ", path, ": negative dimension in shape ", shape_tuple(shape)));
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / d)
      return absl::InvalidArgumentError(absl::StrCat("write_npy_f32 ", path, ": shape too large"));
    count *= d;
  }
  if (count != static_cast<int64_t>(data.size()))
    return absl::InvalidArgumentError(absl::StrCat("write_npy_f32 ", path, ": shape ",
                                                   shape_tuple(shape), " holds ", count,
                                                   " values but ", data.size(), " were given"));

  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ",
                                    shape_tuple(shape), ", }");
  // magic(6) + version(2) + header length(2) + header + padding + '\n' = multiple of 64.
  const size_t unpadded = kMagicLen + 2 + 2 + header.size() + 1;
  header.append((kAlign - unpadded % kAlign) % kAlign, ' ');
  header.push_back('\n');
  if (header.size() > 0xFFFF)  // about 3,000 dimensions: a shape no array of ours has
    return absl::InvalidArgumentError(absl::StrCat("write_npy_f32 ", path, ": shape of ",
                                                   shape.size(), " dimensions: the header is over "
                                                   "the 65535 bytes of format 1.0"));
  LTM_ASSERT((kMagicLen + 4 + header.size()) % kAlign == 0);  // the padding above

  std::string bytes(kMagic, kMagicLen);
  bytes.push_back('\x01');
  bytes.push_back('\x00');
  bytes.push_back(static_cast<char>(header.size() & 0xFF));
  bytes.push_back(static_cast<char>(header.size() >> 8));
  bytes += header;

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("open for writing", path, errno);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if constexpr (std::endian::native == std::endian::little) {
    out.write(reinterpret_cast<const char*>(data.data()),
              static_cast<std::streamsize>(data.size_bytes()));
  } else {
    std::vector<float> le(data.begin(), data.end());
    to_from_little_endian(le.data(), le.size());
    out.write(reinterpret_cast<const char*>(le.data()), static_cast<std::streamsize>(data.size_bytes()));
  }
  out.close();
  if (!out) return io_error("write", path, errno ? errno : EIO);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::vector<float>, std::vector<int64_t>>> read_npy_f32(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("open", path, errno);
  char pre[kMagicLen + 2];
  if (!in.read(pre, sizeof(pre)) || std::memcmp(pre, kMagic, kMagicLen) != 0)
    return bad_file(path, "no NUMPY magic");
  const int major = static_cast<unsigned char>(pre[kMagicLen]);
  if (major < 1 || major > 3)
    return bad_file(path, absl::StrCat("unsupported format version ", major));
  unsigned char len_bytes[4] = {};
  const int len_size = major == 1 ? 2 : 4;
  if (!in.read(reinterpret_cast<char*>(len_bytes), len_size)) return bad_file(path, "truncated header");
  int64_t header_len = 0;
  for (int b = len_size - 1; b >= 0; --b) header_len = (header_len << 8) | len_bytes[b];
  if (header_len > kMaxNpyHeaderBytes) return bad_file(path, "header too long");
  std::string header(static_cast<size_t>(header_len), '\0');
  if (!in.read(header.data(), header_len)) return bad_file(path, "truncated header");

  std::pair<std::vector<float>, std::vector<int64_t>> result;
  LTM_RETURN_IF_ERROR(parse_header(header, path, &result.second));
  int64_t count = 1;
  for (int64_t d : result.second) {
    if (d != 0 && count > (int64_t{1} << 40) / d) return bad_file(path, "shape too large");
    count *= d;
  }
  std::vector<float>& data = result.first;
  data.resize(static_cast<size_t>(count));
  if (!in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(count * sizeof(float))))
    return bad_file(path, absl::StrCat("data shorter than the ", count, " values of its shape"));
  if (in.peek() != std::char_traits<char>::eof())
    return bad_file(path, "data longer than its shape");
  to_from_little_endian(data.data(), data.size());
  return result;
}

}  // namespace ltm
