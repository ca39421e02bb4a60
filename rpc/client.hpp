#pragma once
/// Remote mode's client: a connection to a `glint serve` deployment that
/// implements the typed clients (ModelGroup, SamplerGroup) over Cap'n Proto
/// RPC, so a driver's code does not change between modes. A program linked
/// with glint::rpc installs `connect` as the runtime's remote connector, so
///
///   GLINT_REMOTE_URL=127.0.0.1:7733 GLINT_API_KEY=tml-... build/examples/sft
///
/// runs the SFT example against the server: `open_model_group` attaches to
/// the server's base model and the tenant's adapters, `open_sampler_group`
/// to its samplers, the weight-sync engine syncs on the server, and the
/// dataloaders run in the driver (the data is the tenant's).
///
/// What differs from local mode, each refused with an error that says so:
/// training or saving the full model (the base is shared), a sampler's
/// sleep/wake/abort/reset_prefix_cache (shared by every tenant),
/// update_weights from the driver and streaming (not in the protocol yet).
/// A SamplerSpec's engine settings are the server's: ones the driver sets
/// are reported once on stderr and not applied.
///
/// Threads: one I/O thread per connection runs KJ's event loop; calls from
/// any thread are handed to it and answered through glint futures. Tensors
/// of a request are sent without a copy when aligned (rpc/convert.hpp).

#include "actors/model_group.hpp"
#include "rpc/tenant_store.hpp"
#include "runtime/options.hpp"
#include "runtime/remote.hpp"
#include "runtime/runtime.hpp"

#include <memory>
#include <vector>

namespace glint::rpc {

/// Connects to `opts.remote_endpoint` ("host:port" or "tls://host:port")
/// with `opts.remote_api_key`, checks the protocol version and the key.
/// Errors: unavailable (no server there), permission_denied (the key),
/// failed_precondition (a protocol version the server does not speak).
Result<std::shared_ptr<RemoteAttachment>> connect(const Options& opts);

/// The tenant's checkpoints on the server: saved there durably (they
/// survive a restart of the server, a crash too), listed, loaded and
/// deleted only by the tenant that saved them. Only in remote mode.
///
///   auto ckpts = rpc::ServerCheckpoints::of(rt);
///   ckpts->save(model.with_adapter("policy"), "step-100", /*with_optimizer=*/true);
///   ckpts->load("step-100", model.with_adapter("restored"), /*create=*/true);
class ServerCheckpoints {
public:
  /// Error: the runtime is not in remote mode.
  static Result<ServerCheckpoints> of(Runtime& rt);
  /// Saves `adapter`'s adapter as checkpoint `name` (a new name).
  Result<CheckpointInfo> save(const actors::ModelGroup& adapter, const std::string& name, bool with_optimizer = false);
  Result<std::vector<CheckpointInfo>> list();
  /// Into `target`'s adapter: a new one of that name (create), or the existing one.
  Result<void> load(const std::string& name, const actors::ModelGroup& target, bool create,
                    bool with_optimizer = false);
  Result<void> remove(const std::string& name);

private:
  std::shared_ptr<RemoteAttachment> connection_;
};

}  // namespace glint::rpc
