package report

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
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
	if got, want := sortedKeys(top), []string{"backend", "device", "results", "steps", "workload"}; !slices.Equal(got, want) {
		t.Errorf("top-level keys %v, want %v", got, want)
	}
	var results []map[string]json.RawMessage
	if err := json.Unmarshal(top["results"], &results); err != nil {
		t.Fatal(err)
	}
	required := []string{"bytes_copied", "graph_updates", "host_us", "outputs_match_eager", "patched_nodes",
		"peak_device_bytes", "rerecords", "step_us", "strategy"}
	for i, res := range results {
		want := slices.Clone(required)
		want = append(want, "host_samples_us", "step_samples_us")
		if i == 1 {
			want = append(want, "wall_us") // optional: only the patch sample has it
		}
		if i == 2 {
			want = append(want, "note")
		}
		slices.Sort(want)
		if got := sortedKeys(res); !slices.Equal(got, want) {
			t.Errorf("result %d keys %v, want %v", i, got, want)
		}
		for _, k := range []string{"step_us", "host_us"} {
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
	if err := sample().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	want := `backend sim, device sim device 0, workload mlp width=256 batch=8 layers=8, 4 steps

strategy  step p50 µs  step p90 µs  host p50 µs  host p90 µs  wall p50 µs  re-records  updates  patched nodes   copied  peak memory  matches eager
--------  -----------  -----------  -----------  -----------  -----------  ----------  -------  -------------  -------  -----------  -------------
eager           122.5        128.5        302.5        308.5            -           0        0              0      0 B      3.0 MiB  yes
patch            1.55         1680         4.75         3502         2.25           0        0             64      0 B      3.0 MiB  yes
record          965.0        994.0         1025         1085            -           4        0              0  1.5 KiB      5.0 MiB  NO

notes:
  record: fell back from pool: no VMM
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
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

func TestPlot(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		r    *Report
	}{
		{"wide", sample()}, // log scale: 1.4 µs to 2400 µs
		{"narrow", func() *Report { r := sample(); r.Results = r.Results[:1]; return r }()},
		{"zero", func() *Report {
			r := sample()
			r.Results[1].StepSamplesUS[1] = 0 // drawn at the floor of the log axis
			return r
		}()},
		{"hostonly", func() *Report {
			r := sample()
			for i := range r.Results {
				r.Results[i].StepSamplesUS = nil
			}
			return r
		}()},
	} {
		png := filepath.Join(dir, tc.name+".png")
		svg := filepath.Join(dir, tc.name+".SVG")
		if err := tc.r.SavePlot(png); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := tc.r.SavePlot(svg); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, err := os.ReadFile(png)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 1000 || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s: not a PNG (%d bytes, starts %q)", tc.name, len(b), b[:min(len(b), 8)])
		}
		b, err = os.ReadFile(svg)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("<?xml")) || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("</svg>")) {
			t.Errorf("%s: not an SVG document: %.200q", tc.name, b)
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
	if !strings.Contains(buf.String(), "0 B  -\n") || strings.Contains(buf.String(), "NO") {
		t.Errorf("unchecked result shown as a mismatch:\n%s", buf.String())
	}
}
