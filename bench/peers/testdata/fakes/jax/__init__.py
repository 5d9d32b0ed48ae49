"""TEST FAKE of the few jax calls jax_peers.py makes (see ../README.md).

numpy on the CPU: arrays are an ndarray subclass with block_until_ready and
unsafe_buffer_pointer; jit calls the function. Not JAX.
"""

import os

import numpy as _np

from . import lax  # noqa: F401
from . import numpy  # noqa: F401
from .numpy import FakeArray

__version__ = "0.0-fake"


class _Config:
    jax_default_matmul_precision = None

    def update(self, name, value):
        setattr(self, name, value)


config = _Config()


class _Device:
    platform = "gpu"
    device_kind = "FAKE GPU (numpy)"

    def memory_stats(self):
        return {"peak_bytes_in_use": 3 << 20, "bytes_in_use": 1 << 20}


def devices():
    return [_Device()]


def block_until_ready(tree):
    return tree


class _Compiled:
    def as_text(self):
        # Pretend the XLA_FLAGS setting decides what the optimized HLO holds.
        off = "--xla_gpu_enable_command_buffer=" in os.environ.get("XLA_FLAGS", "").split()
        return "HloModule fake\n" + ("" if off else "%command_buffer = call()\n")


class _Lowered:
    def compile(self):
        return _Compiled()


class _Jitted:
    def __init__(self, fn, donate_argnums=()):
        self.fn = fn
        self.donate = donate_argnums

    def __call__(self, *args):
        return self.fn(*args)

    def lower(self, *args):
        return _Lowered()


def jit(fn, donate_argnums=()):
    return _Jitted(fn, donate_argnums)


def clear_caches():
    pass
