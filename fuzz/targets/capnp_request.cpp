// The Cap'n Proto door: a request's parameters as `glint serve` reads them
// (rpc/server.cpp through rpc/convert.hpp). The first byte picks the method
// (addAdapter, setLoss, setOptimizer, setLrScheduler, forwardBackward,
// sample, loadAdapter); the rest is the message, read with the server's
// limits. Whatever a reader accepts is valid by its own rules, and written
// back and read again it is the same value: its second writing is the
// first's bytes.
#include "common.hpp"

#include "rpc/convert.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include <cstring>

using namespace glint;
using namespace glint::rpc;

namespace {

/// The server's reader limits (rpc/detail/kj_bridge.hpp's reader_options)
/// for its default message_mib of 32.
capnp::ReaderOptions server_options() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = (uint64_t{32} << 20) / 8 + 1024;
  return o;
}

/// read, write, read, write: the two writings agree.
template <class Wire, class Read, class Write>
void round_trip(typename Wire::Reader in, Read read, Write write, const char* what) {
  auto first = read(in);
  if (!first) {
    (void)describe(first.error());
    return;
  }
  capnp::MallocMessageBuilder a;
  write(a.initRoot<Wire>(), *first);
  const auto a_bytes = message_bytes(a);
  auto again = read(a.getRoot<Wire>().asReader());
  GLINT_FUZZ_CHECK(static_cast<bool>(again), std::string{what} + " written does not read back: " + describe(again.error()));
  capnp::MallocMessageBuilder b;
  write(b.initRoot<Wire>(), *again);
  GLINT_FUZZ_CHECK(message_bytes(b) == a_bytes, std::string{what} + " reads back as another value");
}

constexpr int64_t kVocab = 400;  // the test base's

void one(uint8_t method, capnp::FlatArrayMessageReader& msg) {
  using S = wire::Session;
  switch (method % 7) {
    case 0: {
      auto p = msg.getRoot<S::AddAdapterParams>();
      if (auto n = read_name(p.getName(), "adapter name"); n)
        GLINT_FUZZ_CHECK(!n->empty() && n->find('/') == std::string::npos, "a name with a slash: " + *n);
      round_trip<wire::LoraConfig>(p.getLora(), [](auto r) { return read_lora(r); },
                                   [](auto b, const auto& v) { write_lora(b, v); }, "lora");
      break;
    }
    case 1:
      round_trip<wire::LossSpec>(msg.getRoot<S::SetLossParams>().getLoss(), [](auto r) { return read_loss(r); },
                                 [](auto b, const auto& v) { write_loss(b, v); }, "loss");
      break;
    case 2:
      round_trip<wire::OptimizerConfig>(msg.getRoot<S::SetOptimizerParams>().getOptimizer(),
                                        [](auto r) { return read_optimizer(r); },
                                        [](auto b, const auto& v) { write_optimizer(b, v); }, "optimizer");
      break;
    case 3:
      round_trip<wire::SchedulerConfig>(msg.getRoot<S::SetLrSchedulerParams>().getScheduler(),
                                        [](auto r) { return read_scheduler(r); },
                                        [](auto b, const auto& v) { write_scheduler(b, v); }, "scheduler");
      break;
    case 4:
      round_trip<wire::Batch>(msg.getRoot<S::ForwardBackwardParams>().getBatch(), [](auto r) { return read_batch(r); },
                              [](auto b, const auto& v) { write_batch(b, v, nullptr); }, "batch");
      break;
    case 5: {
      auto p = msg.getRoot<S::SampleParams>();
      round_trip<wire::SamplingParams>(p.getParams(), [](auto r) { return read_sampling(r); },
                                       [](auto b, const auto& v) { write_sampling(b, v); }, "sampling params");
      auto rs = read_requests(p.getRequests(), kVocab);
      if (!rs) {
        (void)describe(rs.error());
        break;
      }
      for (const auto& r : *rs)
        for (auto t : r.prompt) GLINT_FUZZ_CHECK(t >= 0 && t < kVocab, "a prompt token outside the vocabulary");
      break;
    }
    default: {
      auto files = read_files(msg.getRoot<S::LoadAdapterParams>().getFiles());
      if (!files) {
        (void)describe(files.error());
        break;
      }
      for (const auto& f : *files)
        GLINT_FUZZ_CHECK(!f.name.empty() && f.name.find('/') == std::string::npos &&
                             f.name.find('\0') == std::string::npos && f.name != "." && f.name != "..",
                         "a file name that leaves its directory: " + f.name);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > fuzz::kMaxInputBytes) return 0;
  // Aligned words, as the connection's buffer gives them.
  const size_t words = (size - 1) / sizeof(capnp::word);
  if (words == 0) return 0;
  auto buf = kj::heapArray<capnp::word>(words);
  std::memcpy(buf.begin(), data + 1, words * sizeof(capnp::word));
  try {
    capnp::FlatArrayMessageReader msg(buf, server_options());
    one(data[0], msg);
  } catch (const kj::Exception& e) {
    // Cap'n Proto's own refusal of a malformed message (a bad pointer, past
    // the traversal limit): the server's RPC system answers it with an error.
    (void)e.getDescription();
  }
  return 0;
}
