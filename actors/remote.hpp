#pragma once
/// Remote mode's side of the typed clients: what a connection to a `glint
/// serve` deployment offers `open_model_group` and `open_sampler_group`. The
/// rpc layer implements it (rpc/client.cpp) and hands it to the runtime
/// (runtime/remote.hpp); this layer only calls it, so actors/ never sees
/// the wire.

#include "actors/checkpoint_engine.hpp"
#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "runtime/remote.hpp"
#include "runtime/runtime.hpp"

namespace glint::actors {

class RemoteGroups : public RemoteAttachment {
public:
  /// Attaches to the server's base model. `spec.model_dir` names the base:
  /// empty (whatever the server hosts), a local directory holding the same
  /// model (checked by fingerprint), or the server's name for it.
  virtual Result<ModelGroup> open_model(const ModelSpec& spec) = 0;
  /// Attaches to the server's samplers, under the same rule for model_dir.
  virtual Result<SamplerGroup> open_sampler(const SamplerSpec& spec) = 0;
};

/// Implemented by a remote ModelBackend: a weight sync to a sampler group
/// of the same server runs there (model to sampler inside the server), the
/// driver only asks for it.
class RemoteWeightSync {
public:
  virtual ~RemoteWeightSync() = default;
  /// `target`: the sampler adapter that receives `adapter`'s weights.
  virtual Result<SyncReport> sync_to(SamplerBackend& sampler, const std::string& adapter, const std::string& target,
                                     const SyncOptions& o) = 0;
};

/// The runtime's connection as RemoteGroups, or an error saying why not.
inline Result<RemoteGroups*> remote_groups(Runtime& rt, const std::string& what) {
  auto* r = dynamic_cast<RemoteGroups*>(rt.remote());
  if (!r) return make_error(errc::unimplemented, what + " in remote mode needs the remote transport (glint::rpc)");
  return r;
}

}  // namespace glint::actors
