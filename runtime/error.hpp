#pragma once
/// glint's one error vocabulary. Every fallible function returns
/// `glint::Result<T>` (= `caf::expected<T>`); every error carries an `errc`
/// that tells the caller what to do, and a context string that says which
/// rank, which value, what was expected and what came.

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace glint {

/// Error codes, chosen by what the caller should do (as Abseil's status guide).
enum class errc : uint8_t {
  ok = 0,
  invalid_argument,     ///< fix your input
  not_found,            ///< the named thing does not exist
  failed_precondition,  ///< fix the state first (e.g. call X before Y)
  unavailable,          ///< a peer or node is gone or unreachable; retry or rebuild
  resource_exhausted,   ///< a limit was hit (memory, message size): shed load
  aborted,              ///< the step was interrupted; redo it
  permission_denied,    ///< not allowed for this caller
  unimplemented,        ///< not built yet, or not in this build
  deadline_exceeded,    ///< a call ran past its timeout
  internal,             ///< glint's own bug: please report it
};

/// The CAF error category of glint errors.
constexpr caf::atom_value error_category = caf::atom("glint");

std::string_view to_string(errc code);

template <class T>
using Result = caf::expected<T>;

/// Builds an error with context. Found by ADL, so a handler may `return errc::x;`.
caf::error make_error(errc code, std::string context);
caf::error make_error(errc code);

/// The glint code of any error: glint's own, or CAF's system errors mapped to
/// the nearest code (a dead receiver is `unavailable`, a request timeout is
/// `deadline_exceeded`, ...). `errc::ok` for an empty error.
errc code_of(const caf::error& err);

/// The context string of a glint error (empty for others).
std::string context_of(const caf::error& err);

/// A one-line human rendering, e.g. "unavailable: rank 1 of group 'model' ...".
std::string describe(const caf::error& err);

/// The error for an exception a library threw inside `what` (a LibTorch
/// call, say), by what the caller should do: out of memory (std::bad_alloc,
/// or an allocator's "can't allocate memory" / "out of memory") is
/// `resource_exhausted` (shed load: smaller batches, fewer sequences);
/// anything else got past glint's input checks, so it is `internal`.
caf::error error_of_exception(const std::exception& e, std::string_view what);

/// Returns `err` with `prefix + ": "` put before its context; keeps the code.
/// CAF errors are turned into glint errors of the mapped code.
caf::error with_context(const caf::error& err, std::string_view prefix);

}  // namespace glint
