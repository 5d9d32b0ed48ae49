package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/stablegraph/stablegraph/workload"
)

// mlpLike are the workloads shaped by layers, width and batch: the MLPs,
// their training steps, dp (an MLP's) and gpt2-decode (width is its model
// width).
var mlpLike = []string{"dp", "gpt2-decode", "gpt2-decode-tiny", "mlp", "mlp-large", "train", "train-large"}

// workloadsTaking lists, for each workload flag that shapes only some
// workloads, the workloads it shapes: the fields of workload.Config each
// builder reads (TestShapeFlagsMatchWorkloads checks the table against
// package workload). A flag given for another workload is refused rather
// than ignored.
var workloadsTaking = map[string][]string{
	"layers":  mlpLike,
	"width":   mlpLike,
	"batch":   mlpLike,
	"k":       {"chain", "chain-moving"},
	"weights": {"gpt2-decode", "gpt2-decode-tiny"},
	// batch-per-rank: workload.Config.BatchPerRank, which only dp reads.
	"batch-per-rank": {"dp"},
}

// swapWorkloads are the workloads with per-sequence state, which the swap
// pattern moves (workload.Swap).
var swapWorkloads = []string{"gpt2-decode", "gpt2-decode-tiny"}

// registerShape registers the workload shape flags into cfg.
func registerShape(fs *flag.FlagSet, cfg *workload.Config) {
	fs.IntVar(&cfg.Layers, "layers", 0, "layers of mlp, train, dp and gpt2-decode (default: 8; gpt2-decode 12, its -tiny 2)")
	fs.IntVar(&cfg.Width, "width", 0, "width of mlp, train, dp and gpt2-decode's model (default: 256, 1024 for the -large ones; gpt2-decode 768, its -tiny 64)")
	fs.IntVar(&cfg.Batch, "batch", 0, "batch of mlp, train, dp (its ranks split it) and gpt2-decode (default: 8, 64 for the -large ones; gpt2-decode-tiny 4)")
	fs.IntVar(&cfg.K, "k", 0, fmt.Sprintf("kernels in chain and chain-moving, 1 to %d (default 1000)", workload.MaxChainK))
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the weights, inputs and random buffer placement")
}

// flagName is the flag as typed: -k, --layers.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// checkShape checks the workload flags that were given: each applies to
// the workload called name (workloadsTaking), a size is positive (left
// out, the workload's default applies), k at most workload.MaxChainK. An
// unknown workload is left to workload.New to report.
func checkShape(fs *flag.FlagSet, name string, cfg workload.Config) error {
	vals := map[string]int{"layers": cfg.Layers, "width": cfg.Width, "batch": cfg.Batch, "k": cfg.K, "batch-per-rank": cfg.BatchPerRank}
	known := slices.Contains(workload.Names(), name)
	var err error
	fs.Visit(func(fl *flag.Flag) {
		if err != nil {
			return
		}
		if takers, ok := workloadsTaking[fl.Name]; ok && known && !slices.Contains(takers, name) {
			err = usagef("%s does not apply to workload %s: it is for %s", flagName(fl.Name), name, strings.Join(takers, ", "))
			return
		}
		v, ok := vals[fl.Name]
		switch {
		case !ok:
		case v <= 0:
			err = usagef("%s must be positive, got %d (leave it out for the workload's default)", flagName(fl.Name), v)
		case fl.Name == "k" && v > workload.MaxChainK:
			err = usagef("-k must be at most %d, got %d", workload.MaxChainK, v)
		}
	})
	return err
}

// checkPattern refuses the swap pattern for a workload without
// per-sequence state, before any backend opens (the caller would refuse it
// only once the run starts).
func checkPattern(name string, p workload.Pattern) error {
	if p == workload.Swap && slices.Contains(workload.Names(), name) && !slices.Contains(swapWorkloads, name) {
		return usagef("--pattern swap is for workloads with per-sequence state (%s), not %s; use fixed, pingpong or random",
			strings.Join(swapWorkloads, ", "), name)
	}
	return nil
}
