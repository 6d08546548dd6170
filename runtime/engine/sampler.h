// Moved to runtime/sampling/sampler.h (the sampler lies below the backend, whose sample op runs it);
// this forwarding header keeps older includes building.
#pragma once

#include "runtime/sampling/sampler.h"
