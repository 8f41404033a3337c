"""Similarity benchmarks: cosine of one 768-d query against 262,144 targets (NumPy's direct formula and
its bare T @ q), top_k k=10 on the same data against FAISS IndexFlatIP, 32 queries against 16,384
targets against NumPy's BLAS product with normalised queries, and matmul against NumPy (the same BLAS).
Half precision (issue 11): top_k over the same corpus in float16 against our own float32 top_k on the
same values and against FAISS's float16 scalar-quantizer index (the same 2 bytes per element), and
cosine_similarity with the corpus in bfloat16 against our float32: half the bytes read."""
import numpy as np

from harness import Case


def cases():
    import hipsched as hs

    rng = np.random.default_rng(0)
    ex = hs.Executor()
    out = []

    n, d = 262_144, 768
    T = rng.standard_normal((n, d), dtype=np.float32)
    q = rng.standard_normal(d, dtype=np.float32)
    tbytes = 4.0 * n * d
    ours = lambda: ex.cosine_similarity(q, T, backend="cpu")  # noqa: E731
    out.append(Case("cosine_similarity", f"q({d}) x T({n},{d})", ours,
                    lambda: (T @ q) / (np.linalg.norm(T, axis=1) * np.linalg.norm(q)), "numpy T@q/(|T||q|)",
                    bytes=tbytes, flops=4.0 * n * d, target=5.0, family="similarity"))
    out.append(Case("cosine_similarity", f"q({d}) x T({n},{d})", ours, lambda: T @ q, "numpy bare T@q (no norms)",
                    bytes=tbytes, flops=4.0 * n * d, target=0.9, family="similarity"))
    try:
        import faiss
    except ImportError:
        print("cases_similarity: faiss not installed, top_k vs FAISS skipped")
    else:
        index = faiss.IndexFlatIP(d)
        index.add(T)
        q2 = q[None, :]
        out.append(Case("top_k", f"k=10, q({d}) x T({n},{d})", lambda: ex.top_k(q, T, 10, backend="cpu"),
                        lambda: index.search(q2, 10), f"faiss IndexFlatIP ({faiss.omp_get_max_threads()} threads)",
                        bytes=tbytes, flops=4.0 * n * d, target=1.5, family="similarity"))

    Th = T.astype(np.float16)
    hbytes = 2.0 * n * d
    top_h = lambda: ex.top_k(q, Th, 10, backend="cpu")  # noqa: E731
    out.append(Case("top_k", f"k=10, q({d}) x T({n},{d}) fp16", top_h, lambda: ex.top_k(q, T, 10, backend="cpu"),
                    "hipsched top_k float32 T", bytes=hbytes, flops=4.0 * n * d, target=1.7, family="similarity"))
    try:
        import faiss
    except ImportError:
        pass
    else:
        sq = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        sq.train(T[:1024])
        sq.add(T)
        q2 = q[None, :]
        out.append(Case("top_k", f"k=10, q({d}) x T({n},{d}) fp16", top_h, lambda: sq.search(q2, 10),
                        f"faiss IndexScalarQuantizer QT_fp16 IP ({faiss.omp_get_max_threads()} threads)",
                        bytes=hbytes, flops=4.0 * n * d, target=2.0, family="similarity"))
    try:
        import ml_dtypes
    except ImportError:
        print("cases_similarity: ml_dtypes not installed, bfloat16 rows skipped")
    else:
        Tb = T.astype(ml_dtypes.bfloat16)
        out.append(Case("cosine_similarity", f"q({d}) x T({n},{d}) bf16", lambda: ex.cosine_similarity(q, Tb, backend="cpu"),
                        ours, "hipsched cosine float32 T", bytes=hbytes, flops=4.0 * n * d, target=1.7,
                        family="similarity"))

    m, n2 = 32, 16_384
    T2 = np.ascontiguousarray(T[:n2])
    Q = rng.standard_normal((m, d), dtype=np.float32)
    Qn = Q / np.linalg.norm(Q, axis=1, keepdims=True)

    def numpy_blas():
        inv_norms = 1.0 / np.linalg.norm(T2, axis=1)
        return (T2 @ Qn.T) * inv_norms[:, None]

    out.append(Case("cosine_similarity", f"Q({m},{d}) x T({n2},{d})", lambda: ex.cosine_similarity(Q, T2, backend="cpu"),
                    numpy_blas, "numpy (T@Qn.T)*inv_norms", bytes=4.0 * n2 * d, flops=2.0 * m * n2 * d, target=1.0,
                    family="similarity"))

    s = 1024
    A = rng.standard_normal((s, s), dtype=np.float32)
    B = rng.standard_normal((s, s), dtype=np.float32)
    out.append(Case("matmul", f"({s},{s}) @ ({s},{s})", lambda: ex.matmul(A, B, backend="cpu"), lambda: A @ B,
                    "numpy A@B", flops=2.0 * s ** 3, target=0.95, family="similarity"))
    try:
        import ml_dtypes
        import torch
    except ImportError:
        print("cases_similarity: torch or ml_dtypes not installed, half matmul rows skipped")
        return out
    for name, dt, tdt in (("fp16", np.float16, torch.float16), ("bf16", ml_dtypes.bfloat16, torch.bfloat16)):
        Ah, Bh = A.astype(dt), B.astype(dt)
        tA, tB = torch.from_numpy(A).to(tdt), torch.from_numpy(B).to(tdt)
        out.append(Case("matmul", f"({s},{s}) @ ({s},{s}) {name}", lambda Ah=Ah, Bh=Bh: ex.matmul(Ah, Bh, backend="cpu"),
                        lambda tA=tA, tB=tB: tA @ tB, f"torch {name} A@B ({torch.get_num_threads()} threads)",
                        flops=2.0 * s ** 3, target=1.0, family="similarity"))
    return out
