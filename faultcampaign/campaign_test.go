package faultcampaign_test

import (
	"context"
	"flag"
	"testing"
	"time"

	"go.uber.org/goleak"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/faultcampaign"
	_ "github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/workload"
)

var full = flag.Bool("campaign.full", false, "sweep every call index of every site (the full campaign; minutes)")

// TestFaultCampaign runs the fault campaign: every strategy and workload,
// each driver entry point the trial reaches failed in turn (see the package
// doc), and logs the summary table. By default it tries at most two call
// indices per (phase, entry point), the first and the last, over random
// buffer movement; under the race detector (CI: go test -race ./...) one
// index, over the mlp, train and chain-moving workloads; with -short one. The
// full campaign, every index of every site over random and pingpong
// buffers, takes seconds without the race detector:
//
//	go test -run TestFaultCampaign -v ./faultcampaign
//	go test -run TestFaultCampaign -v ./faultcampaign -args -campaign.full
func TestFaultCampaign(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := faultcampaign.Config{PerSite: 2}
	switch {
	case *full:
		cfg.PerSite = 0
		cfg.Patterns = []workload.Pattern{workload.Random, workload.PingPong}
	case raceEnabled:
		cfg.Workloads = []string{"mlp", "train", "chain-moving"}
		cfg.PerSite = 1
	}
	if testing.Short() && !*full {
		cfg.PerSite = 1
	}
	cfg.Progress = func(c faultcampaign.Cell) {
		t.Logf("%-13s %-9s %-21s sites %4d tried %4d injected %4d failed %d (%v)", c.Workload, c.Pattern, c.Variant,
			c.Sites, c.Tried, c.Injected(), c.Counts[faultcampaign.Failed], c.Duration.Round(time.Millisecond))
	}
	rep, err := faultcampaign.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fault campaign summary:\n%s", rep.Table())
	for _, c := range rep.Cells {
		for _, f := range c.Faults {
			if f.Outcome != faultcampaign.Failed {
				t.Logf("  %s", f)
			}
		}
	}
	for _, f := range rep.Failures() {
		t.Errorf("%s", f)
	}
	if rep.Goroutines > 0 {
		t.Errorf("%d goroutines left behind by the campaign", rep.Goroutines)
	}
}

// TestFaultCampaignRemap sweeps every call index of every site of the
// remap strategy (its per-step event wait, unmap, map and set access
// included) over random and pingpong buffers, on the workloads the
// reduced campaign samples: the new entry points at every index, in CI.
// Under the race detector, mlp and random buffers only.
func TestFaultCampaignRemap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := faultcampaign.Config{
		Workloads: []string{"mlp", "train", "chain-moving"},
		Variants:  []faultcampaign.Variant{{Name: "remap", Options: sg.Options{Strategy: sg.StrategyRemap}}},
		Patterns:  []workload.Pattern{workload.Random, workload.PingPong},
	}
	if raceEnabled || testing.Short() {
		cfg.Workloads, cfg.Patterns = []string{"mlp"}, []workload.Pattern{workload.Random}
	}
	rep, err := faultcampaign.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("remap fault sweep:\n%s", rep.Table())
	var injected int
	for _, c := range rep.Cells {
		injected += c.Injected()
		for _, f := range c.Faults {
			if f.Outcome != faultcampaign.Failed {
				t.Logf("  %s", f)
			}
		}
	}
	for _, f := range rep.Failures() {
		t.Errorf("%s", f)
	}
	// Each step that moves buffers remaps them: the sweep must have
	// failed the remap's own driver calls.
	for _, op := range []string{"EventQuery", "MemUnmap", "MemMap", "MemSetAccess", "MemAddressReserve", "EventRecord"} {
		if !hasSite(rep, op) {
			t.Errorf("no fault was injected into %s", op)
		}
	}
	if injected == 0 || rep.Goroutines > 0 {
		t.Errorf("%d faults injected, %d goroutines left behind", injected, rep.Goroutines)
	}
}

// hasSite reports whether a fault of the campaign fired in op.
func hasSite(rep *faultcampaign.Report, op string) bool {
	for _, c := range rep.Cells {
		if c.Fired[op] > 0 {
			return true
		}
	}
	return false
}
