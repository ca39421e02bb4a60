#pragma once
// What the typed clients' CAF backends share (actors' own).

#include "runtime/future.hpp"
#include "runtime/runtime.hpp"

#include <cmath>
#include <string>
#include <string_view>

namespace glint::actors::detail {

/// The future of a call whose answer only says it worked (the actors answer
/// `true`): its error, or nothing.
template <class T>
Future<void> done_of(const Future<T>& f) {
  return f.then([](const Result<T>& r) -> Result<void> {
    if (!r) return r.error();
    return {};
  });
}

/// The metrics of a batch sliced over `ranks` data-parallel ranks, from the
/// mean of theirs (Collect::mean): the loss (and a pairwise loss's reward
/// metrics) weighed by what each rank's mean is over (the mean of
/// X_weighted over the mean of loss_count), tokens, sequences and
/// loss_count summed; X_sum (a loss with reduction sum) becomes X, the sum
/// over ranks; the other metrics stay the means of the ranks'.
inline Metrics whole_batch_metrics(Metrics m, double ranks) {
  for (auto it = m.begin(); it != m.end();) {
    const auto& k = it->first;
    constexpr std::string_view suffix = "_sum";
    if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) {
      m[k.substr(0, k.size() - suffix.size())] = it->second * ranks;
      it = m.erase(it);
    } else {
      ++it;
    }
  }
  const auto c = m.find("loss_count");
  for (auto it = m.begin(); it != m.end();) {
    const auto& k = it->first;
    constexpr std::string_view suffix = "_weighted";
    if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) {
      if (c != m.end() && c->second > 0) m[k.substr(0, k.size() - suffix.size())] = it->second / c->second;
      it = m.erase(it);
    } else {
      ++it;
    }
  }
  // Counts: the mean times the ranks is their sum, up to rounding (whole).
  for (const char* k : {"tokens", "sequences", "loss_count"})
    if (auto it = m.find(k); it != m.end()) it->second = std::round(it->second * ranks);
  return m;
}

/// A future that fails at once: what a client answers for bad input it can
/// see before anything is sent, or a mode it does not serve.
template <class T>
Future<T> failed(caf::error e) {
  return Future<T>::ready_with(std::move(e));
}

/// Why `open_*` of a group a server does not host cannot run in this
/// runtime's mode, or none: in remote mode a server hosts model and sampler
/// groups (and dataloaders run with the driver), nothing else.
inline caf::error refuse_remote(const Runtime& rt, const std::string& what) {
  if (rt.mode() != Mode::remote) return caf::none;
  return make_error(errc::unimplemented, what + " in remote mode: a glint server hosts model and sampler groups only; "
                                                "run in local or cluster mode");
}

}  // namespace glint::actors::detail
