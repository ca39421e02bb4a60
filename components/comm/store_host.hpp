#pragma once
/// One rendezvous store for many process groups. A model group cut over a
/// mesh (FSDP, TP, PP, with DP) has a process group per dimension and
/// slice, most of which do not hold the group's rank 0; rather than a port
/// per group, the group's rank 0 hosts one store and every process group
/// joins it as a client under its own prefix:
///
///   auto host = StoreHost::open("127.0.0.1", port);               // on rank 0, first
///   auto tp = join_hosted_group({.store_host = "127.0.0.1", .store_port = port,
///                                .rank = r, .world_size = 2, .prefix = "glint/model/tp/0"});

#include "components/comm/process_group.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace glint::components {

/// The c10d TCPStore server on host:port, for as long as it lives.
class StoreHost {
public:
  static Result<std::unique_ptr<StoreHost>> open(const std::string& host, uint16_t port,
                                                 std::chrono::milliseconds timeout = std::chrono::minutes(5));
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

private:
  StoreHost() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// ProcessGroup::create for a group whose store a StoreHost serves: every
/// rank, rank 0 too, joins the store at cfg.store_host:store_port as a
/// client (keys under cfg.prefix, which must differ between the groups).
Result<std::shared_ptr<ProcessGroup>> join_hosted_group(const CommConfig& cfg);

}  // namespace glint::components
