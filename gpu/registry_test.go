package gpu

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// fakeBackend is a Backend of devs devices; any other method panics (the
// embedded interface is nil), which the registry must never call.
type fakeBackend struct {
	Backend
	name   string
	devs   int
	closed *int
}

func (b fakeBackend) Name() string     { return b.name }
func (b fakeBackend) DeviceCount() int { return b.devs }
func (b fakeBackend) Close() error     { *b.closed++; return nil }

// fakeDriver opens a fakeBackend, or fails with err, and records the
// configuration it was given.
type fakeDriver struct {
	name   string
	prio   Priority
	devs   int
	err    error
	opened *[]string
	got    *Config
	closed int
}

func (d *fakeDriver) Open(cfg Config) (Backend, error) {
	*d.opened = append(*d.opened, d.name)
	if d.got != nil {
		*d.got = cfg
	}
	if d.err != nil {
		return nil, d.err
	}
	return fakeBackend{name: d.name, devs: d.devs, closed: &d.closed}, nil
}

func (d *fakeDriver) Priority() Priority { return d.prio }

// fakeConfig is a backend configuration of the fake drivers.
type fakeConfig struct{ backend, value string }

func (c fakeConfig) BackendName() string { return c.backend }

// TestAutoOrderByPriority: "auto" tries drivers by the priority they
// report, not by name: hardware first, then simulators, equal ones in name
// order; it passes over a driver that fails or finds no device, saying
// why, and never tries one that keeps out of auto.
func TestAutoOrderByPriority(t *testing.T) {
	var opened []string
	r := &registry{drivers: map[string]Driver{}}
	hw := &fakeDriver{name: "zhw", prio: PriorityHardware, devs: 1, opened: &opened}
	emu := &fakeDriver{name: "emu", prio: PrioritySimulator + 50, devs: 1, opened: &opened}
	simA := &fakeDriver{name: "asim", prio: PrioritySimulator, devs: 1, opened: &opened}
	simB := &fakeDriver{name: "bsim", prio: PrioritySimulator, devs: 1, opened: &opened}
	manual := &fakeDriver{name: "amanual", prio: PriorityManual, devs: 1, opened: &opened}
	for _, d := range []*fakeDriver{simB, manual, simA, emu, hw} {
		r.register(d.name, d)
	}
	if got, want := r.autoOrder(), []string{"zhw", "emu", "asim", "bsim"}; !slices.Equal(got, want) {
		t.Fatalf("autoOrder = %v, want %v", got, want)
	}
	b, reason, err := r.open("auto", Config{})
	if err != nil || b.Name() != "zhw" || !strings.HasPrefix(reason, "zhw (auto") {
		t.Fatalf("open(auto) = %v, %q, %v; want the hardware backend", b, reason, err)
	}
	// Hardware that fails, an emulator without devices: the simulator of
	// the first name, with both reasons.
	opened = nil
	hw.err = errors.New("no driver library")
	emu.devs = 0
	b, reason, err = r.open("auto", Config{})
	if err != nil || b.Name() != "asim" {
		t.Fatalf("open(auto) = %v, %v; want asim", b, err)
	}
	if !strings.Contains(reason, "zhw: no driver library") || !strings.Contains(reason, "emu: no devices") || emu.closed != 1 {
		t.Errorf("reason %q (emulator closed %d times)", reason, emu.closed)
	}
	if want := []string{"zhw", "emu", "asim"}; !slices.Equal(opened, want) {
		t.Errorf("tried %v, want %v (never the manual driver, nothing after the first that opens)", opened, want)
	}
	// By name, a manual driver opens.
	if b, _, err := r.open("amanual", Config{}); err != nil || b.Name() != "amanual" {
		t.Errorf("open(amanual) = %v, %v", b, err)
	}
	// Nothing opens: ErrUnavailable with every reason.
	simA.err, simB.err = errors.New("broken a"), errors.New("broken b")
	if _, _, err := r.open("auto", Config{}); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "bsim: broken b") {
		t.Errorf("open(auto) with nothing working: %v", err)
	}
}

// TestBackendConfigs: a backend gets its own configuration from
// Config.Backends (For), the others ignored; a configuration for a backend
// that is not registered, two for one backend, or a nil one are refused
// before any backend opens.
func TestBackendConfigs(t *testing.T) {
	var opened []string
	var got Config
	r := &registry{drivers: map[string]Driver{}}
	r.register("one", &fakeDriver{name: "one", prio: PrioritySimulator, devs: 1, opened: &opened, got: &got})
	r.register("two", &fakeDriver{name: "two", prio: PrioritySimulator, devs: 1, opened: &opened})
	cfg := Config{Backends: []BackendConfig{fakeConfig{"two", "b"}, fakeConfig{"one", "a"}}}
	if _, _, err := r.open("one", cfg); err != nil {
		t.Fatal(err)
	}
	if c, ok := got.For("one").(fakeConfig); !ok || c.value != "a" || got.Logger == nil {
		t.Errorf("backend one got %+v (For: %+v), want its own configuration and a logger", got, got.For("one"))
	}
	if got.For("three") != nil {
		t.Errorf("For of a backend without configuration: %v", got.For("three"))
	}
	opened = nil
	for name, bad := range map[string]Config{
		"unregistered": {Backends: []BackendConfig{fakeConfig{"cuda", ""}}},
		"duplicate":    {Backends: []BackendConfig{fakeConfig{"one", "a"}, fakeConfig{"one", "b"}}},
		"nil":          {Backends: []BackendConfig{nil}},
	} {
		if _, _, err := r.open("auto", bad); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%s: %v, want ErrInvalidValue", name, err)
		}
	}
	if len(opened) != 0 {
		t.Errorf("backends opened despite a bad configuration: %v", opened)
	}
}
