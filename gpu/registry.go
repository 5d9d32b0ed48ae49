package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// Driver opens a backend. Drivers register themselves from init with
// Register.
type Driver interface {
	Open(cfg Config) (Backend, error)
}

// Config holds every option a backend reads, with documented defaults. It is
// read once, at Open; nothing in the backends consults the environment
// except where a field says so.
type Config struct {
	// Devices is the number of simulated devices (sim only). Default 1.
	Devices int
	// DeviceMemory is each simulated device's memory in bytes (sim only).
	// Default 8 GiB.
	DeviceMemory uint64
	// CUDALibrary names the libcuda file to load (cuda only). Default: the
	// value of STABLEGRAPH_LIBCUDA, else a list of standard names and
	// directories.
	CUDALibrary string
	// CUBLASLibrary names the libcublas file to load (cuda only). Default:
	// STABLEGRAPH_LIBCUBLAS, else a list of candidates; cuBLAS is optional.
	CUBLASLibrary string
	// NCCLLibrary names the libnccl file to load for collectives (cuda
	// only). Default: STABLEGRAPH_LIBNCCL, else a list of candidates
	// (system library directories, CUDA toolkits, PyTorch's NCCL wheel).
	// NCCL is optional: without it the backend's collectives return
	// gpu.ErrNotSupported listing the places tried.
	NCCLLibrary string
	// Logger receives backend logs; hot paths log at debug level only.
	// Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Devices <= 0 {
		c.Devices = 1
	}
	if c.DeviceMemory == 0 {
		c.DeviceMemory = 8 << 30
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

var (
	driversMu sync.RWMutex
	drivers   = map[string]Driver{}
)

// Register makes a driver available under name. It panics on a nil driver,
// an empty name or a duplicate: those are programming errors found at init.
func Register(name string, d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if d == nil {
		panic("gpu: Register driver is nil")
	}
	if name == "" || name == "auto" {
		panic(fmt.Sprintf("gpu: Register with reserved name %q", name))
	}
	if _, dup := drivers[name]; dup {
		panic("gpu: Register called twice for driver " + name)
	}
	drivers[name] = d
}

// Drivers returns the names of the registered drivers, sorted.
func Drivers() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	names := make([]string, 0, len(drivers))
	for n := range drivers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// autoOrder is the preference of Open("auto").
var autoOrder = []string{"cuda", "sim"}

// Open opens the backend registered as name. With "auto" it tries "cuda"
// (needs a driver and at least one device) and then "sim". The returned
// reason says which backend was chosen and why.
func Open(name string, cfg Config) (b Backend, reason string, err error) {
	cfg = cfg.WithDefaults()
	if name != "auto" {
		d, ok := lookup(name)
		if !ok {
			return nil, "", fmt.Errorf("gpu: unknown backend %q (registered: %s)%s", name, registered(), importHint(name))
		}
		b, err := d.Open(cfg)
		if err != nil {
			return nil, "", fmt.Errorf("gpu: open %s: %w", name, err)
		}
		return b, name + " (requested)", nil
	}
	var why []string
	for _, n := range autoOrder {
		d, ok := lookup(n)
		if !ok {
			why = append(why, n+": not built in")
			continue
		}
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
	return nil, "", fmt.Errorf("gpu: no backend could be opened: %s%s: %w", strings.Join(why, "; "), importHint("auto"), ErrUnavailable)
}

// builtIn are the backends of this module, registered by importing their
// packages (the root package stablegraph imports both).
var builtIn = map[string]string{"sim": "gpu/sim", "cuda": "gpu/cuda"}

func registered() string {
	if d := Drivers(); len(d) > 0 {
		return strings.Join(d, ", ")
	}
	return "none"
}

// importHint says which import registers the built-in backend name (for
// "auto": both), when it is not registered.
func importHint(name string) string {
	const mod = "github.com/stablegraph/stablegraph"
	if name == "auto" {
		if _, sim := lookup("sim"); !sim {
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

func lookup(name string) (Driver, bool) {
	driversMu.RLock()
	defer driversMu.RUnlock()
	d, ok := drivers[name]
	return d, ok
}
