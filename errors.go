package stablegraph

import (
	"errors"
	"fmt"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/replay"
)

var (
	// ErrInvalidProgram is wrapped by every error Compile and
	// Program.Validate return for a bad program; each is a *CompileError
	// naming the command and the buffer. Nothing was allocated.
	ErrInvalidProgram = errors.New("stablegraph: invalid program")
	// ErrInvalidBinding is returned by Run and the buffer accessors for a
	// buffer that is missing, of the wrong class, of another program,
	// bound to a null address, bound to less memory than its size where
	// the backend can tell (the error then also wraps gpu.ErrOutOfBounds),
	// or overlapping another buffer in a way the package doc's "Bindings"
	// section refuses, and by Run under StrategyRemap for memory it cannot
	// map as bound (see StrategyRemap); the error names the buffers.
	// Nothing was enqueued. It is replay.ErrInvalidBinding.
	ErrInvalidBinding = replay.ErrInvalidBinding
	// ErrStreamCapturing is returned by Run for a step on a stream that is
	// capturing a graph (gpu.Backend.StreamIsCapturing): an executable's
	// steps launch graphs of their own and cannot be captured into the
	// caller's. Nothing was bound or enqueued, and the executable is
	// unchanged: the next step on a stream that is not capturing runs.
	ErrStreamCapturing = errors.New("stablegraph: stream is capturing")
	// ErrClosed is returned by every method of a closed Executable, and by
	// the Runs and reads that Close woke from their waits.
	ErrClosed = errors.New("stablegraph: executable closed")
	// ErrSlotWait is returned by Run under StrategyPool when no slot became
	// ready within Options.SlotWait (or ctx's deadline): the device did not
	// finish the step that last used the slot (a hung or stalled device),
	// or every slot stayed leased by zero-copy outputs not released. It
	// comes with gpu.ErrTimeout. Nothing was enqueued; the executable stays
	// usable once the device advances or a lease is released. It is
	// replay.ErrSlotWait.
	ErrSlotWait = replay.ErrSlotWait
	// ErrReleased is returned by ReadOutput for zero-copy outputs whose
	// lease was released: their slot may hold another step's results.
	ErrReleased = errors.New("stablegraph: outputs already released")
)

// errNilContext is what the methods that take a context return for a nil
// one, rather than panic on it: context.Background() (or a context with
// a deadline) is what they want.
var errNilContext = fmt.Errorf("nil context.Context (pass context.Background() or a context with a deadline): %w", gpu.ErrInvalidValue)

// errNilProgram is what Compile and Validate return for a nil *Program.
var errNilProgram = fmt.Errorf("%w: nil *Program (make one with NewProgram)", ErrInvalidProgram)

// CompileError is one mistake in a program. Command is the index of the
// offending command, or -1 when the mistake is in a buffer declaration or
// in the program as a whole.
type CompileError struct {
	Program string
	Command int
	Op      string // the command's label ("launch sg_gemm"), "" for buffers
	Buffer  string // the buffer concerned, "" when none
	Msg     string
}

func (e *CompileError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "stablegraph: program %q: ", e.Program)
	if e.Command >= 0 {
		fmt.Fprintf(&b, "command %d (%s): ", e.Command, e.Op)
	}
	if e.Buffer != "" {
		fmt.Fprintf(&b, "buffer %q: ", e.Buffer)
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *CompileError) Unwrap() error { return ErrInvalidProgram }
