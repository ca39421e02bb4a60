#include "runtime/error.hpp"

#include <new>

#include <caf/message.hpp>
#include <caf/exit_reason.hpp>
#include <caf/sec.hpp>
#include <caf/make_message.hpp>

namespace glint {

std::string_view to_string(errc code) {
  switch (code) {
    case errc::ok: return "ok";
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_found: return "not_found";
    case errc::failed_precondition: return "failed_precondition";
    case errc::unavailable: return "unavailable";
    case errc::resource_exhausted: return "resource_exhausted";
    case errc::aborted: return "aborted";
    case errc::permission_denied: return "permission_denied";
    case errc::unimplemented: return "unimplemented";
    case errc::deadline_exceeded: return "deadline_exceeded";
    case errc::internal: return "internal";
  }
  return "unknown";
}

caf::error make_error(errc code, std::string context) {
  return caf::error{static_cast<uint8_t>(code), error_category,
                    caf::make_message(std::move(context))};
}

caf::error make_error(errc code) { return make_error(code, std::string{}); }

namespace {

errc map_sec(caf::sec s) {
  switch (s) {
    case caf::sec::request_timeout: return errc::deadline_exceeded;
    case caf::sec::request_receiver_down:
    case caf::sec::cannot_connect_to_node:
    case caf::sec::disconnect_during_handshake:
    case caf::sec::remote_linking_failed:
    case caf::sec::bad_function_call:
      return errc::unavailable;
    case caf::sec::unexpected_message:
    case caf::sec::unexpected_response:
    case caf::sec::invalid_argument:
    case caf::sec::unexpected_actor_messaging_interface:
      return errc::invalid_argument;
    case caf::sec::no_actor_published_at_port:
    case caf::sec::cannot_spawn_actor_from_arguments:
      return errc::not_found;
    case caf::sec::cannot_open_port:
    case caf::sec::cannot_add_upstream:
      return errc::unavailable;
    default:
      return errc::internal;
  }
}

std::string message_text(const caf::message& ctx) {
  if (ctx.empty()) return {};
  if (ctx.size() == 1 && ctx.match_element<std::string>(0)) return ctx.get_as<std::string>(0);
  return caf::to_string(ctx);
}

}  // namespace

errc code_of(const caf::error& err) {
  if (!err) return errc::ok;
  if (err.category() == error_category) return static_cast<errc>(err.code());
  if (err.category() == caf::atom("system")) return map_sec(static_cast<caf::sec>(err.code()));
  if (err.category() == caf::atom("exit")) return errc::unavailable;
  return errc::internal;
}

std::string context_of(const caf::error& err) {
  if (!err || err.category() != error_category) return {};
  return message_text(err.context());
}

std::string describe(const caf::error& err) {
  if (!err) return "ok";
  if (err.category() == error_category) {
    std::string out{to_string(static_cast<errc>(err.code()))};
    auto ctx = message_text(err.context());
    if (!ctx.empty()) {
      out += ": ";
      out += ctx;
    }
    return out;
  }
  std::string out{to_string(code_of(err))};
  out += ": ";
  if (err.category() == caf::atom("system")) {
    out += caf::to_string(static_cast<caf::sec>(err.code()));
  } else if (err.category() == caf::atom("exit")) {
    out += "actor exited: ";
    out += caf::to_string(static_cast<caf::exit_reason>(err.code()));
  } else {
    out += caf::to_string(err);
  }
  auto ctx = message_text(err.context());
  if (!ctx.empty()) {
    out += " (";
    out += ctx;
    out += ")";
  }
  return out;
}

caf::error with_context(const caf::error& err, std::string_view prefix) {
  std::string ctx{prefix};
  std::string inner;
  if (err.category() == error_category) {
    inner = message_text(err.context());
  } else {
    // Keep CAF's own words for the cause; the code is mapped.
    inner = describe(err);
    inner.erase(0, inner.find(": ") == std::string::npos ? 0 : inner.find(": ") + 2);
  }
  if (!inner.empty()) {
    ctx += ": ";
    ctx += inner;
  }
  return make_error(code_of(err), std::move(ctx));
}

caf::error error_of_exception(const std::exception& e, std::string_view what) {
  std::string text = e.what();
  // LibTorch's errors carry a backtrace after the first line.
  if (auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                   text.find("can't allocate memory") != std::string::npos ||
                   text.find("out of memory") != std::string::npos;
  if (oom)
    return make_error(errc::resource_exhausted, std::string{what} + " ran out of memory (" + text +
                                                    "): use smaller batches or fewer sequences");
  return make_error(errc::internal, std::string{what} + " failed: " + text);
}

}  // namespace glint
