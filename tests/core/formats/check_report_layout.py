"""Reads what layout_check.js wrote into each dumped page and the screenshots of
report_layout_test.sh: no text overflow at any size, every chart there, screenshots not blank."""
import html
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "e2e"))
from check_report import png_pixels  # noqa: E402  (the stdlib PNG decoder of the e2e check)


def main(out):
    failures = []
    for size in ("1280x800", "1920x1080"):
        w, h = (int(v) for v in size.split("x"))
        for page, charts_min in (("report", 7), ("compare", 14), ("versions", 14)):
            name = f"{page}-{size}"
            dom = open(os.path.join(out, f"{name}.dom.html"), encoding="utf-8").read()
            m = re.search(r'<pre id="layout-check">(.*?)</pre>', dom, re.S)
            assert m, f"{name}: the layout script wrote nothing"
            check = json.loads(html.unescape(m.group(1)))
            assert check["width"] == w, f"{name}: window {check['width']} px, expected {w}"
            assert check["charts"] >= charts_min, f"{name}: {check['charts']} charts"
            failures += [f"{name}: {p}" for p in check["problems"]]
            width, height, bpp, rows = png_pixels(os.path.join(out, f"{name}.png"))
            assert (width, height) == (w, h), f"{name}.png is {width}x{height}"
            colours = set()
            inked = 0
            for row in rows[::8]:
                for x in range(0, width * bpp, 8 * bpp):
                    px = bytes(row[x:x + 3])
                    colours.add(px)
                    inked += px != b"\xff\xff\xff"
            assert len(colours) > 50 and inked > 0.05 * (width // 8) * (height // 8), \
                f"{name}.png looks blank ({len(colours)} colours)"
            print(f"{name}: {check['charts']} charts, summary at {check['summaryTop']:.0f} px, "
                  f"{len(check['problems'])} overflow(s), screenshot {len(colours)} colours")
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("report layout: ok")


if __name__ == "__main__":
    main(sys.argv[1])
