#pragma once
// A model directory's identity, so a remote driver can check that the
// server's base model is the one it would otherwise load: SHA-256 (hex)
// over config.json, tokenizer.json and every *.safetensors file, in name
// order, each as its name, its size and its bytes. It reads every weight
// byte (about 1 s per GB here), once per attach.

#include "runtime/error.hpp"

#include <string>

namespace glint::rpc {

Result<std::string> model_fingerprint(const std::string& model_dir);

}  // namespace glint::rpc
