// The one TLS channel-credential builder: the CLI's channels and the tests' use it.
#ifndef CALIPER_CLIENT_CHANNEL_CREDENTIALS_H_
#define CALIPER_CLIENT_CHANNEL_CREDENTIALS_H_

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>

namespace caliper {

// TLS channel credentials trusting `ca_pem` (empty: system roots),
// presenting a client certificate when both cert and key are given.
std::shared_ptr<grpc::ChannelCredentials> MakeTlsChannelCredentials(const std::string& ca_pem,
                                                                    const std::string& cert_pem,
                                                                    const std::string& key_pem);

}  // namespace caliper

#endif  // CALIPER_CLIENT_CHANNEL_CREDENTIALS_H_
