#pragma once
/// `ProcessGroup`: collectives across the ranks of a group (c10d: Gloo on
/// CPU; NCCL when built with CUDA), for gradient all-reduce across
/// data-parallel ranks and weight broadcast.
///
///   auto pg = ProcessGroup::create({.store_host = "127.0.0.1", .store_port = port, .rank = r, .world_size = 2});
///   pg->all_reduce_sum(tensors);          // in place, every rank gets the sum
///
/// Rendezvous goes through a c10d TCPStore that rank 0 hosts on
/// store_host:store_port (the placement service hands the address out). Ranks
/// may be threads of one process or separate processes. Every call blocks
/// until all ranks have joined it or `timeout` passes (then an error naming
/// the collective). A rank that goes silent (frozen, cut off) fails the
/// others' collectives within `peer_timeout` instead, naming it (heartbeats
/// over UDP, components/comm/peer_watch.hpp); the group is then broken and
/// every later call fails at once. Not thread-safe: one caller per group, as
/// c10d.

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace glint::components {

struct CommConfig {
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  int rank = 0;
  int world_size = 1;
  std::string backend = "gloo";  ///< "gloo" (CPU); "nccl" needs a CUDA build
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string prefix = "glint";  ///< keys in the store, so that several groups share one
  /// A rank not heard from for this long fails the collectives that wait for
  /// it. 0: the runtime's peer timeout (GLINT_PEER_TIMEOUT_MS), else 5 s.
  std::chrono::milliseconds peer_timeout{0};
};

/// The collectives glint uses, as an interface: `create` makes the c10d
/// one; tests put a fake in its place to reach the error paths of its
/// callers (a rank that fails or never answers) without a second process.
class ProcessGroup {
public:
  /// A c10d group (Gloo on CPU) joined through the store in `cfg`.
  static Result<std::shared_ptr<ProcessGroup>> create(const CommConfig& cfg);
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Whether a collective gave up on a silent rank: every later call fails.
  virtual bool broken() const { return false; }
  /// Sums each tensor over all ranks, in place (f32, f16, bf16, f64, i64, i32).
  virtual Result<void> all_reduce_sum(std::vector<Tensor>& tensors) = 0;
  /// Copies each of root's tensors to every rank, in place.
  virtual Result<void> broadcast(std::vector<Tensor>& tensors, int root) = 0;
  /// The same, in buckets: runs of tensors of one dtype, up to about
  /// bucket_bytes, travel as one flat buffer each (few large messages
  /// instead of many small ones). Every rank passes tensors of the same
  /// shapes and dtypes, in the same order. Answers the buckets sent.
  virtual Result<int64_t> broadcast_buckets(std::vector<Tensor>& tensors, int root, int64_t bucket_bytes) = 0;
  virtual Result<void> barrier() = 0;

  /// Every rank's `input` (one shape and dtype on all ranks), end to end in
  /// rank order along dim 0, into `output` (size() x input's first dim).
  virtual Result<void> all_gather(const Tensor& input, Tensor& output) = 0;
  /// `input` (size() x output's elements on every rank) summed over ranks;
  /// this rank's slice of the sum (elements [rank x n, (rank + 1) x n))
  /// into `output`. Callers that want a mean divide: there is no AVG on
  /// Gloo. Gloo has no native reduce-scatter: it runs as an all-reduce of a
  /// copy, then the slice (twice the bytes of a native one; NCCL's would
  /// serve it as is).
  virtual Result<void> reduce_scatter_sum(const Tensor& input, Tensor& output) = 0;
  /// Rows (dim 0) to every rank, for expert parallelism: the first
  /// input_rows[0] rows of `input` to rank 0, the next input_rows[1] to rank
  /// 1, ...; `output` (preallocated, the same dtype and trailing shape) gets
  /// output_rows[r] rows from each rank r, in rank order. Each rank's counts
  /// must mirror the others' (input_rows[r] here is output_rows[this rank]
  /// on r). Both contiguous.
  virtual Result<void> all_to_all(const Tensor& input, const std::vector<int64_t>& input_rows, Tensor& output,
                                  const std::vector<int64_t>& output_rows) = 0;
  /// Point to point, for pipeline stages: `send` hands `t` to rank `to`
  /// and returns once `to` has received it (Gloo's send is a rendezvous: two
  /// ranks that both send first wait for each other); `recv` fills `t` (its
  /// shape and dtype agreed beforehand) from rank `from`. Messages between
  /// two ranks with one tag arrive in order.
  virtual Result<void> send(const Tensor& t, int to, int tag) = 0;
  virtual Result<void> recv(Tensor& t, int from, int tag) = 0;

  /// A send posted and not yet waited for.
  class PendingSend {
  public:
    virtual ~PendingSend() = default;
    /// Returns once the receiver has it (or the send failed).
    virtual Result<void> wait() = 0;
  };
  /// `send` without waiting for the receiver: a pipeline stage posts its
  /// sends and goes on to its receives (two neighbours that both send first
  /// would otherwise wait for each other). `t` must not change until the
  /// wait. Every group must post for real: one that sent at once here
  /// would deadlock the pipeline (a wrapper forwards it to its inner group).
  virtual Result<std::unique_ptr<PendingSend>> send_async(const Tensor& t, int to, int tag) = 0;
};

}  // namespace glint::components
