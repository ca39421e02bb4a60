// The model shard actor in local and 2-process cluster mode: a dp=2 group
// trains like one trainer on the whole batch; adapters, save/load and bad
// input through the actor interface.
#include "actors/model.hpp"
#include "actors/model_group.hpp"
#include "actors/sampler.hpp"
#include "components/model/trainer.hpp"
#include "placement/service.hpp"
#include "runtime/group.hpp"
#include "runtime/process.hpp"
#include "support/cluster.hpp"
#include "support/tensors.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

namespace glint {
namespace {

using namespace std::chrono_literals;
using actors::model_actor;
using glint::testing::ids_of;

components::ModelConfig tiny() { return components::ModelConfig::make(components::Architecture::qwen3, 31, 16, 32, 2, 4, 2); }

Batch batch_of(const Tensor& ids, const Tensor& mask) {
  Batch b;
  b.tensors["input_ids"] = ids;
  b.tensors["attention_mask"] = mask;
  return b;
}

class ModelActorTest : public testing::ModeJobTest {
protected:
  Group<model_actor> spawn(actors::ModelSpec spec, int ranks = 2) {
    auto mesh = placement::DeviceMesh::from_sizes({.dp = ranks});
    EXPECT_TRUE(mesh);
    auto g = actors::spawn_model_group(*job_.rt, placement::DeviceGroup::of("model", ranks), *mesh, spec);
    EXPECT_TRUE(g) << describe(g.error());
    return g ? *g : Group<model_actor>{};
  }
};

TEST_P(ModelActorTest, DataParallelGroupTrainsLikeOneTrainerOnTheWholeBatch) {
  auto group = spawn({.config_json = tiny().to_json(), .seed = 7});
  auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}});
  auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  // SGD with momentum: Adam's per-element normalisation turns the rounding
  // of near-zero gradients (the same sums in another order) into ~2e-5
  // after 5 steps; the AdamW version of this check is in comm_test.
  actors::OptimizerConfig opt{.kind = actors::OptimizerConfig::Kind::sgd, .lr = 0.1, .momentum = 0.9};
  ASSERT_TRUE((group.call<Collect::first>(Dispatch::all, actors::set_optimizer_atom::value, std::string{}, opt).get()));

  auto single = components::Trainer::create(
      *components::CausalLM::init_random(tiny(), 7),
      {.optimizer = {.kind = components::OptimizerConfig::Kind::sgd, .lr = 0.1, .momentum = 0.9}});
  ASSERT_TRUE(single);
  for (int step = 0; step < 5; ++step) {
    auto m = group.call<Collect::mean>(Dispatch::slice_dp, actors::forward_backward_atom_v, batch_of(ids, mask),
                                       std::string{})
                 .get();
    ASSERT_TRUE(m) << describe(m.error());
    EXPECT_GT(m->at("loss"), 0);
    auto s = group.call<Collect::first>(Dispatch::all, actors::clip_grad_and_step_atom_v, std::string{}).get();
    ASSERT_TRUE(s) << describe(s.error());
    EXPECT_EQ(s->at("step"), step + 1);
    ASSERT_TRUE(single->forward_backward({.tokens = {.input_ids = ids, .attention_mask = mask}}, {}));
    ASSERT_TRUE(single->clip_grad_and_step());
  }
  auto weights = group.call<Collect::flatten>(Dispatch::all, actors::export_weights_atom::value, std::string{}).get();
  ASSERT_TRUE(weights) << describe(weights.error());
  // Flattened: rank 0's named tensors, then rank 1's.
  auto expected = *single->model().named_parameters();
  const auto n = expected.size();
  ASSERT_EQ(weights->size(), 2 * n);
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, want] = expected[i];
    EXPECT_EQ((*weights)[i].first, name);
    EXPECT_EQ((*weights)[i].second, (*weights)[n + i].second) << name << " differs between the dp ranks";
    auto got = *(*weights)[i].second.values<float>();
    auto ref = *want.values<float>();
    // Within 1e-5, relative to the weight's size as at::allclose (the same
    // sums in another order, amplified a little by Adam's normalisation).
    double worst = 0;
    for (size_t k = 0; k < ref.size(); ++k)
      worst = std::max(worst, std::abs(got[k] - ref[k]) / (1.0 + std::abs(static_cast<double>(ref[k]))));
    EXPECT_LT(worst, 1e-5) << name;
  }
  auto metrics = group.call<Collect::first>(Dispatch::all, actors::calculate_metric_atom::value, std::string{}).get();
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->at("step"), 5);
  EXPECT_GT(metrics->at("loss"), 0);
}

// A mesh the group cannot honour is refused at spawn: before, tp=2 ranks
// were each given the whole batch as if they were one data-parallel rank.
// The model group runs dp with one of fsdp, tp and pp; the sampler only dp.
TEST_P(ModelActorTest, AMeshWithDimensionsTheGroupDoesNotRunIsRefused) {
  for (auto sizes : {placement::MeshSizes{.cp = 2}}) {
    auto mesh = placement::DeviceMesh::from_sizes(sizes);
    ASSERT_TRUE(mesh);
    auto g = actors::spawn_model_group(*job_.rt, placement::DeviceGroup::of("model", 2), *mesh,
                                       {.config_json = tiny().to_json(), .seed = 7});
    ASSERT_FALSE(g) << mesh->describe();
    EXPECT_NE(describe(g.error()).find("model group 'model' cannot run on mesh"), std::string::npos)
        << describe(g.error());
  }
  auto both = placement::DeviceMesh::from_sizes({.fsdp = 2, .tp = 2});
  ASSERT_TRUE(both);
  auto g = actors::spawn_model_group(*job_.rt, placement::DeviceGroup::of("model", 4), *both,
                                     {.config_json = tiny().to_json(), .seed = 7});
  ASSERT_FALSE(g);
  EXPECT_NE(describe(g.error()).find("combines tp or pp with another cut"), std::string::npos) << describe(g.error());
  for (auto sizes : {placement::MeshSizes{.tp = 2}, placement::MeshSizes{.pp = 2}, placement::MeshSizes{.fsdp = 2}}) {
    auto mesh = placement::DeviceMesh::from_sizes(sizes);
    ASSERT_TRUE(mesh);
    auto s = actors::spawn_sampler_group(*job_.rt, placement::DeviceGroup::of("sampler", 2), *mesh,
                                         {.config_json = tiny().to_json(), .seed = 7});
    ASSERT_FALSE(s) << mesh->describe();
  }
}

// The largest |a - b| / (1 + |b|) of two f32 tensors of one shape.
double worst_difference(const Tensor& x, const Tensor& y) {
  auto a = *x.values<float>();
  auto b = *y.values<float>();
  double worst = 0;
  for (size_t k = 0; k < b.size(); ++k)
    worst = std::max(worst, std::abs(a[k] - b[k]) / (1.0 + std::abs(static_cast<double>(b[k]))));
  return worst;
}

// One step of the group on `batch` and of the single trainer on the same
// rows (`whole`): the same loss and gradient norm within 1e-5.
void step_both(actors::ModelGroup& model, components::Trainer& single, const Batch& batch,
               const components::TrainBatch& whole) {
  auto m = model.forward_backward(batch).take();
  ASSERT_TRUE(m) << describe(m.error());
  auto want = single.forward_backward(whole, {});
  ASSERT_TRUE(want);
  EXPECT_NEAR(m->at("loss"), want->at("loss"), 1e-5);
  auto s = model.clip_grad_and_step().take();
  ASSERT_TRUE(s) << describe(s.error());
  auto ws = single.clip_grad_and_step();
  ASSERT_TRUE(ws);
  EXPECT_NEAR(s->at("grad_norm"), ws->at("grad_norm"), 1e-5 * (1 + ws->at("grad_norm")));
}

// `got` names and holds `want`'s tensors, in its order, within 1e-5.
void expect_same_weights(const NamedTensors& got, const NamedTensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    ASSERT_EQ(got[i].second.shape(), want[i].second.shape()) << what << " " << want[i].first;
    EXPECT_LT(worst_difference(got[i].second, want[i].second), 1e-5) << what << " " << want[i].first;
  }
}

// A model group cut over its ranks (FSDP, TP, PP on two; each with dp = 2
// on four, whose groups of ranks 2 and 3 meet through rank 0's store) trains
// as one trainer on the whole batch, through the driver's ModelGroup: the
// batch goes to the ranks by their data coordinate (FSDP and dp cut it; the
// TP and PP ranks of a replica share theirs and answer once for it), and saves,
// exports and forward_only gather the whole model. The saved directory
// loads as a plain model with the same weights (the mesh is not in it), and
// with its per-rank optimizer state back into the group.
TEST_P(ModelActorTest, AModelCutOverItsRanksTrainsAsOneTrainerOnTheWholeBatch) {
  // tiny()'s 31 rows of vocabulary split 16 and 15 over the TP ranks.
  auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}});
  auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  const auto batch = batch_of(ids, mask);
  // SGD with momentum, as the data-parallel test above: sums in another
  // order stay within 1e-5.
  const actors::OptimizerConfig opt{.kind = actors::OptimizerConfig::Kind::sgd, .lr = 0.1, .momentum = 0.9};
  struct Case {
    const char* name;  ///< the group's
    const char* cut;   ///< the dimension the model is cut along
    placement::MeshSizes sizes;
  };
  const Case meshes[] = {{"fsdp", "fsdp", {.fsdp = 2}},        {"tp", "tp", {.tp = 2}},
                         {"pp", "pp", {.pp = 2}},              {"hsdp", "fsdp", {.dp = 2, .fsdp = 2}},
                         {"dp-tp", "tp", {.dp = 2, .tp = 2}}, {"dp-pp", "pp", {.dp = 2, .pp = 2}}};
  const auto tmp = testing::fresh_dir("cut-model");
  for (const auto& [name, cut, sizes] : meshes) {
    SCOPED_TRACE(name);
    auto mesh = placement::DeviceMesh::from_sizes(sizes);
    ASSERT_TRUE(mesh);
    auto g = actors::open_model_group(*job_.rt, placement::DeviceGroup::of(name, mesh->world_size()), *mesh,
                                      {.config_json = tiny().to_json(), .seed = 7});
    ASSERT_TRUE(g) << describe(g.error());
    auto model = *g;
    ASSERT_TRUE(model.set_optimizer(opt).take());
    auto single = components::Trainer::create(*components::CausalLM::init_random(tiny(), 7), {.optimizer = opt});
    ASSERT_TRUE(single);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      step_both(model, *single, batch, {.tokens = {.input_ids = ids, .attention_mask = mask}});
    }
    auto expect_weights = [&](const NamedTensors& got, const std::string& what) {
      expect_same_weights(got, *single->model().named_parameters(), what);
    };
    auto exported = model.export_weights().take();
    ASSERT_TRUE(exported) << describe(exported.error());
    expect_weights(*exported, "export_weights");
    // forward_only: one answer per row of the batch (not one per rank).
    auto lp = model.forward_only(batch).take();
    ASSERT_TRUE(lp) << describe(lp.error());
    auto want = single->model().forward({.input_ids = ids, .attention_mask = mask});
    ASSERT_TRUE(want);
    ASSERT_EQ(lp->shape(), want->logprobs.shape());
    auto a = *lp->values<float>();
    auto b = *want->logprobs.values<float>();
    for (size_t k = 0; k < b.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-4) << k;
    // The group trains one tenant: the model is cut for the full model.
    auto other = model.add_adapter("late", {.r = 2}, 1).take();
    ASSERT_FALSE(other);
    EXPECT_NE(describe(other.error()).find("cut over its ranks"), std::string::npos) << describe(other.error());

    const auto dir = tmp + "/" + name;
    auto saved = model.save({.dir = dir, .with_optimizer = true}).take();
    ASSERT_TRUE(saved) << describe(saved.error());
    // One optimizer file per part of the cut (named by it, not by the rank).
    for (int part : {0, 1})
      EXPECT_TRUE(std::filesystem::exists(dir + "/optimizer-" + cut + std::to_string(part) + "-of-2.safetensors"));
    auto plain = components::CausalLM::load(dir);
    ASSERT_TRUE(plain) << describe(plain.error());
    expect_weights(*plain->named_parameters(), "the saved directory");
    // Back into the group with its optimizer state: the next step is the
    // single trainer's next step.
    ASSERT_TRUE(model.load({.dir = dir, .with_optimizer = true}).take());
    auto m = model.forward_backward(batch).take();
    ASSERT_TRUE(m) << describe(m.error());
    ASSERT_TRUE(model.clip_grad_and_step().take());
    ASSERT_TRUE(single->forward_backward({.tokens = {.input_ids = ids, .attention_mask = mask}}, {}));
    ASSERT_TRUE(single->clip_grad_and_step());
    auto after = model.export_weights().take();
    ASSERT_TRUE(after) << describe(after.error());
    expect_weights(*after, "after the load and a step");
    // What the FSDP group saved loads into this mesh (its weights: the
    // optimizer state does not move between cuts), cut again at the next
    // training call, with the same log-probs as the saved model alone.
    if (std::string{name} == "fsdp") continue;
    const auto from_fsdp = tmp + "/fsdp";
    auto with_state = model.load({.dir = from_fsdp, .with_optimizer = true}).take();
    if (std::string{cut} == "fsdp") {
      // The same cut with another dp size (fsdp=2 saved, dp=2 x fsdp=2 here): a resume.
      EXPECT_TRUE(with_state) << describe(with_state.error());
    } else {
      ASSERT_FALSE(with_state);
      EXPECT_NE(describe(with_state.error()).find("from another mesh"), std::string::npos) << describe(with_state.error());
    }
    ASSERT_TRUE(model.load({.dir = from_fsdp}).take());
    ASSERT_TRUE(model.forward_backward(batch).take());  // cuts it
    auto saved_lp = model.forward_only(batch).take();
    ASSERT_TRUE(saved_lp) << describe(saved_lp.error());
    auto alone = components::CausalLM::load(from_fsdp);
    ASSERT_TRUE(alone);
    auto alone_lp = alone->forward({.input_ids = ids, .attention_mask = mask});
    ASSERT_TRUE(alone_lp);
    auto x = *saved_lp->values<float>();
    auto y = *alone_lp->logprobs.values<float>();
    for (size_t k = 0; k < y.size(); ++k) EXPECT_NEAR(x[k], y[k], 1e-4) << k;
  }
}

// A tiny Qwen3-MoE: 4 experts of width 8, 2 per token, in both layers.
components::ModelConfig tiny_moe() {
  auto c = components::ModelConfig::make(components::Architecture::qwen3_moe, 31, 16, 32, 2, 4, 2);
  c.moe.num_experts = 4;
  c.moe.num_experts_per_tok = 2;
  c.moe.moe_intermediate_size = 8;
  c.moe.norm_topk_prob = true;
  return c;
}

// An MoE model group with its experts split over ep ranks (ep = 2; dp 2 x
// ep 2 and fsdp 2 x ep 2 on four) trains as one trainer on the whole batch: each rank takes
// its data coordinate's rows, tokens go to their experts' ranks; export,
// forward_only and save gather the whole model, one optimizer file per ep
// part (and fsdp shard), and the saved directory loads as a plain model and back into the
// group with its state (the next step is the single trainer's). A dense
// model on ep is refused at its first training call, naming why.
TEST_P(ModelActorTest, AnExpertParallelGroupTrainsAsOneTrainerOnTheWholeBatch) {
  auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}});
  auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  const auto batch = batch_of(ids, mask);
  const components::TrainBatch whole{.tokens = {.input_ids = ids, .attention_mask = mask}};
  const actors::OptimizerConfig opt{.kind = actors::OptimizerConfig::Kind::sgd, .lr = 0.1, .momentum = 0.9};
  const auto tmp = testing::fresh_dir("ep-model");
  for (auto sizes : {placement::MeshSizes{.ep = 2}, placement::MeshSizes{.dp = 2, .ep = 2},
                     placement::MeshSizes{.fsdp = 2, .ep = 2}}) {
    auto mesh = placement::DeviceMesh::from_sizes(sizes);
    ASSERT_TRUE(mesh);
    SCOPED_TRACE(mesh->describe());
    const std::string name = "ep" + std::to_string(mesh->world_size()) + (sizes.fsdp > 1 ? "-fsdp" : "");
    auto g = actors::open_model_group(*job_.rt, placement::DeviceGroup::of(name, mesh->world_size()), *mesh,
                                      {.config_json = tiny_moe().to_json(), .seed = 7});
    ASSERT_TRUE(g) << describe(g.error());
    auto model = *g;
    ASSERT_TRUE(model.set_optimizer(opt).take());
    auto single = components::Trainer::create(*components::CausalLM::init_random(tiny_moe(), 7), {.optimizer = opt});
    ASSERT_TRUE(single);
    auto step = [&] { step_both(model, *single, batch, whole); };
    for (int i = 0; i < 3; ++i) step();
    auto expect_weights = [&](const NamedTensors& got, const std::string& what) {
      expect_same_weights(got, *single->model().named_parameters(), what);
    };
    auto exported = model.export_weights().take();
    ASSERT_TRUE(exported) << describe(exported.error());
    expect_weights(*exported, "export_weights");
    auto lp = model.forward_only(batch).take();
    ASSERT_TRUE(lp) << describe(lp.error());
    auto want = single->model().forward(whole.tokens);
    ASSERT_TRUE(want);
    ASSERT_EQ(lp->shape(), want->logprobs.shape());
    EXPECT_LT(worst_difference(*lp, want->logprobs), 1e-4);
    const auto dir = tmp + "/" + name;
    auto saved = model.save({.dir = dir, .with_optimizer = true}).take();
    ASSERT_TRUE(saved) << describe(saved.error());
    for (int part : {0, 1})
      for (int shard : {0, 1}) {
        const auto e = "ep" + std::to_string(part) + "-of-2";
        const auto file = sizes.fsdp > 1 ? "optimizer-fsdp" + std::to_string(shard) + "-of-2-" + e : "optimizer-" + e;
        EXPECT_TRUE(std::filesystem::exists(dir + "/" + file + ".safetensors")) << file;
      }
    auto plain = components::CausalLM::load(dir);
    ASSERT_TRUE(plain) << describe(plain.error());
    expect_weights(*plain->named_parameters(), "the saved directory");
    ASSERT_TRUE(model.load({.dir = dir, .with_optimizer = true}).take());
    step();
    auto after = model.export_weights().take();
    ASSERT_TRUE(after) << describe(after.error());
    expect_weights(*after, "after the load and a step");
  }
  auto mesh = placement::DeviceMesh::from_sizes({.ep = 2});
  auto dense = actors::open_model_group(*job_.rt, placement::DeviceGroup::of("dense-ep", 2), *mesh,
                                        {.config_json = tiny().to_json(), .seed = 7});
  ASSERT_TRUE(dense) << describe(dense.error());
  auto refused = dense->forward_backward(batch).take();
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("has none"), std::string::npos) << describe(refused.error());
}

TEST_P(ModelActorTest, BadInputGetsAClearErrorAndTheNextCallIsServed) {
  auto group = spawn({.config_json = tiny().to_json(), .seed = 1});
  auto ok_batch = batch_of(ids_of({{1, 2, 3}, {4, 5, 6}}), ids_of({{1, 1, 1}, {1, 1, 1}}));
  auto call = [&](const Batch& b, const std::string& adapter = "") {
    return group.call<Collect::mean>(Dispatch::slice_dp, actors::forward_backward_atom_v, b, adapter).get();
  };
  auto oov = call(batch_of(ids_of({{1, 2, 31}, {4, 5, 6}}), ids_of({{1, 1, 1}, {1, 1, 1}})));
  ASSERT_FALSE(oov);
  EXPECT_NE(describe(oov.error()).find("outside the vocabulary"), std::string::npos) << describe(oov.error());
  EXPECT_NE(describe(oov.error()).find("of model group 'model'"), std::string::npos) << describe(oov.error());
  auto shapes = call(batch_of(ids_of({{1, 2, 3}, {4, 5, 6}}), ids_of({{1, 1}, {1, 1}})));
  ASSERT_FALSE(shapes);
  EXPECT_NE(describe(shapes.error()).find("attention_mask is i64[1, 2]"), std::string::npos) << describe(shapes.error());
  auto unknown = call(ok_batch, "tenant-x");
  ASSERT_FALSE(unknown);
  EXPECT_NE(describe(unknown.error()).find("no adapter 'tenant-x'"), std::string::npos);
  auto nan_batch = ok_batch;
  nan_batch.tensors["advantages"] = *Tensor::from_values(std::vector<float>{1.f, NAN}, {2});
  ASSERT_TRUE((group.call<Collect::first>(Dispatch::all, actors::set_loss_atom::value, std::string{},
                                          actors::LossSpec{.kind = actors::LossKind::grpo})
                   .get()));
  auto nan = call(nan_batch);
  ASSERT_FALSE(nan);
  EXPECT_NE(describe(nan.error()).find("NaN"), std::string::npos) << describe(nan.error());
  // A loss kind from another process can hold any number.
  auto bad_loss = group.call<Collect::first>(Dispatch::all, actors::set_loss_atom::value, std::string{},
                                             actors::LossSpec{.kind = static_cast<actors::LossKind>(42)})
                      .get();
  ASSERT_FALSE(bad_loss);
  EXPECT_NE(describe(bad_loss.error()).find("kind 42"), std::string::npos) << describe(bad_loss.error());
  // Still serving.
  auto adv = ok_batch;
  adv.tensors["advantages"] = *Tensor::from_values(std::vector<float>{1.f, -1.f}, {2});
  auto good = call(adv);
  ASSERT_TRUE(good) << describe(good.error());
  EXPECT_TRUE((group.call<Collect::first>(Dispatch::all, actors::clip_grad_and_step_atom_v, std::string{}).get()));
}

TEST_P(ModelActorTest, BrokenWeightsAreAnErrorOnEveryCall) {
  auto dir = glint::testing::fresh_dir("actor-broken-model");
  auto lm = components::CausalLM::init_random(tiny(), 2);
  ASSERT_TRUE(lm->save(dir));
  std::filesystem::resize_file(dir + "/model.safetensors", std::filesystem::file_size(dir + "/model.safetensors") / 3);
  auto group = spawn({.model_dir = dir});
  auto r = group.call<Collect::first>(Dispatch::all, actors::get_train_configs_atom::value, std::string{}).get();
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("truncated"), std::string::npos) << describe(r.error());
  // A good model loads over it, and then it serves.
  auto good = glint::testing::fresh_dir("actor-good-model");
  ASSERT_TRUE(lm->save(good));
  ASSERT_TRUE((group.call<Collect::first>(Dispatch::all, actors::load_atom::value, std::string{}, good, false).get()));
  auto cfg = group.call<Collect::first>(Dispatch::all, actors::get_train_configs_atom::value, std::string{}).get();
  ASSERT_TRUE(cfg) << describe(cfg.error());
  EXPECT_NE(cfg->find("Qwen3ForCausalLM"), std::string::npos) << *cfg;
}

TEST_P(ModelActorTest, AdaptersTrainSaveAndLoadThroughTheActor) {
  auto group = spawn({.config_json = tiny().to_json(), .seed = 3}, 1);
  auto call1 = [&](auto... xs) { return group.call<Collect::first>(Dispatch::all, xs...).get(); };
  ASSERT_TRUE(call1(actors::add_adapter_atom::value, std::string{"alice"}, actors::LoraConfig{.r = 4}, uint64_t{1}));
  auto dupe = call1(actors::add_adapter_atom::value, std::string{"alice"}, actors::LoraConfig{}, uint64_t{0});
  ASSERT_FALSE(dupe);
  ASSERT_TRUE(call1(actors::set_optimizer_atom::value, std::string{"alice"}, actors::OptimizerConfig{.lr = 1e-2}));
  auto b = batch_of(ids_of({{1, 2, 3, 4}}), ids_of({{1, 1, 1, 1}}));
  auto base = call1(actors::forward_only_atom_v, b, std::string{});
  ASSERT_TRUE(base) << describe(base.error());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(call1(actors::forward_backward_atom_v, b, std::string{"alice"}));
    ASSERT_TRUE(call1(actors::clip_grad_and_step_atom_v, std::string{"alice"}));
  }
  auto tuned = call1(actors::forward_only_atom_v, b, std::string{"alice"});
  ASSERT_TRUE(tuned);
  EXPECT_NE(*tuned, *base);
  EXPECT_EQ(*call1(actors::forward_only_atom_v, b, std::string{}), *base) << "the base moved";
  auto dir = glint::testing::fresh_dir("actor-adapter-" + std::to_string(static_cast<int>(GetParam())));
  auto saved = call1(actors::save_atom::value, std::string{"alice"}, dir, true, components::default_max_shard_bytes);
  ASSERT_TRUE(saved) << describe(saved.error());
  EXPECT_TRUE(std::filesystem::exists(dir + "/adapter_model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/optimizer.safetensors"));
  ASSERT_TRUE(call1(actors::load_atom::value, std::string{"bob"}, dir, true));
  EXPECT_EQ(*call1(actors::forward_only_atom_v, b, std::string{"bob"}), *tuned);
  // A failed load leaves the adapter it would have replaced as it was.
  auto broken = glint::testing::fresh_dir("actor-adapter-broken-" + std::to_string(static_cast<int>(GetParam())));
  std::filesystem::copy(dir, broken, std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(broken + "/adapter_model.safetensors", 100);
  auto failed = call1(actors::load_atom::value, std::string{"bob"}, broken, false);
  ASSERT_FALSE(failed);
  EXPECT_EQ(*call1(actors::forward_only_atom_v, b, std::string{"bob"}), *tuned);
  auto lora = call1(actors::export_weights_atom::value, std::string{"bob"});
  ASSERT_TRUE(lora);
  EXPECT_EQ(lora->front().first, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  auto cfg = call1(actors::get_train_configs_atom::value, std::string{"bob"});
  ASSERT_TRUE(cfg);
  EXPECT_NE(cfg->find("\"step\": 3"), std::string::npos) << *cfg;
  ASSERT_TRUE(call1(actors::remove_adapter_atom::value, std::string{"alice"}));
  EXPECT_FALSE(call1(actors::forward_only_atom_v, b, std::string{"alice"}));
}

INSTANTIATE_TEST_SUITE_P(Modes, ModelActorTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return info.param == Mode::local ? "local" : "cluster"; });

}  // namespace
}  // namespace glint
