// The connection flags ltm-client and ltm-loadgen share: TLS (server verification, a client
// certificate for mutual TLS) and the API key sent as "authorization: Bearer <key>".
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include <boost/program_options.hpp>

namespace ltm {

struct ConnectionOptions {
  std::string server;           // HOST:PORT
  bool tls = false;             // --tls (implied by any other --tls-* flag)
  std::string tls_ca;           // PEM roots that sign the server's certificate (default: system's)
  std::string tls_cert;         // client certificate (mutual TLS)
  std::string tls_key;          // its key
  std::string tls_server_name;  // name to verify instead of HOST
  std::string api_key_file;
};

// Adds --server, --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --api-key-file.
void add_connection_options(boost::program_options::options_description& desc,
                            ConnectionOptions* o);

struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::string api_key;
  // Adds the API key (if any) to a call's metadata; call once per ClientContext.
  void prepare(grpc::ClientContext& ctx) const {
    if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  }
};

// Builds the channel; false with `error` set when a file cannot be read.
bool connect(const ConnectionOptions& o, Connection* out, std::string* error);

}  // namespace ltm
