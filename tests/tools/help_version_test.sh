#!/usr/bin/env bash
# Every DynMo program answers --help and --version with exit 0: --version
# prints "<program> (DynMo) <version>", --help a usage text. Programs that
# were not built (dynmo-train without LibTorch) are skipped.
set -u
bin=$1
shift
fail=0
for p in "$@"; do
  [ -x "$bin/$p" ] || { echo "skip $p (not built)"; continue; }
  v=$("$bin/$p" --version 2>&1); rc=$?
  if [ $rc -ne 0 ] || [[ "$v" != "$p (DynMo) "* ]]; then
    echo "FAIL $p --version: exit $rc: $v"; fail=1
  fi
  h=$("$bin/$p" --help 2>&1); rc=$?
  if [ $rc -ne 0 ] || [[ "$h" != *usage* && "$h" != *"$p"* ]]; then
    echo "FAIL $p --help: exit $rc: ${h:0:200}"; fail=1
  fi
done
[ $fail -eq 0 ] && echo "every program answers --help and --version"
exit $fail
