package workload

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda"
)

// driverClock is the CUDA backend with a clock around the two driver calls
// a replayed step makes on the host: exec updates of kernel nodes and graph
// launches. It embeds the backend, so every capability stays visible.
type driverClock struct {
	*cuda.Backend
	update, launch time.Duration
	updates        int
}

func (d *driverClock) GraphExecKernelNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error {
	t0 := time.Now()
	err := d.Backend.GraphExecKernelNodeSetParams(x, n, p)
	d.update += time.Since(t0)
	d.updates++
	return err
}

func (d *driverClock) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	t0 := time.Now()
	err := d.Backend.GraphLaunch(x, s)
	d.launch += time.Since(t0)
	return err
}

// BenchmarkCUDAStepHost takes a step's host time apart: for patch and
// device, fixed and fresh addresses, on mlp, mlp-large and train, the p50
// of Run's host time, of the exec updates it made (and how many), of the
// graph launch, and of the rest (the runtime's own work and the other
// driver calls). One iteration is one step: inputs bound (not timed), Run,
// a stream synchronization. BENCHMARKS.md section 0 quotes it.
func BenchmarkCUDAStepHost(bm *testing.B) {
	b, _, err := gpu.Open("cuda", gpu.Config{})
	if err != nil {
		bm.Skipf("no CUDA here: %v", err)
	}
	defer b.Close()
	cb, ok := b.(*cuda.Backend)
	if !ok {
		bm.Skipf("backend %T is not the CUDA backend", b)
	}
	ctx := context.Background()
	for _, name := range []string{"mlp", "mlp-large", "train"} {
		for _, pat := range []Pattern{Fixed, Random} {
			for _, st := range []sg.Strategy{sg.StrategyPatch, sg.StrategyDevice} {
				bm.Run(fmt.Sprintf("%s/%s/%s", name, pat, st), func(bm *testing.B) {
					stepHost(ctx, bm, &driverClock{Backend: cb}, name, pat, st)
				})
			}
		}
	}
}

func stepHost(ctx context.Context, bm *testing.B, d *driverClock, name string, pat Pattern, st sg.Strategy) {
	w, err := New(name, Config{})
	if err != nil {
		bm.Fatal(err)
	}
	c, err := NewCaller(d, 0, w, pat, 1)
	if err != nil {
		bm.Fatal(err)
	}
	defer c.Close()
	exe, err := sg.Compile(ctx, d, w.Program, sg.Options{Strategy: st})
	if err != nil {
		bm.Fatal(err)
	}
	defer exe.Close()
	for _, s := range w.States {
		if err := exe.WriteBuffer(ctx, s.Buffer, s.Data); err != nil {
			bm.Fatal(err)
		}
	}
	s, err := d.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		bm.Fatal(err)
	}
	defer d.StreamDestroy(s)
	var run, upd, launch []float64
	updates := 0
	for step := 0; bm.Loop(); step++ {
		bind, err := c.Bind(step)
		if err != nil {
			bm.Fatal(err)
		}
		d.update, d.launch, d.updates = 0, 0, 0
		t0 := time.Now()
		outs, err := exe.Run(ctx, s, bind)
		host := time.Since(t0)
		if err != nil {
			bm.Fatal(err)
		}
		if err := d.StreamSynchronize(s); err != nil {
			bm.Fatal(err)
		}
		outs.Release()
		if step < 10 { // recording, probing templates
			continue
		}
		run = append(run, us(host))
		upd = append(upd, us(d.update))
		launch = append(launch, us(d.launch))
		updates += d.updates
	}
	if len(run) == 0 {
		return
	}
	r, u, l := p50(run), p50(upd), p50(launch)
	bm.ReportMetric(r, "run-µs")
	bm.ReportMetric(u, "updates-µs")
	bm.ReportMetric(float64(updates)/float64(len(run)), "updates/step")
	bm.ReportMetric(l, "launch-µs")
	bm.ReportMetric(r-u-l, "rest-µs")
}

func p50(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}
