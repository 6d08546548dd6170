// GPU-only build: Boost.Program_options's header, served by common/fallback/program_options_subset.h.
#pragma once
#include "common/fallback/program_options_subset.h"
