// GPU-only build without spdlog: served by common/fallback/spdlog_subset.h.
#pragma once
#include "common/fallback/spdlog_subset.h"
