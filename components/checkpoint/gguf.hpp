#pragma once
/// GGUF, the file format of ggml and llama.cpp: metadata key/values, then
/// tensor descriptions, then the tensors' bytes, each aligned.
///
///   GgufFile f;
///   f.metadata.push_back({"general.architecture", std::string{"llama"}});
///   f.tensors.push_back({.name = "token_embd.weight", .shape = {vocab, hidden}, .dtype = Dtype::f16,
///                        .data = [&] { return embeddings_in_f16(); }});
///   write_gguf("model.gguf", f);              // atomically: temporary, fsync, rename
///   auto back = read_gguf_header("model.gguf");  // metadata and tensor descriptions
///
/// Version 3, little-endian, alignment 32 (general.alignment when set).
/// Shapes here are row-major, as everywhere in glint ({rows, columns});
/// the file stores ggml's `ne`, fastest dimension first, and the writer and
/// reader turn one into the other. Tensors are F32, F16 or BF16 (glint
/// writes no quantized types). Each tensor's bytes are asked for only when
/// it is written, so a model is never held twice in memory.

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace glint::components {

/// A metadata value: the GGUF scalar and array types glint writes.
using GgufValue = std::variant<uint32_t, int32_t, uint64_t, float, bool, std::string, std::vector<std::string>,
                               std::vector<int32_t>, std::vector<float>>;

struct GgufTensor {
  std::string name;
  std::vector<int64_t> shape;  ///< row-major
  Dtype dtype = Dtype::f32;    ///< f32, f16 or bf16: the type in the file
  /// The bytes, as a tensor of `dtype` and `shape`, asked for once while
  /// writing (the reader leaves it empty).
  std::function<Result<Tensor>()> data;
  uint64_t offset = 0;  ///< the reader's: from the start of the data section
};

struct GgufFile {
  std::vector<std::pair<std::string, GgufValue>> metadata;
  std::vector<GgufTensor> tensors;
  uint32_t alignment = 32;
  uint64_t data_offset = 0;  ///< the reader's: where the data section starts in the file

  /// The value of `key`, or null.
  const GgufValue* find(const std::string& key) const;
};

/// Writes `file` to `path`. Called after each tensor is written with how
/// many are done, for a progress bar. Refused: a duplicate key or tensor
/// name, a dtype other than f32/f16/bf16, tensor bytes that do not match
/// the declared dtype and shape.
Result<void> write_gguf(const std::string& path, const GgufFile& file,
                        const std::function<void(size_t done)>& progress = {});

/// Reads the metadata and tensor descriptions of a GGUF file (version 3),
/// checking that every tensor lies inside the file. It reads the value
/// types glint writes (u32, i32, u64, f32, bool, string, and arrays of
/// string, i32 and f32); another type is an error naming the key, as is a
/// truncated or inconsistent file. For glint's own checks: tests read the
/// files glint writes with llama.cpp's reader too.
Result<GgufFile> read_gguf_header(const std::string& path);

/// ggml's type numbers.
uint32_t ggml_type_of(Dtype d);
Result<Dtype> dtype_of_ggml_type(uint32_t type);

}  // namespace glint::components
