#pragma once
// Roles a test binary can be started in besides running its tests.

#include "runtime/options.hpp"
#include "runtime/runtime.hpp"

#include <map>
#include <string>

namespace glint::testing {

/// GLINT_TEST_ROLE=driver: the driver of a cluster job that a test kills.
/// Null in binaries without one; cluster_tests sets it (support/cluster.cpp):
/// it spawns a probe on every node, creates the file GLINT_TEST_READY_FILE
/// and waits to be killed.
extern int (*driver_role)(const Options&);

/// GLINT_TEST_ROLE=<name>: other roles a test file registers (a child
/// process a test kills, say), by name.
std::map<std::string, int (*)()>& roles();

}  // namespace glint::testing
