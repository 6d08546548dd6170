// NumPy .npy files of float32, for dumping activations and logits to compare with PyTorch.
//
// write_npy_f32 writes format version 1.0: magic, header dict {'descr': '<f4', 'fortran_order':
// False, 'shape': (...), } padded with spaces and a newline so that the data starts at a multiple
// of 64 bytes, then the values little-endian in C order. np.load() reads it.
// read_npy_f32 reads versions 1.0, 2.0 and 3.0 with descr '<f4' and C order (what the writer and
// np.save of a float32 array produce); anything else is an error, not a conversion.
//
// Failures are absl::Status: InvalidArgument for a shape that does not match the data or a file
// that is not a float32 C-order .npy (message names the file and the problem); the errno-derived
// code (NotFound, PermissionDenied, ...) when the file cannot be opened, read or written.
// Thread-safe (no shared state); concurrent writers to one path race like any file write.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ltm {

// `shape` may be empty (a 0-d array holding one value); every dimension must be >= 0 and their
// product must equal data.size().
absl::Status write_npy_f32(const std::string& path, std::span<const float> data,
                           std::vector<int64_t> shape);

// Returns (values in C order, shape).
absl::StatusOr<std::pair<std::vector<float>, std::vector<int64_t>>> read_npy_f32(
    const std::string& path);

}  // namespace ltm
