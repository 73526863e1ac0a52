#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (-fsanitize=fuzzer,address,undefined) in
# their own build dir, compiling caliper_core's sources directly (the main gcc build never needs
# clang; the request targets add server/proto_convert.cc and the caliper.v1 messages, generated
# here with protoc), then runs each target for FUZZ_SECONDS over its seed corpus
# tests/fuzz/corpus/<target> (kept in the repository). CI time: the first compile of ~52 sources
# with ASan (minutes on 2 cores; later runs rebuild only changed files) plus FUZZ_SECONDS per
# target: 8 targets x 10 s = 80 s of fuzzing in CTest's fuzz_short.
# Any crash fails the run, and its input is copied to tests/fuzz/regressions/<target>/ where the
# normal build's fuzz_replay_test replays it. Prints executions and executions/s per target.
# Exit 77 (CTest: skipped) when clang cannot build a libFuzzer binary here.
#   FUZZ_SECONDS (20)  FUZZ_TARGETS (all)  FUZZ_BUILD_DIR (build-fuzz)  FUZZ_CXX (clang++)  JOBS
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-20}
TARGETS=${FUZZ_TARGETS:-"safetensors lightllm hf_config observer_codec chunk proto_convert scales_args adapt_args"}
CXX=${FUZZ_CXX:-clang++}
JOBS=${JOBS:-$(nproc)}

mkdir -p "$BUILD/obj" "$BUILD/work" "$BUILD/gen"
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "fuzz: $CXX not found (install clang and libclang-rt-14-dev); skipping"
  exit 77
fi
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$BUILD/probe.cc"
if ! "$CXX" -fsanitize=fuzzer "$BUILD/probe.cc" -o "$BUILD/probe" >/dev/null 2>&1; then
  echo "fuzz: $CXX cannot link libFuzzer (install libclang-rt-14-dev); skipping"
  exit 77
fi

ABSL_PKGS="absl_status absl_statusor absl_strings absl_str_format absl_span absl_cord absl_synchronization"
CXXFLAGS="-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
  -fno-sanitize-recover=undefined -pthread -I$ROOT -I$BUILD/gen $(pkg-config --cflags $ABSL_PKGS) \
  -DCALIPER_VERSION=\"$(cat "$ROOT/VERSION")\""
LIBS="$(pkg-config --libs $ABSL_PKGS) -pthread"
# The request targets' caliper.v1 messages, regenerated only when the .proto changes.
if [[ ! -f $BUILD/gen/proto/caliper.pb.cc || proto/caliper.proto -nt $BUILD/gen/proto/caliper.pb.cc ]]; then
  protoc -I"$ROOT" --cpp_out="$BUILD/gen" proto/caliper.proto
fi

# caliper_core's source list, read from its CMakeLists so the two never drift apart.
mapfile -t CORE_SOURCES < <(sed -n '/add_library(caliper_core/,/)/p' core/CMakeLists.txt |
  grep -oE '^[[:space:]]+[A-Za-z0-9_/]+\.cc' | tr -d ' ')
SOURCES=("${CORE_SOURCES[@]/#/core/}" tests/fuzz/fuzz_targets.cc)
REQUEST_SOURCES=("$BUILD/gen/proto/caliper.pb.cc" server/proto_convert.cc
  tests/fuzz/request_fuzz_targets.cc)

# Rebuild an object when its source or any file in its depfile is newer (or it has no depfile).
compile() {
  local src=$1 obj=$BUILD/obj/$(echo "$1" | tr / _).o
  if [[ -f $obj && -f $obj.d ]]; then
    local stale=0 dep
    for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
      if [[ $dep -nt $obj ]]; then stale=1; break; fi
    done
    if (( stale == 0 )); then return 0; fi
  fi
  # Coverage instrumentation only; the fuzzer's main is linked once per binary.
  $CXX $CXXFLAGS -fsanitize=fuzzer-no-link -MMD -MF "$obj.d" -c "$src" -o "$obj"
}
export -f compile
export CXX CXXFLAGS BUILD
echo "fuzz: compiling ${#SOURCES[@]} sources with $CXX ($JOBS jobs)"
printf '%s\n' "${SOURCES[@]}" "${REQUEST_SOURCES[@]}" | xargs -P "$JOBS" -I{} bash -c 'compile {}'

OBJECTS=() REQUEST_OBJECTS=()
for src in "${SOURCES[@]}"; do OBJECTS+=("$BUILD/obj/$(echo "$src" | tr / _).o"); done
for src in "${REQUEST_SOURCES[@]}"; do REQUEST_OBJECTS+=("$BUILD/obj/$(echo "$src" | tr / _).o"); done

declare -A FUNCTION=([safetensors]=FuzzSafetensors [lightllm]=FuzzLightLlm
  [hf_config]=FuzzHfConfig [observer_codec]=FuzzObserverCodec [chunk]=FuzzChunk
  [proto_convert]=FuzzProtoConvert [scales_args]=FuzzScalesArgs [adapt_args]=FuzzAdaptArgs)
declare -A REQUEST=([proto_convert]=1 [scales_args]=1 [adapt_args]=1)
for target in $TARGETS; do
  [[ -n ${FUNCTION[$target]:-} ]] || { echo "fuzz: unknown target $target"; exit 2; }
  extra=()
  if [[ -n ${REQUEST[$target]:-} ]]; then extra=("${REQUEST_OBJECTS[@]}" -lprotobuf); fi
  $CXX $CXXFLAGS -fsanitize=fuzzer "-DCALIPER_FUZZ_TARGET=caliper::fuzz::${FUNCTION[$target]}" \
    tests/fuzz/libfuzzer_entry.cc "${OBJECTS[@]}" "${extra[@]}" $LIBS -o "$BUILD/fuzz_$target"
done

failed=()
SUMMARY=$BUILD/summary.txt
printf '%-16s %12s %10s %s\n' target executions exec/s result > "$SUMMARY"
for target in $TARGETS; do
  work=$BUILD/work/$target artifacts=$BUILD/artifacts/$target/
  mkdir -p "$work" "$artifacts"
  log=$BUILD/$target.log
  echo "fuzz: $target for ${SECONDS_PER_TARGET}s"
  set +e
  # New inputs go to the work dir; the committed seed corpus is only read.
  "$BUILD/fuzz_$target" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
    -rss_limit_mb=2048 -timeout=10 -max_len=65536 -artifact_prefix="$artifacts" \
    "$work" "tests/fuzz/corpus/$target" > "$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  result=ok
  if (( rc != 0 )); then
    result="CRASH (rc $rc)"
    failed+=("$target")
    mkdir -p "tests/fuzz/regressions/$target"
    for crash in "$artifacts"*; do
      [[ -f $crash ]] && cp "$crash" "tests/fuzz/regressions/$target/"
    done
    grep -E 'ERROR|SUMMARY|fuzz property' "$log" | head -5 || true
  fi
  printf '%-16s %12s %10s %s\n' "$target" "$execs" "$rate" "$result" >> "$SUMMARY"
done
cat "$SUMMARY"
if (( ${#failed[@]} > 0 )); then
  echo "fuzz: crashes in ${failed[*]}; inputs copied to tests/fuzz/regressions/ (logs in $BUILD)"
  exit 1
fi
