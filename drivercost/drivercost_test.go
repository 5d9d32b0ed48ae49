package drivercost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/report"
)

func openSim(t *testing.T) gpu.Backend {
	t.Helper()
	if !slices.Contains(gpu.Drivers(), "sim") {
		t.Skip("sim backend not registered in this build")
	}
	b, _, err := gpu.Open("sim", gpu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, ok := gpu.LiveHandles(b); ok && !c.IsZero() {
			t.Errorf("live handles after the test: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func quick() Options {
	return Options{Iterations: 5, HeavyIterations: 2, GraphIterations: 2, Ks: []int{10, 100},
		ParamBytes: []int{24, 152}, UpdateNodes: []int{4}, UpdateIterations: 2}
}

func TestRunSim(t *testing.T) {
	b := openSim(t)
	var progress bytes.Buffer
	o := quick()
	o.Progress = &progress
	res, err := Run(context.Background(), b, o)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{RowStreamCreate, RowStreamDestroy, RowStreamCreateBatch, RowStreamDestroyBatch, RowEventCreate,
		RowEventDestroy, RowMemAlloc, RowMemFree, RowWriteValueEnqueue, RowWriteValueSeen, RowCopy1M, RowCopy64M, RowParamInfo,
		"VMM 2 MiB MemCreate", "VMM 64 MiB MemRelease"}
	for _, what := range []string{"capture", "instantiate", "first-launch", "launch", "replay", "eager", "eager-host",
		"update", "recapture-update", "set-params"} {
		want = append(want, GraphRow(what, 10), GraphRow(what, 100))
	}
	for _, name := range want {
		row, ok := res.Row(name)
		switch {
		case !ok:
			t.Errorf("row %q missing", name)
		case row.Skipped != "":
			t.Logf("row %q skipped: %s", name, row.Skipped)
		case row.Samples == 0 || row.P50 < 0 || row.P90 < row.P50:
			t.Errorf("row %q: %+v", name, row)
		}
	}
	if r, _ := res.Row(RowCopy1M); r.Clock != GPU {
		t.Errorf("copy row clock %q, want gpu", r.Clock)
	}
	// The sim's times are simulated: never set beside a hardware figure.
	if r, _ := res.Row(RowStreamCreate); r.Samples != o.Iterations || r.ReferenceUS != nil {
		t.Errorf("stream row: %+v", r)
	}
	if !res.Simulated {
		t.Error("a sim result is not marked simulated")
	}
	if r, _ := res.Row(GraphRow("replay", 10)); r.Samples != o.GraphIterations*10 {
		t.Errorf("K=10 replay has %d samples, want %d", r.Samples, o.GraphIterations*10)
	}
	if !strings.Contains(progress.String(), "bench-driver: graphs: K=100") {
		t.Errorf("progress:\n%s", progress.String())
	}

	var tab bytes.Buffer
	if err := res.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", tab.String())
	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Rows) != len(res.Rows) || back.Rows[0].Name != res.Rows[0].Name {
		t.Errorf("JSON round trip lost rows")
	}
}

func TestRunCancelled(t *testing.T) {
	b := openSim(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, b, quick()); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context: %v", err)
	}
}

func TestRunBadOptions(t *testing.T) {
	b := openSim(t)
	if _, err := Run(context.Background(), b, Options{Ks: []int{0}}); err == nil {
		t.Error("K=0 accepted")
	}
	if _, err := Run(context.Background(), b, Options{Device: 7}); err == nil {
		t.Error("device 7 accepted")
	}
}

// Every reference figure names a row that Run produces for the default
// sizes, so a renamed row cannot silently lose its reference.
func TestReferencesNameRows(t *testing.T) {
	names := map[string]bool{}
	for _, n := range []string{RowStreamCreate, RowStreamDestroy, RowStreamCreateBatch, RowStreamDestroyBatch, RowEventCreate,
		RowEventDestroy, RowMemAlloc, RowMemFree, RowWriteValueEnqueue, RowWriteValueSeen, RowCopy1M, RowCopy64M, RowParamInfo} {
		names[n] = true
	}
	for _, s := range vmmSizes {
		for _, n := range vmmRows(s) {
			names[n] = true
		}
	}
	for _, k := range []int{10, 100, 1000} {
		for _, what := range []string{"capture", "instantiate", "first-launch", "launch", "replay", "eager", "eager-host",
			"update", "recapture-update", "set-params"} {
			names[GraphRow(what, k)] = true
		}
	}
	for name := range references {
		if !names[name] {
			t.Errorf("reference %q names no row", name)
		}
	}
	if v, ok := Reference(GraphRow("update", 1000)); !ok || v != 158 {
		t.Errorf("exec update K=1000 reference = %v, %v", v, ok)
	}
	if _, ok := Reference("VMM 64 MiB MemCreate"); ok {
		t.Error("64 MiB MemCreate has a reference the document does not give")
	}
}

func TestWriteTable(t *testing.T) {
	ref := 1.6
	r := &Result{Backend: "cuda", Device: "H100", Rows: []Row{
		{Name: RowStreamCreate, Clock: Host, P50: 3.2, P90: 4, Samples: 10, ReferenceUS: &ref},
		{Name: RowWriteValueSeen, Clock: Host, Skipped: "gpu: not supported"},
	}}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	want := `backend cuda, device 0: H100; microseconds; ref = H100 reference (docs/GPU-MACHINE.md, driver 580, CUDA 13.0)

operation                                  clock  p50 µs   p90 µs  n   H100 ref µs  p50/ref
StreamCreate, per stream                   host   3.20     4.00    10  1.60         2.00x
StreamWriteValue64 until the host sees it  host   skipped  -       0   -            -

skipped:
  StreamWriteValue64 until the host sees it: gpu: not supported
`
	if got := b.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}

	// Simulated: said so, no reference column, no ratio.
	r.Backend, r.Device, r.Simulated = "sim", "simdev", true
	b.Reset()
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	want = `backend sim, device 0: simdev; microseconds
` + report.SimulatedNote + `

operation                                  clock  sim p50 µs  sim p90 µs  n
StreamCreate, per stream                   host   3.20        4.00        10
StreamWriteValue64 until the host sees it  host   skipped     -           0

skipped:
  StreamWriteValue64 until the host sees it: gpu: not supported
`
	if got := b.String(); got != want {
		t.Errorf("simulated table:\n%s\nwant:\n%s", got, want)
	}
}

// TestJSONKeys: the JSON has snake_case keys throughout, the device's
// properties included.
func TestJSONKeys(t *testing.T) {
	r := &Result{Backend: "sim", Props: devicePropsOf(gpu.DeviceProps{Name: "d", TotalMemory: 1 << 30, ComputeMajor: 9, VMM: true})}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js.Bytes(), &top); err != nil {
		t.Fatal(err)
	}
	var props map[string]any
	if err := json.Unmarshal(top["device_props"], &props); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)
	for k := range top {
		if !snake.MatchString(k) {
			t.Errorf("key %q is not snake_case", k)
		}
	}
	for k := range props {
		if !snake.MatchString(k) {
			t.Errorf("device_props key %q is not snake_case", k)
		}
	}
	if props["total_memory_bytes"] != float64(1<<30) || props["compute_capability"] != "9.0" {
		t.Errorf("device_props: %v", props)
	}
}

// idleCheck wraps a backend and records every GraphLaunch made while its
// stream still has kernels or graphs pending (launched and not yet waited
// for with StreamSynchronize or EventSynchronize): host times of such
// launches would include waiting behind the earlier work.
type idleCheck struct {
	gpu.Backend
	mu        sync.Mutex
	pending   map[gpu.Stream]bool
	capturing map[gpu.Stream]bool
	launches  int
	busy      []string
	// probe is the node update section's module while it is loaded: that
	// section launches back to back and updates running graphs on
	// purpose (hostupdate.go), and is not checked.
	probe gpu.Module
}

func (c *idleCheck) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	m, err := c.Backend.ModuleLoad(dev, img)
	if err == nil && img.Name == "stablegraph-drivercost-probe" {
		c.mu.Lock()
		c.probe = m
		c.mu.Unlock()
	}
	return m, err
}

func (c *idleCheck) ModuleUnload(m gpu.Module) error {
	c.mu.Lock()
	if m == c.probe {
		c.probe = 0
	}
	c.mu.Unlock()
	return c.Backend.ModuleUnload(m)
}

func (c *idleCheck) LaunchKernel(f gpu.Function, cfg gpu.LaunchConfig, args []gpu.Arg, s gpu.Stream) error {
	c.mu.Lock()
	if !c.capturing[s] {
		c.pending[s] = true
	}
	c.mu.Unlock()
	return c.Backend.LaunchKernel(f, cfg, args, s)
}

func (c *idleCheck) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	c.mu.Lock()
	c.launches++
	if c.pending[s] && c.probe == 0 {
		c.busy = append(c.busy, fmt.Sprintf("GraphLaunch %d of exec %#x", c.launches, uint64(x)))
	}
	c.pending[s] = true
	c.mu.Unlock()
	return c.Backend.GraphLaunch(x, s)
}

func (c *idleCheck) StreamSynchronize(s gpu.Stream) error {
	err := c.Backend.StreamSynchronize(s)
	c.mu.Lock()
	c.pending[s] = false
	c.mu.Unlock()
	return err
}

// EventSynchronize: the benchmark records its events on its one stream.
func (c *idleCheck) EventSynchronize(e gpu.Event) error {
	err := c.Backend.EventSynchronize(e)
	c.mu.Lock()
	clear(c.pending)
	c.mu.Unlock()
	return err
}

func (c *idleCheck) StreamBeginCapture(s gpu.Stream) error {
	c.mu.Lock()
	c.capturing[s] = true
	c.mu.Unlock()
	return c.Backend.StreamBeginCapture(s)
}

func (c *idleCheck) StreamEndCapture(s gpu.Stream) (gpu.Graph, error) {
	c.mu.Lock()
	c.capturing[s] = false
	c.mu.Unlock()
	return c.Backend.StreamEndCapture(s)
}

// TestGraphLaunchOnIdleStream: every GraphLaunch the benchmark makes is
// on a stream with nothing pending, so its host time is the launch's own.
func TestGraphLaunchOnIdleStream(t *testing.T) {
	c := &idleCheck{Backend: openSim(t), pending: map[gpu.Stream]bool{}, capturing: map[gpu.Stream]bool{}}
	o := quick()
	o.Ks = []int{10}
	res, err := Run(context.Background(), c, o)
	if err != nil {
		t.Fatal(err)
	}
	if c.launches == 0 {
		t.Fatal("no GraphLaunch seen")
	}
	for _, b := range c.busy {
		t.Errorf("%s made while the stream had work pending", b)
	}
	for _, what := range []string{"first-launch", "launch", "eager-host"} {
		if r, ok := res.Row(GraphRow(what, 10)); !ok || r.Clock != Host || r.Samples == 0 {
			t.Errorf("row %q: %+v", GraphRow(what, 10), r)
		}
	}
}

// TestRemapRows: the remap section measures the unmap, map and set access
// of a granule and whole steps of N moved buffers; on one device the
// every-device row is skipped saying why, on two it is measured. A driver
// failure anywhere in the section ends Run with that error and leaves no
// handle live (Run checks the counters itself).
func TestRemapRows(t *testing.T) {
	for _, devices := range []int{1, 2} {
		t.Run(fmt.Sprintf("devices=%d", devices), func(t *testing.T) {
			b, _, err := gpu.Open("sim", gpu.Config{Backends: []gpu.BackendConfig{sim.Config{Devices: devices, DeviceMemory: 1 << 30}}})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			o := quick()
			o.Ks, o.RemapBuffers = []int{10}, []int{1, 3}
			res, err := Run(context.Background(), b, o)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{RowRemapUnmap, RowRemapMap, RowRemapSetAccess, RemapStepRow(1), RemapStepRow(3)} {
				if r, ok := res.Row(name); !ok || r.Skipped != "" || r.Samples == 0 || r.Clock != Host {
					t.Errorf("row %q: %+v", name, r)
				}
			}
			if r, _ := res.Row(RemapStepRow(3)); r.Samples != o.HeavyIterations {
				t.Errorf("N=3 step row: %d samples, want %d", r.Samples, o.HeavyIterations)
			}
			all, ok := res.Row(RowRemapSetAccessAll)
			if !ok || (devices == 1) != (all.Skipped != "") || (devices == 2 && all.Samples != o.Iterations) {
				t.Errorf("every-device row on %d devices: %+v", devices, all)
			}
			if _, ok := Reference(RowRemapMap); ok {
				t.Error("a remap row has an H100 reference the document does not give")
			}
		})
	}
	b, _, err := gpu.Open("sim", gpu.Config{Backends: []gpu.BackendConfig{sim.Config{Devices: 1, DeviceMemory: 1 << 30}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fi := b.(gpu.FaultInjector)
	o := quick()
	o.Ks, o.RemapBuffers = []int{10}, []int{2}
	for _, op := range []string{"MemCreate", "MemAddressReserve", "MemMap", "MemSetAccess", "MemUnmap", "EventQuery"} {
		// Run's own sections call these too: fail the calls the remap
		// section makes, which come after the plain VMM rows'.
		calls := fi.Calls(op)
		if _, err := Run(context.Background(), b, o); err != nil {
			t.Fatal(err)
		}
		per := fi.Calls(op) - calls
		nths := []int{per - 1, per - 2, per / 2}
		if op == "MemUnmap" {
			// The last unmaps release the section's memory: a release
			// that fails keeps its handle by nature. The middle ones are
			// timed.
			nths = []int{per / 2}
		}
		for _, nth := range nths {
			if nth < 0 {
				continue
			}
			fi.InjectFault(op, nth, nil)
			_, err := Run(context.Background(), b, o)
			fi.ClearFaults()
			if !errors.Is(err, gpu.ErrInjected) || strings.Contains(err.Error(), "leaked") {
				t.Errorf("%s call %d of %d failing: %v", op, nth, per, err)
			}
		}
	}
	if live, _ := gpu.LiveHandles(b); !live.IsZero() {
		t.Errorf("live after the faults: %s", live)
	}
}

// TestNodeUpdateRows: the node update section measures, per parameter
// block size and chain, every row on sim, and MeasureNodeUpdates gives the
// figures a bench sets beside its strategies.
func TestNodeUpdateRows(t *testing.T) {
	b := openSim(t)
	res, err := Run(context.Background(), b, quick())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{24, 152} {
		for _, what := range []string{"idle", "in-flight", "call", "slope", "template-set", "exec-update", "whole-per-node",
			"launch-plain", "launch-device-updatable"} {
			if r, ok := res.Row(UpdateRow(what, p, 4, 0)); !ok || r.Samples == 0 || r.Skipped != "" {
				t.Errorf("row %q: %+v (found %v)", UpdateRow(what, p, 4, 0), r, ok)
			}
		}
		for _, m := range []int{0, 1, 2} {
			if r, ok := res.Row(UpdateRow("step", p, 4, m)); !ok || r.Samples != 2 {
				t.Errorf("row %q: %+v", UpdateRow("step", p, 4, m), r)
			}
		}
		if _, ok := res.Row(UpdateRow("step", p, 4, 8)); ok {
			t.Errorf("a step of 8 updates on a chain of 4")
		}
	}
	// One section alone.
	o := quick()
	o.Sections = []string{"node updates"}
	only, err := Run(context.Background(), b, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range only.Rows {
		if !strings.HasPrefix(r.Name, "node update") && !strings.HasPrefix(r.Name, "whole update") {
			t.Errorf("row %q of another section", r.Name)
		}
	}
	o.Sections = []string{"no such section"}
	if _, err := Run(context.Background(), b, o); err == nil || !strings.Contains(err.Error(), "no such section") {
		t.Errorf("an unknown section: %v", err)
	}
	pr, err := MeasureNodeUpdates(context.Background(), b, 0, 360, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	if pr.ParamBytes != 360 || pr.Nodes != 4 || pr.Samples != 3 || pr.IdleUS <= 0 || pr.InFlightUS <= 0 || !pr.Simulated {
		t.Errorf("MeasureNodeUpdates = %+v", pr)
	}
	for _, bad := range []int{20, 30} {
		if _, err := MeasureNodeUpdates(context.Background(), b, 0, bad, 4, 3); err == nil {
			t.Errorf("a parameter block of %d bytes was taken", bad)
		}
		o := quick()
		o.ParamBytes = []int{bad}
		if _, err := Run(context.Background(), b, o); err == nil {
			t.Errorf("Run took a parameter block of %d bytes", bad)
		}
	}
}
