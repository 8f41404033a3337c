"""An LLM decode end to end (examples/llama_model.py, issue 34): a Llama-architecture model of random
weights written to a GGUF file with the `gguf` package and read back, decoded token by token with a KV
cache from hipsched's public ops only, against an independent torch implementation of the architecture on
the weights `gguf` dequantizes (torch's rms_norm, SDPA with repeated KV heads and an explicit causal mask,
rotary embedding from the formula), run over the whole sequence at once: logits within 1e-4 relative,
the same top-1 token at every step."""
import importlib.util
import os
import sys

import numpy as np
import pytest

import gpu_emulator
from emulated_executor import emulated_executor
from requires import need

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _example_module(name):
    """examples/<name>.py loaded by path (examples/ is no package, and on sys.path it could shadow one)."""
    spec = importlib.util.spec_from_file_location(f"hipsched_example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


lm = _example_module("llama_model")
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    need("gguf")
    d = tmp_path_factory.mktemp("gguf")
    cfg = lm.PRESETS["tiny"]
    return {w: lm.write_gguf(str(d / f"tiny-{w}.gguf"), cfg, w, seed=7) for w in lm.WEIGHT_DTYPES}


def test_the_gguf_file_reads_back_as_written(gguf_files):
    gguf = need("gguf")
    cfg = lm.PRESETS["tiny"]
    m = lm.load_gguf(gguf_files["q4_0"])
    # the config from the metadata; the file holds rms_eps as float32
    assert m.cfg == cfg.replace(rms_eps=float(np.float32(cfg.rms_eps))) and m.weight_dtype == "q4_0"
    assert sorted(m.tensors) == sorted(n for n, _ in lm.all_tensors(cfg))
    w = m.tensors["blk.1.ffn_down.weight"]
    assert w.shape == (cfg.dim, cfg.ffn_dim) and w.qtype == "q4_0"
    # hipsched reads the mapped blocks as gguf does: the same floats
    import hipsched
    np.testing.assert_array_equal(hipsched.dequantize(w, backend="cpu"), m.dequantized("blk.1.ffn_down.weight"))
    assert m.reader.tensors[0].tensor_type == gguf.GGMLQuantizationType.Q4_0


@pytest.mark.parametrize("weights,fuse", [(w, True) for w in lm.WEIGHT_DTYPES] + [("q8_0", False)])
def test_decode_matches_torch_over_64_steps(gguf_files, weights, fuse):
    need("torch")
    import hipsched
    model = lm.load_gguf(gguf_files[weights])
    with hipsched.Executor(persist_model=False, strategy="backend_only", backend="cpu") as ex:
        dec = lm.HipschedLlama(model, ex, fuse=fuse)
        out, logits = dec.generate(PROMPT, 64)
        ops = {e["op"] for e in ex.events}
    ref = lm.TorchLlama(model).forward(PROMPT + out[:-1])
    rel, differ = lm.compare_logits(logits, ref)
    assert rel < 1e-4 and differ == [], (weights, rel, differ)
    # greedy: each generated token is the reference's top-1 after the tokens before it
    assert out == [int(t) for t in ref[len(PROMPT) - 1:].argmax(-1)]
    assert len(set(out)) > 8    # the decode depends on its context (no token echoed all along)
    assert {"rms_norm", "rope", "attention", "silu_mul", "add", "qmatmul" if weights != "float32" else "matmul"} <= ops


def test_kv_cache_positions_past_kv_len_are_not_read(gguf_files):
    """kv_len, not the cache's length, bounds what attention reads: garbage in the rows not yet written
    changes nothing."""
    import hipsched
    model = lm.load_gguf(gguf_files["q8_0"])
    dec = lm.HipschedLlama(model, backend="cpu")
    clean = [dec.step(t) for t in PROMPT]
    dec.reset()
    for c in dec.k_cache + dec.v_cache:
        c[...] = 1e4
    dirty = [dec.step(t) for t in PROMPT]
    np.testing.assert_array_equal(np.stack(clean), np.stack(dirty))
    assert hipsched is not None


def test_a_full_cache_is_a_clear_error(gguf_files):
    model = lm.load_gguf(gguf_files["q8_0"])
    dec = lm.HipschedLlama(model, backend="cpu")
    dec.pos = model.cfg.max_seq
    with pytest.raises(ValueError, match="KV cache holds"):
        dec.step(1)


@pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")
@pytest.mark.parametrize("weights,budget,warp,kv_resident", [("float32", None, 32, False), ("q8_0", None, 32, True),
                                                             ("q4_0", None, 64, False), ("q8_0", 0.25, 32, False)])
def test_decode_on_the_emulated_gpu_matches_torch(tmp_path, monkeypatch, weights, budget, warp, kv_resident):
    """Every op of the step on the GPU side (the real kernels and glue on the emulator at warp 32, and 64 as
    AMD's wavefronts, fallback off); with a
    resident budget of a quarter of the weights, the weights that do not fit are uploaded per call and the
    cache holds no more than its budget, the logits unchanged; with the KV caches resident, every
    attention call reads them from their device copies (it uploads less than one cache's bytes)."""
    need("torch")
    monkeypatch.setenv("HIPSCHED_EMU_BUILD_CACHE", os.environ.get("HIPSCHED_EMU_BUILD_CACHE", str(tmp_path / "emu")))
    cfg = lm.LlamaConfig(vocab=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96,
                         max_seq=8)
    model = lm.load_gguf(lm.write_gguf(str(tmp_path / "m.gguf"), cfg, weights, seed=3))
    wbytes = sum(t.nbytes for t in model.tensors.values())
    rt = gpu_emulator.EmuRuntime(warp)
    try:
        gpu_config = {} if budget is None else {"resident_bytes": int(budget * wbytes)}
        with emulated_executor(rt, tmp_path, gpu_config, allow_fallback=False) as ex:
            dec = lm.HipschedLlama(model, ex, backend="gpu", resident_cache=kv_resident)
            out, logits = dec.generate([5, 9], 3)
            sides = {(e["op"], e["backend"]) for e in ex.events}
            held = ex._gpu.resident_summary()
            attn = [e["resident"] for e in ex.events if e["op"] == "attention"]
            dec.close()
    finally:
        rt.close()
    ref = lm.TorchLlama(model).forward([5, 9] + out[:-1])
    rel, differ = lm.compare_logits(logits, ref)
    assert rel < 1e-4 and differ == [], (rel, differ)
    assert {side for _, side in sides} == {"gpu"}, sides
    cache_bytes = dec.k_cache[0].nbytes
    assert attn and all((r["uploaded"] < cache_bytes) == kv_resident for r in attn), attn
    if budget is not None:
        assert 0 < held["bytes"] <= budget * wbytes, held
