// The Tinker API's protobuf forward_backward bodies (SDK 0.19 and newer) as
// the gateway reads them: parse_forward_backward_proto with the budget a
// server of 4,096 tokens per call gives, and, when it refuses, the ids it
// still reads (forward_backward_ids_proto). A request read holds its
// budget and consistent tensors, and its canonical form (maps in key order,
// what a retry is recognised by) reads back to itself.
#include "tinker_checks.hpp"

using namespace glint;
using namespace glint::rpc::tinker;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string_view body = fuzz::text_of(data, size);
  const size_t budget = request_element_budget(4096);
  std::string canonical;
  auto r = parse_forward_backward_proto(body, &canonical, budget);
  if (!r) {
    (void)describe(r.error());
    if (auto ids = forward_backward_ids_proto(body)) (void)ids->first.size();
    return 0;
  }
  fuzz::check_forward_backward(*r, budget);
  std::string again;
  auto twice = parse_forward_backward_proto(canonical, &again, budget);
  GLINT_FUZZ_CHECK(static_cast<bool>(twice), "the canonical form does not read back: " + describe(twice.error()));
  GLINT_FUZZ_CHECK(again == canonical, "the canonical form is not canonical");
  GLINT_FUZZ_CHECK(twice->model_id == r->model_id && twice->seq_id == r->seq_id && twice->data.size() == r->data.size(),
                   "the canonical form reads as another request");
  return 0;
}
