# glint's remote-mode protocol: what a driver in remote mode (rpc/client.cpp)
# and `glint serve`'s gateway (rpc/server.cpp) say to each other over Cap'n
# Proto RPC (two-party, TCP or TLS). Every field is documented from the side
# that sends it. docs/remote.md has the overview.
#
# Rules for changes (the schema is a wire format):
# - Add fields and methods only at the end, with the next ordinal; never
#   renumber, retype or remove one (mark it unused instead).
# - A change a server or client of the previous version would misread (a new
#   meaning of an existing field, a field that must be honoured) raises
#   `protocolVersion`; `Gateway.connect` refuses a client whose version the
#   server does not speak, with the two versions in the message.
# - Optional values use an explicit `hasX` flag or a documented sentinel,
#   never "zero means unset" for a number zero is valid for.
#
# Trust: the server validates every field of every message (sizes, shapes,
# dtypes, token ids, names) before it reaches an actor; a client never has
# to be trusted.

@0xe94e52df319755a8;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("glint::rpc::wire");

const protocolVersion :UInt32 = 1;
# The version this schema describes. Sent by the client in `connect`.

# -- values -----------------------------------------------------------------

struct Status {
  # The outcome of a call, set by the server in every result. `code` 0 (ok):
  # the other result fields hold the answer; anything else: they are unset
  # and `message` says what went wrong and what to do.
  code @0 :UInt16;
  # glint's errc (runtime/error.hpp): 1 invalid_argument, 2 not_found,
  # 3 failed_precondition, 4 unavailable, 5 resource_exhausted, 6 aborted,
  # 7 permission_denied, 8 unimplemented, 9 deadline_exceeded, 10 internal.
  message @1 :Text;
}

struct Tensor {
  # A dense, row-major tensor.
  dtype @0 :UInt8;
  # glint's Dtype: 0 f32, 1 bf16, 2 f16, 3 i64, 4 i32, 5 u8, 6 bool, 7 f64.
  shape @1 :List(Int64);
  # At most 8 dimensions, each >= 0.
  data @2 :Data;
  # Exactly product(shape) * element size bytes, little-endian. The sender
  # hands its buffer to Cap'n Proto without a copy when it is 8-byte aligned
  # and a whole number of words long; the receiver reads it in place.
}

struct NamedTensor {
  name @0 :Text;
  tensor @1 :Tensor;
}

struct Field {
  # A per-sample text column of a batch.
  name @0 :Text;
  values @1 :List(Text);
  # One per sample.
}

struct Batch {
  # A training batch: named tensors whose dim 0 is the sample (input_ids
  # required; attention_mask, position_ids, segment_ids, target_ids,
  # loss_mask, old_logps, ref_logps, advantages as components/model/trainer.hpp
  # defines them), and per-sample text fields.
  tensors @0 :List(NamedTensor);
  fields @1 :List(Field);
}

struct Metric {
  name @0 :Text;
  value @1 :Float64;
}

struct File {
  # One file of a saved directory (an adapter in PEFT layout, its optimizer
  # state): a plain name (no directory part) and its bytes.
  name @0 :Text;
  data @1 :Data;
}

struct LoraConfig {
  # A LoRA adapter's shape, as PEFT's adapter_config.json describes it
  # (components/model/lora_config.hpp).
  r @0 :Int64;
  alpha @1 :Float64;
  dropout @2 :Float64;
  targetModules @3 :List(Text);
  # Module names or suffixes; ["all-linear"]: every projection.
  rslora @4 :Bool;
  targetRegex @5 :Text;
  # When not empty, used instead of targetModules (a whole-path match).
  rankPattern @6 :List(PatternRank);
  alphaPattern @7 :List(PatternAlpha);
  layersToTransform @8 :List(Int64);
  layersPattern @9 :List(Text);
  excludeModules @10 :List(Text);
  excludeRegex @11 :Text;

  struct PatternRank { pattern @0 :Text; r @1 :Int64; }
  struct PatternAlpha { pattern @0 :Text; alpha @1 :Float64; }
}

struct OptimizerConfig {
  kind @0 :UInt8;
  # 0 adamw, 1 sgd.
  lr @1 :Float64;
  weightDecay @2 :Float64;
  beta1 @3 :Float64;
  beta2 @4 :Float64;
  eps @5 :Float64;
  momentum @6 :Float64;
  maxGradNorm @7 :Float64;
  # clipGradAndStep clips to this global norm; 0 disables clipping.
  keepState @8 :Bool;
  # setOptimizer: keep the moments and step count of an optimizer of the
  # same kind (new hyperparameters only); false (an older client): a fresh one.
}

struct SchedulerConfig {
  kind @0 :UInt8;
  # 0 constant, 1 linear, 2 cosine.
  warmupSteps @1 :Int64;
  totalSteps @2 :Int64;
  minLrRatio @3 :Float64;
}

struct LossSpec {
  kind @0 :UInt8;
  # 0 cross_entropy, 1 grpo, 2 gspo, 3 dr_grpo, 4 cispo, 5 dpo, 6 ipo,
  # 7 importance_sampling, 8 ppo, 9 dro, 10 decoupled_ppo.
  epsilon @1 :Float64;
  epsilonHigh @2 :Float64;
  beta @3 :Float64;
  entropyCoef @4 :Float64;
  maxTokens @5 :Int64;
  labelSmoothing @6 :Float64;
  # dpo only; an older client leaves it 0.
  reduction @7 :UInt8;
  # 0 mean (glint's normalisation; what an older client means), 1 sum (the
  # token-level losses as Tinker defines them: components/model/trainer.hpp).
  weightCap @8 :Float64 = 5.0;
  # decoupled_ppo only (kind 10): the behaviour weight's cap.
  capMode @9 :UInt8;
  # decoupled_ppo only: 0 mask, 1 clamp.
}

struct SamplingParams {
  # As components/sampler/params.hpp: the server applies every field.
  numSamples @0 :Int64;
  maxTokens @1 :Int64;
  temperature @2 :Float64;
  topK @3 :Int64;
  topP @4 :Float64;
  minP @5 :Float64;
  repetitionPenalty @6 :Float64;
  seed @7 :Int64;
  # -1: no seed (the server's sampling stream).
  stopTokenIds @8 :List(Int64);
  stop @9 :List(Text);
  includeStopStrInOutput @10 :Bool;
  ignoreEos @11 :Bool;
  logprobs @12 :Int64;
  # Top-k log-probabilities per completion token; -1: none.
  promptLogprobs @13 :Int64;
  # -1: none; 0: the chosen prompt tokens'; k > 0: also the top k.
  returnRoutes @14 :Bool;
  # Each completion token's experts (a model with experts): SampledSequence.routes.
}

struct SampleRequest {
  index @0 :Int64;
  # The caller's id for the prompt, echoed in its sequences.
  prompt @1 :List(Int64);
  # Token ids, each in [0, vocabulary size).
}

struct TokenLogprobs {
  chosen @0 :List(Float32);
  k @1 :Int64;
  topIds @2 :List(Int64);
  topLogprobs @3 :List(Float32);
}

struct ExpertRoutes {
  # components/sampler/params.hpp's ExpertRoutes: experts[(t * layers + s) * k + j].
  layers @0 :Int64;
  k @1 :Int64;
  experts @2 :List(Int32);
}

struct SampledSequence {
  # One completion, sent by the server (actors/sampler.hpp's SampledSequence).
  index @0 :Int64;
  sample @1 :Int64;
  error @2 :Text;
  tokens @3 :List(Int64);
  logprobs @4 :TokenLogprobs;
  stopReason @5 :UInt8;
  # 0 none, 1 length, 2 stop, 3 abort.
  stopToken @6 :Int64;
  stopString @7 :Text;
  text @8 :Text;
  weightVersion @9 :Int64;
  promptLogprobs @10 :TokenLogprobs;
  cachedTokens @11 :Int64;
  firstWeightVersion @12 :Int64 = -1;
  # -1 from an older server: its tokens all have weightVersion.
  routes @13 :ExpertRoutes;
}

struct BaseInfo {
  # What the server hosts, sent at connect.
  name @0 :Text;
  # The base model's name (its directory's last component, or the config's).
  fingerprint @1 :Text;
  # SHA-256 (hex) over the base's config.json, tokenizer.json and weight
  # files, in name order: a client holding the same directory computes the
  # same value (rpc/fingerprint.hpp).
  modelRanks @2 :Int32;
  samplerRanks @3 :Int32;
  vocabSize @4 :Int64;
}

struct Limits {
  # The tenant's limits, as the server's configuration sets them.
  maxAdapters @0 :Int64;
  maxRank @1 :Int64;
  maxTokensPerCall @2 :Int64;
  maxCallsInFlight @3 :Int64;
  maxMessageBytes @4 :Int64;
  idleSeconds @5 :Int64;
  # A tenant silent this long has its adapters freed (its checkpoints
  # stay): the client sends a heartbeat at a third of it.
}

# -- interfaces -------------------------------------------------------------

interface Gateway {
  # The server's bootstrap capability: the only thing an unauthenticated
  # peer can call.
  connect @0 (protocolVersion :UInt32, apiKey :Text, client :Text)
      -> (status :Status, session :Session, base :BaseInfo, limits :Limits, tenant :Text,
          serverVersion :UInt32);
  # protocolVersion: the client's `protocolVersion`. apiKey: a key made by
  # `glint serve keys create`. client: a free-form description for the logs
  # (program, host), at most 256 bytes. A wrong or revoked key answers
  # permission_denied, after the same delay as a right one.
}

interface Session {
  # One authenticated connection of a tenant. Adapter names are the tenant's
  # own: two tenants may both call theirs "default"; neither can name the
  # other's. Calls of one session run in the order they were sent; the
  # calls the model group serves take turns with other tenants' (round
  # robin by call).
  #
  # An empty `adapter` names the base model. Reading it (forwardOnly,
  # sample) is always allowed. Training, saving, loading, exporting or
  # syncing it is refused (permission_denied) unless the server runs with
  # full_training = "exclusive": then the first such call, made while no
  # other tenant has adapters or calls, gives the server to this tenant
  # alone until its last connection closes (or it goes idle); meanwhile
  # other tenants' calls answer unavailable, and afterwards the base's
  # weights and the samplers are restored before anyone is served.

  heartbeat @0 () -> (status :Status);
  # Keeps the session's adapters resident; the server frees the memory of a
  # tenant silent for longer than its idle limit (checkpoints stay).

  addAdapter @1 (name :Text, lora :LoraConfig, seed :UInt64) -> (status :Status);
  # A new LoRA adapter on the base model in the model group (A drawn from
  # seed, B zero). Names: 1-64 bytes of [A-Za-z0-9._-].
  removeAdapter @2 (name :Text) -> (status :Status);
  setLoss @3 (adapter :Text, loss :LossSpec) -> (status :Status);
  setOptimizer @4 (adapter :Text, optimizer :OptimizerConfig) -> (status :Status);
  setLrScheduler @5 (adapter :Text, scheduler :SchedulerConfig) -> (status :Status);
  forwardBackward @6 (adapter :Text, batch :Batch, withLogps :Bool)
      -> (status :Status, metrics :List(Metric), logps :Tensor);
  # Accumulates the adapter's gradients of the batch; answers the loss's
  # metrics, and with withLogps the f32 [B, T] log-probs of the batch's
  # targets under the weights before the call (0 where no target).
  forwardOnly @7 (adapter :Text, batch :Batch) -> (status :Status, logps :Tensor);
  # f32 [B, T] log-probabilities of the batch's targets, no gradients.
  clipGradAndStep @8 (adapter :Text) -> (status :Status, metrics :List(Metric));
  calculateMetric @9 (adapter :Text) -> (status :Status, metrics :List(Metric));
  trainConfigs @10 (adapter :Text) -> (status :Status, json :Text);
  exportWeights @11 (adapter :Text) -> (status :Status, tensors :List(NamedTensor));
  # The adapter's tensors under PEFT's names.
  saveAdapter @12 (adapter :Text, withOptimizer :Bool) -> (status :Status, files :List(File));
  # The adapter as PEFT's save_pretrained writes it (adapter_config.json,
  # adapter_model.safetensors), plus optimizer.safetensors when asked: the
  # client writes them where its driver asked.
  loadAdapter @13 (adapter :Text, files :List(File), withOptimizer :Bool, create :Bool)
      -> (status :Status);
  # Files of a PEFT adapter directory (as saveAdapter answers them). create:
  # a new model-group adapter of that name; else into the existing one (its
  # weights, and optimizer state when withOptimizer).
  sample @14 (adapter :Text, requests :List(SampleRequest), params :SamplingParams)
      -> (status :Status, sequences :List(SampledSequence));
  # adapter empty: the base model. Sequences request by request, num_samples each.
  syncWeights @15 (adapter :Text, samplerAdapter :Text) -> (status :Status, version :Int64);
  # Copies the adapter's trained weights from the model group to the sampler
  # group on the server; answers the version sequences sampled with them report.
  # samplerAdapter: the sampler adapter that receives them (of the same
  # shape, made with samplerAddAdapter); empty: the one named `adapter`.
  samplerStats @16 () -> (status :Status, ranks :List(RankMetrics));
  struct RankMetrics { metrics @0 :List(Metric); }
  listAdapters @17 () -> (status :Status, names :List(Text));
  # The tenant's model-group adapters, by name.
  samplerAddAdapter @18 (name :Text, lora :LoraConfig) -> (status :Status);
  # A LoRA adapter of the sampler group (B zero: the base's output until
  # syncWeights or samplerLoadAdapter brings weights).
  samplerLoadAdapter @19 (name :Text, files :List(File)) -> (status :Status);
  samplerRemoveAdapter @20 (name :Text) -> (status :Status);

  saveCheckpoint @21 (adapter :Text, name :Text, withOptimizer :Bool, ttlSeconds :Int64)
      -> (status :Status, checkpoint :CheckpointInfo);
  # Saves the adapter on the server, durably (it survives a restart, a
  # crash too), as the tenant's checkpoint `name` (a new name).
  # ttlSeconds > 0: the server deletes it that long after it was saved;
  # 0: never.
  listCheckpoints @22 () -> (status :Status, checkpoints :List(CheckpointInfo));
  # The tenant's checkpoints, oldest first.
  loadCheckpoint @23 (name :Text, adapter :Text, create :Bool, withOptimizer :Bool) -> (status :Status);
  # Into a new adapter (create) or an existing one of the tenant's.
  deleteCheckpoint @24 (name :Text) -> (status :Status);
  samplerLoadCheckpoint @25 (name :Text, adapter :Text) -> (status :Status);
  # A new sampler adapter `adapter` holding the weights of the tenant's
  # checkpoint `name` (no upload: the checkpoint is on the server).
}

struct CheckpointInfo {
  # A tenant's server-side checkpoint, as the server describes it.
  name @0 :Text;
  adapter @1 :Text;
  # The adapter it was saved from.
  createdMs @2 :Int64;
  withOptimizer @3 :Bool;
  expiresMs @4 :Int64;
  # When the server deletes it (milliseconds since the epoch); 0: never.
}
