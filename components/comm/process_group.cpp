#include "components/comm/process_group_impl.hpp"
#include "components/comm/store_host.hpp"

#include "components/comm/peer_watch.hpp"

#include "components/tensor/torch_bridge.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/core/GradMode.h>

#include "runtime/log.hpp"
#include "runtime/process.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace glint::components {

namespace {

// GLINT_PEER_TIMEOUT_MS, the runtime's peer timeout (Options::peer_timeout),
// which glint run hands every process of a job; else its default.
Result<std::chrono::milliseconds> default_peer_timeout() {
  const char* v = std::getenv("GLINT_PEER_TIMEOUT_MS");
  if (!v || !*v) return std::chrono::milliseconds(5000);
  char* end = nullptr;
  const long long ms = std::strtoll(v, &end, 10);
  if (*end != '\0' || ms < 1)
    return make_error(errc::invalid_argument,
                      std::string{"GLINT_PEER_TIMEOUT_MS='"} + v + "' is not a positive number of milliseconds");
  return std::chrono::milliseconds(ms);
}

class GlooGroup final : public ProcessGroup {
public:
  ~GlooGroup() override {
    // A collective given up on may still sit in Gloo's worker thread until
    // Gloo's own timeout, and c10d's destructor would join it: let the
    // broken group go without waiting (one group's memory, once).
    if (!broken_reason.empty()) {
      (void)pg.release();
      (void)store.release();
    }
  }
  int rank() const override { return cfg.rank; }
  int size() const override { return cfg.world_size; }
  bool broken() const override { return !broken_reason.empty(); }
  Result<void> all_reduce_sum(std::vector<Tensor>& tensors) override;
  Result<void> broadcast(std::vector<Tensor>& tensors, int root) override;
  Result<int64_t> broadcast_buckets(std::vector<Tensor>& tensors, int root, int64_t bucket_bytes) override;
  Result<void> barrier() override;
  Result<void> all_gather(const Tensor& input, Tensor& output) override;
  Result<void> reduce_scatter_sum(const Tensor& input, Tensor& output) override;
  Result<void> all_to_all(const Tensor& input, const std::vector<int64_t>& input_rows, Tensor& output,
                          const std::vector<int64_t>& output_rows) override;
  Result<void> send(const Tensor& t, int to, int tag) override;
  Result<void> recv(Tensor& t, int from, int tag) override;
  Result<std::unique_ptr<PendingSend>> send_async(const Tensor& t, int to, int tag) override;

  CommConfig cfg;

  Result<void> check_peer(const char* what, int peer) const {
    if (peer < 0 || peer >= size() || peer == rank())
      return make_error(errc::invalid_argument, std::string{what} + " on rank " + std::to_string(rank()) + ": rank " +
                                                    std::to_string(peer) + " is not another rank of a group of " +
                                                    std::to_string(size()));
    return {};
  }
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::unique_ptr<PeerWatch> watch;
  std::string broken_reason;  ///< why an earlier collective was given up on

  // Waits for a collective while its ranks are alive: fails once one has
  // been silent for the peer timeout (Gloo would wait for its own timeout).
  // Collectives say they are done through their future; send and recv have
  // none (c10d's SendWork, RecvWork), and Gloo breaks the whole context when
  // a timed wait on them expires, so a helper thread waits on those, and is
  // left behind, until Gloo's own timeout, if the wait is given up on.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, bool has_future = true) {
    if (!watch) {
      work->wait();
      return;
    }
    struct Done {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::exception_ptr error;
      void set(std::exception_ptr e = nullptr) {
        {
          std::lock_guard lock(mu);
          done = true;
          error = std::move(e);
        }
        cv.notify_all();
      }
    };
    auto done = std::make_shared<Done>();
    if (has_future) {
      work->getFuture()->addCallback([done](c10::ivalue::Future&) { done->set(); });
    } else {
      std::thread([work, done] {
        try {
          work->wait();
          done->set();
        } catch (...) {
          done->set(std::current_exception());
        }
      }).detach();
    }
    const auto tick = std::max(watch->timeout() / 10, std::chrono::milliseconds(10));
    {
      std::unique_lock lock(done->mu);
      while (!done->cv.wait_for(lock, tick, [&] { return done->done; })) {
        if (auto why = watch->silent()) {
          broken_reason = *why;
          // This rank leaves the collective: it goes silent too, so that the
          // others give up on it as well instead of waiting out Gloo.
          lock.unlock();
          watch.reset();
          throw std::runtime_error(*why);
        }
      }
      if (done->error) std::rethrow_exception(done->error);
    }
    if (has_future) work->wait();  // Gloo's error, if it failed
  }

  template <class F>
  Result<void> run(const char* what, F&& f) {
    if (!broken_reason.empty())
      return make_error(errc::unavailable, std::string{what} + " on rank " + std::to_string(cfg.rank) +
                                               ": the process group is broken since an earlier collective gave up (" +
                                               broken_reason + ")");
    try {
      f();
      return {};
    } catch (const std::exception& e) {
      const auto* c = dynamic_cast<const c10::Error*>(&e);
      const std::string why = c ? c->what_without_backtrace() : e.what();
      auto who = closed_peer(why);
      return make_error(errc::unavailable, std::string{what} + " on rank " + std::to_string(cfg.rank) + " of " +
                                               std::to_string(cfg.world_size) + " failed: " +
                                               (who.empty() ? why : who + " (" + why + ")"));
    }
  }

  // Which rank a connection that Gloo saw closed or reset belongs to (its
  // message names only an address): in a group of two, the other; else the
  // one the heartbeats find silent, waited for up to the peer timeout (a
  // process that died sends none). Empty when the error is not a closed
  // connection or no rank is found.
  std::string closed_peer(const std::string& why) {
    static const char* closed[] = {"Connection reset", "Connection closed", "closed by peer", "Read error",
                                   "Write error", "Broken pipe", "Connection refused"};
    if (std::none_of(std::begin(closed), std::end(closed), [&](const char* m) { return why.find(m) != std::string::npos; }))
      return {};
    const std::string gone = " closed its connection: its process exited, or its link was reset";
    if (cfg.world_size == 2) return "rank " + std::to_string(1 - cfg.rank) + gone;
    if (!watch) return {};
    const auto deadline = std::chrono::steady_clock::now() + watch->timeout() + watch->timeout() / 5;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto silent = watch->silent()) return *silent;
      std::this_thread::sleep_for(std::max(watch->timeout() / 10, std::chrono::milliseconds(10)));
    }
    return {};
  }
};

Result<std::shared_ptr<ProcessGroup>> create_group(const CommConfig& cfg, bool host_store);

}  // namespace

Result<std::shared_ptr<ProcessGroup>> ProcessGroup::create(const CommConfig& cfg) {
  return create_group(cfg, /*host_store=*/cfg.rank == 0);
}

Result<std::shared_ptr<ProcessGroup>> join_hosted_group(const CommConfig& cfg) {
  return create_group(cfg, /*host_store=*/false);
}

struct StoreHost::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

Result<std::unique_ptr<StoreHost>> StoreHost::open(const std::string& host, uint16_t port,
                                                   std::chrono::milliseconds timeout) {
  if (port == 0) return make_error(errc::invalid_argument, "a store host needs a port");
  auto out = std::unique_ptr<StoreHost>(new StoreHost);
  out->impl_ = std::make_unique<Impl>();
  try {
    c10d::TCPStoreOptions so;
    so.port = port;
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = timeout;
    out->impl_->store = c10::make_intrusive<c10d::TCPStore>(host, so);
  } catch (const std::exception& e) {
    return make_error(errc::unavailable, "cannot host the process groups' store on " + host + ":" +
                                             std::to_string(port) + ": " + e.what());
  }
  return out;
}

StoreHost::~StoreHost() = default;

namespace {

Result<std::shared_ptr<ProcessGroup>> create_group(const CommConfig& cfg, bool host_store) {
  if (cfg.world_size < 1 || cfg.rank < 0 || cfg.rank >= cfg.world_size)
    return make_error(errc::invalid_argument, "process group rank " + std::to_string(cfg.rank) +
                                                  " is outside a world of " + std::to_string(cfg.world_size));
  if (cfg.backend != "gloo")
    return make_error(errc::unimplemented, "process group backend '" + cfg.backend +
                                               "' is not in this build (CPU build: use gloo)");
  if (cfg.store_port == 0 && cfg.world_size > 1)
    return make_error(errc::invalid_argument, "a process group of several ranks needs a store port");
  // The address the other ranks reach this one by: the local address of the
  // route to the store's host (loopback when the store is on loopback). Not
  // this host's name: on many machines (and in a network namespace) it
  // resolves to a loopback address that ranks on other machines cannot reach.
  auto local = local_address_towards(cfg.store_host, cfg.store_port);
  if (!local) return with_context(local.error(), "joining the process group");
  auto pg = std::make_shared<GlooGroup>();
  auto& impl = *pg;
  impl.cfg = cfg;
  auto ok = impl.run("joining the process group", [&] {
    c10d::TCPStoreOptions so;
    so.port = cfg.store_port;
    so.isServer = host_store;
    so.numWorkers = static_cast<size_t>(cfg.world_size);
    so.waitWorkers = false;
    so.timeout = cfg.timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(cfg.store_host, so);
    impl.store = c10::make_intrusive<c10d::PrefixStore>(cfg.prefix, tcp);
    auto opts = c10d::ProcessGroupGloo::Options::create(cfg.timeout);
    // Gloo binds to the interface GLOO_SOCKET_IFNAME names (PyTorch's
    // setting), else to that address.
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(*local));
    opts->threads = 1;
    impl.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl.store, cfg.rank, cfg.world_size, opts);
  });
  if (!ok) return ok.error();
  if (cfg.world_size > 1) {
    // Heartbeats: each rank's address goes through the store, as Gloo's do.
    auto timeout = cfg.peer_timeout.count() > 0 ? Result<std::chrono::milliseconds>{cfg.peer_timeout}
                                                : default_peer_timeout();
    if (!timeout) return timeout.error();
    // Without a watch (no socket to be had) the group still works: the
    // others leave this rank out, and Gloo's timeout bounds a freeze.
    auto watch = PeerWatch::open(cfg.rank, *local, *timeout);
    if (!watch)
      log::warn("process group rank " + std::to_string(cfg.rank) + ": no heartbeats (" + describe(watch.error()) +
                "); a frozen rank is noticed only at the group's timeout");
    std::vector<std::string> addresses(static_cast<size_t>(cfg.world_size));
    auto shared = impl.run("exchanging heartbeat addresses", [&] {
      const std::string mine = watch ? (*watch)->address() : PeerWatch::kNoWatch;
      impl.store->set("peer_watch/" + std::to_string(cfg.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
      for (int r = 0; r < cfg.world_size; ++r) {
        if (r == cfg.rank) continue;
        auto v = impl.store->get("peer_watch/" + std::to_string(r));
        addresses[static_cast<size_t>(r)] = std::string(v.begin(), v.end());
      }
    });
    if (!shared) return shared.error();
    if (watch) {
      if (auto started = (*watch)->start(addresses); !started) return started.error();
      // Every rank's first beat, before the group is used: a rank frozen
      // early is then silent, not "never heard". Milliseconds where UDP
      // passes; where it is blocked, the timeout once, and the watch warns.
      (void)(*watch)->await_peers((*watch)->timeout());
      impl.watch = std::move(*watch);
    }
  }
  return std::shared_ptr<ProcessGroup>{std::move(pg)};
}

}  // namespace

Result<void> GlooGroup::all_reduce_sum(std::vector<Tensor>& tensors) {
  if (tensors.empty() || size() == 1) return {};
  return run("all_reduce", [&] {
    c10::NoGradGuard no_grad;
    // One flat buffer per dtype: one collective instead of one per tensor.
    std::vector<at::Tensor> torch;
    for (auto& t : tensors) torch.push_back(to_torch(t));
    std::map<at::ScalarType, std::vector<at::Tensor*>> by_dtype;
    for (auto& t : torch) by_dtype[t.scalar_type()].push_back(&t);
    for (auto& [dtype, ts] : by_dtype) {
      if (ts.size() == 1) {  // reduced where it lies
        std::vector<at::Tensor> one{*ts.front()};
        wait(pg->allreduce(one));
        continue;
      }
      std::vector<at::Tensor> flat_parts;
      for (auto* t : ts) flat_parts.push_back(t->reshape({-1}));
      std::vector<at::Tensor> buf{at::cat(flat_parts)};
      wait(pg->allreduce(buf));
      int64_t offset = 0;
      for (auto* t : ts) {
        auto n = t->numel();
        t->copy_(buf[0].narrow(0, offset, n).view(t->sizes()));
        offset += n;
      }
    }
  });
}

CarriedError::CarriedError(caf::error e) : std::runtime_error(describe(e)), err(std::move(e)) {}

void throw_error(caf::error e) { throw CarriedError(std::move(e)); }

std::optional<caf::error> carried_error(const std::exception& e) {
  if (const auto* c = dynamic_cast<const CarriedError*>(&e)) return c->err;
  return std::nullopt;
}

Result<void> all_reduce_sum(ProcessGroup& pg, std::vector<at::Tensor>& tensors) {
  if (tensors.empty() || pg.size() == 1) return {};
  c10::NoGradGuard no_grad;
  // One contiguous buffer per dtype, seen as glint tensors, summed, copied back.
  std::map<at::ScalarType, std::vector<at::Tensor*>> by_dtype;
  for (auto& t : tensors) by_dtype[t.scalar_type()].push_back(&t);
  std::vector<at::Tensor> bufs;
  std::vector<Tensor> views;
  for (auto& [dtype, ts] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (auto* t : ts) flat_parts.push_back(t->reshape({-1}));
    bufs.push_back(at::cat(flat_parts));
    auto v = from_torch(bufs.back());
    if (!v) return v.error();
    views.push_back(std::move(*v));
  }
  if (auto ok = pg.all_reduce_sum(views); !ok) return ok;
  size_t k = 0;
  for (auto& [dtype, ts] : by_dtype) {
    int64_t offset = 0;
    for (auto* t : ts) {
      t->copy_(bufs[k].narrow(0, offset, t->numel()).view(t->sizes()));
      offset += t->numel();
    }
    ++k;
  }
  return {};
}

Result<void> GlooGroup::all_to_all(const Tensor& input, const std::vector<int64_t>& input_rows, Tensor& output,
                                   const std::vector<int64_t>& output_rows) {
  const auto n = static_cast<size_t>(size());
  auto sum = [](const std::vector<int64_t>& v) {  // -1 for a negative count, which no tensor matches
    int64_t s = 0;
    for (auto x : v) {
      if (x < 0) return int64_t{-2};
      s += x;
    }
    return s;
  };
  const int64_t in0 = input.shape().empty() ? -1 : input.shape()[0];
  const int64_t out0 = output.shape().empty() ? -1 : output.shape()[0];
  if (input_rows.size() != n || output_rows.size() != n || sum(input_rows) != in0 || sum(output_rows) != out0 ||
      input.dtype() != output.dtype())
    return make_error(errc::invalid_argument,
                      "all_to_all on rank " + std::to_string(rank()) + ": " + std::to_string(input_rows.size()) +
                          " input and " + std::to_string(output_rows.size()) + " output counts for " +
                          std::to_string(n) + " ranks, input " + input.describe() + ", output " + output.describe() +
                          " (the counts are rows, one per rank, summing to each tensor's first dim)");
  if (size() == 1) {
    c10::NoGradGuard no_grad;
    auto out = to_torch(output);
    if (out.numel() > 0) out.copy_(to_torch(input));
    return {};
  }
  return run("all_to_all", [&] {
    c10::NoGradGuard no_grad;
    auto in = to_torch(input), out = to_torch(output);
    auto in_splits = input_rows, out_splits = output_rows;
    wait(pg->alltoall_base(out, in, out_splits, in_splits));
  });
}

Result<void> GlooGroup::broadcast(std::vector<Tensor>& tensors, int root) {
  if (root < 0 || root >= size())
    return make_error(errc::invalid_argument, "broadcast root " + std::to_string(root) + " is not a rank");
  if (size() == 1) return {};
  return run("broadcast", [&] {
    std::vector<at::Tensor> ts;
    for (auto& t : tensors) ts.push_back(to_torch(t));
    for (auto& t : ts) {
      std::vector<at::Tensor> one{t};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      wait(pg->broadcast(one, o));
    }
  });
}

Result<int64_t> GlooGroup::broadcast_buckets(std::vector<Tensor>& tensors, int root, int64_t bucket_bytes) {
  if (root < 0 || root >= size())
    return make_error(errc::invalid_argument, "broadcast root " + std::to_string(root) + " is not a rank");
  if (bucket_bytes < 1) return make_error(errc::invalid_argument, "bucket_bytes must be at least 1");
  int64_t buckets = 0;
  auto ok = run("broadcast", [&] {
    c10::NoGradGuard no_grad;
    size_t i = 0;
    while (i < tensors.size()) {
      // A bucket: consecutive tensors of one dtype, up to bucket_bytes (at least one).
      std::vector<at::Tensor> part;
      int64_t bytes = 0;
      const auto dtype = tensors[i].dtype();
      while (i < tensors.size() && tensors[i].dtype() == dtype &&
             (part.empty() || bytes + static_cast<int64_t>(tensors[i].nbytes()) <= bucket_bytes)) {
        part.push_back(to_torch(tensors[i]));
        bytes += static_cast<int64_t>(tensors[i].nbytes());
        ++i;
      }
      ++buckets;
      if (size() == 1) continue;
      std::vector<at::Tensor> flat_parts;
      for (auto& t : part) flat_parts.push_back(t.reshape({-1}));
      std::vector<at::Tensor> flat{rank() == root ? at::cat(flat_parts) : at::empty({bytes / part.front().element_size()},
                                                                                   part.front().options())};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      wait(pg->broadcast(flat, o));
      if (rank() != root) {
        int64_t at = 0;
        for (auto& t : part) {
          t.copy_(flat[0].narrow(0, at, t.numel()).view(t.sizes()));
          at += t.numel();
        }
      }
    }
  });
  if (!ok) return ok.error();
  return buckets;
}

Result<void> GlooGroup::all_gather(const Tensor& input, Tensor& output) {
  if (input.dims() == 0 || output.dtype() != input.dtype() || output.dims() != input.dims() ||
      output.size(0) != input.size(0) * size() ||
      !std::equal(input.shape().begin() + 1, input.shape().end(), output.shape().begin() + 1))
    return make_error(errc::invalid_argument, "all_gather: the output must be the input's shape with " +
                                                  std::to_string(size()) + " times its first dimension, same dtype");
  return run("all_gather", [&] {
    c10::NoGradGuard no_grad;
    auto out = to_torch(output);
    std::vector<at::Tensor> in{to_torch(input)};
    if (size() == 1) {
      out.copy_(in[0]);
      return;
    }
    // Each rank's part lands in its own slice of the output.
    std::vector<std::vector<at::Tensor>> parts(1);
    for (int r = 0; r < size(); ++r) parts[0].push_back(out.narrow(0, r * input.size(0), input.size(0)));
    wait(pg->allgather(parts, in));
  });
}

Result<void> GlooGroup::reduce_scatter_sum(const Tensor& input, Tensor& output) {
  if (output.dtype() != input.dtype() || input.numel() != output.numel() * size())
    return make_error(errc::invalid_argument, "reduce_scatter_sum: the input must hold " + std::to_string(size()) +
                                                  " times the output's elements, same dtype (input " +
                                                  std::to_string(input.numel()) + ", output " +
                                                  std::to_string(output.numel()) + ")");
  return run("reduce_scatter", [&] {
    c10::NoGradGuard no_grad;
    auto out = to_torch(output);
    std::vector<at::Tensor> sum{to_torch(input).reshape({-1}).clone()};
    if (size() > 1) wait(pg->allreduce(sum));
    out.copy_(sum[0].narrow(0, rank() * output.numel(), output.numel()).view(out.sizes()));
  });
}

Result<void> GlooGroup::send(const Tensor& t, int to, int tag) {
  if (auto ok = check_peer("send", to); !ok) return ok;
  return run("send", [&] {
    std::vector<at::Tensor> one{to_torch(t).contiguous()};
    wait(pg->send(one, to, tag), false);
  });
}

Result<std::unique_ptr<ProcessGroup::PendingSend>> GlooGroup::send_async(const Tensor& t, int to, int tag) {
  if (auto ok = check_peer("send", to); !ok) return ok.error();
  struct Posted : PendingSend {
    GlooGroup* group = nullptr;
    c10::intrusive_ptr<c10d::Work> work;
    Result<void> wait() override {
      return group->run("send", [&] { group->wait(work, false); });
    }
  };
  auto posted = std::make_unique<Posted>();
  posted->group = this;
  auto ok = run("send", [&] {
    std::vector<at::Tensor> one{to_torch(t).contiguous()};
    posted->work = pg->send(one, to, tag);
  });
  if (!ok) return ok.error();
  return std::unique_ptr<PendingSend>{std::move(posted)};
}

Result<void> GlooGroup::recv(Tensor& t, int from, int tag) {
  if (auto ok = check_peer("recv", from); !ok) return ok;
  return run("recv", [&] {
    std::vector<at::Tensor> one{to_torch(t)};
    wait(pg->recv(one, from, tag), false);
  });
}

Result<void> GlooGroup::barrier() {
  if (size() == 1) return {};
  return run("barrier", [&] { wait(pg->barrier()); });
}

}  // namespace glint::components
