package report

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// TestPairedFloorIsRegimeFree: a row and its floor move together between
// a fast and a slow regime of the host's clock (and of the card's), at
// different moments from the floor row's. The paired median sees the row's
// own 5 µs over the floor and its 5% of GPU time; the floor row's p50
// would not.
func TestPairedFloorIsRegimeFree(t *testing.T) {
	host := []float64{10, 10, 10, 10, 30, 30}
	floorHost := []float64{5, 5, 5, 5, 25, 25}
	lat := []float64{110, 110, 110, 110, 130, 130}
	floorLat := []float64{100, 100, 100, 100, 125, 125}
	gpuUS := []float64{105, 105, 105, 105, 126, 126}
	floorGPU := []float64{100, 100, 100, 100, 120, 120}
	p := NewPairedFloor(2, host, lat, gpuUS, floorHost, floorLat, floorGPU)
	if p == nil || p.HostOverUS != 5 || p.HostUS.P50 != 5 {
		t.Fatalf("paired floor %+v, want host over 5 and the floor's own p50 5", p)
	}
	if p.LatencyRatio != 1.1 {
		t.Errorf("latency ratio %v, want the median over the blocks 1.1", p.LatencyRatio)
	}
	if p.GPURatio != 1.05 || p.GPUUS.P50 != 100 || len(p.GPUSamplesUS) != 6 {
		t.Errorf("GPU ratio %v (floor p50 %v), want the median over the blocks 1.05 and the floor's own p50 100", p.GPURatio, p.GPUUS.P50)
	}
	if NewPairedFloor(2, host, lat, gpuUS, nil, nil, nil) != nil {
		t.Error("a pair without floor samples")
	}
	if q := NewPairedFloor(2, host, nil, nil, floorHost, floorLat, floorGPU); q == nil || q.LatencyRatio != 0 || q.GPURatio != 0 {
		t.Errorf("a pair without the row's latency and GPU samples: %+v, want host alone", q)
	}
	if q := NewPairedFloor(2, host[:1], lat[:1], gpuUS[:1], floorHost[:1], floorLat[:1], floorGPU[:1]); q == nil || q.HostOverUS != 5 || q.LatencyRatio != 1.1 {
		t.Errorf("one step: %+v, want it taken alone", q)
	}
	// The floor row ran in the slow regime: 25 µs.
	r := &Report{Results: []Result{
		{Strategy: "patch", MovedNodesPerStep: 2, PairedFloor: p, StepUS: Percentiles{P50: 90}},
		{Strategy: "device", MovedNodesPerStep: 1, StepUS: Percentiles{P50: 90}},
		{Strategy: FloorRow, StepUS: Percentiles{P50: 90}, LatencyUS: &Percentiles{P50: 125}},
	}}
	r.Results[0].SetSamples([]float64{90, 90, 90, 90, 90, 90}, host)
	r.Results[0].SetLatency(lat)
	r.Results[1].SetSamples([]float64{90, 90, 90, 90, 90, 90}, []float64{27, 27, 27, 27, 27, 27})
	r.Results[2].SetSamples([]float64{90, 90, 90, 90, 90, 90}, []float64{25, 25, 25, 25, 25, 25})
	r.SetFloor()
	if o := r.Results[0].HostOverFloorUS; o == nil || *o != 5 || *r.Results[0].HostUSPerMovedNode != 2.5 {
		t.Errorf("paired row: host over floor %v, want 5 (2.5 a moved node)", o)
	}
	if o := r.Results[1].HostOverFloorUS; o == nil || *o != 2 {
		t.Errorf("unpaired row: host over floor %v, want 2 from the floor row", o)
	}
	var b bytes.Buffer
	r.writeAgainstFloor(&b, "GPU", "host", "latency", "wall")
	out := b.String()
	if !strings.Contains(out, "floor's step timed beside each of the row's") {
		t.Errorf("the table does not say its figures are paired:\n%s", out)
	}
	patch := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "patch") {
			patch = l
		}
	}
	if f := strings.Fields(patch); len(f) < 7 || f[2] != "1.05×" || f[3] != "1.10×" || f[4] != "5.00" || f[6] != "2.50" {
		t.Errorf("patch's row %q: want GPU 1.05× and latency 1.10× the floor (paired) and 5 µs over it", patch)
	}
}

// TestPairedFloorLeavesOutTheColdStep: the row's first step of each block
// follows the floor's block and pays for it (their weights evict each
// other's from the card's L2); the rest of the row's steps run 5% longer
// than the floor's, which all ran warm behind an untimed step. The blocks
// compare the warm steps alone: 1.05, where the first steps would add
// their cost to every block. The last block is short.
func TestPairedFloorLeavesOutTheColdStep(t *testing.T) {
	const block, steps = 8, 43
	var gpuUS, floorGPU, host, floorHost []float64
	for i := range steps {
		floor := 100 + float64(i%3)
		row := 1.05 * floor
		rowHost := 7.0
		if i%block == 0 {
			row *= 1.5
			rowHost += 10
		}
		gpuUS, floorGPU = append(gpuUS, row), append(floorGPU, floor)
		host, floorHost = append(host, rowHost), append(floorHost, 5)
	}
	p := NewPairedFloor(block, host, gpuUS, gpuUS, floorHost, floorGPU, floorGPU)
	if p.Block != block {
		t.Errorf("block %d, want %d", p.Block, block)
	}
	if math.Abs(p.GPURatio-1.05) > 1e-9 || math.Abs(p.LatencyRatio-1.05) > 1e-9 {
		t.Errorf("GPU ratio %v, latency ratio %v: want 1.05, the warm steps'", p.GPURatio, p.LatencyRatio)
	}
	if p.HostOverUS != 2 {
		t.Errorf("host over the floor %v, want 2", p.HostOverUS)
	}
}
