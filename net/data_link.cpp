#include "net/data_link.hpp"
#include "net/tls.hpp"
#include "net/tls_io.hpp"

#include <limits.h>

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "messages/error.hpp"

namespace af::plane_io {

thread_local std::string last_tls_error;
thread_local tls_failure last_tls_failure = tls_failure::none;

void note_failure(const secure_stream& tls) {
  if (!tls.reason().empty()) {
    last_tls_error = tls.reason();
    last_tls_failure = tls.failure();
  }
}

long long ms_left(const send_bound& b) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                b.deadline - std::chrono::steady_clock::now())
                .count();
  return std::max<long long>(left, 0);
}

bool write_all(const link& io, iovec* iov, int count, const send_bound* b) {
  return io.bytes->write(io, iov, count, b);
}

read_end read_timed(const link& io, void* buf, size_t n, int first_wait_ms, int stall_ms,
                    bool poll_first) {
  return io.bytes->read_timed(io, buf, n, first_wait_ms, stall_ms, poll_first);
}

bool read_all(const link& io, void* buf, size_t n, size_t* got,
              const std::chrono::steady_clock::time_point* until) {
  if (got != nullptr)
    *got = 0;
  return io.bytes->read_all(io, buf, n, got, until);
}

std::string peer_address(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
              NI_NUMERICHOST | NI_NUMERICSERV);
  return addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port)
                                    : fmt::format("{}:{}", host, port);
}

af_error wire_code(const caf::error& err) {
  if (err.category() == error_category && valid_af_error(err.code()))
    return static_cast<af_error>(err.code());
  return af_error::internal;
}

bool send_frame(const link& fd, wire::header& h, const std::string* name, const void* payload,
                const send_bound* b) {
  iovec iov[3];
  int count = 0;
  iov[count++] = {&h, sizeof(h)};
  if (name != nullptr && !name->empty())
    iov[count++] = {const_cast<char*>(name->data()), name->size()};
  if (h.payload_bytes > 0)
    iov[count++] = {const_cast<void*>(payload), h.payload_bytes};
  return write_all(fd, iov, count, b);
}

bool send_error(const link& fd, af_error code, const std::string& text) {
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::reply);
  h.status = static_cast<uint8_t>(code);
  h.payload_bytes = text.size();
  return send_frame(fd, h, nullptr, text.data());
}

void last_words(const link& fd, af_error code, const char* node, const char* text) noexcept {
  try {
    send_error(fd, code, std::string{node} + " data plane: " + text);
  } catch (...) {
    // nop: the connection closes without them
  }
}

skipped skip_payload(const link& fd, uint64_t bytes, int frame_ms, read_end& how) {
  if (bytes > drain_limit)
    return skipped::too_large;
  char scratch[65536];
  for (uint64_t left = bytes; left > 0;) {
    auto n = static_cast<size_t>(std::min<uint64_t>(left, sizeof(scratch)));
    how = read_timed(fd, scratch, n, frame_ms, frame_ms, false);
    if (how != read_end::done)
      return skipped::lost;
    left -= n;
  }
  return skipped::past;
}

bool refuse_request(const link& io, af_error code, const std::string& text, uint64_t payload,
                    int frame_ms, read_end& how) {
  how = read_end::done;
  bool drain = payload <= drain_limit;
  if (!send_error(io, code,
                  drain ? text : text + " (the connection is closed: its payload was not read)")
      || !drain)
    return false;
  return skip_payload(io, payload, frame_ms, how) == skipped::past;
}

bool looks_like_frame(const unsigned char* p, size_t n) {
  uint32_t m = wire::magic;
  return n >= 4 && std::memcmp(p, &m, 4) == 0;
}

std::string host_of(const std::string& peer) {
  auto colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

bool looks_like_tls(const unsigned char* p, size_t n) {
  return n >= 2 && (p[0] == 0x16 || p[0] == 0x15) && p[1] == 0x03;
}

void close_refused(int fd) {
  ::shutdown(fd, SHUT_WR);
  char scratch[4096];
  for (int i = 0; i < 16 && ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0; ++i) {
  }
  close(fd);
}

caf::error check_push_prefix(const std::string& what, size_t name_size, uint32_t worker,
                             const std::string& token) {
  wire::push_prefix pre;
  if (name_size + sizeof(pre) > wire::max_name || worker > UINT16_MAX)
    return make_error(af_error::invalid_argument, what + ": name or worker index too large");
  if (token.size() != sizeof(pre.token))
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: a token of {} bytes, expected the {} its join was "
                                  "answered with (join the aggregator before pushing)",
                                  what, token.size(), sizeof(pre.token)));
  return caf::none;
}

caf::error append_float_values(const std::string& what, const std::vector<tensor>& values,
                               std::vector<iovec>& iov, wire::header& h) {
  uint64_t floats = 0;
  for (const auto& v : values) {
    if (v.type() != dtype::float32)
      return make_error(af_error::dtype_mismatch,
                        what + ": values must be float32, got " + v.summary());
    floats += v.num_elements();
    if (v.nbytes() > 0)
      iov.push_back({const_cast<std::byte*>(v.bytes()), v.nbytes()});
  }
  h.has_tensor = 1;
  h.dtype = static_cast<uint8_t>(dtype::float32);
  h.rank = 1;
  h.dims[0] = static_cast<int64_t>(floats);
  h.payload_bytes = floats * sizeof(float);
  return caf::none;
}

} // namespace af::plane_io
