#include "template_bench.hpp"

#include "components/data/bpe_trainer.hpp"
#include "components/data/jinja.hpp"
#include "components/data/template.hpp"
#include "components/data/tokenizer.hpp"
#include "measure.hpp"
#include "runtime/file.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

namespace glint::bench {
namespace {

using json = nlohmann::ordered_json;

// A file of the source tree; "" where it cannot be read (the caller's
// parse then says what is wrong).
std::string read(const std::string& path) {
  auto text = read_text_file(path);
  if (!text) std::fprintf(stderr, "bench template: %s\n", describe(text.error()).c_str());
  return text ? std::move(*text) : std::string{};
}

// The conversations as transformers passes them (bos and eos tokens set).
json cases_of(const std::string& file) {
  json cases = json::array();
  for (auto c : json::parse(read(file))) {
    c.erase("name");
    if (!c.contains("add_generation_prompt")) c["add_generation_prompt"] = false;
    c["bos_token"] = "<s>";
    c["eos_token"] = "</s>";
    cases.push_back(std::move(c));
  }
  return cases;
}

// Microseconds per conversation, glint's interpreter, median over repeats.
double glint_us(const components::JinjaTemplate& t, const json& cases, int rounds, int repeats) {
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r)
    times.push_back(seconds_of([&] {
                      for (int k = 0; k < rounds; ++k)
                        for (const auto& c : cases) (void)t.render(c);
                    }) /
                    (rounds * static_cast<double>(cases.size())) * 1e6);
  return median(times);
}

int cpp_vs_jinja(const std::string& dir, int repeats) {
  // A ChatML + Llama 3 tokenizer, trained here on the bench's own text.
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back("Be brief. What is " + std::to_string(i) + " + " + std::to_string(i * 7 % 13) + "? The answer is " +
                    std::to_string(i + i * 7 % 13) + ". <think> plan it </think> Weather? sunny 22C");
  auto vocab = components::train_bpe(texts, {.vocab_size = 600,
                                             .special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                                "<|begin_of_text|>", "<|start_header_id|>",
                                                                "<|end_header_id|>", "<|eot_id|>"}});
  if (!vocab) {
    std::fprintf(stderr, "bench template: %s\n", describe(vocab.error()).c_str());
    return 1;
  }
  const std::vector<std::vector<components::Message>> chats = {
      {{"user", "Hi"}, {"assistant", "Hello!"}},
      {{"system", "Be brief."}, {"user", "2 + 2?"}, {"assistant", "4"}, {"user", "and 3 + 3?"}, {"assistant", "6"}},
      {{"user", "Weather?"}, {"assistant", "Calling."}, {"tool", "22C"}, {"assistant", "22C, sunny."}},
  };
  std::vector<double> ratios;
  for (const char* file : {"chatml_glint.jinja", "qwen2.jinja", "qwen2.5.jinja", "qwen3.jinja", "llama3.jinja"}) {
    components::TokenizerConfig config;
    config.chat_template = read(dir + "/" + file);
    config.chat_template_origin = file;
    if (std::string{file} == "llama3.jinja") config.special_tokens["bos_token"] = "<|begin_of_text|>";
    auto tok = components::Tokenizer::parse(*vocab, "bench tokenizer.json", config);
    if (!tok) {
      std::fprintf(stderr, "bench template: %s\n", describe(tok.error()).c_str());
      return 1;
    }
    auto shared = std::make_shared<const components::Tokenizer>(std::move(*tok));
    auto cpp = components::Template::make(shared, {});
    auto interp = components::Template::make(shared, {.name = "jinja"});
    if (!cpp || !interp) {
      std::fprintf(stderr, "bench template: %s: %s\n", file, describe(!cpp ? cpp.error() : interp.error()).c_str());
      return 1;
    }
    auto time_of = [&](const components::Template& t) {
      std::vector<double> times;
      for (int r = 0; r < repeats; ++r)
        times.push_back(seconds_of([&] {
          for (int k = 0; k < 50; ++k)
            for (const auto& c : chats) (void)t.encode(c, false);
        }));
      return median(times);
    };
    ratios.push_back(time_of(*interp) / time_of(*cpp));
  }
  print_metric("chat_cpp_vs_jinja_encode", median(ratios), 2);
  return 0;
}

}  // namespace

int templates(const TemplateBenchArgs& args) {
  const std::string source = GLINT_SOURCE_DIR;
  const std::string dir = source + "/tests/data/chat_templates";
  const json cases = cases_of(source + "/tests/data/chat/conversations.json");
  std::map<std::string, std::string> sources;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".jinja") sources[e.path().filename().string()] = read(e.path().string());
  const int rounds = 20;
  json job = {{"support", source + "/tests/support"}, {"templates", sources}, {"cases", cases}, {"rounds", rounds},
              {"repeats", args.repeats}};
  const std::string in = "/tmp/glint-bench-template-" + std::to_string(::getpid()) + ".json", out = in + ".out";
  std::ofstream{in} << job.dump();
  const std::string cmd = "python3 " + source + "/bench/python/template_baseline.py < " + in + " > " + out;
  const int rc = std::system(cmd.c_str());
  std::remove(in.c_str());
  if (rc != 0) {
    std::fprintf(stderr, "bench template: the Jinja2 baseline did not run (python3 with jinja2: scripts/setup.sh)\n");
    return 1;
  }
  const json python = json::parse(read(out));
  std::remove(out.c_str());
  std::vector<double> mine, theirs, ratios;
  for (const auto& [name, text] : sources) {
    auto t = components::JinjaTemplate::parse(text, name);
    if (!t) {
      std::fprintf(stderr, "bench template: %s\n", describe(t.error()).c_str());
      return 1;
    }
    const double us = glint_us(*t, cases, rounds, args.repeats), py = python[name].get<double>();
    mine.push_back(us);
    theirs.push_back(py);
    ratios.push_back(py / us);
  }
  print_metric("jinja_render_us", median(mine), 1);
  print_metric("jinja2_render_us", median(theirs), 1);
  print_metric("jinja_vs_jinja2", median(ratios), 2);
  print_metric("jinja_vs_jinja2_min", *std::min_element(ratios.begin(), ratios.end()), 2);
  return cpp_vs_jinja(dir, args.repeats);
}

}  // namespace glint::bench
