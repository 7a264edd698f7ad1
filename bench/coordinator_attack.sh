#!/usr/bin/env bash
# The coordinator attacked from outside, as a hostile client and a careless
# operator would (issue 25), on loopback. Prints one report:
#  1. hostile requests: dynmo-fuzz-grpc (a live coordinator with named
#     principals and a canary job of 2 real agents; 4 clients send random,
#     unauthenticated, wrong-role and raw-byte calls on every RPC): status
#     codes, whether the canary job changed, whether the coordinator answers;
#  2. connections: a real dynmo-coordinator; IDLE plain TCP connections and
#     STALLED ones (the HTTP/2 preface, then nothing) held HOLD seconds:
#     the daemon's threads, resident memory and CPU before, during, after,
#     and whether it still answers dynmo-ctl meanwhile;
#  3. bad flags and arguments: each binary with flags it must refuse; every
#     one must exit 2 with one line on stderr (a crash or a stack of lines
#     is counted);
#  4. readers that never read: WATCHERS WatchReleased streams that grant no
#     window while a scheduler claims and returns a 2,000-GPU pool for 5 s
#     (dynmo-bench-stream-attack): the daemon's peak and after resident
#     memory, and how the streams ended (RESOURCE_EXHAUSTED: their backlog
#     was full); then the same with 1 watcher, to tell what the watchers
#     leave behind from what the pool's traffic does;
#  5. Sessions that never say hello: 10,000, 20,000 and 40,000 at once, held
#     5 s each: peak and after resident memory, how they ended.
# The kill -9 part of the attack is trainer.CoordinatorKill9Test (ctest),
# the watchers' bound tests/service/released_watchers_test.cc and the
# per-job bounds tests/service/job_limits_test.cc; docs/operations.md
# ("Attacked from outside") has the figures of all of them.
#
#   bash bench/coordinator_attack.sh BIN_DIR [REQUESTS=11200] [IDLE=2000] [STALLED=1000] [HOLD=20] [WATCHERS=64]
set -uo pipefail
if (($# < 1)); then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
bin=$1
requests=${2:-11200}
idle=${3:-2000}
stalled=${4:-1000}
hold=${5:-20}
watchers=${6:-64}
work=$(mktemp -d /tmp/dynmo-attack-XXXXXX)
trap 'kill "$daemon" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
daemon=

# A daemon on a state dir, its resident MB now, and its peak while a command
# runs (sampled every 0.1 s).
start_daemon() {
  port=$((20000 + RANDOM % 20000))
  "$bin/dynmo-coordinator" --listen="127.0.0.1:$port" --state_dir="$1" \
    >"$work/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do
    "$bin/dynmo-ctl" --coordinator="127.0.0.1:$port" --timeout_s=1 jobs >/dev/null 2>&1 && break
    sleep 0.1
  done
}
rss() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$daemon/status"; }
with_peak() {
  local peak=0 now
  "$@" >"$work/attack.json" 2>"$work/attack.err" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    now=$(rss)
    peak=$(echo "if ($now > $peak) $now else $peak" | bc)
    sleep 0.1
  done
  wait "$pid"
  echo "$peak"
}

echo "== 1. hostile requests: dynmo-fuzz-grpc --requests=$requests --clients=4"
"$bin/dynmo-fuzz-grpc" --requests="$requests" --clients=4 >"$work/fuzz.json" 2>"$work/fuzz.err"
echo "exit $?"
python3 - "$work/fuzz.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
names = {0: "OK", 3: "INVALID_ARGUMENT", 5: "NOT_FOUND", 7: "PERMISSION_DENIED",
         8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 12: "UNIMPLEMENTED",
         13: "INTERNAL", 14: "UNAVAILABLE", 16: "UNAUTHENTICATED", 6: "ALREADY_EXISTS",
         11: "OUT_OF_RANGE", 4: "DEADLINE_EXCEEDED"}
codes = ", ".join(f"{names.get(int(c), c)} {n:,}" for c, n in
                  sorted(r["status_codes"].items(), key=lambda kv: -kv[1]))
print(f"{r['requests']:,} requests from {r['clients']} clients in {r['seconds']:.1f} s; {codes}")
print(f"coordinator answers after: {r['coordinator_answers']}; canary job unchanged: "
      f"{r['canary_unchanged']}")
EOF

echo
echo "== 2. connections: $idle idle + $stalled stalled (HTTP/2 preface only), held ${hold}s"
start_daemon "$work/state"
# threads, RSS (MB), CPU seconds (user+sys) of the daemon
probe() {
  awk '/^Threads/ {t=$2} /^VmRSS/ {r=$2} END {printf "%d %.1f", t, r / 1024}' \
    "/proc/$daemon/status"
  awk -v hz="$(getconf CLK_TCK)" '{printf " %.2f\n", ($14 + $15) / hz}' "/proc/$daemon/stat"
}
read -r t0 r0 c0 < <(probe)
echo "before: $t0 threads, $r0 MB resident"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
python3 - "$port" "$idle" "$stalled" "$hold" "$bin" "$daemon" <<'EOF' &
import socket, sys, time
port, idle, stalled, hold = (int(x) for x in sys.argv[1:5])
socks, failed = [], 0
preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
for i in range(idle + stalled):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i >= idle:
            s.sendall(preface)
        socks.append(s)
    except OSError:
        failed += 1
print(f"opened {len(socks)} connections ({failed} refused or failed)", flush=True)
time.sleep(hold)
alive = 0
for s in socks:
    try:
        s.setblocking(False)
        data = s.recv(65536)
        alive += 1 if data != b"" else 0
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print(f"after {hold}s: {alive} still open", flush=True)
for s in socks:
    s.close()
EOF
attacker=$!
sleep $((hold / 2))
read -r t1 r1 _ < <(probe)
start=$(date +%s.%N)
"$bin/dynmo-ctl" --coordinator="127.0.0.1:$port" --timeout_s=5 jobs >/dev/null 2>&1
ctl=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
echo "during: $t1 threads, $r1 MB resident; dynmo-ctl jobs exit $ctl in ${took}s"
wait "$attacker"
sleep 1
read -r t2 r2 c2 < <(probe)
echo "after: $t2 threads, $r2 MB resident; daemon CPU over the attack $(echo "$c2 - $c0" | bc) s"
kill "$daemon" 2>/dev/null
wait "$daemon" 2>/dev/null
daemon=

echo
echo "== 3. bad flags and arguments: exit 2 and one line each"
bad=(
  "dynmo-coordinator --listen=[::1"
  "dynmo-coordinator --max_jobs=abc"
  "dynmo-coordinator --max_jobs=1e99"
  "dynmo-coordinator --max_jobs=0"
  "dynmo-coordinator --max_ranks_per_job=-1"
  "dynmo-coordinator --trigger=sometimes"
  "dynmo-coordinator --balancer=random"
  "dynmo-coordinator --metrics_auth_file=/nonexistent"
  "dynmo-coordinator --no_such_flag"
  "dynmo-coordinator extra_argument"
  "dynmo-ctl --coordinator=127.0.0.1:1 --timeout_s=-1 jobs"
  "dynmo-ctl --coordinator=127.0.0.1:1 claim gpu-1 --holder=x --lease_seconds=-5"
  "dynmo-ctl --coordinator=127.0.0.1:1 frobnicate"
  "dynmo-ctl --coordinator=127.0.0.1:1 jobs extra"
  "dynmo-ctl --no_such_flag jobs"
  "dynmo-loadgen --agents=-3"
  "dynmo-loadgen --no_such_flag"
  "dynmo-loadgen extra_argument"
  "dynmo-launch --nproc=2 --coordinator=bad::: -- true"
  "dynmo-launch --nproc=0 -- true"
  "dynmo-launch --no_such_flag -- true"
  "dynmo-plan --no_such_flag"
  "dynmo-sim --schedule=1f1b --stages=-1"
  "dynmo-sim --trigger=sometimes"
  "dynmo-sim --no_such_flag"
  "dynmo-train --steps=abc"
  "dynmo-train --layers=0"
  "dynmo-train --device=gpu"
  "dynmo-train --coordinator=nowhere"
  "dynmo-train --no_such_flag"
  "dynmo-train extra_argument"
)
pass=0
for b in "${bad[@]}"; do
  read -r -a cmd <<<"$b"
  out=$(timeout 20 "$bin/${cmd[0]}" "${cmd[@]:1}" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s' "$out" | grep -c .)
  if ((rc == 2 && lines == 1)); then
    pass=$((pass + 1))
  else
    echo "NOT ONE LINE + EXIT 2: $b -> exit $rc, $lines lines: $(printf '%s' "$out" | head -3)"
  fi
done
echo "$pass of ${#bad[@]} exit 2 with one line"

echo
echo "== 4. $watchers WatchReleased streams that never read, a 2,000-GPU pool claimed and returned for 5 s"
echo "   (then the same traffic with 1 watcher, a fresh daemon: what the pool's own traffic leaves behind)"
for n in "$watchers" 1; do
  rm -rf "$work/pool"
  mkdir -p "$work/pool"
  "$bin/dynmo-bench-stream-attack" --mode=pool --state_dir="$work/pool" --gpus=2000 >/dev/null
  start_daemon "$work/pool"
  r0=$(rss)
  peak=$(with_peak "$bin/dynmo-bench-stream-attack" --mode=watchers \
    --coordinator="127.0.0.1:$port" --count="$n" --seconds=5)
  sleep 12  # the daemon trims freed memory every 10 s
  echo "$n watchers: before $r0 MB; peak $peak MB; 12 s after the clients left $(rss) MB"
  echo "streams: $(cat "$work/attack.json") $(head -c 300 "$work/attack.err")"
  kill "$daemon" 2>/dev/null
  wait "$daemon" 2>/dev/null
  daemon=
done

echo
echo "== 5. Sessions that never say hello (--hello_timeout_s=10), held 5 s"
start_daemon "$work/hello"
for n in 10000 20000 40000; do
  r0=$(rss)
  peak=$(with_peak "$bin/dynmo-bench-stream-attack" --mode=helloless \
    --coordinator="127.0.0.1:$port" --count="$n" --seconds=5)
  sleep 12
  echo "$n sessions: before $r0 MB; peak $peak MB; 12 s after $(rss) MB; $(cat "$work/attack.json") $(head -c 300 "$work/attack.err")"
done
kill "$daemon" 2>/dev/null
wait "$daemon" 2>/dev/null
daemon=
