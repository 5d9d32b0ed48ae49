package stablegraph

import (
	"fmt"
	"log/slog"
	"math/bits"
	"strings"

	"stablegraph/trace"
)

// Strategy is a way of replaying a compiled step when its buffers move
// between steps (ARCHITECTURE.md, "The problem it solves").
type Strategy string

const (
	// StrategyEager launches every command on the stream every step. It
	// records nothing and is the reference the others must match bit for
	// bit.
	StrategyEager Strategy = "eager"
	// StrategyRecord records the commands into a graph and, whenever an
	// address they use changes, records and instantiates it again: what
	// other runtimes ship.
	StrategyRecord Strategy = "record"
	// StrategyUpdate re-records into a new graph when addresses change and
	// applies it to the executable graph with a whole-graph exec update,
	// falling back to re-instantiating when the driver refuses.
	StrategyUpdate Strategy = "update"
	// StrategyPatch rewrites in place only the nodes whose buffers moved,
	// with per-node exec parameter updates; traced nodes through their
	// child graph (see package graph and package trace).
	StrategyPatch Strategy = "patch"
)

// Strategies lists the strategies this build implements, in the order
// benchmarks report them.
func Strategies() []Strategy {
	return []Strategy{StrategyEager, StrategyRecord, StrategyUpdate, StrategyPatch}
}

// ParseStrategy returns the strategy named s.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range Strategies() {
		if string(st) == s {
			return st, nil
		}
	}
	names := make([]string, 0, 4)
	for _, st := range Strategies() {
		names = append(names, string(st))
	}
	return "", fmt.Errorf("stablegraph: unknown strategy %q (known: %s)", s, strings.Join(names, ", "))
}

// Options configure Compile. The zero value is valid; each field's default
// is given with it and applied in one place, withDefaults.
type Options struct {
	// Strategy is the replay strategy. Default StrategyPatch.
	Strategy Strategy
	// Device is the ordinal of the device the executable runs on.
	// Default 0.
	Device int
	// TraceCacheSize is how many traces each traced command keeps, keyed
	// by its operands' addresses. Default 16 (trace.DefaultCacheSize).
	TraceCacheSize int
	// Alignment of the executable's own buffers (states, constants, temps),
	// a power of two. Default 256, what cudaMalloc guarantees.
	Alignment uint64
	// NoTempSharing gives every temp its own memory. Default false: temps
	// whose lifetimes (first to last command using them) do not overlap
	// share memory.
	NoTempSharing bool
	// Logger receives the executable's logs; per-step paths log at debug
	// level only. Default slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.Strategy == "" {
		o.Strategy = StrategyPatch
	}
	if _, err := ParseStrategy(string(o.Strategy)); err != nil {
		return o, err
	}
	if o.Device < 0 {
		return o, fmt.Errorf("stablegraph: negative device %d", o.Device)
	}
	if o.TraceCacheSize < 0 {
		return o, fmt.Errorf("stablegraph: negative trace cache size %d", o.TraceCacheSize)
	}
	if o.TraceCacheSize == 0 {
		o.TraceCacheSize = trace.DefaultCacheSize
	}
	if o.Alignment == 0 {
		o.Alignment = 256
	}
	if bits.OnesCount64(o.Alignment) != 1 {
		return o, fmt.Errorf("stablegraph: alignment %d is not a power of two", o.Alignment)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}
