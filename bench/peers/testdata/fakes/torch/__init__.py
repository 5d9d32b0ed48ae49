"""TEST FAKE of the few torch calls torch_peers.py makes (see ../README.md).

numpy on the CPU. Tensors own numpy buffers that ops fill in place; during a
fake graph capture every op is also recorded as a closure over the tensors it
read and wrote, and replay() runs the closures: like a CUDA graph, a replay
touches the captured buffers only.
"""

import contextlib

import numpy as np

__version__ = "0.0-fake"
float32 = np.float32
bfloat16 = np.float32  # the fake has no bfloat16; it computes in float32


class version:  # noqa: N801  (torch.version)
    cuda = "0.0-fake"


_capturing = []  # the CUDAGraph being captured, if any


def _run(fn):
    fn()
    if _capturing:
        _capturing[-1].ops.append(fn)


class Tensor:
    def __init__(self, a):
        self.a = a

    @property
    def shape(self):
        return self.a.shape

    def data_ptr(self):
        return self.a.__array_interface__["data"][0]

    def to(self, device=None, dtype=None):
        return Tensor(np.array(self.a, dtype=np.float32, copy=True))

    def contiguous(self):
        return self

    def clone(self):
        return Tensor(self.a.copy())

    def copy_(self, src):
        _run(lambda: np.copyto(self.a, src.a))
        return self

    def tanh_(self):
        _run(lambda: np.tanh(self.a, out=self.a))
        return self

    def mul_(self, s):
        _run(lambda: np.multiply(self.a, s, out=self.a))
        return self

    def add_(self, other, alpha=1.0):
        _run(lambda: np.add(self.a, alpha * other.a, out=self.a))
        return self

    def t(self):
        return Tensor(self.a.T)  # a view, as in torch

    def sum(self, dim):
        out = Tensor(np.empty(np.delete(self.a.shape, dim), dtype=self.a.dtype))
        _run(lambda: np.sum(self.a, axis=dim, out=out.a))
        return out

    def double(self):
        return Tensor(self.a.astype(np.float64))

    def float(self):
        return Tensor(self.a.astype(np.float32))

    def cpu(self):
        return self

    def numpy(self):
        return self.a

    def __sub__(self, other):
        return Tensor(self.a - other.a)

    def abs(self):
        return Tensor(np.abs(self.a))

    def max(self):
        return Tensor(np.max(self.a))

    def item(self):
        return self.a.item()


def device(name):
    return name


def from_numpy(a):
    return Tensor(a)


def empty(shape, device=None, dtype=None):
    return Tensor(np.empty(shape, dtype=np.float32))


def empty_like(t):
    return Tensor(np.empty_like(t.a))


def full(shape, value, device=None, dtype=None):
    return Tensor(np.full(shape, value, dtype=np.float32))


def _out(out, shape):
    return out if out is not None else Tensor(np.empty(shape, dtype=np.float32))


def addmm(bias, a, b, out=None):
    out = _out(out, (a.shape[0], b.shape[1]))
    _run(lambda: np.copyto(out.a, a.a @ b.a + bias.a))
    return out


def mm(a, b, out=None):
    out = _out(out, (a.shape[0], b.shape[1]))
    _run(lambda: np.copyto(out.a, a.a @ b.a))
    return out


def sub(x, y, out=None):
    out = _out(out, x.shape)
    _run(lambda: np.subtract(x.a, y.a, out=out.a))
    return out


def add(x, y, alpha=1.0, out=None):
    out = _out(out, x.shape)
    _run(lambda: np.copyto(out.a, x.a + alpha * y.a))
    return out


class _Aten:
    @staticmethod
    def tanh_backward(dy, y):
        out = Tensor(np.empty_like(dy.a))
        _run(lambda: np.copyto(out.a, dy.a * (1 - y.a * y.a)))
        return out


class ops:  # noqa: N801
    aten = _Aten


_precision = ["highest"]


def set_float32_matmul_precision(p):
    _precision[0] = p


def get_float32_matmul_precision():
    return _precision[0]


class _Props:
    name = "FAKE GPU (numpy)"
    multi_processor_count = 1
    major, minor = 0, 0
    total_memory = 1 << 30


class _Stream:
    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


class _Event:
    _clock = [0.0]

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        _Event._clock[0] += 0.001
        self.t = _Event._clock[0]

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.t - self.t


class CUDAGraph:
    def __init__(self, keep_graph=False):
        self.ops = None
        self.keep_graph = keep_graph

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if _capturing:
            raise RuntimeError("fake: nested capture")
        self.ops = []
        _capturing.append(self)

    def capture_end(self):
        _capturing.remove(self)

    def replay(self):
        if _capturing:
            raise RuntimeError("fake: replay during capture")
        for op in self.ops:
            op()

    def raw_cuda_graph(self):
        return id(self)

    def raw_cuda_graph_exec(self):
        return id(self) + 1


class cuda:  # noqa: N801  (torch.cuda)
    Stream = _Stream
    Event = _Event
    CUDAGraph = CUDAGraph
    _stream = _Stream()

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def init():
        pass

    @staticmethod
    def get_device_properties(i):
        return _Props()

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def reset_peak_memory_stats():
        pass

    @staticmethod
    def max_memory_reserved():
        return 2 << 20

    @staticmethod
    def max_memory_allocated():
        return 1 << 20

    @staticmethod
    def current_stream():
        return cuda._stream

    @staticmethod
    @contextlib.contextmanager
    def stream(s):
        yield s

    @staticmethod
    def graph_pool_handle():
        return (0, 1)
