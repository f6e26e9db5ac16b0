#include "net/tls.hpp"
#include "net/tls_detail.hpp"
#include "net/tls_io.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "net/socket.hpp"

namespace af {

using tls_detail::failure_of_errno;
using tls_detail::failure_of_queue;
using tls_detail::read_ahead_bytes;
using tls_detail::state_of;

// -- the data plane's record layer (tls_io.hpp) ---------------------------------

const char* const tls_label_client_to_server = "EXPORTER-actorflow-data client->server";
const char* const tls_label_server_to_client = "EXPORTER-actorflow-data server->client";

namespace {

/// Ciphertext read ahead of the caller: as the BIO's, one recvmsg takes a
/// record's rest and what follows it.
constexpr size_t raw_bytes = read_ahead_bytes;

/// A record is encrypted and sent in pieces of this size: each is still in
/// cache when the kernel copies it, and the sender's buffer stays small.
constexpr size_t send_chunk_bytes = 64 * 1024;

/// The nonce of record `seq`: the direction's secret IV XOR (4 zero bytes,
/// then seq big-endian), as TLS 1.3 (RFC 8446 5.3) and QUIC make theirs.
void nonce_of(const unsigned char base[12], uint64_t seq, unsigned char iv[12]) {
  std::memcpy(iv, base, 12);
  for (int i = 0; i < 8; ++i)
    iv[4 + i] ^= static_cast<unsigned char>(seq >> (56 - 8 * i));
}

void put_be32(uint32_t v, unsigned char* p) {
  p[0] = static_cast<unsigned char>(v >> 24);
  p[1] = static_cast<unsigned char>(v >> 16);
  p[2] = static_cast<unsigned char>(v >> 8);
  p[3] = static_cast<unsigned char>(v);
}

uint32_t get_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

} // namespace

std::unique_ptr<secure_stream> secure_stream::make(ssl_st* ssl, int fd, bool server,
                                                   std::string& why) {
  if (SSL_has_pending(ssl) != 0) {
    why = "the peer sent TLS data right after the handshake (a session ticket or a request "
          "sent too early), where the data plane's records were expected";
    return nullptr;
  }
  // Per direction: a 16-byte key, then a 12-byte IV (record_secret_bytes).
  unsigned char c2s[record_secret_bytes], s2c[record_secret_bytes];
  auto derive = [&](unsigned char* out, const char* label) {
    return SSL_export_keying_material(ssl, out, record_secret_bytes, label, std::strlen(label),
                                      nullptr, 0, 0)
           == 1;
  };
  if (!derive(c2s, tls_label_client_to_server) || !derive(s2c, tls_label_server_to_client)) {
    why = tls_errors("cannot derive the data plane's keys from the TLS session");
    return nullptr;
  }
  std::unique_ptr<secure_stream> out{new (std::nothrow) secure_stream};
  if (out) {
    out->enc_ = aes_gcm::make(true, server ? s2c : c2s);
    out->dec_ = aes_gcm::make(false, server ? c2s : s2c);
    out->raw_.reset(new (std::nothrow) char[raw_bytes]);
  }
  bool ok = out && out->enc_ && out->dec_ && out->raw_;
  if (ok) {
    std::memcpy(out->send_iv_, (server ? s2c : c2s) + 16, 12);
    std::memcpy(out->recv_iv_, (server ? c2s : s2c) + 16, 12);
  }
  OPENSSL_cleanse(c2s, sizeof(c2s));
  OPENSSL_cleanse(s2c, sizeof(s2c));
  if (!ok) {
    why = tls_errors("no memory for the data plane's record layer");
    return nullptr; // out's destructor must not free the caller's ssl
  }
  // What the BIO read past the handshake is the peer's first record(s).
  if (auto* st = state_of(ssl); st != nullptr && st->pos < st->end) {
    auto n = st->end - st->pos; // <= read_ahead_bytes == raw_bytes
    std::memcpy(out->raw_.get(), st->ahead.get() + st->pos, n);
    out->raw_end_ = n;
    st->pos = st->end = 0;
  }
  out->ssl_ = ssl;
  out->fd_ = fd;
  out->server_ = server;
  return out;
}

bool secure_stream::rekey(uint64_t epoch, bool sending) {
  const char* label = server_ == sending ? tls_label_server_to_client : tls_label_client_to_server;
  unsigned char context[8], key[record_secret_bytes];
  for (int i = 0; i < 8; ++i)
    context[i] = static_cast<unsigned char>(epoch >> (56 - 8 * i));
  bool ok = SSL_export_keying_material(ssl_, key, sizeof(key), label, std::strlen(label), context,
                                       sizeof(context), 1)
              == 1
            && (sending ? enc_ : dec_)->set_key(key);
  if (ok)
    std::memcpy(sending ? send_iv_ : recv_iv_, key + 16, 12);
  OPENSSL_cleanse(key, sizeof(key));
  return ok;
}

secure_stream::~secure_stream() {
  SSL_free(ssl_);
}

bool secure_stream::fail(tls_failure kind, const std::string& why) {
  failed_ = true;
  failure_ = kind;
  reason_ = why;
  errno = EPROTO;
  return false;
}

bool secure_stream::send_record(const iovec* parts, int, size_t len) {
  if (send_seq_ == UINT64_MAX)
    return fail(tls_failure::internal,
                "the connection has sent 2^64-1 records; it must be opened again");
  auto need = std::min(len, send_chunk_bytes) + header_bytes + tag_bytes;
  if (out_cap_ < need) {
    out_.reset(new (std::nothrow) char[need]);
    out_cap_ = out_ ? need : 0;
    if (!out_)
      return fail(tls_failure::internal, "no memory for a record's buffer");
  }
  auto* buf = reinterpret_cast<unsigned char*>(out_.get());
  if (send_seq_ > 0 && send_seq_ % rekey_records == 0
      && !rekey(send_seq_ / rekey_records, true))
    return fail(tls_failure::internal, tls_errors("cannot derive the next key"));
  unsigned char iv[12];
  nonce_of(send_iv_, send_seq_, iv);
  put_be32(static_cast<uint32_t>(len), buf);
  if (!enc_->start(iv, buf, header_bytes))
    return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
  ++send_seq_; // the nonce is spent, whatever happens to the record
  // The header goes with the first piece, the tag with the last: pieces
  // of at most send_chunk_bytes, each encrypted into out_ and sent.
  size_t used = header_bytes;
  size_t left = len;
  int part = 0;
  size_t offset = 0; // within parts[part]
  for (;;) {
    while (left > 0 && used < header_bytes + send_chunk_bytes) {
      while (parts[part].iov_len == offset) {
        ++part;
        offset = 0;
      }
      auto n = std::min({parts[part].iov_len - offset, header_bytes + send_chunk_bytes - used, left});
      if (!enc_->update(buf + used, static_cast<const unsigned char*>(parts[part].iov_base) + offset,
                        n))
        return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
      used += n;
      offset += n;
      left -= n;
    }
    if (left == 0) {
      if (!enc_->seal(buf + used))
        return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
      used += tag_bytes;
      if (!sock::send_all(fd_, out_.get(), used, 0))
        return cut_short(len);
      return true;
    }
    if (!sock::send_all(fd_, out_.get(), used, MSG_MORE))
      return cut_short(len);
    used = 0;
  }
}

bool secure_stream::cut_short(size_t len) {
  // The record's nonce is spent and some of its bytes may be out: the peer
  // reads whatever comes next as this record's rest, so nothing may follow
  // on this stream. The send's errno stays the caller's (EAGAIN: the send
  // timeout; EPIPE: the peer left); later reads and writes fail (EPROTO).
  int err = errno;
  failed_ = true;
  failure_ = tls_detail::failure_of_errno(err);
  reason_ = fmt::format("a record of {} bytes was cut short by its send ({}): the stream cannot "
                        "go on",
                        len, std::strerror(err));
  errno = err;
  return false;
}

bool secure_stream::send_hello() {
  return send_record(nullptr, 0, 0);
}

bool secure_stream::write(const iovec* iov, int count) {
  if (failed_) {
    errno = EPROTO;
    return false;
  }
  // A part this large starts a record of its own: a frame's header and name
  // are one small record, and its payload's records are whole, so that the
  // reader takes them straight into the tensor.
  constexpr size_t large = 16 * 1024;
  constexpr int max_parts = 64;
  iovec parts[max_parts];
  int np = 0;
  size_t len = 0;
  auto flush = [&] {
    bool ok = len == 0 || send_record(parts, np, len);
    np = 0;
    len = 0;
    return ok;
  };
  for (int i = 0; i < count; ++i) {
    auto* p = static_cast<const char*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    if (left >= large && len > 0 && !flush())
      return false;
    while (left > 0) {
      if ((np == max_parts || len == max_record_bytes) && !flush())
        return false;
      auto take = std::min(left, max_record_bytes - len);
      parts[np++] = {const_cast<char*>(p), take};
      len += take;
      p += take;
      left -= take;
    }
  }
  return flush();
}

bool secure_stream::fill_raw(size_t n, bool within_record) {
  if (raw_end_ - raw_pos_ >= n)
    return true;
  if (raw_pos_ > 0) {
    std::memmove(raw_.get(), raw_.get() + raw_pos_, raw_end_ - raw_pos_);
    raw_end_ -= raw_pos_;
    raw_pos_ = 0;
  }
  while (raw_end_ < n) {
    auto r = ::recv(fd_, raw_.get() + raw_end_, raw_bytes - raw_end_, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    if (r == 0) {
      if (raw_end_ > 0 || within_record)
        reason_ = fmt::format("the peer closed the connection within a record's header ({} of {} "
                              "bytes came): a truncated record",
                              raw_end_, n);
      failed_ = true;
      failure_ = tls_failure::closed;
      errno = ECONNRESET;
      return false;
    }
    raw_end_ += static_cast<size_t>(r);
  }
  return true;
}

bool secure_stream::next_record(char* dst, size_t room, size_t& delivered) {
  delivered = 0;
  if (!fill_raw(header_bytes, false))
    return false;
  unsigned char hdr[header_bytes];
  std::memcpy(hdr, raw_.get() + raw_pos_, header_bytes);
  raw_pos_ += header_bytes;
  size_t len = get_be32(hdr);
  // A TLS record's header (content type 20-23, version 3.x) where ours was
  // due: a peer that goes on with OpenSSL's records (an older actorflow), a
  // KeyUpdate, a renegotiation or an alert. Said as such, not as a length.
  if (hdr[0] >= 20 && hdr[0] <= 23 && hdr[1] == 3)
    return fail(tls_failure::protocol,
                fmt::format("a TLS record (content type {}) where the data plane's own records "
                            "were due: a peer of an older actorflow, or a TLS KeyUpdate, "
                            "renegotiation or alert after the handshake (not supported)",
                            hdr[0]));
  if (len > max_record_bytes)
    return fail(tls_failure::forged_record,
                fmt::format("a record of {} bytes, over the bound of {} bytes: not a data-plane "
                            "record of this version, or a corrupted stream",
                            len, max_record_bytes));
  // An empty record carries nothing: the hello is one, and nothing else of
  // ours sends them. A run of them is a peer holding the connection (each
  // comes within the receive timeout, and the read waits on for data).
  empty_run_ = len == 0 ? empty_run_ + 1 : 0;
  if (empty_run_ > max_empty_run)
    return fail(tls_failure::protocol,
                fmt::format("{} empty records in a row: a peer that holds the connection without "
                            "sending data",
                            empty_run_));
  if (recv_seq_ == UINT64_MAX)
    return fail(tls_failure::internal,
                "the connection has read 2^64-1 records; it must be opened again");
  if (recv_seq_ > 0 && recv_seq_ % rekey_records == 0
      && !rekey(recv_seq_ / rekey_records, false))
    return fail(tls_failure::internal, tls_errors("cannot derive the next key"));
  unsigned char iv[12];
  nonce_of(recv_iv_, recv_seq_, iv);
  if (!dec_->start(iv, hdr, header_bytes))
    return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
  bool direct = dst != nullptr && len > 0 && len <= room;
  char* target = dst;
  if (!direct) {
    if (plain_cap_ < len) {
      auto cap = std::max(len, std::min(max_record_bytes, size_t{16} << 10));
      plain_.reset(new (std::nothrow) char[cap]);
      plain_cap_ = plain_ ? cap : 0;
      if (!plain_)
        return fail(tls_failure::internal, fmt::format("no memory for a record of {} bytes", len));
    }
    target = plain_.get();
    plain_pos_ = plain_end_ = 0;
  }
  auto decrypt = [&](unsigned char* out, const char* in, size_t n) {
    return dec_->update(out, reinterpret_cast<const unsigned char*>(in), n);
  };
  auto* t = reinterpret_cast<unsigned char*>(target);
  unsigned char tag[tag_bytes];
  size_t have = 0, tag_have = 0;
  // What was read ahead first (decrypted from there: no copy).
  auto k = std::min(raw_end_ - raw_pos_, len);
  if (k > 0 && !decrypt(t, raw_.get() + raw_pos_, k))
    return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
  raw_pos_ += k;
  have = k;
  k = std::min(raw_end_ - raw_pos_, tag_bytes);
  std::memcpy(tag, raw_.get() + raw_pos_, k);
  raw_pos_ += k;
  tag_have = k;
  if (raw_pos_ == raw_end_)
    raw_pos_ = raw_end_ = 0;
  // The rest straight off the socket: the body into its place (decrypted
  // there as it comes, while in cache), the tag, and what follows ahead.
  while (have < len || tag_have < tag_bytes) {
    iovec iov[3];
    int c = 0;
    if (have < len)
      iov[c++] = {target + have, len - have};
    iov[c++] = {tag + tag_have, tag_bytes - tag_have};
    iov[c++] = {raw_.get(), raw_bytes};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(c);
    auto r = ::recvmsg(fd_, &msg, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      failed_ = true; // within a record: the stream cannot go on
      failure_ = failure_of_errno(errno);
      return false;
    }
    if (r == 0) {
      reason_ = fmt::format("the peer closed the connection within a record ({} of {} bytes "
                            "came): a truncated record",
                            header_bytes + have + tag_have, header_bytes + len + tag_bytes);
      failed_ = true;
      failure_ = tls_failure::closed;
      errno = ECONNRESET;
      return false;
    }
    auto got = static_cast<size_t>(r);
    auto body = std::min(got, len - have);
    if (body > 0 && !decrypt(t + have, target + have, body))
      return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
    have += body;
    got -= body;
    auto tg = std::min(got, tag_bytes - tag_have);
    tag_have += tg;
    got -= tg;
    raw_pos_ = 0;
    raw_end_ = got;
  }
  if (!dec_->open(tag)) {
    ERR_clear_error();
    return fail(tls_failure::forged_record,
                fmt::format("record {} ({} bytes) failed authentication: its tag does not match "
                            "(tampered with, replayed, reordered or cut)",
                            recv_seq_, len));
  }
  ++recv_seq_;
  if (direct)
    delivered = len;
  else
    plain_end_ = len;
  return true;
}

bool secure_stream::read(void* buf, size_t n, size_t* got) {
  auto* p = static_cast<char*>(buf);
  if (got != nullptr)
    *got = 0;
  if (failed_) {
    errno = reason_.empty() ? ECONNRESET : EPROTO;
    return false;
  }
  while (n > 0) {
    if (plain_pos_ < plain_end_) {
      auto k = std::min(n, plain_end_ - plain_pos_);
      std::memcpy(p, plain_.get() + plain_pos_, k);
      plain_pos_ += k;
      p += k;
      n -= k;
      if (got != nullptr)
        *got += k;
      continue;
    }
    size_t delivered = 0;
    if (!next_record(p, n, delivered))
      return false;
    p += delivered;
    n -= delivered;
    if (got != nullptr)
      *got += delivered;
  }
  return true;
}

std::string secure_stream::wait_hello(int wait_ms) {
  auto refuse = [this](tls_failure kind, std::string why) {
    failure_ = kind;
    return why;
  };
  if (raw_pos_ == raw_end_) {
    int rc = sock::poll_one(fd_, POLLIN, wait_ms);
    if (rc == 0)
      return refuse(tls_failure::timeout,
                    fmt::format("no first record within {} ms after the TLS handshake", wait_ms));
    if (rc < 0)
      return refuse(failure_of_errno(errno), std::string{"poll: "} + std::strerror(errno));
    auto r = ::recv(fd_, raw_.get(), raw_bytes, MSG_DONTWAIT);
    if (r == 0)
      return refuse(tls_failure::closed,
                    "the node closed the connection right after the TLS handshake (it refused "
                    "this process, or is stopping)");
    if (r < 0)
      return refuse(failure_of_errno(errno),
                    std::string{"right after the TLS handshake: "} + std::strerror(errno));
    raw_pos_ = 0;
    raw_end_ = static_cast<size_t>(r);
  }
  auto first = static_cast<unsigned char>(raw_[raw_pos_]);
  if (first == 0x15 || first == 0x16 || first == 0x17) {
    // A TLS record (alert, handshake, application data), never one of ours
    // (whose first byte, of a length <= max_record_bytes, is 0): OpenSSL
    // reads it, from what was read ahead and then the socket.
    failed_ = true;
    if (auto* st = state_of(ssl_)) {
      if (!st->ahead)
        st->ahead.reset(new (std::nothrow) char[read_ahead_bytes]);
      if (st->ahead) {
        std::memcpy(st->ahead.get(), raw_.get() + raw_pos_, raw_end_ - raw_pos_);
        st->pos = 0;
        st->end = raw_end_ - raw_pos_;
      }
    }
    raw_pos_ = raw_end_ = 0;
    ERR_clear_error();
    char byte;
    size_t n = 0;
    int ret = SSL_read_ex(ssl_, &byte, 1, &n);
    if (ret == 1)
      return refuse(tls_failure::protocol,
                    "the node sent TLS data where the data plane's first record was expected (a "
                    "node of another version?)");
    if (SSL_get_error(ssl_, ret) == SSL_ERROR_ZERO_RETURN)
      return refuse(tls_failure::closed, "the node closed the TLS session right after the handshake");
    // Most often its alert: it refused this process's certificate after our
    // side of the handshake had finished (TLS 1.3).
    auto kind = failure_of_queue();
    return refuse(kind == tls_failure::handshake ? tls_failure::refused : kind,
                  tls_errors("the node ended the TLS session right after the handshake"));
  }
  size_t delivered = 0;
  if (!next_record(nullptr, 0, delivered)) {
    auto kind = failure_ != tls_failure::none ? failure_ : failure_of_errno(errno);
    if (!reason_.empty())
      return refuse(kind, reason_);
    return refuse(kind, std::string{"reading the node's first record: "} + std::strerror(errno));
  }
  if (plain_end_ != 0)
    return refuse(tls_failure::forged_record,
                  "the node's first record was not the empty one expected (a node of another "
                  "version?)");
  return {};
}

} // namespace af
