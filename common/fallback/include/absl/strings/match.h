// GPU-only build: abseil's header of this name, served by common/fallback/absl_subset.h.
#pragma once
#include "common/fallback/absl_subset.h"
