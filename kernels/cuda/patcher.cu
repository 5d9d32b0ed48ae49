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

// Updates each block reads into shared memory at a time (kernels.PatchChunk):
// as many as the largest block has threads, so that a table of up to that
// many updates is read in one round.
#define SG_PATCH_CHUNK 1024

// Updates read before the header is checked (one warp's loads): the tables
// of most steps, which move a few buffers, are then read in one round trip
// over the bus. More would cost: each is its own read of host memory, and
// reads of a table that turns out not to be this launch's are wasted.
#define SG_PATCH_EARLY 32

// Loads of the tables, which the host rewrites between launches: 16 bytes
// at a time, never from a cache.
__device__ static sg_patch_header sg_load_header(const unsigned char* t) {
    const ulonglong2 v = __ldcv((const ulonglong2*)t);
    sg_patch_header h;
    h.seq = v.x;
    h.count = (unsigned int)v.y;
    h.total = (unsigned int)(v.y >> 32);
    return h;
}

__device__ static sg_patch_update sg_load_update(const sg_patch_update* u) {
    const ulonglong2 v = __ldcv((const ulonglong2*)u);
    sg_patch_update r;
    r.slot = (unsigned int)v.x;
    r.start = (unsigned int)(v.x >> 32);
    r.value = v.y;
    return r;
}

// Applies slot write i of update u; false when it could not be applied.
__device__ static bool sg_apply(const sg_patch_slot* slots, unsigned int nslots, const sg_patch_update& u,
                                unsigned long long i, sg_patch_ctl* ctl) {
    const unsigned long long s = (unsigned long long)u.slot + (i - u.start);
    cudaError_t err = cudaErrorInvalidValue;
    if (s < nslots) {
        const sg_patch_slot sl = slots[s];
        const unsigned long long v = u.value + sl.add;
        err = cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)sl.node, sl.offset, &v, sizeof v);
    }
    if (err == cudaSuccess) return true;
    atomicAdd(&ctl->failed, 1u);
    atomicCAS(&ctl->first_error, 0ull, ((i + 1) << 32) | (unsigned int)err);
    return false;
}

// The patcher is the root of the graph: every node waits for it, so its
// latency is the step's, and what it costs is dependent round trips to
// memory. It makes three before its first update: the control block's seq
// (device memory); the table's header together with its first
// SG_PATCH_EARLY updates (host memory, over the bus); the slots those
// updates name (device memory). After its updates it only stores: seq into
// the control block and the mirror, with no fence, unless something failed
// or was skipped (the kernel's completion publishes the stores; the host
// only ever waits for the mirror's seq to grow, so a late store costs it a
// poll, never a wrong answer). When the counters change they are written
// first, then a system-wide fence, then seq, so that a host that sees seq
// sees them. Measured on an H100 against other layouts of the same work
// (each thread loading the header and its update at once; the table read
// field by field; device-wide fences at the end): this one was the fastest
// for a few updates and for two thousand.
//
// A launch must be one-dimensional. With one block (the usual launch, see
// kernels.PatcherConfig) block barriers order everything; with several, the
// last block to finish (counted in done) advances the control block.
extern "C" __global__ void sg_patcher(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                                      const unsigned char* tables, unsigned long long stride,
                                      unsigned int ntables, unsigned int capacity, sg_patch_mirror* mirror) {
    __shared__ unsigned int count;  // 0xffffffff: the table is not this launch's
    __shared__ unsigned int total;
    __shared__ unsigned int changed;  // this block failed or skipped something
    __shared__ sg_patch_update chunk[SG_PATCH_CHUNK];
    __shared__ unsigned int chunk_end;

    // Every thread reads seq and finds the table itself.
    const unsigned long long seq = __ldcv((const unsigned long long*)&ctl->seq);
    const unsigned char* t = tables + (seq % ntables) * stride;
    const sg_patch_update* updates = (const sg_patch_update*)(t + sizeof(sg_patch_header));
    const unsigned int early = min(min(capacity, (unsigned int)SG_PATCH_EARLY), blockDim.x);
    if (threadIdx.x < early) chunk[threadIdx.x] = sg_load_update(&updates[threadIdx.x]);
    if (threadIdx.x == 0) {
        const sg_patch_header h = sg_load_header(t);
        count = (h.seq == seq && h.count <= capacity) ? h.count : 0xffffffffu;
        total = h.total;
        changed = 0;
    }
    __syncthreads();
    const unsigned int c = count;
    bool ok = true;
    if (c != 0xffffffffu) {
        const unsigned long long gid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
        const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
        for (unsigned int first = 0; first < c; first += SG_PATCH_CHUNK) {
            const unsigned int n = min(c - first, (unsigned int)SG_PATCH_CHUNK);
            const unsigned int have = first == 0 ? early : 0;  // already in chunk
            if (first > 0) __syncthreads();  // every thread is done with the chunk before
            // Nothing to load in the usual case: the early updates were all.
            for (unsigned int k = have + threadIdx.x; k < n; k += blockDim.x) chunk[k] = sg_load_update(&updates[first + k]);
            if (threadIdx.x == 0) chunk_end = first + n < c ? sg_load_update(&updates[first + n]).start : total;
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
                ok = sg_apply(slots, nslots, chunk[lo], i, ctl) && ok;
            }
        }
    }
    if (!ok) changed = 1;  // any thread may: the value is all that matters
    __syncthreads();  // every thread of the block has read seq and made its updates
    if (threadIdx.x != 0) return;
    bool dirty = changed != 0 || c == 0xffffffffu;
    if (c == 0xffffffffu && blockIdx.x == 0) atomicAdd(&ctl->skipped, 1u);
    if (gridDim.x > 1) {
        if (dirty) atomicOr(&ctl->reserved, 1u);
        __threadfence();
        if (atomicAdd(&ctl->done, 1u) != gridDim.x - 1) return;
        // The last block: every block has read seq and finished.
        dirty = atomicExch(&ctl->reserved, 0u) != 0;
        ctl->done = 0;
    }
    ctl->seq = seq + 1;
    if (mirror == nullptr) return;
    volatile sg_patch_mirror* m = mirror;
    if (dirty) {
        // The counters, then seq, each one 8-byte store the host reads whole.
        __threadfence();
        const unsigned long long failed = atomicAdd(&ctl->failed, 0u);
        const unsigned long long skipped = atomicAdd(&ctl->skipped, 0u);
        m->counts = failed | (skipped << 32);
        __threadfence_system();
    }
    m->seq = seq + 1;
}

// Updates a sg_patcher_inline launch carries in its own parameters
// (kernels.PatchInlineCap).
#define SG_PATCH_INLINE 16

// The words of an inline table: a table of SG_PATCH_INLINE updates laid out
// as the ring's tables are (its header's seq unused), 272 bytes, passed as
// that many 8-byte parameters (every kernel parameter of ours has a
// type of fixed size: kernels.PatcherInlineSpec).
#define SG_PATCH_INLINE_WORDS (2 + 2 * SG_PATCH_INLINE)

// sg_patcher_inline is the patcher for steps that move at most
// SG_PATCH_INLINE buffers: the host writes the updates into this kernel
// node's own parameters (one exec update of this node, which is not
// device-updatable, so the graph needs no upload), and the patcher reads
// them from its parameters, with no round trip over the bus before its
// first pointer write: half the GPU time of the table patcher for a few
// updates (bench/probes/patcher). Updates already applied are applied
// again by a launch whose parameters the host left as they were, which
// changes nothing. Failures count in the control block as sg_patcher's do,
// and when there is one the counters go to the mirror (its seq is not
// used); there is no ring, so nothing else is written.
extern "C" __global__ void sg_patcher_inline(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                                             sg_patch_mirror* mirror, unsigned long long w0, unsigned long long w1, unsigned long long w2, unsigned long long w3, unsigned long long w4, unsigned long long w5, unsigned long long w6, unsigned long long w7, unsigned long long w8, unsigned long long w9, unsigned long long w10, unsigned long long w11, unsigned long long w12, unsigned long long w13, unsigned long long w14, unsigned long long w15, unsigned long long w16, unsigned long long w17, unsigned long long w18, unsigned long long w19, unsigned long long w20, unsigned long long w21, unsigned long long w22, unsigned long long w23, unsigned long long w24, unsigned long long w25, unsigned long long w26, unsigned long long w27, unsigned long long w28, unsigned long long w29, unsigned long long w30, unsigned long long w31, unsigned long long w32, unsigned long long w33) {
    const unsigned long long w[SG_PATCH_INLINE_WORDS] = {w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23, w24, w25, w26, w27, w28, w29, w30, w31, w32, w33};
    const unsigned int c = min((unsigned int)w[1], (unsigned int)SG_PATCH_INLINE);
    const unsigned long long end = w[1] >> 32;
    const unsigned long long gid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    bool ok = true;
    if (c > 0) {
        for (unsigned long long i = (w[2] >> 32) + gid; i < end; i += step) {
            // The last update whose start is at most i.
            unsigned int lo = 0, hi = c;
            while (hi - lo > 1) {
                const unsigned int m = (lo + hi) / 2;
                if ((w[2 + 2 * m] >> 32) <= i) lo = m;
                else hi = m;
            }
            sg_patch_update u;
            u.slot = (unsigned int)w[2 + 2 * lo];
            u.start = (unsigned int)(w[2 + 2 * lo] >> 32);
            u.value = w[3 + 2 * lo];
            ok = sg_apply(slots, nslots, u, i, ctl) && ok;
        }
    }
    if (ok || mirror == nullptr) return;
    // Rare: a failed update. The counters, each read whole, to the mirror;
    // whichever failing thread writes last, the host sees them change.
    __threadfence();
    const unsigned long long failed = atomicAdd(&ctl->failed, 0u);
    const unsigned long long skipped = atomicAdd(&ctl->skipped, 0u);
    ((volatile sg_patch_mirror*)mirror)->counts = failed | (skipped << 32);
    __threadfence_system();
}
