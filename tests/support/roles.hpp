#pragma once
// Roles a test binary can be started in besides running its tests.

#include "runtime/options.hpp"
#include "runtime/runtime.hpp"

namespace glint::testing {

/// GLINT_TEST_ROLE=driver: the driver of a cluster job that a test kills.
/// Null in binaries without one; cluster_tests sets it (support/cluster.cpp):
/// it spawns a probe on every node, creates the file GLINT_TEST_READY_FILE
/// and waits to be killed.
extern int (*driver_role)(const Options&);

}  // namespace glint::testing
