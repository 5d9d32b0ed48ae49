package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// Driver opens a backend. Drivers register themselves from init with
// Register.
type Driver interface {
	// Open opens the backend with cfg, reading the backend's own
	// configuration from cfg.For(name) (its defaults when there is none).
	Open(cfg Config) (Backend, error)
	// Priority ranks the driver for Open("auto"), which tries drivers from
	// the highest priority down (equal ones in name order) and takes the
	// first that opens with a device. A driver for real hardware reports
	// PriorityHardware, a simulator PrioritySimulator; a negative priority
	// keeps the driver out of "auto" (it opens by name only).
	Priority() Priority
}

// Priority ranks a driver for Open("auto"); see Driver.Priority.
type Priority int

// The priorities of the built-in kinds of backend. A backend between them
// (an emulator faster than the sim) may report any value.
const (
	// PriorityManual keeps a driver out of Open("auto").
	PriorityManual Priority = -1
	// PrioritySimulator is a backend that needs no hardware (sim): the
	// last resort of "auto".
	PrioritySimulator Priority = 0
	// PriorityHardware is a backend that drives a device (cuda), preferred
	// whenever its library loads and it finds a device.
	PriorityHardware Priority = 100
)

// BackendConfig is one backend's own configuration, a type its package
// defines (sim.Config, cuda.Config). The gpu layer knows only whose it is.
type BackendConfig interface {
	// BackendName is the registered name of the backend it configures.
	BackendName() string
}

// Config is what Open passes to a backend: what every backend reads, and
// each backend's own configuration. It is read once, at Open; a backend
// reads the environment in one place of its own, and only for what its
// configuration leaves unset (see each backend's Config).
type Config struct {
	// Logger receives backend logs; hot paths log at debug level only.
	// Default slog.Default(). A backend's own configuration may name
	// another.
	Logger *slog.Logger
	// Backends holds backend configurations, at most one per backend; a
	// backend reads its own (For) and ignores the others, so that one
	// Config serves Open("auto"). A backend without one gets its defaults.
	Backends []BackendConfig
}

// For returns the configuration c holds for the backend named name, nil
// when it holds none.
func (c Config) For(name string) BackendConfig {
	for _, bc := range c.Backends {
		if bc != nil && bc.BackendName() == name {
			return bc
		}
	}
	return nil
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// check refuses a configuration for a backend that is not registered (a
// typo, or a backend whose package is not linked in) and two for one.
func (r *registry) check(c Config) error {
	seen := map[string]bool{}
	for i, bc := range c.Backends {
		if bc == nil {
			return Errorf("Open", ErrInvalidValue, "Config.Backends[%d] is nil", i)
		}
		n := bc.BackendName()
		if seen[n] {
			return Errorf("Open", ErrInvalidValue, "Config.Backends holds two configurations for backend %q", n)
		}
		seen[n] = true
		if _, ok := r.lookup(n); !ok {
			return Errorf("Open", ErrInvalidValue, "Config.Backends holds a %T for backend %q, which is not registered (registered: %s)",
				bc, n, r.registered())
		}
	}
	return nil
}

// registry is a set of drivers: std is the process's, filled by Register;
// tests make their own.
type registry struct {
	mu      sync.RWMutex
	drivers map[string]Driver
}

var std = &registry{drivers: map[string]Driver{}}

// Register makes a driver available under name. It panics on a nil driver,
// an empty name or a duplicate: those are programming errors found at init.
func Register(name string, d Driver) { std.register(name, d) }

func (r *registry) register(name string, d Driver) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d == nil {
		panic("gpu: Register driver is nil")
	}
	if name == "" || name == "auto" {
		panic(fmt.Sprintf("gpu: Register with reserved name %q", name))
	}
	if _, dup := r.drivers[name]; dup {
		panic("gpu: Register called twice for driver " + name)
	}
	r.drivers[name] = d
}

// Drivers returns the names of the registered drivers, sorted.
func Drivers() []string { return std.names() }

func (r *registry) names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.drivers))
	for n := range r.drivers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// autoOrder is the order in which Open("auto") tries the drivers: by
// priority, highest first, then by name; drivers of negative priority are
// left out.
func (r *registry) autoOrder() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	type entry struct {
		name string
		prio Priority
	}
	var order []entry
	for n, d := range r.drivers {
		if p := d.Priority(); p >= 0 {
			order = append(order, entry{n, p})
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].prio != order[j].prio {
			return order[i].prio > order[j].prio
		}
		return order[i].name < order[j].name
	})
	names := make([]string, len(order))
	for i, e := range order {
		names[i] = e.name
	}
	return names
}

// Open opens the backend registered as name. With "auto" it tries the
// registered drivers by their priority (Driver.Priority: hardware before
// simulators) and takes the first that opens with at least one device. The
// returned reason says which backend was chosen and why.
func Open(name string, cfg Config) (b Backend, reason string, err error) {
	return std.open(name, cfg)
}

func (r *registry) open(name string, cfg Config) (b Backend, reason string, err error) {
	cfg = cfg.WithDefaults()
	if err := r.check(cfg); err != nil {
		return nil, "", fmt.Errorf("gpu: open %s: %w", name, err)
	}
	if name != "auto" {
		d, ok := r.lookup(name)
		if !ok {
			return nil, "", fmt.Errorf("gpu: unknown backend %q (registered: %s)%s", name, r.registered(), r.importHint(name))
		}
		b, err := d.Open(cfg)
		if err != nil {
			return nil, "", fmt.Errorf("gpu: open %s: %w", name, err)
		}
		return b, name + " (requested)", nil
	}
	var why []string
	for _, n := range slices.Sorted(maps.Keys(builtIn)) {
		if _, ok := r.lookup(n); !ok {
			why = append(why, n+": not built in")
		}
	}
	for _, n := range r.autoOrder() {
		d, _ := r.lookup(n)
		b, err := d.Open(cfg)
		if err == nil && b.DeviceCount() == 0 {
			err = errors.Join(fmt.Errorf("no devices: %w", ErrUnavailable), b.Close())
		}
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %s", n, brief(err)))
			continue
		}
		reason := n + " (auto"
		if len(why) > 0 {
			reason += "; " + strings.Join(why, "; ")
		}
		return b, reason + ")", nil
	}
	if len(why) == 0 {
		why = append(why, "no backend is registered")
	}
	return nil, "", fmt.Errorf("gpu: no backend could be opened: %s%s: %w", strings.Join(why, "; "), r.importHint("auto"), ErrUnavailable)
}

// builtIn are the backends of this module, registered by importing their
// packages (the root package stablegraph imports both).
var builtIn = map[string]string{"sim": "gpu/sim", "cuda": "gpu/cuda"}

func (r *registry) registered() string {
	if d := r.names(); len(d) > 0 {
		return strings.Join(d, ", ")
	}
	return "none"
}

// importHint says which import registers the built-in backend name (for
// "auto": both), when it is not registered.
func (r *registry) importHint(name string) string {
	const mod = "github.com/stablegraph/stablegraph"
	if name == "auto" {
		if _, sim := r.lookup("sim"); !sim {
			return fmt.Sprintf(" (import %q, which registers sim and cuda, or blank-import %s/gpu/sim)", mod, mod)
		}
		return ""
	}
	if pkg, ok := builtIn[name]; ok {
		return fmt.Sprintf(" (%s is built in: import %q, which registers sim and cuda, or blank-import %s/%s)", name, mod, mod, pkg)
	}
	return ""
}

// briefLen bounds each backend's part of the auto reason: the full error
// (a CUDA loader's lists every place it tried) is what Open(name) returns
// when that backend is asked for by name.
const briefLen = 160

// brief is err's message cut to about briefLen bytes at a word boundary.
func brief(err error) string {
	msg := err.Error()
	if len(msg) <= briefLen {
		return msg
	}
	cut := msg[:briefLen]
	if i := strings.LastIndexByte(cut, ' '); i > 0 {
		cut = cut[:i]
	} else {
		n := briefLen
		for n > 0 && !utf8.RuneStart(msg[n]) {
			n--
		}
		cut = msg[:n]
	}
	return strings.TrimRight(cut, " ,;:") + " … (open it by name for the whole error)"
}

func (r *registry) lookup(name string) (Driver, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, ok := r.drivers[name]
	return d, ok
}
