#include "client/channel_credentials.h"

namespace caliper {

std::shared_ptr<grpc::ChannelCredentials> MakeTlsChannelCredentials(const std::string& ca_pem,
                                                                    const std::string& cert_pem,
                                                                    const std::string& key_pem) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_pem;
  if (!cert_pem.empty() && !key_pem.empty()) {
    ssl.pem_cert_chain = cert_pem;
    ssl.pem_private_key = key_pem;
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace caliper
