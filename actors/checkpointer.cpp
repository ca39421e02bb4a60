#include "actors/checkpointer.hpp"

#include "components/checkpoint/atomic_dir.hpp"
#include "components/store/index.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace glint::actors {

namespace fs = std::filesystem;

namespace {

constexpr const char* kState = "trainer_state.json";

nlohmann::json to_json(const TrainerState& s) {
  return {{"step", s.step},
          {"consumed_samples", s.consumed_samples},
          {"gradient_accumulation", s.gradient_accumulation},
          {"seed", s.seed},
          {"phase", s.phase},
          {"loader", {{"seed", s.loader.seed}, {"epoch", s.loader.epoch}, {"position", s.loader.position}}},
          {"metrics", s.metrics},
          {"train_configs", s.train_configs}};
}

Result<TrainerState> from_json(const std::string& path) {
  std::ifstream in{path};
  if (!in) return make_error(errc::not_found, "cannot read " + path);
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_argument, path + " is not a trainer state");
  try {
    TrainerState s;
    s.step = j.at("step").get<int64_t>();
    s.consumed_samples = j.value("consumed_samples", int64_t{0});
    s.gradient_accumulation = j.value("gradient_accumulation", int64_t{1});
    s.seed = j.value("seed", uint64_t{0});
    s.phase = j.value("phase", std::string{});
    const auto& l = j.at("loader");
    s.loader = {l.at("seed").get<uint64_t>(), l.at("epoch").get<int64_t>(), l.at("position").get<int64_t>()};
    s.metrics = j.value("metrics", std::map<std::string, double>{});
    s.train_configs = j.value("train_configs", std::string{});
    return s;
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument, path + " lacks a field: " + e.what());
  }
}

}  // namespace

Checkpointer::Checkpointer(Checkpointer&&) noexcept = default;
Checkpointer& Checkpointer::operator=(Checkpointer&&) noexcept = default;
Checkpointer::~Checkpointer() = default;

Result<Checkpointer> Checkpointer::open(const std::string& root, const std::string& run, components::FileSystem* fs) {
  if (run.empty() || run.find('/') != std::string::npos || run[0] == '.')
    return make_error(errc::invalid_argument, "run name '" + run + "' must be non-empty, without '/', not start with '.'");
  auto idx = components::RunIndex::open(root, {.fs = fs});
  if (!idx) return idx.error();
  Checkpointer c;
  c.root_ = fs::absolute(root).string();
  c.run_ = run;
  c.fs_ = fs ? fs : &components::local_file_system();
  c.index_ = std::make_unique<components::RunIndex>(std::move(*idx));
  components::remove_temporaries(c.run_dir(), *c.fs_);  // of saves a killed process left
  return c;
}

Result<std::vector<std::string>> Checkpointer::list() const {
  auto all = index_->checkpoints(run_);
  if (!all) {
    if (code_of(all.error()) == errc::not_found) return std::vector<std::string>{};
    return all.error();
  }
  std::vector<std::string> names;
  for (const auto& c : *all) names.push_back(c.name);
  return names;
}

Result<void> Checkpointer::reset() {
  auto all = index_->checkpoints(run_);
  if (!all) return code_of(all.error()) == errc::not_found ? Result<void>{} : Result<void>{all.error()};
  if (auto ok = index_->remove_run(run_); !ok) return ok;
  for (const auto& c : *all)
    if (auto ok = fs_->remove_all(c.path); !ok) return ok;
  return {};
}

Result<void> Checkpointer::start_over(bool fresh) {
  auto earlier = list();
  if (!earlier) return earlier.error();
  if (!earlier->empty() && !fresh)
    return make_error(errc::failed_precondition,
                      "run " + run_ + " has checkpoints already (latest " + earlier->back() + ")");
  return reset();
}

Result<std::string> Checkpointer::save(const std::string& name, const ModelGroup& model, const DataLoaderGroup* loader,
                                       TrainerState state, const std::string& summary) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    return make_error(errc::invalid_argument, "checkpoint name '" + name + "' must be non-empty, without '/'");
  auto dir = components::AtomicDir::begin(run_dir() + "/" + name, *fs_);
  if (!dir) return dir.error();
  auto saved = model.save({.dir = dir->path() + "/model", .with_optimizer = true}).get();
  if (!saved) return with_context(saved.error(), "saving checkpoint " + name);
  if (loader) {
    auto pos = loader->state().get();
    if (!pos) return with_context(pos.error(), "saving checkpoint " + name + ": the dataloader's position");
    state.loader = *pos;
  }
  if (auto cfg = model.train_configs().get())
    state.train_configs = *cfg;
  if (auto ok = dir->write_file(kState, to_json(state).dump(2)); !ok)
    return with_context(ok.error(), "saving checkpoint " + name);
  if (auto ok = dir->commit(); !ok) return with_context(ok.error(), "saving checkpoint " + name);
  if (auto ok = index_->add_checkpoint({.run = run_, .name = name, .path = dir->final_path(), .step = state.step,
                                        .summary = summary});
      !ok)
    return ok.error();
  return dir->final_path();
}

Result<std::optional<TrainerState>> Checkpointer::resume(const ModelGroup& model, const DataLoaderGroup* loader,
                                                         const std::string& which) {
  std::string path;
  if (which == "latest") {
    auto latest = index_->latest(run_);
    if (!latest) {
      if (code_of(latest.error()) == errc::not_found) return std::optional<TrainerState>{};  // a new run
      return latest.error();
    }
    if (!*latest) return std::optional<TrainerState>{};
    path = (*latest)->path;
  } else {
    auto all = index_->checkpoints(run_);
    if (!all) return all.error();
    for (const auto& c : *all)
      if (c.name == which) path = c.path;
    if (path.empty()) return make_error(errc::not_found, "run '" + run_ + "' has no checkpoint '" + which + "'");
  }
  if (auto ok = components::verify_dir(path); !ok) return with_context(ok.error(), "resuming from " + path);
  auto state = from_json(path + "/" + kState);
  if (!state) return state.error();
  auto loaded = model.load({.dir = path + "/model", .with_optimizer = true}).get();
  if (!loaded) return with_context(loaded.error(), "resuming from " + path);
  if (loader) {
    auto ok = loader->set_state(state->loader).get();
    if (!ok) return with_context(ok.error(), "resuming from " + path + ": the dataloader's position");
  }
  return std::optional<TrainerState>{std::move(*state)};
}

}  // namespace glint::actors
