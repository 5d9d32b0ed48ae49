#!/usr/bin/env python3
"""What NCCL's graph registration does when the physical memory behind a
captured collective's virtual address changes (the remap strategy's move).

Run on 2 GPUs, once per setting of NCCL_GRAPH_REGISTER (NCCL reads it once):

    NCCL_GRAPH_REGISTER=1 NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG \
      timeout 90 torchrun --standalone --nproc_per_node 2 bench/probes/nccl-remap/probe.py --json out.json

Each rank reserves two virtual ranges (send and receive, 8 MiB each: large
enough for NCCL's Simple protocol, whose ring all-gather registers user
buffers), maps physical memory into them with the CUDA driver's VMM calls
(libcuda through ctypes), captures one out-of-place all-gather over them in
a CUDA graph and replays it. Then it maps NEW physical memory at the same
addresses (the old memory unmapped and released, as the remap strategy
swaps a caller's buffers in), writes new values, and replays the same graph.

Per kind of allocation it reports, by rank, what the replays gave:

  ok     the gathered values are the new ones: the collective read and wrote
         through the addresses (no registration, or a registration that
         followed the new memory);
  stale  the values are the old ones or missing: the peers read from or wrote
         into the physical memory the graph was captured over;
  hang   the replay did not finish within --hang-s seconds (the process then
         exits at once, so the other rank's report may be missing).

Kinds: "none" (no shareable handle requested: how stablegraph's remappable
and pool memory is allocated, which NCCL cannot export to its peers) and
"posix_fd" (exportable, as NCCL's own ncclMemAlloc and PyTorch's expandable
segments allocate). NCCL_DEBUG_SUBSYS=REG makes NCCL log each registration on
stderr. Rank 0 writes the JSON. Not a test: it measures the library's
behaviour on this machine, and docs/MULTI-GPU.md reads its output.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

MIB = 1 << 20


class CuMemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CuMemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CuMemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", CuMemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", CuMemAllocFlags)]


class CuMemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CuMemLocation), ("flags", ctypes.c_int)]


HANDLE_TYPES = {"none": 0, "posix_fd": 1}


class VMM:
    """The CUDA driver's virtual memory calls, through ctypes."""

    def __init__(self, device: int):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.device = device

    def check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    def prop(self, kind):
        p = CuMemAllocationProp()
        p.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        p.requestedHandleTypes = HANDLE_TYPES[kind]
        p.location = CuMemLocation(1, self.device)  # CU_MEM_LOCATION_TYPE_DEVICE
        return p

    def granularity(self, kind):
        g = ctypes.c_size_t()
        p = self.prop(kind)
        self.check(self.lib.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 0), "granularity")
        return g.value

    def reserve(self, size):
        va = ctypes.c_uint64()
        self.check(self.lib.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                                ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
        return va.value

    def create(self, size, kind):
        h = ctypes.c_uint64()
        p = self.prop(kind)
        self.check(self.lib.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p),
                                        ctypes.c_uint64(0)), f"cuMemCreate ({kind})")
        return h.value

    def map(self, va, size, h):
        self.check(self.lib.cuMemMap(ctypes.c_uint64(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                     ctypes.c_uint64(h), ctypes.c_uint64(0)), "cuMemMap")
        d = CuMemAccessDesc(CuMemLocation(1, self.device), 3)  # READWRITE
        self.check(self.lib.cuMemSetAccess(ctypes.c_uint64(va), ctypes.c_size_t(size), ctypes.byref(d),
                                           ctypes.c_size_t(1)), "cuMemSetAccess")

    def unmap(self, va, size):
        self.check(self.lib.cuMemUnmap(ctypes.c_uint64(va), ctypes.c_size_t(size)), "cuMemUnmap")

    def release(self, h):
        self.check(self.lib.cuMemRelease(ctypes.c_uint64(h)), "cuMemRelease")


class CudaArray:
    """A float32 view of device memory at ptr, for torch.as_tensor."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}


def wait(torch, hang_s):
    """Wait for the current stream; False when it has not finished within
    hang_s seconds (a hang)."""
    ev = torch.cuda.Event()
    ev.record()
    end = time.monotonic() + hang_s
    while not ev.query():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def experiment(torch, dist, vmm, kind, size, rank, world, hang_s):
    g = vmm.granularity(kind)
    size = (size + g - 1) // g * g
    n = size // 4
    out_size = size * world
    va_send, va_recv = vmm.reserve(size), vmm.reserve(out_size)
    hs = [vmm.create(size, kind), vmm.create(out_size, kind)]
    vmm.map(va_send, size, hs[0])
    vmm.map(va_recv, out_size, hs[1])
    send = torch.as_tensor(CudaArray(va_send, n), device="cuda")
    recv = torch.as_tensor(CudaArray(va_recv, n * world), device="cuda")
    res = {"kind": kind, "bytes": size}

    def expect(base):
        return torch.cat([torch.full((n,), float(base + r), device="cuda") for r in range(world)])

    send.fill_(float(1 + rank))
    recv.zero_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(capture_error_mode="thread_local")
        dist.all_gather_into_tensor(recv, send)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph.replay()
    if not wait(torch, hang_s):
        res["before_remap"] = "hang"
        return res, True
    res["before_remap"] = "ok" if torch.equal(recv, expect(1)) else "stale"

    # The remap strategy's move: same addresses, new physical memory.
    dist.barrier()
    torch.cuda.synchronize()
    vmm.unmap(va_send, size)
    vmm.unmap(va_recv, out_size)
    for h in hs:
        vmm.release(h)
    hs = [vmm.create(size, kind), vmm.create(out_size, kind)]
    vmm.map(va_send, size, hs[0])
    vmm.map(va_recv, out_size, hs[1])
    send.fill_(float(11 + rank))
    recv.zero_()
    torch.cuda.synchronize()
    dist.barrier()
    graph.replay()
    if not wait(torch, hang_s):
        res["after_remap"] = "hang"
        return res, True
    want = expect(11)
    res["after_remap"] = "ok" if torch.equal(recv, want) else "stale"
    if res["after_remap"] == "stale":
        got = recv.view(world, n)[:, 0].tolist()
        res["detail"] = f"first value of each rank's part: {got}, want {want.view(world, n)[:, 0].tolist()}"
    dist.barrier()
    del graph
    torch.cuda.synchronize()
    return res, False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="", help="rank 0 writes the results here")
    ap.add_argument("--mib", type=int, default=8, help="bytes per rank's part, MiB (default 8)")
    ap.add_argument("--hang-s", type=float, default=20, help="a replay not done by then is a hang (default 20)")
    ap.add_argument("--kinds", default="none,posix_fd", help="allocations to try (none, posix_fd)")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    # NCCL sets its communicator up at the first collective, eagerly.
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    vmm = VMM(local)
    out = {"probe": "nccl-remap", "world": world, "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "env": {k: os.environ.get(k) for k in ("NCCL_GRAPH_REGISTER", "NCCL_ALGO", "NCCL_PROTO",
                                                  "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE")},
           "results": []}
    for kind in args.kinds.split(","):
        try:
            res, hung = experiment(torch, dist, vmm, kind, args.mib * MIB, rank, world, args.hang_s)
        except Exception as e:  # report and go on: the next kind may still run
            res, hung = {"kind": kind, "error": f"{type(e).__name__}: {e}"}, False
        res["rank"] = rank
        print(f"[nccl-remap rank {rank}] {json.dumps(res)}", file=sys.stderr, flush=True)
        out["results"].append(res)
        if rank == 0 and args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        if hung:
            # A collective that never ends cannot be torn down: leave now.
            os._exit(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
