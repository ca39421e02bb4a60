#include "rpc/convert.hpp"

#include <capnp/orphan.h>
#include <capnp/serialize.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace glint::rpc {

namespace fs = std::filesystem;

namespace {

std::string text(capnp::Text::Reader t) { return std::string{t.cStr(), t.size()}; }

std::vector<std::string> texts(capnp::List<capnp::Text>::Reader r) {
  std::vector<std::string> out;
  out.reserve(r.size());
  for (auto t : r) out.push_back(text(t));
  return out;
}

void write_texts(capnp::List<capnp::Text>::Builder b, const std::vector<std::string>& v) {
  for (size_t i = 0; i < v.size(); ++i) b.set(static_cast<unsigned>(i), as_text(v[i]));
}

template <class T>
std::vector<T> values(typename capnp::List<T>::Reader r) {
  std::vector<T> out;
  out.reserve(r.size());
  for (auto v : r) out.push_back(v);
  return out;
}

template <class T>
void write_values(typename capnp::List<T>::Builder b, const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i) b.set(static_cast<unsigned>(i), v[i]);
}

caf::error bad(const std::string& what) { return make_error(errc::invalid_argument, what); }

}  // namespace

// -- status -----------------------------------------------------------------

void write_status(wire::Status::Builder b, const caf::error& err) {
  b.setCode(static_cast<uint16_t>(code_of(err)));
  if (err) b.setMessage(as_text(context_of(err).empty() ? describe(err) : context_of(err)));
}

caf::error read_status(wire::Status::Reader r) {
  auto code = r.getCode();
  if (code == 0) return caf::none;
  if (code > static_cast<uint16_t>(errc::internal))
    return make_error(errc::internal, "the server answered an unknown status code " + std::to_string(code) + ": " +
                                          text(r.getMessage()));
  return make_error(static_cast<errc>(code), text(r.getMessage()));
}

// -- tensors and batches ----------------------------------------------------

void write_tensor(wire::Tensor::Builder b, const Tensor& t, KeepAlive* keep) {
  b.setDtype(static_cast<uint8_t>(t.dtype()));
  auto shape = b.initShape(static_cast<unsigned>(t.dims()));
  for (size_t i = 0; i < t.dims(); ++i) shape.set(static_cast<unsigned>(i), t.size(i));
  const size_t n = t.defined() ? t.nbytes() : 0;
  const auto* p = reinterpret_cast<const capnp::byte*>(t.data());
  // Cap'n Proto references whole words: the buffer must start on a word and
  // hold a whole number of them, else it would read past its end.
  if (keep && n > 0 && n % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 8 == 0) {
    auto orphan = capnp::Orphanage::getForMessageContaining(b).referenceExternalData(capnp::Data::Reader(p, n));
    b.adoptData(kj::mv(orphan));
    keep->push_back(t);
  } else {
    b.setData(capnp::Data::Reader(p, n));
  }
}

Result<Tensor> read_tensor(wire::Tensor::Reader r, const std::string& what) {
  auto shape = values<int64_t>(r.getShape());
  auto data = r.getData();
  auto ok = Tensor::check_header(r.getDtype(), shape, data.size());
  if (!ok) return with_context(ok.error(), what);
  auto t = Tensor::zeros(static_cast<Dtype>(r.getDtype()), std::move(shape));
  if (!t) return with_context(t.error(), what);
  if (data.size() > 0) std::memcpy(t->mutable_data(), data.begin(), data.size());
  return t;
}

void write_named(capnp::List<wire::NamedTensor>::Builder b, const NamedTensors& ts, KeepAlive* keep) {
  for (size_t i = 0; i < ts.size(); ++i) {
    auto e = b[static_cast<unsigned>(i)];
    e.setName(as_text(ts[i].first));
    write_tensor(e.initTensor(), ts[i].second, keep);
  }
}

Result<NamedTensors> read_named(capnp::List<wire::NamedTensor>::Reader r, const std::string& what) {
  NamedTensors out;
  out.reserve(r.size());
  for (auto e : r) {
    auto name = text(e.getName());
    if (name.empty() || name.size() > 512) return bad(what + ": a tensor name must be 1-512 bytes");
    auto t = read_tensor(e.getTensor(), what + " tensor '" + name + "'");
    if (!t) return t.error();
    out.emplace_back(std::move(name), std::move(*t));
  }
  return out;
}

void write_batch(wire::Batch::Builder b, const Batch& batch, KeepAlive* keep) {
  NamedTensors ts(batch.tensors.begin(), batch.tensors.end());
  write_named(b.initTensors(static_cast<unsigned>(ts.size())), ts, keep);
  auto fields = b.initFields(static_cast<unsigned>(batch.fields.size()));
  unsigned i = 0;
  for (const auto& [name, vals] : batch.fields) {
    fields[i].setName(as_text(name));
    write_texts(fields[i].initValues(static_cast<unsigned>(vals.size())), vals);
    ++i;
  }
}

Result<Batch> read_batch(wire::Batch::Reader r) {
  Batch out;
  auto ts = read_named(r.getTensors(), "batch");
  if (!ts) return ts.error();
  for (auto& [name, t] : *ts)
    if (!out.tensors.emplace(name, std::move(t)).second) return bad("batch: tensor '" + name + "' is given twice");
  for (auto f : r.getFields()) {
    auto name = text(f.getName());
    if (name.empty() || name.size() > 512) return bad("batch: a field name must be 1-512 bytes");
    if (!out.fields.emplace(name, texts(f.getValues())).second) return bad("batch: field '" + name + "' is given twice");
  }
  if (out.tensors.empty()) return bad("batch: no tensors (input_ids is required)");
  if (auto n = out.size(); !n) return with_context(n.error(), "batch");
  return out;
}

void write_metrics(capnp::List<wire::Metric>::Builder b, const Metrics& m) {
  unsigned i = 0;
  for (const auto& [name, v] : m) {
    b[i].setName(as_text(name));
    b[i].setValue(v);
    ++i;
  }
}

Result<Metrics> read_metrics(capnp::List<wire::Metric>::Reader r) {
  Metrics out;
  for (auto e : r) out[text(e.getName())] = e.getValue();
  return out;
}

// -- files ------------------------------------------------------------------

namespace {
constexpr size_t kMaxFiles = 16;
Result<std::string> checked_file_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos || name.find('\0') != std::string::npos)
    return bad("file name '" + name.substr(0, 128) + "' is not a plain name of 1-128 bytes");
  return name;
}
}  // namespace

Result<std::vector<FileBytes>> read_dir_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return make_error(errc::not_found, dir + " is not a directory");
  std::vector<FileBytes> out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in{e.path(), std::ios::binary};
    std::ostringstream ss;
    ss << in.rdbuf();
    if (!in) return make_error(errc::unavailable, "cannot read " + e.path().string());
    out.push_back({e.path().filename().string(), std::move(ss).str()});
  }
  if (ec) return make_error(errc::unavailable, "cannot list " + dir + ": " + ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  if (out.size() > kMaxFiles)
    return bad(dir + " holds " + std::to_string(out.size()) + " files; an adapter directory has at most " +
               std::to_string(kMaxFiles));
  return out;
}

void write_files(capnp::List<wire::File>::Builder b, const std::vector<FileBytes>& files) {
  for (size_t i = 0; i < files.size(); ++i) {
    b[static_cast<unsigned>(i)].setName(as_text(files[i].name));
    b[static_cast<unsigned>(i)].setData(
        capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(files[i].data.data()), files[i].data.size()));
  }
}

Result<std::vector<FileBytes>> read_files(capnp::List<wire::File>::Reader r) {
  if (r.size() > kMaxFiles)
    return bad(std::to_string(r.size()) + " files given; at most " + std::to_string(kMaxFiles));
  std::vector<FileBytes> out;
  for (auto f : r) {
    auto name = checked_file_name(text(f.getName()));
    if (!name) return name.error();
    for (const auto& o : out)
      if (o.name == *name) return bad("file '" + *name + "' is given twice");
    auto d = f.getData();
    out.push_back({*name, std::string(reinterpret_cast<const char*>(d.begin()), d.size())});
  }
  return out;
}

Result<void> write_dir_files(const std::string& dir, const std::vector<FileBytes>& files) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(errc::unavailable, "cannot create " + dir + ": " + ec.message());
  for (const auto& f : files) {
    auto name = checked_file_name(f.name);
    if (!name) return name.error();
    auto path = (fs::path{dir} / *name).string();
    std::ofstream out{path, std::ios::binary | std::ios::trunc};
    out.write(f.data.data(), static_cast<std::streamsize>(f.data.size()));
    out.close();
    if (!out) return make_error(errc::unavailable, "cannot write " + path);
  }
  return {};
}

// -- settings ---------------------------------------------------------------

void write_lora(wire::LoraConfig::Builder b, const LoraConfig& c) {
  b.setR(c.r);
  b.setAlpha(c.alpha);
  b.setDropout(c.dropout);
  write_texts(b.initTargetModules(static_cast<unsigned>(c.target_modules.size())), c.target_modules);
  b.setRslora(c.rslora);
  b.setTargetRegex(as_text(c.target_regex));
  auto rp = b.initRankPattern(static_cast<unsigned>(c.rank_pattern.size()));
  for (size_t i = 0; i < c.rank_pattern.size(); ++i) {
    rp[static_cast<unsigned>(i)].setPattern(as_text(c.rank_pattern[i].first));
    rp[static_cast<unsigned>(i)].setR(c.rank_pattern[i].second);
  }
  auto ap = b.initAlphaPattern(static_cast<unsigned>(c.alpha_pattern.size()));
  for (size_t i = 0; i < c.alpha_pattern.size(); ++i) {
    ap[static_cast<unsigned>(i)].setPattern(as_text(c.alpha_pattern[i].first));
    ap[static_cast<unsigned>(i)].setAlpha(c.alpha_pattern[i].second);
  }
  write_values<int64_t>(b.initLayersToTransform(static_cast<unsigned>(c.layers_to_transform.size())),
                        c.layers_to_transform);
  write_texts(b.initLayersPattern(static_cast<unsigned>(c.layers_pattern.size())), c.layers_pattern);
  write_texts(b.initExcludeModules(static_cast<unsigned>(c.exclude_modules.size())), c.exclude_modules);
  b.setExcludeRegex(as_text(c.exclude_regex));
}

Result<LoraConfig> read_lora(wire::LoraConfig::Reader r) {
  LoraConfig c;
  c.r = r.getR();
  c.alpha = r.getAlpha();
  c.dropout = r.getDropout();
  c.target_modules = texts(r.getTargetModules());
  c.rslora = r.getRslora();
  c.target_regex = text(r.getTargetRegex());
  for (auto p : r.getRankPattern()) c.rank_pattern.emplace_back(text(p.getPattern()), p.getR());
  for (auto p : r.getAlphaPattern()) c.alpha_pattern.emplace_back(text(p.getPattern()), p.getAlpha());
  c.layers_to_transform = values<int64_t>(r.getLayersToTransform());
  c.layers_pattern = texts(r.getLayersPattern());
  c.exclude_modules = texts(r.getExcludeModules());
  c.exclude_regex = text(r.getExcludeRegex());
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), "lora");
  return c;
}

void write_optimizer(wire::OptimizerConfig::Builder b, const OptimizerConfig& c) {
  b.setKind(static_cast<uint8_t>(c.kind));
  b.setLr(c.lr);
  b.setWeightDecay(c.weight_decay);
  b.setBeta1(c.beta1);
  b.setBeta2(c.beta2);
  b.setEps(c.eps);
  b.setMomentum(c.momentum);
  b.setMaxGradNorm(c.max_grad_norm);
  b.setKeepState(c.keep_state);
}

Result<OptimizerConfig> read_optimizer(wire::OptimizerConfig::Reader r) {
  if (r.getKind() > static_cast<uint8_t>(OptimizerConfig::Kind::sgd))
    return bad("optimizer: kind " + std::to_string(r.getKind()) + " is not 0 (adamw) or 1 (sgd)");
  OptimizerConfig c{.kind = static_cast<OptimizerConfig::Kind>(r.getKind()), .lr = r.getLr(),
                    .weight_decay = r.getWeightDecay(), .beta1 = r.getBeta1(), .beta2 = r.getBeta2(),
                    .eps = r.getEps(), .momentum = r.getMomentum(), .max_grad_norm = r.getMaxGradNorm(),
                    .keep_state = r.getKeepState()};
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), "optimizer");
  return c;
}

void write_scheduler(wire::SchedulerConfig::Builder b, const SchedulerConfig& c) {
  b.setKind(static_cast<uint8_t>(c.kind));
  b.setWarmupSteps(c.warmup_steps);
  b.setTotalSteps(c.total_steps);
  b.setMinLrRatio(c.min_lr_ratio);
}

Result<SchedulerConfig> read_scheduler(wire::SchedulerConfig::Reader r) {
  if (r.getKind() > static_cast<uint8_t>(SchedulerConfig::Kind::cosine))
    return bad("scheduler: kind " + std::to_string(r.getKind()) + " is not 0 (constant), 1 (linear) or 2 (cosine)");
  SchedulerConfig c{.kind = static_cast<SchedulerConfig::Kind>(r.getKind()), .warmup_steps = r.getWarmupSteps(),
                    .total_steps = r.getTotalSteps(), .min_lr_ratio = r.getMinLrRatio()};
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), "scheduler");
  return c;
}

void write_loss(wire::LossSpec::Builder b, const LossSpec& c) {
  b.setKind(static_cast<uint8_t>(c.kind));
  b.setEpsilon(c.epsilon);
  b.setEpsilonHigh(c.epsilon_high);
  b.setBeta(c.beta);
  b.setEntropyCoef(c.entropy_coef);
  b.setMaxTokens(c.max_tokens);
  b.setLabelSmoothing(c.label_smoothing);
  b.setReduction(static_cast<uint8_t>(c.reduction));
  b.setWeightCap(c.weight_cap);
  b.setCapMode(static_cast<uint8_t>(c.cap_mode));
}

Result<LossSpec> read_loss(wire::LossSpec::Reader r) {
  LossSpec c{.kind = static_cast<LossKind>(r.getKind()), .epsilon = r.getEpsilon(),
             .epsilon_high = r.getEpsilonHigh(), .beta = r.getBeta(), .entropy_coef = r.getEntropyCoef(),
             .max_tokens = r.getMaxTokens(), .label_smoothing = r.getLabelSmoothing()};
  c.reduction = static_cast<components::LossReduction>(r.getReduction());
  c.weight_cap = r.getWeightCap();
  c.cap_mode = static_cast<LossSpec::CapMode>(r.getCapMode());
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), "loss");
  return c;
}

void write_sampling(wire::SamplingParams::Builder b, const SamplingParams& p) {
  b.setNumSamples(p.num_samples);
  b.setMaxTokens(p.max_tokens);
  b.setTemperature(p.temperature);
  b.setTopK(p.top_k);
  b.setTopP(p.top_p);
  b.setMinP(p.min_p);
  b.setRepetitionPenalty(p.repetition_penalty);
  b.setSeed(p.seed);
  write_values<int64_t>(b.initStopTokenIds(static_cast<unsigned>(p.stop_token_ids.size())), p.stop_token_ids);
  write_texts(b.initStop(static_cast<unsigned>(p.stop.size())), p.stop);
  b.setIncludeStopStrInOutput(p.include_stop_str_in_output);
  b.setIgnoreEos(p.ignore_eos);
  b.setLogprobs(p.logprobs);
  b.setPromptLogprobs(p.prompt_logprobs);
  b.setReturnRoutes(p.return_routes);
}

Result<SamplingParams> read_sampling(wire::SamplingParams::Reader r) {
  SamplingParams p{.num_samples = r.getNumSamples(), .max_tokens = r.getMaxTokens(), .temperature = r.getTemperature(),
                   .top_k = r.getTopK(), .top_p = r.getTopP(), .min_p = r.getMinP(),
                   .repetition_penalty = r.getRepetitionPenalty(), .seed = r.getSeed(),
                   .stop_token_ids = values<int64_t>(r.getStopTokenIds()), .stop = texts(r.getStop()),
                   .include_stop_str_in_output = r.getIncludeStopStrInOutput(), .ignore_eos = r.getIgnoreEos(),
                   .logprobs = r.getLogprobs(), .prompt_logprobs = r.getPromptLogprobs(),
                   .return_routes = r.getReturnRoutes()};
  if (auto ok = p.validate(); !ok) return with_context(ok.error(), "sampling params");
  return p;
}

// -- sampling ---------------------------------------------------------------

void write_requests(capnp::List<wire::SampleRequest>::Builder b, const std::vector<SampleRequest>& rs) {
  for (size_t i = 0; i < rs.size(); ++i) {
    b[static_cast<unsigned>(i)].setIndex(rs[i].index);
    write_values<int64_t>(b[static_cast<unsigned>(i)].initPrompt(static_cast<unsigned>(rs[i].prompt.size())),
                          rs[i].prompt);
  }
}

Result<std::vector<SampleRequest>> read_requests(capnp::List<wire::SampleRequest>::Reader r, int64_t vocab_size) {
  std::vector<SampleRequest> out;
  out.reserve(r.size());
  for (auto q : r) {
    SampleRequest s{.index = q.getIndex(), .prompt = values<int64_t>(q.getPrompt())};
    for (size_t i = 0; i < s.prompt.size(); ++i)
      if (s.prompt[i] < 0 || (vocab_size > 0 && s.prompt[i] >= vocab_size))
        return bad("request " + std::to_string(s.index) + ": token " + std::to_string(i) + " is " +
                   std::to_string(s.prompt[i]) + ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    out.push_back(std::move(s));
  }
  return out;
}

namespace {
void write_logprobs(wire::TokenLogprobs::Builder b, const TokenLogprobs& l) {
  write_values<float>(b.initChosen(static_cast<unsigned>(l.chosen.size())), l.chosen);
  b.setK(l.k);
  write_values<int64_t>(b.initTopIds(static_cast<unsigned>(l.top_ids.size())), l.top_ids);
  write_values<float>(b.initTopLogprobs(static_cast<unsigned>(l.top_logprobs.size())), l.top_logprobs);
}
TokenLogprobs read_logprobs(wire::TokenLogprobs::Reader r) {
  return {.chosen = values<float>(r.getChosen()), .k = r.getK(), .top_ids = values<int64_t>(r.getTopIds()),
          .top_logprobs = values<float>(r.getTopLogprobs())};
}
}  // namespace

void write_sequences(capnp::List<wire::SampledSequence>::Builder b, const std::vector<SampledSequence>& seqs) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    auto e = b[static_cast<unsigned>(i)];
    e.setIndex(s.index);
    e.setSample(s.sample);
    e.setError(as_text(s.error));
    write_values<int64_t>(e.initTokens(static_cast<unsigned>(s.tokens.size())), s.tokens);
    write_logprobs(e.initLogprobs(), s.logprobs);
    e.setStopReason(static_cast<uint8_t>(s.stop_reason));
    e.setStopToken(s.stop_token);
    e.setStopString(as_text(s.stop_string));
    e.setText(as_text(s.text));
    e.setWeightVersion(s.weight_version);
    write_logprobs(e.initPromptLogprobs(), s.prompt_logprobs);
    e.setCachedTokens(s.cached_tokens);
    e.setFirstWeightVersion(s.first_weight_version);
    auto routes = e.initRoutes();
    routes.setLayers(s.routes.layers);
    routes.setK(s.routes.k);
    write_values<int32_t>(routes.initExperts(static_cast<unsigned>(s.routes.experts.size())), s.routes.experts);
  }
}

Result<std::vector<SampledSequence>> read_sequences(capnp::List<wire::SampledSequence>::Reader r) {
  std::vector<SampledSequence> out;
  out.reserve(r.size());
  for (auto e : r) {
    if (e.getStopReason() > static_cast<uint8_t>(StopReason::abort))
      return bad("sequence: stop reason " + std::to_string(e.getStopReason()) + " is not 0-3");
    out.push_back({.index = e.getIndex(), .sample = e.getSample(), .error = text(e.getError()),
                   .tokens = values<int64_t>(e.getTokens()), .logprobs = read_logprobs(e.getLogprobs()),
                   .stop_reason = static_cast<StopReason>(e.getStopReason()), .stop_token = e.getStopToken(),
                   .stop_string = text(e.getStopString()), .text = text(e.getText()),
                   .weight_version = e.getWeightVersion(),
                   .first_weight_version =
                       e.getFirstWeightVersion() < 0 ? e.getWeightVersion() : e.getFirstWeightVersion(),
                   .prompt_logprobs = read_logprobs(e.getPromptLogprobs()),
                   .cached_tokens = e.getCachedTokens(),
                   .routes = {.layers = e.getRoutes().getLayers(), .k = e.getRoutes().getK(),
                              .experts = values<int32_t>(e.getRoutes().getExperts())}});
    const auto& routes = out.back().routes;
    if (routes.layers < 0 || routes.k < 0 || routes.layers > (1 << 20) || routes.k > (1 << 20) ||
        static_cast<int64_t>(routes.experts.size()) != static_cast<int64_t>(out.back().tokens.size()) * routes.layers * routes.k)
      if (!routes.experts.empty() || routes.layers != 0 || routes.k != 0)
        return bad("sequence: routes of " + std::to_string(routes.experts.size()) + " entries are not " +
                   std::to_string(out.back().tokens.size()) + " tokens x " + std::to_string(routes.layers) +
                   " layers x " + std::to_string(routes.k) + " experts");
  }
  return out;
}

capnp::Text::Reader as_text(const std::string& s) { return {s.data(), s.size()}; }

std::string message_bytes(capnp::MessageBuilder& m) {
  const auto words = capnp::messageToFlatArray(m);  // held: the bytes are its
  const auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Result<std::string> read_name(capnp::Text::Reader r, const std::string& what) {
  auto s = text(r);
  bool ok = !s.empty() && s.size() <= 64 && s != "." && s != "..";
  for (char c : s)
    ok &= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-';
  if (!ok) return bad(what + " '" + s.substr(0, 64) + "' is not 1-64 bytes of letters, digits, '.', '_' or '-'");
  return s;
}

}  // namespace glint::rpc
