#!/usr/bin/env bash
# Installs everything glint builds and runs with, from Debian 12's archive.
# Idempotent: when every package is present it prints one line and exits.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libcaf-dev                      # actors, remote actors (CAF 0.17.6)
  libhwloc-dev hwloc              # topology and CPU binding
  libtorch-dev libgloo-dev        # tensors, autograd, c10d (CPU build)
  python3-torch                   # Python baseline for benchmarks
  python3-jinja2                  # reference rendering of chat templates in tests
  # An optimised BLAS for LibTorch's own matmuls (Python baselines, ATen
  # fallbacks): without it Debian resolves libblas.so.3 to the reference
  # BLAS, ~2 GFLOP/s, against ~60 here (docs/architecture.md).
  libopenblas0-openmp
  capnproto libcapnp-dev          # wire schema and remote RPC (glint serve, remote mode)
  libssl-dev openssl              # TLS of remote mode, API key hashes; test certificates
  librocksdb-dev                  # durable metadata
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libfmt-dev libspdlog-dev
  libpcre2-dev libcpp-httplib-dev
  libprotobuf-dev protobuf-compiler libzstd-dev   # the Tinker-compatible HTTP API's protobuf bodies (rpc/tinker)
  python3-protobuf python3-zstandard python3-requests  # its conformance client (tests/tinker)
  libicu-dev                      # Unicode normalisation for tokenizer normalizers
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-dev           # libFuzzer and sanitizers for the parser fuzzers (fuzz/)
  iproute2 iptables               # the fault tests' namespaces, links and packet loss (tests/e2e/netns_grpo.sh)
)

missing=()
for p in "${packages[@]}"; do
  [[ $p == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
