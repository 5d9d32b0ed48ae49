"""TEST FAKE of the few torch calls torch_peers.py and torch_gpt2.py make (see
../README.md).

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
int64 = np.int64


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
        return Tensor(np.array(self.a, dtype=dtype or np.float32, copy=True))

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

    # Views share the buffer (as numpy views do), so they need no closure;
    # ops that make a new tensor allocate it now and fill it through _run.

    def __getitem__(self, idx):
        t = _tuple(idx)
        if any(isinstance(i, Tensor) for i in t):
            raise NotImplementedError("fake: reading with tensor indices")
        if not any(i is Ellipsis for i in t):
            t += (Ellipsis,)  # so that a single element is a 0-d view, not a copy
        return Tensor(self.a[t])

    def __setitem__(self, idx, value):
        def put():
            ix = tuple(i.a if isinstance(i, Tensor) else i for i in _tuple(idx))
            self.a[ix] = value.a if isinstance(value, Tensor) else value
        _run(put)

    def view(self, *shape):
        return self.reshape(*shape)

    def reshape(self, *shape):
        v = self.a.reshape(*shape)
        if not np.shares_memory(v, self.a):
            raise NotImplementedError("fake: reshape that copies")
        return Tensor(v)

    def transpose(self, a, b):
        return Tensor(np.swapaxes(self.a, a, b))

    def split(self, n, dim=0):
        return [Tensor(x) for x in np.split(self.a, range(n, self.a.shape[dim], n), axis=dim)]

    def _binary(self, other, f, dtype=None):
        o = other.a if isinstance(other, Tensor) else other
        out = Tensor(np.empty(np.broadcast_shapes(self.a.shape, np.shape(o)), dtype=dtype or self.a.dtype))
        _run(lambda: np.copyto(out.a, f(self.a, other.a if isinstance(other, Tensor) else other)))
        return out

    def __add__(self, other):
        return self._binary(other, np.add)

    def __mul__(self, other):
        return self._binary(other, lambda x, y: (x * y).astype(x.dtype))

    def __gt__(self, other):
        return self._binary(other, np.greater, dtype=np.bool_)

    def masked_fill(self, mask, value):
        out = Tensor(np.empty_like(self.a))
        _run(lambda: np.copyto(out.a, np.where(mask.a, np.float32(value), self.a)))
        return out


def _tuple(idx):
    return idx if isinstance(idx, tuple) else (idx,)


def zeros(shape, device=None, dtype=None):
    return Tensor(np.zeros(shape, dtype=dtype or np.float32))


def arange(n, device=None):
    return Tensor(np.arange(n, dtype=np.int64))


def index_select(a, dim, idx, out=None):
    if out is None:
        out = Tensor(np.empty((idx.a.shape[0],) + a.a.shape[1:], dtype=a.a.dtype))
    _run(lambda: np.copyto(out.a, np.take(a.a, idx.a, axis=dim)))
    return out


def matmul(a, b):
    out = Tensor(np.empty(np.matmul(a.a, b.a).shape, dtype=np.float32))
    _run(lambda: np.matmul(a.a, b.a, out=out.a))
    return out


def softmax(x, dim=-1):
    out = Tensor(np.empty_like(x.a))

    def f():
        e = np.exp(x.a - x.a.max(axis=dim, keepdims=True))
        np.copyto(out.a, e / e.sum(axis=dim, keepdims=True))
    _run(f)
    return out


class _Functional:
    @staticmethod
    def layer_norm(x, shape, weight, bias, eps):
        out = Tensor(np.empty_like(x.a))

        def f():
            m = x.a.mean(axis=-1, keepdims=True)
            v = ((x.a - m) ** 2).mean(axis=-1, keepdims=True)
            np.copyto(out.a, (x.a - m) / np.sqrt(v + np.float32(eps)) * weight.a + bias.a)
        _run(f)
        return out

    @staticmethod
    def gelu(x, approximate="none"):
        if approximate != "tanh":
            raise NotImplementedError("fake: gelu without approximate='tanh'")
        out = Tensor(np.empty_like(x.a))
        c = np.float32(np.sqrt(2 / np.pi))
        _run(lambda: np.copyto(out.a, 0.5 * x.a * (1 + np.tanh(c * (x.a + np.float32(0.044715) * x.a ** 3)))))
        return out


class nn:  # noqa: N801  (torch.nn)
    functional = _Functional


def compile(fn, mode=None):  # noqa: A001  (torch.compile)
    return fn


class _Flags:
    allow_tf32 = True


class backends:  # noqa: N801  (torch.backends)
    class cuda:  # noqa: N801
        matmul = _Flags()

    cudnn = _Flags()


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


def sum(x, dim, out=None):  # noqa: A001  (torch.sum)
    out = _out(out, np.delete(x.shape, dim))
    _run(lambda: np.sum(x.a, axis=dim, out=out.a))
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


class _NCCL:
    @staticmethod
    def version():
        return (0, 0, 0)


class cuda:  # noqa: N801  (torch.cuda)
    Stream = _Stream
    nccl = _NCCL
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
    def set_device(i):
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
