#pragma once
// A RocksDB Env whose writes go through a glint FileSystem, so the fault-
// injecting one can crash the run index at any of its writes and drop what
// was not fsynced, exactly as it does for checkpoint directories (RocksDB's
// own FaultInjectionTestFS is test code Debian does not ship). Every write
// RocksDB makes becomes one call of the interface: creating a file, each
// append, each sync of a file or a directory, a rename, a removal. Reads,
// locks and the info log go to the machine's file system. Files are
// reopened for each append: fine for the index's few small writes, not for
// a database with a heavy write load. components/store's own.

#include "components/checkpoint/file_system.hpp"

#include <rocksdb/env.h>

#include <memory>

namespace glint::components::detail {

/// An Env over `fs`, which must outlive it and every DB opened with it.
std::unique_ptr<rocksdb::Env> rocksdb_env_over(FileSystem& fs);

}  // namespace glint::components::detail
