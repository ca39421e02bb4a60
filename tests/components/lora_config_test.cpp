// adapter_config.json without a model (LoraConfig, lora_config.cpp): what
// fuzzing found. The adapters themselves are tested in lora_test.cpp.
#include "components/model/lora_config.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace glint::components {
namespace {

// Found by fuzz/targets/lora_config.cpp: std::regex's backtracking takes
// exponential time on nested or overlapping quantifiers, so one config's
// pattern hung targets() (and a loader calling it for every module).
TEST(LoraConfig, APatternWithNestedQuantifiersMatchesInPolynomialTime) {
  auto c = LoraConfig::parse(R"({"target_modules": "(.|.)*x", "r": 4})");
  ASSERT_TRUE(c) << describe(c.error());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(c->targets("model.layers.10.self_attn.k_proj"));
  EXPECT_TRUE(LoraConfig{.target_regex = "(.|.)*proj"}.targets("model.layers.10.self_attn.k_proj"));
  LoraConfig layers{.target_modules = {"q_proj"}, .layers_to_transform = {3}, .layers_pattern = {"(?:l|l|.)*s"}};
  ASSERT_TRUE(layers.validate()) << describe(layers.validate().error());
  EXPECT_TRUE(layers.targets("model.layers.3.self_attn.q_proj"));
  EXPECT_FALSE(layers.targets("model.layers.4.self_attn.q_proj"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(LoraConfig, OverlongPatternsAndBackReferencesAreRefused) {
  auto deep = LoraConfig::parse(R"({"target_modules": ")" + std::string(2000, '(') + std::string(2000, ')') + "\"}");
  ASSERT_FALSE(deep);
  EXPECT_NE(describe(deep.error()).find("more than glint's 1024"), std::string::npos) << describe(deep.error());
  auto backref = LoraConfig::parse(R"({"target_modules": "(q)\\1_proj"})");
  ASSERT_FALSE(backref);
  EXPECT_NE(describe(backref.error()).find("without back-references"), std::string::npos) << describe(backref.error());
  // Found by fuzzing: libstdc++ reads a repetition count into an int that
  // overflows (undefined behaviour); counts above 1000 are refused first.
  for (const char* pattern : {"q{2222222222222222222}_proj", "q{1,99999}_proj", "q{1001}",
                              ".*+\\\\2222222222222222222222.(q|v)_proj"}) {  // a back-reference's number too
    auto huge = LoraConfig::parse(std::string{R"({"target_modules": ")"} + pattern + "\"}");
    ASSERT_FALSE(huge) << pattern;
    EXPECT_NE(describe(huge.error()).find("not a regular expression glint can read"), std::string::npos)
        << describe(huge.error());
  }
  EXPECT_TRUE(LoraConfig::parse(R"({"target_modules": "q{1,1000}_proj", "r": 4})"));
}

}  // namespace
}  // namespace glint::components
