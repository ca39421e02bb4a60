// The fuzz targets read the actors' message types (rpc/convert.hpp), they
// spawn no actors: the registrations that actors/model.hpp and
// actors/sampler.hpp run before main (their definitions are in .cpp files
// that need LibTorch) have nothing to register here.
#include "actors/model.hpp"
#include "actors/sampler.hpp"

namespace glint::actors {

void glint_register_model(ActorTypes&) {}
void glint_register_sampler(ActorTypes&) {}

}  // namespace glint::actors
