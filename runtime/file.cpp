#include "runtime/file.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sys/stat.h>

namespace glint {

Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error(errc::not_found, "cannot read " + path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return make_error(errc::not_found, "cannot read " + path + ": it is a directory");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return make_error(errc::resource_exhausted, path + " is " + std::to_string(st.st_size) + " bytes, more than the " +
                                                    std::to_string(max_bytes) + " a file of this kind may have");
  std::unique_ptr<FILE, int (*)(FILE*)> f{std::fopen(path.c_str(), "rb"), &std::fclose};
  if (!f) return make_error(errc::not_found, "cannot read " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f.get())) > 0;) {
    out.append(buf, n);
    if (out.size() > max_bytes)  // grew while read
      return make_error(errc::resource_exhausted, path + " is more than the " + std::to_string(max_bytes) +
                                                      " bytes a file of this kind may have");
  }
  if (std::ferror(f.get())) return make_error(errc::unavailable, "cannot read " + path + ": " + std::strerror(errno));
  return out;
}

}  // namespace glint
