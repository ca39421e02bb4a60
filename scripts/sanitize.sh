#!/usr/bin/env bash
# The test suite under the sanitizers.
#
#   scripts/sanitize.sh                  ASan + UBSan: build everything into
#                                        build-sanitize/, run every test, unit
#                                        and integration (processes, sockets,
#                                        the glint binary and its recipes)
#   scripts/sanitize.sh --unit           the same, unit tests only (quicker)
#   scripts/sanitize.sh --thread         TSan: build into build-tsan/, run the
#                                        tests of the runtime, the actors and
#                                        remote mode (rpc/)
#   scripts/sanitize.sh -- -R Tokenizer  arguments after -- go to ctest
#
# Any report fails the run: a heap or stack overflow, a use after free, a
# leak, undefined behaviour (signed overflow, a misaligned or null access,
# a bad shift or enum, ...), a data race.
#
# ASan and UBSan: LibTorch, CAF and the other libraries are Debian's, not
# instrumented: what they do inside is not checked, what glint does with
# their memory is. scripts/sanitize.supp lists the leaks of those libraries
# that are theirs, each with its reason.
#
# TSan cannot work that way: a library that is not instrumented hands
# messages from thread to thread through atomics TSan does not see, so every
# message would look like a race (a CAF program of two actors gives 46
# reports). So --thread first builds, instrumented, the two libraries that
# carry glint's messages between threads: CAF (actors, mailboxes, the
# scheduler) and Cap'n Proto's KJ (remote mode's event loops, its
# cross-thread executor, its futex mutexes), from Debian's own source
# packages of the installed versions (fetched with apt-get from Debian's
# archive, checked against the .dsc's SHA-256, built once into
# build-tsan/deps/). LibTorch stays Debian's, run with one thread
# (OMP_NUM_THREADS=1) so its kernels run on the caller's thread, and
# scripts/tsan.supp drops the reports with a frame inside it (its atomics
# are invisible; the file says why). Status (2026-12-02): the 265 tests of
# those five programs pass with no report (docs/remote.md, "Security").
#
# The parsers are also fuzzed under ASan and UBSan (fuzz/, scripts/fuzz.sh).
# Prints the time of each part.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=address
tests=all
ctest_args=()
while (($#)); do
  case $1 in
    --thread) mode=thread ;;
    --unit) tests=unit ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;  # the header above
    *) echo "sanitize: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
bash scripts/setup.sh
jobs=${GLINT_JOBS:-$(nproc)}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
t0=$(date +%s)

# -- TSan's instrumented CAF and KJ ------------------------------------------
# Debian's source package $1 at the installed version of binary package $2,
# unpacked into $3 (the orig tarball, whose hash the .dsc gives: Debian's
# patches to these two are build fixes, made here instead: see -include limits).
debian_source() {
  local src=$1 bin=$2 into=$3
  local ver upstream lists
  ver=$(dpkg-query -W -f='${source:Version}' "$bin")
  upstream=${ver%-*}
  upstream=${upstream#*:}
  mkdir -p "$into/apt/lists/partial" "$into/apt/etc"
  cat > "$into/apt/etc/src.sources" << EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $(. /etc/os-release && echo "$VERSION_CODENAME")
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  local apt=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$into/apt/etc"
             -o Dir::State::Lists="$into/apt/lists")
  [[ -f $into/apt/updated ]] || { "${apt[@]}" update >/dev/null && touch "$into/apt/updated"; }
  # The .dsc and orig tarball are what is needed; a missing .debian.tar.xz is not.
  (cd "$into" && "${apt[@]}" source --download-only "$src=$ver" >/dev/null 2>&1) || true
  local tarball dsc
  dsc=$(ls "$into/${src}_"*.dsc 2>/dev/null | head -1)
  tarball=$(ls "$into/${src}_${upstream}.orig.tar."* 2>/dev/null | head -1)
  if [[ -z $dsc || -z $tarball ]]; then
    echo "sanitize: could not fetch Debian's source of $src $ver (deb.debian.org reachable?)" >&2
    exit 1
  fi
  local want got
  want=$(awk -v f="$(basename "$tarball")" '/^Checksums-Sha256:/{s=1;next} /^[^ ]/{s=0} s && $3==f {print $1}' "$dsc")
  got=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [[ -z $want || $want != "$got" ]]; then
    echo "sanitize: $tarball does not match the SHA-256 its .dsc gives ($want)" >&2
    exit 1
  fi
  mkdir -p "$into/src"
  tar xf "$tarball" -C "$into/src"
}

tsan_deps() {
  local deps=$1
  # -g1: line tables, enough for a report's stacks, at a third of -g's compile time.
  local flags="-fsanitize=thread -O1 -g1 -fno-omit-frame-pointer"
  if [[ ! -f $deps/caf/.built ]]; then
    echo "sanitize: building CAF with TSan (Debian's source; once)"
    debian_source actor-framework libcaf-core0.17 "$deps/caf-src"
    local caf_src
    caf_src=$(find "$deps/caf-src/src" -maxdepth 1 -mindepth 1 -type d -name 'actor-framework-*' | head -1)
    # -include limits: CAF 0.17.6 uses std::numeric_limits without it, which
    # GCC 12 refuses (Debian's own patch for that is not always on the mirror).
    cmake -S "$caf_src" -B "$deps/caf-build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_CXX_FLAGS_DEBUG="$flags -include limits" -DCMAKE_INSTALL_PREFIX="$deps/caf" \
      -DCAF_NO_EXAMPLES=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_TOOLS=yes -DCAF_NO_PYTHON=yes -DCAF_NO_OPENCL=yes \
      -DCAF_NO_OPENSSL=yes -DCAF_NO_SUMMARY=yes -DCAF_NO_COMPILER_CHECK=yes >/dev/null
    cmake --build "$deps/caf-build" -j "$jobs" >/dev/null
    cmake --install "$deps/caf-build" >/dev/null
    touch "$deps/caf/.built"
  fi
  if [[ ! -f $deps/capnp/.built ]]; then
    echo "sanitize: building Cap'n Proto and KJ with TSan (Debian's source; once)"
    debian_source capnproto libcapnp-dev "$deps/capnp-src"
    local capnp_src
    capnp_src=$(find "$deps/capnp-src/src" -maxdepth 2 -name CMakeLists.txt -printf '%h\n' | head -1)
    cmake -S "$capnp_src" -B "$deps/capnp-build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_CXX_FLAGS_DEBUG="$flags" -DCMAKE_C_FLAGS_DEBUG="$flags" -DCMAKE_INSTALL_PREFIX="$deps/capnp" \
      -DBUILD_TESTING=OFF -DBUILD_SHARED_LIBS=ON -DWITH_OPENSSL=ON -DEXTERNAL_CAPNP=ON \
      -DCAPNP_EXECUTABLE=/usr/bin/capnp -DCAPNPC_CXX_EXECUTABLE=/usr/bin/capnpc-c++ >/dev/null
    cmake --build "$deps/capnp-build" -j "$jobs" >/dev/null
    cmake --install "$deps/capnp-build" >/dev/null
    touch "$deps/capnp/.built"
  fi
}

if [[ $mode == thread ]]; then
  build=${GLINT_TSAN_BUILD_DIR:-build-tsan}
  deps=$root/$build/deps
  tsan_deps "$deps"
  tdeps=$(date +%s)
  # Glint against them: CAF's headers and libraries, KJ's and capnp's (the
  # schema compiler stays Debian's: the same version, and it runs at build
  # time only).
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DGLINT_SANITIZE=thread -DGLINT_FUZZ=OFF \
    -DCAF_INCLUDE_DIR="$deps/caf/include" -DCAF_CORE_LIBRARY="$deps/caf/lib/libcaf_core.so" \
    -DCAF_IO_LIBRARY="$deps/caf/lib/libcaf_io.so" -DCMAKE_PREFIX_PATH="$deps/capnp" \
    -DCapnProto_DIR="$deps/capnp/lib/cmake/CapnProto" -DCAPNP_EXECUTABLE=/usr/bin/capnp \
    -DCAPNPC_CXX_EXECUTABLE=/usr/bin/capnpc-c++ >/dev/null
  targets=(runtime_tests cluster_tests actors_tests rpc_tests rpc_remote_tests)
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" glint
  t1=$(date +%s)
  # halt_on_error: the first report fails its test, with both stacks.
  # second_deadlock_stack: a lock-order inversion shows where each lock was taken.
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$root/scripts/tsan.supp}
  export OMP_NUM_THREADS=1
  export LD_LIBRARY_PATH="$deps/caf/lib:$deps/capnp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The tests of those five programs (ctest knows each test's command).
  regex=$(cd "$build" && ctest --show-only=json-v1 | python3 -c '
import json, re, sys
wanted = set(sys.argv[1:])
names = [t["name"] for t in json.load(sys.stdin)["tests"]
         if t.get("command") and t["command"][0].rsplit("/", 1)[-1] in wanted]
print("^(" + "|".join(re.escape(n) for n in names) + ")$")' "${targets[@]}")
  rc=0
  (cd "$build" && ctest --output-on-failure -j "${GLINT_TEST_JOBS:-2}" -R "$regex" "${ctest_args[@]}") || rc=$?
  t2=$(date +%s)
  echo "sanitize: TSan: instrumented CAF and KJ $((tdeps - t0)) s, build $((t1 - tdeps)) s, tests $((t2 - t1)) s, exit $rc"
  ((rc == 0)) || echo "sanitize: a test failed or TSan reported; search its output for 'WARNING: ThreadSanitizer'" >&2
  exit $rc
fi

build=${GLINT_SANITIZE_BUILD_DIR:-build-sanitize}
# -O1: the sanitizers' usual level, quick to build and to run, stacks still
# readable. The fuzzers have their own sanitized build (GLINT_FUZZ=OFF here).
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DGLINT_SANITIZE=address,undefined -DGLINT_FUZZ=OFF >/dev/null
if [[ $tests == unit ]]; then
  # The unit tests' programs only (no launcher, examples or benchmarks).
  cmake --build "$build" -j "$jobs" --target runtime_tests placement_tests components_tests actors_tests \
    examples_tests
  labels=unit
else
  cmake --build "$build" -j "$jobs"
  labels='unit|integration'
fi
t1=$(date +%s)

# halt_on_error: the first report fails its test, with a stack.
# allocator_may_return_null: a huge allocation throws std::bad_alloc as it
# does without ASan (glint turns it into resource_exhausted) instead of
# ASan stopping the process.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/scripts/sanitize.supp:print_suppressions=0}
# A resident size says nothing under ASan (freed blocks wait in its
# quarantine, every byte has shadow memory): tests that bound one print it
# instead (tests/tinker/attack.py; C++ tests test __SANITIZE_ADDRESS__).
export GLINT_SANITIZED=address
# GLINT_SANITIZE_SKIP: a ctest -E regex of tests to leave out.
skip=${GLINT_SANITIZE_SKIP-}
rc=0
(cd "$build" && ctest --output-on-failure -j "${GLINT_TEST_JOBS:-2}" -L "$labels" ${skip:+-E "$skip"} \
  "${ctest_args[@]}") || rc=$?
t2=$(date +%s)
echo "sanitize: ASan+UBSan: build $((t1 - t0)) s, $labels tests $((t2 - t1)) s, exit $rc"
if ((rc != 0)); then
  echo "sanitize: a test failed or a sanitizer reported; the report is in the test's output above" >&2
  echo "sanitize: (search for 'ERROR: AddressSanitizer', 'runtime error:' or 'ERROR: LeakSanitizer')" >&2
fi
exit $rc
