package sim

import (
	"log/slog"

	"github.com/stablegraph/stablegraph/gpu"
)

// Config is the sim's configuration: New takes it, and gpu.Open("sim") and
// "auto" read it from gpu.Config.Backends. Zero fields take the defaults
// below. The sim reads no environment.
type Config struct {
	// Devices is the number of simulated devices, at most 64. Default 1.
	Devices int
	// DeviceMemory is each device's memory in bytes. Default 8 GiB.
	DeviceMemory uint64
	// Transport carries the collectives of communicators whose ranks are in
	// other processes (one rank per process): see Transport. Nil, the
	// default, keeps every communicator in this process, its ranks the
	// devices of this Backend. SetTransport sets it after New.
	Transport Transport
	// Logger receives the sim's logs. Default: gpu.Config.Logger when
	// opened through gpu.Open, else slog.Default().
	Logger *slog.Logger
}

// BackendName is "sim": a Config in gpu.Config.Backends configures the sim
// (gpu.BackendConfig).
func (Config) BackendName() string { return "sim" }

var _ gpu.BackendConfig = Config{}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
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

// configOf returns the sim's configuration in gc, with gc's logger unless
// it names its own. A configuration given as a *Config is taken too.
func configOf(gc gpu.Config) Config {
	var c Config
	switch bc := gc.For("sim").(type) {
	case Config:
		c = bc
	case *Config:
		if bc != nil {
			c = *bc
		}
	}
	if c.Logger == nil {
		c.Logger = gc.Logger
	}
	return c
}
