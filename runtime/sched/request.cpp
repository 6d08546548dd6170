#include "runtime/sched/request.h"

namespace ltm {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "NONE";
    case FinishReason::kLength: return "LENGTH";
    case FinishReason::kStop: return "STOP";
    case FinishReason::kEos: return "EOS";
    case FinishReason::kCancelled: return "CANCELLED";
    case FinishReason::kError: return "ERROR";
  }
  return "?";
}

}  // namespace ltm
