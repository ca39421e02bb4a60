// Installs remote mode's connector when glint::rpc is linked: every program
// that links it can run in remote mode (runtime/remote.hpp). Linked as an
// object file, not from the archive, so the linker cannot drop it.
#include "rpc/client.hpp"

namespace {
const bool installed = (glint::set_remote_connector(&glint::rpc::connect), true);
}  // namespace
