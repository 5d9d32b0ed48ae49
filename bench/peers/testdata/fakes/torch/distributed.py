"""TEST FAKE of the torch.distributed calls torch_dp.py makes (see ../README.md).

The ranks are separate processes, as under torchrun; they exchange arrays
through files in FAKE_DIST_DIR (one file per rank per collective, numbered
in call order), so a fake all-reduce really sums the ranks' buffers, in rank
order (every rank gets the same bits). Like the fake torch ops, a collective
run during a fake graph capture is recorded and runs again at each replay.
FAKE_DIST_BROKEN=1 makes all_reduce do nothing, so that a test can check that
the peer notices.
"""

import os
import pickle
import time

import numpy as np

from torch import _run

_state = {"rank": 0, "world": 1, "dir": None, "seq": 0}


class ReduceOp:
    SUM = "sum"


def is_available():
    return True


def init_process_group(backend, rank=None, world_size=None, **kw):
    d = os.environ.get("FAKE_DIST_DIR")
    if not d:
        raise RuntimeError("fake torch.distributed: FAKE_DIST_DIR is not set")
    _state.update(rank=int(rank), world=int(world_size), dir=d, seq=0)


def destroy_process_group():
    pass


def get_rank():
    return _state["rank"]


def get_world_size():
    return _state["world"]


def _exchange(payload: bytes):
    """Every rank's payload of the next collective, in rank order."""
    seq = _state["seq"]
    _state["seq"] += 1
    d, rank, world = _state["dir"], _state["rank"], _state["world"]
    path = os.path.join(d, f"{seq}.{rank}")
    with open(path + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(path + ".tmp", path)
    deadline = time.monotonic() + 120
    out = []
    for r in range(world):
        p = os.path.join(d, f"{seq}.{r}")
        while not os.path.exists(p):
            if time.monotonic() > deadline:
                raise RuntimeError(f"fake torch.distributed: rank {r} never reached collective {seq}")
            time.sleep(0.0005)
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def all_reduce(t, op=ReduceOp.SUM):
    if os.environ.get("FAKE_DIST_BROKEN") == "1":
        return

    def f():
        parts = [np.frombuffer(b, dtype=t.a.dtype).reshape(t.a.shape) for b in _exchange(t.a.tobytes())]
        acc = parts[0].copy()
        for p in parts[1:]:
            acc += p
        np.copyto(t.a, acc)
    _run(f)


def all_gather_object(out, obj):
    for i, b in enumerate(_exchange(pickle.dumps(obj))):
        out[i] = pickle.loads(b)


def barrier():
    _exchange(b"")
