#include "runtime/serve/wire_precheck.h"

#include <google/protobuf/descriptor.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "runtime/text/tokenizer.h"

namespace ltm {
namespace {

using google::protobuf::FieldDescriptor;

absl::Status malformed(const google::protobuf::Descriptor& d) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", d.full_name(), " message"));
}

// Reads a base-128 varint of at most 10 bytes; false when it runs off the end or is too long.
bool read_varint(std::string_view bytes, size_t& pos, uint64_t& out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (pos >= bytes.size()) return false;
    const uint8_t b = static_cast<uint8_t>(bytes[pos++]);
    if (shift == 63 && (b & 0x7e) != 0) return false;  // more than 64 bits
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      out = v;
      return true;
    }
  }
  return false;
}

bool is_varint_type(FieldDescriptor::Type t) {
  switch (t) {
    case FieldDescriptor::TYPE_INT32: case FieldDescriptor::TYPE_INT64:
    case FieldDescriptor::TYPE_UINT32: case FieldDescriptor::TYPE_UINT64:
    case FieldDescriptor::TYPE_SINT32: case FieldDescriptor::TYPE_SINT64:
    case FieldDescriptor::TYPE_BOOL: case FieldDescriptor::TYPE_ENUM:
      return true;
    default:
      return false;
  }
}

// Whether protobuf's parser takes wire type `wire` for field `fd`. It keeps a field sent with
// any other wire type as an unknown field (one allocation each), so those count as unknown.
bool wire_type_fits(const FieldDescriptor& fd, int wire) {
  if (wire == 2 && fd.is_packable()) return true;  // packed, accepted for packed and unpacked
  switch (fd.type()) {
    case FieldDescriptor::TYPE_FIXED32: case FieldDescriptor::TYPE_SFIXED32:
    case FieldDescriptor::TYPE_FLOAT:
      return wire == 5;
    case FieldDescriptor::TYPE_FIXED64: case FieldDescriptor::TYPE_SFIXED64:
    case FieldDescriptor::TYPE_DOUBLE:
      return wire == 1;
    case FieldDescriptor::TYPE_STRING: case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
      return wire == 2;
    case FieldDescriptor::TYPE_GROUP:
      return false;  // wire types 3 and 4 are refused as malformed anyway
    default:
      return wire == 0 && is_varint_type(fd.type());
  }
}

// Elements in a packed payload of `t`; -1 when the payload is malformed.
int64_t packed_count(std::string_view payload, FieldDescriptor::Type t) {
  switch (t) {
    case FieldDescriptor::TYPE_FIXED32: case FieldDescriptor::TYPE_SFIXED32:
    case FieldDescriptor::TYPE_FLOAT:
      return payload.size() % 4 == 0 ? static_cast<int64_t>(payload.size() / 4) : -1;
    case FieldDescriptor::TYPE_FIXED64: case FieldDescriptor::TYPE_SFIXED64:
    case FieldDescriptor::TYPE_DOUBLE:
      return payload.size() % 8 == 0 ? static_cast<int64_t>(payload.size() / 8) : -1;
    default:
      break;
  }
  if (!is_varint_type(t)) return -1;
  int64_t n = 0;
  size_t pos = 0;
  uint64_t v = 0;
  while (pos < payload.size()) {
    if (!read_varint(payload, pos, v)) return -1;
    ++n;
  }
  return n;
}

}  // namespace

namespace {
constexpr int kMaxNestedMessages = 8;  // levels of submessages checked (ChatRequest has one)
absl::Status precheck_at(std::string_view bytes, const google::protobuf::Descriptor& d,
                         const PrecheckLimits& limits, int depth);
}  // namespace

absl::Status precheck_message(std::string_view bytes, const google::protobuf::Descriptor& d,
                              const PrecheckLimits& limits) {
  return precheck_at(bytes, d, limits, 0);
}

namespace {

absl::Status precheck_at(std::string_view bytes, const google::protobuf::Descriptor& d,
                         const PrecheckLimits& limits, int depth) {
  std::map<int, int64_t> counts;  // field number -> elements so far (a handful of entries)
  int64_t unknown = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    uint64_t tag = 0;
    if (!read_varint(bytes, pos, tag)) return malformed(d);
    const uint64_t number64 = tag >> 3;
    const int wire = static_cast<int>(tag & 7);
    if (number64 == 0 || number64 > 536870911) return malformed(d);
    const int number = static_cast<int>(number64);
    std::string_view payload;
    switch (wire) {
      case 0: {
        uint64_t v = 0;
        if (!read_varint(bytes, pos, v)) return malformed(d);
        break;
      }
      case 1:
        if (bytes.size() - pos < 8) return malformed(d);
        pos += 8;
        break;
      case 5:
        if (bytes.size() - pos < 4) return malformed(d);
        pos += 4;
        break;
      case 2: {
        uint64_t len = 0;
        if (!read_varint(bytes, pos, len)) return malformed(d);
        if (len > bytes.size() - pos) return malformed(d);
        payload = bytes.substr(pos, static_cast<size_t>(len));
        pos += static_cast<size_t>(len);
        break;
      }
      default:
        return malformed(d);  // groups (3, 4) and the undefined 6, 7
    }

    const FieldDescriptor* fd = d.FindFieldByNumber(number);
    if (fd == nullptr || !wire_type_fits(*fd, wire)) {
      if (++unknown > limits.max_unknown_fields)
        return absl::InvalidArgumentError(absl::StrCat(
            "the request has more than ", limits.max_unknown_fields, " unknown fields",
            fd == nullptr ? ""
                          : absl::StrCat(" (counting fields of the wrong wire type, such as ",
                                         fd->name(), " sent as wire type ", wire, ")")));
      continue;
    }
    const FieldLimit* limit = nullptr;
    for (const FieldLimit& l : limits.fields)
      if (l.number == number) limit = &l;

    int64_t added = 1;
    if (wire == 2 && fd->is_repeated() && fd->is_packable()) {
      added = packed_count(payload, fd->type());
      if (added < 0) return malformed(d);
    } else if (wire == 2) {
      if (limit != nullptr && limit->max_bytes >= 0 &&
          static_cast<int64_t>(payload.size()) > limit->max_bytes) {
        const std::string name =
            fd->is_repeated() ? absl::StrCat(fd->name(), "[", counts[number], "]") : fd->name();
        return absl::InvalidArgumentError(absl::StrCat(name, " is ", payload.size(),
                                                       " bytes long; at most ", limit->max_bytes,
                                                       " are allowed"));
      }
      if (fd->type() == FieldDescriptor::TYPE_STRING && !is_valid_utf8(payload)) {
        const std::string name =
            fd->is_repeated() ? absl::StrCat(fd->name(), "[", counts[number], "]") : fd->name();
        return absl::InvalidArgumentError(absl::StrCat(name, " is not valid UTF-8"));
      }
      // A submessage (ChatRequest.messages): its strings too, with the default limits.
      if (fd->type() == FieldDescriptor::TYPE_MESSAGE && depth < kMaxNestedMessages) {
        if (absl::Status st = precheck_at(payload, *fd->message_type(), PrecheckLimits{},
                                          depth + 1);
            !st.ok()) {
          const std::string name =
              fd->is_repeated() ? absl::StrCat(fd->name(), "[", counts[number], "]") : fd->name();
          return absl::Status(st.code(), absl::StrCat(name, ": ", st.message()));
        }
      }
    }
    int64_t& count = counts[number];
    count += added;
    if (fd->is_repeated() && limit != nullptr && limit->max_count >= 0 &&
        count > limit->max_count) {
      // Count the rest too, so the message says how many the request has.
      int64_t total = count;
      size_t p = pos;
      while (p < bytes.size()) {
        uint64_t t = 0, v = 0;
        if (!read_varint(bytes, p, t)) break;
        const int w = static_cast<int>(t & 7);
        std::string_view pl;
        if (w == 0) {
          if (!read_varint(bytes, p, v)) break;
        } else if (w == 1) {
          if (bytes.size() - p < 8) break;
          p += 8;
        } else if (w == 5) {
          if (bytes.size() - p < 4) break;
          p += 4;
        } else if (w == 2) {
          if (!read_varint(bytes, p, v) || v > bytes.size() - p) break;
          pl = bytes.substr(p, static_cast<size_t>(v));
          p += static_cast<size_t>(v);
        } else {
          break;
        }
        if (static_cast<int>(t >> 3) != number) continue;
        if (w == 2 && fd->is_packable()) {
          const int64_t n = packed_count(pl, fd->type());
          total += n > 0 ? n : 0;
        } else {
          total += 1;
        }
      }
      return absl::InvalidArgumentError(absl::StrCat(fd->name(), " has ", total, " ",
                                                     limit->unit, "; at most ", limit->max_count,
                                                     " are allowed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ltm
