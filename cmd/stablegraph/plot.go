package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/stablegraph/stablegraph/report"
)

func plotCommand() *command {
	return &command{
		name:    "plot",
		args:    " report.json chart.png",
		nargs:   2,
		summary: "draw the chart of a bench JSON report, as bench --plot does",
		detail: `Reads a report written by "stablegraph bench --json" and draws each strategy's
time per step against the floor (replay-fixed) to a .png or .svg file: wall
time when measured, and GPU time per step as p50 with p10-p90 whiskers. It
opens no backend; the chart is written whole or not at all. For example:

  stablegraph bench --json mlp.json
  stablegraph plot mlp.json mlp.png

(the README shows the command that draws its chart).`,
		flags: func(fs *flag.FlagSet) func(*env) error {
			return func(e *env) error {
				if fs.NArg() != 2 {
					return usagef("want a report and a chart file, got %d arguments", fs.NArg())
				}
				in, out := fs.Arg(0), fs.Arg(1)
				if _, err := report.PlotFormat(out); err != nil {
					return usagef("%v", err)
				}
				if err := checkOutput("the chart", out); err != nil {
					return err
				}
				f, err := os.Open(in)
				if err != nil {
					return usagef("%v", err)
				}
				rep, err := report.ReadJSON(f)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", in, err)
				}
				if err := rep.SavePlot(out); err != nil {
					return err
				}
				e.progress("wrote %s", out)
				return nil
			}
		},
	}
}
