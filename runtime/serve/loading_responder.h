#pragma once
// The HTTP front door's stand-in while the model loads: rank 0 binds --http before it loads the
// checkpoint and answers every request with 503 and Retry-After (GET /health:
// {"status":"loading"}; anything else an OpenAI error object with code "loading"), so that a
// load balancer or a client sees "not ready yet" instead of a refused connection. It closes just
// before the real HttpServer binds the same address. One thread, one connection at a time,
// bounded reads with a short timeout: a client cannot hold it.

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ltm {

class LoadingResponder {
 public:
  // Unavailable when the address cannot be bound (the real server would fail the same way later,
  // with the same message).
  static absl::StatusOr<std::unique_ptr<LoadingResponder>> start(const std::string& address);
  ~LoadingResponder();  // stops answering and releases the port
  LoadingResponder(const LoadingResponder&) = delete;
  LoadingResponder& operator=(const LoadingResponder&) = delete;

 private:
  struct State;
  explicit LoadingResponder(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace ltm
