#include "rpc/keys.hpp"

#include "components/store/kv_store.hpp"

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>

namespace glint::rpc {

namespace fs = std::filesystem;

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string unhex(const std::string& s) {
  std::string out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) out += static_cast<char>(std::stoi(s.substr(i, 2), nullptr, 16));
  return out;
}

bool is_hex(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Result<std::string> random_bytes(int n) {
  std::string out(static_cast<size_t>(n), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), n) != 1)
    return make_error(errc::internal, "the system's random generator failed (OpenSSL RAND_bytes)");
  return out;
}

std::string sha256(const std::string& a, const std::string& b) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, a.data(), a.size());
  EVP_DigestUpdate(ctx, b.data(), b.size());
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  return std::string(reinterpret_cast<char*>(md), n);
}

std::string db_path(const std::string& dir) { return (fs::path{dir} / "keys").string(); }
std::string generation_path(const std::string& dir) { return (fs::path{dir} / "keys.generation").string(); }

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool valid_tenant(const std::string& s) {
  if (s.empty() || s.size() > 64 || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

using components::KvStore;

// Opens the store; a writer waits up to 10 s for another writer's lock.
Result<std::unique_ptr<KvStore>> open_db(const std::string& dir, bool read_only) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(errc::unavailable, "cannot create the server's state directory " + dir + ": " + ec.message());
  auto db = KvStore::open(db_path(dir), {.read_only = read_only, .lock_wait = std::chrono::seconds(10)});
  if (!db) return with_context(db.error(), "the key store");
  return db;
}

// Tells readers the store changed: a new file in place of the old (a new
// inode, which a reader's stat sees).
Result<void> bump_generation(const std::string& dir) {
  auto tmp = generation_path(dir) + ".tmp";
  {
    std::ofstream out{tmp, std::ios::trunc};
    out << now_ms() << "\n";
    if (!out) return make_error(errc::unavailable, "cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, generation_path(dir), ec);
  if (ec) return make_error(errc::unavailable, "cannot replace " + generation_path(dir) + ": " + ec.message());
  return {};
}

std::string generation_of(const std::string& dir) {
  struct stat st{};
  if (::stat(generation_path(dir).c_str(), &st) != 0) return "none";
  return std::to_string(st.st_ino) + ":" + std::to_string(st.st_mtim.tv_sec) + ":" +
         std::to_string(st.st_mtim.tv_nsec);
}

nlohmann::json json_of(const KeyRecord& r, const std::string& salt, const std::string& hash) {
  return {{"tenant", r.tenant}, {"created_ms", r.created_ms}, {"revoked", r.revoked}, {"salt", hex(salt)},
          {"hash", hex(hash)}};
}

}  // namespace

std::string KeyStore::id_of(const std::string& key) {
  if (key.size() != key_length || key.compare(0, 4, "tml-") != 0) return {};
  auto id = key.substr(4, 16);
  return is_hex(id) && is_hex(key.substr(20)) ? id : std::string{};
}

Result<std::string> KeyStore::create(const std::string& state_dir, const std::string& tenant) {
  if (!valid_tenant(tenant))
    return make_error(errc::invalid_argument,
                      "tenant '" + tenant.substr(0, 64) + "' is not 1-64 bytes of letters, digits, '.', '_' or '-'");
  auto id = random_bytes(8), secret = random_bytes(24), salt = random_bytes(16);
  if (!id) return id.error();
  if (!secret) return secret.error();
  if (!salt) return salt.error();
  auto db = open_db(state_dir, false);
  if (!db) return db.error();
  KeyRecord r{.id = hex(*id), .tenant = tenant, .created_ms = now_ms()};
  auto key = "tml-" + r.id + hex(*secret);
  if (auto ok = (*db)->put("key/" + r.id, json_of(r, *salt, sha256(*salt, key)).dump()); !ok)
    return with_context(ok.error(), "storing the key");
  db->reset();
  if (auto ok = bump_generation(state_dir); !ok) return ok.error();
  return key;
}

namespace {
Result<std::vector<std::pair<KeyRecord, std::pair<std::string, std::string>>>> read_all(KvStore& db) {
  std::vector<std::pair<KeyRecord, std::pair<std::string, std::string>>> out;
  auto entries = db.scan("key/");
  if (!entries) return with_context(entries.error(), "reading the key store");
  for (const auto& [key, value] : *entries) {
    auto j = nlohmann::json::parse(value, nullptr, false);
    auto id = key.substr(4);
    if (!j.is_object() || !j["tenant"].is_string() || !j["salt"].is_string() || !j["hash"].is_string() ||
        !is_hex(j["salt"].get<std::string>()) || !is_hex(j["hash"].get<std::string>()))
      return make_error(errc::internal, "the key store holds a damaged record for key " + id);
    KeyRecord r{.id = id, .tenant = j["tenant"], .created_ms = j.value("created_ms", int64_t{0}),
                .revoked = j.value("revoked", false)};
    out.push_back({r, {unhex(j["salt"]), unhex(j["hash"])}});
  }
  return out;
}
}  // namespace

Result<std::vector<KeyRecord>> KeyStore::list(const std::string& state_dir) {
  if (!fs::exists(db_path(state_dir))) return std::vector<KeyRecord>{};
  auto db = open_db(state_dir, true);
  if (!db) return db.error();
  auto all = read_all(**db);
  if (!all) return all.error();
  std::vector<KeyRecord> out;
  for (auto& [r, _] : *all) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const KeyRecord& a, const KeyRecord& b) {
    return std::tie(a.tenant, a.created_ms, a.id) < std::tie(b.tenant, b.created_ms, b.id);
  });
  return out;
}

Result<KeyRecord> KeyStore::revoke(const std::string& state_dir, const std::string& id_or_key) {
  auto id = id_of(id_or_key).empty() ? id_or_key : id_of(id_or_key);
  if (id.size() != 16 || !is_hex(id))
    return make_error(errc::invalid_argument, "'" + id.substr(0, 80) + "' is neither a key nor a key id (16 hex digits)");
  auto db = open_db(state_dir, false);
  if (!db) return db.error();
  auto all = read_all(**db);
  if (!all) return all.error();
  for (auto& [r, sh] : *all) {
    if (r.id != id) continue;
    r.revoked = true;
    if (auto ok = (*db)->put("key/" + r.id, json_of(r, sh.first, sh.second).dump()); !ok)
      return with_context(ok.error(), "storing the revocation");
    db->reset();
    if (auto ok = bump_generation(state_dir); !ok) return ok.error();
    return r;
  }
  return make_error(errc::not_found, "no key with id " + id + " (glint serve keys list shows them)");
}

Result<std::unique_ptr<KeyStore>> KeyStore::open_reader(const std::string& state_dir) {
  std::unique_ptr<KeyStore> ks{new KeyStore()};
  ks->dir_ = state_dir;
  if (!fs::exists(db_path(state_dir))) {
    auto db = open_db(state_dir, false);  // create it, so that readers can open it
    if (!db) return db.error();
  }
  std::lock_guard<std::mutex> guard{ks->mx_};
  ks->generation_ = "unread";
  if (auto ok = ks->reload_if_changed(); !ok) return ok.error();
  return ks;
}

KeyStore::~KeyStore() = default;

Result<void> KeyStore::reload_if_changed() {
  auto gen = generation_of(dir_);
  if (gen == generation_) return {};
  auto db = open_db(dir_, true);
  if (!db) return db.error();
  auto all = read_all(**db);
  if (!all) return all.error();
  std::map<std::string, Entry> keys;
  for (auto& [r, sh] : *all) keys[r.id] = Entry{r, sh.first, sh.second};
  keys_ = std::move(keys);
  generation_ = gen;
  return {};
}

Result<std::string> KeyStore::authenticate(const std::string& key) {
  static const std::string refused = "the API key is not valid (unknown, malformed or revoked); ask the server's "
                                     "operator for a key (glint serve keys create)";
  std::lock_guard<std::mutex> guard{mx_};
  if (auto ok = reload_if_changed(); !ok) return make_error(errc::unavailable, "the server cannot read its key store");
  auto id = id_of(key);
  auto it = keys_.find(id);
  // Hash whatever came, found or not, so that timing tells nothing.
  static const std::string dummy_salt(16, '\0');
  const auto& salt = it != keys_.end() ? it->second.salt : dummy_salt;
  auto h = sha256(salt, key);
  if (it == keys_.end() || it->second.record.revoked || it->second.hash.size() != h.size() ||
      CRYPTO_memcmp(h.data(), it->second.hash.data(), h.size()) != 0)
    return make_error(errc::permission_denied, refused);
  return it->second.record.tenant;
}

Result<void> KeyStore::check(const std::string& id) {
  std::lock_guard<std::mutex> guard{mx_};
  if (auto ok = reload_if_changed(); !ok)
    return make_error(errc::unavailable, "the server cannot read its key store now; retry");
  auto it = keys_.find(id);
  if (it == keys_.end() || it->second.record.revoked)
    return make_error(errc::permission_denied, "the API key of this session was revoked; connect with a valid key");
  return {};
}

}  // namespace glint::rpc
