"""The roofline of the GPU benchmark's rows: per kernel, the bytes it must move and the FLOPs it must do
per call at bench/gpu_ops.py's full shapes, and the least time those imply on an H100 SXM at the copy's
bandwidth (2992 GB/s, measured device to device by bench/gpu_ops.py on the H100 of ../shared/h100) and
the dense peaks (990 TFLOP/s fp16/bf16 tensor cores, 67 TFLOP/s fp32 SIMT). The bound is the larger of
the two times. With a bench/gpu_ops.py results table (`--measured FILE.md`) each row also shows the time
measured there and its share of the bound (bound / measured: 1.0 is the hardware's limit).

Usage: python bench/roofline.py [--measured bench/results/gpu_ops.md] [--bandwidth GBPS]
Prints a markdown table (docs/design/kernel-report.md, "Instruction check and roofline", is this output)."""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

COPY_GBPS = 2992.0
FP16_TFLOPS = 990.0
FP32_TFLOPS = 67.0
MiB = 1 << 20


@dataclass(frozen=True)
class Row:
    op: str             # as bench/gpu_ops.py names it (the measured table's first column)
    shape: str          # as bench/gpu_ops.py names it (second column)
    bytes: float        # the least bytes read + written per call
    flops: float        # floating point operations per call
    half: bool          # tensor-core peak (fp16/bf16 operands) rather than the fp32 one
    note: str = ""


def _attention(b, h, s, d, causal, half, elt):
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return flops, 4.0 * b * h * s * d * elt           # q, k, v read once, out written once


def rows() -> list[Row]:
    out = []
    big = 1 << 26
    out += [Row("add", "256 MiB", 12.0 * big, big, False, "a, b read; y written"),
            Row("scale", "256 MiB", 8.0 * big, big, False)]
    for tag in ("fp16", "bf16"):
        out += [Row(f"add {tag}", "64M", 6.0 * big, big, False),
                Row(f"scale {tag}", "64M", 4.0 * big, big, False)]
    x = 8192 * 4096
    out.append(Row("softmax", "(8192, 4096) axis=-1", 8.0 * x, 5.0 * x, False, "one read, one write"))
    n = 1 << 20
    out.append(Row("cosine_similarity", f"q(768) x T({n},768)", 4.0 * n * 768 + 4 * n, 3.0 * n * 768, False))
    for qtype, bpb in (("q8_0", 34), ("q4_0", 18)):
        nn = 8192 * 8192
        out.append(Row("dequantize", f"{qtype} 8192x8192", nn / 32 * bpb + 4.0 * nn, nn, False))
        for r, k in ((8192, 8192), (16384, 16384), (14336, 4096)):
            out.append(Row("qmatmul", f"{qtype} ({r},{k}) x vec", r * k / 32 * bpb + 4.0 * (r + k), 2.0 * r * k, False,
                           "weights once; x and y are noise"))
    r = k = 8192
    out.append(Row("qmatmul", f"q8_0 ({r},{k}) x ({k},8)", r * k / 32 * 34 + 4.0 * 8 * (r + k), 2.0 * r * k * 8,
                   False, "8 columns from one pass over the weights"))
    for tag in ("fp16", "bf16"):
        f, b = _attention(1, 8, 2048, 64, False, True, 2)
        out.append(Row(f"attention {tag}", "(1,8,2048,64)", b, f, True, "tensor cores"))
        out.append(Row(f"matmul {tag}", "4096^3", 3.0 * 4096 * 4096 * 2, 2.0 * 4096 ** 3, True))
    for (b_, h, s, d) in ((1, 8, 2048, 64), (1, 8, 2048, 128), (4, 16, 1024, 64)):
        for causal in (False, True):
            f, b = _attention(b_, h, s, d, causal, False, 4)
            out.append(Row("attention", f"b{b_} h{h} s{s} d{d}{' causal' if causal else ''}", b, f, False,
                           "fp32 SIMT"))
    out.append(Row("matmul", "(4096,4096) @ (4096,4096)", 3.0 * 4096 * 4096 * 4, 2.0 * 4096 ** 3, False))
    return out


def _time(s: str) -> float:
    v, unit = s.split()
    return float(v) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def measured(path: str) -> dict[tuple[str, str], float]:
    """{(op, shape): our time in seconds} from a bench/gpu_ops.py markdown table (the first row of each)."""
    found = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.match(r"^[\d.]+ (us|ms|s)$", cells[2]):
            found.setdefault((cells[0], cells[1]), _time(cells[2]))
    return found


def _fmt(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def table(bandwidth: float = COPY_GBPS, seen: dict | None = None) -> list[str]:
    head = "| op | shape | bytes | FLOPs | at the copy's bandwidth | at peak FLOP/s | bound |"
    sep = "|---|---|--:|--:|--:|--:|---|"
    if seen is not None:
        head += " measured | share of bound |"
        sep += "--:|--:|"
    lines = [head, sep]
    for r in rows():
        t_mem = r.bytes / (bandwidth * 1e9)
        t_fl = r.flops / ((FP16_TFLOPS if r.half else FP32_TFLOPS) * 1e12)
        bound = max(t_mem, t_fl)
        line = (f"| {r.op} | {r.shape} | {r.bytes / MiB:,.1f} MiB | {r.flops / 1e9:,.2f} G | {_fmt(t_mem)} | "
                f"{_fmt(t_fl)} | {'memory' if t_mem >= t_fl else 'compute'} |")
        if seen is not None:
            t = seen.get((r.op, r.shape))
            line += f" {_fmt(t)} | {bound / t:.2g} |" if t else " | |"
        lines.append(line)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measured", help="a bench/gpu_ops.py results table (markdown)")
    p.add_argument("--bandwidth", type=float, default=COPY_GBPS, help="copy bandwidth in GB/s (default %(default)s)")
    a = p.parse_args(argv)
    print("\n".join(table(a.bandwidth, measured(a.measured) if a.measured else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
