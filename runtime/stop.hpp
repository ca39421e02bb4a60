#pragma once
/// A process-wide request to stop long work, set once the driver is done
/// (run_main, after the driver returns): an actor busy in a call nobody
/// waits for any more (a training batch in many micro-batches, sampling
/// to a long max_tokens) stops at its next step with `aborted` rather than
/// running on until the exit grace ends the process.
///
///   for (auto& slice : slices) {
///     if (auto ok = check_stop("training"); !ok) return ok.error();
///     ...
///   }

#include "runtime/error.hpp"

#include <string_view>

namespace glint {

/// Asks long work everywhere in the process to stop (false: withdraws it, for tests).
void request_stop(bool stop = true);
bool stop_requested();
/// `aborted` naming `what` when a stop was requested.
Result<void> check_stop(std::string_view what);

}  // namespace glint
