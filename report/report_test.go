package report

import (
	"bytes"
	"encoding/json"
	"html"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func sample() *Report {
	r := &Report{Backend: "sim", Device: "sim device 0", Workload: "mlp width=256 batch=8 layers=8", Steps: 4}
	eager := Result{Strategy: "eager", PeakDeviceBytes: 3 << 20, OutputsMatchEager: true}
	eager.SetSamples([]float64{120, 110, 130, 125}, []float64{300, 310, 290, 305})
	patch := Result{Strategy: "patch", PatchedNodes: 64, GraphUpdates: 0, PeakDeviceBytes: 3 << 20, OutputsMatchEager: true}
	patch.SetSamples([]float64{2400, 1.5, 1.4, 1.6}, []float64{5000, 4, 5, 4.5})
	patch.WallUS = &Percentiles{P50: 2.25, P90: 2.5}
	patch.SetLatency([]float64{7405, 6.5, 6.25, 6.75})
	patch.GPUTiming = GPUTimingGated
	rec := Result{Strategy: "record", Rerecords: 4, BytesCopied: 1536, PeakDeviceBytes: 5 << 20, Note: "fell back from pool: no VMM"}
	rec.SetSamples([]float64{900, 950, 1000, 980}, []float64{1000, 1100, 1050, 990})
	r.Results = []Result{eager, patch, rec}
	return r
}

func TestPercentile(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		p    float64
		want float64
	}{
		{nil, 50, 0},
		{[]float64{7}, 90, 7},
		{[]float64{3, 1, 2}, 50, 2},
		{[]float64{4, 1, 3, 2}, 50, 2.5},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90, 9.1},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0, 1},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 100, 10},
		{[]float64{1, 2}, 150, 2}, // clamped
	} {
		in := slices.Clone(tc.in)
		got := Percentile(in, tc.p)
		if math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.in, tc.p, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("Percentile modified its input: %v", in)
		}
	}
}

func TestJSONFieldNames(t *testing.T) {
	var buf bytes.Buffer
	if err := sample().WriteJSON(&buf, true); err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &top); err != nil {
		t.Fatal(err)
	}
	if got, want := sortedKeys(top), []string{"backend", "device", "results", "simulated", "steps", "workload"}; !slices.Equal(got, want) {
		t.Errorf("top-level keys %v, want %v", got, want)
	}
	var results []map[string]json.RawMessage
	if err := json.Unmarshal(top["results"], &results); err != nil {
		t.Fatal(err)
	}
	required := []string{"bytes_copied", "graph_updates", "host_us", "moved_nodes_per_step", "outputs_match_eager", "patched_nodes",
		"peak_device_bytes", "rerecords", "step_us", "strategy", "traces_captured"}
	for i, res := range results {
		want := slices.Clone(required)
		want = append(want, "host_samples_us", "step_samples_us")
		if i == 1 {
			// optional: only the patch sample has them
			want = append(want, "wall_us", "latency_us", "latency_samples_us", "gpu_timing")
		}
		if i == 2 {
			want = append(want, "note")
		}
		slices.Sort(want)
		if got := sortedKeys(res); !slices.Equal(got, want) {
			t.Errorf("result %d keys %v, want %v", i, got, want)
		}
		pcts := []string{"step_us", "host_us"}
		if i == 1 {
			pcts = append(pcts, "latency_us", "wall_us")
		}
		for _, k := range pcts {
			var pct map[string]float64
			if err := json.Unmarshal(res[k], &pct); err != nil {
				t.Fatal(err)
			}
			if got := sortedMapKeys(pct); !slices.Equal(got, []string{"p50", "p90"}) {
				t.Errorf("%s keys %v, want [p50 p90]", k, got)
			}
		}
	}

	// Without samples, exactly the required keys (plus note where set).
	buf.Reset()
	if err := sample().WriteJSON(&buf, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "samples") {
		t.Errorf("samples written although withSamples is false:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), `"step_us": {`) || !strings.Contains(buf.String(), `"outputs_match_eager": true`) {
		t.Errorf("unexpected JSON:\n%s", buf.String())
	}
}

func TestJSONRoundTrip(t *testing.T) {
	in := sample()
	var buf bytes.Buffer
	if err := in.WriteJSON(&buf, true); err != nil {
		t.Fatal(err)
	}
	out, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip changed the report:\n in %+v\nout %+v", in, out)
	}
	if _, err := ReadJSON(strings.NewReader(`{"backend":"sim","stepz":3}`)); err == nil {
		t.Error("ReadJSON accepted an unknown field")
	}
	if p, ok := out.Result("patch"); !ok || p.PatchedNodes != 64 {
		t.Errorf("Result(patch) = %+v, %v", p, ok)
	}
}

func TestTable(t *testing.T) {
	var buf bytes.Buffer
	r := sample()
	r.Backend, r.Device = "cuda", "NVIDIA H100"
	r.Results[1].TracesCaptured = 3
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	want := `backend cuda, device NVIDIA H100, workload mlp width=256 batch=8 layers=8, 4 steps

strategy  GPU p50 µs  GPU p90 µs  host p50 µs  host p90 µs  latency p50 µs  wall p50 µs  re-records  updates  patched nodes  traces captured  copied   peak memory  matches eager
eager     122.5       128.5       302.5        308.5        -               -            0           0        0              0                0 B      3.0 MiB      yes
patch     1.55        1680        4.75         3502         6.62            2.25         0           0        64             3                0 B      3.0 MiB      yes
record    965.0       994.0       1025         1085         -               -            4           0        0              0                1.5 KiB  5.0 MiB      NO

notes:
  record: fell back from pool: no VMM
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

// TestTableSimulated: on a simulator the table says the times are
// simulated, in its header and in every time column's name, and never
// calls them GPU time.
func TestTableSimulated(t *testing.T) {
	r := sample()
	r.Simulated = true
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(buf.String(), "\n")
	if lines[1] != SimulatedNote {
		t.Errorf("second line %q, want the simulated note", lines[1])
	}
	header := lines[3]
	for _, col := range []string{"sim step p50 µs", "sim step p90 µs", "sim host p50 µs", "sim host p90 µs", "sim latency p50 µs", "sim wall p50 µs"} {
		if !strings.Contains(header, col) {
			t.Errorf("header lacks %q: %s", col, header)
		}
	}
	if strings.Contains(buf.String(), "GPU p") {
		t.Errorf("a simulated table speaks of GPU time:\n%s", buf.String())
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"simulated": true`) {
		t.Errorf("JSON lacks simulated: true:\n%s", js.String())
	}
	if !SimulatedBackend("sim") || SimulatedBackend("cuda") {
		t.Error("SimulatedBackend: sim must be simulated and cuda not")
	}
}

func TestFormat(t *testing.T) {
	for in, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB", 2 << 40: "2.0 TiB", 3 << 50: "3072.0 TiB"} {
		if got := FormatBytes(in); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[float64]string{0.333: "0.33", 12.34: "12.3", 1234.5: "1234", -5: "-5.00"} {
		if got := FormatUS(in); got != want {
			t.Errorf("FormatUS(%v) = %q, want %q", in, got, want)
		}
	}
}

// withFloor is a report with a floor row: every ratio is known exactly.
func withFloor() *Report {
	r := &Report{Backend: "cuda", Device: "NVIDIA H100", Workload: "mlp", Steps: 10}
	floor := Result{Strategy: FloorRow, WallUS: &Percentiles{P50: 50, P90: 51}}
	floor.SetSamples([]float64{100, 100, 100, 100, 100}, []float64{5, 5, 5, 5, 5})
	patch := Result{Strategy: "patch", WallUS: &Percentiles{P50: 75, P90: 80}}
	patch.SetSamples([]float64{150, 150, 150, 150, 150}, []float64{9, 9, 9, 9, 9})
	eager := Result{Strategy: "eager", WallUS: &Percentiles{P50: 200, P90: 220}}
	eager.SetSamples([]float64{300, 250, 400, 350, 500}, []float64{90, 90, 90, 90, 90})
	failed := Result{Strategy: "pool", Note: "failed: no VMM"}
	r.Results = []Result{eager, patch, failed, floor}
	return r
}

// svgTexts renders r as SVG and returns the text of every text element.
func svgTexts(t *testing.T, r *Report) []string {
	t.Helper()
	var buf bytes.Buffer
	if err := r.WritePlot(&buf, "svg"); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`>([^<>]*)</text>`).FindAllStringSubmatch(buf.String(), -1) {
		out = append(out, html.UnescapeString(m[1]))
	}
	return out
}

// TestPlotRatios: with a floor row, every strategy is drawn as its ratio to
// the floor, wall time (p50) in one panel and GPU time (p50, whiskers
// p10-p90) in the other, each marker labelled with its ratio; a strategy
// without samples says so; the axis is marked at the floor (1×).
func TestPlotRatios(t *testing.T) {
	texts := svgTexts(t, withFloor())
	count := func(s string) int {
		n := 0
		for _, x := range texts {
			if x == s {
				n++
			}
		}
		return n
	}
	for label, want := range map[string]int{
		"1.00×": 2, // the floor, in both panels
		"1.50×": 2, // patch: 75/50 wall, 150/100 GPU
		"4.00×": 1, // eager's wall: 200/50
		"3.50×": 1, // eager's GPU p50: 350/100
		"1×":    2, // each panel's axis marks the floor
		// Row labels, once (left panel).
		"eager": 1, "patch": 1, "pool": 1, FloorRow: 1,
		// pool: no GPU samples, no wall time.
		"no samples (see the notes)": 1, "not measured": 1,
	} {
		if got := count(label); got != want {
			t.Errorf("%q drawn %d times, want %d; texts: %q", label, got, want, texts)
		}
	}
	joined := strings.Join(texts, "\n")
	for _, want := range []string{"1× is the floor", "GPU time per step (events), p50 with p10–p90 whiskers, ÷ the floor's p50",
		"wall time per step (steps back to back), p50, ÷ the floor's p50"} {
		if !strings.Contains(joined, want) {
			t.Errorf("chart lacks %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "simulated") {
		t.Errorf("a cuda chart says simulated:\n%s", joined)
	}
}

// TestPlotMicroseconds: without a floor row the axis is microseconds, and
// a simulated report says so in the title and the axis labels.
func TestPlotMicroseconds(t *testing.T) {
	r := sample()
	r.Simulated = true
	joined := strings.Join(svgTexts(t, r), "\n")
	for _, want := range []string{"122.5 µs", "1.55 µs", "965.0 µs", "2.25 µs", SimulatedNote,
		"simulated time per step, p50 with p10–p90 whiskers (µs)", "simulated wall time per step (steps back to back), p50 (µs)"} {
		if !strings.Contains(joined, want) {
			t.Errorf("chart lacks %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "×") || strings.Contains(joined, "GPU time") {
		t.Errorf("a chart without a floor shows ratios, or a simulated one GPU time:\n%s", joined)
	}

	host := sample()
	for i := range host.Results {
		host.Results[i].StepSamplesUS = nil
	}
	if joined := strings.Join(svgTexts(t, host), "\n"); !strings.Contains(joined, "host time per step") {
		t.Errorf("host-only chart not labelled host time:\n%s", joined)
	}
}

func TestPlotFiles(t *testing.T) {
	dir := t.TempDir()
	for name, r := range map[string]*Report{"floor": withFloor(), "us": sample()} {
		png := filepath.Join(dir, name+".png")
		svg := filepath.Join(dir, name+".SVG")
		if err := r.SavePlot(png); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := r.SavePlot(svg); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := os.ReadFile(png)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 1000 || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s: not a PNG (%d bytes, starts %q)", name, len(b), b[:min(len(b), 8)])
		}
		b, err = os.ReadFile(svg)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("<?xml")) || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("</svg>")) {
			t.Errorf("%s: not an SVG document: %.200q", name, b)
		}
	}

	if err := sample().SavePlot(filepath.Join(dir, "x.gif")); err == nil {
		t.Error("SavePlot accepted .gif")
	}
	empty := &Report{Backend: "sim", Results: []Result{{Strategy: "eager"}}}
	path := filepath.Join(dir, "empty.png")
	if err := empty.SavePlot(path); err == nil {
		t.Error("SavePlot of a report without samples succeeded")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("partial plot file left behind: %v", err)
	}
	bad := sample()
	bad.Results[0].StepSamplesUS[0] = math.NaN()
	if err := bad.WritePlot(&bytes.Buffer{}, "png"); err == nil {
		t.Error("WritePlot accepted a NaN sample")
	}
}

// TestTicks: round steps, no more decimals than the step needs, whole
// numbers once the step is 1 or more, the floor marked on a ratio axis.
func TestTicks(t *testing.T) {
	labels := func(tk niceTicks, lo, hi float64) string {
		var l []string
		for _, x := range tk.Ticks(lo, hi) {
			l = append(l, x.Label)
		}
		return strings.Join(l, " ")
	}
	for _, tc := range []struct {
		tk     niceTicks
		lo, hi float64
		want   string
	}{
		{niceTicks{suffix: "×", from: 1, mark1: true}, 0.96, 3.2, "1× 1.5× 2× 2.5× 3×"},
		{niceTicks{suffix: "×", from: 1, mark1: true}, 0.9, 9.3, "1× 2× 4× 6× 8×"}, // the floor, though the step is 2
		{niceTicks{suffix: "×", from: 1, mark1: true}, 1, 1.1, "1× 1.02× 1.04× 1.06× 1.08× 1.1×"},
		{niceTicks{}, 0, 230, "0 50 100 150 200"},
		{niceTicks{}, 0, 12000, "0 2000 4000 6000 8000 10000 12000"},
	} {
		if got := labels(tc.tk, tc.lo, tc.hi); got != tc.want {
			t.Errorf("ticks of [%v, %v]: %q, want %q", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func sortedKeys(m map[string]json.RawMessage) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

func sortedMapKeys(m map[string]float64) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

func TestTableUnchecked(t *testing.T) {
	r := &Report{Backend: "sim", Results: []Result{{Strategy: "patch", Unchecked: true, Note: "not compared"}}}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(strings.SplitAfter(buf.String(), "\n")[3], "  -\n") || strings.Contains(buf.String(), "NO") {
		t.Errorf("unchecked result shown as a mismatch:\n%s", buf.String())
	}
}

// TestAgainstFloor: with a floor row, SetFloor gives every strategy its
// host time over the floor's and, when it moved nodes, per moved node, and
// the table sets wall, GPU and latency over the floor side by side with
// the host time per moved node beside the node update probe's.
func TestAgainstFloor(t *testing.T) {
	lat := func(v float64) *Percentiles { return &Percentiles{P50: v, P90: v} }
	r := &Report{Backend: "cuda", Device: "H200", Workload: "chain-moving", Steps: 10,
		NodeUpdates: &NodeUpdateProbe{ParamBytes: 360, Nodes: 16, Samples: 20, IdleUS: 0.4, InFlightUS: 0.5},
		Results: []Result{
			{Strategy: "patch", StepUS: Percentiles{P50: 780}, HostUS: Percentiles{P50: 508}, LatencyUS: lat(1300), WallUS: lat(800), MovedNodesPerStep: 1000},
			{Strategy: "stable", StepUS: Percentiles{P50: 779}, HostUS: Percentiles{P50: 10}, LatencyUS: lat(800), WallUS: lat(781)},
			{Strategy: FloorRow, StepUS: Percentiles{P50: 770}, HostUS: Percentiles{P50: 8}, LatencyUS: lat(780), WallUS: lat(775)},
		}}
	r.SetFloor()
	p := r.Results[0]
	if p.HostOverFloorUS == nil || *p.HostOverFloorUS != 500 || p.HostUSPerMovedNode == nil || *p.HostUSPerMovedNode != 0.5 {
		t.Fatalf("patch against the floor: %v, %v", p.HostOverFloorUS, p.HostUSPerMovedNode)
	}
	if s := r.Results[1]; s.HostOverFloorUS == nil || *s.HostOverFloorUS != 2 || s.HostUSPerMovedNode != nil {
		t.Errorf("stable against the floor: %v, %v", s.HostOverFloorUS, s.HostUSPerMovedNode)
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"0.50 µs per node in flight", "wall ×floor", "latency ×floor", "1.03×", "1.67×", "500.0", "1.00×"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	// No floor: nothing to set, no such table.
	r.Results = r.Results[:2]
	r.Results[0].HostOverFloorUS = nil
	r.SetFloor()
	buf.Reset()
	if err := r.WriteTable(&buf); err != nil || r.Results[0].HostOverFloorUS != nil || strings.Contains(buf.String(), "against the floor") {
		t.Errorf("without a floor: %v, %v\n%s", err, r.Results[0].HostOverFloorUS, buf.String())
	}
}
