package main

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stablegraph/stablegraph/drivercost"
)

func benchDriverCommand() *command {
	return &command{
		name:    "bench-driver",
		summary: "measure driver operation costs on the backend (on cuda, beside the H100 reference)",
		detail: `Measures, through the backend-neutral gpu interface, what stablegraph's building
blocks cost: stream and event creation, VMM create/reserve/map/set access/
unmap/free/release at 2 MiB and 64 MiB, MemAlloc/MemFree, stream value writes
until the host sees them, device copies (GPU time by events), and graphs of K
tiny kernels (capture, instantiate, launch, replay vs eager launches, exec
update, re-capture + update, per-node parameter updates), the host side of a
moving step at the driver's own price (exec updates of kernel nodes by
parameter block size --param-bytes, in chains of --update-nodes, with the
graph idle and while it runs, through GraphExecKernelNodeSetParams and the
prepared node sets patch uses; steps of m updates and a launch back to back;
whole-graph updates from a host template, per node; the launch of the chain
beside the same chain with every node device-updatable), FuncParamInfo, and
the remap strategy's per-step calls: unmap, map and set access of a granule
(and set access for every device, on several), and whole steps of N moved
buffers (--remap-buffers).

Each row gives the median and p90 in microseconds; on hardware beside the
reference figure measured on the project's H100 (docs/GPU-MACHINE.md). On the sim
backend the times are simulated (its model on this CPU), not a GPU
measurement: they are labelled so and never set beside the H100 figures.
Progress goes to stderr, the table to stdout. The command fails if any handle
is still live at the end.`,
		flags: func(fs *flag.FlagSet) func(*env) error {
			var o drivercost.Options
			fs.IntVar(&o.Device, "device", 0, "device ordinal to measure")
			fs.IntVar(&o.Iterations, "iters", 1000, "samples of each cheap row")
			fs.IntVar(&o.HeavyIterations, "heavy-iters", 50, "samples of the 64 MiB rows and the 112-stream batches")
			fs.IntVar(&o.GraphIterations, "graph-iters", 50, "samples of each graph row (K < 100 runs proportionally more)")
			ks := fs.String("ks", "10,100,1000", "graph sizes `K`, comma-separated")
			remapN := fs.String("remap-buffers", "1,4,16,64", "moved buffers `N` of the remap step rows, comma-separated")
			paramBytes := fs.String("param-bytes", "24,152,360,1024", "parameter block sizes `P` of the node update rows, comma-separated (24 plus a multiple of 8)")
			updateNodes := fs.String("update-nodes", "16,200", "chain lengths `K` of the node update rows, comma-separated")
			fs.IntVar(&o.UpdateIterations, "update-iters", 20, "samples of each node update row")
			sections := fs.String("sections", "", "comma-separated `list` of the sections to run (default all: "+strings.Join(drivercost.SectionNames(), ", ")+")")
			fs.DurationVar(&o.PollTimeout, "poll-timeout", time.Second, "deadline for the host to see a stream value write")
			jsonPath := fs.String("json", "", "also write the results as JSON to `file` (\"-\": stdout, instead of the table)")
			return func(e *env) error {
				var err error
				if o.Ks, err = parseInts(*ks); err != nil {
					return usagef("--ks: %v", err)
				}
				if o.RemapBuffers, err = parseInts(*remapN); err != nil {
					return usagef("--remap-buffers: %v", err)
				}
				if o.ParamBytes, err = parseInts(*paramBytes); err != nil {
					return usagef("--param-bytes: %v", err)
				}
				for _, p := range o.ParamBytes {
					if p < 24 || (p-24)%8 != 0 {
						return usagef("--param-bytes: %d is not 24 plus a multiple of 8", p)
					}
				}
				if o.UpdateNodes, err = parseInts(*updateNodes); err != nil {
					return usagef("--update-nodes: %v", err)
				}
				for _, name := range strings.Split(*sections, ",") {
					if name = strings.TrimSpace(name); name == "" {
						continue
					}
					if !slices.Contains(drivercost.SectionNames(), name) {
						return usagef("--sections: no section %q (%s)", name, strings.Join(drivercost.SectionNames(), ", "))
					}
					o.Sections = append(o.Sections, name)
				}
				if o.Iterations <= 0 || o.HeavyIterations <= 0 || o.GraphIterations <= 0 || o.UpdateIterations <= 0 {
					return usagef("iteration counts must be positive")
				}
				if err := checkOutput("--json", *jsonPath); err != nil {
					return err
				}
				return benchDriver(e, o, *jsonPath)
			}
		},
	}
}

func benchDriver(e *env, o drivercost.Options, jsonPath string) (err error) {
	b, reason, err := e.open()
	if err != nil {
		return err
	}
	defer closeBackend(b, &err)
	if o.Device < 0 || o.Device >= b.DeviceCount() {
		return usagef("--device %d: backend %s has %s", o.Device, b.Name(), plural(b.DeviceCount(), "device", "devices"))
	}
	e.progress("bench-driver: backend %s", shortReason(reason))
	o.Progress, o.Logger = e.stderr, e.log
	res, err := drivercost.Run(e.ctx, b, o)
	if err != nil {
		return err
	}
	e.progress("bench-driver: done in %.1f s", res.ElapsedS)
	if jsonPath == "-" {
		return res.WriteJSON(e.stdout)
	}
	if err := res.WriteTable(e.stdout); err != nil {
		return err
	}
	if jsonPath != "" {
		if err := e.writeOutput(jsonPath, res.WriteJSON); err != nil {
			return fmt.Errorf("write %s: %w", jsonPath, err)
		}
		e.progress("bench-driver: wrote %s", jsonPath)
	}
	return nil
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}
