#include "runtime/registry.hpp"

#include <algorithm>
#include <thread>

namespace glint {

namespace detail {
namespace {
std::mutex& local_mx() {
  static std::mutex mx;
  return mx;
}
std::vector<caf::weak_actor_ptr>& local_list() {
  static std::vector<caf::weak_actor_ptr> v;
  return v;
}
}  // namespace

void remember_local_actor(const caf::strong_actor_ptr& p) {
  std::lock_guard<std::mutex> guard{local_mx()};
  auto& v = local_list();
  // Drop the dead ones now and then, so the list stays as long as the living.
  if (v.size() > 64 && v.size() % 64 == 0)
    v.erase(std::remove_if(v.begin(), v.end(), [](const caf::weak_actor_ptr& w) { return !w.lock(); }), v.end());
  v.emplace_back(p.get());
}

bool await_local_actors_released(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (local_actors().empty()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<caf::actor_addr> local_actors() {
  std::lock_guard<std::mutex> guard{local_mx()};
  std::vector<caf::actor_addr> out;
  for (auto& w : local_list())
    if (auto s = w.lock()) out.push_back(caf::actor_cast<caf::actor_addr>(s));
  return out;
}
}  // namespace detail

ActorTypes& ActorTypes::global() {
  static ActorTypes instance;
  return instance;
}

void ActorTypes::install(caf::actor_system_config& cfg) const {
  std::lock_guard<std::mutex> guard{mx_};
  for (const auto& f : installers_) f(cfg);
}

bool ActorTypes::contains(const std::string& name) const {
  std::lock_guard<std::mutex> guard{mx_};
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

std::vector<std::string> ActorTypes::names() const {
  std::lock_guard<std::mutex> guard{mx_};
  return names_;
}

}  // namespace glint
