#pragma once
/// The data plane's own TLS I/O (net/byte_channel.cpp's tls_channel, the
/// server in net/data_plane_server.cpp, the client in net/data_channel.cpp): the read path's
/// read-ahead and the record layer after the handshake (secure_stream).
/// Kept out of tls.hpp, which much of the project includes.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "net/aes_gcm.hpp"
#include "net/tls.hpp"

namespace af {

/// tls_set_socket, but reads take up to 64 KiB off the socket at once (one
/// recvmsg instead of two recv per 16 KiB record, docs/wire.md "TLS
/// figures"). The caller must then ask tls_has_pending, not the socket,
/// whether bytes are waiting: only for code that reads in its own loops (the
/// data plane), never for an event loop that waits for the socket to be
/// readable (CAF's, caf_port.cpp), which would not see the bytes held here.
bool tls_set_socket_read_ahead(ssl_st* ssl, int fd);

/// Whether `ssl` holds bytes not yet read by the application: records
/// OpenSSL has, or bytes its socket BIO read ahead (which SSL_has_pending
/// does not see). Before polling the socket for more, ask this: a poll would
/// wait for bytes already taken off the socket.
bool tls_has_pending(ssl_st* ssl);

/// The data plane's record layer after the TLS handshake (docs/wire.md,
/// "TLS"). The mutual-TLS 1.3 handshake authenticates both ends; then each
/// direction gets its own AES-128-GCM key from SSL_export_keying_material
/// (labels tls_label_client_to_server / tls_label_server_to_client), and all
/// further bytes in both directions are records of ours instead of
/// SSL_read/SSL_write:
///
///   record = 4-byte big-endian plaintext length L (authenticated as AAD)
///            + L bytes of ciphertext + 16-byte GCM tag
///   nonce  = the direction's secret 12-byte IV XOR (4 zero bytes + the
///            direction's 64-bit record counter, big endian), one per
///            record, never reused (the connection fails before it could
///            wrap); as TLS 1.3 and QUIC, so that no two connections share
///            a nonce sequence (the key and the IV are exported together:
///            record_secret_bytes per direction and epoch)
///
/// L is at most max_record_bytes: a longer one, or a record whose tag does
/// not verify (tampered, reordered, replayed, cut), fails the stream with a
/// reason (reason()) and errno EPROTO. A read that wants a whole record's
/// plaintext or more takes its ciphertext off the socket straight into the
/// caller's buffer and decrypts it there (bytes of a record whose tag then
/// fails are in that buffer: the caller must discard it, as it does on any
/// failed read). Smaller reads go through one record buffer, at most
/// max_record_bytes. The sender encrypts into one buffer of its own (kept
/// for the next record) and sends it; a run of small parts (a frame's header
/// and name) goes in one record, a large part in records of its own.
///
/// Blocking I/O on the caller's socket: its SO_RCVTIMEO/SO_SNDTIMEO bound
/// each wait (EAGAIN). One thread at a time per stream.
class secure_stream {
public:
  /// The most plaintext one record carries (docs/wire.md "TLS figures").
  static constexpr size_t max_record_bytes = size_t{256} << 10;
  static constexpr size_t tag_bytes = 16;
  static constexpr size_t header_bytes = 4;
  /// What the exporter gives per direction and epoch: the AES-128 key (16
  /// bytes), then the IV its nonces are masked with (12 bytes).
  static constexpr size_t record_secret_bytes = 16 + 12;
  /// Every this many records a direction's key is derived anew (epoch e =
  /// record counter / rekey_records: the exporter's context is e as 8
  /// big-endian bytes; epoch 0 has no context): at most 64 GiB under one
  /// key, well within AES-GCM's usage bound (RFC 8446 §5.5: ~2^38.5 bytes).
  static constexpr uint64_t rekey_records = uint64_t{1} << 18;

  /// After a successful handshake of `ssl` on `fd` (both not owned until
  /// this returns: the stream then owns `ssl`, never `fd`): derives the keys,
  /// and takes the bytes the read-ahead BIO (tls_set_socket_read_ahead)
  /// already holds. Null, with `why`, if the keys cannot be had or OpenSSL
  /// holds TLS bytes after the handshake (there must be none: no session
  /// tickets, net/tls.cpp).
  static std::unique_ptr<secure_stream> make(ssl_st* ssl, int fd, bool server, std::string& why);

  ~secure_stream();
  secure_stream(const secure_stream&) = delete;
  secure_stream& operator=(const secure_stream&) = delete;

  /// Sends all of `iov` as records. False: errno says why (EAGAIN: the
  /// send timeout; EPIPE/ECONNRESET: the peer left; EPROTO: reason()). A
  /// send that fails within a record fails the stream for good (the record
  /// is cut, its nonce spent): later writes and reads fail with EPROTO.
  bool write(const iovec* iov, int count);

  /// Reads exactly `n` bytes. False: errno says why (ECONNRESET: the peer
  /// closed between records; EAGAIN: the receive timeout; EPROTO: reason(),
  /// which for a close within a record says so). `got`: how many came.
  bool read(void* buf, size_t n, size_t* got = nullptr);

  /// Bytes taken off the socket and not yet read by the caller (plaintext
  /// of a record, or ciphertext read ahead): before polling the socket, ask
  /// this.
  bool has_pending() const { return plain_pos_ < plain_end_ || raw_pos_ < raw_end_; }

  /// The server's first record: an empty one, sent once its handshake is
  /// done, that the client waits for before its first request.
  bool send_hello();

  /// The client's wait (up to `wait_ms`) for that record. Empty: it came
  /// and its tag verified (both ends have the same keys). Else why not; in
  /// particular, when the next bytes are a TLS record instead, the server
  /// refused this client's certificate after the client's side of the
  /// handshake had completed (TLS 1.3 sends that alert after the client's
  /// Finished): the alert's reason, read through OpenSSL ("tlsv13 alert
  /// certificate required"). failure() then says its kind (timeout,
  /// closed, refused, forged_record, ...).
  std::string wait_hello(int wait_ms);

  /// Why the stream failed (EPROTO), or why the peer's close was early.
  const std::string& reason() const { return reason_; }

  /// The kind of the failure that reason() says (or that wait_hello's text
  /// says); none while the stream is good. A client takes
  /// tls_failure::forged_record (a record that fails its tag, or a first
  /// record not the one due) as an impostor (is_impostor).
  tls_failure failure() const { return failure_; }

  /// The TLS session (version, suite, the peer's certificate).
  ssl_st* ssl() const { return ssl_; }
  int fd() const { return fd_; }

  /// For tests: the records sent and read so far.
  uint64_t records_sent() const { return send_seq_; }
  uint64_t records_read() const { return recv_seq_; }

private:
  secure_stream() = default;
  /// Fails the stream for good (later reads and writes fail, EPROTO).
  bool fail(tls_failure kind, const std::string& why);
  bool send_record(const iovec* parts, int count, size_t len);
  /// A send of a record of `len` bytes failed (errno): fails the stream.
  bool cut_short(size_t len);
  /// Reads the next record: its plaintext into `dst` if it fits there (and
  /// `dst` is not null), else into plain_. `delivered`: bytes put in dst.
  bool next_record(char* dst, size_t room, size_t& delivered);
  /// At least `n` bytes in raw_ (n <= raw capacity); false: EOF or error.
  bool fill_raw(size_t n, bool within_record);
  /// The key of `epoch` (>= 1) for the direction that sends or reads.
  bool rekey(uint64_t epoch, bool sending);

  ssl_st* ssl_ = nullptr;
  int fd_ = -1;
  bool server_ = false;
  std::unique_ptr<aes_gcm> enc_; ///< seals what this end sends
  std::unique_ptr<aes_gcm> dec_; ///< opens what it reads
  unsigned char send_iv_[12] = {}; ///< the sending direction's IV of this epoch
  unsigned char recv_iv_[12] = {};
  uint64_t send_seq_ = 0;
  uint64_t recv_seq_ = 0;
  /// Empty records read since the last one with data: more than
  /// max_empty_run fail the stream.
  static constexpr int max_empty_run = 8;
  int empty_run_ = 0;
  bool failed_ = false;
  tls_failure failure_ = tls_failure::none;
  std::string reason_;
  std::unique_ptr<char[]> out_; ///< header + ciphertext + tag of the record being sent
  size_t out_cap_ = 0;
  std::unique_ptr<char[]> raw_; ///< ciphertext read ahead of the caller
  size_t raw_pos_ = 0, raw_end_ = 0;
  std::unique_ptr<char[]> plain_; ///< one record's plaintext for small reads
  size_t plain_cap_ = 0;
  size_t plain_pos_ = 0, plain_end_ = 0;
};

/// The exporter labels of the two directions' keys.
extern const char* const tls_label_client_to_server;
extern const char* const tls_label_server_to_client;

} // namespace af
