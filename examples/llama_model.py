"""A Llama-architecture model for decoding with hipsched's public ops, shared by examples/decode.py,
bench/decode.py and tests/models/test_decode.py.

What a user would write to run a GGUF Llama model on hipsched, end to end and small enough to read:

- `LlamaConfig`: the architecture as numbers (vocab, dim, layers, heads, KV heads, head dim, FFN width,
  rope base, RMS norm epsilon), with `PRESETS` (`tiny`, `small`, and `1b`, Llama 3.2 1B's shape).
- `write_gguf`: seeded random weights, quantized to q8_0 / q4_0 with `hipsched.quantize` (the bytes are
  ggml's), written with the `gguf` package's GGUFWriter under llama.cpp's tensor names
  (`token_embd.weight`, `blk.N.attn_q.weight`, ...). Embeddings are tied (no `output.weight`), as Llama
  3.2 1B's.
- `load_gguf`: the file read back with gguf.GGUFReader, as a user loads one: the config from the
  metadata, every tensor a memory map (float tensors as read-only arrays, quantized ones as
  `hipsched.QuantizedTensor` over the mapped blocks: nothing is copied).
- `HipschedLlama`: the decode step built only from hipsched's ops (rms_norm, qmatmul or matmul, rope,
  attention with a preallocated KV cache, silu_mul, add); the next token is the logits' argmax.
- `TorchLlama`: an independent implementation of the same architecture in PyTorch on the CPU, from the
  weights the `gguf` package dequantizes (torch's rms_norm, SDPA with grouped-query heads, rotary
  embedding from the formula, an explicit causal mask): the reference the test and the benchmark compare
  with.

Rotary embedding: a Llama GGUF file written by llama.cpp's converter holds q and k weights permuted for
ggml's "normal" rope mode, which rotates adjacent pairs (2i, 2i+1) -- GPT-J's layout, hipsched's
`style="gptj"`. These weights are random, so the file needs no permutation, and both implementations
rotate as llama.cpp does on such a file.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import numpy as np

ARCH = "llama"
WEIGHT_DTYPES = ("float32", "q8_0", "q4_0")


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 512
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    ffn_dim: int = 384
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    max_seq: int = 128          # the KV cache's length (the GGUF's context_length)
    # the output head is the token embedding (no output.weight), as Llama 3.2 1B's. Untied by default:
    # with random weights a tied head mostly echoes the input token, a decode too easy to check
    tie_embeddings: bool = False

    def __post_init__(self):
        for name in ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "max_seq"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"LlamaConfig: {name} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                             f"({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim ({self.head_dim}) must be even for rotary embedding")
        # quantized rows are whole 32-element blocks along every weight's input axis
        for name in ("dim", "ffn_dim"):
            if getattr(self, name) % 32:
                raise ValueError(f"LlamaConfig: {name} ({getattr(self, name)}) must be a multiple of 32 "
                                 f"(GGUF's quantization block)")
        if (self.n_heads * self.head_dim) % 32:
            raise ValueError("LlamaConfig: n_heads * head_dim must be a multiple of 32")
        if not (self.rms_eps > 0 and math.isfinite(self.rms_eps)) or not self.rope_base > 0:
            raise ValueError("LlamaConfig: rms_eps and rope_base must be positive")

    def replace(self, **changes) -> "LlamaConfig":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def n_params(self) -> int:
        per_layer = (2 * self.dim + self.dim * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.dim
                     + 3 * self.dim * self.ffn_dim)
        heads = 1 if self.tie_embeddings else 2
        return heads * self.vocab * self.dim + self.n_layers * per_layer + self.dim


PRESETS = {
    # a few seconds end to end: the example's default and the test's
    "tiny": LlamaConfig(),
    # quick benchmark runs: a few milliseconds a token
    "small": LlamaConfig(vocab=8192, dim=512, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=64, ffn_dim=1536,
                         rope_base=500000.0, max_seq=512),
    # Llama 3.2 1B's shape (1.24 B parameters; rope base 500000, eps 1e-5, tied embeddings)
    "1b": LlamaConfig(vocab=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
                      rope_base=500000.0, rms_eps=1e-5, max_seq=2048, tie_embeddings=True),
}


def layer_tensors(cfg: LlamaConfig, i: int):
    """(name, (rows, cols)) of layer i's tensors, rows the output axis (GGUF/torch Linear orientation)."""
    p = f"blk.{i}."
    return [(p + "attn_norm.weight", (cfg.dim,)),
            (p + "attn_q.weight", (cfg.q_dim, cfg.dim)),
            (p + "attn_k.weight", (cfg.kv_dim, cfg.dim)),
            (p + "attn_v.weight", (cfg.kv_dim, cfg.dim)),
            (p + "attn_output.weight", (cfg.dim, cfg.q_dim)),
            (p + "ffn_norm.weight", (cfg.dim,)),
            (p + "ffn_gate.weight", (cfg.ffn_dim, cfg.dim)),
            (p + "ffn_up.weight", (cfg.ffn_dim, cfg.dim)),
            (p + "ffn_down.weight", (cfg.dim, cfg.ffn_dim))]


def all_tensors(cfg: LlamaConfig):
    names = [("token_embd.weight", (cfg.vocab, cfg.dim))]
    for i in range(cfg.n_layers):
        names += layer_tensors(cfg, i)
    names.append(("output_norm.weight", (cfg.dim,)))
    return names if cfg.tie_embeddings else names + [("output.weight", (cfg.vocab, cfg.dim))]


def _random_tensor(rng, name, shape):
    if len(shape) == 1:    # norm weights: around 1, so each layer's scale matters
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if name.startswith(("token_embd", "output.")):
        # unit-variance rows: the logits (the normed state against each row of the head) spread enough that
        # the top token stands apart from the next one
        return rng.standard_normal(shape, dtype=np.float32)
    # 1/sqrt(fan-in): activations keep their scale through the layers
    return (rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(shape[1])))


def write_gguf(path: str, cfg: LlamaConfig, weight_dtype: str = "q8_0", seed: int = 0) -> str:
    """Seeded random weights for `cfg`, matrices stored as `weight_dtype` ("float32", "q8_0", "q4_0"; the
    norm weights stay float32 as in llama.cpp's files), written to `path` as a GGUF Llama model."""
    import gguf   # deferred: only writing and reading a file needs the gguf package
    import hipsched

    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"write_gguf: weight_dtype must be one of {WEIGHT_DTYPES}, got {weight_dtype!r}")
    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}.get(weight_dtype)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, ARCH, use_temp_file=True)   # tensors spill to a temp file, not held in memory
    w.add_name(f"random-llama-{cfg.dim}x{cfg.n_layers}-seed{seed}")
    w.add_vocab_size(cfg.vocab)
    w.add_context_length(cfg.max_seq)
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_file_type({"float32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[weight_dtype])
    for name, shape in all_tensors(cfg):
        t = _random_tensor(rng, name, shape)
        if qtype is None or len(shape) == 1:
            w.add_tensor(name, t)
        else:
            blocks = hipsched.quantize(t, weight_dtype).data     # uint8 (rows, row bytes), ggml's bytes
            w.add_tensor(name, np.asarray(blocks), raw_shape=blocks.shape, raw_dtype=qtype)
        del t
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass
class GgufModel:
    """A GGUF Llama file as read: its config, weight type and tensors by name (float32 arrays or
    QuantizedTensor over the file's memory map), and the reader (which holds the map open)."""
    cfg: LlamaConfig
    weight_dtype: str
    tensors: dict
    reader: object

    def dequantized(self, name: str) -> np.ndarray:
        """The tensor as float32, dequantized by the `gguf` package (the outside reference's weights)."""
        from gguf.quants import dequantize   # deferred with the rest of gguf
        t = self._raw[name]
        # a copy: torch takes it over, and a float tensor's data is the file's read-only map
        return np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            self.tensors[name].shape)

    @property
    def _raw(self):
        return {t.name: t for t in self.reader.tensors}


def load_gguf(path: str) -> GgufModel:
    """Reads a GGUF Llama file as a user would: gguf.GGUFReader, the config from its metadata, the tensors
    as memory maps (QuantizedTensor for q8_0 / q4_0 blocks)."""
    import gguf
    import hipsched

    r = gguf.GGUFReader(path)

    def field(key, default=None):
        f = r.fields.get(f"{ARCH}.{key}")
        if f is None:
            if default is None:
                raise ValueError(f"{path}: GGUF metadata {ARCH}.{key} missing")
            return default
        return f.contents()

    arch = r.fields["general.architecture"].contents()
    if arch != ARCH:
        raise ValueError(f"{path}: architecture {arch!r}, expected {ARCH!r}")
    dim, n_heads = int(field("embedding_length")), int(field("attention.head_count"))
    cfg = LlamaConfig(vocab=int(field("vocab_size")), dim=dim, n_layers=int(field("block_count")),
                      n_heads=n_heads, n_kv_heads=int(field("attention.head_count_kv")),
                      head_dim=int(field("attention.key_length", dim // n_heads)),
                      ffn_dim=int(field("feed_forward_length")), rope_base=float(field("rope.freq_base")),
                      rms_eps=float(field("attention.layer_norm_rms_epsilon")),
                      max_seq=int(field("context_length")),
                      tie_embeddings=not any(t.name == "output.weight" for t in r.tensors))
    Q = gguf.GGMLQuantizationType
    tensors, qtypes = {}, set()
    for t in r.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))        # ggml lists the fastest axis first
        if t.tensor_type == Q.F32:
            tensors[t.name] = np.asarray(t.data).reshape(shape)  # a read-only map: the GPU may keep it
        elif t.tensor_type in (Q.Q8_0, Q.Q4_0):
            tensors[t.name] = hipsched.QuantizedTensor(t.data, shape, t.tensor_type.name)
            qtypes.add(t.tensor_type.name.lower())
        else:
            raise ValueError(f"{path}: tensor {t.name} of type {t.tensor_type.name}: this example reads F32, "
                             f"Q8_0 and Q4_0")
    missing = [n for n, _ in all_tensors(cfg) if n not in tensors]
    if missing:
        raise ValueError(f"{path}: tensors missing: {missing[:4]}")
    if len(qtypes) > 1:
        raise ValueError(f"{path}: mixed quantization {sorted(qtypes)}")
    return GgufModel(cfg, qtypes.pop() if qtypes else "float32", tensors, r)


NEEDED_OPS = ("rms_norm", "matmul", "qmatmul", "dequantize", "rope", "attention", "silu_mul", "add")


def missing_ops(hs=None) -> list[str]:
    """The ops (or modes) this decode needs that `hs` (hipsched, or an Executor) lacks: rope, silu_mul and
    attention's kv_len arrived together (issue 34); an older hipsched has none of them."""
    import inspect
    if hs is None:
        import hipsched as hs
    missing = [op for op in NEEDED_OPS if not hasattr(hs, op)]
    if "attention" not in missing and "kv_len" not in inspect.signature(hs.attention).parameters:
        missing.append("attention(kv_len=...)")
    return missing


class HipschedLlama:
    """The decode step from hipsched's public ops, one token at a time (batch 1).

    Where each tensor lives: the weights are the GGUF file's memory maps (read-only float32 arrays, or
    QuantizedTensor blocks), which the GPU's resident cache may keep on the device between calls (the
    quantized ones in the kernels' layout); `resident=True` registers the float ones with
    `Executor.resident` instead, pinning them there whatever the budget. The KV cache is one preallocated
    host array per layer and per K / V, (batch, n_kv_heads, max_seq, head_dim): step `pos` writes row
    `pos` and attention reads the first `pos + 1` rows (kv_len), aligned bottom-right (causal="lower_right"),
    so one cache serves the whole sequence without a copy of the past. `resident_cache=True` (with an
    executor) registers the caches with `Executor.resident` and writes each step's row with
    `update(pos, row, axis=2)`, so a GPU keeps them: its attention calls read the device copies, and each
    step copies only the new row there (a plain host cache is uploaded whole by every GPU attention
    call). The activations are small host arrays the executor moves where each op runs.

    `fuse=True` stacks q, k and v's weights into one matrix and gate and up's into another at load (a copy
    of those weights, made once): two matvecs a layer instead of five, the same numbers.
    """

    def __init__(self, model: GgufModel, executor=None, *, resident: bool = False, fuse: bool = True,
                 backend: str = "auto", resident_cache: bool = False):
        import hipsched
        self.hs = executor if executor is not None else hipsched
        lacking = missing_ops(self.hs)
        if lacking:
            raise RuntimeError(f"HipschedLlama: this hipsched lacks {', '.join(lacking)} (issue 34's decode ops); "
                               f"the decode runs on hipsched's ops only, with no NumPy stand-in")
        self.cfg = cfg = model.cfg
        self.backend = backend
        t = model.tensors
        self._handles = []
        self._cache_handles = []
        self._resident_cache = resident_cache and executor is not None

        from hipsched import QuantizedTensor

        def kept(w):
            if resident and isinstance(w, np.ndarray) and executor is not None:
                h = executor.resident(w, copy=not w.flags.owndata)
                self._handles.append(h)
                return h
            return w

        def stacked(names):
            """Several weights' rows as one matrix, so one matvec does their work (a copy, made once)."""
            ws = [t[n] for n in names]
            if isinstance(ws[0], QuantizedTensor):
                data = np.concatenate([w.data for w in ws])   # rows are whole blocks: the stack is exact
                return QuantizedTensor(data, (data.shape[0], ws[0].shape[1]), ws[0].qtype)
            m = np.concatenate(ws)
            m.flags.writeable = False   # its own read-only memory: a GPU's resident cache may keep it
            return m

        self.embd = t["token_embd.weight"]
        # tied embeddings: the output head is the embedding
        self.out = kept(t["token_embd.weight" if cfg.tie_embeddings else "output.weight"])
        self.out_norm = t["output_norm.weight"]
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            L = {k: t[p + k + ".weight"] for k in ("attn_norm", "ffn_norm")}
            L["attn_output"], L["ffn_down"] = kept(t[p + "attn_output.weight"]), kept(t[p + "ffn_down.weight"])
            if fuse:   # q, k and v from one matvec, gate and up from another
                L["qkv"] = kept(stacked([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]))
                L["gate_up"] = kept(stacked([p + "ffn_gate.weight", p + "ffn_up.weight"]))
            else:
                L.update({k: kept(t[p + k + ".weight"]) for k in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")})
            self.layers.append(L)
        self.reset()

    def reset(self, batch: int = 1):
        c = self.cfg
        shape = (batch, c.n_kv_heads, c.max_seq, c.head_dim)
        self._release_caches()
        self.k_cache = [np.zeros(shape, np.float32) for _ in range(c.n_layers)]
        self.v_cache = [np.zeros(shape, np.float32) for _ in range(c.n_layers)]
        if self._resident_cache:
            self.k_cache = [self.hs.resident(a) for a in self.k_cache]
            self.v_cache = [self.hs.resident(a) for a in self.v_cache]
            self._cache_handles = self.k_cache + self.v_cache
        self.pos = 0

    def _release_caches(self):
        for h in self._cache_handles:
            h.release()
        self._cache_handles = []

    def close(self):
        for h in self._handles:
            h.release()
        self._handles = []
        self._release_caches()

    def _linear(self, w, x):
        from hipsched import QuantizedTensor
        if isinstance(w, QuantizedTensor):
            return self.hs.qmatmul(w, x, backend=self.backend)
        return self.hs.matmul(w, x, backend=self.backend)

    def embed(self, token: int) -> np.ndarray:
        from hipsched import QuantizedTensor
        if isinstance(self.embd, QuantizedTensor):
            row = QuantizedTensor(self.embd.data[token], (1, self.cfg.dim), self.embd.qtype)
            return self.hs.dequantize(row, backend=self.backend).reshape(self.cfg.dim)
        return np.array(self.embd[token], dtype=np.float32)

    def step(self, token: int) -> np.ndarray:
        """Logits (vocab,) float32 after `token` at the next position; the token's K and V enter the cache."""
        c, hs, be, pos = self.cfg, self.hs, self.backend, self.pos
        if pos >= c.max_seq:
            raise ValueError(f"HipschedLlama.step: the KV cache holds {c.max_seq} positions, all used")
        positions = np.array([pos], dtype=np.int64)
        kv_len = np.array([pos + 1], dtype=np.int64)
        x = self.embed(int(token))
        for i, L in enumerate(self.layers):
            h = hs.rms_norm(x, L["attn_norm"], c.rms_eps, backend=be)
            if "qkv" in L:
                qkv = self._linear(L["qkv"], h)
                q, k, v = qkv[:c.q_dim], qkv[c.q_dim:c.q_dim + c.kv_dim], qkv[c.q_dim + c.kv_dim:]
            else:
                q, k, v = (self._linear(L[n], h) for n in ("attn_q", "attn_k", "attn_v"))
            q = q.reshape(1, c.n_heads, 1, c.head_dim)
            k = k.reshape(1, c.n_kv_heads, 1, c.head_dim)
            v = v.reshape(1, c.n_kv_heads, 1, c.head_dim)
            q = hs.rope(q, positions, base=c.rope_base, style="gptj", backend=be)
            k = hs.rope(k, positions, base=c.rope_base, style="gptj", backend=be)
            if self._resident_cache:   # the host row and the device copy's together
                self.k_cache[i].update(pos, k[:, :, 0, :], axis=2)
                self.v_cache[i].update(pos, v[:, :, 0, :], axis=2)
            else:
                self.k_cache[i][:, :, pos, :] = k[:, :, 0, :]
                self.v_cache[i][:, :, pos, :] = v[:, :, 0, :]
            a = hs.attention(q, self.k_cache[i], self.v_cache[i], causal="lower_right", kv_len=kv_len, backend=be)
            x = hs.add(x, self._linear(L["attn_output"], a.reshape(c.q_dim)), backend=be)
            h = hs.rms_norm(x, L["ffn_norm"], c.rms_eps, backend=be)
            if "gate_up" in L:
                gu = self._linear(L["gate_up"], h)
                g = hs.silu_mul(gu[:c.ffn_dim], gu[c.ffn_dim:], backend=be)
            else:
                g = hs.silu_mul(self._linear(L["ffn_gate"], h), self._linear(L["ffn_up"], h), backend=be)
            x = hs.add(x, self._linear(L["ffn_down"], g), backend=be)
        h = hs.rms_norm(x, self.out_norm, c.rms_eps, backend=be)
        self.pos = pos + 1
        return np.asarray(self._linear(self.out, h))

    def generate(self, prompt, n_new: int):
        """Greedy decoding: the prompt fed token by token, then `n_new` tokens, each the argmax of the
        logits. Returns (tokens generated, logits per step (len(prompt) + n_new - 1, vocab))."""
        logits, out = [], []
        tok = None
        seq = list(prompt)
        for i in range(len(seq) + n_new - 1):
            tok = seq[i] if i < len(seq) else out[-1]
            lg = self.step(tok)
            logits.append(lg)
            if i >= len(seq) - 1:
                out.append(int(np.argmax(lg)))
        return out, np.stack(logits)


class TorchLlama:
    """The same architecture in PyTorch (CPU, eager), from the dequantized weights: the reference.

    Written from the formulas, sharing nothing with HipschedLlama: torch's rms_norm, F.linear, rotary
    embedding of adjacent pairs from cos/sin of pos * base^(-2i/d), SDPA with k and v repeated per query
    group and an explicit boolean mask (bottom-right aligned) for the whole sequence (`forward`, the
    test's reference), or a KV cache for the token-by-token decode the benchmark times (`step`: SDPA's
    enable_gqa, no mask, as an eager torch decode would run it)."""

    def __init__(self, model: GgufModel, dtype="float32"):
        import torch
        self.torch = torch
        self.cfg = c = model.cfg
        self.dtype = getattr(torch, dtype)

        def w(name):
            return torch.from_numpy(model.dequantized(name)).to(self.dtype)

        self.embd = w("token_embd.weight")
        self.out = self.embd if c.tie_embeddings else w("output.weight")
        self.out_norm = w("output_norm.weight")
        self.layers = [{k: w(f"blk.{i}.{k}.weight") for k in
                        ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                         "ffn_down")} for i in range(c.n_layers)]
        inv = 1.0 / (c.rope_base ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        ang = torch.arange(c.max_seq, dtype=torch.float64)[:, None] * inv[None, :]   # (max_seq, d/2)
        self.cos, self.sin = torch.cos(ang).to(self.dtype), torch.sin(ang).to(self.dtype)
        self.reset()

    def reset(self):
        c, torch = self.cfg, self.torch
        self.k_cache = [torch.zeros(1, c.n_kv_heads, c.max_seq, c.head_dim, dtype=self.dtype)
                        for _ in range(c.n_layers)]
        self.v_cache = [torch.zeros_like(k) for k in self.k_cache]
        self.pos = 0

    def _rotate(self, x, pos):
        """x (b, h, s, d) at positions pos (s,): pairs (2i, 2i+1) rotated by pos * theta_i."""
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]       # (1, 1, s, d/2)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return self.torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    def _block(self, x, L, pos, k_all=None, v_all=None, cache_at=None):
        torch, c = self.torch, self.cfg
        F = torch.nn.functional
        s = x.shape[0]
        h = F.rms_norm(x, (c.dim,), L["attn_norm"], c.rms_eps)
        q = F.linear(h, L["attn_q"]).view(s, c.n_heads, c.head_dim).transpose(0, 1)[None]
        k = F.linear(h, L["attn_k"]).view(s, c.n_kv_heads, c.head_dim).transpose(0, 1)[None]
        v = F.linear(h, L["attn_v"]).view(s, c.n_kv_heads, c.head_dim).transpose(0, 1)[None]
        q, k = self._rotate(q, pos), self._rotate(k, pos)
        if cache_at is not None:
            kc, vc, p = cache_at
            kc[:, :, p:p + s] = k
            vc[:, :, p:p + s] = v
            k, v = kc[:, :, :p + s], vc[:, :, :p + s]
        n_k = k.shape[2]
        if cache_at is not None and s == 1:
            # the benchmark's peer at its fastest: one query sees every cached key, KV heads shared in place
            a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:
            # bottom-right causal: query j (of s) sits at key position n_k - s + j
            mask = torch.arange(n_k)[None, :] <= (torch.arange(s)[:, None] + n_k - s)
            group = c.n_heads // c.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + F.linear(a[0].transpose(0, 1).reshape(s, c.q_dim), L["attn_output"])
        h = F.rms_norm(x, (c.dim,), L["ffn_norm"], c.rms_eps)
        return x + F.linear(F.silu(F.linear(h, L["ffn_gate"])) * F.linear(h, L["ffn_up"]), L["ffn_down"])

    def _head(self, x):
        F = self.torch.nn.functional
        return F.linear(F.rms_norm(x, (self.cfg.dim,), self.out_norm, self.cfg.rms_eps), self.out)

    def forward(self, tokens) -> np.ndarray:
        """Logits (len(tokens), vocab) for the whole sequence at once (no cache): the test's reference."""
        torch = self.torch
        with torch.no_grad():
            pos = torch.arange(len(tokens))
            x = self.embd[torch.as_tensor(tokens, dtype=torch.long)]
            for L in self.layers:
                x = self._block(x, L, pos)
            return self._head(x).float().numpy()

    def step(self, token: int):
        """One decode step with the KV cache (the benchmark's peer); returns the logits tensor."""
        torch, p = self.torch, self.pos
        with torch.no_grad():
            x = self.embd[token][None]
            pos = torch.tensor([p])
            for i, L in enumerate(self.layers):
                x = self._block(x, L, pos, cache_at=(self.k_cache[i], self.v_cache[i], p))
            self.pos = p + 1
            return self._head(x)[0]


def compare_logits(ours: np.ndarray, ref: np.ndarray):
    """Per step: max |ours - ref| over the step's logits / max |ref|; returns (worst relative error, steps
    whose argmax differs)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    rel = np.abs(ours - ref).max(axis=-1) / np.maximum(np.abs(ref).max(axis=-1), 1e-30)
    differ = np.nonzero(ours.argmax(-1) != ref.argmax(-1))[0]
    return float(rel.max()), differ.tolist()


def model_path(directory: str, cfg: LlamaConfig, weight_dtype: str, seed: int = 0) -> str:
    """A file name for `cfg`'s weights, so runs can reuse a file already written."""
    key = f"{cfg.vocab}-{cfg.dim}-{cfg.n_layers}-{cfg.n_heads}-{cfg.n_kv_heads}-{cfg.head_dim}-{cfg.ffn_dim}"
    return os.path.join(directory, f"llama-{key}-{cfg.max_seq}-{weight_dtype}-s{seed}.gguf")
