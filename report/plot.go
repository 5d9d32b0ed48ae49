package report

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot size.
const (
	plotWidth  = 8 * vg.Inch
	plotHeight = 4.5 * vg.Inch
)

// logRatio is the spread (largest over smallest sample) above which the
// time axis is logarithmic.
const logRatio = 20

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

// SavePlot draws r's per-step GPU time (see WritePlot) to path, as PNG or
// SVG by its extension. A partly written file is removed on error.
func (r *Report) SavePlot(path string) (err error) {
	format, err := PlotFormat(path)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: plot: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("report: plot %s: %w", path, cerr)
		}
		if err != nil {
			err = errors.Join(err, os.Remove(path))
		}
	}()
	return r.WritePlot(f, format)
}

// WritePlot draws per-step time per strategy, one line per strategy over
// the step index, and writes it to w as format ("png" or "svg"). It plots
// GPU step samples, or host samples for a result without GPU samples. The
// time axis is logarithmic when the samples span more than a factor of 20.
// Results with no samples are left out; a report with none at all is an
// error.
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

	type series struct {
		name string
		ys   []float64
	}
	var all []series
	lo, hi := math.Inf(1), 0.0
	hostOnly := true
	for _, res := range r.Results {
		ys, name := res.StepSamplesUS, res.Strategy
		if len(ys) == 0 {
			ys, name = res.HostSamplesUS, res.Strategy+" (host)"
		} else {
			hostOnly = false
		}
		if len(ys) == 0 {
			continue
		}
		for _, y := range ys {
			if math.IsNaN(y) || math.IsInf(y, 0) {
				return fmt.Errorf("report: plot: strategy %s has a non-finite sample", res.Strategy)
			}
			if y > 0 {
				lo, hi = math.Min(lo, y), math.Max(hi, y)
			}
		}
		all = append(all, series{name, ys})
	}
	if len(all) == 0 {
		return fmt.Errorf("report: plot: no per-step samples in the report")
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s on %s (%s)", r.Workload, r.Backend, r.Device)
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "step"
	p.Y.Label.Text = "GPU time per step (µs)"
	if hostOnly {
		p.Y.Label.Text = "host time per step (µs)"
	}
	logY := hi > 0 && hi/lo > logRatio
	floor := 0.0
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Label.Text += ", log scale"
		floor = lo / 2 // zero samples are drawn here; a log axis cannot show 0
	}
	p.Legend.Top = true
	for i, s := range all {
		xys := make(plotter.XYs, len(s.ys))
		for j, y := range s.ys {
			xys[j] = plotter.XY{X: float64(j), Y: math.Max(y, floor)}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("report: plot %s: %w", s.name, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.Add(plotter.NewGrid())
	wt, err := p.WriterTo(plotWidth, plotHeight, format)
	if err != nil {
		return fmt.Errorf("report: plot: %w", err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("report: plot: write %s: %w", format, err)
	}
	return nil
}
