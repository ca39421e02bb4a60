#pragma once
// How actor handlers of this layer answer (actors' own; no other layer
// includes it).

#include "runtime/error.hpp"

#include <caf/result.hpp>

#include <exception>
#include <string>
#include <type_traits>

namespace glint::actors::detail {

/// Runs `run` (a Result<T> maker) and answers its value, or its error passed
/// through `state.fail` (which names the rank). An exception (LibTorch out of
/// memory, say) becomes an `internal` error too, so the actor and its state
/// survive it and serve the next call.
template <class State, class Run>
auto answer(const State& state, Run&& run) -> caf::result<std::decay_t<decltype(*run())>> {
  try {
    auto r = run();
    if (!r) return state.fail(r.error());
    return std::move(*r);
  } catch (const std::exception& e) {
    return state.fail(error_of_exception(e, "the call"));
  }
}

}  // namespace glint::actors::detail
