#pragma once
// What `glint serve` reads from its TOML file (docs/remote.md shows one):
//
//   model = "models/qwen-tiny"       # the base model every tenant trains adapters on
//   state_dir = "serve-state"        # keys, tenants, checkpoints (RocksDB and files)
//   full_training = "refuse"         # or "exclusive": one tenant at a time may train the whole model
//   [listen]
//   host = "127.0.0.1"               # anything but loopback needs [tls] or --insecure
//   port = 7733
//   [tls]
//   cert = "server.pem"              # PEM certificate chain
//   key = "server.key"               # PEM private key
//   [groups]
//   model_ranks = 1                  # data-parallel ranks of the shared model group
//   sampler_ranks = 1
//   sampler_cache_mib = 64
//   [limits]                         # per tenant; over one: resource_exhausted naming it
//   adapters = 8
//   max_rank = 64
//   tokens_per_call = 262144
//   calls_in_flight = 16
//   idle_seconds = 1800              # silent this long (no call, no heartbeat): its adapters are freed
//   memory_mib = 8192                # the whole server: adapters' weights, gradients and AdamW state, all ranks
//   connections = 1024               # the whole server: open connections at most
//   auth_seconds = 10                # a connection without a valid key by then is closed
//   connections_per_tenant = 64      # a tenant's authenticated connections at most
//   message_mib = 256                # largest message a peer may send
//   request_mib = 512                # per tenant: bodies being read and calls queued for an earlier seq_id
//   [metrics]                        # Prometheus text at http://host:port/metrics
//   host = "127.0.0.1"               # anything but loopback needs token_file
//   port = 9464                      # absent: no metrics endpoint
//   token_file = "metrics.token"     # then every scrape sends Authorization: Bearer <the file's text>
//   [tinker]                         # the Tinker-compatible HTTP API (docs/tinker.md); absent: off
//   host = "127.0.0.1"               # anything but loopback needs [tls] (the same cert) or --insecure
//   port = 7734
//   base_model = "Qwen/Qwen3-0.6B"   # the name clients pass as base_model (default: the model directory's name)
//   tokenizer_id = "Qwen/Qwen3-0.6B" # what get_info answers, for the SDK's get_tokenizer (default: base_model)
//   max_samples_in_flight = 12       # per tenant, below [limits] calls_in_flight; over it asample answers 429
//   poll_seconds = 25                # retrieve_future holds a poll this long, then answers try_again
//   seq_gap_seconds = 120            # a call waiting this long for an earlier seq_id fails
//   connections = 256                # open HTTP connections at most
//   body_seconds = 60                # a request body must arrive within this
//
// Every key is checked: an unknown key or a value of the wrong type is an
// error naming it (a typo never silently keeps a default).

#include "runtime/error.hpp"

#include <cstdint>
#include <string>

namespace glint::rpc {

struct TenantLimits {
  int64_t adapters = 8;             ///< model-group adapters a tenant may hold at once
  int64_t max_rank = 64;            ///< LoRA rank at most
  int64_t tokens_per_call = 262144; ///< tokens of one training batch, or prompt + new tokens of one sample call
  int64_t calls_in_flight = 16;     ///< a tenant's calls the server holds at once
  /// A tenant silent this long (no call; drivers send a heartbeat at a third
  /// of it) has its adapters freed from the groups; its checkpoints stay.
  int64_t idle_seconds = 1800;
  /// Not per tenant: what every tenant's adapters may hold in the server's
  /// memory together (weights, gradients and AdamW moments on each model
  /// rank, weights on each sampler rank), in bytes.
  int64_t memory_bytes = int64_t{8} << 30;
  /// Not per tenant: open connections at most (authenticated or not), and
  /// the seconds a new one has to present a valid key before it is closed.
  int64_t connections = 1024;
  int64_t auth_seconds = 10;
  /// Per tenant: its authenticated connections at most, so that one tenant
  /// cannot take every connection.
  int64_t connections_per_tenant = 64;
  /// Per tenant: what its Tinker request bodies being read and its calls
  /// waiting for an earlier seq_id may hold at once, in bytes.
  int64_t request_bytes = int64_t{512} << 20;
};

struct ServeConfig {
  std::string model_dir;
  std::string state_dir = "glint-serve";
  std::string host = "127.0.0.1";
  int port = 7733;  ///< 0: any free port (tests)
  std::string tls_cert, tls_key;
  bool insecure = false;  ///< the CLI's --insecure: plain TCP on a non-loopback address
  int model_ranks = 1;
  int sampler_ranks = 1;
  int64_t sampler_cache_bytes = int64_t{64} << 20;
  uint64_t sampling_seed = 0;
  /// "exclusive": a tenant that trains the base model itself (no adapter)
  /// holds the server alone until it disconnects or goes idle; the others'
  /// calls answer unavailable meanwhile, and the base is restored after.
  /// Otherwise full-parameter training is refused (the base is shared).
  bool exclusive_full_training = false;
  TenantLimits limits;
  int64_t max_message_bytes = int64_t{256} << 20;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;  ///< -1: no metrics endpoint; 0: any free port
  std::string metrics_token_file;  ///< empty: no token (then loopback only)
  /// The Tinker-compatible HTTP API ([tinker]); -1: off; 0: any free port.
  std::string tinker_host = "127.0.0.1";
  int tinker_port = -1;
  std::string tinker_base_model;    ///< empty: the model directory's name
  std::string tinker_tokenizer_id;  ///< empty: tinker_base_model
  /// Below limits.calls_in_flight, which every call of the tenant's counts
  /// against: the rest is room for its training calls.
  int64_t tinker_samples_in_flight = 12;
  int64_t tinker_poll_seconds = 25;
  int64_t tinker_seq_gap_seconds = 120;
  int64_t tinker_connections = 256;
  int64_t tinker_body_seconds = 60;

  static Result<ServeConfig> parse(const std::string& toml_text, const std::string& source);
  static Result<ServeConfig> load(const std::string& path);
  bool tls() const { return !tls_cert.empty(); }
  bool loopback() const;
  bool tinker_loopback() const;
  /// A model directory, TLS files that go together, a non-loopback bind
  /// only with TLS or insecure, positive sizes.
  Result<void> validate() const;
};

}  // namespace glint::rpc
