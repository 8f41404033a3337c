"""Synthetic telemetry logs with known answers for the analyzer and monitor tests, written through
the real Telemetry writer (so the tests also exercise it). Costs are exact per size bucket (no jitter),
so medians, speedups, accuracy and regret have closed-form expected values."""
from hipsched.telemetry import Telemetry

# matmul: cpu = 0.01*s us, gpu = 150 + 0.001*s us -> the GPU wins above s* = 150 / 0.009
CROSSOVER = 150 / 0.009
SIZES = [int(1.4 * 2 ** b) for b in range(8, 23)]
EXPLORE, ROUTED, MISTAKES = 4, 32, 3


def cpu_us(s):
    return 0.01 * s


def gpu_us(s):
    return 150 + 0.001 * s


def write_known_log(path, run_id="run-known", host="h1", device="gfx90a"):
    """Returns the expected answers alongside the log it writes."""
    tel = Telemetry(path=path, run_id=run_id, host=host, device=device, flush_interval=3600,
                    queue_size=1 << 20)
    regret = 0.0
    for s in SIZES:
        c, g = cpu_us(s), gpu_us(s)
        for _ in range(EXPLORE):
            tel.record("matmul", "cpu", "exploring", s, "float32", 12 * s, c, c, g)
            tel.record("matmul", "gpu", "exploring", s, "float32", 12 * s, g, c, g, stream=1)
        better, worse = ("gpu", "cpu") if g < c else ("cpu", "gpu")
        for i in range(ROUTED):
            b = worse if i < MISTAKES else better
            tel.record("matmul", b, "cost_model", s, "float32", 12 * s, c if b == "cpu" else g, c, g,
                       stream=1 if b == "gpu" else None)
        regret += MISTAKES * abs(c - g)
    # attention: 50 GPU successes, 10 fallbacks (7 oom with varying byte counts, 3 launch), and two
    # separate streaks of gpu_unhealthy decisions (the breaker opened twice)
    with tel.scope(phase="transformer"):
        for i in range(50):
            tel.record("attention", "gpu", "cost_model", 4096, "float32", 65536, 80.0, 400.0, 90.0, stream=2)
        for i in range(7):
            tel.record("attention", "cpu", "cost_model", 4096, "float32", 65536, 500.0, 400.0, 90.0,
                       fallback=("gpu", f"[oom/hipErrorOutOfMemory] out of memory allocating {123456789 + i} bytes"))
        for i in range(3):
            tel.record("attention", "cpu", "cost_model", 4096, "float32", 65536, 500.0, 400.0, 90.0,
                       fallback=("gpu", "[launch] kernel failed"))
        for streak in range(2):
            for i in range(4):
                tel.record("attention", "cpu", "gpu_unhealthy", 4096, "float32", 65536, 420.0, 400.0, 90.0)
            tel.record("attention", "gpu", "cost_model", 4096, "float32", 65536, 80.0, 400.0, 90.0, stream=2)
    n = tel.stats().total_operations
    tel.close()
    return {"events": n, "regret_us": regret, "accuracy": (ROUTED - MISTAKES) / ROUTED,
            "judged": ROUTED * len(SIZES), "gpu_ok": 52, "gpu_failed": 10, "oom": 7, "launch": 3, "breaker": 2}


def write_filler_log(path, n, run_id="run-filler"):
    """n events spread over a few ops, sizes and backends (for volume and memory tests)."""
    tel = Telemetry(path=path, run_id=run_id, flush_interval=3600, queue_size=1 << 20, rotate_bytes=0)
    ops = ("add", "softmax", "cosine_similarity", "matmul")
    for i in range(n):
        s = 1 << (4 + i % 20)
        tel.record(ops[i % 4], "gpu" if i % 3 == 0 else "cpu", "cost_model", s, "float32", 8 * s,
                   1.0 + (i * 7919 % 1000) / 10.0, 2.0, 3.0, stream=(i % 2) if i % 3 == 0 else None)
        if i % 50000 == 49999:
            tel.flush()
    tel.close()
