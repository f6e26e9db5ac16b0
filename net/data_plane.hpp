#pragma once
/// The tensor data plane: variable ops between a session and a remote node
/// over plain TCP, beside CAF's control plane.
///
/// Why: through BASP a small remote op costs ~10x a raw socket round trip and
/// a 64 MiB tensor reaches a fraction of the socket's speed (docs/wire.md).
/// Here a session's thread writes one frame (core/wire_format.hpp) straight from
/// the tensor's buffer and blocks on the reply; on the node, one thread per
/// connection reads each frame's header and name and hands the request to
/// the node's plane_handler (net/plane_handler.hpp; the runtime's is
/// actors/variable_directory.hpp), which reads the payload straight into a
/// fresh tensor, applies the op to the variable's cell itself (no actor hop)
/// and writes the reply straight from the variable's buffer. This file knows
/// the wire, not variables: CAF still places variables, keeps the registry
/// and watches nodes, and the handler finds a variable by name. A peer that dies
/// closes its socket: the waiting side sees it at once instead of at a
/// timeout. A peer that goes silent is dropped: between frames after the
/// idle timeout, within a frame after the (short) frame timeout.

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "caf/expected.hpp"

#include "net/shm_ring.hpp"
#include "net/tls.hpp"
#include "net/ucx_link.hpp"
#include "net/byte_channel.hpp"
#include "net/data_plane_counters.hpp"
#include "net/data_plane_limits.hpp"
#include "net/plane_handler.hpp"
#include "core/tensor.hpp"
#include "core/variable_spec.hpp"
#include "core/wire_format.hpp"

namespace af {

class secure_stream; // net/tls_io.hpp
struct data_link;    // net/data_link.hpp: one connection's byte stream
struct served_connection; // net/served_connection.hpp: one connection the server serves

/// The node's side: a listening socket and one thread per connection.
class data_plane_server {
public:
  /// Listens on `bind_host` (empty: all interfaces) at `port` (0: the OS picks).
  /// `node_name` names the node in errors and logs. With `tls`, every
  /// connection is mutual TLS: a peer without a certificate of the cluster CA
  /// is refused (and logged) before it can send a request.
  static caf::expected<std::unique_ptr<data_plane_server>>
  start(std::shared_ptr<plane_handler> handler, const std::string& bind_host, uint16_t port,
        std::string node_name, data_plane_limits limits = {},
        std::shared_ptr<tls_context> tls = nullptr);

  ~data_plane_server();

  uint16_t port() const { return port_; }

  /// What it has served and refused so far (relaxed atomics: read them at
  /// any time, from any thread; metrics/node_metrics.hpp does at each scrape).
  const data_plane_counters& counters() const { return counters_; }

  /// Bytes of its clients' shared-memory segments mapped now ([node] max_shm_bytes bounds them).
  int64_t shm_bytes_mapped() const { return shm_mapped_.load(std::memory_order_relaxed); }

  /// Its limits ([node] max_data_connections, ...).
  const data_plane_limits& limits() const { return timeouts_; }

  /// Closes every connection and joins the threads; idempotent. Call before
  /// the actor system goes away (the handler's calls may hold actors' handles).
  void stop();

private:
  data_plane_server(std::shared_ptr<plane_handler> handler, std::string node_name,
                    data_plane_limits limits, std::shared_ptr<tls_context> tls)
    : handler_(std::move(handler)), node_name_(std::move(node_name)), timeouts_(limits),
      tls_(std::move(tls)) {}
  void accept_loop();
  /// accept_loop's admission of an accepted connection `fd` (under the
  /// limits): a thread serves it, or it is refused. False: the server stops.
  bool admit(int fd, const std::string& peer, std::vector<std::thread>& done,
             uint64_t& over_limit, uint64_t& over_handshakes);
  void serve(int fd, const std::string& peer);
  /// serve()'s frames, one after another, until the connection ends.
  void serve_frames(served_connection& c);
  /// An offer of shared memory (header read, name read: the segment's); false:
  /// drop the connection.
  bool serve_shm_offer(served_connection& c, const wire::header& h, const std::string& name);
  /// An offer of UCX (header read); false: drop the connection.
  bool serve_ucx_offer(served_connection& c, const wire::header& h);
  /// A TLS connection's handshake (bounded by the frame timeout) and its
  /// record layer's first record: the stream, or null if the peer was
  /// refused (logged with why).
  std::unique_ptr<secure_stream> accept_tls(int fd, const std::string& peer);

  std::shared_ptr<plane_handler> handler_; ///< what the request frames reach
  std::string node_name_;
  data_plane_limits timeouts_;
  std::shared_ptr<tls_context> tls_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> shm_mapped_{0}; ///< bytes of the clients' segments mapped now
  data_plane_counters counters_;
  std::thread acceptor_;
  std::mutex mtx_;
  std::vector<std::thread> workers_;
  std::vector<int> conns_;
  /// Over TLS: connections still in their handshake, by peer host. A host
  /// holds at most max_handshakes_per_host of the slots that way, so that
  /// strangers who connect and say nothing cannot keep members out.
  std::unordered_map<std::string, int> handshaking_;
  std::vector<std::thread::id> finished_; ///< workers that returned, to be joined
};

/// Why data_channel::connect failed, as a type set where the failure was
/// found (net/tls.hpp's tls_failure for the TLS half): callers decide what
/// it means from this, never from the words of the error.
enum class connect_failure {
  none,          ///< it did not fail
  unreachable,   ///< no TCP connection (refused, no route, unknown name, its timeout: the
                 ///< error says which)
  impostor,      ///< the node's identity is wrong: a certificate of another CA, host or
                 ///< task, or a first record not sealed with the session's keys
  refused,       ///< the node refused this process in the TLS handshake (an alert: most
                 ///< often this process's certificate is not of the cluster CA)
  protocol,      ///< the node does not speak TLS (run without [security]) or our records
  tls_handshake, ///< the TLS handshake failed otherwise (no common version or suite, ...)
  timeout,       ///< the TLS handshake or the node's first record did not come in time
  closed,        ///< the node closed (or reset) the connection during the handshake or
                 ///< right after it
  internal       ///< this process's own failure (no memory, keys not derived)
};

/// The enumerator's name ("impostor"), for logs and tests.
const char* to_string(connect_failure f);

/// The session's side: one connection to one node's data plane.
class data_channel {
public:
  /// `peer` names the node in errors ("/job:ps/task:0 at h:p").
  /// `poll`: how long to poll for a reply before sleeping in recv (0: never).
  /// With `tls`: mutual TLS, the node's certificate checked against the
  /// cluster CA. `timeout` bounds the whole connect (TCP, TLS handshake and
  /// the node's first record together). `failure` (if given) says why it
  /// failed (connect_failure::impostor: the node's identity is wrong, a
  /// certificate of another CA, host or task, or a first record that fails
  /// authentication), none if it did not.
  ///
  /// `shared_memory`: when the node is on this host (a loopback address, or
  /// this end's own address), without TLS, and ACTORFLOW_DATA_SHM is not
  /// "off", the connection moves to shared memory after the node's first
  /// answer (net/shm_ring.hpp); false: it stays on TCP.
  ///
  /// `trusted_fabric` (or the process's own, process_trusted_fabric()): when
  /// the node is on another host (or ACTORFLOW_DATA_UCX=force), the build has
  /// UCX and ACTORFLOW_DATA_UCX is not "off", the connection offers UCX after
  /// the node's first answer (net/ucx_link.hpp; TLS, if configured, still
  /// authenticates both ends first).
  static caf::expected<std::unique_ptr<data_channel>>
  connect(const std::string& host, uint16_t port, std::string peer,
          std::chrono::milliseconds timeout,
          std::chrono::microseconds poll = std::chrono::microseconds{0},
          std::shared_ptr<tls_context> tls = nullptr, connect_failure* failure = nullptr,
          bool shared_memory = true, bool trusted_fabric = false);

  ~data_channel();

  /// One variable op: the value (empty unless asked for or read) and version.
  /// Errors are the node's (its af_error and text) or the channel's: any I/O
  /// failure or malformed reply (an invalid status byte: internal) breaks
  /// the channel (broken() turns true). `request_id` (0: none) goes in the
  /// header's version field: the variable applies an update once per id and
  /// answers a retry with the first result (actors/variable.hpp). `wait`
  /// (0: the channel's timeout) bounds this call's wait for the reply.
  caf::expected<std::pair<tensor, uint64_t>> call(var_op op, const std::string& var,
                                                  const tensor* operand, bool want_value,
                                                  uint64_t request_id = 0,
                                                  std::chrono::milliseconds wait = {});

  /// One push (values: the parts, sent as one flat float32 tensor without a
  /// copy; none: an abstention) or pull to aggregator `name` of the node:
  /// the global step and the flat parameters. `wait` bounds this call's reply
  /// (a sync push waits for the other workers).
  /// A push carries `token` (the one the worker's join was answered with)
  /// and its number `seq` (push_credentials); a pull neither. `dropped_late`
  /// (if given) is set to whether the node's reply says the push was dropped
  /// as late (wire::reply_flags::dropped_late; false from an older node).
  caf::expected<std::pair<uint64_t, tensor>> aggregate(wire::kind kind, const std::string& name,
                                                       uint32_t worker, uint64_t step,
                                                       const std::vector<tensor>& values,
                                                       std::chrono::milliseconds wait,
                                                       const std::string& token = {},
                                                       uint64_t seq = 0,
                                                       bool* dropped_late = nullptr);

  /// A dense sync push streamed (wire::kind::push_streamed, [train]
  /// pipeline_sync): arguments and answer as aggregate()'s push. The node
  /// may answer while the push is still going out (a pipelined round), so
  /// the push is written without blocking and the answer read as it comes
  /// (poll on both): a client that wrote first and read after would wait
  /// on a full socket buffer while the node waits on its own. The answer
  /// counts only once its trailer says the round committed; an error
  /// trailer drops what was read and is the call's error. Only on a plain
  /// TCP connection: on another transport (TLS, shared memory, UCX), or
  /// with no values (an abstention), this is aggregate()'s plain push.
  caf::expected<std::pair<uint64_t, tensor>>
  push_streamed(const std::string& name, uint32_t worker, uint64_t step,
                const std::vector<tensor>& values, std::chrono::milliseconds wait,
                const std::string& token, uint64_t seq, bool* dropped_late = nullptr);

  /// True if this connection's frames go straight over its TCP socket.
  bool plain_tcp() const;
  /// Whether push_streamed sends aggregator `name`'s pushes whole: its last
  /// push reply asked for it (wire::reply_flags::whole_pushes).
  bool pushes_whole(const std::string& name) const {
    return std::find(whole_pushes_.begin(), whole_pushes_.end(), name) != whole_pushes_.end();
  }

  /// [train] wire_dtype = "bf16": aggregate()'s pushes (wire::kind::push
  /// with values) send their floats rounded to bf16 (to nearest even;
  /// core/bf16.hpp), half the bytes, and the node answers them with the
  /// parameters in bf16, which the answer widens back to float32. The
  /// caller keeps the error feedback (dist/worker.cpp). Pulls, pushes of
  /// parameters (average) and streamed or sparse pushes stay float32.
  void set_wire_bf16(bool on) { wire_bf16_ = on; }

  /// The rows `ids` (1-D int32 or int64) name of table `var` on the node
  /// (messages/variable.hpp's gather): the rows [n] + the table's
  /// shape[1:] and the table's version. Only the ids go out and only those
  /// rows come back. An id out of range is the node's invalid_argument
  /// naming it, the table and the node. Errors otherwise as for call() (a
  /// read: sent again once on a fresh connection if the node had closed a
  /// quiet one); `wait` (0: the channel's timeout) bounds the reply.
  caf::expected<std::pair<tensor, uint64_t>> gather_rows(const std::string& var,
                                                         const tensor& ids,
                                                         std::chrono::milliseconds wait = {});

  /// One sparse push (wire::kind::push_sparse) to aggregator `name` of the
  /// node: `dense` the dense variables' gradients (float32, sent flat
  /// without a copy), and per table `ids[t]` (1-D int32 or int64; int32 is
  /// widened to int64 for the wire) and `rows[t]` (float32 [n] + the
  /// table's shape[1:]); all empty: an abstention. Token, seq, `wait` and
  /// `dropped_late` as for aggregate(). The global step: the answer carries
  /// no parameters.
  caf::expected<uint64_t> push_sparse(const std::string& name, uint32_t worker, uint64_t step,
                                      const std::vector<tensor>& dense,
                                      const std::vector<tensor>& ids,
                                      const std::vector<tensor>& rows,
                                      std::chrono::milliseconds wait, const std::string& token,
                                      uint64_t seq, bool* dropped_late = nullptr);

  // -- pipelined requests: one thread with a request out to several nodes --

  /// What next_reply() gives: the value (gather_rows' rows, a read's value;
  /// none for a sparse push), the version (a push: the global step after
  /// it) and whether a sync push was dropped as late.
  struct answer {
    tensor value;
    uint64_t version = 0;
    bool dropped_late = false;
  };
  /// Sends gather_rows, a read, or a sparse push (arguments as for
  /// gather_rows(), call() and push_sparse()) and returns once it is sent:
  /// its answer comes from next_reply(), in the order the requests went out
  /// (the node serves one connection's frames in turn). Requests of several
  /// channels sent before any answer is read travel and are served at once,
  /// with no thread per channel. While requests are out no other call may
  /// be made on the channel, and none is sent again on a fresh connection
  /// (gather_rows()' retry of a quiet one): a broken connection fails every
  /// request still out. The requests out must fit the connection's buffers
  /// (a sender blocked on a full one while the node is blocked on its full
  /// reply ends with the deadline, not a hang).
  caf::error send_gather_rows(const std::string& var, const tensor& ids,
                              std::chrono::milliseconds wait = {});
  caf::error send_read(const std::string& var, std::chrono::milliseconds wait = {});
  /// One part of send_gather_many: the rows `ids` (1-D int64) name of table
  /// `var`, or, with `ids` empty, the value of variable `var`.
  struct gather_ask {
    std::string var;
    tensor ids;
  };
  /// Every part's rows or value from the node in one frame
  /// (wire::kind::gather_many; docs/wire.md "gather_many"): one request
  /// and one answer instead of a gather_rows or read per variable. Its
  /// answer's value is the reply's payload: split_gather_many() cuts it
  /// into the parts' tensors. A part the node refuses refuses them all
  /// (the error names the part).
  caf::error send_gather_many(const std::vector<gather_ask>& parts,
                              std::chrono::milliseconds wait = {});
  /// The `parts` tensors of a gather_many answer's payload, in the order
  /// they were asked, each over the payload's buffer (no copy) and with
  /// the version its variable was read at; internal if the payload is not
  /// a well-formed answer of that many parts.
  static caf::expected<std::vector<answer>> split_gather_many(const tensor& payload, size_t parts);
  caf::error send_push_sparse(const std::string& name, uint32_t worker, uint64_t step,
                              const std::vector<tensor>& dense, const std::vector<tensor>& ids,
                              const std::vector<tensor>& rows, std::chrono::milliseconds wait,
                              const std::string& token, uint64_t seq);
  /// The answer to the oldest request out; an error (the node's, or the
  /// channel's, which drops it) for it otherwise.
  caf::expected<answer> next_reply();
  /// Requests sent and not yet answered.
  size_t in_flight() const { return pending_.size(); }
  /// Waits, at most until `until`, for the oldest request's answer (its
  /// first bytes) or the connection's end, reading nothing: true once
  /// next_reply() would not wait for the node, or with nothing out (on
  /// every transport: the socket, the shared-memory ring, UCX's stream).
  /// For a thread with requests out to several nodes that reads whichever
  /// answers first.
  bool await_reply(std::chrono::steady_clock::time_point until);

  /// One value of step `step` of graph `graph` (produced by op `op`, sent at
  /// `sent_ns` on this host's steady clock) to the executor of `device` on
  /// the node: none once the node handed it to the executor. `token` is the
  /// graph's edge token (16 bytes; the executor drops a value without it).
  /// Errors as for call(); `wait` (0: the channel's timeout) bounds the send
  /// and the ack.
  caf::error send_edge(const std::string& device, uint64_t graph, const std::string& token,
                       uint64_t step, int32_t op, int64_t sent_ns, const tensor& value,
                       std::chrono::milliseconds wait = {});

  bool broken() const { return fd_ < 0; }

  /// Answers read in place from a shared-memory answer slot so far (the
  /// others were copied out of the ring or the socket): for tests and
  /// benches.
  uint64_t answers_in_place() const { return answers_in_place_; }

  /// "TLSv1.3 TLS_AES_128_GCM_SHA256" on a TLS connection, else empty.
  std::string tls_description() const;

  /// How the frames travel now: "tls", "shared memory", "ucx (tcp)" (UCX and
  /// its transports) or "tcp".
  std::string transport() const;

  /// Makes now the move (to shared memory, or UCX) that this connection
  /// would make before its next op, so that transport() says where its ops
  /// will go (ping). Nothing if there is none to make; errors as for call().
  caf::error settle(std::chrono::milliseconds wait = {});

  /// While `cancel` is set, a call() waiting for its reply gives up within
  /// 20 ms with af_error::cancelled and closes the connection (the reply
  /// would come on it later); the caller reopens it for its next call.
  void set_cancel(std::shared_ptr<const std::atomic<bool>> cancel) { cancel_ = std::move(cancel); }

private:
  /// One call's own wait for its reply (`wait`; 0: the channel's timeout)
  /// while it lives, the channel's timeout again afterwards. On plaintext
  /// TCP and shared memory the socket keeps the call's wait after it
  /// (call_wait_), so that back-to-back calls with about the same wait (a
  /// session's retried updates: a third of what is left) make no system
  /// call for it; the next op of another kind sets the channel's timeout
  /// again first (restore_timeouts). Over TLS, whose record layer sets the
  /// send wait itself, both go back at once as before.
  struct wait_scope {
    wait_scope(data_channel& channel, std::chrono::milliseconds wait);
    ~wait_scope();
    wait_scope(const wait_scope&) = delete;
    wait_scope& operator=(const wait_scope&) = delete;
    data_channel& ch;
    std::chrono::milliseconds saved;
    bool touched = false; ///< SO_RCVTIMEO set to what was left of the call's time
  };
  /// The wait the socket's SO_RCVTIMEO and SO_SNDTIMEO hold between calls
  /// instead of timeout_ (0: timeout_), and whether a wait_scope is open.
  std::chrono::milliseconds call_wait_{0};
  bool in_scope_ = false;
  /// Sets the socket's timeouts back to timeout_ if a call left its own wait
  /// there (outside a wait_scope only).
  void restore_timeouts();

  data_channel(int fd, std::string host, uint16_t port, std::string peer,
               std::chrono::milliseconds timeout, std::chrono::microseconds poll,
               std::shared_ptr<tls_context> tls)
    : fd_(fd), host_(std::move(host)), port_(port), peer_(std::move(peer)), timeout_(timeout),
      poll_(poll), last_reply_(std::chrono::steady_clock::now()), tls_(std::move(tls)) {}
  /// Closes the connection (and frees its TLS session): broken() turns true.
  void drop();
  /// The error of a failed send or read (EAGAIN: a timeout after `waited`,
  /// 0: the channel's timeout; `sending`: the node stopped reading the
  /// request; ECANCELED: cancelled); the connection is dropped.
  caf::error fail(const std::string& what, int err,
                  std::chrono::milliseconds waited = std::chrono::milliseconds{0},
                  bool sending = false);
  /// The reply to the request just sent, by `until` (the try's deadline);
  /// a timeout names `wait`, the request's own (0: the channel's).
  caf::expected<std::pair<tensor, uint64_t>> read_reply(const std::string& what,
                                                        std::chrono::steady_clock::time_point until,
                                                        std::chrono::milliseconds wait = {});
  /// With a cancel flag, on a socket: waits until the socket has bytes,
  /// looking at the flag every 20 ms (set: the connection dropped,
  /// af_error::cancelled); past `until`: fail(what, EAGAIN, wait).
  caf::error await_readable(const std::string& what, std::chrono::steady_clock::time_point until,
                            std::chrono::milliseconds wait = {});
  /// Looks for the reply a moment before the caller sleeps in its read; on a
  /// plain socket the looks read the reply's first bytes into `head` (up to
  /// `n`: its header) themselves. The bytes read so (0: none, or not a plain socket).
  size_t poll_for_reply(void* head, size_t n);
  void reopen_if_closed_by_peer();
  /// The connection's byte stream for a request or reply bounded by `deadline`.
  data_link io(std::chrono::steady_clock::time_point deadline) const;
  /// After the node's first answer: offers shared memory (once per
  /// connection). An error only if the connection failed meanwhile.
  caf::error upgrade_if_due(std::chrono::steady_clock::time_point deadline);
  /// upgrade_if_due's offer, whether or not the connection was quiet.
  caf::error make_offer(std::chrono::steady_clock::time_point deadline);
  /// A fresh connection in place of this one; false (the old one kept) if
  /// the node cannot be reached.
  bool reconnect();

  int fd_;
  std::string host_;
  uint16_t port_;
  std::string peer_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds poll_;
  std::chrono::steady_clock::time_point last_reply_;
  uint16_t reply_flags_ = 0; ///< the last reply's `reserved` (wire::reply_flags)
  /// Aggregators whose last push reply asked for whole pushes
  /// (wire::reply_flags::whole_pushes): push_streamed sends theirs whole.
  std::vector<std::string> whole_pushes_;
  /// Notes the last reply's whole_pushes bit for aggregator `name`.
  void note_whole_pushes(const std::string& name);
  bool wire_bf16_ = false;   ///< set_wire_bf16
  std::vector<uint16_t> bf16_out_, bf16_in_; ///< a push narrowed, an answer before it is widened
  std::shared_ptr<const std::atomic<bool>> cancel_;
  std::shared_ptr<tls_context> tls_; ///< null: plaintext
  secure_stream* stream_ = nullptr;  ///< the connection's record layer (with tls_), owned
  /// What carries the bytes now (net/byte_channel.hpp): the socket's,
  /// stream_bytes_ or moved_bytes_.
  byte_channel* bytes_ = &tcp_bytes();
  std::unique_ptr<byte_channel> stream_bytes_; ///< over stream_
  std::unique_ptr<byte_channel> moved_bytes_;  ///< over shm_ or ucx_, once moved
  bool shm_wanted_ = true;           ///< connect's `shared_memory`
  bool shm_possible_ = false;        ///< this connection may offer it (same host, no TLS)
  bool shm_due_ = false;             ///< the node answered: offer before the next request
  std::unique_ptr<shm_channel> shm_; ///< the rings, once the node took the offer
  uint64_t largest_answer_ = 0;      ///< the largest tensor answer so far: sizes the offer's slots
  uint64_t answers_in_place_ = 0;    ///< answers_in_place()
  bool ucx_trusted_ = false;         ///< connect's `trusted_fabric`
  bool ucx_possible_ = false;        ///< this connection may offer UCX (checked in upgrade_if_due)
  std::unique_ptr<ucx_channel> ucx_; ///< UCX, once the node took that offer
  bool ucx_failed_ = false;          ///< UCX could not reach the node: no more offers (across reconnects)
  bool ucx_carried_ = false;         ///< a reply came over ucx_ (else its failure counts as UCX's)
  /// upgrade_if_due's offer of UCX.
  caf::error offer_ucx(std::chrono::steady_clock::time_point deadline);
  /// From now on the connection's bytes go over `b` (shm_'s or ucx_'s).
  void move_to(std::unique_ptr<byte_channel> b);

  /// A pipelined request out (send_gather_rows ...): what it is, for
  /// errors, its deadline and the wait its reply gets.
  struct pending_request {
    std::string what;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds wait;
  };
  std::deque<pending_request> pending_;
  /// SO_RCVTIMEO while requests are out (timeout_ when none are).
  std::chrono::milliseconds pending_rcv_{0};
  /// The checks (a name of `name_bytes` the frame can carry, an open
  /// connection) and the deadline of a pipelined request `what` about to go
  /// out, whose reply waits `wait`; an error if it cannot go.
  caf::expected<std::chrono::steady_clock::time_point>
  begin_request(const std::string& what, size_t name_bytes, std::chrono::milliseconds wait);
  /// The frame of `h`, `name` and `iov` (the payload's pieces) sent as a
  /// pipelined request `what` with deadline `deadline` and reply wait `wait`.
  caf::error send_pipelined(std::string what, std::chrono::steady_clock::time_point deadline,
                            std::chrono::milliseconds wait, std::vector<iovec>& iov);

  /// On shared memory, where a frame's payload (after `before_payload`
  /// bytes of header and name) would not start at a multiple of
  /// shm_channel::payload_alignment of the ring: true, and `pad` the
  /// padding frame (wire::kind::shm_pad) to send first, so that the node
  /// can read the payload in place.
  bool pad_before(wire::header& pad, uint64_t before_payload) const;
};

} // namespace af
