package stablegraph

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
)

// NCCL's graph registration, and why stablegraph's communicators run
// without it.
//
// With NCCL_GRAPH_REGISTER=1 (NCCL's default), a collective captured into a
// graph may register its send and receive buffers: NCCL exports the
// physical memory behind their virtual addresses to the peers (IPC over
// NVLink, a memory region on a network adapter, NVLink SHARP's multicast)
// and caches the registration by address until the graph is destroyed, so
// that the replayed collective reads and writes the buffers directly.
// Three things that stablegraph does break that:
//
//   - The remap strategy keeps a graph's virtual addresses and maps other
//     physical memory behind them every step. A registration made at
//     capture still points at the old memory: the peers would read and
//     write stale pages, and over a network adapter replay is reported to
//     hang (docs/MULTI-GPU.md says where).
//   - The pool strategy's VMM slots are reported to make registered
//     collectives fault on GPUs before Blackwell.
//   - Ranks capture at different steps (only the order of collectives is
//     the same on every rank), and NCCL requires that when any rank passes
//     registered buffers to a collective every rank does: a rank running a
//     collective eagerly while another replays a registered one breaks it.
//
// So before NCCL is first used (the first communicator id or communicator
// made on a backend with NCCL), ncclGraphRegisterOff sets
// NCCL_GRAPH_REGISTER=0 in the process's environment when it is unset (Go's
// os.Setenv reaches the C environment NCCL reads, through cgo or purego's
// stand-in for it), and refuses a value other than 0 with an error that
// says why. NCCL's internal copy through its own buffers is what that
// costs: small beside the transfer for dp's gradients.

// ncclGraphRegisterVar is NCCL's switch for graph registration.
const ncclGraphRegisterVar = "NCCL_GRAPH_REGISTER"

// ncclEnv is how ncclGraphRegisterOff reads and sets the environment
// (replaced in tests).
var ncclEnv = struct {
	lookup func(string) (string, bool)
	set    func(string, string) error
}{os.LookupEnv, os.Setenv}

// ncclSetOnce guards the one write of the variable in a process: setenv is
// not safe beside a concurrent getenv of NCCL's own threads, and before
// the first communicator there are none.
var ncclSetOnce struct {
	sync.Mutex
	done bool
}

// ncclGraphRegisterOff makes sure NCCL's graph registration is off before
// backend b makes a communicator (see above). Backends without NCCL (sim)
// are left alone.
func ncclGraphRegisterOff(b gpu.Backend) error {
	if b.Name() != "cuda" {
		return nil
	}
	ncclSetOnce.Lock()
	defer ncclSetOnce.Unlock()
	v, ok := ncclEnv.lookup(ncclGraphRegisterVar)
	switch {
	case !ok && !ncclSetOnce.done:
		if err := ncclEnv.set(ncclGraphRegisterVar, "0"); err != nil {
			return fmt.Errorf("stablegraph: set %s=0: %w", ncclGraphRegisterVar, err)
		}
		ncclSetOnce.done = true
		return nil
	case ok && strings.TrimSpace(v) == "0":
		return nil
	}
	return fmt.Errorf("stablegraph: %s=%q: NCCL's graph registration is not supported: a registered buffer keeps the physical memory it had at capture, "+
		"which the remap strategy changes under the same address, and NCCL needs every rank to pass registered buffers when one does, which ranks capturing at different steps do not; "+
		"unset %s or set it to 0 (docs/MULTI-GPU.md): %w", ncclGraphRegisterVar, v, ncclGraphRegisterVar, gpu.ErrNotSupported)
}
