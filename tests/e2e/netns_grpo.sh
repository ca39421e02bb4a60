#!/usr/bin/env bash
# A GRPO job across a real network hop: two network namespaces on this
# machine, each a "machine" with its own address, joined by a veth pair.
# Namespace A runs `glint run --nnodes 2 --node-rank 0` (the driver: the
# model and sampler rank 0), namespace B `--node-rank 1` (sampler rank 1).
#
#   tests/e2e/netns_grpo.sh GLINT
#
# 1. The job across the hop writes the metrics of the same job on loopback;
#    so does one with a model rank in each namespace (--dp 2: Gloo and its
#    store across the hop).
# 2. With latency and packet loss on the link (tc netem; where the kernel
#    lacks it, iptables' random drop and a tbf rate cap), the same again.
# 3. The link is cut mid-run (no reset, packets just stop): the driver finds
#    node 1 lost within the peer timeout (3 s here) plus a margin, respawns
#    sampler rank 1 in namespace A, and finishes with the same metrics;
#    node 1 finds its driver gone and exits.
# Only the namespaces and links this test makes, deleted at the end. Skips
# (exit 77) where it cannot make them (not root, no netns or veth support).
set -uo pipefail
source "$(cd "$(dirname "$0")/../../scripts" && pwd)/fault_lib.sh"  # tiny_setup, same_metrics, find_rank
# Each process picks its matmul backend by timing both (kernels.cpp); on a
# loaded machine two runs can pick differently and round differently (a grad
# norm 1e-5 apart). Pin it: what is compared here is the fault, not the backend.
export GLINT_MATMUL=aten
glint=${1:?usage: netns_grpo.sh GLINT}
skip() { echo "netns_grpo: SKIPPED: $*"; exit 77; }
fail() { echo "netns_grpo: FAILED: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || skip "creating network namespaces needs root"
command -v ip > /dev/null || skip "no ip command (iproute2)"

tag=gl$$                       # names of this run's namespaces and links
A=${tag}a B=${tag}b
net=10.$((200 + $$ % 50)).$(($$ / 50 % 250 + 1))
addr_a=$net.1 addr_b=$net.2
root=$(mktemp -d /tmp/glint-netns-XXXXXX)
cleanup() {
  ip netns pids $A 2> /dev/null | xargs -r kill -9 2> /dev/null
  ip netns pids $B 2> /dev/null | xargs -r kill -9 2> /dev/null
  ip netns del $A 2> /dev/null
  ip netns del $B 2> /dev/null
  rm -rf "$root"
}
trap cleanup EXIT
ip netns add $A 2> /dev/null || skip "cannot create a network namespace here"
ip netns add $B || fail "a second namespace"
ip link add ${tag}x type veth peer name ${tag}y 2> /dev/null || skip "cannot create a veth pair here"
ip link set ${tag}x netns $A && ip link set ${tag}y netns $B || fail "moving the veth ends"
ip -n $A addr add $addr_a/24 dev ${tag}x && ip -n $B addr add $addr_b/24 dev ${tag}y || fail "addresses"
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set ${tag}x up && ip -n $B link set ${tag}y up || fail "links up"

cd "$root"
tiny_setup "$glint" 200 40 || fail "the tiny model set-up"
steps=12
grpo=(grpo --model sft/last --dataset arith.jsonl --max-tokens 16 --max-prompt-length 64 --prompts-per-step 8
      --num-generations 4 --lr 1e-3 --max-steps $steps --sampler-dp 2 --sampler-max-restarts 1)

"$glint" run --nproc 2 -- "$glint" "${grpo[@]}" --output reference > reference.log 2>&1 \
  || { cat reference.log; fail "the job on loopback"; }
"$glint" run --nproc 2 -- "$glint" "${grpo[@]}" --dp 2 --output reference_dp > reference_dp.log 2>&1 \
  || { cat reference_dp.log; fail "the job with --dp 2 on loopback"; }


# run NAME [EXTRA glint grpo FLAGS]: the job across the namespaces, in the
# background; sets pid_a and pid_b.
port=$((20000 + $$ % 20000))
run() {
  local name=$1; shift
  port=$((port + 1))
  local common=(--nnodes 2 --nproc 1 --master-addr $addr_a --master-port $port --peer-timeout ${peer_timeout:-3})
  ip netns exec $A "$glint" run "${common[@]}" --node-rank 0 -- "$glint" "${grpo[@]}" "$@" --output $name > $name.a.log 2>&1 &
  pid_a=$!
  ip netns exec $B "$glint" run "${common[@]}" --node-rank 1 -- "$glint" "${grpo[@]}" "$@" --output $name > $name.b.log 2>&1 &
  pid_b=$!
}
# wait_for PID SECONDS: its exit code, or 124 after SECONDS (then killed).
wait_for() {
  local pid=$1 limit=$2 t=0
  while kill -0 $pid 2> /dev/null && ((t < limit * 10)); do sleep 0.1; t=$((t + 1)); done
  if kill -0 $pid 2> /dev/null; then kill -9 $pid; wait $pid 2> /dev/null; return 124; fi
  wait $pid
}

# 1. Across the hop: hop NAME REFERENCE SPREAD [GRPO FLAGS] runs the job and
#    checks it ran with SPREAD in its log and wrote REFERENCE's metrics.
hop() {
  local name=$1 ref=$2 spread=$3; shift 3
  run $name "$@"
  wait_for $pid_a 120; local code_a=$?
  wait_for $pid_b 30; local code_b=$?
  ((code_a == 0 && code_b == 0)) || { tail -n 40 $name.a.log $name.b.log; fail "$name: the job across namespaces exited $code_a/$code_b"; }
  grep -q "$spread" $name.a.log || { cat $name.a.log; fail "$name: not spread over both namespaces ($spread)"; }
  local why
  why=$(same_metrics $ref/metrics.jsonl $name/metrics.jsonl) || fail "$name: $why"
}
hop hop reference "2 sampler rank(s) on node 0,1"
echo "netns_grpo: across a veth hop ($addr_a <-> $addr_b): the same metrics as on loopback"
hop hop_dp reference_dp "2 model rank(s) on node 0,1" --dp 2
echo "netns_grpo: a model rank in each namespace (--dp 2, Gloo across the hop): the same metrics as on loopback"

# 2. Latency and loss: netem where the kernel has it; else 1% random loss
#    each way (iptables' statistic match) and a 100 Mbit/s cap (tbf, which
#    queues packets behind each other). The same metrics, with a sampler rank
#    and then a model rank (Gloo, and its heartbeats over UDP) across the hop.
impair() {  # sets how; 1 where neither is possible here
  if ip netns exec $A tc qdisc add dev ${tag}x root netem delay 5ms 2ms loss 1% 2> /dev/null; then
    ip netns exec $B tc qdisc add dev ${tag}y root netem delay 5ms 2ms loss 1% || fail "netem on the second end"
    how="5 ms +- 2 ms delay and 1% loss each way (netem)"
    return 0
  fi
  command -v iptables > /dev/null || return 1
  local ns dev
  for ns in $A $B; do
    dev=${tag}x
    [[ $ns == "$B" ]] && dev=${tag}y
    ip netns exec $ns iptables -A OUTPUT -o $dev -m statistic --mode random --probability 0.01 -j DROP 2> /dev/null \
      || return 1
    ip netns exec $ns tc qdisc add dev $dev root tbf rate 100mbit burst 64kb latency 50ms || fail "tbf on $dev"
  done
  how="1% loss each way (iptables' statistic match: this kernel has no netem) and a 100 Mbit/s cap (tbf)"
}
# unimpair: the link as it was (what impair set up, even in part); sets
# dropped, the packets iptables dropped.
unimpair() {
  local ns
  dropped=0
  for ns in $A $B; do
    ip netns exec $ns tc qdisc del dev ${tag}$([[ $ns == "$A" ]] && echo x || echo y) root 2> /dev/null
    if command -v iptables > /dev/null; then
      dropped=$((dropped + $(ip netns exec $ns iptables -L OUTPUT -v -x -n 2> /dev/null | awk '/DROP/ {s += $1} END {print s + 0}')))
      ip netns exec $ns iptables -F OUTPUT 2> /dev/null
    fi
  done
}
if impair; then
  # A lossy link is not a cut one: the peer timeout is not what is tested
  # here, and 3 s is close to what a loaded 2-core CI machine can stall a
  # process for (a CI run saw node 1 give up on its driver at step 10).
  peer_timeout=8
  hop lossy reference "2 sampler rank(s) on node 0,1"
  hop lossy_dp reference_dp "2 model rank(s) on node 0,1" --dp 2
  peer_timeout=3
  unimpair
  echo "netns_grpo: with $how: the same metrics (sampler rank and model rank across the hop)$( ((dropped > 0)) && echo "; $dropped packets dropped")"
else
  unimpair
  echo "netns_grpo: latency and loss SKIPPED: this kernel has no netem qdisc, and iptables (with its statistic match) is not here either"
fi

# 3. The link cut mid-run.
run cut
for ((t = 0; t < 1200; t++)); do
  (($(cat cut/metrics.jsonl 2> /dev/null | wc -l) >= 3)) && break
  kill -0 $pid_a 2> /dev/null || break
  sleep 0.05
done
ip -n $A link set ${tag}x down  # packets stop; neither side gets a reset
cut_at=$(date +%s.%N)
for ((t = 0; t < 300; t++)); do
  grep -q "was lost; respawned" cut.a.log && break
  grep -q "unreachable\|was lost" cut.a.log && break
  sleep 0.05
done
seen_at=$(date +%s.%N)
wait_for $pid_a 120; code_a=$?
wait_for $pid_b 30; code_b=$?
detect=$(python3 -c "print(f'{$seen_at - $cut_at:.2f}')")
((code_a == 0)) || { tail -n 8 cut.a.log; fail "after the cut the driver exited $code_a"; }
python3 -c "import sys; sys.exit(0 if $seen_at - $cut_at < 8 else 1)" \
  || { tail -n 8 cut.a.log; fail "the cut was seen after $detect s (peer timeout 3 s)"; }
grep -q "respawned as rank 1 of group 'sampler' on node 0" cut.a.log || echo "netns_grpo: note: sampler rank 1 was not respawned (the run ended first)"
why=$(same_metrics reference/metrics.jsonl cut/metrics.jsonl) || fail "after the cut: $why"
((code_b != 0 && code_b != 124)) || { tail -n 5 cut.b.log; fail "node 1, cut off, exited $code_b (want: it leaves, lost its driver)"; }
echo "netns_grpo: link cut after step 3: seen in $detect s (peer timeout 3 s); the job finished with the same metrics; node 1 left with $code_b"
