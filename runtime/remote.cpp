#include "runtime/remote.hpp"

#include <mutex>

namespace glint {

namespace {
std::mutex& connector_mx() {
  static std::mutex mx;
  return mx;
}
RemoteConnector& connector() {
  static RemoteConnector c;
  return c;
}
}  // namespace

void set_remote_connector(RemoteConnector connect) {
  std::lock_guard<std::mutex> guard{connector_mx()};
  connector() = std::move(connect);
}

const RemoteConnector* remote_connector() {
  std::lock_guard<std::mutex> guard{connector_mx()};
  return connector() ? &connector() : nullptr;
}

}  // namespace glint
