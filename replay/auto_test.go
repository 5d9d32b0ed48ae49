package replay_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/vmm"
)

// fanOut is a program whose param x is read by k kernels (a wide block
// reading its input everywhere), into one output y: patching it updates k
// nodes per step, copying it costs two copies.
func fanOut(k int) *stablegraph.Program {
	const n = 64
	p := stablegraph.NewProgram("fan-out")
	x := p.Param("x", 4*n)
	y := p.Output("y", 4*n)
	acc := p.Temp("acc", 4*n)
	p.Memset(acc.All(), 0, 4)
	for range k {
		p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(acc.All()), stablegraph.In(x.All()), stablegraph.F32(0.5), stablegraph.I32(n))
	}
	p.Launch(kernels.Copy, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(acc.All()), stablegraph.I32(n))
	return p
}

// autoOptions reads the options column of testdata/auto_choices.txt.
func autoOptions(t *testing.T, col string) stablegraph.Options {
	t.Helper()
	var o stablegraph.Options
	if col == "-" {
		return o
	}
	for _, kv := range strings.Split(col, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		f := func() float64 {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("option %s: %v", kv, err)
			}
			return x
		}
		switch k {
		case "zero-copy":
			o.Pool.ZeroCopyOutputs = true
		case "pool-memory-fraction":
			o.Costs.PoolMemoryFraction = f()
		case "copy-latency-us":
			o.Costs.CopyLatencyUS = f()
		case "copy-bytes-per-us":
			o.Costs.CopyBytesPerUS = f()
		case "node-update-us":
			o.Costs.NodeUpdateUS = f()
		case "patcher-us": // both patchers
			v := f()
			o.Costs.PatcherUS, o.Costs.PatcherInlineUS = v, v
		default:
			t.Fatalf("unknown option %q", k)
		}
	}
	return o
}

// TestAutoChoice checks what auto chooses on the cases of
// testdata/auto_choices.txt, with the default H100 costs and others, and
// that it says why.
func TestAutoChoice(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	for _, row := range simtest.Table(t, "testdata/auto_choices.txt", 5) {
		k, err := strconv.Atoi(row[1])
		if err != nil {
			t.Fatal(err)
		}
		c := struct {
			name string
			p    *stablegraph.Program
			opts stablegraph.Options
			want stablegraph.Strategy
			says string
		}{row[0], fanOut(k), autoOptions(t, row[2]), stablegraph.Strategy(row[3]), row[4]}
		t.Run(c.name, func(t *testing.T) {
			c.opts.Strategy = stablegraph.StrategyAuto
			c.opts.Auto.ProbeSteps = -1 // the model alone
			exe, err := stablegraph.Compile(ctx, b, c.p, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			ch := exe.Choice()
			if ch.Requested != stablegraph.StrategyAuto || ch.Strategy != c.want || exe.Strategy() != c.want || exe.Stats().Strategy != c.want {
				t.Fatalf("chose %s, want %s; reason: %s", ch.Strategy, c.want, ch.Reason)
			}
			if !strings.Contains(ch.Reason, c.says) || !strings.HasPrefix(ch.Reason, "cheapest modelled step: "+string(c.want)) {
				t.Errorf("reason %q does not say %q", ch.Reason, c.says)
			}
			if len(ch.Candidates) != 4 || ch.Candidates[0].Strategy != c.want {
				t.Fatalf("candidates %+v", ch.Candidates)
			}
			for i := 1; i < len(ch.Candidates); i++ {
				a, b := ch.Candidates[i-1], ch.Candidates[i]
				if (!a.Usable && b.Usable) || (a.Usable == b.Usable && a.Usable && a.StepUS > b.StepUS) {
					t.Errorf("candidates not usable and cheapest first: %+v", ch.Candidates)
				}
			}
			// What was chosen is what runs, and it is what memory says.
			m := exe.Memory()
			if (c.want == stablegraph.StrategyStable) != (m.Persistent > 0) || (c.want == stablegraph.StrategyPool) != (m.Slots > 0) {
				t.Errorf("memory %+v under %s", m, c.want)
			}
		})
	}
	// A strategy asked for by name says so.
	exe, err := stablegraph.Compile(ctx, b, fanOut(1), stablegraph.Options{Strategy: stablegraph.StrategyStable})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	if ch := exe.Choice(); ch.Requested != stablegraph.StrategyStable || ch.Strategy != stablegraph.StrategyStable || ch.Reason != "requested" || ch.Candidates != nil {
		t.Errorf("choice %+v", ch)
	}
}

// TestAutoFallsBack: when the chosen strategy cannot be built because the
// device runs out of memory, auto takes the next and records why; any
// other failure is returned. Nothing leaks either way.
func TestAutoFallsBack(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	// The patcher priced out, so that the model's order is pool, stable.
	opts := stablegraph.Options{Strategy: stablegraph.StrategyAuto, Costs: stablegraph.Costs{PatcherUS: 100, PatcherInlineUS: 100}, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{ZeroCopyOutputs: true, Slots: 3}}}
	b.InjectFault("MemCreate", 1, gpu.ErrOutOfMemory)
	exe, err := stablegraph.Compile(ctx, b, fanOut(60), opts)
	b.ClearFaults()
	if err != nil {
		t.Fatal(err)
	}
	ch := exe.Choice()
	if ch.Strategy != stablegraph.StrategyStable || !strings.Contains(ch.Reason, "fell back because pool failed to build") {
		t.Errorf("chose %s: %s", ch.Strategy, ch.Reason)
	}
	if live := b.LiveHandles(); live.Chunks != 0 || live.Mappings != 0 || live.Reservations != 0 {
		t.Errorf("the failed pool left %s", live)
	}
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
	b.InjectFault("MemCreate", 0, nil)
	if exe, err := stablegraph.Compile(ctx, b, fanOut(60), opts); !errors.Is(err, gpu.ErrInjected) {
		if err == nil {
			exe.Close()
		}
		t.Errorf("auto with a pool failing for another reason = %v, want the error", err)
	}
	b.ClearFaults()
}

func TestPersistentOptions(t *testing.T) {
	b := simtest.New(t, 1)
	p := fanOut(1)
	for _, o := range []stablegraph.Options{
		{StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: -1}}},
		{StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: stablegraph.MaxPoolSlots + 1}}},
		{SlotWait: -time.Second},
		{Costs: stablegraph.Costs{NodeUpdateUS: -1}}, {Costs: stablegraph.Costs{PoolMemoryFraction: 2}},
		{Costs: stablegraph.Costs{PatcherUS: -1}}, {Costs: stablegraph.Costs{PatcherNodeUS: -1}},
		{SlotPoll: vmm.WaitPolicy{MinSleep: -time.Microsecond}},
		{StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: stablegraph.MaxAutoProbeSteps + 1}}},
		{StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{Bound: "fastest"}}},
	} {
		if exe, err := stablegraph.Compile(context.Background(), b, p, o); err == nil {
			exe.Close()
			t.Errorf("Compile accepted %+v", o)
		}
	}
	want := []stablegraph.Strategy{"eager", "record", "update", "patch", "device", "stable", "pool", "remap", "auto"}
	if got := stablegraph.Strategies(); !slices.Equal(got, want) {
		t.Errorf("Strategies() = %v", got)
	}
	for _, s := range want {
		if got, err := stablegraph.ParseStrategy(string(s)); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", s, got, err)
		}
	}
	if d := stablegraph.DefaultCosts(); d.NodeUpdateUS != 0.75 || d.TimelineWriteUS != 1 || d.PatcherUS != 4.4 || d.PatcherNodeUS != 0.03 {
		t.Errorf("default costs %+v", d)
	}
}
