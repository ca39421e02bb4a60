// `glint runs` and `glint checkpoints RUN`: what the run index under a root
// directory holds.
#include "actors/checkpointer.hpp"
#include "components/store/index.hpp"
#include "launcher/commands.hpp"

#include <cstdio>
#include <filesystem>
#include <ctime>

namespace glint::launcher {

namespace {

std::string when(int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

}  // namespace

int runs(const RunsArgs& a) {
  if (a.repair) {
    auto r = actors::Checkpointer::repair(a.root);
    if (!r) {
      std::fprintf(stderr, "glint: repairing the run index under %s: %s\n", a.root.c_str(), describe(r.error()).c_str());
      return 1;
    }
    if (!r->set_aside.empty()) std::printf("the old index is kept as %s (delete it when all is well)\n", r->set_aside.c_str());
    std::printf("indexed %lld checkpoints of %lld runs from their directories\n", static_cast<long long>(r->checkpoints),
                static_cast<long long>(r->runs));
    for (const auto& d : r->damaged) std::printf("left out, damaged: %s\n", d.c_str());
  }
  auto idx = components::RunIndex::open(a.root, {.read_only = true});
  if (!idx) {
    std::fprintf(stderr, "glint runs: %s\n", describe(idx.error()).c_str());
    return 1;
  }
  if (a.run.empty()) {
    auto list = idx->runs();
    if (!list) {
      std::fprintf(stderr, "glint runs: %s\n", describe(list.error()).c_str());
      return 1;
    }
    std::printf("%-20s %-19s %11s  %s\n", "RUN", "CREATED", "CHECKPOINTS", "LATEST");
    for (const auto& r : *list)
      std::printf("%-20s %-19s %11lld  %s\n", r.run.c_str(), when(r.created_ms).c_str(),
                  static_cast<long long>(r.checkpoints),
                  r.latest ? (r.latest->name + " (step " + std::to_string(r.latest->step) + ")" +
                              (std::filesystem::exists(std::filesystem::path{r.latest->path} / "manifest.json")
                                   ? ""
                                   : ", GONE from disk"))
                                 .c_str()
                           : "-");
    if (list->empty()) std::printf("(no runs under %s)\n", a.root.c_str());
    return 0;
  }
  auto list = idx->checkpoints(a.run);
  if (!list) {
    std::fprintf(stderr, "glint checkpoints: %s\n", describe(list.error()).c_str());
    return 1;
  }
  std::printf("%8s  %-20s %-19s  %-30s %s\n", "STEP", "NAME", "CREATED", "SUMMARY", "PATH");
  // The index is read, not reconciled (another process may hold it): a
  // directory deleted since is shown as gone, never as a checkpoint to use.
  int64_t gone = 0;
  for (const auto& c : *list) {
    std::error_code ec;
    const bool there = std::filesystem::exists(std::filesystem::path{c.path} / "manifest.json", ec);
    gone += there ? 0 : 1;
    std::printf("%8lld  %-20s %-19s  %-30s %s\n", static_cast<long long>(c.step), c.name.c_str(),
                when(c.created_ms).c_str(), there ? c.summary.c_str() : "GONE (its directory was deleted)",
                c.path.c_str());
  }
  if (gone > 0)
    std::printf("%lld of these are gone from disk: `glint runs --repair --root %s` forgets them, and so does the run's "
                "next --resume\n",
                static_cast<long long>(gone), a.root.c_str());
  return 0;
}

}  // namespace glint::launcher
