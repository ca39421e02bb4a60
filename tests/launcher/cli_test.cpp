// The glint binary as a user meets it: help, bad input, a cluster job.
#include "runtime/memory.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include <array>
#include <chrono>
#include <csignal>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

struct Run {
  int code;
  std::string out;
};

Run run(const std::string& args) {
  std::string cmd = std::string{GLINT_BINARY} + " " + args + " 2>&1";
  Run r{-1, {}};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (auto n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A tiny chat model in dir/model: a ChatML tokenizer trained on generated
// arithmetic (dir/arith.jsonl). Returns its path ("" where it failed: the
// test has failed then).
std::string tiny_chat_model(const std::string& dir, const std::string& flags = "") {
  auto data = run("init-data arithmetic " + dir + "/arith.jsonl --rows 200 --seed 3");
  EXPECT_EQ(data.code, 0) << data.out;
  auto model = run("init-model " + dir + "/model --hidden 32 --intermediate 64 --layers 1 --heads 4 --kv-heads 2 --vocab 300 " +
                   flags + " --tokenizer-from " + dir + "/arith.jsonl");
  EXPECT_EQ(model.code, 0) << model.out;
  return data.code == 0 && model.code == 0 ? dir + "/model" : "";
}

TEST(Cli, HelpListsTheSubcommands) {
  auto r = run("--help");
  EXPECT_EQ(r.code, 0);
  for (auto* s : {"run", "info", "demo", "bench"}) EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(Cli, InfoShowsTheMachine) {
  auto r = run("info");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("core"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("glint.probe"), std::string::npos) << r.out;
}

TEST(Cli, InfoPlansAConfigAndExplainsARefusal) {
  auto path = glint::testing::fresh_dir("cli-info") + "/job.toml";
  std::ofstream{path} << "[[group]]\nname = \"model\"\nranks = 2\n[[group]]\nname = \"sampler\"\nranks = 1\n"
                         "device_type = \"cuda\"\n";
  auto r = run("info --config " + path + " --nproc 2");
  EXPECT_EQ(r.code, 3) << r.out;  // no GPU here: the sampler group is refused
  EXPECT_NE(r.out.find("group 'sampler' needs 1 cuda devices"), std::string::npos) << r.out;
  std::ofstream{path} << "[[group]]\nname = \"model\"\nranks = 2\nmesh = { dp = 2 }\n";
  auto ok = run("info --config " + path + " --nproc 2");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("rank 1 -> node 1"), std::string::npos) << ok.out;
}

TEST(Cli, BenchActorsPrintsItsLinesWithTheirBaselines) {
  auto r = run("bench actors --mode local --repeats 1");
  EXPECT_EQ(r.code, 0) << r.out;
  for (auto* line : {"actor_rtt_local_us: ", "caf_rtt_local_us: ", "actor_calls_per_s_local: ",
                     "actor_rtt_local_detached_us: "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  auto bad = run("bench actors --mode sideways");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--mode"), std::string::npos) << bad.out;
}

TEST(Cli, BenchTrainSmokeRunPrintsItsLinesAndAgreesWithPython) {
  // Needs /usr/bin/python3 with torch (scripts/setup.sh installs python3-torch).
  // MoE models too: the Python side writes the sparse block as transformers
  // does, so their first losses agreeing checks glint's block once more.
  for (std::string mode : {"", " --lora", " --arch qwen3_moe --lora", " --arch qwen2_moe"}) {
    auto r = run("bench train --small --repeats 1 --steps 1" + mode);
    EXPECT_EQ(r.code, 0) << r.out;
    for (auto* line : {"train_tokens_per_s: ", "train_python_tokens_per_s: ", "train_speedup_vs_python: ", "train_mfu: "})
      EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
    if (mode.find("moe") != std::string::npos)
      for (auto* line : {"moe_train_speedup_vs_python: ", "moe_grouped_vs_dense_experts: "})
        EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
    EXPECT_EQ(r.out.find("# warning"), std::string::npos) << r.out;
  }
  auto missing = run("bench train --small --repeats 1 --steps 1 --python /nonexistent/python3");
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_NE(missing.out.find("install python3-torch"), std::string::npos) << missing.out;
}

TEST(Cli, BenchSampleSmokeRunPrintsItsLinesAndAgreesWithPythonAndLlamaCpp) {
  const std::string args = "bench sample --small --repeats 1 --prompts 6 --samples 2 --max-tokens 8 --max-prompt 48";
  // llama.cpp where scripts/setup_llamacpp.sh installed it (scripts/test.sh does), else without.
  auto r = run(args + " --llamacpp installed");
  const bool llama = r.out.find("llama.cpp is not installed") == std::string::npos;
  if (!llama) r = run(args + " --llamacpp none");
  EXPECT_EQ(r.code, 0) << r.out;
  for (auto* line : {"sample_tokens_per_s: ", "sample_python_tokens_per_s: ", "sample_speedup_vs_python: ",
                     "prefix_cache_hit_rate: "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  for (auto* line : {"sample_llamacpp_tokens_per_s: ", "sample_speedup_vs_llamacpp: ", "greedy check against llama.cpp"})
    EXPECT_EQ(r.out.find(line) != std::string::npos, llama) << line << "\n" << r.out;
  EXPECT_EQ(r.out.find("# warning"), std::string::npos) << r.out;
  auto bad = run("bench sample --small --min-prompt 40 --max-prompt 20");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("--max-prompt"), std::string::npos) << bad.out;
  // An MoE model against the dense model of its active size, and llama.cpp's qwen3moe where installed.
  auto moe = run("bench sample --arch qwen3_moe --small --repeats 1 --prompts 4 --samples 2 --max-tokens 8 --max-prompt 48" +
                 std::string{llama ? " --llamacpp installed" : " --llamacpp none"});
  EXPECT_EQ(moe.code, 0) << moe.out;
  for (auto* line : {"moe_sample_tokens_per_s: ", "moe_sample_dense_tokens_per_s: ", "moe_sample_vs_dense_same_active: "})
    EXPECT_NE(moe.out.find(line), std::string::npos) << line << "\n" << moe.out;
  for (auto* line : {"moe_sample_llamacpp_tokens_per_s: ", "moe_sample_speedup_vs_llamacpp: ", "greedy check against llama.cpp"})
    EXPECT_EQ(moe.out.find(line) != std::string::npos, llama) << line << "\n" << moe.out;
  EXPECT_EQ(moe.out.find("# warning"), std::string::npos) << moe.out;
}

TEST(Cli, ExportGgufWritesTheModelAndRefusesWithReasons) {
  auto dir = glint::testing::fresh_dir("export-gguf");
  ASSERT_EQ(run("init-data arithmetic " + dir + "/arith.jsonl --rows 200").code, 0);
  auto model = run("init-model " + dir + "/m --hidden 32 --intermediate 64 --layers 1 --heads 4 --kv-heads 2 --vocab 300 "
                   "--tokenizer-from " + dir + "/arith.jsonl");
  ASSERT_EQ(model.code, 0) << model.out;
  auto r = run("export gguf " + dir + "/m " + dir + "/m.gguf --dtype f16");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("wrote " + dir + "/m.gguf: qwen3, 14 tensors (f16)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenizer.ggml.pre qwen2"), std::string::npos) << r.out;
  std::ifstream f{dir + "/m.gguf", std::ios::binary};
  std::string magic(4, '\0');
  f.read(magic.data(), 4);
  EXPECT_EQ(magic, "GGUF");
  auto again = run("export gguf " + dir + "/m " + dir + "/m.gguf");
  EXPECT_EQ(again.code, 2) << again.out;
  EXPECT_NE(again.out.find("--force"), std::string::npos) << again.out;
  EXPECT_EQ(run("export gguf " + dir + "/m " + dir + "/m.gguf --force").code, 0);
  // No tokenizer: llama.cpp needs the vocabulary.
  ASSERT_EQ(run("init-model " + dir + "/bare --hidden 32 --intermediate 64 --layers 1 --heads 4 --vocab 50").code, 0);
  auto bare = run("export gguf " + dir + "/bare " + dir + "/bare.gguf");
  EXPECT_EQ(bare.code, 2) << bare.out;
  EXPECT_NE(bare.out.find("tokenizer.json is missing"), std::string::npos) << bare.out;
  EXPECT_NE(bare.out.find("--tokenizer"), std::string::npos) << bare.out;
  // ... which --tokenizer can bring from elsewhere (vocabularies of 50 and ~300 ids do not fit, and that is said).
  auto other = run("export gguf " + dir + "/bare " + dir + "/bare.gguf --tokenizer " + dir + "/m");
  EXPECT_EQ(other.code, 2) << other.out;
  EXPECT_NE(other.out.find("past the model's vocabulary of 50"), std::string::npos) << other.out;
  auto dtype = run("export gguf " + dir + "/m " + dir + "/x.gguf --dtype f64");
  EXPECT_NE(dtype.code, 0);
  EXPECT_NE(dtype.out.find("--dtype"), std::string::npos) << dtype.out;
  EXPECT_NE(run("export gguf " + dir + "/nowhere " + dir + "/y.gguf").code, 0);
}

TEST(Cli, BenchSyncSmokeRunPrintsItsLinesInBothModes) {
  auto r = run("bench sync --small --repeats 1 --mode all");
  EXPECT_EQ(r.code, 0) << r.out;
  for (auto* line : {"memcpy_gbps: ", "weight_sync_gbps_1m: ", "weight_sync_vs_memcpy_5m: ",
                     "weight_sync_cluster_gbps_5m: "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
}

TEST(Cli, BenchParallelSmokeRunPrintsItsLines) {
  auto r = run("bench parallel --small --repeats 1 --steps 1");
  EXPECT_EQ(r.code, 0) << r.out;
  for (auto* line : {"dp2_state_bytes: ", "fsdp2_state_bytes_vs_dp: 0.5", "fsdp2_tokens_per_s_vs_dp: ",
                     "dp2_bytes_per_step: ", "fsdp2_bytes_theory: ", "tp2_state_bytes_vs_dp: ", "tp2_bytes_per_step: ",
                     "pp2_state_bytes_vs_dp: ", "pp2_tokens_per_s_vs_dp: ", "pp2_bytes_theory: "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_NE(run("bench parallel --seq 1").code, 0);
  // Expert parallelism on the MoE bench model: ep2 holds half the experts.
  auto ep = run("bench parallel --arch qwen3_moe --small --repeats 1 --steps 1");
  EXPECT_EQ(ep.code, 0) << ep.out;
  for (auto* line : {"ep1_expert_bytes: ", "ep2_expert_bytes_vs_ep1: 0.500", "ep2_tokens_per_s_vs_ep1: ",
                     "ep2_all_to_all_bytes_per_step: ", "ep2_all_to_all_bytes_even_routing: "})
    EXPECT_NE(ep.out.find(line), std::string::npos) << line << "\n" << ep.out;
}

TEST(Cli, InitModelWritesAHuggingFaceDirectory) {
  auto dir = glint::testing::fresh_dir("init-model");
  auto r = run("init-model " + dir + " --arch llama --hidden 32 --intermediate 64 --layers 1 --heads 4 --vocab 50 --seed 3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("LlamaForCausalLM"), std::string::npos) << r.out;
  std::ifstream cfg{dir + "/config.json"};
  std::string text{std::istreambuf_iterator<char>(cfg), {}};
  EXPECT_NE(text.find("\"vocab_size\": 50"), std::string::npos) << text;
  std::ifstream weights{dir + "/model.safetensors"};
  EXPECT_TRUE(weights.good());
  auto bad = run("init-model " + dir + " --heads 3 --hidden 32");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("must divide num_attention_heads"), std::string::npos) << bad.out;
  auto arch = run("init-model " + dir + " --arch gpt2");
  EXPECT_NE(arch.code, 0);
  EXPECT_NE(arch.out.find("--arch"), std::string::npos) << arch.out;
}

TEST(Cli, InitDataAndATrainedTokenizerMakeAChatModelDirectory) {
  auto dir = glint::testing::fresh_dir("init-data");
  auto data = run("init-data arithmetic " + dir + "/arith.jsonl --rows 300 --seed 2");
  ASSERT_EQ(data.code, 0) << data.out;
  EXPECT_NE(data.out.find("300 arithmetic rows"), std::string::npos) << data.out;
  auto model = run("init-model " + dir + "/model --hidden 32 --intermediate 64 --layers 1 --heads 4 --kv-heads 2 --vocab 300 "
                   "--tokenizer-from " + dir + "/arith.jsonl");
  ASSERT_EQ(model.code, 0) << model.out;
  std::ifstream cfg{dir + "/model/config.json"}, tok{dir + "/model/tokenizer.json"}, tcfg{dir + "/model/tokenizer_config.json"};
  std::string config{std::istreambuf_iterator<char>(cfg), {}}, tokenizer{std::istreambuf_iterator<char>(tok), {}},
      tconfig{std::istreambuf_iterator<char>(tcfg), {}};
  // The model's vocabulary and eos follow the trained tokenizer (which
  // stops early: arithmetic text has few pairs worth merging).
  auto c = nlohmann::json::parse(config), t = nlohmann::json::parse(tokenizer);
  int64_t im_end = -1, last = -1;
  for (const auto& a : t["added_tokens"]) {
    if (a["content"] == "<|im_end|>") im_end = a["id"];
    last = std::max<int64_t>(last, a["id"]);
  }
  EXPECT_EQ(c["vocab_size"], last + 1);
  EXPECT_LE(c["vocab_size"].get<int64_t>(), 300);
  EXPECT_GT(c["vocab_size"].get<int64_t>(), 256 + 3);
  EXPECT_EQ(c["eos_token_id"], im_end);
  EXPECT_NE(tconfig.find("chat_template"), std::string::npos);
  auto missing = run("init-model " + dir + "/m2 --tokenizer-from " + dir + "/nope.jsonl");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("cannot read dataset"), std::string::npos) << missing.out;
  auto kind = run("init-data poems " + dir + "/p.jsonl");
  EXPECT_NE(kind.code, 0);
}

// `glint template`: the text the model's own chat template renders, exactly;
// --ids adds the tokens and which of them the loss counts; a template's
// raise_exception is the exit code and its message.
TEST(Cli, TemplatePrintsTheModelsChatTemplateAndWhatTheLossCounts) {
  auto dir = glint::testing::fresh_dir("cli-template");
  ASSERT_FALSE(tiny_chat_model(dir).empty());
  std::ofstream{dir + "/chat.json"} << R"([{"role": "system", "content": "Add."}, {"role": "user", "content": "2+3"},
    {"role": "assistant", "content": "5"}, {"role": "user", "content": "4+4"}, {"role": "assistant", "content": "8"}])";
  auto text = run("template --model " + dir + "/model --messages " + dir + "/chat.json");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_EQ(text.out, "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n2+3<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
                      "<|im_start|>user\n4+4<|im_end|>\n<|im_start|>assistant\n8<|im_end|>\n");
  auto prompt = run("template --model " + dir + "/model --messages " + dir + "/chat.json --add-generation-prompt");
  EXPECT_TRUE(prompt.out.ends_with("<|im_start|>assistant\n")) << prompt.out;
  // --ids: the tokens the loss counts are each assistant's text and its
  // <|im_end|>: "5", "<|im_end|>", "8", "<|im_end|>" (a position marked 1
  // counts the token after it).
  auto ids = run("template --model " + dir + "/model --messages " + dir + "/chat.json --ids");
  ASSERT_EQ(ids.code, 0) << ids.out;
  EXPECT_NE(ids.out.find("4 learned"), std::string::npos) << ids.out;
  std::vector<std::string> learned;
  std::istringstream lines{ids.out.substr(ids.out.find("position\tid\tmask\ttoken"))};
  std::string line;
  bool next_learned = false;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    const std::string token = line.substr(line.rfind('\t') + 1);
    if (next_learned) learned.push_back(token);
    next_learned = line.find("\t1\t") != std::string::npos;
  }
  EXPECT_EQ(learned, (std::vector<std::string>{"5", "<|im_end|>", "8", "<|im_end|>"})) << ids.out;
  // A template that raises: exit 1 with its message; one that does not parse: the line.
  std::ofstream{dir + "/strict.jinja"} << "{% for m in messages %}{% if m.role == 'system' %}"
                                          "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}";
  auto raised = run("template --chat-template " + dir + "/strict.jinja --messages " + dir + "/chat.json");
  EXPECT_EQ(raised.code, 1);
  EXPECT_NE(raised.out.find("raised an exception: System role not supported"), std::string::npos) << raised.out;
  std::ofstream{dir + "/broken.jinja"} << "ok\n{% if x %}";
  auto broken = run("template --chat-template " + dir + "/broken.jinja --messages " + dir + "/chat.json");
  EXPECT_EQ(broken.code, 1);
  EXPECT_NE(broken.out.find("cannot be parsed"), std::string::npos) << broken.out;
  EXPECT_NE(run("template --messages " + dir + "/chat.json").code, 0);
  auto bad = run("template --chat-template " + dir + "/strict.jinja --messages " + dir + "/arith.jsonl");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("is not JSON"), std::string::npos) << bad.out;
}

// glint sft on agent rows (OpenAI's tool calls and tool messages) through
// the model's own chat template (Qwen2.5's), and on a CSV file.
TEST(Cli, SftTrainsAgentRowsThroughTheModelsTemplateAndReadsCsv) {
  auto dir = glint::testing::fresh_dir("cli-agent");
  ASSERT_FALSE(tiny_chat_model(dir, "--max-positions 1024").empty());
  {
    std::ifstream in{std::string{GLINT_TEST_SOURCE_DIR} + "/data/chat_templates/qwen2.5.jinja"};
    std::ofstream{dir + "/model/chat_template.jinja"} << in.rdbuf();
  }
  {
    std::ofstream rows{dir + "/agent.jsonl"};
    for (int i = 0; i < 16; ++i)
      rows << R"({"tools": [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}], )"
           << R"("messages": [{"role": "user", "content": "What is )" << i << R"( + 2?"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": ")"
           << i << R"(+2"}}}]}, {"role": "tool", "content": ")" << i + 2 << R"("}, {"role": "assistant", "content": "It is )" << i + 2 << R"(."}]})" << "\n";
    std::ofstream csv{dir + "/rows.csv"};
    csv << "query,response\n";
    for (int i = 0; i < 16; ++i) csv << "\"What is " << i << ", plus 1?\"," << i + 1 << "\n";
  }
  auto agent = run("sft --model " + dir + "/model --dataset " + dir + "/agent.jsonl --max-steps 2 --output " + dir + "/ra");
  ASSERT_EQ(agent.code, 0) << agent.out;
  EXPECT_NE(agent.out.find("on 16 rows (no rows skipped)"), std::string::npos) << agent.out;
  auto csv = run("sft --model " + dir + "/model --dataset " + dir + "/rows.csv --max-steps 2 --output " + dir + "/rc");
  ASSERT_EQ(csv.code, 0) << csv.out;
  EXPECT_NE(csv.out.find("on 16 rows (no rows skipped)"), std::string::npos) << csv.out;
}

TEST(Cli, BenchTemplatePrintsItsLinesWithTheJinja2Baseline) {
  auto r = run("bench template --repeats 1");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* line : {"jinja_render_us: ", "jinja2_render_us: ", "jinja_vs_jinja2: ", "jinja_vs_jinja2_min: ",
                           "chat_cpp_vs_jinja_encode: "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
}

TEST(Cli, MalformedConfigIsAClearError) {
  auto path = glint::testing::fresh_dir("cli-bad") + "/bad.toml";
  std::ofstream{path} << "[[group]\n";
  auto r = run("info --config " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("malformed TOML"), std::string::npos) << r.out;
}

TEST(Cli, RunWithoutACommandSaysHow) {
  auto r = run("run --nproc 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("command"), std::string::npos) << r.out;
  auto z = run("run --nproc 0 -- true");
  EXPECT_NE(z.code, 0);
  EXPECT_NE(z.out.find("--nproc: Value 0 not in range 1 to 4096"), std::string::npos) << z.out;
}

TEST(Cli, DemoRunsInLocalAndClusterMode) {
  auto local = run("demo --steps 5");
  EXPECT_EQ(local.code, 0) << local.out;
  EXPECT_NE(local.out.find("local mode"), std::string::npos) << local.out;
  EXPECT_NE(local.out.find("-> ok"), std::string::npos) << local.out;
  auto cluster = run("run --nproc 2 -- " + std::string{GLINT_BINARY} + " demo --steps 5");
  EXPECT_EQ(cluster.code, 0) << cluster.out;
  EXPECT_NE(cluster.out.find("cluster mode, 2 processes"), std::string::npos) << cluster.out;
  EXPECT_NE(cluster.out.find("-> ok"), std::string::npos) << cluster.out;
}

// A process that dies before it registers (here: at once, with code 3) is
// reported at once with how it ended, and the job stops; the driver used to
// wait out its 60 s connect timeout. Bounded: the driver would sleep 60 s.
TEST(Cli, AProcessThatDiesEarlyIsReportedAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run(R"(run --nproc 2 --grace 2 -- bash -c 'if [ "$GLINT_RANK" = 1 ]; then exit 3; fi; exec sleep 60')");
  const auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 20) << r.out;
  EXPECT_NE(r.out.find("process 1 (pid"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited with code 3; stopping the job"), std::string::npos) << r.out;
  EXPECT_NE(r.code, 0);
}

// A node process that exits 0 without joining (its program returned early
// on that rank) is reported within seconds and the job stops; the driver
// (glint demo) used to wait out its 60 s connect timeout. A job of plain
// programs that end together is not a failure.
TEST(Cli, ANodeThatLeavesWithoutJoiningIsReportedWithinSeconds) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run(R"(run --nproc 2 --grace 2 -- bash -c 'if [ "$GLINT_RANK" = 1 ]; then exit 0; fi; exec )" +
               std::string{GLINT_BINARY} + " demo --steps 5'");
  const auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 20) << r.out;
  EXPECT_NE(r.out.find("process 1 (pid"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited with code 0 without joining the job, and the driver is still waiting for it"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.code, 0);
  auto plain = run("run --nproc 3 -- true");
  EXPECT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("without joining"), std::string::npos) << plain.out;
}

// A program that is not there is a clear error, found as execvp would.
TEST(Cli, RunningAProgramThatIsNotThereSaysSo) {
  auto r = run("run --nproc 1 -- glint-no-such-program-here");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("cannot start 'glint-no-such-program-here': No such file or directory"), std::string::npos)
      << r.out;
}

// A driver that dies by a signal is reported as such, with the signal's name.
TEST(Cli, ADriverKilledByASignalIsReportedAsSuch) {
  auto r = run(R"(run --nproc 2 --grace 2 -- bash -c 'if [ "$GLINT_RANK" = 0 ]; then kill -SEGV $$; fi; exec sleep 60')");
  EXPECT_NE(r.out.find("the driver, process 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("was killed by SIGSEGV (11)"), std::string::npos) << r.out;
  EXPECT_EQ(r.code, 128 + 11) << r.out;
}

// Alive and not a zombie (an orphan's zombie waits for whoever reaps it).
bool alive(pid_t p) {
  std::ifstream in{"/proc/" + std::to_string(p) + "/stat"};
  std::string line;
  if (!std::getline(in, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Killing the launcher (even with SIGKILL, which it cannot forward) takes its
// processes with it: a job used to go on training and checkpointing alone.
TEST(Cli, TheJobsProcessesDieWithTheirLauncher) {
  const auto dir = glint::testing::fresh_dir("cli-orphans");
  const std::string cmd = std::string{"exec "} + GLINT_BINARY +
                          R"( run --nproc 2 -- bash -c 'echo $$ > )" + dir + R"(/pid-$GLINT_RANK; exec sleep 60')";
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::vector<pid_t> pids;
  for (int tries = 0; tries < 400 && pids.size() < 2; ++tries) {  // up to 20 s for both to start
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pids.clear();
    for (int rank = 0; rank < 2; ++rank) {
      std::ifstream in{dir + "/pid-" + std::to_string(rank)};
      pid_t p = 0;
      if (in >> p && p > 0) pids.push_back(p);
    }
  }
  ASSERT_EQ(pids.size(), 2u) << "the job's processes did not start";
  ::kill(launcher, SIGKILL);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  for (pid_t p : pids) {
    bool gone = false;
    for (int tries = 0; tries < 100 && !gone; ++tries) {  // up to 5 s
      gone = !alive(p);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(gone) << "process " << p << " outlived its launcher";
    if (!gone) ::kill(p, SIGKILL);
  }
}


TEST(Cli, SizesTooLargeAreClearErrorsBeforeAnyAllocation) {
  const auto dir = glint::testing::fresh_dir("cli-sizes");
  struct Case {
    std::string args, says;
  };
  for (const auto& c : std::vector<Case>{
           {"init-model " + dir + "/a --layers 1000000000", "--layers: Value 1000000000 not in range"},
           {"init-model " + dir + "/b --hidden 1048576", "--hidden: Value 1048576 not in range"},
           // Within every bound, but 263 GiB of weights: refused by the estimate.
           {"init-model " + dir + "/c --hidden 8192 --layers 80 --intermediate 28672 --heads 64 --kv-heads 8 --vocab 128256",
            "parameters (in float32) needs 262.8 GiB, more than this machine's"},
           {"info --nproc 100000000", "--nproc: Value 100000000 not in range"},
           {"run --nproc 100000 -- true", "--nproc: Value 100000 not in range"},
           {"run --master-port 70000 -- true", "--master-port: Value 70000 not in range"},
       }) {
    if (c.says.find("262.8 GiB") != std::string::npos && glint::memory_limit_bytes() > (uint64_t{262} << 30)) continue;
    auto r = run(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/c/model.safetensors"));
  // 1e8 rows would be ~40 GiB in memory: refused with the estimate where that is more than the machine has.
  if (glint::memory_limit_bytes() < (uint64_t{40} << 30)) {
    auto r = run("init-data arithmetic " + dir + "/rows.jsonl --rows 100000000");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.out.find("rows made in memory needs"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir + "/rows.jsonl"));
  }
}

}  // namespace
