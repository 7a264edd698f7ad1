# Sourced by the trainer benchmarks (trainer_bench.sh, reshape_bench.sh,
# straggler.sh, straggler_pipelining.sh, pipelining_side_by_side.sh,
# idle_overhead_pipelining.sh, moe_pipelining.sh):
# starting one dynmo-train job's ranks on loopback, as torchrun would.
#   free_port                      a TCP port free on 127.0.0.1 now
#   run_ranks BIN_DIR WORLD OUT_DIR FLAGS...
#                                  WORLD ranks of BIN_DIR/dynmo-train with
#                                  FLAGS (no coordinator unless FLAGS name
#                                  one); rank r's output in OUT_DIR/rank<r>.out;
#                                  returns when every rank exited.
#   throttle_on [CORE] / throttle_off
#                                  a busy loop pinned to CORE (default 1),
#                                  sharing it with the rank there (the
#                                  straggler benches), and its end. The
#                                  loop runs at nice $THROTTLE_NICE (default
#                                  0): the scheduler then leaves the rank
#                                  1024 / (1024 + w) of the core, w the
#                                  loop's weight (1024 at nice 0: about
#                                  half; 820 at 2: 0.56; 335 at 5: 0.75).
#   pinned_example VENV LOG FLAGS...
#                                  examples/torch/$EXAMPLE (default
#                                  llama_pipelining.py) with FLAGS on 2
#                                  ranks under VENV's torchrun, rank r
#                                  pinned to core r; its output in LOG
#                                  (the last 20 lines shown, and exit 1, if
#                                  it fails).
#   example_env BUILD_DIR          for the examples under torch: sets venv
#                                  (scripts/install-torch.sh's, installed
#                                  if missing) and exports PYTHONPATH
#                                  ($PYTHON_DIR, else BUILD_DIR/python),
#                                  DYNMO_BIN_DIR and OMP_NUM_THREADS=1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

run_ranks() {
  local bin_dir=$1 world=$2 out=$3 port r
  shift 3
  port=$(free_port)
  for r in $(seq 0 $((world - 1))); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port DYNMO_COORDINATOR=none \
      "$bin_dir/dynmo-train" "$@" > "$out/rank$r.out" 2>&1 &
  done
  wait
}

pinned_example() {
  local venv=$1 log=$2
  shift 2
  # shellcheck disable=SC2016  # $LOCAL_RANK expands in each rank's own shell
  "$venv/bin/torchrun" --standalone --nproc-per-node 2 --no-python \
    sh -c 'exec taskset -c "$LOCAL_RANK" "$0" "$@"' "$venv/bin/python" \
    "examples/torch/${EXAMPLE:-llama_pipelining.py}" "$@" >"$log" 2>&1 || { tail -20 "$log"; exit 1; }
}

example_env() {
  venv="$(bash scripts/install-torch.sh | tail -n 1)"
  export PYTHONPATH="${PYTHON_DIR:-$PWD/$1/python}" DYNMO_BIN_DIR="$PWD/$1/bin"
  export OMP_NUM_THREADS=1
}

busy_pid=""
throttle_on() {
  nice -n "${THROTTLE_NICE:-0}" taskset -c "${1:-1}" bash -c 'while :; do :; done' &
  busy_pid=$!
}
throttle_off() {
  if [ -n "$busy_pid" ]; then kill "$busy_pid" 2>/dev/null || true; wait "$busy_pid" 2>/dev/null || true; fi
  busy_pid=""
}
