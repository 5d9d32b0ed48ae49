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

var (
	full   = flag.Bool("campaign.full", false, "sweep every call index of every site (the full campaign; minutes)")
	every  = flag.Int("campaign.every", 0, "try one site in `k` of each cell (default 3 under the race detector, else 1: all)")
	offset = flag.Int("campaign.offset", 0, "rotate -campaign.every's sample by `n`: the runs with 0 to k-1 try every site")
)

// TestFaultCampaign runs the fault campaign: every strategy and workload,
// each driver entry point the trial reaches failed in turn (see the package
// doc), and logs the summary table. By default it tries at most two call
// indices per (phase, entry point), the first and the last, over random
// buffer movement; under the race detector (CI: go test -race ./...) one
// index, over the mlp, train and chain-moving workloads, and of those sites
// one in three (Config.Every), a different third in neighbouring cells;
// with -short one index. The full campaign, every index of every site over
// random and pingpong buffers, takes seconds without the race detector:
//
//	go test -run TestFaultCampaign -v ./faultcampaign
//	go test -run TestFaultCampaign -v ./faultcampaign -args -campaign.full
//	go test -race -run TestFaultCampaign -v ./faultcampaign -args -campaign.offset 1   # the next third
func TestFaultCampaign(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := faultcampaign.Config{PerSite: 2, Every: *every, Offset: *offset}
	switch {
	case *full:
		cfg.PerSite, cfg.Every = 0, 1
		cfg.Patterns = []workload.Pattern{workload.Random, workload.PingPong}
	case raceEnabled:
		cfg.Workloads = []string{"mlp", "train", "chain-moving"}
		cfg.PerSite = 1
		if cfg.Every == 0 {
			cfg.Every = 3
		}
	}
	if testing.Short() && !*full {
		cfg.PerSite = 1
	}
	if cfg.Every > 1 {
		t.Logf("one site in %d of each cell, rotation offset %d (-campaign.every, -campaign.offset)", cfg.Every, cfg.Offset)
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
