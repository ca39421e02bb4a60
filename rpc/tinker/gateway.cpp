#include "rpc/tinker/gateway.hpp"

#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "rpc/convert.hpp"
#include "rpc/tinker/codec.hpp"
#include "rpc/tinker/openai.hpp"
#include "components/data/template.hpp"
#include "components/data/tool_calls.hpp"
#include "runtime/log.hpp"

#include <capnp/message.h>
#include <nlohmann/json.hpp>
#include <openssl/rand.h>

#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

namespace glint::rpc::tinker {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string iso_time(int64_t ms) {
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return text;
}

// Unguessable ids: 16 random bytes in hex (ids of one tenant are never
// accepted from another, so guessing would not help either).
std::string random_id(size_t bytes = 16) {
  std::vector<unsigned char> raw(bytes);
  if (RAND_bytes(raw.data(), static_cast<int>(raw.size())) != 1) {
    // OpenSSL's generator failing is not something to serve through.
    throw std::runtime_error("RAND_bytes failed");
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (auto b : raw) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

caf::error user(const std::string& what) { return make_error(errc::invalid_argument, what); }

// The HTTP status an error answers with: 4xx are the caller's to fix (the
// SDK does not retry them, but a bare 400 three times), 429 and 5xx are
// retried.
int status_of(const caf::error& e) {
  switch (code_of(e)) {
    case errc::invalid_argument: return 400;
    case errc::not_found: return 404;
    case errc::failed_precondition: return 400;
    case errc::unimplemented: return 400;
    case errc::permission_denied: return 403;
    case errc::resource_exhausted: return 429;
    case errc::aborted: return 409;
    case errc::unavailable: return 503;
    case errc::deadline_exceeded: return 504;
    default: return 500;
  }
}

// A future's error category: "user" for what the caller can fix.
const char* category_of(const caf::error& e) {
  switch (code_of(e)) {
    case errc::invalid_argument:
    case errc::not_found:
    case errc::failed_precondition:
    case errc::unimplemented:
    case errc::permission_denied:
    case errc::resource_exhausted: return "user";
    default: return "server";
  }
}

/// The headers a request is answered by, copied before its body is read
/// (KJ's headers are valid only until then).
struct RequestHeaders {
  std::string api_key, accept, content_encoding, content_type;
  std::string authorization;  ///< "Bearer KEY", as OpenAI clients send their key
};

struct Reply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  bool no_retry = false;  ///< x-should-retry: false (a conflict that a resend cannot fix)
};

// Messages quote what a client sent, cut to a length: a cut may split a
// UTF-8 character, which is replaced rather than thrown on.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Reply json_reply(const json& j, unsigned status = 200) { return {status, "application/json", dump(j), false}; }

Reply error_reply(const caf::error& e) {
  auto message = describe(e);
  auto r = json_reply(json{{"detail", message}, {"error", message}, {"category", category_of(e)}},
                      static_cast<unsigned>(status_of(e)));
  r.no_retry = code_of(e) == errc::aborted;  // a seq_id used by another call: 409, not to be resent
  return r;
}

// A body over the size limit: 413, which the SDK does not resend.
Reply too_large(int64_t limit) {
  auto message = "the body is larger than the " + std::to_string(limit) + " bytes a message may have";
  return json_reply(json{{"detail", message}, {"error", message}, {"category", "user"}}, 413);
}

template <class R>
caf::error status_error(R& r) {
  return read_status(r.getStatus());
}

/// How a future ended: an error, or one of three kinds of result.
struct Outcome {
  caf::error error;
  enum class Kind { plain, forward_backward, sample } kind = Kind::plain;
  json plain;
  ForwardBackwardResult fb;
  SampleResult sample;
};

Outcome failed(caf::error e) {
  Outcome o;
  o.error = std::move(e);
  return o;
}
Outcome plain(json j) {
  Outcome o;
  o.plain = std::move(j);
  return o;
}

struct Future {
  std::string tenant;
  std::optional<Outcome> outcome;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> waiters;
  Clock::time_point done_at{};
  std::optional<Clock::time_point> answered_at;  ///< when retrieve_future first gave its outcome
};

/// A LoRA training client's model: one adapter of the tenant's.
struct Charge;

struct Model {
  std::string id, adapter;
  int64_t rank = 0;
  bool mlp = true, attn = true, unembed = true;
  int64_t next_seq = 1;  ///< the seq_id whose call runs next
  struct Waiting {
    std::function<kj::Promise<Outcome>()> start;
    std::string request_id;
    Clock::time_point since;
    std::shared_ptr<Charge> charge;  ///< its batch, held until the call ends
  };
  std::map<int64_t, Waiting> waiting;  ///< calls that came before their turn
  std::map<int64_t, std::pair<size_t, std::string>> seen;  ///< seq_id -> (body digest, request id)
  /// Calls run one after another: each starts when the one before ended.
  kj::ForkedPromise<void> tail = kj::Promise<void>(kj::READY_NOW).fork();
  std::deque<std::string> ephemeral;  ///< sampling sessions of its ephemeral saves, oldest first
  /// The loss its adapter trains with now (loss_key), set by the last
  /// forward_backward; empty: unknown (a call sets it first).
  std::string loss;
  int64_t last_request_ms = 0;
};

struct Sampler {
  std::string id;
  std::string adapter;     ///< the tenant's sampler adapter; empty: the base model
  std::string model_path;  ///< the tinker:// path it was made from, if any
  std::map<int64_t, std::pair<size_t, std::string>> seen;  ///< seq_id -> (body digest, request id)
};

struct Tenant {
  std::string name;
  std::map<std::string, wire::Session::Client> sessions;  ///< by key id
  std::map<std::string, Model> models;
  std::map<std::string, Sampler> samplers;
  std::set<std::string> session_ids;  ///< Tinker's create_session ids (they hold nothing)
  /// Sampler adapters loaded from tinker:// paths (keyed by path and the
  /// checkpoint's time), shared by the sampling sessions made from them.
  std::map<std::string, std::string> path_adapters;
  std::set<std::string> doomed;  ///< sampler adapters to remove, retried at each sweep
  std::deque<std::string> path_order;  ///< path_adapters' keys, least recently used first
  /// Loads of a path's weights under way, which sessions of the same path wait for.
  std::map<std::string, kj::ForkedPromise<Reply>> path_loading;
  int64_t samples_in_flight = 0;
  /// The OpenAI door's sampling sessions of tinker:// paths, by path.
  std::map<std::string, std::string> openai_sessions;
  /// What its bodies being read and its model calls queued or running hold
  /// (GatewayOptions::request_bytes bounds it).
  int64_t request_bytes = 0;
};

/// Bytes held against a tenant's request_bytes while it lives: a queued
/// call's batch (fixed), or a body being read (growing as it arrives).
struct Charge {
  Tenant* tenant = nullptr;  ///< none: nobody's (an unauthenticated healthz)
  int64_t bytes = 0;
  Charge() = default;
  Charge(Tenant* t, int64_t b) : tenant(t) { add(b); }
  ~Charge() { clear(); }
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  void add(int64_t n) {
    tenant->request_bytes += n;
    bytes += n;
  }
  void clear() {
    if (tenant) tenant->request_bytes -= bytes;
    bytes = 0;
  }
};

std::string mib_text(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// tinker://<run>/<weights|sampler_weights>/<name>
struct TinkerPath {
  std::string run, kind, name;
  std::string store_name() const { return "tk." + run + (kind == "weights" ? ".w." : ".s.") + name; }
  std::string text() const { return "tinker://" + run + "/" + kind + "/" + name; }
};

bool plain_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

Result<TinkerPath> parse_path(const std::string& text, const std::string& field) {
  const std::string scheme = "tinker://";
  if (text.rfind(scheme, 0) != 0) return user(field + " must be a tinker:// path, not '" + text.substr(0, 80) + "'");
  auto rest = text.substr(scheme.size());
  auto a = rest.find('/'), b = a == std::string::npos ? a : rest.find('/', a + 1);
  if (a == std::string::npos || b == std::string::npos)
    return user(field + " must be tinker://<run>/weights/<name> or tinker://<run>/sampler_weights/<name>");
  TinkerPath p{rest.substr(0, a), rest.substr(a + 1, b - a - 1), rest.substr(b + 1)};
  if (p.kind != "weights" && p.kind != "sampler_weights")
    return user(field + ": the part after the run must be 'weights' or 'sampler_weights', not '" + p.kind.substr(0, 40) +
                "'");
  if (!plain_name(p.run) || !plain_name(p.name) || p.store_name().size() > 64)
    return user(field + ": '" + text.substr(0, 120) + "' names no checkpoint this server could hold");
  return p;
}

const json& field_or_null(const json& j, const char* key) {
  static const json null;
  if (!j.is_object()) return null;
  auto it = j.find(key);
  return it == j.end() ? null : *it;
}

Result<std::string> string_field(const json& j, const char* key) {
  const auto& v = field_or_null(j, key);
  if (!v.is_string()) return user(std::string{key} + " is required (a string)");
  return v.get<std::string>();
}

Result<int64_t> int_field(const json& j, const char* key) {
  const auto& v = field_or_null(j, key);
  if (!v.is_number_integer()) return user(std::string{key} + " is required (an integer)");
  return v.get<int64_t>();
}

// A number of loss_fn_config, with its default.
struct ConfigReader {
  std::map<std::string, double> config;
  std::set<std::string> read;
  double get(const std::string& key, double fallback) {
    read.insert(key);
    auto it = config.find(key);
    return it == config.end() ? fallback : it->second;
  }
  caf::error unread(const std::string& loss) const {
    for (const auto& [k, v] : config)
      if (!read.count(k))
        return user("loss_fn_config." + k.substr(0, 40) + " is not a setting of " + loss + " (it reads " +
                    (read.empty() ? std::string{"none"} : [&] {
                      std::string s;
                      for (const auto& r : read) s += (s.empty() ? "" : ", ") + r;
                      return s;
                    }()) +
                    ")");
    return {};
  }
};

// The Tinker loss as glint's LossSpec (components/model/trainer.hpp), with
// the loss_fn_inputs it reads (required ones first).
struct LossPlan {
  actors::LossSpec spec;
  std::vector<std::string> inputs;
};

Result<LossPlan> plan_loss(const std::string& loss_fn, const std::map<std::string, double>& config) {
  ConfigReader c{config, {}};
  LossPlan p;
  p.spec.reduction = components::LossReduction::sum;
  if (loss_fn == "cross_entropy") {
    p.spec.kind = actors::LossKind::cross_entropy;
    p.inputs = {"target_tokens", "weights"};
  } else if (loss_fn == "importance_sampling") {
    p.spec.kind = actors::LossKind::importance_sampling;
    p.inputs = {"target_tokens", "logprobs", "advantages"};
  } else if (loss_fn == "ppo" || loss_fn == "cispo") {
    p.spec.kind = loss_fn == "ppo" ? actors::LossKind::ppo : actors::LossKind::cispo;
    p.inputs = {"target_tokens", "logprobs", "advantages"};
    const double lo = c.get("clip_low_threshold", 0.8), hi = c.get("clip_high_threshold", 1.2);
    if (!(std::isfinite(lo) && std::isfinite(hi) && lo >= 0 && lo <= 1 && hi >= 1))
      return user("loss_fn_config: " + loss_fn + " needs 0 <= clip_low_threshold <= 1 <= clip_high_threshold, got " +
                  std::to_string(lo) + " and " + std::to_string(hi));
    p.spec.epsilon = 1 - lo;
    p.spec.epsilon_high = hi - 1;
  } else if (loss_fn == "dro") {
    p.spec.kind = actors::LossKind::dro;
    p.inputs = {"target_tokens", "logprobs", "advantages"};
    p.spec.beta = c.get("beta", 0.05);
    if (!(std::isfinite(p.spec.beta) && p.spec.beta >= 0))
      return user("loss_fn_config.beta must be >= 0, got " + std::to_string(p.spec.beta));
  } else {
    return user("loss_fn '" + loss_fn.substr(0, 40) +
                "' is unknown: use cross_entropy, importance_sampling, ppo, cispo or dro");
  }
  if (auto err = c.unread(loss_fn)) return err;
  if (auto ok = p.spec.validate(); !ok) return ok.error();
  return p;
}

// The per-token loss of a forward pass (no backward), from the same
// formulas as components/rl/losses.hpp's token_loss, for forward's
// loss:sum.
double forward_loss(const actors::LossSpec& s, double lp, double q, double a, double w) {
  const double r = std::exp(lp - q);
  const double lo = 1 - s.epsilon, hi = 1 + s.epsilon_high;
  switch (s.kind) {
    case actors::LossKind::cross_entropy: return -w * lp;
    case actors::LossKind::importance_sampling: return -r * a;
    case actors::LossKind::ppo: return -std::min(r * a, std::clamp(r, lo, hi) * a);
    case actors::LossKind::cispo: return -std::clamp(r, lo, hi) * lp * a;
    case actors::LossKind::dro: return -(lp * a - 0.5 * s.beta * (lp - q) * (lp - q));
    default: return 0;
  }
}

/// A forward_backward request as glint's batches: each part's rows padded
/// to its longest datum, every position with a target counted. A request
/// is split into parts of at most `tokens_per_call` padded tokens (the
/// server's limit per call): the losses are sums, so the parts add up to
/// the whole request exactly.
struct PreparedBatch {
  std::vector<Batch> parts;
  std::vector<std::vector<int64_t>> part_lengths;  ///< each part's datums' N
  LossPlan plan;
  // The inputs as read, for forward's loss:sum.
  std::vector<std::vector<double>> weights, sampler_logprobs, advantages;
};

/// What a prepared batch holds in memory, as its tenant is charged for it.
int64_t held_bytes(const PreparedBatch& p) {
  int64_t n = 0;
  for (const auto& b : p.parts)
    for (const auto& [_, t] : b.tensors) n += static_cast<int64_t>(t.nbytes());
  for (const auto* v : {&p.weights, &p.sampler_logprobs, &p.advantages})
    for (const auto& row : *v) n += static_cast<int64_t>(row.size() * sizeof(double));
  return n;
}

Result<PreparedBatch> prepare_batch(const ForwardBackwardRequest& r, const BaseModel& base, int64_t tokens_per_call) {
  auto plan = plan_loss(r.loss_fn, r.loss_fn_config);
  if (!plan) return plan.error();
  if (r.data.empty()) return user("data is empty: forward_backward needs at least one datum");
  PreparedBatch out;
  out.plan = *plan;
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < r.data.size(); ++i) {
    const auto& d = r.data[i];
    const auto n = static_cast<int64_t>(d.tokens.size());
    if (n == 0) return user("data[" + std::to_string(i) + "].model_input is empty");
    if (n > base.max_context)
      return user("data[" + std::to_string(i) + "] has " + std::to_string(n) +
                  " tokens, more than the model's context of " + std::to_string(base.max_context));
    if (n > tokens_per_call)
      return make_error(errc::resource_exhausted, "data[" + std::to_string(i) + "] has " + std::to_string(n) +
                                                      " tokens, more than the server's limit tokens_per_call, " +
                                                      std::to_string(tokens_per_call));
    for (auto t : d.tokens)
      if (t < 0 || t >= base.vocab_size)
        return user("data[" + std::to_string(i) + "].model_input holds token " + std::to_string(t) +
                    ", outside the vocabulary [0, " + std::to_string(base.vocab_size) + ")");
    for (const auto& [k, v] : d.inputs)
      if (std::find(plan->inputs.begin(), plan->inputs.end(), k) == plan->inputs.end())
        return user("data[" + std::to_string(i) + "].loss_fn_inputs." + k.substr(0, 40) + " is not an input of " +
                    r.loss_fn + " (it reads " + [&] {
                      std::string s;
                      for (const auto& x : plan->inputs) s += (s.empty() ? "" : ", ") + x;
                      return s;
                    }() + ")");
    for (const auto& k : plan->inputs) {
      auto it = d.inputs.find(k);
      const auto name = "data[" + std::to_string(i) + "].loss_fn_inputs." + k;
      if (it == d.inputs.end()) return user(name + " is required by " + r.loss_fn);
      if (it->second.shape.size() != 1)
        return user(name + " has shape [" + std::to_string(it->second.shape[0]) + ", " +
                    std::to_string(it->second.shape.size() > 1 ? it->second.shape[1] : 0) +
                    "]: several targets per position ((N, K) inputs) are not supported by this server; send (N,)");
      if (it->second.shape[0] != n)
        return user(name + " has " + std::to_string(it->second.shape[0]) + " entries but model_input has " +
                    std::to_string(n) + " tokens (position i predicts token i + 1: one entry per input token)");
      const bool ints = k == "target_tokens";
      if (ints != (it->second.dtype == TensorData::Dtype::i64))
        return user(name + " must be " + (ints ? "int64" : "float32"));
      for (double v : it->second.values) {
        if (!std::isfinite(v)) return user(name + " holds NaN or infinite values");
        if (ints && (v < 0 || v >= static_cast<double>(base.vocab_size)))
          return user(name + " holds token " + std::to_string(static_cast<int64_t>(v)) +
                      ", outside the vocabulary [0, " + std::to_string(base.vocab_size) + ")");
      }
    }
    lengths.push_back(n);
  }
  const bool ce = plan->spec.kind == actors::LossKind::cross_entropy;
  for (const auto& d : r.data) {
    out.weights.push_back(ce ? d.inputs.at("weights").values : std::vector<double>{});
    out.sampler_logprobs.push_back(ce ? std::vector<double>{} : d.inputs.at("logprobs").values);
    out.advantages.push_back(ce ? std::vector<double>{} : d.inputs.at("advantages").values);
  }
  // The rows [begin, end) as one batch.
  auto build = [&](size_t begin, size_t end) -> Result<Batch> {
    const auto B = static_cast<int64_t>(end - begin);
    int64_t T = 0;
    for (size_t i = begin; i < end; ++i) T = std::max(T, lengths[i]);
    std::vector<int64_t> ids(static_cast<size_t>(B * T), 0), mask(static_cast<size_t>(B * T), 0),
        targets(static_cast<size_t>(B * T), -100);
    std::vector<float> weights(static_cast<size_t>(B * T), 0), old(static_cast<size_t>(B * T), 0),
        adv(static_cast<size_t>(B * T), 0);
    for (size_t i = begin; i < end; ++i) {
      const auto& d = r.data[i];
      const auto b = static_cast<int64_t>(i - begin);
      const auto& tt = d.inputs.at("target_tokens").values;
      for (int64_t t = 0; t < lengths[i]; ++t) {
        const auto at = static_cast<size_t>(b * T + t);
        const auto k = static_cast<size_t>(t);
        ids[at] = d.tokens[k];
        mask[at] = 1;
        targets[at] = static_cast<int64_t>(tt[k]);
        if (ce) weights[at] = static_cast<float>(out.weights[i][k]);
        else {
          old[at] = static_cast<float>(out.sampler_logprobs[i][k]);
          adv[at] = static_cast<float>(out.advantages[i][k]);
        }
      }
    }
    Batch batch;
    auto put = [&](const char* name, auto&& values) -> Result<void> {
      auto t = Tensor::from_values(values, {B, T});
      if (!t) return t.error();
      batch.tensors[name] = std::move(*t);
      return {};
    };
    for (auto ok : {put("input_ids", ids), put("attention_mask", mask), put("target_ids", targets)})
      if (!ok) return ok.error();
    if (ce) {
      if (auto ok = put("loss_weights", weights); !ok) return ok.error();
    } else {
      if (auto ok = put("old_logps", old); !ok) return ok.error();
      if (auto ok = put("advantages", adv); !ok) return ok.error();
    }
    return batch;
  };
  // Parts of at most tokens_per_call padded tokens, datums in order.
  size_t begin = 0;
  while (begin < lengths.size()) {
    size_t end = begin;
    int64_t longest = 0;
    while (end < lengths.size() &&
           std::max(longest, lengths[end]) * static_cast<int64_t>(end - begin + 1) <= tokens_per_call) {
      longest = std::max(longest, lengths[end]);
      ++end;
    }
    auto part = build(begin, end);
    if (!part) return part.error();
    out.parts.push_back(std::move(*part));
    out.part_lengths.emplace_back(lengths.begin() + static_cast<std::ptrdiff_t>(begin),
                                  lengths.begin() + static_cast<std::ptrdiff_t>(end));
    begin = end;
  }
  return out;
}

// The per-datum log-probs of a [B, T] answer, each cut to its datum's N.
Result<std::vector<DatumOutput>> outputs_of(const Tensor& logps, const std::vector<int64_t>& lengths) {
  auto values = logps.values<float>();
  if (!values) return values.error();
  if (logps.dims() != 2 || logps.size(0) != static_cast<int64_t>(lengths.size()))
    return make_error(errc::internal, "the model answered log-probs of shape " + logps.describe());
  const auto T = logps.size(1);
  std::vector<DatumOutput> out;
  for (size_t b = 0; b < lengths.size(); ++b) {
    DatumOutput d;
    d.shape = {lengths[b]};
    auto row = values->begin() + static_cast<std::ptrdiff_t>(static_cast<int64_t>(b) * T);
    d.logprobs.assign(row, row + lengths[b]);
    out.push_back(std::move(d));
  }
  return out;
}

bool accepts_proto(const RequestHeaders& h) { return h.accept.find("application/x-protobuf") != std::string::npos; }

}  // namespace

struct Gateway::Impl {
  Host& host;
  BaseModel base;
  GatewayOptions o;
  kj::Timer& timer;
  kj::Own<kj::HttpHeaderTable> table;
  kj::HttpHeaderId api_key, accept, content_encoding, authorization;
  std::map<std::string, Tenant> tenants;
  std::map<std::string, Future> futures;
  struct Errors final : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override {
      log::warn(std::string{"tinker: a call's bookkeeping failed: "} + e.getDescription().cStr());
    }
  } errors;
  kj::TaskSet tasks{errors};

  Impl(Host& h, BaseModel b, GatewayOptions opts, kj::Timer& t) : host(h), base(std::move(b)), o(opts), timer(t) {
    kj::HttpHeaderTable::Builder builder;
    api_key = builder.add("X-API-Key");
    authorization = builder.add("Authorization");
    accept = builder.add("Accept");
    content_encoding = builder.add("Content-Encoding");
    table = builder.build();
  }

  // -- futures -----------------------------------------------------------------

  std::string new_future(const std::string& tenant) {
    auto id = random_id();
    futures[id].tenant = tenant;
    return id;
  }
  void finish(const std::string& id, Outcome outcome) {
    auto it = futures.find(id);
    if (it == futures.end()) return;
    it->second.outcome = std::move(outcome);
    it->second.done_at = Clock::now();
    for (auto& w : it->second.waiters) w->fulfill();
    it->second.waiters.clear();
  }
  /// Runs `p` and settles future `id` with its outcome (an exception is a
  /// server error).
  void settle(const std::string& id, kj::Promise<Outcome> p) {
    tasks.add(p.then([this, id](Outcome out) { finish(id, std::move(out)); },
                     [this, id](kj::Exception&& e) {
                       finish(id, failed(make_error(errc::internal, std::string{"the call failed: "} +
                                                                        e.getDescription().cStr())));
                     }));
  }

  // -- tenants -----------------------------------------------------------------

  struct Caller {
    Tenant* tenant;
    wire::Session::Client session;
  };
  Result<Caller> caller(const RequestHeaders& h) {
    std::string key = h.api_key;
    if (key.empty() && h.authorization.rfind("Bearer ", 0) == 0) key = h.authorization.substr(7);
    if (key.empty())
      return make_error(errc::permission_denied, "no X-API-Key header (or Authorization: Bearer): send a key made by "
                                                 "`glint serve keys create`");
    auto who = host.authenticate(key);
    if (!who) return who.error();
    auto& t = tenants[who->first];
    t.name = who->first;
    auto s = t.sessions.find(who->second);
    if (s == t.sessions.end()) s = t.sessions.emplace(who->second, host.session(who->first, who->second)).first;
    return Caller{&t, s->second};
  }

  Result<Model*> model_of(Tenant& t, const std::string& id) {
    auto it = t.models.find(id);
    // Another tenant's model is answered as one that does not exist.
    if (it == t.models.end()) return make_error(errc::not_found, "no model '" + id.substr(0, 80) + "' (create_model first)");
    return &it->second;
  }

  /// A model call's model_id (one of the tenant's models) and seq_id.
  struct ModelCall {
    std::string id;
    Model* model;
    int64_t seq;
  };
  Result<ModelCall> model_call(Tenant& t, const json& j) {
    auto id = string_field(j, "model_id");
    if (!id) return id.error();
    auto m = model_of(t, *id);
    if (!m) return m.error();
    auto seq = int_field(j, "seq_id");
    if (!seq) return seq.error();
    return ModelCall{*id, *m, *seq};
  }

  // -- ordering ----------------------------------------------------------------

  /// Queues a model call to run at its seq_id's turn; answers its future's
  /// id (the original one for a retry of the same body).
  Result<std::string> submit(Tenant& t, Model& m, int64_t seq, size_t digest, std::function<kj::Promise<Outcome>()> start,
                             int64_t bytes = 0) {
    m.last_request_ms = now_ms();
    if (auto it = m.seen.find(seq); it != m.seen.end()) {
      if (it->second.first == digest) return it->second.second;
      return make_error(errc::aborted, "seq_id " + std::to_string(seq) + " of model " + m.id +
                                           " was already used by a different call");
    }
    if (seq < m.next_seq)
      return make_error(errc::aborted, "seq_id " + std::to_string(seq) + " of model " + m.id +
                                           " is behind the calls that already ran (the next is " +
                                           std::to_string(m.next_seq) + ")");
    if (seq - m.next_seq > 4096 || m.waiting.size() >= 4096)
      return make_error(errc::resource_exhausted, "seq_id " + std::to_string(seq) + " is too far ahead of " +
                                                      std::to_string(m.next_seq) + ", the next to run");
    // A queued batch counts against its tenant until its call ends: calls
    // waiting for a seq_id that never comes cannot take the machine's memory.
    if (bytes > 0 && t.request_bytes + bytes > o.request_bytes)
      return make_error(errc::resource_exhausted,
                        "limit request_mib: this call's batch needs " + mib_text(bytes) + ", and your calls queued or "
                        "running and bodies being read hold " + mib_text(t.request_bytes) + " of the " +
                        mib_text(o.request_bytes) + " a tenant may hold: wait for them to finish (calls wait for "
                        "seq_id " + std::to_string(m.next_seq) + " of model " + m.id + ")");
    auto charge = bytes > 0 ? std::make_shared<Charge>(&t, bytes) : nullptr;
    auto id = new_future(t.name);
    m.seen[seq] = {digest, id};
    // Remembered for retries, within bounds.
    while (m.seen.size() > 8192) m.seen.erase(m.seen.begin());
    m.waiting[seq] = {std::move(start), id, Clock::now(), std::move(charge)};
    pump(m);
    return id;
  }

  /// Forgets model `id`: the calls still waiting for their turn fail with
  /// `why`.
  void drop_model(Tenant& t, const std::string& id, const caf::error& why) {
    auto it = t.models.find(id);
    if (it == t.models.end()) return;
    for (auto& [seq, w] : it->second.waiting) finish(w.request_id, failed(why));
    // The calls already running finish their futures (their continuations
    // hold ids, not the model).
    tasks.add(it->second.tail.addBranch());
    t.models.erase(it);
  }

  /// Removes a sampler adapter of the tenant's; one the sampler cannot
  /// remove now (samples of it still running) is retried at the sweeps, so
  /// no slot of the tenant's sampler adapters is lost.
  void forget_sampler_adapter(Tenant& t, const std::string& adapter, wire::Session::Client session) {
    auto rm = session.samplerRemoveAdapterRequest();
    rm.setName(adapter);
    auto* tenant = &t;
    tasks.add(rm.send().then(
        [tenant, adapter](capnp::Response<wire::Session::SamplerRemoveAdapterResults>&& res) {
          if (auto e = status_error(res); e && code_of(e) != errc::not_found) tenant->doomed.insert(adapter);
          else tenant->doomed.erase(adapter);
        },
        [tenant, adapter](kj::Exception&&) { tenant->doomed.insert(adapter); }));
  }

  /// A model call refused for its content: its seq_id's turn is a failed
  /// future (the SDK reads it as the call's error), and the calls after it
  /// run.
  kj::Promise<Reply> refuse_at(Tenant& t, Model& m, int64_t seq, size_t digest, caf::error err) {
    return queue(t, m, seq, digest, [err]() -> kj::Promise<Outcome> { return failed(err); });
  }
  /// submit, answered as the SDK expects: the future's id (or why not).
  Reply queue(Tenant& t, Model& m, int64_t seq, size_t digest, std::function<kj::Promise<Outcome>()> start,
              int64_t bytes = 0) {
    auto id = submit(t, m, seq, digest, std::move(start), bytes);
    if (!id) return error_reply(id.error());
    return json_reply(json{{"request_id", *id}, {"model_id", m.id}});
  }

  void pump(Model& m) {
    for (auto it = m.waiting.find(m.next_seq); it != m.waiting.end(); it = m.waiting.find(m.next_seq)) {
      auto call = std::move(it->second);
      m.waiting.erase(it);
      ++m.next_seq;
      auto id = call.request_id;
      auto run = m.tail.addBranch().then([start = std::move(call.start)]() { return start(); });
      auto done = run.then([this, id](Outcome out) { finish(id, std::move(out)); },
                           [this, id](kj::Exception&& e) {
                             finish(id, failed(make_error(errc::internal, std::string{"the call failed: "} +
                                                                              e.getDescription().cStr())));
                           });
      m.tail = done.attach(kj::mv(call.charge)).eagerlyEvaluate(nullptr).fork();
    }
  }

  void sweep() {
    const auto now = Clock::now();
    for (auto& [_, t] : tenants)
      if (!t.doomed.empty() && !t.sessions.empty()) {
        auto doomed = t.doomed;
        for (const auto& a : doomed) forget_sampler_adapter(t, a, t.sessions.begin()->second);
      }
    for (auto& [_, t] : tenants)
      for (auto& [_, m] : t.models) {
        if (m.waiting.empty() || now - m.waiting.begin()->second.since < o.seq_gap) continue;
        // The next seq_id never came: the calls waiting for it fail, and
        // the model goes on after them.
        const auto missing = m.next_seq;
        for (auto& [seq, w] : m.waiting)
          finish(w.request_id, failed(make_error(errc::aborted, "seq_id " + std::to_string(missing) + " of model " +
                                                                    m.id + " never arrived within " +
                                                                    std::to_string(o.seq_gap.count()) +
                                                                    " s, so the calls after it did not run")));
        m.next_seq = m.waiting.rbegin()->first + 1;
        m.waiting.clear();
      }
    for (auto it = futures.begin(); it != futures.end();) {
      const auto& f = it->second;
      if (f.outcome && (now - f.done_at > o.future_ttl || (f.answered_at && now - *f.answered_at > o.retrieved_ttl)))
        it = futures.erase(it);
      else
        ++it;
    }
  }

  // -- endpoints ---------------------------------------------------------------

  kj::Promise<Reply> route(kj::HttpMethod method, std::string path, const RequestHeaders& h, std::string body,
                           Result<Caller> c);
  /// What one call may make of its body: its tokens and tensor entries
  /// (16 per token of tokens_per_call: a datum's inputs and targets), and
  /// the JSON values that carry them.
  size_t element_budget() const { return request_element_budget(o.tokens_per_call); }

  kj::Promise<Reply> create_model(Caller c, const json& j);
  kj::Promise<Reply> forward_backward(Caller c, ForwardBackwardRequest r, size_t digest);
  kj::Promise<Reply> optim_step(Caller c, const json& j, size_t digest);
  kj::Promise<Reply> save_weights(Caller c, const json& j, size_t digest, bool for_sampler);
  kj::Promise<Reply> load_weights(Caller c, const json& j, size_t digest);
  kj::Promise<Reply> unload_model(Caller c, const json& j);
  kj::Promise<Reply> create_sampling_session(Caller c, const json& j);
  kj::Promise<Reply> asample(Caller c, const json& j, size_t digest);
  kj::Promise<Reply> openai_route(Caller c, bool get, bool post, const std::string& path, const std::string& body);
  /// The sampler adapter `model` names for the OpenAI door: "" for the
  /// base, a tinker:// path's weights loaded as create_sampling_session loads them.
  kj::Promise<Result<std::string>> openai_adapter(Caller c, const std::string& model);
  kj::Promise<Reply> retrieve_future(Caller c, const json& j, bool proto);
  kj::Promise<Reply> training_runs(Caller c, const std::string& path, const std::string& query);
  kj::Promise<Reply> weights_info(Caller c, const json& j);

  /// A finished future's outcome, from now on kept only retrieved_ttl more.
  Reply answered(Future& f, bool proto) {
    if (!f.answered_at) f.answered_at = Clock::now();
    return answer(*f.outcome, proto);
  }
  Reply answer(const Outcome& out, bool proto) const {
    if (out.error) {
      auto message = describe(out.error);
      return json_reply(json{{"error", message}, {"category", category_of(out.error)}});
    }
    switch (out.kind) {
      case Outcome::Kind::forward_backward:
        return proto ? Reply{200, "application/x-protobuf", render_forward_backward_proto(out.fb)}
                     : Reply{200, "application/json", render_forward_backward_json(out.fb)};
      case Outcome::Kind::sample:
        return proto ? Reply{200, "application/x-protobuf", render_sample_proto(out.sample)}
                     : Reply{200, "application/json", render_sample_json(out.sample)};
      case Outcome::Kind::plain: break;
    }
    return json_reply(out.plain);
  }

  /// The LoRA shape of a Tinker model: its rank, alpha 32, and the modules
  /// its train_attn, train_mlp and train_unembed flags name.
  actors::LoraConfig lora_of(const Model& m) const {
    actors::LoraConfig lora;
    lora.r = m.rank;
    lora.alpha = o.lora_alpha;
    if (m.attn) lora.target_modules.insert(lora.target_modules.end(), {"q_proj", "k_proj", "v_proj", "o_proj"});
    if (m.mlp) lora.target_modules.insert(lora.target_modules.end(), {"gate_proj", "up_proj", "down_proj"});
    if (m.unembed) lora.target_modules.push_back("lm_head");
    return lora;
  }

  json model_info(const Model& m) const {
    return json{{"model_id", m.id},
                {"model_data", {{"arch", base.arch}, {"model_name", base.name}, {"tokenizer_id", base.tokenizer_id}}},
                {"is_lora", true},
                {"lora_rank", m.rank},
                {"model_name", base.name},
                {"type", "get_info"}};
  }
};

kj::Promise<Reply> Gateway::Impl::create_model(Caller c, const json& j) {
  auto base_model = string_field(j, "base_model");
  if (!base_model) return error_reply(base_model.error());
  if (*base_model != base.name)
    return error_reply(user("base_model '" + base_model->substr(0, 80) + "' is not served here: this server hosts '" +
                            base.name + "' (get_server_capabilities lists it)"));
  const auto& lc = field_or_null(j, "lora_config");
  if (!lc.is_object()) return error_reply(user("lora_config is required"));
  static const std::set<std::string> known = {"rank", "seed", "train_mlp", "train_attn", "train_unembed"};
  for (auto it = lc.begin(); it != lc.end(); ++it)
    if (!known.count(it.key())) return error_reply(user("lora_config." + it.key().substr(0, 40) + " is not a LoRA option"));
  std::string wrong_flag;
  auto flag = [&](const char* key) {
    const auto& v = field_or_null(lc, key);
    if (!v.is_null() && !v.is_boolean() && wrong_flag.empty()) wrong_flag = key;
    return v.is_boolean() ? v.get<bool>() : true;  // absent or null: the SDK's default
  };
  Model m;
  // Absent or null: the SDK's default, 32. Anything else must be an integer
  // (a string or 8.5 is refused, never read as the default).
  m.rank = 32;
  if (const auto& r = field_or_null(lc, "rank"); !r.is_null()) {
    if (!r.is_number_integer() && !r.is_number_unsigned())
      return error_reply(user("lora_config.rank must be an integer, not " + dump(r).substr(0, 40)));
    if (r.is_number_unsigned() && r.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return error_reply(user("lora_config.rank is too large"));
    m.rank = r.get<int64_t>();
  }
  m.mlp = flag("train_mlp");
  m.attn = flag("train_attn");
  m.unembed = flag("train_unembed");
  if (!wrong_flag.empty()) return error_reply(user("lora_config." + wrong_flag + " must be true or false"));
  uint64_t seed = 0;
  if (const auto& s = field_or_null(lc, "seed"); !s.is_null()) {
    if (!s.is_number_integer()) return error_reply(user("lora_config.seed must be an integer"));
    seed = static_cast<uint64_t>(s.get<int64_t>());
  }
  if (m.rank < 1) return error_reply(user("lora_config.rank must be >= 1, got " + std::to_string(m.rank)));
  if (!m.mlp && !m.attn && !m.unembed)
    return error_reply(user("lora_config: at least one of train_mlp, train_attn and train_unembed must be true"));
  auto lora = lora_of(m);
  m.id = random_id(8);
  m.adapter = "tk-" + m.id;
  m.last_request_ms = now_ms();
  auto id = new_future(c.tenant->name);
  auto req = c.session.addAdapterRequest();
  req.setName(m.adapter);
  write_lora(req.initLora(), lora);
  req.setSeed(seed);
  auto model_id = m.id;
  auto* t = c.tenant;
  t->models.emplace(m.id, std::move(m));
  settle(id, req.send().then([this, t, model_id](capnp::Response<wire::Session::AddAdapterResults>&& r) {
    if (auto e = status_error(r)) {
      drop_model(*t, model_id, e);
      return failed(std::move(e));
    }
    return plain(json{{"model_id", model_id}, {"type", "create_model"}});
  }));
  return json_reply(json{{"request_id", id}, {"model_id", model_id}});
}

namespace {

// A forward or forward_backward in progress: its parts run one after
// another, their log-probs and loss adding up.
// A loss spec as bytes (its Cap'n Proto form): equal specs, equal keys.
std::string loss_key(const actors::LossSpec& spec) {
  capnp::MallocMessageBuilder m;
  write_loss(m.initRoot<wire::LossSpec>(), spec);
  return message_bytes(m);
}

struct PassState {
  std::shared_ptr<PreparedBatch> p;
  std::shared_ptr<wire::Session::Client> session;
  std::string adapter;
  bool forward = false;
  Outcome out;
};

kj::Promise<Outcome> run_parts(std::shared_ptr<PassState> st, size_t k) {
  const auto& p = *st->p;
  if (k == p.parts.size()) {
    st->out.kind = Outcome::Kind::forward_backward;
    return kj::mv(st->out);
  }
  auto fail_at = [st, k](caf::error e) -> Outcome {
    if (k == 0 || st->forward) return failed(std::move(e));
    return failed(with_context(e, "forward_backward failed at part " + std::to_string(k + 1) + " of " +
                                      std::to_string(st->p->parts.size()) +
                                      " (split by the server's tokens_per_call); the gradients of the parts before "
                                      "it are accumulated"));
  };
  // The parts' datums come one after another: the first datum of part k.
  size_t first = 0;
  for (size_t i = 0; i < k; ++i) first += p.part_lengths[i].size();
  if (st->forward) {
    auto req = st->session->forwardOnlyRequest();
    req.setAdapter(st->adapter);
    write_batch(req.initBatch(), p.parts[k], nullptr);
    return req.send().then([st, k, first, fail_at](capnp::Response<wire::Session::ForwardOnlyResults>&& res) mutable
                           -> kj::Promise<Outcome> {
      if (auto e = status_error(res)) return fail_at(std::move(e));
      auto lp = read_tensor(res.getLogps(), "forward's log-probs");
      if (!lp) return fail_at(lp.error());
      auto outs = outputs_of(*lp, st->p->part_lengths[k]);
      if (!outs) return fail_at(outs.error());
      const auto& pb = *st->p;
      const bool ce = pb.plan.spec.kind == actors::LossKind::cross_entropy;
      double loss = 0;
      for (size_t b = 0; b < outs->size(); ++b)
        for (size_t t = 0; t < (*outs)[b].logprobs.size(); ++t) {
          const size_t d = first + b;
          loss += forward_loss(pb.plan.spec, (*outs)[b].logprobs[t], ce ? 0 : pb.sampler_logprobs[d][t],
                               ce ? 0 : pb.advantages[d][t], ce ? pb.weights[d][t] : 0);
        }
      st->out.fb.metrics["loss:sum"] += loss;
      for (auto& o : *outs) st->out.fb.outputs.push_back(std::move(o));
      return run_parts(st, k + 1);
    });
  }
  auto req = st->session->forwardBackwardRequest();
  req.setAdapter(st->adapter);
  req.setWithLogps(true);
  write_batch(req.initBatch(), p.parts[k], nullptr);
  return req.send().then([st, k, fail_at](capnp::Response<wire::Session::ForwardBackwardResults>&& res) mutable
                         -> kj::Promise<Outcome> {
    if (auto e = status_error(res)) return fail_at(std::move(e));
    auto metrics = read_metrics(res.getMetrics());
    if (!metrics) return fail_at(metrics.error());
    auto lp = read_tensor(res.getLogps(), "forward_backward's log-probs");
    if (!lp) return fail_at(lp.error());
    auto outs = outputs_of(*lp, st->p->part_lengths[k]);
    if (!outs) return fail_at(outs.error());
    st->out.fb.metrics["loss:sum"] += metrics->count("loss") ? metrics->at("loss") : 0.0;
    for (auto& o : *outs) st->out.fb.outputs.push_back(std::move(o));
    return run_parts(st, k + 1);
  });
}

}  // namespace

kj::Promise<Reply> Gateway::Impl::forward_backward(Caller c, ForwardBackwardRequest r, size_t digest) {
  auto m = model_of(*c.tenant, r.model_id);
  if (!m) return error_reply(m.error());
  auto prepared = prepare_batch(r, base, o.tokens_per_call);
  // A call refused for its content still takes its seq_id's turn (as a
  // failed future), so the model's later calls do not wait for it.
  if (!prepared) return refuse_at(*c.tenant, **m, r.seq_id, digest, prepared.error());
  auto st = std::make_shared<PassState>();
  st->p = std::make_shared<PreparedBatch>(std::move(*prepared));
  st->session = std::make_shared<wire::Session::Client>(c.session);
  st->adapter = (*m)->adapter;
  st->forward = r.forward_only;
  const int64_t bytes = held_bytes(*st->p);
  auto* t = c.tenant;
  auto start = [st, t, model_id = (*m)->id, key = loss_key(st->p->plan.spec)]() mutable -> kj::Promise<Outcome> {
    if (st->forward) return run_parts(st, 0);
    // The loss first, then the batch: a refused loss must not leave the
    // batch to train under the previous one, so the batch waits for it.
    // A loss the adapter has already (the same as the model's last call's:
    // calls of a model run in turn) is not set again, which would take a
    // turn of its own at the model group behind other tenants' calls.
    auto owner = t->models.find(model_id);
    if (owner != t->models.end() && owner->second.loss == key) return run_parts(st, 0);
    if (owner != t->models.end()) owner->second.loss.clear();
    auto loss = st->session->setLossRequest();
    loss.setAdapter(st->adapter);
    write_loss(loss.initLoss(), st->p->plan.spec);
    return loss.send().then([st, t, model_id, key](capnp::Response<wire::Session::SetLossResults>&& res) mutable
                                -> kj::Promise<Outcome> {
      if (auto e = status_error(res)) return failed(std::move(e));
      if (auto owner = t->models.find(model_id); owner != t->models.end()) owner->second.loss = key;
      return run_parts(st, 0);
    });
  };
  return queue(*c.tenant, **m, r.seq_id, digest, std::move(start), bytes);
}

kj::Promise<Reply> Gateway::Impl::optim_step(Caller c, const json& j, size_t digest) {
  auto call = model_call(*c.tenant, j);
  if (!call) return error_reply(call.error());
  Model& model = *call->model;
  const int64_t seq = call->seq;
  const auto& a = field_or_null(j, "adam_params");
  if (!a.is_null() && !a.is_object()) return refuse_at(*c.tenant, model, seq, digest, user("adam_params must be an object"));
  static const std::set<std::string> known = {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"};
  for (auto it = a.begin(); a.is_object() && it != a.end(); ++it)
    if (!known.count(it.key())) return refuse_at(*c.tenant, model, seq, digest, user("adam_params." + it.key().substr(0, 40) + " is not an AdamParams field"));
  auto num = [&](const char* key, double fallback) -> Result<double> {
    const auto& v = field_or_null(a, key);
    if (v.is_null()) return fallback;  // SDK 0.16 sends only what the caller set
    if (!v.is_number()) return user(std::string{"adam_params."} + key + " must be a number");
    return v.get<double>();
  };
  actors::OptimizerConfig opt;
  opt.kind = actors::OptimizerConfig::Kind::adamw;
  opt.keep_state = true;  // new hyperparameters each step, the same moments (Tinker's optim_step)
  for (auto [key, fallback, dst] : {std::tuple{"learning_rate", 1e-4, &opt.lr}, {"beta1", 0.9, &opt.beta1},
                                    {"beta2", 0.95, &opt.beta2}, {"eps", 1e-12, &opt.eps},
                                    {"weight_decay", 0.0, &opt.weight_decay}, {"grad_clip_norm", 0.0, &opt.max_grad_norm}}) {
    auto v = num(key, fallback);
    if (!v) return refuse_at(*c.tenant, model, seq, digest, v.error());
    *dst = *v;
  }
  if (auto ok = opt.validate(); !ok) return refuse_at(*c.tenant, model, seq, digest, with_context(ok.error(), "adam_params"));
  auto adapter = model.adapter;
  auto session = std::make_shared<wire::Session::Client>(c.session);
  auto start = [adapter, session, opt]() mutable -> kj::Promise<Outcome> {
    auto set = session->setOptimizerRequest();
    set.setAdapter(adapter);
    write_optimizer(set.initOptimizer(), opt);
    return set.send().then([adapter, session](capnp::Response<wire::Session::SetOptimizerResults>&& res) mutable
                           -> kj::Promise<Outcome> {
      if (auto e = status_error(res)) return failed(std::move(e));
      auto step = session->clipGradAndStepRequest();
      step.setAdapter(adapter);
      return step.send().then([](capnp::Response<wire::Session::ClipGradAndStepResults>&& res) {
        if (auto e = status_error(res)) return failed(std::move(e));
        auto metrics = read_metrics(res.getMetrics());
        if (!metrics) return failed(metrics.error());
        json out = json::object();
        for (const auto& [k, v] : *metrics) out[k] = v;
        return plain(json{{"metrics", out}, {"type", "optim_step"}});
      });
    });
  };
  return queue(*c.tenant, model, seq, digest, std::move(start));
}

kj::Promise<Reply> Gateway::Impl::save_weights(Caller c, const json& j, size_t digest, bool for_sampler) {
  auto call = model_call(*c.tenant, j);
  if (!call) return error_reply(call.error());
  Model& model = *call->model;
  const int64_t seq = call->seq;
  const auto& path = field_or_null(j, "path");
  int64_t ttl = 0;
  if (const auto& v = field_or_null(j, "ttl_seconds"); !v.is_null()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return refuse_at(*c.tenant, model, seq, digest, user("ttl_seconds must be an integer >= 0"));
    ttl = v.get<int64_t>();
  }
  const bool overwrite = field_or_null(j, "overwrite").is_boolean() && field_or_null(j, "overwrite").get<bool>();
  auto adapter = model.adapter;
  auto session = std::make_shared<wire::Session::Client>(c.session);
  auto* t = c.tenant;
  std::function<kj::Promise<Outcome>()> start;
  if (for_sampler && path.is_null()) {
    // Ephemeral: the weights as they are now, in a sampler adapter of their
    // own, for a new sampling session.
    auto sampler_adapter = "tks-" + random_id(8);
    auto lora = lora_of(model);
    start = [this, t, model_id = model.id, adapter, session, sampler_adapter, lora]() mutable -> kj::Promise<Outcome> {
      // Older ephemeral weights of this model go first (a tenant's sampler
      // adapters are limited): their sampling sessions end.
      auto found = t->models.find(model_id);
      if (found == t->models.end())
        return failed(make_error(errc::not_found, "model " + model_id + " was unloaded before this call ran"));
      auto& m = found->second;
      kj::Promise<void> freed = kj::READY_NOW;
      while (static_cast<int64_t>(m.ephemeral.size()) >= o.ephemeral_per_model) {
        auto old = m.ephemeral.front();
        m.ephemeral.pop_front();
        auto it = t->samplers.find(old);
        if (it == t->samplers.end()) continue;
        auto rm = session->samplerRemoveAdapterRequest();
        rm.setName(it->second.adapter);
        freed = freed.then([t, rm = kj::mv(rm), name = it->second.adapter]() mutable {
          return rm.send().then(
              [t, name](capnp::Response<wire::Session::SamplerRemoveAdapterResults>&& res) {
                if (status_error(res)) t->doomed.insert(name);  // retried at the sweeps
              },
              [t, name](kj::Exception&&) { t->doomed.insert(name); });
        });
        t->samplers.erase(it);
      }
      return freed.then([this, t, model_id, adapter, session, sampler_adapter, lora]() mutable {
        auto add = session->samplerAddAdapterRequest();
        add.setName(sampler_adapter);
        write_lora(add.initLora(), lora);
        return add.send().then([this, t, model_id, adapter, session, sampler_adapter](
                                   capnp::Response<wire::Session::SamplerAddAdapterResults>&& res) mutable
                               -> kj::Promise<Outcome> {
          if (auto e = status_error(res)) return failed(std::move(e));
          auto sync = session->syncWeightsRequest();
          sync.setAdapter(adapter);
          sync.setSamplerAdapter(sampler_adapter);
          return sync.send().then([this, t, model_id, session, sampler_adapter](
                                      capnp::Response<wire::Session::SyncWeightsResults>&& res) mutable {
            if (auto e = status_error(res)) {
              forget_sampler_adapter(*t, sampler_adapter, *session);
              return failed(std::move(e));
            }
            auto owner = t->models.find(model_id);
            if (owner == t->models.end()) {  // unloaded meanwhile: its weights go with it
              forget_sampler_adapter(*t, sampler_adapter, *session);
              return failed(make_error(errc::aborted, "model " + model_id + " was unloaded while its weights were "
                                                                            "saved for sampling"));
            }
            auto sid = "s-" + random_id(8);
            t->samplers[sid] = Sampler{sid, sampler_adapter, "", {}};
            owner->second.ephemeral.push_back(sid);
            return plain(json{{"sampling_session_id", sid}, {"type", "save_weights_for_sampler"}});
          });
        });
      });
    };
  } else {
    if (!path.is_string()) return refuse_at(*c.tenant, model, seq, digest, user("path must be a checkpoint name"));
    TinkerPath target{model.id, for_sampler ? "sampler_weights" : "weights", path.get<std::string>()};
    if (!plain_name(target.name) || target.store_name().size() > 64)
      return refuse_at(*c.tenant, model, seq, digest, user("path '" + target.name.substr(0, 80) + "' must be 1 to " +
                              std::to_string(64 - (target.store_name().size() - target.name.size())) +
                              " bytes of letters, digits, '.', '_' and '-'"));
    start = [this, t, adapter, session, target, ttl, overwrite, for_sampler]() mutable -> kj::Promise<Outcome> {
      const bool exists = static_cast<bool>(host.store().find(t->name, target.store_name()));
      kj::Promise<void> cleared = kj::READY_NOW;
      if (exists) {
        if (!overwrite)
          return failed(user(target.text() + " exists already: pick another name, or save with overwrite=True"));
        auto del = session->deleteCheckpointRequest();
        del.setName(target.store_name());
        cleared = del.send().ignoreResult();
      }
      return cleared.then([adapter, session, target, ttl, for_sampler]() mutable {
        auto save = session->saveCheckpointRequest();
        save.setAdapter(adapter);
        save.setName(target.store_name());
        save.setWithOptimizer(!for_sampler);
        save.setTtlSeconds(ttl);
        return save.send().then([target, for_sampler](capnp::Response<wire::Session::SaveCheckpointResults>&& res) {
          if (auto e = status_error(res)) return failed(std::move(e));
          return plain(json{{"path", target.text()}, {"type", for_sampler ? "save_weights_for_sampler" : "save_weights"}});
        });
      });
    };
  }
  return queue(*c.tenant, model, seq, digest, std::move(start));
}

kj::Promise<Reply> Gateway::Impl::load_weights(Caller c, const json& j, size_t digest) {
  if (!field_or_null(j, "model_id").is_string())
    return error_reply(user("model_id is required (loading into a new model, create_model_via_load_weights, is not "
                            "offered by this server)"));
  auto call = model_call(*c.tenant, j);
  if (!call) return error_reply(call.error());
  Model& model = *call->model;
  const int64_t seq = call->seq;
  auto text = string_field(j, "path");
  if (!text) return refuse_at(*c.tenant, model, seq, digest, text.error());
  auto path = parse_path(*text, "path");
  if (!path) return refuse_at(*c.tenant, model, seq, digest, path.error());
  const bool optimizer = field_or_null(j, "optimizer").is_boolean() && field_or_null(j, "optimizer").get<bool>();
  auto adapter = model.adapter;
  auto session = std::make_shared<wire::Session::Client>(c.session);
  model.loss.clear();  // a load may bring the adapter's trainer back as saved: the next call sets the loss
  auto start = [adapter, session, path = *path, optimizer]() mutable -> kj::Promise<Outcome> {
    auto load = session->loadCheckpointRequest();
    load.setName(path.store_name());
    load.setAdapter(adapter);
    load.setCreate(false);
    load.setWithOptimizer(optimizer);
    return load.send().then([path](capnp::Response<wire::Session::LoadCheckpointResults>&& res) {
      if (auto e = status_error(res)) {
        // The store's "you have no checkpoint 'tk....'" in Tinker's terms.
        if (code_of(e) == errc::not_found) return failed(make_error(errc::not_found, "no checkpoint " + path.text()));
        return failed(std::move(e));
      }
      return plain(json{{"path", path.text()}, {"type", "load_weights"}});
    });
  };
  return queue(*c.tenant, model, seq, digest, std::move(start));
}

kj::Promise<Reply> Gateway::Impl::unload_model(Caller c, const json& j) {
  auto model_id = string_field(j, "model_id");
  if (!model_id) return error_reply(model_id.error());
  auto m = model_of(*c.tenant, *model_id);
  if (!m) return error_reply(m.error());
  auto id = new_future(c.tenant->name);
  auto adapter = (*m)->adapter;
  auto* t = c.tenant;
  auto session = std::make_shared<wire::Session::Client>(c.session);
  // After the calls already queued for it.
  auto done = (*m)->tail.addBranch().then([session, adapter]() mutable {
    auto rm = session->removeAdapterRequest();
    rm.setName(adapter);
    return rm.send();
  });
  // Its ephemeral sampler weights go with it.
  for (const auto& sid : (*m)->ephemeral)
    if (auto s = t->samplers.find(sid); s != t->samplers.end()) {
      forget_sampler_adapter(*t, s->second.adapter, *session);
      t->samplers.erase(s);
    }
  drop_model(*t, *model_id, make_error(errc::aborted, "model " + *model_id + " was unloaded before this call ran"));
  settle(id, done.then([model_id = *model_id](capnp::Response<wire::Session::RemoveAdapterResults>&& res) {
    if (auto e = status_error(res)) return failed(std::move(e));
    return plain(json{{"model_id", model_id}, {"type", "unload_model"}});
  }));
  return json_reply(json{{"request_id", id}, {"model_id", *model_id}});
}

kj::Promise<Reply> Gateway::Impl::create_sampling_session(Caller c, const json& j) {
  const auto& path = field_or_null(j, "model_path");
  const auto& base_model = field_or_null(j, "base_model");
  auto sid = "s-" + random_id(8);
  if (path.is_null()) {
    if (!base_model.is_string()) return error_reply(user("create_sampling_session needs model_path or base_model"));
    if (base_model.get<std::string>() != base.name)
      return error_reply(user("base_model '" + base_model.get<std::string>().substr(0, 80) +
                              "' is not served here: this server hosts '" + base.name + "'"));
    c.tenant->samplers[sid] = Sampler{sid, "", "", {}};
    return json_reply(json{{"sampling_session_id", sid}, {"type", "create_sampling_session"}});
  }
  if (!path.is_string()) return error_reply(user("model_path must be a tinker:// path"));
  auto p = parse_path(path.get<std::string>(), "model_path");
  if (!p) return error_reply(p.error());
  auto found = host.store().find(c.tenant->name, p->store_name());
  if (!found) return error_reply(make_error(errc::not_found, "no checkpoint " + p->text()));
  // The sampler adapter of this checkpoint as saved then (a checkpoint
  // saved again under its name is another key, so never stale weights).
  const auto key = p->text() + "@" + std::to_string(found->created_ms);
  auto* t = c.tenant;
  auto session_of = [t, sid, key, text = p->text()]() -> Reply {
    auto it = t->path_adapters.find(key);
    if (it == t->path_adapters.end())
      return error_reply(make_error(errc::unavailable, "loading " + text + " into the sampler failed; retry"));
    t->samplers[sid] = Sampler{sid, it->second, text, {}};
    // Most recently used last.
    t->path_order.erase(std::remove(t->path_order.begin(), t->path_order.end(), key), t->path_order.end());
    t->path_order.push_back(key);
    return json_reply(json{{"sampling_session_id", sid}, {"type", "create_sampling_session"}});
  };
  if (t->path_adapters.count(key)) return session_of();
  if (auto it = t->path_loading.find(key); it != t->path_loading.end())  // another session's load of it
    return it->second.addBranch().then([session_of](Reply r) { return r.status != 200 ? r : session_of(); });
  auto adapter = "tks-" + random_id(8);
  auto req = c.session.samplerLoadCheckpointRequest();
  req.setName(p->store_name());
  req.setAdapter(adapter);
  auto session = c.session;
  auto loaded = req.send()
                    .then([this, t, key, adapter, session](
                              capnp::Response<wire::Session::SamplerLoadCheckpointResults>&& res) mutable -> Reply {
                      if (auto e = status_error(res)) {
                        if (code_of(e) == errc::resource_exhausted)
                          return error_reply(make_error(
                              errc::failed_precondition,
                              "the sampler holds as many of your adapters as the server allows (ephemeral weights, "
                              "two per model, and the three tinker:// paths used last): unload a model or wait "
                              "for older sampling sessions to be replaced (" + describe(e) + ")"));
                        return error_reply(e);
                      }
                      // The least recently used path's weights make room.
                      while (!t->path_order.empty() &&
                             static_cast<int64_t>(t->path_order.size()) >= o.path_adapters) {
                        auto old = t->path_order.front();
                        t->path_order.pop_front();
                        auto a = t->path_adapters.find(old);
                        if (a == t->path_adapters.end()) continue;
                        for (auto s = t->samplers.begin(); s != t->samplers.end();)
                          s = s->second.adapter == a->second ? t->samplers.erase(s) : std::next(s);
                        forget_sampler_adapter(*t, a->second, session);
                        t->path_adapters.erase(a);
                      }
                      t->path_adapters[key] = adapter;
                      t->path_order.push_back(key);  // counted by the LRU even if no waiter is left
                      return Reply{};
                    })
                    .fork();
  auto mine = loaded.addBranch();
  // Forgotten once the load ends, from a branch of its own (never from the
  // fork's continuation, which its hub may not outlive).
  tasks.add(loaded.addBranch().then([t, key](Reply) { t->path_loading.erase(key); },
                                    [t, key](kj::Exception&&) { t->path_loading.erase(key); }));
  t->path_loading.emplace(key, kj::mv(loaded));
  return mine.then([session_of](Reply r) { return r.status != 200 ? r : session_of(); });
}

kj::Promise<Reply> Gateway::Impl::asample(Caller c, const json& j, size_t digest) {
  auto sid = string_field(j, "sampling_session_id");
  if (!sid) return error_reply(sid.error());
  auto it = c.tenant->samplers.find(*sid);
  if (it == c.tenant->samplers.end())
    return error_reply(make_error(errc::not_found, "no sampling session '" + sid->substr(0, 80) +
                                                       "' (it never existed, or newer weights of its model replaced it)"));
  auto& sampler = it->second;
  int64_t seq = -1;
  if (const auto& v = field_or_null(j, "seq_id"); v.is_number_integer()) seq = v.get<int64_t>();
  if (seq >= 0)
    if (auto s = sampler.seen.find(seq); s != sampler.seen.end()) {
      if (s->second.first == digest) return json_reply(json{{"request_id", s->second.second}});
      return error_reply(make_error(errc::aborted, "seq_id " + std::to_string(seq) + " of sampling session " + *sid +
                                                       " was already used by a different request"));
    }
  auto body = parse_sample_json(j, {.max_context = base.max_context, .tokens_per_call = o.tokens_per_call},
                                element_budget());
  if (!body) return error_reply(body.error());
  const auto& prompt = body->prompt;
  const auto& params = body->params;
  const bool want_prompt = body->prompt_logprobs;
  const int64_t topk = body->topk_prompt_logprobs;
  if (c.tenant->samples_in_flight >= o.max_samples_in_flight)
    return error_reply(make_error(errc::resource_exhausted,
                                  "limit tinker.max_samples_in_flight: " + std::to_string(c.tenant->samples_in_flight) +
                                      " sample calls of yours are running; retry after some finish"));
  auto id = new_future(c.tenant->name);
  if (seq >= 0) {
    sampler.seen[seq] = {digest, id};
    while (sampler.seen.size() > 8192) sampler.seen.erase(sampler.seen.begin());
  }
  auto req = c.session.sampleRequest();
  req.setAdapter(sampler.adapter);
  write_requests(req.initRequests(1), {actors::SampleRequest{0, prompt}});
  write_sampling(req.initParams(), params);
  auto* t = c.tenant;
  ++t->samples_in_flight;
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  settle(id, req.send()
                 .then([want_prompt, topk, prompt_len](capnp::Response<wire::Session::SampleResults>&& res) {
                   if (auto e = status_error(res)) return failed(std::move(e));
                   auto seqs = read_sequences(res.getSequences());
                   if (!seqs) return failed(seqs.error());
                   Outcome o;
                   o.kind = Outcome::Kind::sample;
                   for (const auto& s : *seqs) {
                     if (!s.error.empty()) return failed(user(s.error));
                     SampledSequence q;
                     q.length = s.stop_reason == actors::StopReason::length;
                     q.tokens = s.tokens;
                     q.logprobs = s.logprobs.chosen;
                     o.sample.sequences.push_back(std::move(q));
                     o.sample.prompt_cache_hit_tokens = std::max(o.sample.prompt_cache_hit_tokens, s.cached_tokens);
                   }
                   if ((want_prompt || topk > 0) && !seqs->empty()) {
                     const auto& pl = seqs->front().prompt_logprobs;
                     if (want_prompt) {
                       std::vector<float> lp{std::numeric_limits<float>::quiet_NaN()};
                       lp.insert(lp.end(), pl.chosen.begin(), pl.chosen.end());
                       lp.resize(static_cast<size_t>(prompt_len), std::numeric_limits<float>::quiet_NaN());
                       o.sample.prompt_logprobs = std::move(lp);
                     }
                     if (topk > 0) {
                       SampleResult::Topk tk;
                       tk.k = static_cast<uint32_t>(topk);
                       tk.ids.assign(static_cast<size_t>(topk), 0);  // the first prompt token has none
                       tk.logprobs.assign(static_cast<size_t>(topk), -99999.0f);
                       for (size_t i = 0; i < pl.top_ids.size(); ++i) {
                         tk.ids.push_back(static_cast<int32_t>(pl.top_ids[i]));
                         tk.logprobs.push_back(pl.top_logprobs[i]);
                       }
                       tk.ids.resize(static_cast<size_t>(prompt_len * topk), 0);
                       tk.logprobs.resize(static_cast<size_t>(prompt_len * topk), -99999.0f);
                       o.sample.topk_prompt_logprobs = std::move(tk);
                     }
                   }
                   return o;
                 })
                 .attach(kj::defer([t] { --t->samples_in_flight; })));
  return json_reply(json{{"request_id", id}});
}

kj::Promise<Result<std::string>> Gateway::Impl::openai_adapter(Caller c, const std::string& model) {
  using R = Result<std::string>;
  if (model == base.name) return R{std::string{}};
  if (model.rfind("tinker://", 0) != 0)
    return R{make_error(errc::not_found, "model '" + model.substr(0, 80) + "' is not served here: this server hosts '" +
                                             base.name + "', and your sampler weights by their tinker:// paths")};
  auto* t = c.tenant;
  if (auto it = t->openai_sessions.find(model); it != t->openai_sessions.end()) {
    if (auto s = t->samplers.find(it->second); s != t->samplers.end()) return R{s->second.adapter};
    t->openai_sessions.erase(it);  // its weights made room for others': load them again
  }
  return create_sampling_session(c, json{{"model_path", model}}).then([t, model](Reply r) -> R {
    auto j = json::parse(r.body, nullptr, false);
    if (r.status != 200) {
      const auto message = j.is_object() && j.contains("detail") ? j["detail"].get<std::string>() : r.body;
      return make_error(r.status == 404 ? errc::not_found : r.status == 400 ? errc::invalid_argument : errc::unavailable,
                        message);
    }
    const auto sid = j.value("sampling_session_id", std::string{});
    auto s = t->samplers.find(sid);
    if (s == t->samplers.end()) return make_error(errc::unavailable, "loading " + model + " into the sampler failed; retry");
    t->openai_sessions[model] = sid;
    return s->second.adapter;
  });
}

kj::Promise<Reply> Gateway::Impl::openai_route(Caller c, bool get, bool post, const std::string& path,
                                               const std::string& body) {
  auto refuse = [](const caf::error& e) {
    return json_reply(openai::error_json(e), static_cast<unsigned>(status_of(e)));
  };
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (get && path == "/v1/models") {
    std::vector<std::string> paths;
    if (auto list = host.store().list(c.tenant->name))
      for (const auto& ck : *list) {
        // Tinker's sampler weights are stored as tk.<run>.s.<name>.
        const auto& n = ck.name;
        const auto at = n.find(".s.");
        if (n.rfind("tk.", 0) == 0 && at != std::string::npos)
          paths.push_back("tinker://" + n.substr(3, at - 3) + "/sampler_weights/" + n.substr(at + 3));
      }
    return json_reply(openai::models(base.name, paths, now));
  }
  const bool chat = path == "/v1/chat/completions";
  if (!post || (!chat && path != "/v1/completions"))
    return refuse(make_error(errc::not_found, "no route " + path.substr(0, 80) +
                                                  ": POST /v1/chat/completions, POST /v1/completions, GET /v1/models"));
  if (!base.tokenizer)
    return refuse(make_error(errc::unavailable, "the served model's tokenizer did not load, so /v1 cannot encode"));
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return refuse(user("the body is not JSON"));
  auto r = openai::parse_request(j, chat, base.chat.get(), *base.tokenizer, {.max_context = base.max_context});
  if (!r) return refuse(r.error());
  auto* t = c.tenant;
  if (t->samples_in_flight >= o.max_samples_in_flight)
    return refuse(make_error(errc::resource_exhausted,
                             "limit tinker.max_samples_in_flight: " + std::to_string(t->samples_in_flight) +
                                 " sample calls of yours are running; retry after some finish"));
  ++t->samples_in_flight;
  auto request = std::make_shared<openai::Request>(std::move(*r));
  const auto format = base.chat && base.chat->tokenizer().config().chat_template
                          ? components::tool_call_format_of(*base.chat->tokenizer().config().chat_template)
                          : components::ToolCallFormat::none;
  auto session = c.session;
  auto tokenizer = base.tokenizer;
  return openai_adapter(c, request->model)
      .then([refuse, request, session, tokenizer, format, now](Result<std::string> adapter) mutable -> kj::Promise<Reply> {
        if (!adapter) return refuse(adapter.error());
        auto req = session.sampleRequest();
        req.setAdapter(*adapter);
        write_requests(req.initRequests(1), {actors::SampleRequest{0, request->prompt}});
        write_sampling(req.initParams(), request->params);
        return req.send().then([refuse, request, tokenizer, format, now](
                                   capnp::Response<wire::Session::SampleResults>&& res) -> Reply {
          if (auto e = status_error(res)) return refuse(e);
          auto seqs = read_sequences(res.getSequences());
          if (!seqs) return refuse(seqs.error());
          std::vector<openai::Choice> choices;
          for (const auto& s : *seqs) {
            if (!s.error.empty()) return refuse(user(s.error));
            choices.push_back({s.tokens, s.logprobs, s.stop_reason, s.stop_token, s.text});
          }
          auto a = openai::answer(*request, choices, *tokenizer, format,
                                  (request->chat ? "chatcmpl-" : "cmpl-") + random_id(12), now);
          return Reply{200, a.content_type, std::move(a.body), false};
        });
      })
      .attach(kj::defer([t] { --t->samples_in_flight; }));
}

kj::Promise<Reply> Gateway::Impl::retrieve_future(Caller c, const json& j, bool proto) {
  auto id = string_field(j, "request_id");
  if (!id) return error_reply(id.error());
  auto it = futures.find(*id);
  // Another tenant's future is answered as one that does not exist.
  if (it == futures.end() || it->second.tenant != c.tenant->name)
    return error_reply(make_error(errc::not_found, "no future '" + id->substr(0, 80) + "' (unknown, or expired)"));
  if (it->second.outcome) return answered(it->second, proto);
  auto paf = kj::newPromiseAndFulfiller<void>();
  it->second.waiters.push_back(kj::mv(paf.fulfiller));
  return paf.promise.exclusiveJoin(timer.afterDelay(static_cast<uint64_t>(o.poll.count()) * kj::MILLISECONDS))
      .then([this, id = *id, proto]() {
        auto f = futures.find(id);
        if (f == futures.end())
          return error_reply(make_error(errc::not_found, "no future '" + id + "' (unknown, or expired)"));
        if (f->second.outcome) return answered(f->second, proto);
        return json_reply(json{{"type", "try_again"}, {"request_id", id}, {"queue_state", "active"}});
      });
}

kj::Promise<Reply> Gateway::Impl::weights_info(Caller c, const json& j) {
  auto text = string_field(j, "tinker_path");
  if (!text) return error_reply(text.error());
  auto p = parse_path(*text, "tinker_path");
  if (!p) return error_reply(p.error());
  auto found = host.store().find(c.tenant->name, p->store_name());
  if (!found) return error_reply(make_error(errc::not_found, "no checkpoint " + p->text()));
  auto lora = actors::LoraConfig::load(host.store().checkpoint_dir(c.tenant->name, p->store_name()) + "/adapter_config.json");
  if (!lora) return error_reply(with_context(lora.error(), p->text()));
  auto has = [&](const char* m) {
    return std::find(lora->target_modules.begin(), lora->target_modules.end(), m) != lora->target_modules.end();
  };
  return json_reply(json{{"base_model", base.name},
                         {"is_lora", true},
                         {"lora_rank", lora->r},
                         {"train_unembed", has("lm_head")},
                         {"train_mlp", has("up_proj")},
                         {"train_attn", has("q_proj")}});
}

kj::Promise<Reply> Gateway::Impl::training_runs(Caller c, const std::string& path, const std::string& query) {
  auto list = host.store().list(c.tenant->name);
  if (!list) return error_reply(list.error());
  // Runs: live models and the runs of checkpoints (tk.<run>.<w|s>.<name>).
  struct Run {
    int64_t rank = 0;
    int64_t last_ms = 0;
    std::optional<json> last, last_sampler;
  };
  std::map<std::string, Run> runs;
  std::map<std::string, std::vector<json>> checkpoints;
  for (const auto& [id, m] : c.tenant->models) {
    runs[id].rank = m.rank;
    runs[id].last_ms = m.last_request_ms;
  }
  for (const auto& info : *list) {
    if (info.name.rfind("tk.", 0) != 0) continue;
    auto rest = info.name.substr(3);
    auto dot = rest.find('.');
    if (dot == std::string::npos || rest.size() < dot + 3) continue;
    auto run = rest.substr(0, dot);
    const bool weights = rest[dot + 1] == 'w';
    auto name = rest.substr(dot + 3);
    TinkerPath tp{run, weights ? "weights" : "sampler_weights", name};
    json ck{{"checkpoint_id", tp.kind + "/" + name},
            {"checkpoint_type", weights ? "training" : "sampler"},
            {"time", iso_time(info.created_ms)},
            {"tinker_path", tp.text()},
            {"public", false},
            {"expires_at", info.expires_ms > 0 ? json(iso_time(info.expires_ms)) : json(nullptr)}};
    auto& r = runs[run];
    r.last_ms = std::max(r.last_ms, info.created_ms);
    if (r.rank == 0)
      if (auto l = actors::LoraConfig::load(host.store().checkpoint_dir(c.tenant->name, info.name) + "/adapter_config.json"))
        r.rank = l->r;
    (weights ? r.last : r.last_sampler) = ck;
    checkpoints[run].push_back(std::move(ck));
  }
  auto run_json = [&](const std::string& id, const Run& r) {
    return json{{"training_run_id", id},
                {"base_model", base.name},
                {"model_owner", c.tenant->name},
                {"is_lora", true},
                {"corrupted", false},
                {"lora_rank", r.rank},
                {"last_request_time", iso_time(r.last_ms)},
                {"last_checkpoint", r.last ? *r.last : json(nullptr)},
                {"last_sampler_checkpoint", r.last_sampler ? *r.last_sampler : json(nullptr)},
                {"user_metadata", nullptr}};
  };
  auto param = [&](const std::string& key, int64_t fallback) {
    auto at = ("&" + query).find("&" + key + "=");
    if (at == std::string::npos) return fallback;
    try {
      return static_cast<int64_t>(std::stoll(query.substr(at + key.size() + 1)));
    } catch (...) {
      return fallback;
    }
  };
  const std::string prefix = "/api/v1/training_runs";
  auto rest = path.substr(prefix.size());
  if (rest.empty() || rest == "/") {
    const auto offset = std::max<int64_t>(0, param("offset", 0)), limit = std::clamp<int64_t>(param("limit", 20), 0, 1000);
    json items = json::array();
    int64_t i = 0;
    for (const auto& [id, r] : runs) {
      if (i >= offset && i < offset + limit) items.push_back(run_json(id, r));
      ++i;
    }
    return json_reply(json{{"training_runs", items}, {"cursor", {{"offset", offset}, {"limit", limit}, {"total_count", runs.size()}}}});
  }
  auto run = rest.substr(1);
  auto slash = run.find('/');
  auto tail = slash == std::string::npos ? std::string{} : run.substr(slash);
  run = run.substr(0, slash);
  auto r = runs.find(run);
  if (r == runs.end()) return error_reply(make_error(errc::not_found, "no training run '" + run.substr(0, 80) + "'"));
  if (tail.empty()) return json_reply(run_json(run, r->second));
  if (tail == "/checkpoints") {
    auto& items = checkpoints[run];
    return json_reply(json{{"checkpoints", items},
                           {"cursor", {{"offset", 0}, {"limit", items.size()}, {"total_count", items.size()}}}});
  }
  return error_reply(make_error(errc::not_found, "no endpoint " + path.substr(0, 120)));
}

kj::Promise<Reply> Gateway::Impl::route(kj::HttpMethod method, std::string path, const RequestHeaders& h,
                                        std::string body, Result<Caller> c) {
  std::string query;
  if (auto q = path.find('?'); q != std::string::npos) {
    query = path.substr(q + 1);
    path = path.substr(0, q);
  }
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const bool get = method == kj::HttpMethod::GET, post = method == kj::HttpMethod::POST;
  if (get && path == "/api/v1/healthz") return json_reply(json{{"status", "ok"}});
  if (!c) {
    // The same answer whatever was wrong with the key.
    return json_reply(json{{"detail", describe(c.error())}, {"error", describe(c.error())}, {"category", "user"}}, 401);
  }
  if (path == "/v1" || path.rfind("/v1/", 0) == 0) return openai_route(*c, get, post, path, body);
  if (get && path == "/api/v1/get_server_capabilities")
    return json_reply(json{{"supported_models", json::array({json{{"model_name", base.name}, {"max_context_length", base.max_context}}})}});
  if (get && path.rfind("/api/v1/samplers/", 0) == 0) {
    auto id = path.substr(std::string{"/api/v1/samplers/"}.size());
    auto it = c->tenant->samplers.find(id);
    if (it == c->tenant->samplers.end()) return error_reply(make_error(errc::not_found, "no sampling session '" + id.substr(0, 80) + "'"));
    return json_reply(json{{"sampler_id", id},
                           {"base_model", base.name},
                           {"model_path", it->second.model_path.empty() ? json(nullptr) : json(it->second.model_path)}});
  }
  if (get && path.rfind("/api/v1/training_runs", 0) == 0) return training_runs(*c, path, query);
  if (method == kj::HttpMethod::DELETE && path.rfind("/api/v1/training_runs/", 0) == 0) {
    // /api/v1/training_runs/<run>/checkpoints/<weights|sampler_weights>/<name>
    auto rest = path.substr(std::string{"/api/v1/training_runs/"}.size());
    auto a = rest.find("/checkpoints/");
    if (a == std::string::npos) return error_reply(make_error(errc::not_found, "no endpoint DELETE " + path.substr(0, 120)));
    auto p = parse_path("tinker://" + rest.substr(0, a) + "/" + rest.substr(a + 13), "checkpoint");
    if (!p) return error_reply(p.error());
    if (!host.store().find(c->tenant->name, p->store_name()))
      return error_reply(make_error(errc::not_found, "no checkpoint " + p->text()));
    auto del = c->session.deleteCheckpointRequest();
    del.setName(p->store_name());
    return del.send().then([](capnp::Response<wire::Session::DeleteCheckpointResults>&& res) {
      if (auto e = status_error(res)) return error_reply(e);
      return json_reply(json::object());
    });
  }
  if (!post) return error_reply(make_error(errc::not_found, "no endpoint " + path.substr(0, 120)));

  if (!h.content_encoding.empty() && h.content_encoding != "identity") {
    if (h.content_encoding != "zstd")
      return error_reply(user("Content-Encoding '" + h.content_encoding.substr(0, 40) + "' is not supported (zstd is)"));
    auto plain_body = zstd_decompress(body, static_cast<size_t>(o.max_body_bytes));
    if (!plain_body)
      return code_of(plain_body.error()) == errc::resource_exhausted ? too_large(o.max_body_bytes)
                                                                     : error_reply(plain_body.error());
    body = std::move(*plain_body);
  }
  const bool proto_body = h.content_type.find("application/x-protobuf") != std::string::npos;
  // A retry is recognised by its content (a digest of its canonical form),
  // not its bytes: the same request may come with its maps in another order.
  if (path == "/api/v1/forward_backward" && proto_body) {
    std::string canonical;
    auto r = parse_forward_backward_proto(body, &canonical, element_budget());
    if (!r) {
      if (auto ids = forward_backward_ids_proto(body))
        if (auto m = model_of(*c->tenant, ids->first))
          return refuse_at(*c->tenant, **m, ids->second, std::hash<std::string>{}(path + "\n" + body), r.error());
      return error_reply(r.error());
    }
    return forward_backward(*c, std::move(*r), std::hash<std::string>{}(path + "\n" + canonical));
  }
  if (proto_body) return error_reply(user(path.substr(0, 120) + " takes a JSON body, not protobuf"));
  auto decoded = decode_json_body(body, kMaxJsonDepth, element_budget());
  if (!decoded) return error_reply(decoded.error());
  const json& j = *decoded;
  const size_t digest = std::hash<std::string>{}(path + "\n" + j.dump());  // keys in order

  if (path == "/api/v1/client/config")
    return json_reply(json{{"pjwt_auth_enabled", false},
                           {"use_pyqwest_transport", false},
                           {"parallel_fwdbwd_chunks", true},
                           {"proto_write_fwdbwd", false},
                           {"proto_compress_fwdbwd", true},
                           {"fwd_via_fwdbwd", false},
                           {"enable_grpc_retrieve_future", false},
                           {"create_model_via_load_weights", false},
                           {"sample_no_retries", false}});
  if (path == "/api/v1/create_session") {
    auto id = random_id(8);
    c->tenant->session_ids.insert(id);
    return json_reply(json{{"session_id", id}, {"type", "create_session"}});
  }
  if (path == "/api/v1/session_heartbeat") {
    auto beat = c->session.heartbeatRequest();
    return beat.send().then([](capnp::Response<wire::Session::HeartbeatResults>&& res) {
      if (auto e = status_error(res)) return error_reply(e);
      return json_reply(json{{"type", "session_heartbeat"}});
    });
  }
  if (path == "/api/v1/telemetry") return json_reply(json{{"status", "accepted"}});
  if (path == "/api/v1/create_model") return create_model(*c, j);
  if (path == "/api/v1/forward_backward" || path == "/api/v1/forward") {
    auto r = parse_forward_backward_json(j, path == "/api/v1/forward", element_budget());
    if (!r) {
      // Readable ids: the call takes its seq_id's turn as a failed future.
      const auto& id = field_or_null(j, "model_id");
      const auto& seq = field_or_null(j, "seq_id");
      if (id.is_string() && seq.is_number_integer())
        if (auto m = model_of(*c->tenant, id.get<std::string>()))
          return refuse_at(*c->tenant, **m, seq.get<int64_t>(), digest, r.error());
      return error_reply(r.error());
    }
    return forward_backward(*c, std::move(*r), digest);
  }
  if (path == "/api/v1/optim_step") return optim_step(*c, j, digest);
  if (path == "/api/v1/save_weights") return save_weights(*c, j, digest, false);
  if (path == "/api/v1/save_weights_for_sampler") return save_weights(*c, j, digest, true);
  if (path == "/api/v1/load_weights") return load_weights(*c, j, digest);
  if (path == "/api/v1/unload_model") return unload_model(*c, j);
  if (path == "/api/v1/get_info") {
    auto model_id = string_field(j, "model_id");
    if (!model_id) return error_reply(model_id.error());
    auto m = model_of(*c->tenant, *model_id);
    if (!m) return error_reply(m.error());
    return json_reply(model_info(**m));
  }
  if (path == "/api/v1/weights_info") return weights_info(*c, j);
  if (path == "/api/v1/create_sampling_session") return create_sampling_session(*c, j);
  if (path == "/api/v1/asample") return asample(*c, j, digest);
  if (path == "/api/v1/retrieve_future") return retrieve_future(*c, j, accepts_proto(h));
  return error_reply(make_error(errc::not_found, "no endpoint " + path.substr(0, 120) +
                                                     " (docs/tinker.md lists what this server offers)"));
}

Gateway::Gateway(Host& host, BaseModel base, GatewayOptions options, kj::Timer& timer)
    : impl_(std::make_unique<Impl>(host, std::move(base), options, timer)) {}

Gateway::~Gateway() = default;

const kj::HttpHeaderTable& Gateway::headers() const { return *impl_->table; }

void Gateway::sweep() { impl_->sweep(); }

void Gateway::forget_adapters(const std::string& tenant) {
  auto it = impl_->tenants.find(tenant);
  if (it == impl_->tenants.end()) return;
  auto& t = it->second;
  const auto why = make_error(errc::not_found, "the server freed this tenant's adapters after a silence longer than "
                                               "its idle limit (checkpoints stay): create a model and load a "
                                               "checkpoint into it");
  std::vector<std::string> ids;
  for (const auto& [id, _] : t.models) ids.push_back(id);
  for (const auto& id : ids) impl_->drop_model(t, id, why);
  t.samplers.clear();
  t.path_adapters.clear();
  t.path_order.clear();
  t.doomed.clear();
  t.path_loading.clear();
}

namespace {
kj::Promise<void> send_reply(const kj::HttpHeaderTable& table, kj::HttpService::Response& response, Reply r);

// A request's body: kept up to the limit, read to its end beyond it (and
// dropped), so that a client still sending gets its 413 instead of a reset.
// What it keeps counts against its tenant's request bytes while it lives.
struct Body {
  std::string text;
  bool over = false, over_budget = false;
  size_t read = 0;
  Charge charge;       ///< what the kept text holds, against its tenant
  int64_t budget = 0;  ///< the tenant's request_bytes limit
  kj::byte buffer[65536];
  void keep(size_t n) {
    const auto more = static_cast<int64_t>(n);
    if (charge.tenant && charge.tenant->request_bytes + more > budget) {
      over_budget = true;
      drop();
      return;
    }
    text.append(reinterpret_cast<const char*>(buffer), n);
    if (charge.tenant) charge.add(more);
  }
  void drop() {
    text.clear();
    text.shrink_to_fit();
    charge.clear();
  }
};

// How much of a body over the limit is read (and dropped) for a polite 413.
size_t drain_bound(size_t limit) { return 4 * limit + (size_t{64} << 20); }

kj::Promise<void> read_body(kj::AsyncInputStream& in, std::shared_ptr<Body> b, size_t limit) {
  return in.tryRead(b->buffer, 1, sizeof b->buffer).then([&in, b, limit](size_t n) -> kj::Promise<void> {
    if (n == 0) return kj::READY_NOW;
    b->read += n;
    // Drained to its end for a polite 413, up to a bound: beyond, the
    // connection goes (a body that never ends must not hold it).
    if ((b->over || b->over_budget) && b->read > drain_bound(limit)) return kj::READY_NOW;
    if (!b->over && !b->over_budget) {
      if (b->text.size() + n > limit) {
        b->over = true;
        b->drop();
      } else {
        b->keep(n);
      }
    }
    return read_body(in, b, limit);
  });
}

Reply unauthorized(const caf::error& e) {
  // The same answer whatever was wrong with the key.
  return json_reply(json{{"detail", describe(e)}, {"error", describe(e)}, {"category", "user"}}, 401);
}
}  // namespace

kj::Promise<void> Gateway::request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                                   kj::AsyncInputStream& body, Response& response) {
  std::string path{url.cStr()};
  auto* impl = impl_.get();
  RequestHeaders h;
  auto copy = [&](kj::HttpHeaderId id, std::string& out) {
    KJ_IF_MAYBE(v, headers.get(id)) { out = v->cStr(); }
  };
  copy(impl->api_key, h.api_key);
  copy(impl->accept, h.accept);
  copy(impl->content_encoding, h.content_encoding);
  copy(impl->authorization, h.authorization);
  copy(kj::HttpHeaderId::CONTENT_TYPE, h.content_type);
  const int64_t limit = impl->o.max_body_bytes;
  // The key is checked before the body is read: a peer without one never
  // has its body buffered (it gets 401, and KJ closes the connection if
  // the body goes on).
  std::string bare = path.substr(0, path.find('?'));
  while (bare.size() > 1 && bare.back() == '/') bare.pop_back();
  Result<Impl::Caller> who = make_error(errc::permission_denied, "no key");
  if (!(method == kj::HttpMethod::GET && bare == "/api/v1/healthz")) {
    who = impl->caller(h);
    if (!who) return send_reply(*impl->table, response, unauthorized(who.error()));
    // A length past what read_body would drain for a polite 413 is answered
    // before a byte of it is read; a smaller one over the limit is drained
    // (held nowhere), so that a client still sending gets its 413, not a reset.
    KJ_IF_MAYBE(length, body.tryGetLength()) {
      if (*length > drain_bound(static_cast<size_t>(limit))) return send_reply(*impl->table, response, too_large(limit));
    }
  }
  auto state = std::make_shared<Body>();
  if (who) {
    state->charge.tenant = who->tenant;
    state->budget = impl->o.request_bytes;
  }
  auto timed_out = std::make_shared<bool>(false);
  auto deadline = impl->timer.afterDelay(static_cast<uint64_t>(impl->o.body_timeout.count()) * kj::SECONDS)
                      .then([timed_out] { *timed_out = true; });
  return read_body(body, state, static_cast<size_t>(limit))
      .exclusiveJoin(kj::mv(deadline))
      .then([impl, method, path, h = std::move(h), limit, state, timed_out, who = std::move(who)]() mutable
                -> kj::Promise<Reply> {
        if (*timed_out) {
          auto message = "the body did not arrive within " + std::to_string(impl->o.body_timeout.count()) +
                         " s ([tinker] body_seconds)";
          return json_reply(json{{"detail", message}, {"error", message}, {"category", "user"}}, 408);
        }
        if (state->over) return too_large(limit);
        if (state->over_budget)
          return error_reply(make_error(
              errc::resource_exhausted,
              "limit request_mib: your bodies being read and calls queued or running hold more than the " +
                  mib_text(impl->o.request_bytes) + " a tenant may hold: wait for your calls to finish"));
        try {
          // From here the text is the route's, parsed at once; what it
          // makes is charged where it is kept (a queued call's batch).
          auto text = std::move(state->text);
          state->drop();
          return impl->route(method, path, h, std::move(text), std::move(who));
        } catch (const std::exception& e) {
          return error_reply(make_error(errc::internal, std::string{"the gateway failed: "} + e.what()));
        }
      })
      .then([impl, &response](Reply r) { return send_reply(*impl->table, response, std::move(r)); });
}

namespace {

kj::Promise<void> send_reply(const kj::HttpHeaderTable& table, kj::HttpService::Response& response, Reply r) {
  kj::HttpHeaders out(table);
  out.set(kj::HttpHeaderId::CONTENT_TYPE, kj::heapString(r.content_type.data(), r.content_type.size()));
  if (r.no_retry) out.add("x-should-retry", "false");
  auto stream = response.send(r.status, r.status == 200 ? "OK" : "Error", out, r.body.size());
  auto text = kj::heapString(r.body.data(), r.body.size());
  auto write = stream->write(text.begin(), text.size());
  return write.attach(kj::mv(stream), kj::mv(text));
}

}  // namespace

}  // namespace glint::rpc::tinker
