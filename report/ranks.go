package report

import (
	"fmt"
	"io"
	"strings"
)

// WriteRanksTable renders the ranks of r (Report.Ranks) side by side: per
// strategy, in the order of the first rank's results, each rank's GPU time
// p50 and p90, latency p50 and wall time p50, in rank order, and whether
// every rank's outputs matched eager. It writes nothing when r has no
// ranks.
func (r *Report) WriteRanksTable(w io.Writer) error {
	if len(r.Ranks) == 0 {
		return nil
	}
	tw := NewTabWriter(w)
	fmt.Fprintf(tw, "\nper rank (ranks 0..%d, in order; microseconds):\n", len(r.Ranks)-1)
	fmt.Fprintln(tw, "strategy\tGPU p50\tGPU p90\tlatency p50\twall p50\tmatches eager\t")
	for _, first := range r.Ranks[0].Results {
		var gpu50, gpu90, lat, wall []string
		match := "yes"
		for i := range r.Ranks {
			res, ok := r.Ranks[i].Result(first.Strategy)
			if !ok {
				gpu50, gpu90, lat, wall = append(gpu50, "-"), append(gpu90, "-"), append(lat, "-"), append(wall, "-")
				match = "no"
				continue
			}
			gpu50 = append(gpu50, FormatUS(res.StepUS.P50))
			gpu90 = append(gpu90, FormatUS(res.StepUS.P90))
			lat = append(lat, optUS(res.LatencyUS))
			wall = append(wall, optUS(res.WallUS))
			if !res.OutputsMatchEager {
				match = "no"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", first.Strategy, strings.Join(gpu50, " "), strings.Join(gpu90, " "),
			strings.Join(lat, " "), strings.Join(wall, " "), match)
	}
	return tw.Flush()
}

// optUS formats p's p50, or "-" when p is nil.
func optUS(p *Percentiles) string {
	if p == nil {
		return "-"
	}
	return FormatUS(p.P50)
}
