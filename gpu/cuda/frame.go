package cuda

import (
	"runtime"
	"sync"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// frame is the Go memory that one driver call lends the driver: output
// parameters (the current context, a new node), node parameter structs, and
// kernel arguments in C form (each argument in its own 8-byte-aligned word,
// and the void* array pointing at the words). Frames are pooled, so that
// the hot calls (launches, node updates, graph launches) allocate nothing.
//
// # Why no pinning is needed
//
// The driver reads a frame only during the call it is passed to: cuLaunchKernel
// copies the arguments when it enqueues the launch, cuGraphAddKernelNode and
// cuGraphExec*NodeSetParams copy the parameters into the node (reading a
// node's parameters back gives driver-owned copies), and output parameters
// are written before the call returns; none keeps a pointer to the caller's
// memory. (The pinned argument packs this replaced were unpinned as soon as
// the call returned, on the same grounds.) For the duration of the call:
//   - the frame is a heap object (sync.Pool holds pointers; and cu's wrappers
//     are go:uintptrescapes, which would move it to the heap anyway), and
//     Go's collector never moves heap objects;
//   - it is reachable from the calling goroutine, which holds it until after
//     the call returns and only then puts it back (release), so it is
//     neither freed nor handed to another goroutine while the driver reads it.
//
// So the addresses the driver reads stay valid and keep their contents,
// which is all runtime.Pinner would add; Pinner's rule exists for C code that
// keeps Go pointers after the call returns, which the driver does not do.
// Pinning takes span locks for every object pinned and unpinned; with the
// allocations of the argument packs it came with, it was most of this
// layer's cost per launch. Frames are not pinned.
type frame struct {
	ctx   cu.Context   // cuCtxGetCurrent's output
	node  cu.GraphNode // a GraphAdd call's output
	event cu.Event     // cuEventCreate's output

	kp cu.KernelNodeParams
	cp cu.Memcpy3D
	mp cu.MemsetNodeParams
	// upd is cuGraphExecUpdate's output.
	upd cu.GraphExecUpdateResultInfo

	// deps, words and ptrs are the used parts of the arrays below, or
	// heap slices when a call needs more.
	deps  []cu.GraphNode
	words []uint64
	ptrs  []unsafe.Pointer

	depBuf  [frameDeps]cu.GraphNode
	wordBuf [frameWords]uint64
	ptrBuf  [frameArgs]unsafe.Pointer
}

// Inline capacities of a frame; calls that need more allocate.
const (
	frameDeps  = 8
	frameArgs  = 24
	frameWords = 32
)

var frames = sync.Pool{New: func() any { return new(frame) }}

// getFrame returns a frame for one call; release it when the call returns.
func getFrame() *frame { return frames.Get().(*frame) }

// release returns fr to the pool. Anything fr points at outside itself
// (slices too big for it) is dropped first, so a pooled frame keeps nothing
// alive.
func (fr *frame) release() {
	if len(fr.words) > frameWords {
		clear(fr.ptrBuf[:]) // they may point into the big words slice
	}
	fr.kp = cu.KernelNodeParams{}
	fr.deps, fr.words, fr.ptrs = nil, nil, nil
	frames.Put(fr)
}

// pack writes the C view of args into fr (see frame) and returns the void**
// to pass, nil without arguments.
func (fr *frame) pack(args []gpu.Arg) *unsafe.Pointer {
	if len(args) == 0 {
		fr.words, fr.ptrs = fr.wordBuf[:0], fr.ptrBuf[:0]
		return nil
	}
	n := 0
	for i := range args {
		n += slotWords(&args[i])
	}
	if n <= frameWords {
		fr.words = fr.wordBuf[:n]
	} else {
		fr.words = make([]uint64, n)
	}
	if len(args) <= frameArgs {
		fr.ptrs = fr.ptrBuf[:len(args)]
	} else {
		fr.ptrs = make([]unsafe.Pointer, len(args))
	}
	w := 0
	for i := range args {
		x := &args[i]
		fr.ptrs[i] = unsafe.Pointer(&fr.words[w])
		if x.Kind == gpu.ArgBytes {
			k := slotWords(x)
			clear(fr.words[w : w+k])
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&fr.words[w])), k*8), x.Raw)
			w += k
			continue
		}
		// What Arg.Encode writes, and zero padding to the word.
		switch x.Kind.Size() {
		case 4:
			fr.words[w] = uint64(uint32(x.Bits))
		case 8:
			fr.words[w] = x.Bits
		default:
			fr.words[w] = 0
		}
		w++
	}
	return &fr.ptrs[0]
}

// slotWords is the number of 8-byte words argument x takes (at least one).
func slotWords(x *gpu.Arg) int {
	if x.Kind != gpu.ArgBytes {
		return 1 // every typed kind is 4 or 8 bytes
	}
	return (max(len(x.Raw), 1) + 7) / 8
}

// params is the void** of the arguments last packed (nil without any).
func (fr *frame) params() *unsafe.Pointer {
	if len(fr.ptrs) == 0 {
		return nil
	}
	return &fr.ptrs[0]
}

// packArgs returns a frame holding the C view of args; release it after the
// call.
func packArgs(args []gpu.Arg) *frame {
	fr := getFrame()
	fr.pack(args)
	return fr
}

// enter locks the calling goroutine to its OS thread and makes ctx current
// there (cuCtxGetCurrent into fr, cuCtxSetCurrent only when another context
// is current). When it returns nil the caller makes its driver calls and
// then calls runtime.UnlockOSThread; on error the thread is already
// unlocked.
func (b *Backend) enter(ctx cu.Context, fr *frame) error { return b.enterCtx(ctx, &fr.ctx) }

// enterCtx is enter with cuCtxGetCurrent's output at cur (heap memory the
// caller holds, as a frame's).
func (b *Backend) enterCtx(ctx cu.Context, cur *cu.Context) error {
	runtime.LockOSThread()
	if r := b.d.CtxGetCurrent(cur); r != cu.Success {
		runtime.UnlockOSThread()
		return b.check("cuCtxGetCurrent", r)
	}
	if *cur != ctx {
		if r := b.d.CtxSetCurrent(ctx); r != cu.Success {
			runtime.UnlockOSThread()
			return b.check("cuCtxSetCurrent", r)
		}
	}
	return nil
}

// callFrame is call for a caller that holds a frame (whose memory f passes
// to the driver): one driver call on dev, its result checked as op.
func (b *Backend) callFrame(fr *frame, dev int, op string, f func() cu.Result) error {
	if err := b.enter(b.devs[dev].ctx, fr); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	return b.check(op, f())
}
