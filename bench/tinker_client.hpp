#pragma once
// What the benchmarks that serve need (bench remote, bench serve-soak): the
// bench's base model, and a client of the server's Tinker API that speaks as
// the SDK does. bench's own.

#include "runtime/batch.hpp"
#include "runtime/error.hpp"

#include "tinker_public.pb.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace glint::bench {

/// A fresh directory under the system's temporary one, removed with it.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

/// 8 rows of 64 token ids in [3, vocab), varied by `offset`.
inline Batch bench_batch(int64_t vocab, int64_t offset) {
  Batch b;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 8 * 64; ++i) ids.push_back((i * 31 + offset * 7) % (vocab - 3) + 3);
  if (auto t = Tensor::from_values(ids, {8, 64})) b.tensors["input_ids"] = std::move(*t);
  return b;
}

/// A small Qwen3 (4 layers, hidden 256) with a tokenizer trained on
/// arithmetic rows, saved in Hugging Face's layout in `dir`; answers its
/// vocabulary size.
Result<int64_t> make_bench_base(const std::string& dir);

// A client of the server's Tinker API that does what SDK 0.25 does for a
// training step: forward_backward as protobuf, optim_step as JSON, both
// futures polled (retrieve_future) to their results.
class TinkerClient {
public:
  TinkerClient(int port, std::string key) : http_("127.0.0.1", port), key_(std::move(key)) {
    http_.set_read_timeout(120, 0);
  }

  Result<void> open(const std::string& base_model) {
    auto session = post("/api/v1/create_session", R"({"tags": [], "sdk_version": "0.25.0"})");
    if (!session) return session.error();
    nlohmann::json create{{"session_id", (*session)["session_id"]},
                          {"model_seq_id", 0},
                          {"base_model", base_model},
                          {"lora_config", {{"rank", 8}, {"train_unembed", false}}}};
    auto f = post("/api/v1/create_model", create.dump());
    if (!f) return f.error();
    auto done = wait((*f)["request_id"], false);
    if (!done) return done.error();
    model_ = nlohmann::json::parse(*done)["model_id"];
    return {};
  }

  // One step on `batch`'s rows: each row's tokens predict the next ones.
  Result<void> step(const Batch& batch) {
    tinker_public::ForwardBackwardRequest req;
    req.set_model_id(model_);
    req.set_seq_id(seq_++);
    req.set_loss_fn("cross_entropy");
    const auto& ids = batch.tensors.at("input_ids");
    auto v = ids.values<int64_t>();
    if (!v) return v.error();
    const int64_t rows = ids.size(0), n = ids.size(1) - 1;
    for (int64_t r = 0; r < rows; ++r) {
      auto* d = req.add_data();
      std::vector<int32_t> input(v->begin() + r * (n + 1), v->begin() + r * (n + 1) + n);
      std::vector<int64_t> targets(v->begin() + r * (n + 1) + 1, v->begin() + (r + 1) * (n + 1));
      std::vector<float> weights(static_cast<size_t>(n), 1.0f / static_cast<float>(n * rows));
      d->add_model_input()->mutable_encoded_text()->set_tokens(
          std::string(reinterpret_cast<const char*>(input.data()), input.size() * 4));
      auto& t = (*d->mutable_loss_fn_inputs())["target_tokens"];
      t.set_dtype(tinker_public::DTYPE_INT64);
      t.add_shape(n);
      t.set_dense(std::string(reinterpret_cast<const char*>(targets.data()), targets.size() * 8));
      auto& w = (*d->mutable_loss_fn_inputs())["weights"];
      w.set_dtype(tinker_public::DTYPE_FLOAT32);
      w.add_shape(n);
      w.set_dense(std::string(reinterpret_cast<const char*>(weights.data()), weights.size() * 4));
    }
    auto fb = post("/api/v1/forward_backward", req.SerializeAsString(), "application/x-protobuf");
    if (!fb) return fb.error();
    nlohmann::json opt{{"model_id", model_}, {"seq_id", seq_++}, {"adam_params", {{"learning_rate", 1e-3}}}};
    auto st = post("/api/v1/optim_step", opt.dump());
    if (!st) return st.error();
    auto out = wait((*fb)["request_id"], true);
    if (!out) return out.error();
    tinker_public::ForwardBackwardOutput parsed;
    if (!parsed.ParseFromString(*out) || !parsed.metrics().count("loss:sum"))
      return make_error(errc::internal, "the forward_backward result is not a ForwardBackwardOutput");
    auto stepped = wait((*st)["request_id"], false);
    if (!stepped) return stepped.error();
    return {};
  }

  /// save_weights_for_sampler: a sampling session of the model's weights now.
  Result<std::string> sampler() {
    nlohmann::json body{{"model_id", model_}, {"seq_id", seq_++}, {"sampling_session_seq_id", sampler_seq_++},
                        {"type", "save_weights_for_sampler"}};
    auto f = post("/api/v1/save_weights_for_sampler", body.dump());
    if (!f) return f.error();
    auto done = wait((*f)["request_id"], false);
    if (!done) return done.error();
    auto j = nlohmann::json::parse(*done, nullptr, false);
    if (!j.is_object() || !j.contains("sampling_session_id"))
      return make_error(errc::internal, "save_weights_for_sampler answered " + done->substr(0, 200));
    return j["sampling_session_id"].get<std::string>();
  }

  /// asample of `prompt` in sampling session `sid`: answers the tokens made.
  Result<int64_t> sample(const std::string& sid, const std::vector<int64_t>& prompt, int n, int max_tokens) {
    nlohmann::json body{{"sampling_session_id", sid},
                        {"seq_id", sample_seq_++},
                        {"num_samples", n},
                        {"prompt", {{"chunks", {{{"tokens", prompt}, {"type", "encoded_text"}}}}}},
                        {"sampling_params", {{"max_tokens", max_tokens}, {"temperature", 1.0}}},
                        {"prompt_logprobs", false},
                        {"topk_prompt_logprobs", 0},
                        {"type", "sample"}};
    auto f = post("/api/v1/asample", body.dump());
    if (!f) return f.error();
    auto done = wait((*f)["request_id"], false);
    if (!done) return done.error();
    auto j = nlohmann::json::parse(*done, nullptr, false);
    if (!j.is_object() || !j.contains("sequences") || !j["sequences"].is_array())
      return make_error(errc::internal, "asample answered " + done->substr(0, 200));
    int64_t tokens = 0;
    for (const auto& q : j["sequences"]) tokens += static_cast<int64_t>(q.value("tokens", nlohmann::json::array()).size());
    return tokens;
  }

private:
  Result<nlohmann::json> post(const std::string& path, const std::string& body,
                              const std::string& type = "application/json", const std::string& accept = "") {
    httplib::Headers h{{"X-API-Key", key_}};
    if (!accept.empty()) h.emplace("Accept", accept);
    auto r = http_.Post(path.c_str(), h, body, type.c_str());
    if (!r) return make_error(errc::unavailable, "POST " + path + " failed: " + httplib::to_string(r.error()));
    if (r->status != 200)
      return make_error(errc::internal, "POST " + path + ": HTTP " + std::to_string(r->status) + " " + r->body);
    if (accept == "application/x-protobuf" && r->get_header_value("Content-Type").find("protobuf") != std::string::npos)
      return nlohmann::json{{"proto", r->body}};
    auto j = nlohmann::json::parse(r->body, nullptr, false);
    if (j.is_discarded()) return make_error(errc::internal, "POST " + path + " answered no JSON");
    return j;
  }
  Result<std::string> wait(const std::string& id, bool proto) {
    nlohmann::json body{{"request_id", id}, {"allow_metadata_only", true}};
    for (;;) {
      auto r = post("/api/v1/retrieve_future", body.dump(), "application/json",
                    proto ? "application/x-protobuf" : "application/json");
      if (!r) return r.error();
      if (r->contains("proto")) return (*r)["proto"].get<std::string>();
      if (r->value("type", "") == "try_again") continue;
      if (r->contains("error")) return make_error(errc::internal, "a Tinker call failed: " + r->dump());
      return r->dump();
    }
  }

  httplib::Client http_;
  std::string key_, model_;
  int seq_ = 1;
  int sampler_seq_ = 0;
  int sample_seq_ = 0;
};


}  // namespace glint::bench
