#pragma once
// A bare Cap'n Proto client of `glint serve`'s gateway, for tests that must
// speak the wire protocol themselves (random fields, no heartbeat): no
// glint runtime, no validation on this side. Lives on the calling thread's
// own KJ event loop.

#include "rpc/glint.capnp.h"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <string>

namespace glint::rpc::testing {

class RawSession {
public:
  /// Connects to 127.0.0.1:port and authenticates with `key`; `status()`
  /// says whether the server accepted it.
  RawSession(int port, const std::string& key, uint64_t max_message_words = 8 << 20)
      : io_(kj::setupAsyncIo()),
        stream_(io_.provider->getNetwork()
                    .parseAddress("127.0.0.1", static_cast<unsigned>(port))
                    .wait(io_.waitScope)
                    ->connect()
                    .wait(io_.waitScope)),
        network_(*stream_, capnp::rpc::twoparty::Side::CLIENT, options(max_message_words)),
        rpc_(capnp::makeRpcClient(network_)) {
    capnp::MallocMessageBuilder vat;
    auto vat_id = vat.initRoot<capnp::rpc::twoparty::VatId>();
    vat_id.setSide(capnp::rpc::twoparty::Side::SERVER);
    auto hello = rpc_.bootstrap(vat_id).castAs<wire::Gateway>().connectRequest();
    hello.setProtocolVersion(wire::PROTOCOL_VERSION);
    hello.setApiKey(key);
    auto answer = hello.send().wait(io_.waitScope);
    status_ = answer.getStatus().getCode();
    message_ = answer.getStatus().getMessage().cStr();
    idle_seconds_ = answer.getLimits().getIdleSeconds();
    session_ = answer.getSession();
  }

  uint16_t status() const { return status_; }
  const std::string& message() const { return message_; }
  int64_t idle_seconds() const { return idle_seconds_; }
  wire::Session::Client& session() { return session_; }
  kj::WaitScope& wait_scope() { return io_.waitScope; }
  void sleep_ms(uint64_t ms) { io_.provider->getTimer().afterDelay(ms * kj::MILLISECONDS).wait(io_.waitScope); }

  /// Adds a rank-2 LoRA adapter on q_proj named `name`; the status code.
  uint16_t add_small_adapter(const std::string& name) {
    auto add = session_.addAdapterRequest();
    add.setName(name);
    add.getLora().setR(2);
    add.getLora().setAlpha(4);
    add.getLora().initTargetModules(1).set(0, "q_proj");
    return add.send().wait(io_.waitScope).getStatus().getCode();
  }

private:
  static capnp::ReaderOptions options(uint64_t words) {
    capnp::ReaderOptions o;
    o.traversalLimitInWords = words;
    return o;
  }
  kj::AsyncIoContext io_;
  kj::Own<kj::AsyncIoStream> stream_;
  capnp::TwoPartyVatNetwork network_;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc_;
  wire::Session::Client session_{nullptr};
  uint16_t status_ = 0;
  std::string message_;
  int64_t idle_seconds_ = 0;
};

}  // namespace glint::rpc::testing
