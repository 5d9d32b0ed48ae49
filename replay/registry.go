package replay

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// entry is one strategy of the registry.
type entry struct {
	name Name
	// build makes the strategy from spec, releasing what it made on error.
	build func(spec Spec) (Strategy, error)
	// model, when set, makes the strategy a candidate of auto: it prices
	// one step under spec.Costs, or says why the device cannot run
	// it (Candidate.Usable false). It allocates nothing.
	model func(spec Spec) Candidate
}

// registry lists the strategies in the order benchmarks report them; auto
// weighs its candidates in this order too, which breaks ties of the cost
// model (the ones holding less memory first). It is filled by init
// because auto builds its candidates through it.
var registry []entry

func init() {
	registry = []entry{
		{name: Eager, build: newEager},
		{name: Record, build: newRecord},
		{name: Update, build: newUpdate},
		{name: Patch, build: newPatch, model: modelPatch},
		{name: Device, build: newDevice, model: modelDevice},
		{name: Stable, build: newStable, model: modelStable},
		{name: Pool, build: newPool, model: modelPool},
		{name: Remap, build: newRemap},
		{name: Auto, build: newAuto},
	}
}

// Names lists the strategies of this build, in the order benchmarks
// report them.
func Names() []Name {
	out := make([]Name, len(registry))
	for i, e := range registry {
		out[i] = e.name
	}
	return out
}

// Parse returns the strategy named s, or an error listing the known ones.
func Parse(s string) (Name, error) {
	if _, ok := lookup(Name(s)); ok {
		return Name(s), nil
	}
	names := make([]string, len(registry))
	for i, e := range registry {
		names[i] = string(e.name)
	}
	return "", fmt.Errorf("unknown strategy %q (known: %s)", s, strings.Join(names, ", "))
}

func lookup(name Name) (entry, bool) {
	for _, e := range registry {
		if e.name == name {
			return e, true
		}
	}
	return entry{}, false
}

// New builds strategy name from spec. On error it has released everything
// it made.
func New(name Name, spec Spec) (Strategy, error) {
	e, ok := lookup(name)
	if !ok {
		return nil, fmt.Errorf("strategy %q is not implemented", name)
	}
	if spec.Backend == nil || spec.Commands == nil {
		return nil, errors.New("replay: a spec needs a backend and commands")
	}
	if spec.Logger == nil {
		spec.Logger = slog.Default()
	}
	spec.classes = ClassesOf(spec.Buffers)
	return e.build(spec)
}
