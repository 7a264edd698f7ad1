#!/usr/bin/env bash
# Checks deploy/slurm/dynmo.sbatch: `bash -n`, then runs it outside Slurm
# against stand-ins for scontrol, srun and dynmo-coordinator (2 nodes x 3
# tasks) and asserts what every rank saw: RANK = SLURM_PROCID, LOCAL_RANK =
# SLURM_LOCALID, WORLD_SIZE = SLURM_NTASKS, LOCAL_WORLD_SIZE and NODE_RANK per
# node, MASTER_ADDR = the first node of SLURM_JOB_NODELIST, DYNMO_COORDINATOR
# on that node; and that the coordinator got its flags and was stopped.
#   slurm_test.sh SOURCE_DIR
set -euo pipefail
src="$(cd "${1:?usage: slurm_test.sh SOURCE_DIR}" && pwd)"
script="$src/deploy/slurm/dynmo.sbatch"
bash -n "$script"
echo "slurm_test: bash -n OK"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"

# scontrol show hostnames: a fixed two-node expansion of gpu[07-08].
cat >"$work/bin/scontrol" <<'EOF'
#!/bin/bash
[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] || { echo "scontrol: unexpected $*" >&2; exit 1; }
printf 'gpu07\ngpu08\n'
EOF
# srun: one process per task, with the per-task variables Slurm sets.
cat >"$work/bin/srun" <<'EOF'
#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
pids=()
for node in 0 1; do
  for local in 0 1 2; do
    SLURM_PROCID=$((node * 3 + local)) SLURM_LOCALID=$local SLURM_NODEID=$node \
      SLURM_NTASKS=6 SLURM_TASKS_PER_NODE='3(x2)' "$@" &
    pids+=($!)
  done
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
EOF
# dynmo-coordinator: records its flags, listens on --listen's port until
# SIGTERM, and notes that it was stopped.
cat >"$work/bin/dynmo-coordinator" <<'EOF'
#!/bin/bash
printf '%s\n' "$@" >"$FAKE_OUT/coordinator.args"
port=""
for a in "$@"; do case "$a" in --listen=*) port="${a##*:}";; esac; done
exec python3 -c '
import signal, socket, sys
# The handler goes in before the port opens: the script may send SIGTERM as
# soon as the port accepts, and a default-handled SIGTERM would skip the note.
def stop(*_):
    open(sys.argv[2] + "/coordinator.stopped", "w").close(); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); c.close()
' "$port" "$FAKE_OUT"
EOF
chmod +x "$work/bin/"*

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
mkdir -p "$work/out"
(
  cd "$work"
  env -i PATH="$work/bin:/usr/bin:/bin" HOME="$work" FAKE_OUT="$work/out" \
    SLURM_JOB_NODELIST='gpu[07-08]' SLURM_NTASKS=6 SLURM_JOB_ID=4242 SLURM_JOB_NAME=moe \
    SLURM_SUBMIT_DIR="$work" DYNMO_GRPC_PORT="$port" DYNMO_COORDINATOR_ARGS="--repack --trigger=auto" \
    bash "$script" bash -c 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $NODE_RANK $MASTER_ADDR $MASTER_PORT $DYNMO_COORDINATOR $DYNMO_JOB" >"$FAKE_OUT/rank.$RANK"'
) >"$work/sbatch.log" 2>&1 || { cat "$work/sbatch.log"; echo "FAIL dynmo.sbatch exited non-zero"; exit 1; }

fail=0
for r in 0 1 2 3 4 5; do
  want="$r $((r % 3)) 6 3 $((r / 3)) gpu07 29500 gpu07:$port moe-4242"
  got="$(cat "$work/out/rank.$r" 2>/dev/null || echo missing)"
  if [ "$got" != "$want" ]; then
    echo "FAIL rank $r: got '$got', want '$want'"; fail=1
  fi
done
args="$(tr '\n' ' ' <"$work/out/coordinator.args")"
for want in "--listen=0.0.0.0:$port" "--state_dir=$work/dynmo-state/moe-4242" \
            "--metrics_listen=0.0.0.0:9464" "--repack" "--trigger=auto"; do
  case " $args " in *" $want "*) ;; *) echo "FAIL coordinator flags '$args' lack $want"; fail=1;; esac
done
[ -d "$work/dynmo-state/moe-4242" ] || { echo "FAIL state dir not created"; fail=1; }
[ -e "$work/out/coordinator.stopped" ] || { echo "FAIL coordinator not stopped at exit"; fail=1; }
if [ "$fail" -ne 0 ]; then cat "$work/sbatch.log"; exit 1; fi
echo "slurm_test: 6 ranks mapped from Slurm to torchrun variables; coordinator on gpu07 started and stopped"

# Without a trainer command the script refuses to run.
if env -i PATH="$work/bin:/usr/bin:/bin" bash "$script" >/dev/null 2>&1; then
  echo "FAIL dynmo.sbatch ran without a trainer command"; exit 1
fi
echo "slurm_test: OK"
