#include "rpc/tinker/codec.hpp"

#include "tinker_public.pb.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <nlohmann/json.hpp>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

namespace glint::rpc::tinker {

namespace {

using nlohmann::json;

caf::error bad(const std::string& what) { return make_error(errc::invalid_argument, what); }

// At most this many elements in one tensor or one model input: far above
// any context, far below what would exhaust memory before the gateway's
// own limits (tokens per call) refuse the call.
constexpr size_t max_elements = size_t{1} << 26;

/// The elements one request may still make (tokens, and every tensor's
/// elements as they will be held), taken before each is made: a small body
/// cannot name a shape that expands to gigabytes.
struct Budget {
  size_t total, left;
  explicit Budget(size_t n) : total(n), left(n) {}
  Result<void> take(size_t n, const std::string& field) {
    if (n > left)
      return make_error(errc::resource_exhausted, field + " takes the request past the " + std::to_string(total) +
                                                      " elements (tokens and tensor entries) one call may hold");
    left -= n;
    return {};
  }
};

Result<int64_t> integer(const json& v, const std::string& field) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  return bad(field + " must be an integer, not " + v.dump().substr(0, 40));
}

Result<std::vector<int64_t>> int_list(const json& v, const std::string& field) {
  if (!v.is_array()) return bad(field + " must be a list of integers");
  if (v.size() > max_elements) return bad(field + " has " + std::to_string(v.size()) + " entries, too many");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    auto x = integer(v[i], field + "[" + std::to_string(i) + "]");
    if (!x) return x.error();
    out.push_back(*x);
  }
  return out;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Result<void> check_shape(const std::vector<int64_t>& shape, const std::string& field) {
  if (shape.empty() || shape.size() > 2) return bad(field + ".shape must have 1 or 2 dimensions");
  for (auto d : shape)
    if (d < 0 || static_cast<size_t>(d) > max_elements) return bad(field + ".shape holds an invalid size");
  if (static_cast<size_t>(product(shape)) > max_elements) return bad(field + " is too large");
  return {};
}

// Rows of a sparse CSR tensor made dense: `values` holds the nonzeros.
Result<std::vector<double>> densify(const std::vector<double>& values, const std::vector<int64_t>& crow,
                                    const std::vector<int64_t>& col, const std::vector<int64_t>& shape,
                                    const std::string& field) {
  if (shape.size() != 2) return bad(field + ": a sparse tensor needs a 2-dimensional shape");
  const int64_t rows = shape[0], cols = shape[1];
  if (static_cast<int64_t>(crow.size()) != rows + 1 || col.size() != values.size() || crow.front() != 0 ||
      crow.back() != static_cast<int64_t>(values.size()))
    return bad(field + ": sparse_crow_indices, sparse_col_indices and the values do not agree");
  std::vector<double> dense(static_cast<size_t>(rows * cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (crow[static_cast<size_t>(r + 1)] < crow[static_cast<size_t>(r)])
      return bad(field + ": sparse_crow_indices must not decrease");
    for (int64_t k = crow[static_cast<size_t>(r)]; k < crow[static_cast<size_t>(r + 1)]; ++k) {
      auto c = col[static_cast<size_t>(k)];
      if (c < 0 || c >= cols) return bad(field + ": a sparse column index is outside the shape");
      dense[static_cast<size_t>(r * cols + c)] = values[static_cast<size_t>(k)];
    }
  }
  return dense;
}

Result<TensorData::Dtype> dtype_of(std::string_view name, const std::string& field) {
  if (name == "float32") return TensorData::Dtype::f32;
  if (name == "int64") return TensorData::Dtype::i64;
  return bad(field + ".dtype must be \"float32\" or \"int64\", not \"" + std::string{name.substr(0, 32)} + "\"");
}

Result<TensorData> tensor_json(const json& v, const std::string& field, Budget& budget) {
  if (!v.is_object()) return bad(field + " must be a TensorData object");
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "data" && it.key() != "dtype" && it.key() != "shape" && it.key() != "sparse_crow_indices" &&
        it.key() != "sparse_col_indices")
      return bad(field + " has an unknown field '" + it.key().substr(0, 40) + "'");
  TensorData t;
  if (!v.contains("dtype") || !v["dtype"].is_string()) return bad(field + ".dtype is required");
  auto d = dtype_of(v["dtype"].get<std::string>(), field);
  if (!d) return d.error();
  t.dtype = *d;
  if (!v.contains("data") || !v["data"].is_array()) return bad(field + ".data must be a list of numbers");
  const auto& data = v["data"];
  if (data.size() > max_elements) return bad(field + ".data is too large");
  if (auto ok = budget.take(data.size(), field); !ok) return ok.error();
  std::vector<double> values;
  values.reserve(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const auto& x = data[i];
    if (t.dtype == TensorData::Dtype::i64) {
      auto n = integer(x, field + ".data[" + std::to_string(i) + "]");
      if (!n) return n.error();
      values.push_back(static_cast<double>(*n));
    } else {
      if (!x.is_number()) return bad(field + ".data[" + std::to_string(i) + "] must be a number");
      values.push_back(x.get<double>());
    }
  }
  const bool sparse = v.contains("sparse_crow_indices") && !v["sparse_crow_indices"].is_null();
  if (v.contains("shape") && !v["shape"].is_null()) {
    auto s = int_list(v["shape"], field + ".shape");
    if (!s) return s.error();
    t.shape = std::move(*s);
  } else {
    if (sparse) return bad(field + ": a sparse tensor needs its shape");
    t.shape = {static_cast<int64_t>(values.size())};
  }
  if (auto ok = check_shape(t.shape, field); !ok) return ok.error();
  if (sparse) {
    if (auto ok = budget.take(static_cast<size_t>(product(t.shape)), field); !ok) return ok.error();
    auto crow = int_list(v["sparse_crow_indices"], field + ".sparse_crow_indices");
    if (!crow) return crow.error();
    if (!v.contains("sparse_col_indices")) return bad(field + ".sparse_col_indices is required with the crow indices");
    auto col = int_list(v["sparse_col_indices"], field + ".sparse_col_indices");
    if (!col) return col.error();
    auto dense = densify(values, *crow, *col, t.shape, field);
    if (!dense) return dense.error();
    values = std::move(*dense);
  }
  if (static_cast<int64_t>(values.size()) != product(t.shape))
    return bad(field + " has " + std::to_string(values.size()) + " values for its shape of " +
               std::to_string(product(t.shape)));
  t.values = std::move(values);
  return t;
}

Result<std::map<std::string, double>> config_json(const json& v) {
  std::map<std::string, double> out;
  if (v.is_null()) return out;
  if (!v.is_object()) return bad("loss_fn_config must be an object of numbers");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number()) return bad("loss_fn_config." + it.key().substr(0, 40) + " must be a number");
    out[it.key()] = it.value().get<double>();
  }
  return out;
}

// -- protobuf ------------------------------------------------------------------

template <class T>
std::vector<T> unpack(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

template <class T>
std::string pack(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

Result<std::vector<double>> proto_values(const std::string& bytes, tinker_public::DType dtype, const std::string& field) {
  size_t size = dtype == tinker_public::DTYPE_INT64 ? 8 : dtype == tinker_public::DTYPE_FLOAT32 ? 4 : 0;
  if (size == 0) return bad(field + ".dtype must be FLOAT32 or INT64");
  if (bytes.size() % size != 0) return bad(field + " holds a partial element");
  std::vector<double> out;
  if (dtype == tinker_public::DTYPE_INT64)
    for (auto x : unpack<int64_t>(bytes)) out.push_back(static_cast<double>(x));
  else
    for (auto x : unpack<float>(bytes)) out.push_back(x);
  return out;
}

Result<TensorData> tensor_proto(const tinker_public::Tensor& p, const std::string& field, Budget& budget) {
  TensorData t;
  if (p.dtype() == tinker_public::DTYPE_INT64) t.dtype = TensorData::Dtype::i64;
  else if (p.dtype() == tinker_public::DTYPE_FLOAT32) t.dtype = TensorData::Dtype::f32;
  else return bad(field + ".dtype must be FLOAT32 or INT64");
  t.shape.assign(p.shape().begin(), p.shape().end());
  const size_t esize = t.dtype == TensorData::Dtype::i64 ? 8 : 4;
  std::vector<double> values;
  if (p.has_sparse_csr()) {
    if (t.shape.size() != 2) return bad(field + ": a sparse tensor needs a 2-dimensional shape");
    if (auto ok = check_shape(t.shape, field); !ok) return ok.error();
    if (auto ok = budget.take(static_cast<size_t>(product(t.shape)) + p.sparse_csr().values().size() / esize, field); !ok)
      return ok.error();
    auto nz = proto_values(p.sparse_csr().values(), p.dtype(), field);
    if (!nz) return nz.error();
    if (p.sparse_csr().crow_indices().size() % 8 || p.sparse_csr().col_indices().size() % 8)
      return bad(field + ": sparse indices must be int64");
    auto dense = densify(*nz, unpack<int64_t>(p.sparse_csr().crow_indices()), unpack<int64_t>(p.sparse_csr().col_indices()),
                         t.shape, field);
    if (!dense) return dense.error();
    values = std::move(*dense);
  } else {
    if (auto ok = budget.take(p.dense().size() / esize, field); !ok) return ok.error();
    auto v = proto_values(p.dense(), p.dtype(), field);
    if (!v) return v.error();
    values = std::move(*v);
    if (t.shape.empty()) t.shape = {static_cast<int64_t>(values.size())};
    if (auto ok = check_shape(t.shape, field); !ok) return ok.error();
  }
  if (static_cast<int64_t>(values.size()) != product(t.shape))
    return bad(field + " has " + std::to_string(values.size()) + " values for its shape of " +
               std::to_string(product(t.shape)));
  t.values = std::move(values);
  return t;
}

json tensor_to_json(const DatumOutput& d) {
  json data = json::array();
  for (float x : d.logprobs) data.push_back(x);
  return json{{"data", std::move(data)}, {"dtype", "float32"}, {"shape", d.shape}};
}

// A float for JSON: NaN has no JSON form, so it is null (what the SDK reads
// as "none" in prompt_logprobs).
json number_or_null(float x) { return std::isnan(x) ? json(nullptr) : json(x); }

}  // namespace

namespace {
Result<std::vector<int64_t>> model_input_json(const json& input, const std::string& field, Budget& budget) {
  if (!input.is_object() || !input.contains("chunks") || !input["chunks"].is_array())
    return bad(field + " must be {\"chunks\": [...]}");
  std::vector<int64_t> tokens;
  const auto& chunks = input["chunks"];
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    const auto name = field + ".chunks[" + std::to_string(i) + "]";
    if (!c.is_object()) return bad(name + " must be an object");
    if (c.contains("type") && !c["type"].is_null() && c["type"] != "encoded_text")
      return bad(name + " is a '" + c["type"].dump().substr(0, 40) +
                 "' chunk; this server's model reads text only (encoded_text chunks)");
    if (!c.contains("tokens")) return bad(name + ".tokens is required");
    if (c["tokens"].is_array())
      if (auto ok = budget.take(c["tokens"].size(), name + ".tokens"); !ok) return ok.error();
    auto t = int_list(c["tokens"], name + ".tokens");
    if (!t) return t.error();
    if (tokens.size() + t->size() > max_elements) return bad(field + " is too long");
    tokens.insert(tokens.end(), t->begin(), t->end());
  }
  return tokens;
}
}  // namespace

Result<std::vector<int64_t>> parse_model_input_json(const json& input, const std::string& field, size_t max_elements) {
  Budget budget{max_elements};
  return model_input_json(input, field, budget);
}

Result<SampleBody> parse_sample_json(const json& j, const SampleBounds& bounds, size_t max_elements) {
  if (!j.is_object()) return bad("the body must be a JSON object");
  auto field = [&](const json& o, const char* key) -> const json& {
    static const json none;
    auto it = o.find(key);
    return it == o.end() ? none : *it;
  };
  SampleBody out;
  auto prompt = parse_model_input_json(field(j, "prompt"), "prompt", max_elements);
  if (!prompt) return prompt.error();
  if (prompt->empty()) return bad("prompt is empty");
  out.prompt = std::move(*prompt);
  const auto& sp = field(j, "sampling_params");
  if (!sp.is_null() && !sp.is_object()) return bad("sampling_params must be an object");
  static const std::set<std::string> known = {"max_tokens", "seed", "stop", "temperature", "top_k", "top_p"};
  for (auto f = sp.begin(); sp.is_object() && f != sp.end(); ++f)
    if (!known.count(f.key())) return bad("sampling_params." + f.key().substr(0, 40) + " is not a sampling parameter");
  auto& params = out.params;
  if (const auto& v = field(j, "num_samples"); !v.is_null()) {
    auto n = integer(v, "num_samples");
    if (!n) return n.error();
    params.num_samples = *n;
  }
  params.logprobs = 0;  // the chosen tokens' log-probs: the RL loop needs them
  const auto prompt_len = static_cast<int64_t>(out.prompt.size());
  const auto room = bounds.max_context - prompt_len;
  if (room < 1)
    return bad("the prompt has " + std::to_string(prompt_len) + " tokens, the model's context " +
               std::to_string(bounds.max_context) + ": nothing is left to generate");
  // None given (SDK 0.16 may leave it out): up to the context, within the
  // server's tokens_per_call for the call's samples.
  params.max_tokens = std::max<int64_t>(
      1, std::min(room, (bounds.tokens_per_call - prompt_len) / std::max<int64_t>(params.num_samples, 1)));
  const json& none = field(j, "no such key");
  const json& params_in = sp.is_object() ? sp : none;
  if (const auto& v = field(params_in, "max_tokens"); !v.is_null()) {
    auto n = integer(v, "sampling_params.max_tokens");
    if (!n) return n.error();
    params.max_tokens = *n;
  }
  if (const auto& v = field(params_in, "temperature"); !v.is_null()) {
    if (!v.is_number()) return bad("sampling_params.temperature must be a number");
    params.temperature = v.get<double>();
  }
  if (const auto& v = field(params_in, "top_p"); !v.is_null()) {
    if (!v.is_number()) return bad("sampling_params.top_p must be a number");
    params.top_p = v.get<double>();
  }
  if (const auto& v = field(params_in, "top_k"); !v.is_null()) {
    auto k = integer(v, "sampling_params.top_k");
    if (!k) return k.error();
    params.top_k = *k < 0 ? 0 : *k;  // the SDK's -1: no limit
  }
  if (const auto& v = field(params_in, "seed"); !v.is_null()) {
    auto seed = integer(v, "sampling_params.seed");
    if (!seed || *seed < 0) return bad("sampling_params.seed must be an integer >= 0");
    params.seed = *seed;
  }
  if (const auto& v = field(params_in, "stop"); !v.is_null()) {
    if (v.is_string()) {
      params.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const auto& s : v) {
        if (s.is_string()) params.stop.push_back(s.get<std::string>());
        else if (s.is_number_integer()) params.stop_token_ids.push_back(s.get<int64_t>());
        else return bad("sampling_params.stop must be a string, strings or token ids");
      }
      if (!params.stop.empty() && !params.stop_token_ids.empty())
        return bad("sampling_params.stop mixes strings and token ids");
    } else {
      return bad("sampling_params.stop must be a string, strings or token ids");
    }
  }
  bool want_prompt = false;
  if (const auto& v = field(j, "prompt_logprobs"); !v.is_null()) {
    if (!v.is_boolean()) return bad("prompt_logprobs must be true or false");
    want_prompt = v.get<bool>();
  }
  int64_t topk = 0;
  if (const auto& v = field(j, "topk_prompt_logprobs"); !v.is_null()) {
    auto k = integer(v, "topk_prompt_logprobs");
    if (!k) return k.error();
    if (*k < 0) return bad("topk_prompt_logprobs must be >= 0");
    topk = *k;
  }
  params.prompt_logprobs = topk > 0 ? topk : want_prompt ? 0 : -1;
  out.prompt_logprobs = want_prompt;
  out.topk_prompt_logprobs = topk;
  if (auto ok = params.validate(); !ok) return with_context(ok.error(), "sampling_params");
  return out;
}

Result<json> decode_json_body(std::string_view body, size_t max_depth, size_t max_values) {
  // Bounded before it is parsed: no request nests deeper than a few levels
  // (nlohmann's dump and destructor recurse, so 100,000 levels would take
  // the stack), nor holds more values than its tokens allow.
  if (auto ok = check_json_bounds(body, max_depth, max_values); !ok) return ok.error();
  if (body.empty()) return json::object();
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("the body is not a JSON object");
  return j;
}

Result<ForwardBackwardRequest> parse_forward_backward_json(const json& body, bool forward, size_t max_elements) {
  Budget budget{max_elements};
  const char* key = forward ? "forward_input" : "forward_backward_input";
  if (!body.is_object()) return bad("the body must be a JSON object");
  ForwardBackwardRequest r;
  r.forward_only = forward;
  if (!body.contains("model_id") || !body["model_id"].is_string()) return bad("model_id is required");
  r.model_id = body["model_id"].get<std::string>();
  if (!body.contains("seq_id") || body["seq_id"].is_null()) return bad("seq_id is required");
  auto seq = integer(body["seq_id"], "seq_id");
  if (!seq) return seq.error();
  r.seq_id = *seq;
  if (!body.contains(key) || !body[key].is_object()) return bad(std::string{key} + " is required");
  const auto& in = body[key];
  if (!in.contains("loss_fn") || !in["loss_fn"].is_string()) return bad(std::string{key} + ".loss_fn is required");
  r.loss_fn = in["loss_fn"].get<std::string>();
  if (in.contains("loss_fn_config")) {
    auto c = config_json(in["loss_fn_config"]);
    if (!c) return c.error();
    r.loss_fn_config = std::move(*c);
  }
  if (!in.contains("data") || !in["data"].is_array()) return bad(std::string{key} + ".data must be a list of datums");
  for (size_t i = 0; i < in["data"].size(); ++i) {
    const auto& d = in["data"][i];
    const auto name = "data[" + std::to_string(i) + "]";
    if (!d.is_object()) return bad(name + " must be a Datum object");
    Datum datum;
    if (!d.contains("model_input")) return bad(name + ".model_input is required");
    auto tokens = model_input_json(d["model_input"], name + ".model_input", budget);
    if (!tokens) return tokens.error();
    datum.tokens = std::move(*tokens);
    if (d.contains("loss_fn_inputs") && !d["loss_fn_inputs"].is_null()) {
      if (!d["loss_fn_inputs"].is_object()) return bad(name + ".loss_fn_inputs must be an object");
      for (auto it = d["loss_fn_inputs"].begin(); it != d["loss_fn_inputs"].end(); ++it) {
        auto t = tensor_json(it.value(), name + ".loss_fn_inputs." + it.key().substr(0, 40), budget);
        if (!t) return t.error();
        datum.inputs[it.key()] = std::move(*t);
      }
    }
    r.data.push_back(std::move(datum));
  }
  return r;
}

Result<void> check_json_bounds(std::string_view text, size_t max_depth, size_t max_values) {
  size_t depth = 0, values = 1;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    switch (ch) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > max_depth)
          return bad("the body nests deeper than " + std::to_string(max_depth) + " levels, more than any request needs");
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      case ',':
        if (++values > max_values)
          return make_error(errc::resource_exhausted, "the body holds more than " + std::to_string(max_values) +
                                                          " values, more than one call may (tokens_per_call bounds it)");
        break;
      default: break;
    }
  }
  return {};
}

Result<std::pair<std::string, int64_t>> forward_backward_ids_proto(std::string_view body) {
  tinker_public::ForwardBackwardRequest p;
  if (body.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !p.ParseFromArray(body.data(), static_cast<int>(body.size())))
    return bad("the body is not a ForwardBackwardRequest protobuf message");
  return std::pair{p.model_id(), static_cast<int64_t>(p.seq_id())};
}

Result<ForwardBackwardRequest> parse_forward_backward_proto(std::string_view body, std::string* canonical,
                                                            size_t max_elements) {
  Budget budget{max_elements};
  tinker_public::ForwardBackwardRequest p;
  if (body.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !p.ParseFromArray(body.data(), static_cast<int>(body.size())))
    return bad("the body is not a ForwardBackwardRequest protobuf message");
  if (canonical) {
    canonical->clear();
    google::protobuf::io::StringOutputStream raw(canonical);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    p.SerializeToCodedStream(&out);
  }
  ForwardBackwardRequest r;
  r.model_id = p.model_id();
  r.seq_id = p.seq_id();
  r.loss_fn = p.loss_fn();
  r.forward_only = p.forward_only();
  for (const auto& [k, v] : p.loss_fn_config()) r.loss_fn_config[k] = v;
  for (int i = 0; i < p.data_size(); ++i) {
    const auto& d = p.data(i);
    const auto name = "data[" + std::to_string(i) + "]";
    Datum datum;
    for (int c = 0; c < d.model_input_size(); ++c) {
      const auto& chunk = d.model_input(c);
      if (!chunk.has_encoded_text())
        return bad(name + ".model_input[" + std::to_string(c) +
                   "] is not an encoded_text chunk; this server's model reads text only");
      const auto& bytes = chunk.encoded_text().tokens();
      if (bytes.size() % 4) return bad(name + ".model_input[" + std::to_string(c) + "].tokens holds a partial int32");
      if (auto ok = budget.take(bytes.size() / 4, name + ".model_input"); !ok) return ok.error();
      for (auto t : unpack<int32_t>(bytes)) datum.tokens.push_back(t);
      if (datum.tokens.size() > max_elements) return bad(name + ".model_input is too long");
    }
    for (const auto& [k, v] : d.loss_fn_inputs()) {
      auto t = tensor_proto(v, name + ".loss_fn_inputs." + k.substr(0, 40), budget);
      if (!t) return t.error();
      datum.inputs[k] = std::move(*t);
    }
    r.data.push_back(std::move(datum));
  }
  return r;
}

std::string render_forward_backward_json(const ForwardBackwardResult& r) {
  json outputs = json::array();
  for (const auto& d : r.outputs) outputs.push_back(json{{"logprobs", tensor_to_json(d)}});
  json metrics = json::object();
  for (const auto& [k, v] : r.metrics) metrics[k] = v;
  return json{{"loss_fn_output_type", "ArrayRecord"}, {"loss_fn_outputs", std::move(outputs)}, {"metrics", metrics}}
      .dump();
}

std::string render_forward_backward_proto(const ForwardBackwardResult& r) {
  tinker_public::ForwardBackwardOutput p;
  p.set_loss_fn_output_type("ArrayRecord");
  for (const auto& [k, v] : r.metrics) (*p.mutable_metrics())[k] = v;
  if (!r.outputs.empty()) {
    auto* record = p.add_loss_fn_outputs();
    record->set_type_tag("ArrayRecord");
    record->set_num_datums(static_cast<int64_t>(r.outputs.size()));
    auto& field = (*record->mutable_fields())["logprobs"];
    field.set_dtype(tinker_public::DTYPE_FLOAT32);
    std::vector<float> data;
    std::vector<int64_t> offsets{0};
    for (const auto& d : r.outputs) {
      data.insert(data.end(), d.logprobs.begin(), d.logprobs.end());
      offsets.push_back(static_cast<int64_t>(data.size() * sizeof(float)));
    }
    // One trailing shape for the record: the datums' dimensions after the first.
    const auto& shape = r.outputs.front().shape;
    for (size_t i = 1; i < shape.size(); ++i) field.add_trailing_shape(shape[i]);
    field.set_data(pack(data));
    field.set_offsets(pack(offsets));
  }
  return p.SerializeAsString();
}

std::string render_sample_json(const SampleResult& r) {
  json seqs = json::array();
  for (const auto& s : r.sequences)
    seqs.push_back(json{{"stop_reason", s.length ? "length" : "stop"}, {"tokens", s.tokens}, {"logprobs", s.logprobs}});
  json out{{"type", "sample"}, {"sequences", std::move(seqs)}, {"prompt_cache_hit_tokens", r.prompt_cache_hit_tokens}};
  if (r.prompt_logprobs) {
    json lp = json::array();
    for (float x : *r.prompt_logprobs) lp.push_back(number_or_null(x));
    out["prompt_logprobs"] = std::move(lp);
  } else {
    out["prompt_logprobs"] = nullptr;
  }
  if (r.topk_prompt_logprobs) {
    const auto& t = *r.topk_prompt_logprobs;
    json rows = json::array();
    const size_t n = t.k == 0 ? 0 : t.ids.size() / t.k;
    for (size_t i = 0; i < n; ++i) {
      json row = json::array();
      for (size_t j = 0; j < t.k; ++j) {
        float lp = t.logprobs[i * t.k + j];
        if (lp <= -99999.0f) break;  // the empty cells end a row
        row.push_back(json::array({t.ids[i * t.k + j], lp}));
      }
      rows.push_back(row.empty() ? json(nullptr) : std::move(row));
    }
    out["topk_prompt_logprobs"] = std::move(rows);
  } else {
    out["topk_prompt_logprobs"] = nullptr;
  }
  return out.dump();
}

std::string render_sample_proto(const SampleResult& r) {
  tinker_public::SampleResponse p;
  for (const auto& s : r.sequences) {
    auto* q = p.add_sequences();
    q->set_stop_reason(s.length ? tinker_public::STOP_REASON_LENGTH : tinker_public::STOP_REASON_STOP);
    std::vector<int32_t> ids(s.tokens.begin(), s.tokens.end());
    q->set_tokens(pack(ids));
    q->set_logprobs(pack(s.logprobs));
  }
  if (r.prompt_logprobs) p.set_prompt_logprobs(pack(*r.prompt_logprobs));
  if (r.topk_prompt_logprobs) {
    const auto& t = *r.topk_prompt_logprobs;
    auto* q = p.mutable_topk_prompt_logprobs();
    q->set_k(t.k);
    q->set_prompt_length(t.k == 0 ? 0 : static_cast<uint32_t>(t.ids.size() / t.k));
    q->set_token_ids(pack(t.ids));
    q->set_logprobs(pack(t.logprobs));
  }
  p.set_prompt_cache_hit_tokens(static_cast<int32_t>(std::min<int64_t>(r.prompt_cache_hit_tokens, INT32_MAX)));
  return p.SerializeAsString();
}

Result<std::string> zstd_decompress(std::string_view frame, size_t max_bytes) {
  auto* ds = ZSTD_createDStream();
  if (!ds) return make_error(errc::internal, "zstd: cannot allocate a decoder");
  std::string out;
  ZSTD_inBuffer in{frame.data(), frame.size(), 0};
  std::vector<char> chunk(ZSTD_DStreamOutSize());
  size_t last = 0;
  for (;;) {
    ZSTD_outBuffer o{chunk.data(), chunk.size(), 0};
    last = ZSTD_decompressStream(ds, &o, &in);
    if (ZSTD_isError(last)) {
      std::string why = ZSTD_getErrorName(last);
      ZSTD_freeDStream(ds);
      return bad("the body is not valid zstd (Content-Encoding: zstd): " + why);
    }
    out.append(chunk.data(), o.pos);
    if (out.size() > max_bytes) {
      ZSTD_freeDStream(ds);
      return make_error(errc::resource_exhausted, "the decompressed body is larger than the " +
                                                      std::to_string(max_bytes) + " bytes a message may have");
    }
    // All input read and the output not full: nothing more will come out.
    if (in.pos == in.size && o.pos < o.size) break;
  }
  ZSTD_freeDStream(ds);
  if (last != 0) return bad("the zstd body ends inside a frame");
  return out;
}

}  // namespace glint::rpc::tinker
