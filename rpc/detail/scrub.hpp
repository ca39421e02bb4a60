#pragma once
// What of an error's text a tenant may not read (rpc's own): which process
// of the server's job failed is the operator's to know.

#include <regex>
#include <string>

namespace glint::rpc::detail {

/// `text` with every "node N (host, pid P)" (NodeInfo::describe) as "a
/// server process", and `host` (this machine's name; ignored when shorter
/// than 4 characters, which would match inside ordinary words) as "<host>".
inline std::string without_process_labels(std::string text, const std::string& host) {
  static const std::regex node{R"(node [0-9]+ \([^()]*, pid [0-9]+\))"};
  text = std::regex_replace(text, node, "a server process");
  if (host.size() >= 4)
    for (size_t at = text.find(host); at != std::string::npos; at = text.find(host, at + 6)) text.replace(at, host.size(), "<host>");
  return text;
}

}  // namespace glint::rpc::detail
