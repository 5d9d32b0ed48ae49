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
// parameters. 16 bytes.
struct sg_patch_slot {
    unsigned long long node;  // cudaGraphDeviceNode_t
    unsigned int offset;
    unsigned int reserved;
};

// The header of one table. 16 bytes, followed by capacity updates.
struct sg_patch_header {
    unsigned long long seq;  // the launch this table is for
    unsigned int count;      // updates that follow
    unsigned int reserved;
};

// One update: slot takes value. 16 bytes.
struct sg_patch_update {
    unsigned int slot;
    unsigned int reserved;
    unsigned long long value;
};

// The control block, in device memory, zeroed before the first launch.
// 32 bytes.
struct sg_patch_ctl {
    unsigned long long seq;          // launches run
    unsigned int done;               // blocks finished in this launch
    unsigned int failed;             // updates not applied
    unsigned int skipped;            // launches whose table was not theirs
    unsigned int reserved;
    unsigned long long first_error;  // (entry+1)<<32 | cudaError_t, 0: none
};

static_assert(sizeof(sg_patch_slot) == 16, "slot layout");
static_assert(sizeof(sg_patch_header) == 16, "header layout");
static_assert(sizeof(sg_patch_update) == 16, "update layout");
static_assert(sizeof(sg_patch_ctl) == 32, "control block layout");

// A launch must be one-dimensional: its last block to finish (counted in
// done, over gridDim.x blocks) advances the control block for the next launch.
extern "C" __global__ void sg_patcher(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                                      const unsigned char* tables, unsigned long long stride,
                                      unsigned int ntables, unsigned int capacity) {
    __shared__ unsigned long long seq;
    __shared__ unsigned int count;  // 0xffffffff: the table is not this launch's
    __shared__ const sg_patch_update* updates;
    if (threadIdx.x == 0) {
        unsigned long long s = *(volatile unsigned long long*)&ctl->seq;
        const unsigned char* t = tables + (s % ntables) * stride;
        const volatile sg_patch_header* h = (const volatile sg_patch_header*)t;
        unsigned long long hs = h->seq;
        unsigned int c = h->count;
        seq = s;
        count = (hs == s && c <= capacity) ? c : 0xffffffffu;
        updates = (const sg_patch_update*)(t + sizeof(sg_patch_header));
    }
    __syncthreads();
    const unsigned int c = count;
    if (c != 0xffffffffu) {
        for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < c; i += gridDim.x * blockDim.x) {
            sg_patch_update u = updates[i];
            cudaError_t err = cudaErrorInvalidValue;
            if (u.slot < nslots) {
                sg_patch_slot sl = slots[u.slot];
                err = cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)sl.node, sl.offset, &u.value, sizeof u.value);
            }
            if (err != cudaSuccess) {
                atomicAdd(&ctl->failed, 1u);
                atomicCAS(&ctl->first_error, 0ull, ((unsigned long long)(i + 1) << 32) | (unsigned int)err);
            }
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
        }
    }
}
