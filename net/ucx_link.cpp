#include "net/ucx_link.hpp"

#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/log.hpp"
#include "core/fnv1a.hpp"

namespace af {

namespace {

using clock_type = std::chrono::steady_clock;

/// The process's UCP context: made on first use, kept for the process's life
/// (workers come and go with connections).
struct ucx_context {
  ucp_context_h ctx = nullptr;
  std::string error;
};

ucx_context& context() {
  static ucx_context c = [] {
    ucx_context out;
    ucp_config_t* cfg = nullptr;
    auto st = ucp_config_read(nullptr, nullptr, &cfg);
    if (st != UCS_OK) {
      out.error = std::string{"reading UCX's configuration failed: "} + ucs_status_string(st);
      return out;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1; // workers of different connections' threads
    st = ucp_init(&params, cfg, &out.ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
      out.ctx = nullptr;
      out.error = std::string{"ucp_init failed: "} + ucs_status_string(st);
      log::get()->warn("data plane: UCX is not usable in this process ({}); connections between "
                       "hosts stay on TCP/TLS",
                       out.error);
    }
    return out;
  }();
  return c;
}

/// The envelope around a worker's address: magic, length, FNV-1a of the
/// bytes. Garbage is refused here, before UCX parses it.
constexpr char envelope_magic[8] = {'A', 'F', 'U', 'C', 'X', 'A', 'D', '1'};
constexpr size_t envelope_bytes = sizeof(envelope_magic) + 4 + 8;

/// A send is posted in pieces of this many bytes (see write()).
constexpr size_t send_piece = size_t{4} << 20;

std::string wrap(const void* addr, size_t len) {
  std::string out(envelope_bytes + len, '\0');
  std::memcpy(out.data(), envelope_magic, sizeof(envelope_magic));
  auto n = static_cast<uint32_t>(len);
  std::memcpy(out.data() + 8, &n, 4);
  auto h = fnv1a64(static_cast<const char*>(addr), len);
  std::memcpy(out.data() + 12, &h, 8);
  std::memcpy(out.data() + envelope_bytes, addr, len);
  return out;
}

/// The address inside `wrapped`, or why there is none.
bool unwrap(const std::string& wrapped, std::string& addr, std::string& why) {
  if (wrapped.size() < envelope_bytes
      || std::memcmp(wrapped.data(), envelope_magic, sizeof(envelope_magic)) != 0) {
    why = fmt::format("{} bytes that are not a UCX worker address of actorflow's (no envelope)",
                      wrapped.size());
    return false;
  }
  uint32_t n = 0;
  uint64_t h = 0;
  std::memcpy(&n, wrapped.data() + 8, 4);
  std::memcpy(&h, wrapped.data() + 12, 8);
  if (n == 0 || n != wrapped.size() - envelope_bytes) {
    why = fmt::format("a UCX worker address whose envelope says {} bytes but holds {}", n,
                      wrapped.size() - envelope_bytes);
    return false;
  }
  if (fnv1a64(wrapped.data() + envelope_bytes, n) != h) {
    why = "a UCX worker address whose checksum does not match (corrupt)";
    return false;
  }
  addr.assign(wrapped.data() + envelope_bytes, n);
  return true;
}

/// The first byte of this process's worker addresses (UCX's address header:
/// its format version in the low 4 bits, flags above), set by the first
/// create(); -1 before. A peer's address of another format (or garbage with a
/// valid envelope) is refused before ucp_ep_create, whose parser asserts
/// (aborting the process) on a version it does not expect.
std::atomic<int> own_address_header{-1};

bool env_is(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  if (v == nullptr)
    return false;
  for (auto* x : values)
    if (std::strcmp(v, x) == 0)
      return true;
  return false;
}

/// UCX's transports of `ep` ("tcp", "posix, cma", "rc_mlx5"), from its
/// printed configuration ("lane[0]:  2:tcp/lo.0 md[1] ...").
std::string transports_of(ucp_ep_h ep) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr)
    return {};
  ucp_ep_print_info(ep, f);
  fclose(f);
  std::string text{buf, len};
  free(buf);
  std::vector<std::string> names;
  size_t at = 0;
  while ((at = text.find("lane[", at)) != std::string::npos) {
    auto eol = text.find('\n', at);
    auto line = text.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    at = eol == std::string::npos ? text.size() : eol;
    // the token after "N:" up to '/'
    auto colon = line.find(':', line.find(']'));
    if (colon == std::string::npos)
      continue;
    auto start = line.find_first_not_of(" ", colon + 1);
    if (start == std::string::npos)
      continue;
    auto c2 = line.find(':', start);
    auto slash = line.find('/', start);
    if (c2 == std::string::npos || slash == std::string::npos || slash < c2)
      continue;
    auto name = line.substr(c2 + 1, slash - c2 - 1);
    if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end())
      names.push_back(name);
  }
  std::string out;
  for (auto& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

} // namespace

struct ucx_channel::impl {
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  int efd = -1;
  std::atomic<bool> failed{false}; ///< the endpoint's error handler ran
  ucs_status_t why = UCS_OK;
  bool broken = false; ///< a transfer did not finish: nothing more goes on it
  // The received piece being taken (ucp_stream_recv_data_nb), and how far.
  char* piece = nullptr;
  size_t piece_len = 0;
  size_t piece_off = 0;
  std::vector<void*> pending; ///< sends not finished when a write gave up

  static void on_error(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* self = static_cast<impl*>(arg);
    self->why = st;
    self->failed = true;
  }

  /// The socket says the peer closed (EOF, an error) or sent a stray byte
  /// (nothing goes on it on UCX): true, with `corrupt` for the byte.
  static bool socket_says_gone(int fd, bool& corrupt) {
    char byte;
    auto r = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) {
      corrupt = true;
      return true;
    }
    if (r == 0)
      return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }

  /// Waits until `ready()`: progress and spin for b.spin, then sleep in poll
  /// on the worker's event fd and the socket. `first`: nothing moved yet in
  /// this call (first_ms bounds it then, answered by idle).
  /// `last_progress`: when bytes last moved; `ready()` may move it on (a
  /// finished piece of a send), so a stall counts from there.
  template <class Ready>
  status wait(Ready ready, int fd, const bound& b, bool first, clock_type::time_point& last_progress) {
    auto spin_until = clock_type::now() + b.spin;
    for (;;) {
      ucp_worker_progress(worker);
      if (ready())
        return status::done;
      if (failed)
        return status::closed;
      if (clock_type::now() >= spin_until)
        break;
    }
    for (;;) {
      while (ucp_worker_progress(worker) != 0) {
      }
      if (ready())
        return status::done;
      if (failed)
        return status::closed;
      auto now = clock_type::now();
      if (b.cancel != nullptr && b.cancel->load())
        return status::cancelled;
      if (now >= b.deadline)
        return status::timeout;
      long long limit_ms = -1;
      int stall = first && b.first_ms > 0 ? b.first_ms : b.stall_ms;
      if (stall > 0) {
        auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_progress).count();
        if (quiet >= stall)
          return first && b.first_ms > 0 ? status::idle : status::timeout;
        limit_ms = stall - quiet;
      }
      if (b.deadline != clock_type::time_point::max()) {
        long long left = std::chrono::duration_cast<std::chrono::milliseconds>(b.deadline - now).count() + 1;
        limit_ms = limit_ms < 0 ? left : std::min(limit_ms, left);
      }
      long long cap = b.cancel != nullptr ? 20 : 200;
      int wait_ms = static_cast<int>(limit_ms < 0 ? cap : std::min(limit_ms, cap));
      auto armed = ucp_worker_arm(worker);
      if (armed == UCS_ERR_BUSY)
        continue; // events came meanwhile: progress them
      pollfd pfd[2] = {{efd, POLLIN, 0}, {fd, POLLIN | POLLRDHUP, 0}};
      int rc = ::poll(pfd, fd >= 0 ? 2 : 1, armed == UCS_OK ? wait_ms : std::min(wait_ms, 1));
      if (rc < 0 && errno != EINTR)
        return status::closed;
      if (rc > 0 && fd >= 0 && pfd[1].revents != 0) {
        bool corrupt = false;
        if (socket_says_gone(fd, corrupt)) {
          // What came before the close is still taken.
          while (ucp_worker_progress(worker) != 0) {
          }
          if (ready())
            return status::done;
          return corrupt ? status::corrupt : status::closed;
        }
      }
    }
  }

  /// Takes the next received piece if there is one; false if none (or the
  /// endpoint failed: `failed`).
  bool next_piece() {
    if (piece != nullptr)
      return true;
    size_t len = 0;
    auto p = ucp_stream_recv_data_nb(ep, &len);
    if (UCS_PTR_IS_ERR(p)) {
      why = UCS_PTR_STATUS(p);
      failed = true;
      return false;
    }
    if (p == nullptr)
      return false;
    piece = static_cast<char*>(p);
    piece_len = len;
    piece_off = 0;
    return true;
  }

  void release_piece() {
    if (piece != nullptr)
      ucp_stream_data_release(ep, piece);
    piece = nullptr;
  }

  /// Closes the endpoint: flushed (what was sent reaches the peer) within a
  /// second, else forced; then the worker.
  void close() {
    release_piece();
    if (ep != nullptr) {
      // Closed once: the handle is gone after ucp_ep_close_nbx whatever it
      // returns. A flush that does not end within the second has its request
      // freed (it finishes on its own), and destroying the worker below
      // takes the endpoint with it.
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = (broken || failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      auto req = ucp_ep_close_nbx(ep, &prm);
      if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
        auto until = clock_type::now() + std::chrono::seconds{1};
        while (ucp_request_check_status(req) == UCS_INPROGRESS && clock_type::now() < until)
          ucp_worker_progress(worker);
        ucp_request_free(req);
      }
      ep = nullptr;
    }
    for (auto* r : pending)
      ucp_request_free(r);
    pending.clear();
    if (worker != nullptr)
      ucp_worker_destroy(worker);
    worker = nullptr;
  }
};

bool ucx_channel::available() {
  return context().ctx != nullptr;
}

bool ucx_channel::disabled_by_environment() {
  return env_is("ACTORFLOW_DATA_UCX", {"off", "0", "no", "false"});
}

bool ucx_channel::forced_by_environment() {
  return env_is("ACTORFLOW_DATA_UCX", {"force"});
}

caf::expected<std::unique_ptr<ucx_channel>> ucx_channel::create() {
  auto& c = context();
  if (c.ctx == nullptr)
    return make_error(af_error::unsupported, "UCX is not usable in this process: " + c.error);
  std::unique_ptr<ucx_channel> ch{new ucx_channel};
  ch->impl_ = std::make_unique<impl>();
  auto& d = *ch->impl_;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED; // one connection's thread at a time
  auto st = ucp_worker_create(c.ctx, &wp, &d.worker);
  if (st != UCS_OK) {
    d.worker = nullptr;
    return make_error(af_error::unsupported,
                      std::string{"creating a UCX worker failed: "} + ucs_status_string(st));
  }
  st = ucp_worker_get_efd(d.worker, &d.efd);
  if (st != UCS_OK)
    return make_error(af_error::unsupported,
                      std::string{"a UCX worker without an event fd: "} + ucs_status_string(st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(d.worker, &addr, &len);
  if (st != UCS_OK)
    return make_error(af_error::unsupported,
                      std::string{"a UCX worker without an address: "} + ucs_status_string(st));
  ch->address_ = wrap(addr, len);
  if (len > 0)
    own_address_header.store(*reinterpret_cast<const unsigned char*>(addr));
  ucp_worker_release_address(d.worker, addr);
  if (ch->address_.size() > max_address_bytes)
    return make_error(af_error::unsupported,
                      fmt::format("this UCX worker's address is {} bytes, more than the {} a peer "
                                  "takes",
                                  ch->address_.size(), max_address_bytes));
  return ch;
}

ucx_channel::~ucx_channel() {
  if (impl_)
    impl_->close();
}

std::string ucx_channel::check_offer(const std::string& peer_address) {
  std::string addr, why;
  if (!unwrap(peer_address, addr, why))
    return why;
  int own = own_address_header.load();
  // The format version (low 4 bits) must be this UCX's own.
  if (own >= 0 && ((static_cast<unsigned char>(addr[0]) ^ own) & 0x0f) != 0)
    return fmt::format("a UCX worker address of format {} (this UCX writes {}): another UCX "
                       "version, or not an address",
                       static_cast<unsigned char>(addr[0]) & 0x0f, own & 0x0f);
  return {};
}

caf::error ucx_channel::connect(const std::string& peer_address) {
  if (auto why = check_offer(peer_address); !why.empty())
    return make_error(af_error::invalid_argument, why);
  std::string addr, why;
  if (!unwrap(peer_address, addr, why))
    return make_error(af_error::invalid_argument, why);
  auto& d = *impl_;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                  | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &impl::on_error;
  ep.err_handler.arg = &d;
  auto st = ucp_ep_create(d.worker, &ep, &d.ep);
  if (st != UCS_OK) {
    d.ep = nullptr;
    return make_error(af_error::invalid_argument,
                      std::string{"UCX cannot reach that worker address: "} + ucs_status_string(st));
  }
  auto names = transports_of(d.ep);
  transport_ = names.empty() ? "ucx" : "ucx (" + names + ")";
  return {};
}

ucx_channel::status ucx_channel::write(const iovec* iov, int count, int fd, const bound& b,
                                       uint64_t* moved) {
  auto& d = *impl_;
  if (moved != nullptr)
    *moved = 0;
  if (d.broken || d.failed || d.ep == nullptr)
    return status::closed;
  std::vector<void*> reqs;
  uint64_t total = 0;
  status st = status::done;
  // Sent in pieces of at most send_piece bytes (the stream keeps their
  // order): each finished piece is progress, so the stall bound counts from
  // the last one, not from the start of a reply that is long by size alone.
  for (int i = 0; i < count && st == status::done; ++i) {
    auto* base = static_cast<const char*>(iov[i].iov_base);
    for (size_t off = 0; off < iov[i].iov_len;) {
      size_t len = std::min<size_t>(iov[i].iov_len - off, send_piece);
      ucp_request_param_t prm{};
      auto r = ucp_stream_send_nbx(d.ep, base + off, len, &prm);
      if (UCS_PTR_IS_ERR(r)) {
        d.why = UCS_PTR_STATUS(r);
        st = status::closed;
        break;
      }
      if (r != nullptr)
        reqs.push_back(r);
      off += len;
      total += len;
    }
  }
  if (st == status::done && !reqs.empty()) {
    size_t next = 0; // requests before it are finished
    auto last_progress = clock_type::now();
    auto all_done = [&] {
      while (next < reqs.size()) {
        auto s = ucp_request_check_status(reqs[next]);
        if (s == UCS_INPROGRESS)
          return false;
        if (s != UCS_OK) {
          d.why = s;
          d.failed = true;
          return true;
        }
        ++next;
        last_progress = clock_type::now(); // a piece went: the peer takes the reply
      }
      return true;
    };
    st = d.wait(all_done, fd, b, false, last_progress);
    if (st == status::done && d.failed)
      st = status::closed;
  }
  if (st == status::done) {
    for (auto* r : reqs)
      ucp_request_free(r);
    if (moved != nullptr)
      *moved = total;
    return st;
  }
  // Unfinished sends still point at the caller's buffers: the endpoint is
  // closed by force now (that ends them) before the buffers can go away.
  d.broken = true;
  for (auto* r : reqs)
    d.pending.push_back(r);
  d.close();
  return st;
}

ucx_channel::status ucx_channel::await_bytes(int fd, const bound& b) {
  auto& d = *impl_;
  if (d.broken || d.ep == nullptr)
    return status::closed;
  ucp_worker_progress(d.worker);
  if (d.next_piece())
    return status::done;
  if (d.failed)
    return status::closed;
  // The socket first, even for a look that does not wait: a peer that died
  // with nothing of ours in flight may not fail the endpoint for a long
  // time (RDMA), while its socket's end is in at once (docs/wire.md
  // "Liveness"). Nothing is marked: read() finds the same and names it.
  bool corrupt = false;
  if (fd >= 0 && impl::socket_says_gone(fd, corrupt)) {
    while (ucp_worker_progress(d.worker) != 0) {
    }
    if (d.next_piece())
      return status::done; // what came before the end is still taken
    return corrupt ? status::corrupt : status::closed;
  }
  if (clock_type::now() >= b.deadline)
    return status::timeout;
  bound look = b;
  look.stall_ms = 0;
  look.first_ms = 0;
  auto since = clock_type::now();
  return d.wait([&] { return d.next_piece(); }, fd, look, false, since);
}

ucx_channel::status ucx_channel::read(void* dst, uint64_t n, int fd, const bound& b,
                                      uint64_t* moved) {
  auto& d = *impl_;
  if (moved != nullptr)
    *moved = 0;
  if (d.broken || d.ep == nullptr)
    return status::closed;
  auto* out = static_cast<char*>(dst);
  uint64_t got = 0;
  auto last_progress = clock_type::now();
  while (got < n) {
    if (d.next_piece()) {
      auto take = std::min<uint64_t>(n - got, d.piece_len - d.piece_off);
      if (out != nullptr)
        std::memcpy(out + got, d.piece + d.piece_off, take);
      got += take;
      d.piece_off += take;
      if (d.piece_off == d.piece_len)
        d.release_piece();
      if (auto* hooks = wire_test_hooks(); hooks != nullptr && hooks->ucx_bytes_taken)
        hooks->ucx_bytes_taken(take);
      last_progress = clock_type::now();
      continue;
    }
    if (d.failed)
      break;
    auto st = d.wait([&] { return d.next_piece(); }, fd, b, got == 0, last_progress);
    if (st != status::done) {
      if (moved != nullptr)
        *moved = got;
      if (st != status::idle)
        d.broken = st != status::timeout || got > 0; // a clean idle or timeout keeps the stream whole
      return st;
    }
  }
  if (moved != nullptr)
    *moved = got;
  if (got < n) {
    d.broken = true;
    return status::closed;
  }
  return status::done;
}

} // namespace af
