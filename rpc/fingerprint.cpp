#include "rpc/fingerprint.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

namespace glint::rpc {

namespace fs = std::filesystem;

Result<std::string> model_fingerprint(const std::string& model_dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(model_dir, ec)) {
    auto name = e.path().filename().string();
    if (e.is_regular_file() && (name == "config.json" || name == "tokenizer.json" || e.path().extension() == ".safetensors"))
      files.push_back(e.path());
  }
  if (ec) return make_error(errc::not_found, "cannot list the model directory " + model_dir + ": " + ec.message());
  if (files.empty()) return make_error(errc::not_found, model_dir + " holds no config.json or weights");
  std::sort(files.begin(), files.end());
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(size_t{1} << 20);
  for (const auto& f : files) {
    auto head = f.filename().string() + "\n" + std::to_string(fs::file_size(f, ec)) + "\n";
    EVP_DigestUpdate(ctx.get(), head.data(), head.size());
    std::ifstream in{f, std::ios::binary};
    if (!in) return make_error(errc::unavailable, "cannot read " + f.string());
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
    }
    if (in.bad()) return make_error(errc::unavailable, "cannot read " + f.string());
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &n);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += digits[md[i] >> 4];
    out += digits[md[i] & 15];
  }
  return out;
}

}  // namespace glint::rpc
