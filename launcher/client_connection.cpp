#include "launcher/client_connection.h"

#include <fstream>
#include <sstream>

#include "runtime/serve/auth.h"

namespace ltm {
namespace po = boost::program_options;

void add_connection_options(po::options_description& desc, ConnectionOptions* o) {
  desc.add_options()
      ("server", po::value(&o->server)->required(), "server address, HOST:PORT")
      ("tls", po::bool_switch(&o->tls), "connect with TLS (the server runs with --tls-cert)")
      ("tls-ca", po::value(&o->tls_ca), "PEM CA certificate(s) to verify the server with (default: the system's); implies --tls")
      ("tls-cert", po::value(&o->tls_cert), "PEM client certificate for mutual TLS; implies --tls")
      ("tls-key", po::value(&o->tls_key), "PEM key of --tls-cert")
      ("tls-server-name", po::value(&o->tls_server_name), "name the server's certificate must carry (default: HOST)")
      ("api-key-file", po::value(&o->api_key_file), "send the key in this file as \"authorization: Bearer <key>\"");
}

namespace {

bool read_file(const std::string& path, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot be read";
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

bool connect(const ConnectionOptions& o, Connection* out, std::string* error) {
  if (!o.api_key_file.empty()) {
    absl::StatusOr<std::string> key = read_api_key_file(o.api_key_file);
    if (!key.ok()) {
      *error = std::string(key.status().message());
      return false;
    }
    out->api_key = std::move(*key);
  }
  const bool tls = o.tls || !o.tls_ca.empty() || !o.tls_cert.empty() || !o.tls_key.empty() ||
                   !o.tls_server_name.empty();
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    *error = "give --tls-cert and --tls-key together";
    return false;
  }
  if (!tls) {
    out->channel = grpc::CreateChannel(o.server, grpc::InsecureChannelCredentials());
    return true;
  }
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_ca.empty() && !read_file(o.tls_ca, &ssl.pem_root_certs, error)) return false;
  if (!o.tls_cert.empty() && (!read_file(o.tls_cert, &ssl.pem_cert_chain, error) ||
                              !read_file(o.tls_key, &ssl.pem_private_key, error)))
    return false;
  grpc::ChannelArguments args;
  if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  out->channel = grpc::CreateCustomChannel(o.server, grpc::SslCredentials(ssl), args);
  return true;
}

}  // namespace ltm
