// Loopback HTTP/2 peers that hold a gRPC server's resources as an attacker would: connections
// that never open a stream, Observe streams that never send, and messages that stall halfway or
// trickle a byte at a time. They answer SETTINGS and PING (live peers, not dead ones), so only
// the server's own limits can end them; each stream's end and trailers are recorded.
#ifndef CALIPER_TESTS_SUPPORT_HOSTILE_PEERS_H_
#define CALIPER_TESTS_SUPPORT_HOSTILE_PEERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace caliper::testing {

enum class HostileMode {
  kIdleConnection,  // preface and SETTINGS, then nothing
  kIdleStream,      // an Observe stream's HEADERS, then nothing
  kStalledMessage,  // a message declaring `declared_bytes`, half of it sent, then nothing
  kTrickle,         // a message declaring `declared_bytes`, one byte every `trickle_ms`
};

struct HostileCounts {
  int connections = 0;         // opened
  int closed = 0;              // closed or sent GOAWAY by the server
  int streams_ended = 0;       // trailers or RST_STREAM received
  int ended_with_reason = 0;   // trailers that contain `reason` (see Count)
};

class HostilePeers {
 public:
  explicit HostilePeers(int port, int64_t declared_bytes = 1 << 20, int trickle_ms = 100);
  ~HostilePeers();  // closes every socket, stops the pump thread

  // Opens `count` peers of `mode` to 127.0.0.1:port; false when a connect fails.
  bool Open(HostileMode mode, int count);
  HostileCounts Count(HostileMode mode, const std::string& reason = "") const;

 private:
  struct Peer;
  void Pump();

  const int port_;
  const int64_t declared_bytes_;
  const int trickle_ms_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::atomic<bool> stop_{false};
  std::thread pump_;
};

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_HOSTILE_PEERS_H_
