#include "components/checkpoint/gguf.hpp"

#include "components/checkpoint/safetensors.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace glint::components {

namespace {

// GGUF's value types.
enum : uint32_t {
  t_u8 = 0, t_i8, t_u16, t_i16, t_u32, t_i32, t_f32, t_bool, t_string, t_array, t_u64, t_i64, t_f64,
};
constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kVersion = 3;

// The bytes of one header, built in memory (it is small next to the tensors).
class Header {
public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof v);  // x86-64 and aarch64 are little-endian, as GGUF is
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.append(s);
  }
  void put_value(const GgufValue& v) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, uint32_t>) put(t_u32), put(x);
          else if constexpr (std::is_same_v<T, int32_t>) put(t_i32), put(x);
          else if constexpr (std::is_same_v<T, uint64_t>) put(t_u64), put(x);
          else if constexpr (std::is_same_v<T, float>) put(t_f32), put(x);
          else if constexpr (std::is_same_v<T, bool>) put(t_bool), put<uint8_t>(x ? 1 : 0);
          else if constexpr (std::is_same_v<T, std::string>) put(t_string), put_string(x);
          else {
            put(t_array);
            using E = typename T::value_type;
            put(std::is_same_v<E, std::string> ? t_string : std::is_same_v<E, int32_t> ? t_i32 : t_f32);
            put<uint64_t>(x.size());
            for (const auto& e : x) {
              if constexpr (std::is_same_v<E, std::string>) put_string(e);
              else put(e);
            }
          }
        },
        v);
  }
  const std::string& bytes() const { return bytes_; }

private:
  std::string bytes_;
};

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace

const GgufValue* GgufFile::find(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

uint32_t ggml_type_of(Dtype d) {
  switch (d) {
    case Dtype::f32: return 0;
    case Dtype::f16: return 1;
    case Dtype::bf16: return 30;
    default: return UINT32_MAX;
  }
}

Result<Dtype> dtype_of_ggml_type(uint32_t type) {
  switch (type) {
    case 0: return Dtype::f32;
    case 1: return Dtype::f16;
    case 30: return Dtype::bf16;
    default:
      return make_error(errc::unimplemented, "ggml type " + std::to_string(type) +
                                                 " is quantized or unknown; glint reads F32 (0), F16 (1) and BF16 (30)");
  }
}

Result<void> write_gguf(const std::string& path, const GgufFile& file,
                        const std::function<void(size_t done)>& progress) {
  if (file.alignment == 0 || (file.alignment & (file.alignment - 1)) != 0)
    return make_error(errc::invalid_argument, "GGUF alignment must be a power of two, not " +
                                                  std::to_string(file.alignment));
  Header h;
  h.put(kMagic);
  h.put(kVersion);
  h.put<uint64_t>(file.tensors.size());
  const bool own_alignment = file.alignment != 32 && !file.find("general.alignment");
  h.put<uint64_t>(file.metadata.size() + (own_alignment ? 1 : 0));
  std::set<std::string> keys;
  for (const auto& [k, v] : file.metadata) {
    if (!keys.insert(k).second) return make_error(errc::invalid_argument, "GGUF key '" + k + "' is given twice");
    if (k == "general.alignment" && (!std::holds_alternative<uint32_t>(v) || std::get<uint32_t>(v) != file.alignment))
      return make_error(errc::invalid_argument, "GGUF key general.alignment disagrees with the file's alignment " +
                                                    std::to_string(file.alignment));
    h.put_string(k);
    h.put_value(v);
  }
  if (own_alignment) {
    h.put_string("general.alignment");
    h.put_value(file.alignment);
  }
  std::set<std::string> names;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const auto& t : file.tensors) {
    if (!names.insert(t.name).second)
      return make_error(errc::invalid_argument, "GGUF tensor '" + t.name + "' is given twice");
    if (ggml_type_of(t.dtype) == UINT32_MAX)
      return make_error(errc::invalid_argument, "GGUF tensor '" + t.name + "' is " + std::string{to_string(t.dtype)} +
                                                    "; glint writes f32, f16 and bf16");
    if (t.shape.empty() || t.shape.size() > 4)
      return make_error(errc::invalid_argument, "GGUF tensor '" + t.name + "' has " + std::to_string(t.shape.size()) +
                                                    " dimensions; ggml takes 1 to 4");
    uint64_t numel = 1;
    for (auto d : t.shape) {
      if (d <= 0) return make_error(errc::invalid_argument, "GGUF tensor '" + t.name + "' has a dimension of " +
                                                                std::to_string(d));
      numel *= static_cast<uint64_t>(d);
    }
    h.put_string(t.name);
    h.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) h.put<uint64_t>(static_cast<uint64_t>(*it));
    h.put<uint32_t>(ggml_type_of(t.dtype));
    h.put<uint64_t>(offset);
    sizes.push_back(numel * element_size(t.dtype));
    offset = align_up(offset + sizes.back(), file.alignment);
  }

  auto out = AtomicFile::create(path);
  if (!out) return out.error();
  if (auto ok = out->write(h.bytes().data(), h.bytes().size()); !ok) return ok;
  if (auto ok = out->pad_to(file.alignment); !ok) return ok;
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const auto& t = file.tensors[i];
    if (!t.data) return make_error(errc::invalid_argument, "GGUF tensor '" + t.name + "' has no data");
    auto bytes = t.data();
    if (!bytes) return bytes.error();
    if (bytes->dtype() != t.dtype || bytes->shape() != t.shape)
      return make_error(errc::internal, "GGUF tensor '" + t.name + "' was declared " +
                                            std::string{to_string(t.dtype)} + " of " +
                                            std::to_string(t.shape.size()) + " dimensions but is " +
                                            bytes->describe());
    if (auto ok = out->write(bytes->data(), bytes->nbytes()); !ok) return ok;
    // After the last tensor too: ggml's reader counts every tensor padded.
    if (auto ok = out->pad_to(file.alignment); !ok) return ok;
    if (progress) progress(i + 1);
  }
  return out->commit();
}

namespace {

// Reads a header from a file, every read checked against its size.
class Reader {
public:
  Reader(std::ifstream& in, std::string path, uint64_t size) : in_(in), path_(std::move(path)), size_(size) {}

  template <class T>
  Result<T> get(const char* what) {
    T v{};
    if (auto ok = read(&v, sizeof v, what); !ok) return ok.error();
    return v;
  }
  Result<std::string> get_string(const char* what) {
    auto n = get<uint64_t>(what);
    if (!n) return n.error();
    if (*n > size_ - pos_) return truncated(what);
    std::string s(static_cast<size_t>(*n), '\0');
    if (auto ok = read(s.data(), s.size(), what); !ok) return ok.error();
    return s;
  }
  Result<GgufValue> get_value(const std::string& key) {
    auto type = get<uint32_t>("a value type");
    if (!type) return type.error();
    switch (*type) {
      case t_u32: return lift(get<uint32_t>("a u32"));
      case t_i32: return lift(get<int32_t>("an i32"));
      case t_u64: return lift(get<uint64_t>("a u64"));
      case t_f32: return lift(get<float>("an f32"));
      case t_bool: {
        auto b = get<uint8_t>("a bool");
        if (!b) return b.error();
        if (*b > 1) return bad("key '" + key + "' has the bool value " + std::to_string(*b));
        return GgufValue{*b == 1};
      }
      case t_string: return lift(get_string("a string"));
      case t_array: {
        auto et = get<uint32_t>("an array's type");
        if (!et) return et.error();
        auto n = get<uint64_t>("an array's length");
        if (!n) return n.error();
        if (*n > size_ - pos_) return truncated("an array");
        // Each element takes at least 8 (string) or 4 bytes of the file.
        if (*et == t_string && *n > (size_ - pos_) / 8) return truncated("an array");
        if ((*et == t_i32 || *et == t_f32) && *n > (size_ - pos_) / 4) return truncated("an array");
        if (*et == t_string) return array<std::string>(*n, [&] { return get_string("a string"); });
        if (*et == t_i32) return array<int32_t>(*n, [&] { return get<int32_t>("an i32"); });
        if (*et == t_f32) return array<float>(*n, [&] { return get<float>("an f32"); });
        return bad("key '" + key + "' is an array of type " + std::to_string(*et) +
                   "; glint reads arrays of strings, i32 and f32");
      }
      default:
        return bad("key '" + key + "' has value type " + std::to_string(*type) +
                   "; glint reads u32, i32, u64, f32, bool, string and arrays");
    }
  }
  uint64_t pos() const { return pos_; }
  caf::error bad(const std::string& what) const {
    return make_error(errc::invalid_argument, path_ + " is not a GGUF file glint reads: " + what);
  }

private:
  template <class T>
  static Result<GgufValue> lift(Result<T> r) {
    if (!r) return r.error();
    return GgufValue{std::move(*r)};
  }
  template <class E, class F>
  Result<GgufValue> array(uint64_t n, F next) {
    std::vector<E> out;
    out.reserve(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) {
      auto e = next();
      if (!e) return e.error();
      out.push_back(std::move(*e));
    }
    return GgufValue{std::move(out)};
  }
  caf::error truncated(const char* what) const { return bad(std::string{"it ends inside "} + what); }
  Result<void> read(void* p, size_t n, const char* what) {
    if (n > size_ - pos_) return truncated(what);
    in_.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    if (!in_) return truncated(what);
    pos_ += n;
    return {};
  }
  std::ifstream& in_;
  std::string path_;
  uint64_t size_ = 0, pos_ = 0;
};

}  // namespace

Result<GgufFile> read_gguf_header(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(errc::not_found, "cannot read " + path + ": " + ec.message());
  std::ifstream in{path, std::ios::binary};
  if (!in) return make_error(errc::unavailable, "cannot open " + path);
  Reader r{in, path, size};
  auto magic = r.get<uint32_t>("the magic number");
  if (!magic) return magic.error();
  if (*magic != kMagic) return r.bad("it does not start with 'GGUF'");
  auto version = r.get<uint32_t>("the version");
  if (!version) return version.error();
  if (*version != kVersion) return r.bad("it is version " + std::to_string(*version) + "; glint reads version 3");
  auto n_tensors = r.get<uint64_t>("the tensor count");
  if (!n_tensors) return n_tensors.error();
  auto n_kv = r.get<uint64_t>("the key count");
  if (!n_kv) return n_kv.error();
  GgufFile f;
  std::set<std::string> keys;
  for (uint64_t i = 0; i < *n_kv; ++i) {
    auto key = r.get_string("a key");
    if (!key) return key.error();
    auto value = r.get_value(*key);
    if (!value) return value.error();
    if (!keys.insert(*key).second) return r.bad("key '" + *key + "' is there twice");
    if (*key == "general.alignment") {
      if (!std::holds_alternative<uint32_t>(*value)) return r.bad("general.alignment is not a u32");
      f.alignment = std::get<uint32_t>(*value);
      if (f.alignment == 0 || (f.alignment & (f.alignment - 1)) != 0)
        return r.bad("general.alignment is " + std::to_string(f.alignment));
    }
    f.metadata.emplace_back(std::move(*key), std::move(*value));
  }
  for (uint64_t i = 0; i < *n_tensors; ++i) {
    GgufTensor t;
    auto name = r.get_string("a tensor name");
    if (!name) return name.error();
    t.name = std::move(*name);
    auto dims = r.get<uint32_t>("a tensor's dimension count");
    if (!dims) return dims.error();
    if (*dims == 0 || *dims > 4) return r.bad("tensor '" + t.name + "' has " + std::to_string(*dims) + " dimensions");
    t.shape.resize(*dims);
    for (uint32_t d = 0; d < *dims; ++d) {
      auto ne = r.get<uint64_t>("a tensor's shape");
      if (!ne) return ne.error();
      if (*ne == 0 || *ne > (uint64_t{1} << 40)) return r.bad("tensor '" + t.name + "' has a dimension of " + std::to_string(*ne));
      t.shape[*dims - 1 - d] = static_cast<int64_t>(*ne);
    }
    auto type = r.get<uint32_t>("a tensor's type");
    if (!type) return type.error();
    auto dtype = dtype_of_ggml_type(*type);
    if (!dtype) return r.bad("tensor '" + t.name + "': " + describe(dtype.error()));
    t.dtype = *dtype;
    auto off = r.get<uint64_t>("a tensor's offset");
    if (!off) return off.error();
    t.offset = *off;
    f.tensors.push_back(std::move(t));
  }
  f.data_offset = align_up(r.pos(), f.alignment);
  if (f.data_offset > size) return r.bad("its data section starts past the end of the file");
  const uint64_t data_bytes = size - f.data_offset;
  for (const auto& t : f.tensors) {
    uint64_t bytes = element_size(t.dtype);
    bool overflow = false;
    for (auto d : t.shape) overflow |= __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
    if (t.offset % f.alignment != 0) return r.bad("tensor '" + t.name + "' is not aligned");
    if (overflow || t.offset > data_bytes || bytes > data_bytes - t.offset)
      return r.bad("tensor '" + t.name + "' ends past the end of the file");
  }
  return f;
}

}  // namespace glint::components
