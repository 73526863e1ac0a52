#!/bin/sh
# The repository stands on its own: no tracked file names a tracker issue number or a file outside
# the repository (research notes, a sibling shared folder, a machine's work tree). The project's
# own references live in docs/. Usage: self_contained_test.sh SOURCE_DIR. Exits 1 and lists each offending line.
set -u
src=${1:?usage: self_contained_test.sh SOURCE_DIR}
# Built from pieces so this file does not match itself.
i=issue d=domain s=shared w=work
pattern="(^|[^a-z])${i}s? ?#?[0-9]+|${d}\\.md|\\.\\./${s}|${s}/[a-z_-]+\\.md|(^|[^a-z0-9_}])/${w}/"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Tracked files plus new ones not ignored, as they are in the work tree.
  hits=$(git -C "$src" grep --untracked -nIiE "$pattern" -- . ':!CHANGELOG.md')
else
  hits=$(cd "$src" && grep -rnIiE --exclude-dir=.git --exclude-dir='build*' \
    --exclude=CHANGELOG.md "$pattern" .)
fi
if [ -n "$hits" ]; then
  echo "References outside the repository (say it in place, or point to docs/):"
  echo "$hits"
  exit 1
fi
echo "self-contained: no issue numbers or outside paths"
