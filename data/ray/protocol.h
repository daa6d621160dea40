// The frames RayBatches (data/ray_batches.cpp) and ef_ray_driver (driver.cpp) exchange over their
// socket. Both sides include this header, compiled with different libstdc++ string ABIs (the driver
// links Ray's library, built with the old one), so it holds plain structs and functions on bytes only.
//   request  (trainer -> driver): RequestHeader, then `count` int64 dataset indices
//   response (driver -> trainer): ResponseHeader, then `size` bytes: an encoded batch (kOk) or a message
// The driver's first response has id kReady: kOk once it has connected to the cluster, kFailed with
// the reason otherwise. Requests are numbered from 1; responses come back in any order.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace evenflow::data::ray_protocol {

inline constexpr uint64_t kReady = 0;
inline constexpr uint32_t kOk = 0, kFailed = 1;

struct RequestHeader {
  uint64_t id, seed, epoch, count;
};

struct ResponseHeader {
  uint64_t id;
  uint32_t status, reserved;
  uint64_t size;
};

// Reads exactly n bytes; false at the end of the stream or on an error.
inline bool read_exact(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Writes exactly n bytes to a socket; false when the other side is gone (no SIGPIPE).
inline bool write_exact(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace evenflow::data::ray_protocol
