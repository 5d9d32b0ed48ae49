package replay

import (
	"errors"
	"fmt"
)

// ErrSlotWait is returned by Run under pool when no slot became ready
// within the wait's deadline (Options.SlotWait of the root package, or
// ctx's): the device did not finish the step that last used the slot (a
// hung or stalled device), or every slot stayed leased by zero-copy
// outputs not released. It comes with gpu.ErrTimeout. Nothing was
// enqueued; the strategy stays usable once the device advances or a lease
// is released. The root package's ErrSlotWait is this error.
var ErrSlotWait = errors.New("stablegraph: timed out waiting for a pool slot")

// ErrInvalidBinding is wrapped by the errors of Run for a binding that
// cannot be run: refused by the executable (a buffer missing, of the wrong
// class, bound to the null address), or by the strategy (remap: memory
// that cannot be mapped as bound). Nothing was enqueued. The root
// package's ErrInvalidBinding is this error.
var ErrInvalidBinding = errors.New("stablegraph: invalid binding")

// ProgramError is a program that a strategy cannot run as declared with
// the options given (zero-copy outputs that the step reads before writing
// them in full). The root package reports it as a *CompileError, which
// wraps its ErrInvalidProgram.
type ProgramError struct {
	Buffer string // the buffer concerned
	Msg    string
}

func (e *ProgramError) Error() string { return fmt.Sprintf("buffer %q: %s", e.Buffer, e.Msg) }
