/// A request frame as the server hands it to its plane_handler
/// (net/plane_handler.hpp): the payload read, skipped or refused, and the
/// reply sent, on the connection it came on.
#include "net/plane_handler.hpp"
#include "net/data_link.hpp"
#include "net/served_connection.hpp"

#include <cerrno>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

using namespace plane_io;

const std::string& plane_request::peer() const {
  return conn_.peer;
}

const std::string& plane_request::node_name() const {
  return conn_.node_name;
}

std::string plane_request::transport() const {
  // After an offer of UCX the frames go over it, the TLS stream kept only
  // for liveness: what carries them names itself.
  return conn_.io.bytes->name();
}

bool plane_request::read_payload(void* dst, bool quiet) {
  if (h_.payload_bytes == 0)
    return true;
  return read_bytes(dst, h_.payload_bytes, quiet);
}

bool plane_request::read_part(void* dst, size_t n, bool quiet) {
  if (n == 0)
    return true;
  consumed_ += n;
  return read_bytes(dst, n, quiet);
}

bool plane_request::read_bytes(void* dst, size_t n, bool quiet) {
  auto how = read_timed(conn_.io, dst, n, conn_.frame_ms, conn_.frame_ms, false);
  if (quiet)
    return how == read_end::done;
  return !conn_.ended(how, "payload");
}

bool plane_request::skip_payload() {
  read_end how = read_end::done;
  auto skip = plane_io::skip_payload(conn_.io, h_.payload_bytes, conn_.frame_ms, how);
  if (skip == skipped::lost) {
    conn_.ended(how, "payload");
    return false;
  }
  if (skip == skipped::too_large) {
    send_error(conn_.io, af_error::invalid_argument,
               "a payload that is no tensor (the connection is closed: its payload was not "
               "read)");
    return false;
  }
  return true;
}

bool plane_request::refuse(af_error code, const std::string& text) {
  read_end how = read_end::done;
  if (refuse_request(conn_.io, code, text, h_.payload_bytes - consumed_, conn_.frame_ms, how))
    return true;
  conn_.ended(how, "payload");
  return false;
}

bool plane_request::reply(wire::header& h, const void* payload) {
  h.kind = static_cast<uint8_t>(wire::kind::reply);
  if (send_frame(conn_.io, h, nullptr, payload))
    return true;
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    log::get()->warn("{} data plane: dropped {}: it took nothing of its reply for {} ms",
                     conn_.node_name, conn_.peer, conn_.frame_ms);
  return false;
}

bool plane_request::reply_error(af_error code, const std::string& text) {
  return send_error(conn_.io, code, text);
}

bool plane_request::reply_error(const caf::error& err) {
  return send_error(conn_.io, wire_code(err), describe(err));
}

} // namespace af
