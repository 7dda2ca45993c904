#!/usr/bin/env python3
"""Renders a run's report.html in headless Chromium and checks what a person
would see: the DOM has every chart with a drawn line and the draft samples
with highlighted accepted prefixes, and the screenshot is not blank (chart
colours and the highlight colour are on screen).

usage: report_browser_check.py REPORT.html OUT_DIR
Exit 0 when every check holds; otherwise each failed check is printed.
Standard library only: the PNG is decoded here (zlib + the five filters).
"""
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")


def browser():
    for b in BROWSERS:
        path = shutil.which(b)
        if path:
            return path
    sys.exit("report_browser_check: no headless Chromium (%s); ci/bootstrap.sh installs "
             "chromium-headless-shell" % ", ".join(BROWSERS))


def run(args):
    base = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--window-size=1000,3000"]
    return subprocess.run(base + args, capture_output=True, timeout=120)


def decode_png(data):
    """(width, height, channels, rows of bytes) of an 8-bit non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = head
    assert depth == 8 and interlace == 0 and ctype in (2, 6), "unsupported PNG %r" % (head,)
    ch = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * ch, [], bytearray(w * ch)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - ch] if i >= ch else 0
            b, c = prev[i], prev[i - ch] if i >= ch else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, ch, rows


def near(px, rgb, tol=40):
    return all(abs(px[i] - rgb[i]) <= tol for i in range(3))


def ticks(svg, axis):
    """[(value, pixel)] of one axis' tick labels, and the axis' data-scale."""
    g = re.search(r'<g class="%s-ticks"([^>]*)>(.*?)</g>' % axis, svg, re.S)
    if not g:
        return [], None
    scale = re.search(r'data-scale="(\w+)"', g.group(1))
    coord = "y" if axis == "y" else "x"
    out = [(float(v), float(p)) for p, v in re.findall(
        r'<text class="tick" [^>]*?%s="([0-9.]+)"[^>]*>([-0-9.e+]+)</text>' % coord, g.group(2))]
    return out, scale.group(1) if scale else None


def axis_failures(svgs, titles):
    """Every chart has value ticks on both axes; the loss chart's y axis is
    logarithmic (its ticks are 1, 2 or 5 times powers of ten, placed at
    equal distances per factor of ten); points carry their value on hover."""
    failures = []
    for title, svg in zip(titles, svgs):
        ys, scale = ticks(svg, "y")
        xs, _ = ticks(svg, "x")
        if len(ys) < 3 or len(xs) < 3:
            failures.append("chart %r: %d y ticks, %d x ticks with values (want >= 3 each)"
                            % (title, len(ys), len(xs)))
        if "<title>" not in svg:
            failures.append("chart %r: no value on hover (<title> on its points)" % title)
        if title.startswith("loss"):
            if scale != "log" or "log scale" not in title:
                failures.append("the loss chart is not on a log axis (%r, %s)" % (title, scale))
                continue
            mantissas = {round(v / 10 ** math.floor(math.log10(v)), 6) for v, _ in ys}
            per_decade = {round((p1 - p2) / (math.log10(v2) - math.log10(v1)), 1)
                          for (v1, p1), (v2, p2) in zip(ys, ys[1:])}
            if not mantissas <= {1.0, 2.0, 5.0} or max(per_decade) - min(per_decade) > 1.0:
                failures.append("loss ticks not logarithmic: values %s, pixels per decade %s"
                                % ([v for v, _ in ys], sorted(per_decade)))
    return failures


def main():
    report, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.makedirs(out, exist_ok=True)
    failures = []
    dom = run(["--dump-dom", "file://" + report]).stdout.decode("utf-8", "replace")
    with open(os.path.join(out, "dom.html"), "w") as f:
        f.write(dom)
    svgs = re.findall(r"<svg.*?</svg>", dom, re.S)
    drawn = [s for s in svgs if re.search(r'<polyline[^>]*points="[0-9.]+,[0-9.]+ [0-9.]+,', s)]
    titles = re.findall(r"<h3>([^<]*)</h3>\s*<svg", dom)
    for want in ("loss", "tau", "served acceptance", "learning rate", "gradient norm",
                 "throughput"):
        if not any(t.startswith(want) for t in titles):
            failures.append("no chart titled %r in the DOM (charts: %s)" % (want, titles))
    if len(drawn) < 7:
        failures.append("%d of %d charts draw a line (want >= 7)" % (len(drawn), len(svgs)))
    failures += axis_failures(svgs, titles)
    samples = dom.count('class="sample"')
    blocks = dom.count('class="block"')
    rows = re.findall(r'<tr class="block">.*?</tr>', dom, re.S)
    accepted = sum(bool(re.search(r'<mark class="accepted">[^<]+</mark>', r)) for r in rows)
    if samples < 1 or blocks < 2:
        failures.append("draft samples missing: %d samples, %d blocks" % (samples, blocks))
    if accepted < 1:
        failures.append("no block with a non-empty accepted prefix highlighted "
                        "(<mark class=\"accepted\"> in a block row)")
    shot = os.path.join(out, "report.png")
    r = run(["--screenshot=" + shot, "file://" + report])
    if not os.path.exists(shot):
        failures.append("no screenshot: %s" % r.stderr.decode()[-400:])
    else:
        w, h, ch, rows = decode_png(open(shot, "rb").read())
        # Chart-only colours (no text uses them): the loss/tau blue, the
        # gradient-norm orange, the tokens/s purple; then the highlight green.
        total = ink = blue = orange = purple = green = 0
        for row in rows[::2]:
            for x in range(0, w * ch, ch * 2):
                px = row[x:x + 3]
                total += 1
                ink += min(px) < 200
                blue += near(px, (0x1f, 0x77, 0xb4))
                orange += near(px, (0xff, 0x7f, 0x0e))
                purple += near(px, (0x94, 0x67, 0xbd))
                green += near(px, (0xb6, 0xe3, 0xb6), 12)
        print("screenshot %dx%d: %.1f%% ink, chart blue %d, orange %d, purple %d, highlight "
              "green %d px" % (w, h, 100.0 * ink / total, blue, orange, purple, green))
        if ink < 0.01 * total:
            failures.append("the screenshot is blank (%.2f%% ink)" % (100.0 * ink / total))
        if min(blue, orange, purple) < 20:
            failures.append("chart lines not on screen (blue %d, orange %d, purple %d px)"
                            % (blue, orange, purple))
        if green < 20:
            failures.append("accepted-prefix highlight not on screen (%d px)" % green)
    print("DOM: %d charts (%d drawn: %s), %d samples, %d blocks, %d accepted highlights"
          % (len(svgs), len(drawn), ", ".join(titles), samples, blocks, accepted))
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
