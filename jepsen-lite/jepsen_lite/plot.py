"""A PNG of a run, drawn without a plotting library (zlib and struct only).

Layout, top to bottom: one band per nemesis kind with its faults as coloured spans (kill red,
pause orange, clock purple, disk-full brown, lock-fault black, partition teal, monkey-unlock
olive, clear-locks magenta; a fault not verified is drawn hatched), then the chart: enqueue
acks per second (green bars), executions per second (blue line), enqueue failures and unknown outcomes per second (red / grey ticks at the bottom). The
x axis is seconds since the start, with a grid line every 10 s; a faint grid every 10 units on
the y axis. Phases (heal, liveness) are dotted vertical lines.
"""

from __future__ import annotations

import struct
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot"]

Color = tuple[int, int, int]
FAULT_COLORS: dict[str, Color] = {
    "kill": (220, 40, 40),
    "pause": (240, 150, 20),
    "clock": (140, 60, 200),
    "disk-full": (130, 80, 30),
    "lock-fault": (20, 20, 20),
    "partition": (0, 140, 140),
    "monkey-unlock": (120, 130, 20),
    "clear-locks": (200, 40, 160),
}
GREEN: Color = (60, 170, 80)
BLUE: Color = (40, 90, 220)
RED: Color = (220, 40, 40)
GREY: Color = (150, 150, 150)
GRID: Color = (228, 228, 228)
AXIS: Color = (90, 90, 90)


class Canvas:
    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def set(self, x: int, y: int, c: Color) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i : i + 3] = bytes(c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: Color, hatch: bool = False) -> None:
        for y in range(max(0, y0), min(self.h, y1)):
            for x in range(max(0, x0), min(self.w, x1)):
                if not hatch or (x + y) % 4 < 2:
                    self.set(x, y, c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: Color) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            self.set(x0 + (x1 - x0) * i // steps, y0 + (y1 - y0) * i // steps, c)

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.px[y * self.w * 3 : (y + 1) * self.w * 3]) for y in range(self.h)
        )

        def chunk(tag: bytes, data: bytes) -> bytes:
            body = tag + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b"")
        )


def plot(history: Sequence[Mapping[str, Any]], path: Path, width: int = 1000) -> None:
    """Draw the run's throughput and faults over time into `path` (PNG)."""
    t0 = history[0]["t"]
    t_end = max(e["t"] for e in history)
    seconds = max(1, (t_end - t0) // 1_000_000 + 1)
    acks: dict[int, int] = defaultdict(int)
    execs: dict[int, int] = defaultdict(int)
    fails: dict[int, int] = defaultdict(int)
    infos: dict[int, int] = defaultdict(int)
    spans: list[tuple[str, int, int, bool]] = []
    starts: dict[tuple[Any, Any], int] = {}
    phases: list[int] = []
    for e in history:
        s = (e["t"] - t0) // 1_000_000
        kind = e.get("kind")
        if kind == "enqueue":
            {"ok": acks, "fail": fails, "info": infos}.get(e.get("phase", ""), defaultdict(int))[
                s
            ] += 1
        elif kind == "execute":
            execs[s] += 1
        elif kind == "fault":
            key = (e.get("name"), e.get("node"))
            if e.get("phase") == "start":
                starts[key] = e["t"]
            elif key in starts:
                spans.append((str(e.get("name")), starts.pop(key), e["t"], bool(e.get("verified"))))
        elif kind == "phase":
            phases.append(e["t"])
    kinds = [k for k in FAULT_COLORS if any(sp[0] == k for sp in spans)]
    band, left, top_chart, chart_h, bottom = 14, 40, 10 + 16 * len(kinds), 260, 20
    height = top_chart + chart_h + bottom
    c = Canvas(width, height)
    plot_w = width - left - 10

    def x_of(t_us: int) -> int:
        return left + int((t_us - t0) * plot_w / max(1, t_end - t0))

    for row, k in enumerate(kinds):
        y = 8 + 16 * row
        c.rect(left, y + band // 2, left + plot_w, y + band // 2 + 1, GRID)
        c.rect(4, y, 4 + band, y + band, FAULT_COLORS[k])  # legend swatch
        for name, a, b, ok in spans:
            if name == k:
                c.rect(
                    x_of(a), y, max(x_of(b), x_of(a) + 2), y + band, FAULT_COLORS[k], hatch=not ok
                )
    peak = max([*acks.values(), *execs.values(), 1])
    scale = (chart_h - 10) / peak
    base = top_chart + chart_h
    for v in range(0, peak + 1, 10):
        y = base - int(v * scale)
        c.rect(left, y, left + plot_w, y + 1, GRID)
    for s in range(0, seconds + 1, 10):
        x = x_of(t0 + s * 1_000_000)
        c.rect(x, top_chart, x + 1, base, GRID)
    bar = max(1, plot_w // seconds - 1)
    for s, n in acks.items():
        x = x_of(t0 + s * 1_000_000)
        c.rect(x, base - int(n * scale), x + bar, base, GREEN)
    prev: tuple[int, int] | None = None
    for s in range(seconds):
        pt = (x_of(t0 + s * 1_000_000) + bar // 2, base - int(execs.get(s, 0) * scale))
        if prev is not None:
            c.line(prev[0], prev[1], pt[0], pt[1], BLUE)
            c.line(prev[0], prev[1] - 1, pt[0], pt[1] - 1, BLUE)
        prev = pt
    for s, n in fails.items():
        x = x_of(t0 + s * 1_000_000)
        c.rect(x, base + 3, x + bar, base + 3 + min(8, n), RED)
    for s, n in infos.items():
        x = x_of(t0 + s * 1_000_000)
        c.rect(x, base + 12, x + bar, base + 12 + min(8, n), GREY)
    for t in phases:
        x = x_of(t)
        for y in range(top_chart, base, 4):
            c.rect(x, y, x + 1, y + 2, AXIS)
    c.rect(left, top_chart, left + 1, base, AXIS)
    c.rect(left, base, left + plot_w, base + 1, AXIS)
    path.write_bytes(c.png())
