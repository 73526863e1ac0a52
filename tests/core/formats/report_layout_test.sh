#!/usr/bin/env bash
# report.html as people read it: rendered by headless Chromium at 1280x800 (a laptop) and
# 1920x1080, one screenshot of the first screen per size and page, and a script run in the page
# (appended to a copy) that measures every text box: no SVG text outside its chart, no text
# wider than its box, no page wider than the window, charts at least 300 px wide, the summary on
# the first screen. Checked by check_report_layout.py. Exit 77 (skipped) when chromium is missing.
# usage: report_layout_test.sh WRITE_REPORT_SAMPLE OUT_DIR
set -euo pipefail
GEN=$1
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[[ -n "$CHROMIUM" ]] || { echo "chromium not installed: layout check skipped"; exit 77; }
rm -rf "$OUT" && mkdir -p "$OUT"
"$GEN" "$OUT"
for page in report compare versions; do
  sed 's|</body>|<script src="layout_check.js"></script></body>|' "$OUT/$page.html" >"$OUT/$page-checked.html"
done
cp "$HERE/layout_check.js" "$OUT/"
for size in 1280,800 1920,1080; do
  for page in report compare versions; do
    name="$page-${size/,/x}"
    timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
      --allow-file-access-from-files --window-size="$size" --screenshot="$OUT/$name.png" \
      "file://$OUT/$page.html" >"$OUT/$name.log" 2>&1 || { cat "$OUT/$name.log"; exit 1; }
    timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
      --allow-file-access-from-files --window-size="$size" --dump-dom \
      "file://$OUT/$page-checked.html" >"$OUT/$name.dom.html" 2>"$OUT/$name.dom.log" ||
      { cat "$OUT/$name.dom.log"; exit 1; }
  done
done
python3 "$HERE/check_report_layout.py" "$OUT"
