"""Checks caliper report's outputs: report.json content, report.html sections, and that the
Chromium screenshot of it is not blank (stdlib PNG decoder: many distinct colours, ink on most
rows of the page's upper part)."""
import json
import sys
import zlib


def png_pixels(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big")
            depth, ctype = body[8], body[9]
            assert depth == 8 and ctype in (2, 6), f"unsupported PNG colour type {ctype}"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def main(single_json, compare_json, html_path, shot=None):
    a = json.load(open(single_json))
    assert a["schema"] == "caliper.report.v1", a["schema"]
    assert a["has_histograms"] is True
    assert a["session"]["recipe"]["kv_observer"] == "mse"
    layers = a["kv"]["layers"]
    assert len(layers) == a["session"]["model"]["num_layers"] and layers
    flagged = 0
    for layer in layers:
        for kind in ("K", "V"):
            side = layer[kind]
            assert side["recommended"] in ("mse", "static_minmax")
            assert side["sqnr_db"] is not None and side["sqnr_db"] > 10, side["sqnr_db"]
            for h in side["heads"]:
                o = h["observers"]
                assert 0 < o["mse"] <= o["static_minmax"] * (1 + 1e-6), o
                assert 0 < o["percentile"] <= o["static_minmax"] * (1 + 1e-6), o
                assert abs(h["scale"] - o["mse"]) <= 1e-6 * o["mse"], (h["scale"], o["mse"])
                assert 0 <= h["fraction_clipped"] < 0.01
                flagged += h["outlier"]
    assert flagged > 0, "the demo model's outlier heads were not flagged"
    assert a["worst_histograms"] and a["worst_histograms"][0]["bins"]
    c = json.load(open(compare_json))
    assert c["schema"] == "caliper.report.compare.v1" and len(c["sessions"]) == 2
    b = c["sessions"][1]
    assert b["session"]["recipe"]["kv_observer"] == "percentile:99.9"
    mods = b["nvfp4"]["modules"]
    assert mods and all(m["input_p99_99"] and m["input_p99_99"] <= m["input_amax"] for m in mods)
    assert any(m["weight_range_lost_octaves"] is None for m in mods)  # no weights were streamed
    html = open(html_path, encoding="utf-8").read()
    for section in ("compare", "session-a", "session-b", "heatmaps-a", "sqnr-a", "histograms-a",
                    "layers-a", "nvfp4-b", "summary-b"):
        assert f'id="{section}"' in html, f"section {section} missing"
    assert html.count("<svg") >= 6
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    assert "<script" not in html
    if shot:
        width, height, bpp, rows = png_pixels(shot)
        colours, inked = set(), 0
        for y in range(0, height, 4):
            row = rows[y]
            px = {row[i:i + 3] for i in range(0, width * bpp, bpp * 4)}
            colours |= px
            inked += len(px) > 1
        assert len(colours) > 50, f"screenshot looks blank: {len(colours)} colours"
        assert inked > height // 16, f"screenshot looks blank: {inked} inked rows"
        print(f"screenshot {width}x{height}: {len(colours)} colours, {inked} inked rows")
    print("check_report: ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
