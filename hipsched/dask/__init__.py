"""hipsched on a Dask cluster: one Executor per worker, the ops on Dask arrays, one telemetry log per
worker in a folder per job. Needs `pip install "hipsched[dask]"` (dask[array] and distributed);
`import hipsched` never imports this. See docs/guide/distributed.md.

    from dask.distributed import Client
    import hipsched.dask as hd
    client = Client(...)
    job = hd.setup(client, telemetry_dir="logs")   # an Executor on every worker, logs/<job>/<worker>.jsonl
    idx, scores = dask.compute(*hd.top_k(q, T, 10))  # T: a Dask array chunked by rows
"""
try:
    import dask.array  # noqa: F401
    import distributed  # noqa: F401
except ImportError as e:  # say which extra brings them, not just the missing module
    raise ImportError(f"hipsched.dask needs dask[array] and distributed ({e}); install them with "
                      f"pip install \"hipsched[dask]\"") from e

from .graph import PartitionedGraph, partition_graph, spread_activation
from .linalg import QuantizedRows, attention, dequantize, matmul, qmatmul, shard_rows
from .ops import add, cosine_similarity, gelu, merge_top_k, rope, scale, silu_mul, softmax, top_k
from .placement import forget_placements
from .direct import search
from .workers import (PLUGIN_NAME, HipschedWorkerPlugin, executor, flush_telemetry, pinned_device, setup, teardown,
                      worker_info)

__all__ = ["setup", "teardown", "executor", "worker_info", "pinned_device", "HipschedWorkerPlugin", "PLUGIN_NAME", "flush_telemetry",
           "top_k", "cosine_similarity", "merge_top_k", "forget_placements", "search", "add", "scale", "softmax",
           "silu_mul", "gelu", "rope",
           "matmul", "attention", "dequantize", "qmatmul", "QuantizedRows", "shard_rows",
           "spread_activation", "PartitionedGraph", "partition_graph"]
