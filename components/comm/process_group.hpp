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
/// the collective). Not thread-safe: one caller per group, as c10d.

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
};

class ProcessGroup {
public:
  static Result<std::shared_ptr<ProcessGroup>> create(const CommConfig& cfg);
  ~ProcessGroup();

  int rank() const;
  int size() const;

  /// Sums each tensor over all ranks, in place (f32, f16, bf16, i64, i32).
  Result<void> all_reduce_sum(std::vector<Tensor>& tensors);
  /// Copies each of root's tensors to every rank, in place.
  Result<void> broadcast(std::vector<Tensor>& tensors, int root);
  /// The same, in buckets: runs of tensors of one dtype, up to about
  /// bucket_bytes, travel as one flat buffer each (few large messages
  /// instead of many small ones). Every rank passes tensors of the same
  /// shapes and dtypes, in the same order. Answers the buckets sent.
  Result<int64_t> broadcast_buckets(std::vector<Tensor>& tensors, int root, int64_t bucket_bytes);
  Result<void> barrier();

  struct Impl;
  Impl& impl() { return *impl_; }

private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace glint::components
