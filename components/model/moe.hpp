#pragma once
/// Switches of the mixture-of-experts block (components/model/moe.cpp),
/// for tests and benchmarks.

namespace glint::components {

/// When set, every sparse block runs every expert on every token and
/// weights the outputs with the router's (0 for the experts a token did
/// not choose): the dense composition the grouped one is measured against
/// (`glint bench train --arch qwen3_moe`, moe_grouped_vs_dense_experts) and
/// checked against (tests). Off by default; process-wide.
void set_dense_experts(bool on);
bool dense_experts();

}  // namespace glint::components
