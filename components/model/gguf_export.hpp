#pragma once
/// Export of a Hugging Face model directory (Llama, Qwen2, Qwen3) to GGUF,
/// so that a model trained with glint runs in llama.cpp and the tools built
/// on it (Ollama, LM Studio, node-llama-cpp, ...):
///
///   auto done = export_gguf("models/arith", "arith.gguf", {.dtype = Dtype::f16});
///
/// What llama.cpp's convert_hf_to_gguf.py writes for these models, done
/// here: the architecture's hyperparameters under `<arch>.*`, tensors under
/// ggml's names (blk.N.attn_q.weight, ...), Llama's q and k rows reordered
/// for ggml's interleaved RoPE (Qwen's NeoX RoPE needs no reordering),
/// Llama 3.1's RoPE scaling as a rope_freqs tensor, one-dimensional tensors
/// (norms, biases) in f32 whatever the dtype, no output.weight for tied
/// embeddings, and the tokenizer: tokens, token types, merges, the
/// pre-tokenizer's name, special token ids, add_bos_token and the chat
/// template. A vocabulary smaller than the model's is padded with
/// [PAD<id>] tokens of type unused, as the converter does.
///
/// Refused with an error that says why, never written half-right: what
/// llama.cpp's architecture would compute otherwise (an activation other
/// than SiLU, sliding-window layers, biases the architecture lacks),
/// tokenizers other than byte-level BPE, a
/// pre-tokenizer llama.cpp does not know by name, a normalizer other than
/// NFC, a tokenizer with ids past the model's vocabulary.

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace glint::components {

struct GgufExportOptions {
  /// The type of the matrices (f32, f16 or bf16); empty: the model's stored
  /// dtype (config.json's torch_dtype), which loses nothing.
  std::optional<Dtype> dtype{};
  /// A PEFT LoRA adapter directory to merge into the weights first (W +
  /// scaling * B A), so the file computes the trained model; empty: none.
  std::string adapter{};
  /// Where tokenizer.json (and tokenizer_config.json) are; empty: the model
  /// directory. A model without one is refused: llama.cpp needs its
  /// vocabulary.
  std::string tokenizer{};
  /// general.name; empty: the model directory's name.
  std::string name{};
  /// Called after each tensor is written (done, total).
  std::function<void(size_t done, size_t total)> progress{};
};

struct GgufExportSummary {
  std::string architecture;   ///< "llama", "qwen2", "qwen3"
  Dtype dtype = Dtype::f32;   ///< of the matrices
  size_t tensors = 0;
  uint64_t bytes = 0;         ///< of the file
  int64_t vocab = 0;          ///< tokens in the file
  int64_t padded_tokens = 0;  ///< [PAD] tokens added to reach the model's vocabulary
  std::string pre_tokenizer;  ///< tokenizer.ggml.pre
};

/// Writes `out` (atomically) from the model directory `model_dir`.
Result<GgufExportSummary> export_gguf(const std::string& model_dir, const std::string& out,
                                      const GgufExportOptions& options = {});

}  // namespace glint::components
