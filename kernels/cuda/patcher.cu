// The patcher: a kernel, normally the root node of a graph, that moves the
// pointer arguments of the graph's device-updatable kernel nodes with the
// device runtime (cudaGraphKernelNodeSetParam), one thread per update, so that
// the nodes after it run on the new addresses in the same launch. Package
// kernels (patcher.go) is the specification: the layout of the records below,
// the host's protocol, and the Go reference the sim runs.
//
// It calls the device runtime, so it is compiled with -rdc=true and
// device-linked with cudadevrt into one cubin per architecture by
// gen-patcher.sh; the cubins are loaded as they are (cuModuleLoadData), never
// JIT-linked. Rebuild them after any change: a test in package kernels fails
// while kernels/patcher/SOURCE_SHA256 is stale.
#include <cuda_runtime.h>

// One parameter the patcher may change: 8 bytes at offset of node's kernel
// parameters, set to an update's value plus add. 24 bytes.
struct sg_patch_slot {
    unsigned long long node;  // cudaGraphDeviceNode_t
    unsigned long long add;
    unsigned int offset;
    unsigned int reserved;
};

// The header of one table. 16 bytes, followed by capacity updates.
struct sg_patch_header {
    unsigned long long seq;  // the launch this table is for
    unsigned int count;      // updates that follow
    unsigned int total;      // slot writes of those updates
};

// One update: the slots [slot, slot + the next update's start - start) take
// value plus their add. 16 bytes.
struct sg_patch_update {
    unsigned int slot;
    unsigned int start;  // slot writes of the updates before this one
    unsigned long long value;
};

// The control block, in device memory, zeroed before the first launch.
// 32 bytes.
struct sg_patch_ctl {
    unsigned long long seq;          // launches run
    unsigned int done;               // blocks finished in this launch
    unsigned int failed;             // slot writes not applied
    unsigned int skipped;            // launches whose table was not theirs
    unsigned int reserved;
    unsigned long long first_error;  // (write+1)<<32 | cudaError_t, 0: none
};

// The mirror of the control block, in mapped host memory: seq, then
// failed | skipped<<32. 16 bytes.
struct sg_patch_mirror {
    unsigned long long seq;
    unsigned long long counts;
};

static_assert(sizeof(sg_patch_slot) == 24, "slot layout");
static_assert(sizeof(sg_patch_header) == 16, "header layout");
static_assert(sizeof(sg_patch_update) == 16, "update layout");
static_assert(sizeof(sg_patch_ctl) == 32, "control block layout");
static_assert(sizeof(sg_patch_mirror) == 16, "mirror layout");

// Updates each block reads into shared memory at a time (kernels.PatchChunk).
#define SG_PATCH_CHUNK 256

// A launch must be one-dimensional: its last block to finish (counted in
// done, over gridDim.x blocks) advances the control block for the next launch.
extern "C" __global__ void sg_patcher(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                                      const unsigned char* tables, unsigned long long stride,
                                      unsigned int ntables, unsigned int capacity, sg_patch_mirror* mirror) {
    __shared__ unsigned long long seq;
    __shared__ unsigned int count;  // 0xffffffff: the table is not this launch's
    __shared__ unsigned int total;
    __shared__ const sg_patch_update* updates;
    __shared__ sg_patch_update chunk[SG_PATCH_CHUNK];
    __shared__ unsigned int chunk_end;
    if (threadIdx.x == 0) {
        unsigned long long s = *(volatile unsigned long long*)&ctl->seq;
        const unsigned char* t = tables + (s % ntables) * stride;
        const volatile sg_patch_header* h = (const volatile sg_patch_header*)t;
        unsigned long long hs = h->seq;
        unsigned int c = h->count;
        unsigned int tot = h->total;
        seq = s;
        count = (hs == s && c <= capacity) ? c : 0xffffffffu;
        total = tot;
        updates = (const sg_patch_update*)(t + sizeof(sg_patch_header));
    }
    __syncthreads();
    const unsigned int c = count;
    if (c != 0xffffffffu) {
        const unsigned long long gid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
        const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
        for (unsigned int first = 0; first < c; first += SG_PATCH_CHUNK) {
            const unsigned int n = min(c - first, (unsigned int)SG_PATCH_CHUNK);
            for (unsigned int k = threadIdx.x; k < n; k += blockDim.x) chunk[k] = updates[first + k];
            if (threadIdx.x == 0) chunk_end = first + n < c ? updates[first + n].start : total;
            __syncthreads();
            const unsigned long long end = chunk_end;
            for (unsigned long long i = chunk[0].start + gid; i < end; i += step) {
                // The last update of the chunk whose start is at most i.
                unsigned int lo = 0, hi = n;
                while (hi - lo > 1) {
                    const unsigned int m = (lo + hi) / 2;
                    if (chunk[m].start <= i) lo = m;
                    else hi = m;
                }
                const sg_patch_update u = chunk[lo];
                const unsigned long long s = (unsigned long long)u.slot + (i - u.start);
                cudaError_t err = cudaErrorInvalidValue;
                if (s < nslots) {
                    const sg_patch_slot sl = slots[s];
                    const unsigned long long v = u.value + sl.add;
                    err = cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)sl.node, sl.offset, &v, sizeof v);
                }
                if (err != cudaSuccess) {
                    atomicAdd(&ctl->failed, 1u);
                    atomicCAS(&ctl->first_error, 0ull, ((i + 1) << 32) | (unsigned int)err);
                }
            }
            __syncthreads();  // the chunk is read again next round
        }
    }
    __syncthreads();  // every thread of the block has made its updates
    if (threadIdx.x == 0) {
        if (c == 0xffffffffu && blockIdx.x == 0) atomicAdd(&ctl->skipped, 1u);
        __threadfence();
        if (atomicAdd(&ctl->done, 1u) == gridDim.x - 1) {
            // Every block has read seq and finished: advance for the next launch.
            ctl->done = 0;
            ctl->seq = seq + 1;
            __threadfence();
            if (mirror != nullptr) {
                // The counters, then seq, each one 8-byte store the host reads whole.
                const unsigned long long failed = atomicAdd(&ctl->failed, 0u);
                const unsigned long long skipped = atomicAdd(&ctl->skipped, 0u);
                volatile sg_patch_mirror* m = mirror;
                m->counts = failed | (skipped << 32);
                __threadfence_system();
                m->seq = seq + 1;
                __threadfence_system();
            }
        }
    }
}
