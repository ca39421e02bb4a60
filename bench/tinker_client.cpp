#include "bench/tinker_client.hpp"

#include "components/data/bpe_trainer.hpp"
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/model.hpp"

namespace glint::bench {

Result<int64_t> make_bench_base(const std::string& dir) {
  auto rows = components::arithmetic_rows(200, {.seed = 1});
  auto json = components::train_bpe(components::texts_of(components::Dataset::from_rows(rows)), {.vocab_size = 512});
  if (!json) return with_context(json.error(), "training the tokenizer");
  auto tok = components::Tokenizer::parse(*json);
  if (!tok) return with_context(tok.error(), "reading the tokenizer");
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, tok->vocab_size(), 256, 768, 4, 8, 4);
  cfg.max_position_embeddings = 512;
  auto lm = components::CausalLM::init_random(cfg, 1);
  if (!lm) return with_context(lm.error(), "making the model");
  if (auto ok = lm->save(dir); !ok) return with_context(ok.error(), "saving the model");
  if (auto ok = components::save_chatml_tokenizer(dir, *json); !ok) return with_context(ok.error(), "saving the tokenizer");
  return tok->vocab_size();
}

}  // namespace glint::bench
