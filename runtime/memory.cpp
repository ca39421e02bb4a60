#include "runtime/memory.hpp"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <fstream>
#include <string>
#include <utility>

namespace glint {

namespace {

// A cgroup limit file's value; 0 for none ("max", absent, unreadable).
uint64_t cgroup_limit(const char* path) {
  std::ifstream in{path};
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

uint64_t memory_limit_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  uint64_t limit = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"})
    if (auto c = cgroup_limit(path); c > 0) limit = std::min(limit, c);
  return limit;
}

uint64_t memory_available_bytes() {
  // MemAvailable: free memory plus what the kernel can reclaim (caches).
  uint64_t available = 0;
  std::ifstream meminfo{"/proc/meminfo"};
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  if (available == 0) available = memory_limit_bytes();  // no /proc: the limit is all we know
  // Under a cgroup limit, what it leaves (its usage counts the page cache,
  // which is reclaimable, so this errs on the small side).
  for (auto [max, current] : {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                              {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                               "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const auto limit = cgroup_limit(max), used = cgroup_limit(current);
    if (limit > 0 && limit < (uint64_t{1} << 60)) available = std::min(available, limit > used ? limit - used : 0);
  }
  return available;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

Result<void> check_memory(double bytes, std::string_view what) {
  const auto limit = memory_limit_bytes();
  if (bytes <= static_cast<double>(limit)) return {};
  return make_error(errc::resource_exhausted, std::string{what} + " needs " + format_bytes(bytes) +
                                                  ", more than this machine's " +
                                                  format_bytes(static_cast<double>(limit)) + " of memory");
}

void keep_freed_memory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("GLINT_MALLOC_TUNING");
    if (v && std::strcmp(v, "0") == 0) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}

}  // namespace glint
