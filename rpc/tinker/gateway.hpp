#pragma once
/// The Tinker-compatible HTTP API of `glint serve` (docs/tinker.md): what the
/// Tinker SDK and the tinker-cookbook's loops call, answered by the same
/// core as the native Cap'n Proto API. Each request authenticates with its
/// X-API-Key (a key of `glint serve keys create`: a Tinker key is a tenant
/// key) and is turned into calls on that tenant's in-process Session
/// (rpc/glint.capnp), so validation, fairness, limits, isolation and
/// checkpoints are the native API's own. Runs on the server's I/O thread
/// (KJ's event loop): a long poll is a promise, not a thread.
///
/// What the gateway adds: Tinker's ids (sessions, models, sampling
/// sessions, futures, tinker:// paths), its futures (retrieve_future long
/// polls), each model's calls executed in seq_id order whatever order they
/// arrive in, retries answered with the original future, and the two wire
/// formats (rpc/tinker/codec.hpp).

#include "rpc/tenant_store.hpp"
#include "runtime/error.hpp"

#include "rpc/glint.capnp.h"

#include <kj/compat/http.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace glint::components {
class Template;
class Tokenizer;
}  // namespace glint::components

namespace glint::rpc::tinker {

/// What the gateway needs from the server (rpc/server.cpp implements it).
class Host {
public:
  virtual ~Host() = default;
  /// The tenant and the key id of a valid, unrevoked key; permission_denied
  /// otherwise.
  virtual Result<std::pair<std::string, std::string>> authenticate(const std::string& key) = 0;
  /// A session of the tenant on the server's core, as a native client's.
  virtual wire::Session::Client session(const std::string& tenant, const std::string& key_id) = 0;
  /// The tenants' checkpoints (read-only here; changes go through sessions).
  virtual const TenantStore& store() const = 0;
};

/// The served base model, as Tinker clients see it.
struct BaseModel {
  std::string name;          ///< what create_model's base_model must be (ServeConfig::tinker.base_model)
  std::string tokenizer_id;  ///< what get_info answers (a Hugging Face id the client can load)
  std::string arch;          ///< config.json's model_type
  int64_t vocab_size = 0;
  int64_t max_context = 0;
  /// The OpenAI-compatible door (/v1, rpc/tinker/openai.hpp) renders chats
  /// with the model's own template and encodes and decodes with its
  /// tokenizer; null: /v1 answers that the server cannot (chat: no template).
  std::shared_ptr<const components::Tokenizer> tokenizer{};
  std::shared_ptr<const components::Template> chat{};
};

struct GatewayOptions {
  int64_t max_body_bytes = int64_t{256} << 20;
  /// Sample calls of one tenant running at once; over it, asample answers 429.
  int64_t max_samples_in_flight = 64;
  /// retrieve_future holds a poll this long before it answers try_again.
  std::chrono::milliseconds poll{25000};
  /// A finished future's result is kept this long for retrieve_future...
  std::chrono::seconds future_ttl{3600};
  /// ...and this long once it has been answered (a client's retry of the
  /// same retrieval still finds it; the result's memory does not wait an hour).
  std::chrono::seconds retrieved_ttl{120};
  /// A call waiting for an earlier seq_id that has not come by then fails.
  std::chrono::seconds seq_gap{120};
  /// Ephemeral sampler weights (save_weights_and_get_sampling_client) kept
  /// per model: an older sampling session's weights are dropped.
  int64_t ephemeral_per_model = 2;
  /// Weights of tinker:// paths kept in the sampler per tenant; the least
  /// recently used path's sampling sessions end when another is loaded.
  int64_t path_adapters = 3;
  /// The server's tokens_per_call: a forward_backward with more (padded)
  /// tokens runs in parts, which add up (Tinker's losses are sums).
  int64_t tokens_per_call = 262144;
  double lora_alpha = 32;  ///< Tinker's LoRA scale is alpha / rank
  /// A request's body must arrive within this (else 408 and the
  /// connection closes): a trickled body does not hold a connection.
  std::chrono::seconds body_timeout{60};
  /// Per tenant: the bytes its bodies being read and its calls waiting for
  /// an earlier seq_id may hold at once ([limits] request_mib); over it,
  /// 429 (bodies) or a refused call (queued batches).
  int64_t request_bytes = int64_t{512} << 20;
};

/// The HTTP service. Construct it on the I/O thread, serve it with a
/// kj::HttpServer built on `headers()`.
class Gateway final : public kj::HttpService {
public:
  Gateway(Host& host, BaseModel base, GatewayOptions options, kj::Timer& timer);
  ~Gateway();

  /// The header table the server must use (it knows X-API-Key and the
  /// other headers the gateway reads).
  const kj::HttpHeaderTable& headers() const;

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                            kj::AsyncInputStream& body, Response& response) override;

  /// Fails calls stuck behind a missing seq_id, forgets expired futures,
  /// retries sampler adapters it could not remove. Call it now and then
  /// (the server's sweep does).
  void sweep();
  /// The server freed `tenant`'s adapters (idle): its models and sampling
  /// sessions are gone; calls still waiting fail saying so.
  void forget_adapters(const std::string& tenant);

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace glint::rpc::tinker
