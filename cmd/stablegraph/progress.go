package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	sg "github.com/stablegraph/stablegraph"
)

// stepProgress reports the steps of a command's runs (the eager reference,
// each strategy, the floor) on stderr with an estimate of the time left:
// as a progress bar when stderr is a terminal or --progress asks for one,
// else as a line at every quarter of each run, so that logs and tests stay
// readable.
type stepProgress struct {
	e     *env
	cmd   string
	total int // steps of every run of the command
	done  int // steps of the runs finished
	cur   int // steps of the current run
	start time.Time
	bar   *progressbar.ProgressBar
}

// newStepProgress starts reporting total steps for cmd.
func newStepProgress(e *env, cmd string, total int) *stepProgress {
	p := &stepProgress{e: e, cmd: cmd, total: max(total, 1), start: time.Now()}
	if e.global.progress.on {
		p.bar = progressbar.NewOptions(p.total,
			progressbar.OptionSetWriter(e.stderr),
			progressbar.OptionSetDescription(cmd),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("steps"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetRenderBlankState(true),
			progressbar.OptionClearOnFinish(),
		)
	}
	return p
}

// step is a workload.RunOptions.Progress function: step of total of the
// current run, which begins when step is 1.
func (p *stepProgress) step(s sg.Strategy, step, total int) {
	if step == 1 {
		p.done += p.cur
	}
	p.cur = step
	n := p.done + p.cur
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("%s: %s", p.cmd, s))
		p.bar.Set(min(n, p.total))
		return
	}
	if step == total || step%max(1, total/4) == 0 {
		p.e.progress("%s: %s step %d/%d (%.1f s%s)", p.cmd, s, step, total, time.Since(p.start).Seconds(), p.left(n))
	}
}

// left estimates the time left after n steps: ", about 12s left".
func (p *stepProgress) left(n int) string {
	if n <= 0 || n >= p.total {
		return ""
	}
	rem := time.Duration(float64(time.Since(p.start)) / float64(n) * float64(p.total-n))
	return fmt.Sprintf(", about %v left", max(rem.Round(time.Second), time.Second))
}

// finish clears the bar, before the command prints its results.
func (p *stepProgress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
