#pragma once
// Between glint's own value types and the wire structs of glint.capnp (rpc's
// own: no other layer sees capnp). Writers fill a builder; readers validate
// as they read, so a malformed message is an error naming the field, never
// a crash or a silently changed value.
//
// Tensors: given `keep`, a writer hands a tensor's buffer to Cap'n Proto
// without a copy when it can (8-byte aligned, a whole number of words) and
// puts the tensor in `keep`, which the caller holds until the message is
// written (the client: until the call's answer came, which the server can
// only send after reading the whole request); without, it copies. Readers
// copy the bytes once out of the connection's buffer, which only the I/O
// thread may hold.

#include "actors/model.hpp"
#include "actors/sampler.hpp"
#include "runtime/batch.hpp"
#include "runtime/tensor.hpp"
#include "rpc/glint.capnp.h"

#include <string>
#include <vector>

namespace glint::rpc {

using actors::LoraConfig;
using actors::LossKind;
using actors::LossSpec;
using actors::OptimizerConfig;
using actors::SampledSequence;
using actors::SampleRequest;
using actors::SamplingParams;
using actors::SchedulerConfig;
using actors::StopReason;
using actors::TokenLogprobs;

/// What a message references without a copy: hold it until the message is sent.
using KeepAlive = std::vector<Tensor>;

/// A string as Cap'n Proto text, every byte of it, for every setter given a
/// std::string. KJ's implicit conversion from std::string goes through
/// c_str() and ends it at its first NUL: a stop string, prompt or adapter
/// name "a\0b" would reach the other end as "a".
capnp::Text::Reader as_text(const std::string& s);

/// A built message's bytes, as it would be sent (equal values, equal bytes).
std::string message_bytes(capnp::MessageBuilder& m);

// -- status -----------------------------------------------------------------
void write_status(wire::Status::Builder b, const caf::error& err);
/// none for code 0; else the error the server sent (code and message).
caf::error read_status(wire::Status::Reader r);

// -- tensors and batches ----------------------------------------------------
void write_tensor(wire::Tensor::Builder b, const Tensor& t, KeepAlive* keep);
Result<Tensor> read_tensor(wire::Tensor::Reader r, const std::string& what);
void write_named(capnp::List<wire::NamedTensor>::Builder b, const NamedTensors& ts, KeepAlive* keep);
Result<NamedTensors> read_named(capnp::List<wire::NamedTensor>::Reader r, const std::string& what);
void write_batch(wire::Batch::Builder b, const Batch& batch, KeepAlive* keep);
Result<Batch> read_batch(wire::Batch::Reader r);
void write_metrics(capnp::List<wire::Metric>::Builder b, const Metrics& m);
Result<Metrics> read_metrics(capnp::List<wire::Metric>::Reader r);

/// A directory's regular files (no subdirectories), as `File`s; and back.
struct FileBytes {
  std::string name;
  std::string data;
};
Result<std::vector<FileBytes>> read_dir_files(const std::string& dir);
void write_files(capnp::List<wire::File>::Builder b, const std::vector<FileBytes>& files);
/// Validates names (plain, no '/', no "..", at most 128 bytes) and count.
Result<std::vector<FileBytes>> read_files(capnp::List<wire::File>::Reader r);
/// Writes them into `dir` (created; existing files of those names replaced).
Result<void> write_dir_files(const std::string& dir, const std::vector<FileBytes>& files);

// -- settings ---------------------------------------------------------------
void write_lora(wire::LoraConfig::Builder b, const LoraConfig& c);
Result<LoraConfig> read_lora(wire::LoraConfig::Reader r);
void write_optimizer(wire::OptimizerConfig::Builder b, const OptimizerConfig& c);
Result<OptimizerConfig> read_optimizer(wire::OptimizerConfig::Reader r);
void write_scheduler(wire::SchedulerConfig::Builder b, const SchedulerConfig& c);
Result<SchedulerConfig> read_scheduler(wire::SchedulerConfig::Reader r);
void write_loss(wire::LossSpec::Builder b, const LossSpec& c);
Result<LossSpec> read_loss(wire::LossSpec::Reader r);
void write_sampling(wire::SamplingParams::Builder b, const SamplingParams& p);
Result<SamplingParams> read_sampling(wire::SamplingParams::Reader r);

// -- sampling ---------------------------------------------------------------
void write_requests(capnp::List<wire::SampleRequest>::Builder b, const std::vector<SampleRequest>& rs);
/// Token ids checked against `vocab_size` (0: not checked).
Result<std::vector<SampleRequest>> read_requests(capnp::List<wire::SampleRequest>::Reader r, int64_t vocab_size);
void write_sequences(capnp::List<wire::SampledSequence>::Builder b, const std::vector<SampledSequence>& seqs);
Result<std::vector<SampledSequence>> read_sequences(capnp::List<wire::SampledSequence>::Reader r);

/// A name a tenant gives an adapter: 1-64 bytes of [A-Za-z0-9._-], not "."
/// or "..". `what` names the field in the error.
Result<std::string> read_name(capnp::Text::Reader r, const std::string& what);

}  // namespace glint::rpc
