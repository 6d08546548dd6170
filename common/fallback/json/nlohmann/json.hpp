// <nlohmann/json.hpp> for the GPU-only build where nlohmann_json is not installed
// (cmake/gpu_only.cmake puts common/fallback/json on the include path only then): our JSON subset
// (common/fallback/json_subset.h) under nlohmann's names.
#pragma once

#include "common/fallback/json_subset.h"

namespace nlohmann {
using json = ltm::json_subset::json;
using ordered_json = ltm::json_subset::ordered_json;
namespace detail {
using exception = ltm::json_subset::exception;
using value_t = ltm::json_subset::value_t;
}  // namespace detail
}  // namespace nlohmann
