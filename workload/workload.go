// Package workload builds the step programs that stablegraph's tests,
// `stablegraph run` and `stablegraph bench` measure, and plays the caller
// around them: buffers from a caching allocator that move between steps,
// inputs written every step, outputs read back and compared.
//
// The workloads are those of docs/WORKLOADS.md, with the same shapes and
// float32 data as the PyTorch and JAX peers:
//
//   - mlp: L layers of tanh(x·W + b), width 256 batch 8 (mlp-large: width
//     1024 batch 64); one GEMM and one fused bias+tanh per layer.
//   - train: the same MLP's training step: forward, mean-squared-error
//     backward, SGD update of the state weights in place.
//   - chain: K tiny kernels (axpb over 256 elements), the update-cost stress.
//   - dp: one rank's data-parallel training step: train on the rank's shard
//     of the batch, the gradients all-reduced over Config.Comm before the
//     update (see dp.go).
//   - gpt2-decode: one GPT-2 small decode step over a batch of sequences,
//     each with its own KV cache, a param bound every step (gpt2-decode-tiny
//     for CI; see gpt2.go). Its weights can be read from or written to a
//     safetensors file, so that the PyTorch peer loads the same ones. On a
//     communicator of several ranks it is tensor parallel: each rank runs
//     its heads and MLP columns, with an all-reduce after each projection.
//
// # Caller
//
// A Caller owns a region of device memory managed by a bfc allocator and
// hands out each step's param and output buffers from it according to a
// Pattern: fixed (the same buffers every step), pingpong (two sets,
// alternating), or random (new buffers every step between live allocations
// of random sizes; BindBatch binds a batch of steps ahead, each to its
// own fresh set). Inputs are a pure function of (seed, step, param), so
// two runs with the same seed see the same data whatever their strategy.
// gpt2-decode's sequences keep their KV caches across steps: the Caller
// owns them (gpt2caller.go), and the swap pattern gives some batch rows
// another sequence, and another cache, every step. A remappable Caller
// (CallerOptions.Remappable) allocates every buffer as its own VMM
// allocation instead (package remappable): the memory the remap strategy
// maps, which Run and Bench give it (CallerOptionsFor).
//
// # Runs
//
// Run compiles a workload with one strategy, runs warm-up and measured
// steps, and returns a report.Result: host time per step from the host
// clock around Executable.Run; GPU time per step, the device's work alone,
// from events behind a gate that holds the stream while Run enqueues the
// step (gpu.StreamWaits; timing.go); latency per step, from the call to the
// end of that work; the strategy's counters over the measured steps, peak
// device memory, and a digest of every step's outputs. Without stream waits
// the GPU time is events around the call (the latency), and the row says
// so. Then batches of steps run back to back for the wall time, at fresh
// addresses under Random (Caller.BindBatch). Bench runs every strategy,
// eager first, and marks which matched eager bit for bit.
//
// # Ranks
//
// A workload with collectives (dp, gpt2-decode) runs on several ranks: in one process
// on the sim's devices (ForRanks, RunRanks, BenchRanks), or one process per
// GPU, each setting its rank up with JoinRank or NewRank from a rendezvous
// (see ranks.go and docs/MULTI-GPU.md). Run aligns the ranks of a
// communicator with barriers before each step, behind the step's gate and
// before each wall batch, so that no rank's times hold its wait for a late
// peer; GatherReports brings every rank's report to each.
//
// # Concurrency
//
// A Workload is immutable once built and may be compiled many times. A
// Caller and a run are used from one goroutine.
package workload

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
)

// Config selects a workload's shape. Zero fields take the workload's
// defaults (docs/WORKLOADS.md), applied in New.
type Config struct {
	// Layers of mlp and train. Default 8.
	Layers int
	// Width and Batch of mlp and train. Defaults 256 and 8 (mlp-large:
	// 1024 and 64).
	Width, Batch int
	// K is chain's kernel count (1 to 10000). Default 1000.
	K int
	// N is chain's element count. Default 256.
	N int
	// Heads, Vocab and Positions shape gpt2-decode: attention heads,
	// vocabulary, and the positions of the KV caches and of the position
	// embedding. Defaults GPT-2 small's 12, 50257 and 1024 (gpt2-decode-tiny:
	// 4, 256, 64). gpt2-decode also reads Layers (12; tiny 2), Width as the
	// model width d (768; tiny 64) and Batch (8; tiny 4).
	Heads, Vocab, Positions int
	// Pos is gpt2-decode's decode position: sequence s decodes at
	// max(0, Pos - s mod 4). Default 128 (tiny 16).
	Pos int
	// Weights names a safetensors file of gpt2-decode's weights, with GPT-2
	// checkpoint names and shapes (float32): read when it exists, else
	// written there with the weights generated from Seed. Empty: generated,
	// not written.
	Weights string
	// BatchPerRank is dp's rows per rank: the global batch is BatchPerRank
	// times the ranks (weak scaling: each rank's work stays the same as
	// ranks are added). Zero: Batch is the global batch (strong scaling:
	// the ranks share it). Setting both is an error, and other workloads
	// refuse it.
	BatchPerRank int
	// Seed seeds the weights and the inputs. Default 1.
	Seed uint64
	// Comm is the rank's communicator. dp: the rank's shard of the batch
	// and the ranks its gradients are all-reduced over. gpt2-decode: the
	// tensor-parallel group, of more than one rank, whose ranks each run
	// their heads and MLP columns (gpt2.go); one rank is the whole model.
	// Nil: the single-rank step. Other workloads ignore it.
	Comm *stablegraph.Comm
}

// MaxChainK is the largest chain New accepts.
const MaxChainK = 10000

// Workload is a program and what a caller needs to drive it.
type Workload struct {
	// Name is the workload's name ("mlp", "mlp-large", "train", "chain").
	Name string
	// Desc names the workload with its shape, for reports.
	Desc string
	// Program is the step.
	Program *stablegraph.Program
	// Params and Outputs are the caller-bound buffers, in declaration
	// order.
	Params, Outputs []stablegraph.Buffer
	// States are the executable-owned buffers to initialise with Init
	// before the first step, with their contents.
	States []StateInit
	// Comm is the communicator the program's collectives use (dp,
	// tensor-parallel gpt2-decode), nil when it has none. The program must
	// run on Comm.Device().
	Comm *stablegraph.Comm

	seed   uint64
	inputs []inputFunc // per param
	// gpt2 is set for gpt2-decode: its params hold per-sequence state that
	// the Caller keeps across steps (gpt2.go, gpt2caller.go).
	gpt2 *gpt2Model
}

// StateInit is a state buffer's initial contents.
type StateInit struct {
	Buffer stablegraph.Buffer
	Data   []byte
}

// builders are the workloads by name.
var builders = map[string]func(Config) (*Workload, error){
	"mlp":          func(c Config) (*Workload, error) { return mlp("mlp", c, 256, 8) },
	"mlp-large":    func(c Config) (*Workload, error) { return mlp("mlp-large", c, 1024, 64) },
	"train":        func(c Config) (*Workload, error) { return train("train", c, 256, 8) },
	"train-large":  func(c Config) (*Workload, error) { return train("train-large", c, 1024, 64) },
	"chain":        chain,
	"chain-moving": chainMoving,
	"dp":           dp,
	// One decode step of GPT-2 small over per-sequence KV caches, and a
	// tiny one for CI (gpt2.go).
	"gpt2-decode":      gpt2Decode("gpt2-decode", gpt2Small),
	"gpt2-decode-tiny": gpt2Decode("gpt2-decode-tiny", gpt2Tiny),
}

// Names lists the workloads New knows, sorted.
func Names() []string {
	var n []string
	for k := range builders {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// New builds the workload called name with cfg.
func New(name string, cfg Config) (*Workload, error) {
	b, ok := builders[name]
	if !ok {
		return nil, fmt.Errorf("workload: unknown workload %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if cfg.Layers < 0 || cfg.Width < 0 || cfg.Batch < 0 || cfg.K < 0 || cfg.N < 0 ||
		cfg.Heads < 0 || cfg.Vocab < 0 || cfg.Positions < 0 || cfg.Pos < 0 || cfg.BatchPerRank < 0 {
		return nil, fmt.Errorf("workload %s: negative size in %+v", name, cfg)
	}
	if cfg.BatchPerRank > 0 && name != "dp" {
		return nil, fmt.Errorf("workload %s: a batch per rank (%d) is dp's alone; %s has no ranks", name, cfg.BatchPerRank, name)
	}
	w, err := b(cfg)
	if err != nil {
		return nil, err
	}
	w.seed = cfg.Seed
	if err := w.Program.Validate(); err != nil {
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	return w, nil
}

// Input returns the contents of param i (index into Params) at step: a pure
// function of the seed, the step and i. For gpt2-decode they are those of
// the fixed pattern (row r holds sequence r): the tokens, the positions,
// and for a cache param its sequence's initial cache.
func (w *Workload) Input(step, i int) []byte {
	return w.appendInput(nil, step, i)
}

// appendInput is Input written into dst's storage when it is large
// enough (the caller's scratch, so that a step's inputs make no garbage:
// a collection running under a measured step would time the collector).
func (w *Workload) appendInput(dst []byte, step, i int) []byte {
	if w.gpt2 != nil {
		return w.gpt2.input(step, i)
	}
	r := rand.New(rand.NewPCG(w.seed, uint64(step)<<16|uint64(i)))
	return w.inputs[i](r, dst[:0])
}

// inputFunc makes a param's input from r, appended to dst.
type inputFunc func(r *rand.Rand, dst []byte) []byte

// uniform returns n float32 values uniform in [-a, a] from r.
func uniform(r *rand.Rand, n int, a float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((2*r.Float64() - 1) * a)
	}
	return v
}

// uniformInput is a param input of n values uniform in [-1, 1].
func uniformInput(n int) inputFunc {
	return func(r *rand.Rand, dst []byte) []byte { return appendUniform(dst, r, n, 1) }
}

// appendUniform appends to dst the little-endian bytes of uniform(r, n, a)
// without the intermediate slice.
func appendUniform(dst []byte, r *rand.Rand, n int, a float64) []byte {
	for range n {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32((2*r.Float64()-1)*a)))
	}
	return dst
}

// weights returns the state contents for one layer's matrix and bias:
// uniform in [-1/sqrt(width), 1/sqrt(width)] from the seed.
func weights(seed uint64, layer, n, width int) []byte {
	r := rand.New(rand.NewPCG(seed, 1<<40|uint64(layer)<<8|uint64(n%251)))
	return gpu.F32ToBytes(uniform(r, n, 1/math.Sqrt(float64(width))))
}

func f32Bytes(n int) int64 { return 4 * int64(n) }
