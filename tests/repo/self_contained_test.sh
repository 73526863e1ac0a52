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
# Every docs/ page a file points to exists.
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  pages=$(git -C "$src" grep --untracked -hoIE 'docs/[a-z0-9_-]+\.md' | sort -u)
else
  pages=$(cd "$src" && grep -rhoIE --exclude-dir=.git --exclude-dir='build*' 'docs/[a-z0-9_-]+\.md' . | sort -u)
fi
missing=0
for page in $pages; do
  [ -f "$src/$page" ] || { echo "missing page: $page"; missing=1; }
done
[ $missing = 0 ] || exit 1
echo "self-contained: no issue numbers or outside paths; $(echo "$pages" | wc -w) docs pages referenced, all present"
