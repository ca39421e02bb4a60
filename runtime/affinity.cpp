#include "runtime/affinity.hpp"

#include <pthread.h>
#include <sched.h>

#include <cstring>

namespace glint {

Result<void> bind_current_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return {};
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE)
      return make_error(errc::invalid_argument, "cpu id " + std::to_string(c) + " is out of range");
    CPU_SET(c, &set);
  }
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0)
    return make_error(errc::failed_precondition, std::string{"cannot bind thread to its cpus: "} + std::strerror(rc));
  return {};
}

std::vector<int> current_thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

}  // namespace glint
