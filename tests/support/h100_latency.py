"""Measured latencies of hipsched on an NVIDIA H100 80GB HBM3 (sm_90, CUDA 13, driver 580.159) and on its
host's CPU (16 cores with AVX-512, 16 threads), the data behind tests/support/sim_gpu.py. Copied here
because ../shared is not part of the repository.

Provenance (all on the same machine, 2026-11-26, commit 073d9ba, files under shared/h100/):
- "calibrate": `hipsched calibrate --no-progress --max-seconds 0.5` (calibrate.txt), the GPU column
  (the CPU column for CPU_US):
  median wall time of 3 forced runs of host arrays, so the inputs were resident (the resident cache
  keeps them after the first run) and each time includes the launch, the kernel and the copy of the
  output back to the host.
- "demo": the GPU calls of `hipsched demo --no-progress` (demo-cold.jsonl, demo-calibrated.jsonl),
  median duration_us per size of calls whose inputs were already resident (a corpus after its first
  query, the transformer's weights after their first layer), for the sizes the demo runs beyond the
  calibration sweep.
- "bench": bench-gpu-ops-full.md (device arrays in and out; used only where nothing else covers the
  size: top_k over a 1M x 768 corpus, qmatmul q8_0 shapes).
- "benchmarks": docs/benchmarks.md, the CPU benchmark on that GPU host at 16 threads (qmatmul).
- "estimate": one point derived from a measured one, with the arithmetic given.

Times are microseconds per call at the op's work measure (Call.size)."""

# (work measure, microseconds, source); ascending work per op
GPU_US = {
    "add": [(64, 185.8, "calibrate"), (256, 166.3, "calibrate"), (1024, 157.8, "calibrate"),
            (4096, 187.0, "calibrate"), (16384, 188.8, "calibrate"), (65536, 213.6, "calibrate"),
            (262144, 350.9, "calibrate"), (1048576, 628.5, "calibrate"), (4194304, 1696.6, "calibrate")],
    "scale": [(64, 144.8, "calibrate"), (256, 138.2, "calibrate"), (1024, 144.2, "calibrate"),
              (4096, 131.2, "calibrate"), (16384, 167.5, "calibrate"), (65536, 188.4, "calibrate"),
              (262144, 270.5, "calibrate"), (1048576, 641.0, "calibrate"), (4194304, 1498.1, "calibrate")],
    "softmax": [(64, 186.2, "calibrate"), (256, 141.4, "calibrate"), (1024, 155.9, "calibrate"),
                (4096, 143.6, "calibrate"), (16384, 142.8, "calibrate"), (65536, 198.7, "calibrate"),
                (262144, 260.0, "calibrate"), (1048576, 588.9, "calibrate"), (4194304, 1422.3, "calibrate")],
    "rms_norm": [(64, 234.0, "calibrate"), (256, 148.0, "calibrate"), (1024, 156.9, "calibrate"),
                 (4096, 168.6, "calibrate"), (16384, 152.5, "calibrate"), (65536, 188.3, "calibrate"),
                 (262144, 301.8, "calibrate"), (1048576, 550.9, "calibrate"), (4194304, 1619.5, "calibrate")],
    "attention": [(65536, 307.7, "calibrate"), (1048576, 220.0, "calibrate"), (4194304, 255.5, "calibrate"),
                  (16777216, 318.1, "calibrate"), (67108864, 431.6, "calibrate"),
                  (268435456, 1783.0, "demo")],
    "spread_activation": [(6144, 430.4, "calibrate"), (98304, 381.2, "calibrate"), (1572864, 752.8, "calibrate"),
                          # demo: 12.6 ms on the first call of a process, which uploaded the 72 MB CSR
                          # graph (6.1 ms at the measured 11.7 GB/s): 12.6 - 6.1 - a fresh seeds upload
                          (24000000, 6000.0, "estimate")],
    "matmul": [(512, 517.7, "calibrate"), (4096, 221.8, "calibrate"), (32768, 521.5, "calibrate"),
               (262144, 417.3, "calibrate"), (2097152, 185.7, "calibrate"), (16777216, 318.8, "calibrate"),
               (134217728, 432.5, "calibrate")],
    "cosine_similarity": [(8192, 279.2, "calibrate"), (32768, 189.7, "calibrate"), (131072, 181.7, "calibrate"),
                          (524288, 226.8, "calibrate"), (2097152, 243.6, "calibrate"), (8388608, 372.0, "calibrate"),
                          (152567808, 323.0, "demo"), (231260160, 394.0, "demo"), (531283968, 638.0, "demo"),
                          (805306368, 826.0, "demo")],
    "top_k": [(8192, 341.1, "calibrate"), (32768, 256.7, "calibrate"), (131072, 258.6, "calibrate"),
              (524288, 345.2, "calibrate"), (2097152, 361.3, "calibrate"), (8388608, 381.7, "calibrate"),
              (16602624, 327.0, "demo"), (38144256, 335.0, "demo"), (805306368, 1353.0, "bench")],
    "qmatmul": [(58720256, 134.0, "bench"), (268435456, 325.0, "bench"), (536870912, 1176.0, "bench"),
                (1610612736, 1277.0, "demo"), (2147483648, 1881.0, "demo")],
}

# The host CPU (16 threads), same sources. Its top_k was bimodal between processes: the calibrated demo
# ran 393k-3.1M sizes in 67-89 us, the cold one ran 0.9M-57M sizes in 6-12 ms (a multi-threaded pass
# that waited ~8 ms on its threads there); this table is the calibrated process's, the other a finding
# (docs/design/scheduling.md, "Routing accuracy").
CPU_US = {
    "add": [(64, 6.7, "calibrate"), (256, 3.6, "calibrate"), (1024, 2.7, "calibrate"), (4096, 3.3, "calibrate"),
            (16384, 7.5, "calibrate"), (65536, 17.4, "calibrate"), (262144, 150.2, "calibrate"),
            (524288, 257.0, "demo"), (1048576, 323.5, "calibrate"), (4194304, 357.9, "calibrate")],
    "scale": [(64, 3.5, "calibrate"), (256, 2.7, "calibrate"), (1024, 3.5, "calibrate"), (4096, 4.1, "calibrate"),
              (16384, 5.7, "calibrate"), (65536, 14.6, "calibrate"), (262144, 83.3, "calibrate"),
              (524288, 234.0, "demo"), (1048576, 303.6, "calibrate"), (4194304, 293.6, "calibrate")],
    "softmax": [(64, 5.4, "calibrate"), (256, 3.6, "calibrate"), (1024, 4.8, "calibrate"), (4096, 8.7, "calibrate"),
                (16384, 13.3, "calibrate"), (65536, 35.4, "calibrate"), (256000, 356.0, "demo"),
                (1048576, 84.1, "calibrate"), (4194304, 317.6, "calibrate")],
    "rms_norm": [(64, 37.4, "calibrate"), (256, 14.1, "calibrate"), (1024, 15.8, "calibrate"),
                 (4096, 16.3, "calibrate"), (16384, 20.7, "calibrate"), (65536, 43.3, "calibrate"),
                 (262144, 161.9, "calibrate"), (1048576, 265.8, "calibrate"), (4194304, 419.9, "calibrate")],
    "attention": [(65536, 45.2, "calibrate"), (1048576, 82.5, "calibrate"), (4194304, 132.1, "calibrate"),
                  (16777216, 276.6, "calibrate"), (67108864, 396.8, "calibrate"), (268435456, 962.0, "demo")],
    "spread_activation": [(6144, 46.7, "calibrate"), (98304, 99.4, "calibrate"), (1572864, 1152.2, "calibrate"),
                          (24000000, 6496.0, "demo")],
    "matmul": [(512, 24.2, "calibrate"), (4096, 23.8, "calibrate"), (32768, 21.1, "calibrate"),
               (262144, 33.4, "calibrate"), (2097152, 45.0, "calibrate"), (16777216, 111.8, "calibrate"),
               (134217728, 479.0, "calibrate")],
    "cosine_similarity": [(8192, 30.5, "calibrate"), (32768, 26.8, "calibrate"), (131072, 36.0, "calibrate"),
                          (524288, 179.6, "calibrate"), (2097152, 172.8, "calibrate"),
                          (8388608, 355.2, "calibrate"), (28901376, 3447.0, "demo"), (100638720, 18660.0, "demo"),
                          (1220616192, 16902.0, "demo"), (6442450944, 53920.0, "demo")],
    "top_k": [(8192, 34.7, "calibrate"), (32768, 29.8, "calibrate"), (131072, 47.9, "calibrate"),
              (393216, 67.0, "demo"), (903168, 78.0, "demo"), (3144960, 89.0, "demo"),
              (8388608, 455.7, "calibrate"), (38144256, 707.0, "demo"), (87631872, 2896.0, "demo"),
              (132825600, 5103.0, "demo"), (201326592, 7861.0, "demo")],
    # 64 x 1024 q8_0 mat-vec: the 8192 x 8192 one's 870 us scaled by its 1/1024 of the bytes, plus ~10 us
    # of call overhead
    "qmatmul": [(65536, 11.0, "estimate"), (67108864, 870.0, "benchmarks"), (262144000, 2109.0, "demo"),
                (536870912, 2939.0, "benchmarks"), (1610612736, 9287.0, "demo"), (2147483648, 16877.0, "demo")],
}

# The link as hipsched measured it at start on that machine (model-after-calibrate.json "transfer").
MEASURED_TRANSFER = {"h2d_latency_us": 11.1, "h2d_gbps": 11.75, "d2h_latency_us": 20.8, "d2h_gbps": 12.19}

# Uploads of large pageable host arrays ran slower than that measurement in the demo logs: a 432 MB
# corpus slice cost 45 ms per call (9.6 GB/s), an 805 MB one 100 ms (8.1 GB/s), a 150 MB one 33 ms on
# its first upload. Above LARGE_UPLOAD_BYTES the simulated link runs at LARGE_UPLOAD_GBPS.
LARGE_UPLOAD_BYTES = 64 << 20
LARGE_UPLOAD_GBPS = 8.5

# The GPU backend's resident budget on the day of these measurements (256 MiB, the default then; now
# half the free device memory, which the simulated device takes: sim_gpu.py). The demo logs' uploads of
# corpus slices over it, on every call, come from this budget.
RESIDENT_BYTES_THEN = 256 << 20
