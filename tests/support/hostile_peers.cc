#include "tests/support/hostile_peers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace caliper::testing {
namespace {

constexpr uint8_t kData = 0, kHeaders = 1, kRstStream = 3, kSettings = 4, kPing = 6,
                  kGoAway = 7;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f(9, '\0');
  const uint32_t n = static_cast<uint32_t>(payload.size());
  f[0] = static_cast<char>(n >> 16);
  f[1] = static_cast<char>(n >> 8);
  f[2] = static_cast<char>(n);
  f[3] = static_cast<char>(type);
  f[4] = static_cast<char>(flags);
  f[5] = static_cast<char>((stream >> 24) & 0x7f);
  f[6] = static_cast<char>(stream >> 16);
  f[7] = static_cast<char>(stream >> 8);
  f[8] = static_cast<char>(stream);
  return f + payload;
}

// HPACK "literal header field without indexing, new name", no Huffman (names and values < 127).
void Header(std::string* block, const std::string& name, const std::string& value) {
  block->push_back('\0');
  block->push_back(static_cast<char>(name.size()));
  *block += name;
  block->push_back(static_cast<char>(value.size()));
  *block += value;
}

std::string ObserveHeaders() {
  std::string block;
  Header(&block, ":method", "POST");
  Header(&block, ":scheme", "http");
  Header(&block, ":path", "/caliper.v1.Calibration/Observe");
  Header(&block, ":authority", "127.0.0.1");
  Header(&block, "content-type", "application/grpc");
  Header(&block, "te", "trailers");
  return Frame(kHeaders, kEndHeaders, 1, block);
}

// The gRPC message prefix: uncompressed, `length` bytes follow.
std::string MessagePrefix(int64_t length) {
  std::string p(5, '\0');
  p[1] = static_cast<char>(length >> 24);
  p[2] = static_cast<char>(length >> 16);
  p[3] = static_cast<char>(length >> 8);
  p[4] = static_cast<char>(length);
  return p;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

struct HostilePeers::Peer {
  HostileMode mode;
  int fd = -1;
  bool closed = false;  // EOF or error: no longer polled
  bool goaway = false;
  bool stream_ended = false;
  std::string in;        // unparsed bytes from the server
  std::string trailers;  // raw HPACK blocks of the stream's HEADERS (values are not Huffman)
  int64_t trickle_left = 0;
  int64_t next_trickle_ms = 0;
};

HostilePeers::HostilePeers(int port, int64_t declared_bytes, int trickle_ms)
    : port_(port), declared_bytes_(declared_bytes), trickle_ms_(trickle_ms) {
  pump_ = std::thread([this] { Pump(); });
}

HostilePeers::~HostilePeers() {
  stop_ = true;
  pump_.join();
  for (const std::unique_ptr<Peer>& peer : peers_) {
    if (peer->fd >= 0) close(peer->fd);
  }
}

bool HostilePeers::Open(HostileMode mode, int count) {
  for (int i = 0; i < count; ++i) {
    auto peer = std::make_unique<Peer>();
    peer->mode = mode;
    peer->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (peer->fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(peer->fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(peer->fd);
      return false;
    }
    const int one = 1;
    setsockopt(peer->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + Frame(kSettings, 0, 0, "");
    if (mode != HostileMode::kIdleConnection) out += ObserveHeaders();
    if (mode == HostileMode::kStalledMessage || mode == HostileMode::kTrickle) {
      // The prefix and a first byte: the server now has a read in progress.
      out += Frame(kData, 0, 1, MessagePrefix(declared_bytes_) + "\x0a");
    }
    if (mode == HostileMode::kStalledMessage) {
      // Half the message (at most the default 16 KiB frame), then silence.
      const int64_t half = std::min<int64_t>(declared_bytes_ / 2, 16000);
      out += Frame(kData, 0, 1, std::string(static_cast<size_t>(half), '\0'));
    }
    if (!SendAll(peer->fd, out)) {
      close(peer->fd);
      return false;
    }
    peer->trickle_left = declared_bytes_ - 1;
    peer->next_trickle_ms = NowMs() + trickle_ms_;
    std::lock_guard<std::mutex> lock(mu_);
    peers_.push_back(std::move(peer));
  }
  return true;
}

HostileCounts HostilePeers::Count(HostileMode mode, const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  HostileCounts counts;
  for (const std::unique_ptr<Peer>& peer : peers_) {
    if (peer->mode != mode) continue;
    ++counts.connections;
    counts.closed += peer->closed || peer->goaway ? 1 : 0;
    counts.streams_ended += peer->stream_ended ? 1 : 0;
    if (peer->stream_ended && !reason.empty() &&
        peer->trailers.find(reason) != std::string::npos) {
      ++counts.ended_with_reason;
    }
  }
  return counts;
}

void HostilePeers::Pump() {
  std::vector<pollfd> fds;
  std::vector<Peer*> polled;
  while (!stop_) {
    fds.clear();
    polled.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::unique_ptr<Peer>& peer : peers_) {
        if (peer->closed) continue;
        fds.push_back({peer->fd, POLLIN, 0});
        polled.push_back(peer.get());
      }
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    poll(fds.data(), fds.size(), 20);
    const int64_t now = NowMs();
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < fds.size(); ++i) {
      Peer& peer = *polled[i];
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buffer[16384];
        const ssize_t n = recv(peer.fd, buffer, sizeof(buffer), 0);
        if (n <= 0) {
          peer.closed = true;
          continue;
        }
        peer.in.append(buffer, static_cast<size_t>(n));
        while (peer.in.size() >= 9) {
          const size_t length = (static_cast<uint8_t>(peer.in[0]) << 16) |
                                (static_cast<uint8_t>(peer.in[1]) << 8) |
                                static_cast<uint8_t>(peer.in[2]);
          if (peer.in.size() < 9 + length) break;
          const uint8_t type = static_cast<uint8_t>(peer.in[3]);
          const uint8_t flags = static_cast<uint8_t>(peer.in[4]);
          const std::string payload = peer.in.substr(9, length);
          peer.in.erase(0, 9 + length);
          if (type == kSettings && !(flags & kAck)) {
            SendAll(peer.fd, Frame(kSettings, kAck, 0, ""));
          } else if (type == kPing && !(flags & kAck)) {
            SendAll(peer.fd, Frame(kPing, kAck, 0, payload));
          } else if (type == kHeaders) {
            peer.trailers += payload;
            if (flags & kEndStream) peer.stream_ended = true;
          } else if (type == kRstStream) {
            peer.stream_ended = true;
          } else if (type == kGoAway) {
            peer.goaway = true;
          }
        }
      }
      if (peer.mode == HostileMode::kTrickle && !peer.stream_ended && !peer.closed &&
          peer.trickle_left > 0 && now >= peer.next_trickle_ms) {
        if (!SendAll(peer.fd, Frame(kData, 0, 1, std::string(1, '\0')))) peer.closed = true;
        --peer.trickle_left;
        peer.next_trickle_ms = now + trickle_ms_;
      }
    }
  }
}

}  // namespace caliper::testing
