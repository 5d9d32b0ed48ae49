package report

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/stablegraph/stablegraph/internal/atomicfile"
)

// The chart answers one question at a glance: how far above the floor is
// each strategy's time per step? One row per strategy (labelled on the
// left, each with its own colour and marker), a dashed line at the floor
// (1×), the figure written beside every marker. With wall times (steps
// back to back) a left panel shows their p50 against the floor's; the
// right panel shows time per step (GPU time by events) as its p50 with
// whiskers from p10 to p90. Without a floor row the axis is microseconds.

// Chart geometry.
const (
	chartWidth  = 10 * vg.Inch
	chartRow    = 0.42 * vg.Inch // height per strategy
	chartTitle  = 0.95 * vg.Inch // the title lines
	chartAxis   = 0.85 * vg.Inch // the x axis and its label
	chartDPI    = 144
	markerSize  = 5 // points
	labelSize   = 10
	tickTargets = 6 // about this many ticks per axis
)

// palette holds distinct colours (Tableau 10), one per row; shapes the
// markers, so that rows differ also without colour.
var (
	palette = []color.RGBA{
		{0x1f, 0x77, 0xb4, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xd6, 0x27, 0x28, 0xff},
		{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x3b, 0x3b, 0x3b, 0xff},
		{0xbc, 0xbd, 0x22, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
	}
	shapes = []draw.GlyphDrawer{
		draw.CircleGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{}, draw.RingGlyph{},
		draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.CrossGlyph{}, draw.PlusGlyph{},
	}
)

// PlotFormat returns the image format for path from its extension: "png"
// or "svg". Other extensions are an error.
func PlotFormat(path string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".png", ".svg":
		return ext[1:], nil
	default:
		return "", fmt.Errorf("report: plot %s: unsupported extension %q (use .png or .svg)", path, ext)
	}
}

// SavePlot draws r's chart (see WritePlot) to path, as PNG or SVG by its
// extension, whole or not at all: on error the file that was there is
// left as it was (internal/atomicfile).
func (r *Report) SavePlot(path string) error {
	format, err := PlotFormat(path)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, func(w io.Writer) error { return r.WritePlot(w, format) }); err != nil {
		return fmt.Errorf("report: plot %s: %w", path, err)
	}
	return nil
}

// mark is one row of a panel: a marker at mid, whiskers from lo to hi when
// whisker is set, and label beside it. A row with ok false has no figure.
type mark struct {
	ok           bool
	lo, mid, hi  float64
	whisker      bool
	label        string
	missingLabel string
}

// panel is one plot of the chart: a figure per row on one x axis.
type panel struct {
	xlabel string
	marks  []mark
	ratio  bool // x is a ratio to the floor (1× drawn), else microseconds
}

// WritePlot draws the chart described at the top of this file and writes
// it to w as format ("png" or "svg"). Time per step is the GPU samples, or
// the host samples for a report without GPU samples. On a simulator the
// title says the times are simulated. Results with no samples get a row
// saying so; a report with no samples at all, or with a non-finite sample,
// is an error.
func (r *Report) WritePlot(w io.Writer, format string) (err error) {
	if format != "png" && format != "svg" {
		return fmt.Errorf("report: plot: unsupported format %q (use png or svg)", format)
	}
	// gonum/plot panics on some inputs it considers programming errors;
	// inputs are validated below, and this turns anything missed into an
	// error rather than a crash of the caller.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("report: plot: %v", p)
		}
	}()
	panels, err := r.panels()
	if err != nil {
		return err
	}
	names := make([]string, len(r.Results))
	for i, res := range r.Results {
		names[i] = res.Strategy
	}

	height := chartTitle + chartAxis + vg.Length(len(names))*chartRow + vg.Inch/4
	var c vg.CanvasWriterTo
	if format == "png" {
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(chartWidth, height), vgimg.UseDPI(chartDPI))}
	} else {
		c = vgsvg.New(chartWidth, height)
	}
	dc := draw.New(c)
	r.drawTitle(dc)

	row := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		row[i] = pn.plot(names, i == 0)
	}
	body := draw.Crop(dc, 0, 0, 0, -chartTitle)
	canvases := plot.Align([][]*plot.Plot{row}, draw.Tiles{
		Rows: 1, Cols: len(row), PadX: vg.Inch / 4, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 4, PadBottom: vg.Inch / 16,
	}, body)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("report: plot: write %s: %w", format, err)
	}
	return nil
}

// panels computes the chart's figures from r.
func (r *Report) panels() ([]panel, error) {
	samples := make([][]float64, len(r.Results))
	gpu, some := false, false
	for _, res := range r.Results {
		if len(res.StepSamplesUS) > 0 {
			gpu = true
		}
	}
	for i, res := range r.Results {
		s := res.StepSamplesUS
		if !gpu {
			s = res.HostSamplesUS
		}
		for _, y := range s {
			if math.IsNaN(y) || math.IsInf(y, 0) {
				return nil, fmt.Errorf("report: plot: strategy %s has a non-finite sample", res.Strategy)
			}
		}
		samples[i] = s
		some = some || len(s) > 0
	}
	if !some {
		return nil, fmt.Errorf("report: plot: no per-step samples in the report")
	}

	// The floor: the replay-fixed row's p50, when it has one.
	floorStep, floorWall := 0.0, 0.0
	for i, res := range r.Results {
		if res.Strategy == FloorRow && len(samples[i]) > 0 {
			floorStep = Percentile(samples[i], 50)
			if res.WallUS != nil {
				floorWall = res.WallUS.P50
			}
		}
	}
	ratio := floorStep > 0
	sim := ""
	if r.Simulated {
		sim = "simulated "
	}
	of := " (µs)"
	if ratio {
		of = ", ÷ the floor's p50"
	}

	var out []panel
	// Wall time: when the floor (or, without a floor, any row) has it.
	hasWall := slices.ContainsFunc(r.Results, func(res Result) bool { return res.WallUS != nil && res.Strategy != FloorRow })
	if hasWall && (!ratio || floorWall > 0) {
		div := 1.0
		if ratio {
			div = floorWall
		}
		pn := panel{xlabel: sim + "wall time per step (steps back to back), p50" + of, ratio: ratio}
		for _, res := range r.Results {
			m := mark{missingLabel: "not measured"}
			if res.WallUS != nil && res.WallUS.P50 > 0 {
				v := res.WallUS.P50 / div
				m = mark{ok: true, lo: v, mid: v, hi: v, label: figure(v, ratio)}
			}
			pn.marks = append(pn.marks, m)
		}
		out = append(out, pn)
	}

	what := "GPU time per step (events)"
	switch {
	case r.Simulated:
		what = "simulated time per step"
	case !gpu:
		what = "host time per step"
	}
	div := 1.0
	if ratio {
		div = floorStep
	}
	pn := panel{xlabel: what + ", p50 with p10–p90 whiskers" + of, ratio: ratio}
	for i := range r.Results {
		m := mark{missingLabel: "no samples (see the notes)"}
		if s := samples[i]; len(s) > 0 {
			sorted := slices.Sorted(slices.Values(s))
			mid := sortedPercentile(sorted, 50) / div
			m = mark{ok: true, whisker: true, lo: sortedPercentile(sorted, 10) / div, mid: mid,
				hi: sortedPercentile(sorted, 90) / div, label: figure(mid, ratio)}
		}
		pn.marks = append(pn.marks, m)
	}
	return append(out, pn), nil
}

// figure is the label beside a marker: "1.07×" or "62.8 µs".
func figure(v float64, ratio bool) string {
	if ratio {
		return strconv.FormatFloat(v, 'f', 2, 64) + "×"
	}
	return FormatUS(v) + " µs"
}

// drawTitle writes the title lines at the top of dc.
func (r *Report) drawTitle(dc draw.Canvas) {
	lines := []string{
		fmt.Sprintf("%s on %s (%s), %d steps", r.Workload, r.Backend, r.Device, r.Steps),
		"time per step of each strategy; lower is better",
	}
	if slices.ContainsFunc(r.Results, func(res Result) bool { return res.Strategy == FloorRow }) {
		lines[1] += "; 1× is the floor (" + FloorRow + "): the same graph replayed with nothing moving"
	}
	if r.Simulated {
		lines = append(lines, SimulatedNote)
	}
	x := dc.Min.X + (dc.Max.X-dc.Min.X)/2
	y := dc.Max.Y - vg.Points(8)
	for i, l := range lines {
		size := vg.Length(11)
		if i == 0 {
			size = 13
		}
		sty := textStyle(size, color.Black)
		sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
		if i == 2 {
			sty.Color = color.RGBA{0xb0, 0x00, 0x00, 0xff}
		}
		dc.FillText(sty, vg.Point{X: x, Y: y}, l)
		y -= sty.Font.Size * 1.45
	}
}

func textStyle(size vg.Length, c color.Color) text.Style {
	return text.Style{Color: c, Font: font.From(plot.DefaultFont, size), Handler: plot.DefaultTextHandler,
		XAlign: draw.XLeft, YAlign: draw.YCenter}
}

// plot makes the panel's plot over names (row 0 at the top); the first
// panel carries the row labels.
func (pn panel) plot(names []string, first bool) *plot.Plot {
	p := plot.New()
	p.X.Label.Text = pn.xlabel
	p.X.Label.TextStyle.Font.Size = 11
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range pn.marks {
		if m.ok {
			lo, hi = math.Min(lo, m.lo), math.Max(hi, m.hi)
		}
	}
	if math.IsInf(lo, 0) { // no figure at all in this panel
		lo, hi = 0, 1
	}
	if pn.ratio {
		lo = math.Min(lo, 1)
	} else {
		lo = 0
	}
	span := math.Max(hi-lo, 1e-9)
	// Room on the right for the labels beside the markers.
	p.X.Min, p.X.Max = lo-0.04*span, hi+0.3*span
	if !pn.ratio {
		p.X.Min = 0
	}
	suffix := ""
	if pn.ratio {
		suffix = "×"
	}
	p.X.Tick.Marker = niceTicks{suffix: suffix, from: lo, mark1: pn.ratio}

	n := len(names)
	p.Y.Min, p.Y.Max = -0.6, float64(n)-0.4
	if first {
		ticks := make([]plot.Tick, n)
		for i, name := range names {
			ticks[i] = plot.Tick{Value: float64(n - 1 - i), Label: name}
		}
		p.Y.Tick.Marker = plot.ConstantTicks(ticks)
		p.Y.Tick.Label.Font.Size = 12
		p.Y.Tick.Length, p.Y.Width = 0, 0
	} else {
		p.HideY()
	}
	grid := &rowGrid{n: n}
	p.Add(grid, &marks{panel: pn})
	return p
}

// rowGrid draws a faint line along every row and the x axis's major ticks.
type rowGrid struct{ n int }

func (g *rowGrid) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	faint := draw.LineStyle{Color: color.Gray{0xe4}, Width: vg.Points(0.6)}
	for i := range g.n {
		y := trY(float64(i))
		c.StrokeLine2(faint, c.Min.X, y, c.Max.X, y)
	}
	for _, t := range p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max) {
		if t.Label != "" {
			x := trX(t.Value)
			c.StrokeLine2(faint, x, c.Min.Y, x, c.Max.Y)
		}
	}
}

// marks draws a panel's figures: the floor line, then per row the
// whiskers, the marker and its label.
type marks struct{ panel panel }

func (m *marks) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	if m.panel.ratio {
		x := trX(1)
		c.StrokeLine2(draw.LineStyle{Color: color.Gray{0x60}, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(5), vg.Points(3)}},
			x, c.Min.Y, x, c.Max.Y)
		sty := textStyle(9, color.Gray{0x60})
		sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
		c.FillText(sty, vg.Point{X: x, Y: c.Max.Y}, "floor")
	}
	n := len(m.panel.marks)
	for i, mk := range m.panel.marks {
		y := trY(float64(n - 1 - i))
		col := palette[i%len(palette)]
		if !mk.ok {
			c.FillText(textStyle(labelSize, color.Gray{0x70}), vg.Point{X: trX(p.X.Min) + vg.Points(6), Y: y}, mk.missingLabel)
			continue
		}
		right := trX(mk.mid)
		if mk.whisker {
			ls := draw.LineStyle{Color: col, Width: vg.Points(1.5)}
			x0, x1 := trX(mk.lo), trX(mk.hi)
			tick := vg.Points(4)
			c.StrokeLine2(ls, x0, y, x1, y)
			c.StrokeLine2(ls, x0, y-tick, x0, y+tick)
			c.StrokeLine2(ls, x1, y-tick, x1, y+tick)
			right = max(right, x1)
		}
		c.DrawGlyph(draw.GlyphStyle{Color: col, Radius: vg.Points(markerSize), Shape: shapes[i%len(shapes)]}, vg.Point{X: trX(mk.mid), Y: y})
		c.FillText(textStyle(labelSize, color.Black), vg.Point{X: right + vg.Points(8), Y: y}, mk.label)
	}
}

// niceTicks marks an axis at round steps (1, 2, 2.5 or 5 times a power of
// ten), labelled with no more decimals than the step needs: whole numbers
// once the step is 1 or more. Ticks start at from or later; mark1 adds a
// tick at 1 (the floor of a ratio axis) when the steps miss it.
type niceTicks struct {
	suffix string
	from   float64
	mark1  bool
}

func (t niceTicks) Ticks(lo, hi float64) []plot.Tick {
	lo = math.Max(lo, t.from)
	span := hi - lo
	if !(span > 0) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'f', -1, 64) + t.suffix}}
	}
	raw := span / tickTargets
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, f := range []float64{1, 2, 2.5, 5} {
		if f*mag >= raw {
			step = f * mag
			break
		}
	}
	// Labels keep the digits the step has, no trailing zeros: 1, 1.5, 2.
	decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9))) + 1
	var ticks []plot.Tick
	for i := math.Ceil(lo/step - 1e-9); i*step <= hi+1e-9*step; i++ {
		v := i * step
		if v == 0 {
			v = 0 // not -0
		}
		l := strconv.FormatFloat(v, 'f', decimals, 64)
		if strings.Contains(l, ".") {
			l = strings.TrimRight(strings.TrimRight(l, "0"), ".")
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: l + t.suffix})
	}
	if t.mark1 && lo <= 1 && !slices.ContainsFunc(ticks, func(tk plot.Tick) bool { return math.Abs(tk.Value-1) < step/100 }) {
		ticks = append([]plot.Tick{{Value: 1, Label: "1" + t.suffix}}, ticks...)
	}
	return ticks
}
