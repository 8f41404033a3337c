"""Streaming quantiles in bounded memory: a log-scale histogram. Bin i holds values in
[g^i, g^(i+1)) with g = 1.02, so any quantile is returned within 1% relative error (the bin's geometric
middle), whatever the number of values; durations from 1 ns to hours need under 2,000 bins. Histograms
merge exactly (add the bins), which is what combining logs and size buckets needs."""
from __future__ import annotations

import math

GROWTH = 1.02
_LOG_G = math.log(GROWTH)


class LogHistogram:
    __slots__ = ("bins", "count", "total", "zeros", "min", "max")

    def __init__(self):
        self.bins = {}
        self.count = 0
        self.total = 0.0
        self.zeros = 0          # values <= 0 (a timer can read 0 for tiny calls)
        self.min = math.inf
        self.max = -math.inf

    def add(self, x: float) -> None:
        self.count += 1
        self.total += x
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        if x <= 0:
            self.zeros += 1
            return
        i = math.floor(math.log(x) / _LOG_G)
        b = self.bins
        b[i] = b.get(i, 0) + 1

    def merge(self, other: "LogHistogram") -> None:
        for i, n in other.bins.items():
            self.bins[i] = self.bins.get(i, 0) + n
        self.count += other.count
        self.total += other.total
        self.zeros += other.zeros
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """Value at quantile q in [0, 1] by nearest rank (the ceil(q*n)-th smallest value; None when
        empty), clamped to the observed min and max."""
        if self.count == 0:
            return None
        k = max(0, math.ceil(q * self.count) - 1)      # 0-based index of the value wanted
        if k == 0:
            return self.min                              # the extremes are known exactly
        if k >= self.count - 1:
            return self.max
        seen = self.zeros
        if k < seen:
            return max(self.min, 0.0)
        for i in sorted(self.bins):
            seen += self.bins[i]
            if k < seen:
                return min(max(GROWTH ** (i + 0.5), self.min), self.max)
        return self.max

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def summary(self) -> dict:
        return {"count": self.count, "total_us": self.total, "mean_us": self.mean, "p50_us": self.quantile(0.5),
                "p95_us": self.quantile(0.95), "p99_us": self.quantile(0.99)}
