"""The data of stablegraph's gpt2-decode workload (docs/WORKLOADS.md), for
the PyTorch peer: the weights from the safetensors file the workload writes
(`stablegraph run --workload gpt2-decode --weights FILE`), and the inputs,
made by the same 32-bit integer hash as workload/gpt2.go so that every
sequence's KV cache starts with the same prefix here as there.

numpy only (and the standard library); no torch, so that it is tested on a
machine without a GPU.
"""

from __future__ import annotations

import json
import re
import struct

# GPT-2's layer-norm epsilon, as workload/gpt2.go.
EPS = 1e-5

# safetensors dtypes this reader maps to numpy (little-endian).
_DTYPES = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "U8": "u1", "F16": "<f2"}


def read_safetensors(path: str):
    """(tensors, metadata): every tensor of the file as a numpy array (a
    read-only view of a memory map), and the header's __metadata__."""
    import numpy as np

    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise ValueError(f"{path}: header length {n} too large")
        header = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, e in header.items():
        dt = _DTYPES.get(e["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: dtype {e['dtype']} not supported here")
        b, end = e["data_offsets"]
        out[name] = mm[b:end].view(dt).reshape(e["shape"])
    return out, meta


class Config:
    """A gpt2-decode shape: from the weights (layers, d, vocab, positions)
    and the metadata stablegraph writes with them (heads, pos), else GPT-2's
    12 heads and position 128, or what the caller gives."""

    def __init__(self, weights: dict, meta: dict, batch: int, heads: int | None = None, pos: int | None = None,
                 seed: int | None = None):
        shape = dict(re.findall(r"(\w+)=(\d+)", meta.get("shape", "")))
        self.vocab, self.d = (int(x) for x in weights["wte.weight"].shape)
        self.npos = int(weights["wpe.weight"].shape[0])
        self.layers = 0
        while f"h.{self.layers}.ln_1.weight" in weights:
            self.layers += 1
        self.heads = heads or int(shape.get("heads", 12))
        self.pos = pos if pos is not None else int(shape.get("pos", 128))
        self.seed = seed if seed is not None else int(meta.get("seed", 1))
        self.batch = batch
        if self.layers == 0 or self.d % self.heads or not 0 <= self.pos < self.npos or batch < 1:
            raise ValueError(f"bad gpt2-decode shape: {self.describe()}")
        self.hd = self.d // self.heads

    def describe(self) -> str:
        return (f"layers={self.layers} d={self.d} heads={self.heads} vocab={self.vocab} "
                f"positions={self.npos} pos={self.pos} batch={self.batch}")

    def seq_pos(self, seq: int) -> int:
        """The position sequence seq decodes at (workload/gpt2.go seqPos)."""
        return max(0, self.pos - seq % 4)

    def swaps_per_step(self) -> int:
        """Rows that get another sequence per step under swap."""
        return max(1, self.batch // 4)


# ---------------------------------------------------------------- the hash


def mix32(x):
    """lowbias32 over a numpy uint32 array (wrapping like Go's uint32)."""
    import numpy as np

    u = np.uint32
    x = x ^ (x >> u(16))
    x = x * u(0x7FEB352D)
    x = x ^ (x >> u(15))
    x = x * u(0x846CA68B)
    x = x ^ (x >> u(16))
    return x


def key(seed: int, seq: int, idx):
    """gpt2Key(seed, seq, idx) of workload/gpt2.go, idx a uint32 array."""
    import numpy as np

    s = mix32(np.array([seed & 0xFFFFFFFF], dtype=np.uint32))
    s = mix32(s ^ np.uint32(seq & 0xFFFFFFFF))
    return mix32(s + np.asarray(idx, dtype=np.uint32))


def token(cfg: Config, step: int, seq: int) -> int:
    """The token sequence seq decodes at step."""
    import numpy as np

    idx = np.array([(1 << 31) | (step & ((1 << 31) - 1))], dtype=np.uint32)
    return int(key(cfg.seed, seq, idx)[0] % np.uint32(cfg.vocab))


def cache_prefix(cfg: Config, seq: int):
    """Sequence seq's initial keys and values for positions below its
    position: float32 [layers, 2, pos, d] (workload/gpt2.go initialCache;
    element (l, kv, t, c) is at index ((l*2 + kv)*positions + t)*d + c of
    the cache)."""
    import numpy as np

    p = cfg.seq_pos(seq)
    lk = np.arange(2 * cfg.layers, dtype=np.uint32)[:, None, None] * np.uint32(cfg.npos * cfg.d)
    t = np.arange(p, dtype=np.uint32)[None, :, None] * np.uint32(cfg.d)
    c = np.arange(cfg.d, dtype=np.uint32)[None, None, :]
    k = key(cfg.seed, seq, lk + t + c)
    v = ((k >> np.uint32(8)).astype(np.int64) - (1 << 23)).astype(np.float32) / np.float32(1 << 24)
    return v.reshape(cfg.layers, 2, p, cfg.d)
