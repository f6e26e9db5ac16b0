#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time
# (docs/fuzzing.md). Exits non-zero on the first target that crashes, leaks,
# hangs or reports a problem; the input that did it is left in
# $FUZZ_ARTIFACTS (default: BUILD_DIR/fuzz-artifacts) and printed as hex.
#
#   fuzz/run.sh [SECONDS_PER_TARGET [TARGET...]]
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz-clang, beside the source),
# FUZZ_JOBS (build jobs, default nproc), FUZZ_ARGS (more libFuzzer flags).
# The repo's corpus is read, never written: new inputs go to a scratch dir.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-10}"
shift || true
build="${FUZZ_BUILD_DIR:-$src/build-fuzz-clang}"
jobs="${FUZZ_JOBS:-$(nproc)}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(cluster_toml cluster_json train_config device_name wire_header tensor_decode
           repl_parser data_plane)
fi

cxx="${CXX_FUZZ:-clang++}"
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz/run.sh: $cxx not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DACTORFLOW_WITH_CUDA=OFF -DACTORFLOW_BUILD_TESTS=OFF -DACTORFLOW_FUZZ=ON "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$jobs" --target $(printf 'fuzz_%s ' "${targets[@]}")

artifacts="${FUZZ_ARTIFACTS:-$build/fuzz-artifacts}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$artifacts"
export ACTORFLOW_LOG="${ACTORFLOW_LOG:-off}"
status=0
for t in "${targets[@]}"; do
  bin="$build/fuzz/fuzz_$t"
  flags=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
         -artifact_prefix="$artifacts/$t-")
  [ -f "$src/fuzz/dict/$t.dict" ] && flags+=(-dict="$src/fuzz/dict/$t.dict")
  mkdir -p "$scratch/$t"
  echo "=== fuzz_$t for ${seconds}s"
  log="$scratch/$t.log"
  # shellcheck disable=SC2086
  if ! "$bin" "${flags[@]}" ${FUZZ_ARGS:-} "$scratch/$t" "$src/fuzz/corpus/$t" >"$log" 2>&1; then
    status=1
    tail -n 60 "$log"
    for a in "$artifacts/$t-"*; do
      [ -f "$a" ] || continue
      echo "--- input $a ($(stat -c %s "$a") bytes):"
      head -c 512 "$a" | od -A d -t x1z | head -n 20
    done
    echo "fuzz_$t FAILED: reproduce with $bin $artifacts/$t-<file>;" \
         "docs/fuzzing.md says how to make it a regression case"
  else
    grep -E "^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added)" "$log" |
      tr '\n' ' ' || true
    echo
  fi
done
exit $status
