#include "components/sampler/engine.hpp"
#include "runtime/log.hpp"
#include "runtime/memory.hpp"

#include "components/model/kernels.hpp"
#include "components/model/transformer.hpp"
#include "components/sampler/paged_attention.hpp"
#include "components/sampler/scheduler.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "runtime/stop.hpp"
#include "runtime/text.hpp"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <set>

namespace glint::components {

namespace fs = std::filesystem;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A uniform double in [0, 1) from 53 random bits: the same on every platform
// (std::uniform_real_distribution is not specified bit for bit).
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

uint64_t mix_seed(uint64_t seed, uint64_t sample) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(sample),
                    static_cast<uint32_t>(sample >> 32)};
  std::mt19937_64 g{seq};
  return g();
}

// What the engine keeps per sequence besides the scheduler's state.
struct SeqState {
  Sequence* seq = nullptr;
  std::mt19937_64 rng;
  std::string bytes;         // the completion's bytes so far (for stop strings)
  size_t stop_scan_from = 0; // stop strings cannot start before this byte
};

struct Request {
  uint64_t id = 0;
  SamplingParams params;
  std::string adapter;
  RequestOutput out;
  std::vector<SeqState> seqs;  // by sample; empty entries until forked
  bool forked = false;
  int64_t prompt_logprobs_done = 0;  // prompt positions whose log-probabilities are recorded
  bool done() const {
    for (const auto& s : out.sequences)
      if (s.stop_reason == StopReason::none) return false;
    return true;
  }
};

struct PendingUpdate {
  std::map<std::string, at::Tensor> tensors;
  std::string adapter;
  int64_t version = 0;
  // Requests it touches numbered below wait_below finish first (finish_old:
  // those admitted before it; otherwise none); those from hold_from on (the
  // ones added after it) wait for it. Requests before hold_from are never
  // held by it, so an update queued behind another cannot hold back the
  // requests that one waits for.
  uint64_t wait_below = 0, hold_from = 0;

  // Whether it changes what `adapter`'s requests sample with: the base
  // changes every request's, an adapter only its own.
  bool touches(const std::string& a) const { return adapter.empty() || adapter == a; }
  // Whether it must apply after `earlier` (they change the same weights).
  bool after(const PendingUpdate& earlier) const { return adapter.empty() || earlier.touches(adapter); }
};

}  // namespace

struct Engine::Impl {
  CausalLM model;
  EngineConfig cfg;
  std::optional<Tokenizer> tokenizer;
  int64_t max_len = 0;
  int32_t num_blocks = 0;
  std::unique_ptr<Scheduler> sched;
  std::vector<at::Tensor> k_cache, v_cache;  // per layer [num_blocks * block_size, kv_heads, head_dim]; undefined on Gated DeltaNet layers
  // Gated DeltaNet layers (Qwen3.5): per layer (undefined members on
  // attention layers), every sequence slot's conv window [slots, K-1, C] and
  // delta-rule state [slots, nv, dk, dv]. A running sequence holds a slot
  // from its first scheduled chunk until it finishes or is preempted; a
  // fork copies its parent's; a chunk from position 0 starts from zeros.
  std::vector<gdn::MixerState> linear_state;
  int64_t state_slots = 0, state_bytes_per_sequence = 0;
  std::map<uint64_t, int64_t> state_slot;  // sequence id -> slot
  std::vector<int64_t> free_state_slots;
  // The projection and head weights in oneDNN's layout, converted once
  // instead of at every call (rebuilt when weights change).
  std::map<std::string, at::Tensor> packed;
  std::map<uint64_t, Request> requests;
  std::map<uint64_t, std::pair<uint64_t, int32_t>> seq_owner;  // sequence id -> (request, sample)
  uint64_t next_request = 1;
  std::mt19937_64 seeds;
  int64_t version = 0;  ///< the highest version applied
  /// Per adapter ("" : the base): its last update (when it applied, its version).
  std::map<std::string, std::pair<uint64_t, int64_t>> versions;
  uint64_t updates_applied = 0;
  /// Updates waiting for the requests admitted before each (finish_old),
  /// applied in order where they change the same weights; at most max_pending.
  std::deque<PendingUpdate> pending;
  static constexpr size_t max_pending = 8;
  bool asleep = false;
  int64_t steps = 0, generated = 0;
  double schedule_seconds = 0, forward_seconds = 0, sample_seconds = 0;
  int64_t max_stop_len = 0;

  CausalLM::Impl& lm() const { return model.impl(); }
  const ModelConfig& mc() const { return model.config(); }

  void allocate_cache() {
    const auto& c = mc();
    const int64_t slots = static_cast<int64_t>(num_blocks) * cfg.block_size;
    k_cache.clear();
    v_cache.clear();
    linear_state.clear();
    state_slot.clear();
    free_state_slots.clear();
    const auto& la = c.linear_attention;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (c.token_mixer(l) == TokenMixer::gated_deltanet) {
        k_cache.emplace_back();
        v_cache.emplace_back();
        linear_state.push_back({at::zeros({state_slots, la.conv_kernel_dim - 1, la.conv_dim()}, at::kFloat),
                                at::zeros({state_slots, la.num_value_heads, la.key_head_dim, la.value_head_dim},
                                          at::kFloat)});
        continue;
      }
      k_cache.push_back(at::zeros({slots, c.num_key_value_heads, c.head_dim}, at::kFloat));
      v_cache.push_back(at::zeros({slots, c.num_key_value_heads, c.head_dim}, at::kFloat));
      linear_state.emplace_back();
    }
    for (int64_t s = state_slots - 1; s >= 0; --s) free_state_slots.push_back(s);
    sched = std::make_unique<Scheduler>(SchedulerConfig{cfg.block_size, num_blocks, cfg.max_num_seqs,
                                                        cfg.max_num_batched_tokens, cfg.enable_prefix_caching});
  }

  // Cached keys and values depend on the adapter and the weights; a weight
  // update clears the whole cache, so the adapter's name suffices.
  void pack_weights() {
    packed.clear();
    for (const auto& [name, w] : lm().params)
      if (w.dim() == 2 && name != "model.embed_tokens.weight") packed[name] = pack_linear_weight(w);
    if (mc().tie_word_embeddings)
      packed["model.embed_tokens.weight"] = pack_linear_weight(lm().param("model.embed_tokens.weight"));
  }

  // Logits of the step's rows `need` (indices into hidden), with the LM-head
  // LoRA of the adapters that have one, for their rows.
  at::Tensor head(const at::Tensor& hidden, const std::vector<int64_t>& need,
                  const std::vector<RowAdapter>& adapters) const {
    auto h = hidden.index_select(0, at::tensor(need, at::kLong));
    auto y = fast_linear(h, packed.at(mc().tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"));
    std::vector<RowAdapter> heads;
    std::vector<int64_t> owner;
    for (size_t k = 0; k < adapters.size(); ++k) {
      const auto& a = adapters[k];
      if (a.lora->merged || !a.lora->weights.count("lm_head")) continue;
      if (owner.empty()) owner.assign(static_cast<size_t>(hidden.size(0)), -1);
      auto rows = a.rows.contiguous();
      for (int64_t i = 0; i < rows.numel(); ++i) owner[static_cast<size_t>(rows.data_ptr<int64_t>()[i])] = static_cast<int64_t>(k);
    }
    if (owner.empty()) return y;
    for (size_t k = 0; k < adapters.size(); ++k) {
      std::vector<int64_t> mine;
      for (size_t j = 0; j < need.size(); ++j)
        if (owner[static_cast<size_t>(need[j])] == static_cast<int64_t>(k)) mine.push_back(static_cast<int64_t>(j));
      if (!mine.empty()) heads.push_back({adapters[k].lora, at::tensor(mine, at::kLong)});
    }
    PassOptions pass;
    pass.row_adapters = std::move(heads);
    return lm().add_lora("lm_head", h, std::move(y), pass);
  }

  static uint64_t salt_of(const std::string& adapter) { return hash_seed("adapter:" + adapter); }

  Result<void> check_request(const std::vector<int64_t>& prompt, const SamplingParams& p,
                             const std::string& adapter) const {
    if (asleep) return make_error(errc::failed_precondition, "the sampler is asleep: wake it before sampling");
    if (auto ok = p.validate(); !ok) return ok;
    if (prompt.empty()) return make_error(errc::invalid_argument, "the prompt is empty");
    for (size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] < 0 || prompt[i] >= mc().vocab_size)
        return make_error(errc::invalid_argument, "prompt token " + std::to_string(i) + " is " +
                                                      std::to_string(prompt[i]) + ", outside the vocabulary [0, " +
                                                      std::to_string(mc().vocab_size) + ")");
      else if (std::find(mc().media_token_ids.begin(), mc().media_token_ids.end(), prompt[i]) != mc().media_token_ids.end())
        return make_error(errc::unimplemented, "prompt token " + std::to_string(i) + " is " + std::to_string(prompt[i]) +
                                                   ", the checkpoint's image or video placeholder: glint runs the "
                                                   "text model of this vision-language checkpoint only");
    const auto len = static_cast<int64_t>(prompt.size());
    if (len > max_len || (p.max_tokens > 0 && len == max_len))
      return make_error(errc::invalid_argument, "the prompt has " + std::to_string(len) +
                                                    " tokens; max_model_len is " + std::to_string(max_len) +
                                                    (p.max_tokens > 0 ? ", and a completion needs at least one more" : ""));
    for (auto t : p.stop_token_ids)
      if (t < 0 || t >= mc().vocab_size)
        return make_error(errc::invalid_argument, "stop token id " + std::to_string(t) + " is outside the vocabulary");
    if (p.return_routes && !mc().has_experts())
      return make_error(errc::invalid_argument, "return_routes asks for the experts each token was routed to, and this "
                                                "model (" + std::string{hf_class_name(mc().architecture)} +
                                                ") has none; leave it false");
    if (!p.stop.empty() && !tokenizer)
      return make_error(errc::failed_precondition,
                        "stop strings need a tokenizer, and this model has none (no tokenizer.json in its directory)");
    if (!adapter.empty() && !model.has_adapter(adapter)) {
      auto names = model.adapters();
      return make_error(errc::not_found, "no LoRA adapter '" + adapter + "' in the sampler (it has: " +
                                             (names.empty() ? std::string{"none"} : join(names)) + ")");
    }
    if (p.num_samples > cfg.max_num_seqs)
      return make_error(errc::invalid_argument, "num_samples " + std::to_string(p.num_samples) +
                                                    " exceeds max_num_seqs " + std::to_string(cfg.max_num_seqs) +
                                                    ": the samples of a request run together");
    const int64_t longest = std::min(len + p.max_tokens, max_len);
    const int64_t need = (longest + cfg.block_size - 1) / cfg.block_size;
    if (need > num_blocks)
      return make_error(errc::resource_exhausted,
                        "a sequence of " + std::to_string(longest) + " tokens needs " + std::to_string(need) +
                            " KV-cache blocks but the cache has " + std::to_string(num_blocks) +
                            "; raise cache_bytes or lower max_tokens");
    return {};
  }

  // -- one step ------------------------------------------------------------------

  struct Rows {
    at::Tensor ids, positions, slots;  // [N]
    // Decodes (one token each) come first, then prefill chunks.
    int64_t num_decode = 0;
    at::Tensor decode_slots;    // i64 [S, Cmax]
    at::Tensor decode_lengths;  // i64 [S]
    at::Tensor decode_states;   // i64 [S]: the decodes' Gated DeltaNet state slots
    struct Prefill {
      int64_t row = 0, count = 0, ctx = 0;
      at::Tensor slots;  // i64 [ctx]
      at::Tensor bias;   // f32 [count, ctx]
      at::Tensor window_bias{};  // f32 [count, ctx], for sliding-window layers
      int64_t state = -1;        // its Gated DeltaNet state slot
      bool fresh = true;         // the chunk starts its sequence (the state is zero)
    };
    std::vector<Prefill> prefills;
    std::vector<const Chunk*> order;  // chunks in row order
    std::vector<int64_t> first_row;   // per chunk in `order`
    std::vector<RowAdapter> adapters;
  };

  // The state slot of a sequence whose chunk starts at `begin`: its own, or
  // a free one; zeros when the chunk starts the sequence (fresh, or
  // recomputed after a preemption).
  int64_t state_slot_for(const Sequence& s, int64_t begin) {
    auto it = state_slot.find(s.id);
    if (it == state_slot.end()) {
      if (free_state_slots.empty())
        throw std::logic_error("more running sequences than Gated DeltaNet state slots (" + std::to_string(state_slots) + ")");
      it = state_slot.emplace(s.id, free_state_slots.back()).first;
      free_state_slots.pop_back();
    }
    if (begin == 0)
      for (auto& st : linear_state)
        if (st.conv.defined()) {
          st.conv[it->second].zero_();
          st.recurrent[it->second].zero_();
        }
    return it->second;
  }
  void release_state(uint64_t seq) {
    if (auto it = state_slot.find(seq); it != state_slot.end()) {
      free_state_slots.push_back(it->second);
      state_slot.erase(it);
    }
  }
  // A fork's samples start from their parent's state after the prompt.
  void fork_state(const Sequence& parent, const Sequence& kid) {
    if (state_slots == 0) return;
    const int64_t from = state_slot.at(parent.id), to = state_slot_for(kid, kid.num_computed);
    for (auto& st : linear_state)
      if (st.conv.defined()) {
        st.conv[to].copy_(st.conv[from]);
        st.recurrent[to].copy_(st.recurrent[from]);
      }
  }

  int64_t slot_of(const Sequence& s, int64_t pos) const {
    return static_cast<int64_t>(s.blocks[static_cast<size_t>(pos / cfg.block_size)]) * cfg.block_size +
           pos % cfg.block_size;
  }

  Rows build_rows(const Schedule& sch) {
    Rows r;
    for (const auto& c : sch.chunks)
      if (c.count == 1) r.order.push_back(&c);
    r.num_decode = static_cast<int64_t>(r.order.size());
    for (const auto& c : sch.chunks)
      if (c.count > 1) r.order.push_back(&c);
    std::vector<int64_t> ids, pos, slots, states;
    std::map<std::string, std::vector<int64_t>> by_adapter;
    for (const auto* c : r.order) {
      r.first_row.push_back(static_cast<int64_t>(ids.size()));
      if (state_slots > 0) states.push_back(state_slot_for(*c->seq, c->begin));
      const auto& adapter = requests.at(c->seq->request).adapter;
      for (int64_t i = 0; i < c->count; ++i) {
        const int64_t p = c->begin + i;
        if (!adapter.empty()) by_adapter[adapter].push_back(static_cast<int64_t>(ids.size()));
        ids.push_back(c->seq->tokens[static_cast<size_t>(p)]);
        pos.push_back(p);
        slots.push_back(slot_of(*c->seq, p));
      }
    }
    auto vec = [](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); };
    r.ids = vec(ids);
    r.positions = vec(pos);
    r.slots = vec(slots);
    if (state_slots > 0)
      r.decode_states = vec(std::vector<int64_t>(states.begin(), states.begin() + r.num_decode));
    for (auto& [name, rows] : by_adapter) {
      auto a = lm().adapter(name);  // requests hold their adapter (remove_adapter refuses)
      if (!a) throw std::logic_error("a scheduled request's adapter is gone: " + describe(a.error()));
      r.adapters.push_back({*a, vec(rows)});
    }
    // Decodes: every sequence's context slots, padded to the longest (the
    // padding is never read).
    if (r.num_decode > 0) {
      int64_t cmax = 0;
      for (int64_t i = 0; i < r.num_decode; ++i) cmax = std::max(cmax, r.order[static_cast<size_t>(i)]->begin + 1);
      std::vector<int64_t> ds(static_cast<size_t>(r.num_decode * cmax), 0), lens;
      for (int64_t i = 0; i < r.num_decode; ++i) {
        const auto* c = r.order[static_cast<size_t>(i)];
        for (int64_t j = 0; j <= c->begin; ++j) ds[static_cast<size_t>(i * cmax + j)] = slot_of(*c->seq, j);
        lens.push_back(c->begin + 1);
      }
      r.decode_slots = vec(ds).view({r.num_decode, cmax});
      r.decode_lengths = vec(lens);
    }
    for (size_t k = static_cast<size_t>(r.num_decode); k < r.order.size(); ++k) {
      const auto* c = r.order[k];
      Rows::Prefill p{r.first_row[k], c->count, c->begin + c->count, {}, {}};
      if (state_slots > 0) {
        p.state = states[k];
        p.fresh = c->begin == 0;
      }
      std::vector<int64_t> s(static_cast<size_t>(p.ctx));
      for (int64_t j = 0; j < p.ctx; ++j) s[static_cast<size_t>(j)] = slot_of(*c->seq, j);
      p.slots = vec(s);
      // Query i (position begin + i) sees keys 0..begin + i; on a sliding
      // layer only those after begin + i - window.
      auto hidden = at::ones({p.count, p.ctx}, at::kBool).triu(c->begin + 1);
      p.bias = at::zeros({p.count, p.ctx}, at::kFloat).masked_fill(hidden, kNegInf);
      if (const int64_t w = mc().sliding_window; w > 0) {
        auto outside = hidden.logical_or(at::ones({p.count, p.ctx}, at::kBool).tril(c->begin - w));
        p.window_bias = at::zeros({p.count, p.ctx}, at::kFloat).masked_fill(outside, kNegInf);
      }
      r.prefills.push_back(std::move(p));
    }
    return r;
  }

  // Final hidden states [N, hidden] of the step's rows, writing their keys
  // and values into the cache.
  at::Tensor forward(const Rows& r, RouterRecord* routes = nullptr) {
    const auto& c = mc();
    const int64_t D = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads, g = nh / nkv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto attend = [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      auto& kc = k_cache[static_cast<size_t>(layer)];
      auto& vc = v_cache[static_cast<size_t>(layer)];
      kc.index_copy_(0, r.slots, k);
      vc.index_copy_(0, r.slots, v);
      std::vector<at::Tensor> parts;
      if (r.num_decode > 0) {
        auto qd = q.narrow(0, 0, r.num_decode);
        parts.push_back(paged_decode_attention(qd, kc, vc, r.decode_slots, r.decode_lengths, scale, c.window(layer))
                            .view({r.num_decode, nh * D}));
      }
      for (const auto& p : r.prefills) {
        auto keys = kc.index_select(0, p.slots).permute({1, 0, 2});  // [kv, ctx, D]
        auto vals = vc.index_select(0, p.slots).permute({1, 0, 2});
        // [n, kv, g, D] -> [kv, g * n, D]
        auto qp = q.narrow(0, p.row, p.count).view({p.count, nkv, g, D}).permute({1, 2, 0, 3}).reshape({nkv, g * p.count, D});
        const auto& bias = c.window(layer) > 0 ? p.window_bias : p.bias;
        auto scores = fast_bmm(qp, keys.transpose(1, 2)).view({nkv, g, p.count, p.ctx}) * scale + bias;
        auto probs = at::softmax(scores, -1).view({nkv, g * p.count, p.ctx});
        auto out = fast_bmm(probs, vals).view({nkv, g, p.count, D}).permute({2, 0, 1, 3}).reshape({p.count, nh * D});
        parts.push_back(out);
      }
      return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    };
    // Gated DeltaNet layers: the step's rows projected at once (each row's
    // adapter), then the decodes token by token from their states in one
    // batch and each prefill chunk by the chunked rule from its own; the
    // states after them written back to their slots.
    auto mix = [&](int64_t layer, const gdn::MixerWeights& w, const at::Tensor& h) {
      auto& st = linear_state[static_cast<size_t>(layer)];
      const auto in = gdn::project_in(w, h);  // [N, .]
      auto rows_of = [&](int64_t row, int64_t count, int64_t dim) {
        auto part = [&](const at::Tensor& t) { return t.narrow(0, row, count).unsqueeze(dim); };
        return gdn::Projected{part(in.qkv), part(in.z), part(in.b), part(in.a)};
      };
      std::vector<at::Tensor> outs;
      if (r.num_decode > 0) {
        const auto& slots = r.decode_states;
        gdn::MixerState before{st.conv.index_select(0, slots), st.recurrent.index_select(0, slots)};
        auto [o, after] = gdn::mix_projected(w, rows_of(0, r.num_decode, 1), before, {}, /*chunk=*/0);
        st.conv.index_copy_(0, slots, after.conv);
        st.recurrent.index_copy_(0, slots, after.recurrent);
        outs.push_back(o.squeeze(1));
      }
      for (const auto& p : r.prefills) {
        gdn::MixerState before;
        if (!p.fresh) before = {st.conv.narrow(0, p.state, 1), st.recurrent.narrow(0, p.state, 1)};
        auto [o, after] = gdn::mix_projected(w, rows_of(p.row, p.count, 0), before, {}, lm().gdn_chunk);
        st.conv.narrow(0, p.state, 1).copy_(after.conv);
        st.recurrent.narrow(0, p.state, 1).copy_(after.recurrent);
        outs.push_back(o.squeeze(0));
      }
      auto o = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
      return w.project("out_proj", w.out_proj, o);
    };
    PassOptions pass;
    pass.row_adapters = r.adapters;
    pass.packed = &packed;
    pass.routes = routes;
    return lm().decode_stack(r.ids, r.positions, attend, pass, mix);
  }

  // -- sampling ------------------------------------------------------------------

  // One draw: a sequence's next token from logits row `row`.
  struct Draw {
    Request* req = nullptr;
    int32_t sample = 0;
    int64_t row = 0;  // into the step's logits
    const std::vector<int64_t>* history = nullptr;  // for the repetition penalty
    int64_t token = -1;
    int64_t route_row = -1;  // into step_routes, when its request asked for routes
  };
  at::Tensor step_routes;  // i32 [rows, sparse layers, k] of the last step that recorded them

  void sample(std::vector<Draw>& draws, const at::Tensor& logits) {
    if (draws.empty()) return;
    const int64_t R = static_cast<int64_t>(draws.size()), V = logits.size(1);
    std::vector<int64_t> src(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) src[static_cast<size_t>(i)] = draws[static_cast<size_t>(i)].row;
    auto x = logits.index_select(0, at::tensor(src, at::kLong)).contiguous();  // a copy: processed in place
    auto xa = x.accessor<float, 2>();
    bool any_top_k = false, any_top_p = false, any_min_p = false;
    std::vector<float> temps(static_cast<size_t>(R), 1.0f);
    for (int64_t i = 0; i < R; ++i) {
      const auto& p = draws[static_cast<size_t>(i)].req->params;
      if (p.repetition_penalty != 1.0) {
        std::set<int64_t> seen(draws[static_cast<size_t>(i)].history->begin(), draws[static_cast<size_t>(i)].history->end());
        const auto pen = static_cast<float>(p.repetition_penalty);
        for (auto t : seen) {
          float& v = xa[i][t];
          v = v > 0 ? v / pen : v * pen;
        }
      }
      if (p.temperature > 0) temps[static_cast<size_t>(i)] = static_cast<float>(p.temperature);
      any_top_k |= p.temperature > 0 && p.top_k > 0 && p.top_k < V;
      any_top_p |= p.temperature > 0 && p.top_p < 1.0;
      any_min_p |= p.temperature > 0 && p.min_p > 0.0;
    }
    auto greedy = x.argmax(1);
    x.div_(at::tensor(temps, at::kFloat).unsqueeze(1));
    if (any_top_k) {
      int64_t kmax = 0;
      for (const auto& d : draws)
        if (d.req->params.top_k > 0) kmax = std::max(kmax, std::min(d.req->params.top_k, V));
      auto top = std::get<0>(x.topk(kmax, 1));  // sorted, largest first
      auto ta = top.accessor<float, 2>();
      for (int64_t i = 0; i < R; ++i) {
        const auto k = draws[static_cast<size_t>(i)].req->params.top_k;
        if (k <= 0 || k >= V) continue;
        const float cut = ta[i][k - 1];
        for (int64_t t = 0; t < V; ++t)
          if (xa[i][t] < cut) xa[i][t] = kNegInf;
      }
    }
    auto probs = at::softmax(x, 1);
    if (any_top_p) {
      auto [sorted, order] = probs.sort(1, /*descending=*/true);
      auto before = sorted.cumsum(1) - sorted;  // mass of the likelier tokens
      std::vector<float> ps(static_cast<size_t>(R));
      for (int64_t i = 0; i < R; ++i) ps[static_cast<size_t>(i)] = static_cast<float>(draws[static_cast<size_t>(i)].req->params.top_p);
      // Keep a token while the likelier ones have not reached top_p (the first always stays).
      auto drop = before >= at::tensor(ps, at::kFloat).unsqueeze(1);
      probs = probs.scatter(1, order, sorted.masked_fill(drop, 0));
    }
    if (any_min_p) {
      std::vector<float> ms(static_cast<size_t>(R));
      for (int64_t i = 0; i < R; ++i) ms[static_cast<size_t>(i)] = static_cast<float>(draws[static_cast<size_t>(i)].req->params.min_p);
      auto floor = std::get<0>(probs.max(1, true)) * at::tensor(ms, at::kFloat).unsqueeze(1);
      probs = probs.masked_fill(probs < floor, 0);
    }
    probs = probs.contiguous();
    auto pa = probs.accessor<float, 2>();
    auto ga = greedy.accessor<int64_t, 1>();
    for (int64_t i = 0; i < R; ++i) {
      auto& d = draws[static_cast<size_t>(i)];
      if (d.req->params.temperature == 0) {
        d.token = ga[i];
        continue;
      }
      // Inverse CDF with the sequence's own generator: what it draws does not
      // depend on the other rows.
      double total = 0;
      for (int64_t t = 0; t < V; ++t) total += pa[i][t];
      auto& rng = d.req->seqs[static_cast<size_t>(d.sample)].rng;
      const double u = uniform(rng) * total;
      double acc = 0;
      int64_t pick = -1;
      for (int64_t t = 0; t < V; ++t) {
        if (pa[i][t] <= 0) continue;
        pick = t;
        acc += pa[i][t];
        if (acc > u) break;
      }
      d.token = pick;
    }
  }

  // Log-probabilities to record: the chosen token's and the top k.
  static void record(TokenLogprobs& out, const at::Tensor& logprobs_row, int64_t token, int64_t k) {
    out.chosen.push_back(logprobs_row[token].item<float>());
    out.k = k;
    if (k <= 0) return;
    auto [vals, idx] = logprobs_row.topk(std::min<int64_t>(k, logprobs_row.size(0)));
    auto va = vals.accessor<float, 1>();
    auto ia = idx.accessor<int64_t, 1>();
    for (int64_t j = 0; j < vals.size(0); ++j) {
      out.top_ids.push_back(ia[j]);
      out.top_logprobs.push_back(va[j]);
    }
  }

  // Appends `token` to sample `k` of `req`; finishes it when a stop rule says so.
  void append(Request& req, int32_t k, int64_t token, const at::Tensor& logprobs_row, int64_t route_row) {
    auto& st = req.seqs[static_cast<size_t>(k)];
    auto& out = req.out.sequences[static_cast<size_t>(k)];
    const auto& p = req.params;
    st.seq->tokens.push_back(token);
    const int64_t v = version_of(req.adapter);
    if (out.tokens.empty()) out.first_weight_version = v;
    out.tokens.push_back(token);
    out.weight_version = v;  // only continue_new changes it while a sequence runs
    ++generated;
    if (p.logprobs >= 0) record(out.logprobs, logprobs_row, token, p.logprobs);
    if (p.return_routes) {
      auto& r = out.routes;
      r.layers = step_routes.size(1), r.k = step_routes.size(2);
      const auto* row = step_routes.data_ptr<int32_t>() + route_row * r.layers * r.k;
      r.experts.insert(r.experts.end(), row, row + r.layers * r.k);
    }
    StopReason why = StopReason::none;
    if ((!p.ignore_eos && mc().is_eos(token)) ||
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end()) {
      why = StopReason::stop;
      out.stop_token = token;
    }
    if (why == StopReason::none && !p.stop.empty()) {
      if (!tokenizer->is_special(token)) st.bytes += tokenizer->token_bytes(token);
      size_t best = std::string::npos;
      const std::string* hit = nullptr;
      for (const auto& s : p.stop) {
        auto at = st.bytes.find(s, st.stop_scan_from);
        if (at != std::string::npos && at < best) {
          best = at;
          hit = &s;
        }
      }
      if (hit) {
        why = StopReason::stop;
        out.stop_string = *hit;
        st.bytes.resize(best + (p.include_stop_str_in_output ? hit->size() : 0));
      } else if (st.bytes.size() + 1 > static_cast<size_t>(max_stop_len)) {
        st.stop_scan_from = st.bytes.size() + 1 - static_cast<size_t>(max_stop_len);
      }
    }
    if (why == StopReason::none && (static_cast<int64_t>(out.tokens.size()) >= p.max_tokens ||
                                    static_cast<int64_t>(st.seq->tokens.size()) >= max_len))
      why = StopReason::length;
    if (why != StopReason::none) finish(req, k, why);
  }

  void finish(Request& req, int32_t k, StopReason why) {
    auto& st = req.seqs[static_cast<size_t>(k)];
    auto& out = req.out.sequences[static_cast<size_t>(k)];
    out.stop_reason = why;
    if (tokenizer)
      out.text = req.params.stop.empty() ? tokenizer->decode(out.tokens) : tokenizer->finish_text(st.bytes);
    if (st.seq) {
      seq_owner.erase(st.seq->id);
      release_state(st.seq->id);
      sched->finish(*st.seq);
      st.seq = nullptr;
    }
    req.out.finished = req.done();
  }

  void abort_request(Request& req) {
    for (int32_t k = 0; k < static_cast<int32_t>(req.out.sequences.size()); ++k)
      if (req.out.sequences[static_cast<size_t>(k)].stop_reason == StopReason::none) finish(req, k, StopReason::abort);
    // Samples not forked yet have no sequence of their own: all finished above.
  }

  Result<std::vector<uint64_t>> run_step();
  void apply_update(PendingUpdate&& u);

  // The version the tokens of `adapter`'s requests are sampled with: of the
  // last update that changed their weights, the adapter's or the base's.
  int64_t version_of(const std::string& adapter) const {
    std::pair<uint64_t, int64_t> last{0, 0};  // the later of the adapter's update and the base's
    for (const auto& name : {adapter, std::string{}})
      if (auto it = versions.find(name); it != versions.end() && it->second.first > last.first) last = it->second;
    return last.second;
  }

  // Whether update `i` of the queue waits: for an earlier one that changes
  // the same weights, or for a request it touches admitted before it.
  bool waits(size_t i) const {
    const auto& u = pending[i];
    for (size_t j = 0; j < i; ++j)
      if (u.after(pending[j])) return true;
    for (const auto& [id, r] : requests)
      if (id < u.wait_below && !r.out.finished && u.touches(r.adapter)) return true;
    return false;
  }

  // Whether request `id` must wait for a queued update: one that changes
  // its weights and came before it.
  bool held(uint64_t id) const {
    auto it = requests.find(id);
    if (it == requests.end()) return false;
    for (const auto& u : pending)
      if (id >= u.hold_from && u.touches(it->second.adapter)) return true;
    return false;
  }

  // Applies the waiting updates that no longer wait, in queue order.
  void apply_due_updates() {
    for (size_t i = 0; i < pending.size();) {
      if (waits(i)) {
        ++i;
        continue;
      }
      // Off the queue first: an update that throws is not applied again, empty.
      auto u = std::move(pending[i]);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      apply_update(std::move(u));
    }
  }
};

// -- the step ---------------------------------------------------------------------

Result<std::vector<uint64_t>> Engine::Impl::run_step() {
  std::vector<uint64_t> touched;
  if (asleep) return touched;
  apply_due_updates();
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  auto sch = pending.empty() ? sched->schedule() : sched->schedule([this](uint64_t id) { return held(id); });
  for (const auto* s : sch.preempted) release_state(s->id);  // recomputed from position 0 when readmitted
  if (sch.chunks.empty()) return touched;
  ++steps;
  std::set<uint64_t> stepped;  // the requests of this step's chunks
  for (const auto& c : sch.chunks) stepped.insert(c.seq->request);
  c10::NoGradGuard no_grad;
  at::Tensor logits, logprobs;
  std::vector<Draw> draws;
  try {
    for (auto [src, dst] : sch.copies) {
      const auto bs = cfg.block_size;
      for (size_t l = 0; l < k_cache.size(); ++l) {
        if (!k_cache[l].defined()) continue;  // a Gated DeltaNet layer
        k_cache[l].narrow(0, dst * bs, bs).copy_(k_cache[l].narrow(0, src * bs, bs));
        v_cache[l].narrow(0, dst * bs, bs).copy_(v_cache[l].narrow(0, src * bs, bs));
      }
    }
    auto rows = build_rows(sch);
    schedule_seconds += since(t0);
    t0 = clock::now();
    // Routing replay: the step records its routes when a request asks.
    RouterRecord routed;
    bool want_routes = false;
    for (const auto* c : rows.order) want_routes |= requests.at(c->seq->request).params.return_routes;
    auto hidden = forward(rows, want_routes ? &routed : nullptr);
    // Rows whose logits are needed: the last of a chunk that completes its
    // sequence's known tokens (the next token), and prompt positions of
    // requests that asked for prompt log-probabilities.
    std::vector<int64_t> need;
    std::vector<int64_t> next_row(rows.order.size(), -1), prompt_row(rows.order.size(), -1);
    for (size_t k = 0; k < rows.order.size(); ++k) {
      const auto* c = rows.order[k];
      const auto& req = requests.at(c->seq->request);
      if (req.params.prompt_logprobs >= 0 && c->begin < c->seq->prompt_len - 1) {
        prompt_row[k] = static_cast<int64_t>(need.size());
        const int64_t last = std::min(c->begin + c->count, c->seq->prompt_len - 1);
        for (int64_t p = c->begin; p < last; ++p) need.push_back(rows.first_row[k] + p - c->begin);
      }
      if (c->completes() && req.params.max_tokens > 0) {
        next_row[k] = static_cast<int64_t>(need.size());
        need.push_back(rows.first_row[k] + c->count - 1);
      }
    }
    if (!need.empty()) {
      logits = head(hidden, need, rows.adapters).to(at::kFloat);
      logprobs = at::log_softmax(logits, 1);
    }
    forward_seconds += since(t0);
    t0 = clock::now();
    sched->commit(sch);
    // Prompt log-probabilities first (the prompt's order), then the draws.
    for (size_t k = 0; k < rows.order.size(); ++k) {
      const auto* c = rows.order[k];
      auto& req = requests.at(c->seq->request);
      if (c->seq->sample == 0) req.out.cached_tokens = c->seq->cached_tokens;
      if (prompt_row[k] >= 0) {
        const int64_t last = std::min(c->begin + c->count, c->seq->prompt_len - 1);
        for (int64_t p = c->begin; p < last; ++p) {
          if (p < req.prompt_logprobs_done) continue;  // recomputed after a preemption, or a fork's
          record(req.out.prompt_logprobs, logprobs[prompt_row[k] + p - c->begin], req.out.prompt[static_cast<size_t>(p + 1)],
                 req.params.prompt_logprobs);
          req.prompt_logprobs_done = p + 1;
        }
      }
      if (next_row[k] < 0) continue;
      const int32_t sample = seq_owner.at(c->seq->id).second;
      if (!req.forked && req.params.num_samples > 1) {
        for (int32_t s = 0; s < req.params.num_samples; ++s)
          draws.push_back({&req, s, next_row[k], &c->seq->tokens});
      } else {
        draws.push_back({&req, sample, next_row[k], &c->seq->tokens});
      }
    }
    sample(draws, logits);
    if (want_routes) {
      // [rows, sparse layers, k] of the step; each draw takes its logits row's.
      std::vector<at::Tensor> chosen;
      for (const auto& l : routed.layers) chosen.push_back(l.chosen);
      step_routes = at::stack(chosen, 1).to(at::kInt).contiguous();
      for (auto& d : draws) d.route_row = need[static_cast<size_t>(d.row)];
    }
  } catch (const std::exception& e) {
    // Nothing of the step is trusted: its requests end as aborted, and the
    // blocks it registered may hold garbage.
    sched->reset_prefix_cache();
    for (auto id : stepped) abort_request(requests.at(id));
    apply_due_updates();
    return make_error(errc::internal, std::string{"sampler step failed (its requests were aborted): "} + e.what());
  }
  // Forks first (they copy the parent's prompt before its first token lands).
  for (auto& d : draws) {
    if (d.sample != 0 || d.req->forked || d.req->params.num_samples <= 1) continue;
    auto& parent = *d.req->seqs[0].seq;
    auto kids = sched->fork(parent, static_cast<int32_t>(d.req->params.num_samples));
    for (size_t j = 0; j < kids.size(); ++j) {
      fork_state(parent, *kids[j]);
      d.req->seqs[j + 1].seq = kids[j];
      seq_owner[kids[j]->id] = {d.req->id, static_cast<int32_t>(j + 1)};
    }
    d.req->forked = true;
  }
  for (auto& d : draws) append(*d.req, d.sample, d.token, logprobs[d.row], d.route_row);
  sample_seconds += since(t0);
  // Prompt-only requests (max_tokens 0) end when their prompt is done.
  for (auto id : stepped) {
    auto& req = requests.at(id);
    if (req.params.max_tokens == 0 && !req.out.finished && req.seqs[0].seq &&
        req.seqs[0].seq->num_computed == req.seqs[0].seq->prompt_len)
      for (int32_t k = 0; k < static_cast<int32_t>(req.out.sequences.size()); ++k) finish(req, k, StopReason::length);
    touched.push_back(id);
  }
  apply_due_updates();  // those whose last requests this step finished: not left for a step that may not come
  return touched;
}

void Engine::Impl::apply_update(PendingUpdate&& u) {
  for (auto& [name, t] : u.tensors) {
    if (u.adapter.empty()) {
      lm().params.at(name).copy_(t);
    } else {
      auto params = model.adapter_parameters(u.adapter);
      for (auto& [n, w] : *params)
        if (n == name) to_torch(w).copy_(t);
    }
  }
  version = std::max(version, u.version);
  versions[u.adapter] = {++updates_applied, u.version};
  if (u.adapter.empty()) pack_weights();
  if (sched) sched->reset_prefix_cache();  // asleep: no cache (wake makes a fresh one)
}

// -- Engine ---------------------------------------------------------------------------

Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

Result<Engine> Engine::create(CausalLM model, const EngineConfig& cfg, std::optional<Tokenizer> tokenizer) try {
  if (auto ok = cfg.validate(); !ok) return ok.error();
  if (auto ok = model.impl().have_parameters("a sampler engine"); !ok) return ok.error();  // sharded: not servable
  const auto& c = model.config();
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  impl->max_len = cfg.max_model_len > 0 ? cfg.max_model_len : c.max_position_embeddings;
  const int64_t attention_layers = c.layers_of(TokenMixer::attention);
  // Gated DeltaNet layers (Qwen3.5) keep per sequence a conv window and a
  // delta-rule state of fixed size, whatever its length: a slot per
  // sequence that may run at once, taken from the budget first (at most
  // half of it: the rest is the attention layers' KV blocks).
  int64_t kv_bytes = cfg.cache_bytes;
  if (c.has_linear_attention()) {
    impl->state_bytes_per_sequence =
        c.layers_of(TokenMixer::gated_deltanet) * c.linear_attention.state_elements() * 4;  // f32
    impl->state_slots = std::min<int64_t>(cfg.max_num_seqs, cfg.cache_bytes / 2 / impl->state_bytes_per_sequence);
    if (impl->state_slots < 1)
      return make_error(errc::invalid_argument,
                        "cache_bytes " + std::to_string(cfg.cache_bytes) + " cannot hold the Gated DeltaNet state of "
                        "one sequence beside its KV cache: each sequence takes " +
                            std::to_string(impl->state_bytes_per_sequence) + " bytes (conv windows and recurrent "
                            "states of " + std::to_string(c.layers_of(TokenMixer::gated_deltanet)) +
                            " layers) and the state gets at most half of cache_bytes; raise cache_bytes");
    if (impl->state_slots < cfg.max_num_seqs)
      log::info("sampler: cache_bytes holds the Gated DeltaNet state of " + std::to_string(impl->state_slots) +
                " sequences at once (" + std::to_string(impl->state_bytes_per_sequence) +
                " bytes each, half the budget), fewer than max_num_seqs " + std::to_string(cfg.max_num_seqs) +
                ": at most that many run together (raise cache_bytes for more)");
    impl->cfg.max_num_seqs = impl->state_slots;
    kv_bytes -= impl->state_slots * impl->state_bytes_per_sequence;
    // A cached prefix's KV blocks are of no use without the linear layers'
    // state at the same position, which would take a snapshot per block
    // (docs/sampler.md): prefix caching is off for these models.
    impl->cfg.enable_prefix_caching = false;
  }
  const int64_t block_bytes = 2 * attention_layers * cfg.block_size * c.num_key_value_heads * c.head_dim * 4;
  // A model without attention layers keeps no KV (its blocks are 0 bytes):
  // the blocks only count each sequence's tokens for the scheduler.
  const int64_t blocks = attention_layers > 0
                             ? kv_bytes / block_bytes
                             : impl->cfg.max_num_seqs * ((impl->max_len + cfg.block_size - 1) / cfg.block_size);
  if (blocks < 1)
    return make_error(errc::invalid_argument, "cache_bytes " + std::to_string(cfg.cache_bytes) +
                                                  " holds no KV-cache block: one block of " +
                                                  std::to_string(cfg.block_size) + " tokens takes " +
                                                  std::to_string(block_bytes) + " bytes for this model");
  impl->num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max() / cfg.block_size));
  // Refused before it is allocated: a cache past the machine's memory would
  // die in LibTorch's allocator (or the kernel's OOM killer) instead.
  if (auto ok = check_memory(static_cast<double>(impl->num_blocks) * static_cast<double>(block_bytes) +
                                 static_cast<double>(impl->state_slots * impl->state_bytes_per_sequence),
                             "the sampler's KV cache (cache_bytes: lower it, or the prompts, samples and tokens "
                             "it was sized for)");
      !ok)
    return ok.error();
  impl->model = std::move(model);
  impl->tokenizer = std::move(tokenizer);
  impl->seeds.seed(cfg.seed);
  impl->allocate_cache();
  impl->pack_weights();
  Engine e;
  e.impl_ = std::move(impl);
  return e;
} catch (const std::exception& e) {
  return make_error(errc::resource_exhausted, std::string{"cannot allocate the KV cache: "} + e.what());
}

Result<Engine> Engine::load(const std::string& dir, const EngineConfig& cfg) {
  auto lm = CausalLM::load(dir);
  if (!lm) return lm.error();
  std::optional<Tokenizer> tok;
  if (auto path = fs::path{dir} / "tokenizer.json"; fs::exists(path)) {
    auto t = Tokenizer::load(path.string());
    if (!t) return t.error();
    tok = std::move(*t);
  }
  return create(std::move(*lm), cfg, std::move(tok));
}

Result<uint64_t> Engine::add_request(std::vector<int64_t> prompt, const SamplingParams& params,
                                     const std::string& adapter) {
  auto& m = *impl_;
  if (auto ok = m.check_request(prompt, params, adapter); !ok) return ok.error();
  Request req;
  req.id = m.next_request++;
  req.params = params;
  req.adapter = adapter;
  const uint64_t seed = params.seed >= 0 ? static_cast<uint64_t>(params.seed) : m.seeds();
  req.out.id = req.id;
  req.out.prompt = prompt;
  req.out.adapter = adapter;
  const auto n = static_cast<size_t>(params.num_samples);
  req.out.sequences.resize(n);
  req.seqs.resize(n);
  for (size_t k = 0; k < n; ++k) req.seqs[k].rng.seed(mix_seed(seed, k));
  for (const auto& s : params.stop) m.max_stop_len = std::max<int64_t>(m.max_stop_len, static_cast<int64_t>(s.size()));
  auto& seq = m.sched->add(req.id, std::move(prompt), m.salt_of(adapter), params.prompt_logprobs < 0,
                           static_cast<int32_t>(n) - 1);
  req.seqs[0].seq = &seq;
  m.seq_owner[seq.id] = {req.id, 0};
  auto id = req.id;
  m.requests.emplace(id, std::move(req));
  return id;
}

void Engine::abort(uint64_t id) {
  auto it = impl_->requests.find(id);
  if (it != impl_->requests.end() && !it->second.out.finished) impl_->abort_request(it->second);
}

bool Engine::has_unfinished() const {
  for (const auto& [id, r] : impl_->requests)
    if (!r.out.finished) return true;
  return false;
}

Result<std::vector<uint64_t>> Engine::step() { return impl_->run_step(); }

const RequestOutput* Engine::output(uint64_t id) const {
  auto it = impl_->requests.find(id);
  return it == impl_->requests.end() ? nullptr : &it->second.out;
}

std::optional<RequestOutput> Engine::take(uint64_t id) {
  auto it = impl_->requests.find(id);
  if (it == impl_->requests.end() || !it->second.out.finished) return std::nullopt;
  auto out = std::move(it->second.out);
  impl_->requests.erase(it);
  return out;
}

std::vector<Result<RequestOutput>> Engine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                    const SamplingParams& params, const std::string& adapter) {
  std::vector<Result<RequestOutput>> out;
  std::vector<uint64_t> ids;
  for (const auto& p : prompts) {
    auto id = add_request(p, params, adapter);
    ids.push_back(id ? *id : 0);
    out.push_back(id ? Result<RequestOutput>{RequestOutput{}} : Result<RequestOutput>{id.error()});
  }
  auto unfinished = [&] {
    for (auto id : ids)
      if (id && !impl_->requests.at(id).out.finished) return true;
    return false;
  };
  // A failed step aborts its requests, which then finish with StopReason::abort.
  while (unfinished()) {
    if (auto ok = check_stop("sampling"); !ok) {  // the driver is gone: stop between steps
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!ids[i]) continue;
        abort(ids[i]);
        (void)take(ids[i]);
        out[i] = ok.error();
      }
      return out;
    }
    (void)step();
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i]) continue;
    auto o = take(ids[i]);
    out[i] = std::move(*o);
  }
  return out;
}

Result<void> Engine::update_weights(const NamedTensors& weights, const std::string& adapter, int64_t version,
                                    UpdatePolicy policy) {
  auto& m = *impl_;
  // An enum from the wire can hold any number.
  if (policy != UpdatePolicy::finish_old && policy != UpdatePolicy::abort && policy != UpdatePolicy::continue_new)
    return make_error(errc::invalid_argument, "update policy " + std::to_string(static_cast<int>(policy)) +
                                                  " is not finish_old, continue_new or abort");
  m.apply_due_updates();
  if (m.pending.size() >= Impl::max_pending)
    return make_error(errc::resource_exhausted,
                      std::to_string(m.pending.size()) + " weight updates (versions " +
                          std::to_string(m.pending.front().version) + " to " + std::to_string(m.pending.back().version) +
                          ") already wait for requests in flight; wait for them (stats: update_pending) before "
                          "sending more");
  PendingUpdate u;
  u.adapter = adapter;
  u.version = version;
  std::map<std::string, Tensor> current;
  if (adapter.empty()) {
    auto p = m.model.named_parameters();
    if (!p) return p.error();
    for (auto& [n, t] : *p) current.emplace(n, t);
  } else {
    auto p = m.model.adapter_parameters(adapter);
    if (!p) return p.error();
    for (auto& [n, t] : *p) current.emplace(n, t);
  }
  std::vector<std::string> problems;
  for (const auto& [name, t] : weights) {
    auto it = current.find(name);
    if (it == current.end()) {
      problems.push_back("unknown tensor " + name);
      continue;
    }
    if (t.shape() != it->second.shape()) {
      problems.push_back(name + " is " + t.describe() + ", the sampler's is " + it->second.describe());
      continue;
    }
    if (t.dtype() != Dtype::f32 && t.dtype() != Dtype::bf16 && t.dtype() != Dtype::f16) {
      problems.push_back(name + " is " + t.describe() + ", not floating point");
      continue;
    }
    u.tensors[name] = to_torch(t);  // read now, or copied below if the update must wait
  }
  if (!problems.empty())
    return make_error(errc::invalid_argument, "weight update rejected (nothing changed): " + join(problems, "; "));
  if (policy == UpdatePolicy::abort)
    for (auto& [id, r] : m.requests)
      if (!r.out.finished && u.touches(r.adapter)) m.abort_request(r);
  // finish_old waits for the requests admitted so far that it touches; the
  // others only for the updates already waiting that change the same
  // weights, then apply before the next step, whatever runs.
  u.wait_below = policy == UpdatePolicy::finish_old ? m.next_request : 0;
  u.hold_from = m.next_request;
  m.apply_due_updates();
  m.pending.push_back(std::move(u));
  if (m.waits(m.pending.size() - 1)) {
    // The caller's tensors may change once we return: keep our own copy.
    for (auto& [name, t] : m.pending.back().tensors) t = t.to(at::kFloat, false, /*copy=*/true);
  } else {
    auto now = std::move(m.pending.back());
    m.pending.pop_back();
    m.apply_update(std::move(now));  // one copy, straight into the weights
  }
  return {};
}

bool Engine::update_pending() const { return !impl_->pending.empty(); }
int64_t Engine::weight_version() const { return impl_->version; }

Result<void> Engine::add_adapter(const std::string& name, const LoraConfig& cfg) {
  return impl_->model.add_adapter(name, cfg);
}
Result<void> Engine::load_adapter(const std::string& name, const std::string& dir) {
  return impl_->model.load_adapter(name, dir);
}
Result<void> Engine::remove_adapter(const std::string& name) {
  for (const auto& [id, r] : impl_->requests)
    if (!r.out.finished && r.adapter == name)
      return make_error(errc::failed_precondition, "adapter '" + name + "' is in use by request " + std::to_string(id));
  for (const auto& u : impl_->pending)
    if (u.adapter == name)
      return make_error(errc::failed_precondition, "adapter '" + name + "' has a weight update (version " +
                                                       std::to_string(u.version) + ") waiting for requests in flight");
  if (auto ok = impl_->model.remove_adapter(name); !ok) return ok;
  impl_->versions.erase(name);
  return {};
}
std::vector<std::string> Engine::adapters() const { return impl_->model.adapters(); }

void Engine::reset_prefix_cache() {
  if (impl_->sched) impl_->sched->reset_prefix_cache();
}

Result<void> Engine::sleep() {
  auto& m = *impl_;
  if (m.asleep) return {};
  if (has_unfinished())
    return make_error(errc::failed_precondition, "requests are in flight: wait for them or abort them before sleep");
  m.apply_due_updates();  // none waits for anything now
  m.k_cache.clear();
  m.v_cache.clear();
  m.linear_state.clear();
  m.sched.reset();
  m.asleep = true;
  return {};
}

Result<void> Engine::wake() try {
  auto& m = *impl_;
  if (!m.asleep) return {};
  m.allocate_cache();
  m.asleep = false;
  return {};
} catch (const std::exception& e) {
  return make_error(errc::resource_exhausted, std::string{"cannot allocate the KV cache: "} + e.what());
}

bool Engine::sleeping() const { return impl_->asleep; }

EngineStats Engine::stats() const {
  const auto& m = *impl_;
  EngineStats s;
  s.num_blocks = m.num_blocks;
  s.block_size = m.cfg.block_size;
  s.state_slots = m.state_slots;
  s.state_bytes_per_sequence = m.state_bytes_per_sequence;
  s.steps = m.steps;
  s.generated_tokens = m.generated;
  s.schedule_seconds = m.schedule_seconds;
  s.forward_seconds = m.forward_seconds;
  s.sample_seconds = m.sample_seconds;
  if (m.sched) {
    s.free_blocks = m.sched->pool().num_free();
    const auto& st = m.sched->stats();
    s.prompt_tokens = st.prompt_tokens;
    s.cached_tokens = st.cached_tokens;
    s.preemptions = st.preemptions;
    s.recomputed_tokens = st.recomputed_tokens;
    s.running = static_cast<int64_t>(m.sched->num_running());
    s.waiting = static_cast<int64_t>(m.sched->num_waiting());
  }
  return s;
}

const EngineConfig& Engine::config() const { return impl_->cfg; }
const CausalLM& Engine::model() const { return impl_->model; }
const Tokenizer* Engine::tokenizer() const { return impl_->tokenizer ? &*impl_->tokenizer : nullptr; }
int64_t Engine::max_model_len() const { return impl_->max_len; }

}  // namespace glint::components
