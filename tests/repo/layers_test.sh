#!/bin/sh
# core/'s folders are layers: a file in one may include only its own folder and the folders
# declared before it in core/CMakeLists.txt's CALIPER_CORE_LAYERS. One include root serves them
# all, so the compiler accepts an upward include; this check refuses it. Also refuses a core
# folder the list does not declare. Usage: layers_test.sh SOURCE_DIR (exit 1 lists each
# offending line), or layers_test.sh --self-test (shows it fails on an injected upward include).
set -u
if [ "${1:-}" = --self-test ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/core/low" "$tmp/core/high"
  printf 'set(CALIPER_CORE_LAYERS\n  low\n  high\n)\n' >"$tmp/core/CMakeLists.txt"
  printf '#include "core/low/a.h"\n' >"$tmp/core/high/b.h"
  printf '#include <string>\n' >"$tmp/core/low/a.h"
  sh "$0" "$tmp" >/dev/null || { echo "self-test: a clean tree was refused"; exit 1; }
  printf '#include "core/high/b.h"\n' >"$tmp/core/low/a.cc"
  out=$(sh "$0" "$tmp") && { echo "self-test: an upward include passed"; exit 1; }
  echo "$out" | grep -q 'core/low/a.cc:1:.*core/high/b.h' ||
    { echo "self-test: the refusal does not name the line: $out"; exit 1; }
  mkdir -p "$tmp/core/extra" && rm "$tmp/core/low/a.cc"
  sh "$0" "$tmp" >/dev/null && { echo "self-test: an undeclared folder passed"; exit 1; }
  echo "self-test: an upward include and an undeclared folder are refused"
  exit 0
fi
src=${1:?usage: layers_test.sh SOURCE_DIR | --self-test}
# The list: the words between "set(CALIPER_CORE_LAYERS" and the next ")".
layers=$(sed -n '/^set(CALIPER_CORE_LAYERS/,/)/p' "$src/core/CMakeLists.txt" |
  sed -e 's/#.*//' -e 's/set(CALIPER_CORE_LAYERS//' -e 's/)//' | tr -s ' \n' '  ')
[ -n "$(echo $layers)" ] || { echo "core/CMakeLists.txt declares no CALIPER_CORE_LAYERS"; exit 1; }
rank() {  # position of $1 in the list, 0 when absent
  i=0
  for layer in $layers; do
    i=$((i + 1))
    [ "$layer" = "$1" ] && { echo $i; return; }
  done
  echo 0
}
status=0
for dir in "$src"/core/*/; do
  folder=$(basename "$dir")
  if [ "$(rank "$folder")" = 0 ]; then
    echo "core/$folder: not a declared layer (add it to CALIPER_CORE_LAYERS in core/CMakeLists.txt)"
    status=1
  fi
done
for folder in $layers; do
  own=$(rank "$folder")
  [ -d "$src/core/$folder" ] || { echo "core/$folder: declared but missing"; status=1; continue; }
  hits=$(cd "$src" && grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"core/' \
    "core/$folder" --include='*.h' --include='*.cc')
  [ -n "$hits" ] || continue
  bad=$(echo "$hits" | while IFS= read -r line; do
    target=$(echo "$line" | sed -E 's|.*#[[:space:]]*include[[:space:]]*"core/([^/"]*)/.*|\1|')
    r=$(rank "$target")
    if [ "$r" = 0 ] || [ "$r" -gt "$own" ]; then echo "$line"; fi
  done)
  if [ -n "$bad" ]; then
    echo "core/$folder includes a layer above it (order: $(echo $layers | sed 's/ / < /g')):"
    echo "$bad"
    status=1
  fi
done
[ $status = 0 ] && echo "layers: $(echo $layers | sed 's/ / < /g'); no upward include"
exit $status
