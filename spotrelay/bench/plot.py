"""`--plot OUT.png`: cost vs deadline-miss rate per policy (one panel per workload), and the timeline
of one job under each policy (which pool it ran in, when; the spot availability of its pools above).

Pure Python: a small RGB canvas, a 5x7 bitmap font and a PNG writer (zlib + struct), so that the bench
needs no plotting library (matplotlib is not a dependency of spotrelay).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from spotrelay.bench.report import figures
from spotrelay.bench.runner import WorkloadRun
from spotrelay.bench.sim import JobResult, MarketView
from spotrelay.models import Market, Pool

Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (20, 20, 20)
GRID: Color = (225, 225, 225)
AXIS: Color = (110, 110, 110)
ON_DEMAND: Color = (200, 40, 40)
AVAILABLE: Color = (120, 190, 120)
POLICY_COLORS: dict[str, Color] = {
    "on-demand": (200, 40, 40),
    "greedy": (230, 140, 20),
    "uniform-progress": (40, 110, 200),
    "skypilot-eager": (140, 80, 170),
    "spotrelay": (20, 150, 80),
    "spotrelay-no-migrate": (110, 170, 40),
    "omniscient": (60, 60, 60),
}
ZONE_PALETTE: tuple[Color, ...] = (
    (31, 119, 180),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (23, 190, 207),
    (188, 189, 34),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (80, 80, 160),
    (0, 128, 128),
    (160, 120, 0),
)

# 5x7 glyphs: 7 rows of 5 bits (bit 4 = left), as 14 hex digits.
_FONT_HEX = {
    " ": "00000000000000",
    "0": "0E11131519110E",
    "1": "040C040404040E",
    "2": "0E11010204081F",
    "3": "1F02040201110E",
    "4": "02060A121F0202",
    "5": "1F101E0101110E",
    "6": "0608101E11110E",
    "7": "1F010204080808",
    "8": "0E11110E11110E",
    "9": "0E11110F01020C",
    "A": "0E1111111F1111",
    "B": "1E11111E11111E",
    "C": "0E11101010110E",
    "D": "1C12111111121C",
    "E": "1F10101E10101F",
    "F": "1F10101E101010",
    "G": "0E11101711110F",
    "H": "1111111F111111",
    "I": "0E04040404040E",
    "J": "0702020202120C",
    "K": "11121418141211",
    "L": "1010101010101F",
    "M": "111B1515111111",
    "N": "11111915131111",
    "O": "0E11111111110E",
    "P": "1E11111E101010",
    "Q": "0E11111115120D",
    "R": "1E11111E141211",
    "S": "0F10100E01011E",
    "T": "1F040404040404",
    "U": "1111111111110E",
    "V": "11111111110A04",
    "W": "1111111515150A",
    "X": "11110A040A1111",
    "Y": "1111110A040404",
    "Z": "1F01020408101F",
    "a": "00000E010F110F",
    "b": "1010161911111E",
    "c": "00000E1010110E",
    "d": "01010D1311110F",
    "e": "00000E111F100E",
    "f": "0609081C080808",
    "g": "00000F110F010E",
    "h": "10101619111111",
    "i": "04000C0404040E",
    "j": "0200060202120C",
    "k": "10101214181412",
    "l": "0C04040404040E",
    "m": "00001A15151111",
    "n": "00001619111111",
    "o": "00000E1111110E",
    "p": "00001E111E1010",
    "q": "00000D130F0101",
    "r": "00001619101010",
    "s": "00000E100E011E",
    "t": "08081C08080906",
    "u": "0000111111130D",
    "v": "00001111110A04",
    "w": "0000111115150A",
    "x": "0000110A040A11",
    "y": "000011110F010E",
    "z": "00001F0204081F",
    ".": "00000000000C0C",
    ",": "000000000C0408",
    ":": "000C0C000C0C00",
    "-": "0000001F000000",
    "_": "0000000000001F",
    "/": "00010204081000",
    "%": "18190204081303",
    "$": "040F140E051E04",
    "(": "02040808080402",
    ")": "08040202020408",
    "+": "0004041F040400",
    "=": "00001F001F0000",
    "<": "02040810080402",
    ">": "08040201020408",
    "#": "0A0A1F0A1F0A0A",
    "*": "0004150E150400",
    "[": "0E08080808080E",
    "]": "0E02020202020E",
    "'": "0C040800000000",
    "?": "0E110102040004",
    "!": "04040404000004",
    "|": "04040404040404",
    "&": "0C12140815120D",
}
_FONT: dict[str, tuple[int, ...]] = {
    ch: tuple(int(code[i : i + 2], 16) for i in range(0, 14, 2)) for ch, code in _FONT_HEX.items()
}


class Canvas:
    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: Color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped."""
        left, right = max(0, round(min(x0, x1))), min(self.width, round(max(x0, x1)))
        top, bottom = max(0, round(min(y0, y1))), min(self.height, round(max(y0, y1)))
        if right <= left or bottom <= top:
            return
        row = bytes(color) * (right - left)
        for y in range(top, bottom):
            start = (y * self.width + left) * 3
            self.pixels[start : start + len(row)] = row

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color, width: int = 1) -> None:
        steps = max(1, round(max(abs(x1 - x0), abs(y1 - y0))))
        half = width // 2
        for i in range(steps + 1):
            x = x0 + (x1 - x0) * i / steps
            y = y0 + (y1 - y0) * i / steps
            self.rect(x - half, y - half, x - half + width, y - half + width, color)

    def text(self, x: float, y: float, text: str, color: Color = BLACK, scale: int = 2) -> None:
        cx = round(x)
        for ch in text:
            glyph = _FONT.get(ch) or _FONT["?"]
            for row, bits in enumerate(glyph):
                for col in range(5):
                    if bits & (0x10 >> col):
                        self.rect(
                            cx + col * scale, y + row * scale, cx + (col + 1) * scale, y + (row + 1) * scale, color
                        )
            cx += 6 * scale

    @staticmethod
    def text_width(text: str, scale: int = 2) -> int:
        return len(text) * 6 * scale

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(1, ticks)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def _tick_label(value: float, step: float) -> str:
    return f"{round(value / step) * step:g}"


def _scatter(canvas: Canvas, run: WorkloadRun, x0: int, y0: int, width: int, height: int) -> None:
    figs = figures(run)
    canvas.text(x0, y0, run.workload.name, BLACK, 2)
    canvas.text(x0, y0 + 18, "cost vs on-demand (y) by deadline miss rate % (x)", AXIS, 1)
    left, top, right, bottom = x0 + 50, y0 + 36, x0 + width - 10, y0 + height - 30
    max_miss = max((100 * f.deadline_misses / f.jobs for f in figs.values() if f.jobs), default=0.0)
    x_max = max(5.0, max_miss * 1.1)
    y_max = max(
        1.05, max((f.cost_vs_on_demand for f in figs.values() if math.isfinite(f.cost_vs_on_demand)), default=1)
    )
    y_max *= 1.05
    xs, ys = _nice_step(x_max), _nice_step(y_max)

    def px(v: float) -> float:
        return left + (right - left) * v / x_max

    def py(v: float) -> float:
        return bottom - (bottom - top) * v / y_max

    k = 0.0
    while k <= y_max + 1e-9:
        canvas.line(left, py(k), right, py(k), GRID)
        label = _tick_label(k, ys)
        canvas.text(left - 6 - Canvas.text_width(label, 1), py(k) - 3, label, AXIS, 1)
        k += ys
    k = 0.0
    while k <= x_max + 1e-9:
        canvas.line(px(k), top, px(k), bottom, GRID)
        label = _tick_label(k, xs)
        canvas.text(px(k) - Canvas.text_width(label, 1) / 2, bottom + 6, label, AXIS, 1)
        k += xs
    canvas.line(left, bottom, right, bottom, AXIS)
    canvas.line(left, top, left, bottom, AXIS)
    placed: list[tuple[float, float, float]] = []  # the labels drawn: (left, right, top)
    for name, f in sorted(figs.items(), key=lambda item: -item[1].cost_vs_on_demand):
        if not f.jobs or not math.isfinite(f.cost_vs_on_demand):
            continue
        color = POLICY_COLORS.get(name, BLACK)
        x, y = px(100 * f.deadline_misses / f.jobs), py(f.cost_vs_on_demand)
        canvas.rect(x - 4, y - 4, x + 5, y + 5, color)
        label = f"{name} {f.cost_vs_on_demand:.2f}"
        text_w = Canvas.text_width(label)
        lx = x + 8 if x + 8 + text_w < right else x - 8 - text_w
        label_y = y - 7
        # Next to its point, or the nearest free row above or below it (labels that share a row only clash
        # if they overlap sideways), joined to the point by a line
        for shift in (0, 15, -15, 30, -30, 45, -45, 60, -60, 75, -75):
            candidate = min(max(y - 7 + shift, top), bottom - 16)
            if not any(abs(candidate - t) < 15 and lx < r and a < lx + text_w for a, r, t in placed):
                label_y = candidate
                break
        placed.append((lx, lx + text_w, label_y))
        if abs(label_y - (y - 7)) > 1:
            edge = lx if lx > x else lx + text_w
            canvas.line(x, y, edge, label_y + 7, color)
        canvas.text(lx, label_y, label, color, 2)


def _pool_colors(pools: Sequence[Pool]) -> dict[Pool, Color]:
    return {pool: ZONE_PALETTE[i % len(ZONE_PALETTE)] for i, pool in enumerate(pools)}


def _lighter(color: Color) -> Color:
    r, g, b = color
    return ((r + 2 * 255) // 3, (g + 2 * 255) // 3, (b + 2 * 255) // 3)


def _timeline(canvas: Canvas, run: WorkloadRun, x0: int, y0: int, width: int) -> int:
    """Draws the timeline panel; returns its height."""
    results: dict[str, JobResult] = run.timelines
    if not results:
        return 0
    job = run.workload.jobs[run.timeline_job]
    view = MarketView(run.workload.market)
    spot_views, _ = view.pools_for(job.instance_types, job.zones)
    spot = [v.pool for v in spot_views]
    colors = _pool_colors(spot)
    end = max(
        [job.deadline_hours, *(r.completion_hours for r in results.values() if math.isfinite(r.completion_hours))]
    )
    end *= 1.02
    title = (
        f"one job: {job.name} ({job.work_hours:g} h of work, deadline {job.deadline_hours:g} h, "
        f"restart {job.restart_overhead_hours:g} h) in {run.workload.name}"
    )
    canvas.text(x0, y0, title, BLACK, 2)
    label_w = max(Canvas.text_width(name) for name in results) + 12
    left, right = x0 + label_w, x0 + width - 20
    y = y0 + 28

    def px(hours: float) -> float:
        return left + (right - left) * hours / end

    # Spot availability of the job's pools.
    canvas.text(x0, y, "spot available:", AXIS, 1)
    y += 12
    shown = spot[:12]
    for pool in shown:
        timeline = view.view(pool).timeline
        canvas.text(x0 + 10, y, pool.availability_zone + " " + pool.instance_type, AXIS, 1)
        t = job.submit_hours
        stop = job.submit_hours + end
        while t < stop:
            nxt = min(stop, view.market.next_change(t, pool) or stop)
            if timeline.available(t, job.max_price):
                canvas.rect(px(t - job.submit_hours), y, px(nxt - job.submit_hours), y + 7, colors[pool])
            t = nxt
        y += 10
    y += 8
    row_h = 22
    for name, result in results.items():
        canvas.text(x0, y + 4, name, POLICY_COLORS.get(name, BLACK), 2)
        canvas.rect(left, y + row_h - 3, right, y + row_h - 2, GRID)
        for seg in result.segments:
            base = ON_DEMAND if seg.pool.market is Market.ON_DEMAND else colors.get(seg.pool, BLACK)
            color = _lighter(base) if seg.kind == "overhead" else base
            a, b = px(seg.start - job.submit_hours), px(seg.end - job.submit_hours)
            canvas.rect(a, y + 2, max(b, a + 1), y + row_h - 4, color)
        y += row_h
    # The deadline and the time axis.
    canvas.line(px(job.deadline_hours), y0 + 36, px(job.deadline_hours), y, ON_DEMAND, 2)
    canvas.text(px(job.deadline_hours) + 4, y0 + 24, "deadline", ON_DEMAND, 1)
    step = _nice_step(end, 8)
    k = 0.0
    canvas.line(left, y + 2, right, y + 2, AXIS)
    while k <= end + 1e-9:
        canvas.line(px(k), y + 2, px(k), y + 6, AXIS)
        label = _tick_label(k, step)
        canvas.text(px(k) - Canvas.text_width(label, 1) / 2, y + 9, label, AXIS, 1)
        k += step
    canvas.text(right - Canvas.text_width("hours since submission", 1), y + 22, "hours since submission", AXIS, 1)
    y += 38
    # Legend.
    lx = x0
    several_types = len({pool.instance_type for pool in shown}) > 1
    for pool in shown:
        label = f"{pool.availability_zone} {pool.instance_type}" if several_types else pool.availability_zone
        canvas.rect(lx, y, lx + 12, y + 12, colors[pool])
        canvas.text(lx + 16, y + 2, label, BLACK, 1)
        lx += 16 + Canvas.text_width(label, 1) + 14
    for label, color in (("on-demand", ON_DEMAND), ("restart overhead (lighter)", _lighter(AXIS))):
        canvas.rect(lx, y, lx + 12, y + 12, color)
        canvas.text(lx + 16, y + 2, label, BLACK, 1)
        lx += 16 + Canvas.text_width(label, 1) + 14
    return y + 20 - y0


def render(runs: Sequence[WorkloadRun], width: int = 1400) -> bytes:
    """The PNG of the module docstring."""
    panel_h = 340
    per_row = min(3, max(1, len(runs)))
    rows = math.ceil(len(runs) / per_row)
    timeline_run = next((r for r in runs if r.timelines and len(r.workload.jobs[r.timeline_job].zones) > 1), None)
    timeline_run = timeline_run or next((r for r in runs if r.timelines), None)
    spot_rows = 0
    if timeline_run is not None:
        spot_rows = min(12, len(timeline_run.workload.market.pools()))
    timeline_h = 0 if timeline_run is None else 28 + 12 + spot_rows * 10 + 8 + 22 * len(timeline_run.timelines) + 80
    height = 20 + rows * panel_h + timeline_h + 20
    canvas = Canvas(width, height)
    panel_w = (width - 40) // per_row
    for i, run in enumerate(runs):
        _scatter(canvas, run, 20 + (i % per_row) * panel_w, 20 + (i // per_row) * panel_h, panel_w - 20, panel_h - 20)
    if timeline_run is not None:
        _timeline(canvas, timeline_run, 20, 20 + rows * panel_h, width - 40)
    return canvas.png()


def write_plot(path: str | Path, runs: Sequence[WorkloadRun]) -> None:
    Path(path).write_bytes(render(runs))
