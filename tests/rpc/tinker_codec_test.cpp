// The Tinker API's bodies (rpc/tinker/codec.hpp): a request encoded by the
// SDK's own generated protobuf module, JSON in SDK 0.16's and 0.18's forms,
// sparse tensors, zstd, the results as the SDK decodes them, and bad bodies
// refused naming the field.
#include "rpc/tinker/codec.hpp"

#include "tinker_public.pb.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace glint::rpc::tinker {
namespace {

using nlohmann::json;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// ForwardBackwardRequest{model_id "model-123", seq_id 1, loss_fn "cross_entropy", one datum: tokens
// int32 [1, 2, 3], target_tokens int64 [2, 3, 4]}, as the SDK 0.25's tinker_public_pb2 serializes it.
const char* kSdkRequest =
    "0a096d6f64656c2d31323310011a440a100a0e0a0c01000000020000000300000012300a0d7461726765745f746f6b656e73121f0a1802"
    "00000000000000030000000000000004000000000000001802220103220d63726f73735f656e74726f7079";

TEST(TinkerCodec, ReadsARequestTheSdkEncoded) {
  std::string canonical;
  auto r = parse_forward_backward_proto(from_hex(kSdkRequest), &canonical);
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->model_id, "model-123");
  EXPECT_EQ(r->seq_id, 1);
  EXPECT_EQ(r->loss_fn, "cross_entropy");
  EXPECT_FALSE(r->forward_only);
  ASSERT_EQ(r->data.size(), 1u);
  EXPECT_EQ(r->data[0].tokens, (std::vector<int64_t>{1, 2, 3}));
  const auto& t = r->data[0].inputs.at("target_tokens");
  EXPECT_EQ(t.dtype, TensorData::Dtype::i64);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(t.values, (std::vector<double>{2, 3, 4}));
  EXPECT_FALSE(canonical.empty());
  auto ids = forward_backward_ids_proto(from_hex(kSdkRequest));
  ASSERT_TRUE(ids);
  EXPECT_EQ(*ids, (std::pair<std::string, int64_t>{"model-123", 1}));
  EXPECT_FALSE(forward_backward_ids_proto("\xff\xff not protobuf"));
}

TEST(TinkerCodec, ARequestsCanonicalFormIgnoresItsMapOrder) {
  // One datum whose loss_fn_inputs entries are written in a chosen order:
  // serialized one-entry datums concatenate into one datum (protobuf merges).
  auto datum_bytes = [](std::vector<std::string> keys) {
    std::string out;
    int32_t tokens[2] = {5, 6};
    tinker_public::Datum input;
    input.add_model_input()->mutable_encoded_text()->set_tokens(std::string(reinterpret_cast<char*>(tokens), 8));
    out += input.SerializeAsString();
    for (const auto& k : keys) {
      tinker_public::Datum one;
      auto& t = (*one.mutable_loss_fn_inputs())[k];
      t.set_dtype(k == "target_tokens" ? tinker_public::DTYPE_INT64 : tinker_public::DTYPE_FLOAT32);
      t.add_shape(2);
      t.set_dense(std::string(k == "target_tokens" ? 16 : 8, '\0'));
      out += one.SerializeAsString();
    }
    return out;
  };
  auto request = [&](std::vector<std::string> keys) {
    tinker_public::ForwardBackwardRequest head;
    head.set_model_id("m");
    head.set_seq_id(3);
    head.set_loss_fn("importance_sampling");
    auto datum = datum_bytes(std::move(keys));
    std::string out = head.SerializeAsString();
    out.push_back(static_cast<char>((3 << 3) | 2));  // field 3 (data), length-delimited
    size_t n = datum.size();
    do {
      out.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
      n >>= 7;
    } while (n);
    return out + datum;
  };
  auto one = request({"advantages", "logprobs", "target_tokens"}), other = request({"target_tokens", "logprobs", "advantages"});
  ASSERT_NE(one, other);
  std::string a, b;
  auto r = parse_forward_backward_proto(one, &a);
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->data[0].inputs.size(), 3u);
  ASSERT_TRUE(parse_forward_backward_proto(other, &b));
  EXPECT_EQ(a, b);
}

TEST(TinkerCodec, ReadsJsonOfSdk016And018) {
  // 0.16: no type fields, loss_fn_config null, a tensor without its shape.
  auto old = json::parse(R"({"forward_backward_input": {"data": [{"loss_fn_inputs": {
      "target_tokens": {"data": [2, 3], "dtype": "int64"},
      "weights": {"data": [0.0, 1.0], "dtype": "float32", "shape": [2]}},
      "model_input": {"chunks": [{"tokens": [1]}, {"tokens": [2]}]}}],
      "loss_fn": "cross_entropy", "loss_fn_config": null}, "model_id": "M", "seq_id": 4})");
  auto r = parse_forward_backward_json(old, false);
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->data[0].tokens, (std::vector<int64_t>{1, 2})) << "chunks are concatenated";
  EXPECT_EQ(r->data[0].inputs.at("target_tokens").shape, (std::vector<int64_t>{2}));
  EXPECT_TRUE(r->loss_fn_config.empty());
  // 0.18+: type fields, a sparse CSR weights tensor (one value at [1, 0] of [2, 2]).
  auto sparse = json::parse(R"({"forward_input": {"data": [{"loss_fn_inputs": {
      "weights": {"data": [0.5], "dtype": "float32", "shape": [2, 2], "sparse_crow_indices": [0, 0, 1],
                  "sparse_col_indices": [0]}},
      "model_input": {"chunks": [{"tokens": [1, 2], "type": "encoded_text"}]}}],
      "loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": 0.9}}, "model_id": "M", "seq_id": 5})");
  r = parse_forward_backward_json(sparse, true);
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_TRUE(r->forward_only);
  EXPECT_EQ(r->data[0].inputs.at("weights").values, (std::vector<double>{0, 0, 0.5, 0}));
  EXPECT_EQ(r->loss_fn_config.at("clip_low_threshold"), 0.9);
}

TEST(TinkerCodec, BadBodiesAreRefusedNamingTheField) {
  auto refuse = [](const std::string& text, const std::string& needle) {
    auto r = parse_forward_backward_json(json::parse(text), false);
    ASSERT_FALSE(r) << text;
    EXPECT_NE(describe(r.error()).find(needle), std::string::npos) << describe(r.error());
  };
  const std::string head = R"({"model_id": "M", "seq_id": 1, "forward_backward_input": {"loss_fn": "cross_entropy", "data": [)";
  refuse(head + R"({"model_input": {"chunks": [{"tokens": [1.5]}]}}]}})", "data[0].model_input.chunks[0].tokens[0]");
  refuse(head + R"({"model_input": {"chunks": [{"type": "image", "data": "x"}]}}]}})", "reads text only");
  refuse(head + R"({"model_input": {"chunks": [{"tokens": [1]}]}, "loss_fn_inputs": {"w": {"data": [1], "dtype": "float16"}}}]}})",
         "loss_fn_inputs.w.dtype");
  refuse(head + R"({"model_input": {"chunks": [{"tokens": [1]}]}, "loss_fn_inputs": {"w": {"data": [1, 2], "dtype": "float32", "shape": [3]}}}]}})",
         "has 2 values for its shape of 3");
  refuse(head + R"({"model_input": {"chunks": [{"tokens": [1]}]}, "loss_fn_inputs": {"w": {"data": [1], "dtype": "float32", "extra": 1}}}]}})",
         "unknown field 'extra'");
  refuse(R"({"model_id": "M", "forward_backward_input": {"loss_fn": "x", "data": []}})", "seq_id is required");
  EXPECT_FALSE(parse_forward_backward_proto("not a protobuf message at all \xff\xff"));
}

// An asample body: every field read with its type checked, none read and
// then dropped (a num_samples or prompt_logprobs of the wrong type was taken
// as its default before it had a home here), max_tokens defaulted within
// the context and the server's tokens per call.
TEST(TinkerCodec, SampleBodiesAreReadWithEveryFieldChecked) {
  const SampleBounds bounds{.max_context = 64, .tokens_per_call = 40};
  auto read = [&](const std::string& text) { return parse_sample_json(json::parse(text), bounds); };
  const std::string prompt = R"("prompt": {"chunks": [{"tokens": [1, 2, 3, 4]}]})";
  auto r = read("{" + prompt + R"(, "num_samples": 3, "prompt_logprobs": true, "topk_prompt_logprobs": 2,
               "sampling_params": {"max_tokens": 5, "temperature": 0.5, "top_k": -1, "top_p": 0.9, "seed": 7,
                                   "stop": ["END"]}})");
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->prompt, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(r->params.num_samples, 3);
  EXPECT_EQ(r->params.max_tokens, 5);
  EXPECT_EQ(r->params.temperature, 0.5);
  EXPECT_EQ(r->params.top_k, 0) << "the SDK's -1 is no limit";
  EXPECT_EQ(r->params.top_p, 0.9);
  EXPECT_EQ(r->params.seed, 7);
  EXPECT_EQ(r->params.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r->prompt_logprobs);
  EXPECT_EQ(r->topk_prompt_logprobs, 2);
  EXPECT_EQ(r->params.prompt_logprobs, 2);
  EXPECT_EQ(r->params.logprobs, 0);
  auto d = read("{" + prompt + R"(, "num_samples": 4})");
  ASSERT_TRUE(d) << describe(d.error());
  EXPECT_EQ(d->params.max_tokens, (40 - 4) / 4) << "within tokens_per_call for 4 samples";
  EXPECT_EQ(d->params.prompt_logprobs, -1);
  auto refuse = [&](const std::string& text, const std::string& needle) {
    auto bad = read(text);
    ASSERT_FALSE(bad) << text;
    EXPECT_NE(describe(bad.error()).find(needle), std::string::npos) << describe(bad.error());
  };
  refuse("{" + prompt + R"(, "num_samples": "3"})", "num_samples must be an integer");
  refuse("{" + prompt + R"(, "prompt_logprobs": "yes"})", "prompt_logprobs must be true or false");
  refuse("{" + prompt + R"(, "topk_prompt_logprobs": -1})", "topk_prompt_logprobs must be >= 0");
  refuse("{" + prompt + R"(, "sampling_params": {"max_tokens": 2.5}})", "sampling_params.max_tokens");
  refuse("{" + prompt + R"(, "sampling_params": {"beam_width": 2}})", "sampling_params.beam_width is not a sampling parameter");
  refuse("{" + prompt + R"(, "sampling_params": {"stop": ["a", 3]}})", "mixes strings and token ids");
  refuse("{" + prompt + R"(, "sampling_params": {"seed": -2}})", "seed must be an integer >= 0");
  refuse("{" + prompt + R"(, "sampling_params": {"temperature": -1}})", "sampling_params");
  refuse(R"({"prompt": {"chunks": []}})", "prompt is empty");
  refuse(R"({"prompt": {"chunks": [{"tokens": [)" + [] {
    std::string t = "1";
    for (int i = 0; i < 63; ++i) t += ", 1";
    return t;
  }() + "]}]}}", "nothing is left to generate");
}

// The gateway's JSON bodies: bounded, parsed, an object or refused.
TEST(TinkerCodec, JsonBodiesAreObjectsOrRefused) {
  auto empty = decode_json_body("", 64, 100);
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->is_object() && empty->empty());
  EXPECT_FALSE(decode_json_body("[1, 2]", 64, 100));
  EXPECT_FALSE(decode_json_body("{\"a\": ", 64, 100));
  EXPECT_FALSE(decode_json_body("{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}", 64, 100));
  auto ok = decode_json_body(R"({"a": [1, 2]})", 64, 100);
  ASSERT_TRUE(ok);
  EXPECT_EQ((*ok)["a"][1], 2);
}

TEST(TinkerCodec, JsonIsBoundedInDepthAndValuesBeforeItIsParsed) {
  EXPECT_TRUE(check_json_bounds(R"({"a": [[1, 2], {"b": "[[[[[[[[[[,,,,,,"}]})", 4, 10))
      << "brackets and commas inside strings do not count";
  EXPECT_TRUE(check_json_bounds(R"({"s": "\"[[[[[\\"})", 1, 10)) << "escaped quotes stay inside the string";
  std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto d = check_json_bounds(deep, 64, 1 << 20);
  ASSERT_FALSE(d);
  EXPECT_EQ(code_of(d.error()), errc::invalid_argument);
  EXPECT_NE(describe(d.error()).find("deeper than 64"), std::string::npos) << describe(d.error());
  EXPECT_TRUE(check_json_bounds("[" + std::string(64 - 1, '[') + std::string(64, ']'), 64, 10)) << "64 levels pass";
  std::string wide = "[1" + std::string(20, ',') + "]";
  auto w = check_json_bounds(wide, 64, 10);
  ASSERT_FALSE(w);
  EXPECT_EQ(code_of(w.error()), errc::resource_exhausted);
}

TEST(TinkerCodec, ARequestsElementsAreBoundedBeforeTheyAreMade) {
  // One [1, 2^26] sparse tensor of one value: 2^26 elements once dense,
  // refused before they are made.
  auto sparse = json::parse(R"({"forward_backward_input": {"data": [{"loss_fn_inputs": {
      "weights": {"data": [0.5], "dtype": "float32", "shape": [1, 67108864], "sparse_crow_indices": [0, 1],
                  "sparse_col_indices": [0]}},
      "model_input": {"chunks": [{"tokens": [1, 2]}]}}], "loss_fn": "cross_entropy"}, "model_id": "M", "seq_id": 1})");
  auto r = parse_forward_backward_json(sparse, false, 1 << 20);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::resource_exhausted);
  EXPECT_NE(describe(r.error()).find("data[0].loss_fn_inputs.weights"), std::string::npos) << describe(r.error());
  // Tokens and dense tensors count alike, across datums.
  auto two = json::parse(R"({"forward_backward_input": {"data": [
      {"model_input": {"chunks": [{"tokens": [1, 2, 3]}]}, "loss_fn_inputs": {"w": {"data": [1, 1, 1], "dtype": "float32"}}},
      {"model_input": {"chunks": [{"tokens": [1, 2, 3]}]}}], "loss_fn": "cross_entropy"}, "model_id": "M", "seq_id": 1})");
  EXPECT_TRUE(parse_forward_backward_json(two, false, 9));
  auto over = parse_forward_backward_json(two, false, 8);
  ASSERT_FALSE(over);
  EXPECT_NE(describe(over.error()).find("data[1].model_input"), std::string::npos) << describe(over.error());
  EXPECT_FALSE(parse_model_input_json(json::parse(R"({"chunks": [{"tokens": [1, 2, 3]}]})"), "prompt", 2));
  // The protobuf form: the SDK's request fits its own element count, not less.
  const std::string body = from_hex(kSdkRequest);
  auto whole = parse_forward_backward_proto(body);
  ASSERT_TRUE(whole);
  size_t n = 0;
  for (const auto& d : whole->data) {
    n += d.tokens.size();
    for (const auto& [_, t] : d.inputs) n += t.values.size();
  }
  EXPECT_TRUE(parse_forward_backward_proto(body, nullptr, n));
  EXPECT_FALSE(parse_forward_backward_proto(body, nullptr, n - 1));
}

TEST(TinkerCodec, ZstdBodiesAreReadAndBoundedInSize) {
  std::string plain = from_hex(kSdkRequest);
  std::string frame(ZSTD_compressBound(plain.size()), '\0');
  frame.resize(ZSTD_compress(frame.data(), frame.size(), plain.data(), plain.size(), 3));
  auto back = zstd_decompress(frame, 1 << 20);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, plain);
  auto small = zstd_decompress(frame, 10);
  ASSERT_FALSE(small);
  EXPECT_EQ(code_of(small.error()), errc::resource_exhausted);
  EXPECT_FALSE(zstd_decompress("definitely not zstd", 1 << 20));
  EXPECT_FALSE(zstd_decompress(frame.substr(0, frame.size() - 3), 1 << 20)) << "a cut frame";
}

TEST(TinkerCodec, ResultsAreWrittenAsTheSdkReadsThem) {
  ForwardBackwardResult fb;
  fb.outputs = {{{-0.5f, -1.0f, -2.0f}, {3}}, {{-0.25f, -0.125f}, {2}}};
  fb.metrics["loss:sum"] = 1.5;
  tinker_public::ForwardBackwardOutput p;
  ASSERT_TRUE(p.ParseFromString(render_forward_backward_proto(fb)));
  ASSERT_EQ(p.loss_fn_outputs_size(), 1);
  const auto& rec = p.loss_fn_outputs(0);
  EXPECT_EQ(rec.num_datums(), 2);
  const auto& lp = rec.fields().at("logprobs");
  EXPECT_EQ(lp.dtype(), tinker_public::DTYPE_FLOAT32);
  std::vector<int64_t> offsets(lp.offsets().size() / 8);
  std::memcpy(offsets.data(), lp.offsets().data(), lp.offsets().size());
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 12, 20})) << "byte offsets, one per datum plus one";
  EXPECT_EQ(p.metrics().at("loss:sum"), 1.5);
  auto j = json::parse(render_forward_backward_json(fb));
  EXPECT_EQ(j["loss_fn_outputs"][1]["logprobs"]["shape"], json::array({2}));
  EXPECT_EQ(j["loss_fn_outputs"][1]["logprobs"].size(), 3u) << "data, dtype, shape only (the SDK forbids more)";

  SampleResult s;
  s.sequences = {{true, {10, 11}, {-0.5f, -1.5f}}, {false, {12}, {-0.25f}}};
  s.prompt_logprobs = std::vector<float>{std::numeric_limits<float>::quiet_NaN(), -1.0f};
  s.topk_prompt_logprobs = SampleResult::Topk{1, {0, 7}, {-99999.0f, -0.75f}};
  tinker_public::SampleResponse q;
  ASSERT_TRUE(q.ParseFromString(render_sample_proto(s)));
  EXPECT_EQ(q.sequences(0).stop_reason(), tinker_public::STOP_REASON_LENGTH);
  EXPECT_EQ(q.sequences(1).stop_reason(), tinker_public::STOP_REASON_STOP);
  EXPECT_EQ(q.topk_prompt_logprobs().prompt_length(), 2u);
  auto sj = json::parse(render_sample_json(s));
  EXPECT_EQ(sj["sequences"][0]["stop_reason"], "length");
  EXPECT_TRUE(sj["prompt_logprobs"][0].is_null()) << "NaN is written as null";
  EXPECT_TRUE(sj["topk_prompt_logprobs"][0].is_null()) << "an empty row is null";
  EXPECT_EQ(sj["topk_prompt_logprobs"][1][0][0], 7);
}

}  // namespace
}  // namespace glint::rpc::tinker
