# The fuzz targets, one per parser: fuzz/targets/<name>.cpp builds fuzz_<name>,
# with its seed corpus in fuzz/corpus/<name>/. Read by fuzz/CMakeLists.txt
# and by cmake/fuzz.cmake, which registers a test for each.
set(GLINT_FUZZ_TARGETS
  safetensors       # safetensors headers (SafetensorsFile::parse)
  model_config      # config.json (ModelConfig::parse)
  tokenizer         # tokenizer.json (Tokenizer::parse)
  tokenizer_config  # tokenizer_config.json (TokenizerConfig::parse)
  chat_template     # a model's Jinja chat template (detect_chat_template, Template::make)
  tool_calls        # tool calls in model output (parse_tool_calls)
  lora_config       # adapter_config.json (LoraConfig::parse)
  dataset           # dataset rows, JSONL and JSON (Dataset::parse)
  job_toml          # the job TOML (placement::JobConfig::parse)
  trainer_state     # a checkpoint's trainer_state.json (parse_trainer_state)
  manifest          # a checkpoint's manifest.json (parse_manifest)
  tinker_json       # the Tinker API's JSON bodies, zstd or not (decode_json_body, parse_*_json)
  tinker_proto      # the Tinker API's protobuf forward_backward bodies (parse_forward_backward_proto)
  capnp_request     # the Cap'n Proto requests' parameters as the server reads them (rpc/convert.hpp)
  openai            # the OpenAI-compatible door's bodies (rpc/tinker/openai.hpp: parse_request, answer)
)
