#pragma once
/// Remote mode's hook in the runtime. A remote-mode runtime is a local one
/// (its dataloaders and other client-side actors run in this process) plus
/// a connection to a `glint serve` deployment, which hosts the model and
/// sampler groups. The rpc layer makes that connection: it installs its
/// connector here when it is linked (every program that links glint::rpc),
/// `initialize` calls it in remote mode, and the typed clients
/// (actors/remote.hpp) reach the connection through `Runtime::remote()`.
/// The runtime itself knows nothing of the wire.

#include "runtime/error.hpp"
#include "runtime/options.hpp"

#include <functional>
#include <memory>

namespace glint {

/// A live connection to a server; what it offers is the upper layers' business.
class RemoteAttachment {
public:
  virtual ~RemoteAttachment() = default;
};

using RemoteConnector = std::function<Result<std::shared_ptr<RemoteAttachment>>(const Options&)>;

/// Installs the connector remote mode uses (the rpc layer does, at load).
void set_remote_connector(RemoteConnector connect);
/// The installed connector, or null.
const RemoteConnector* remote_connector();

}  // namespace glint
