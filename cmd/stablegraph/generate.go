package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/models/gpt2"
	"github.com/stablegraph/stablegraph/models/gpt2/tokenizer"
	"github.com/stablegraph/stablegraph/streamcache"
)

// tinySeed seeds the random weights generate writes when given none.
const tinySeed = 1

func generateCommand() *command {
	return &command{
		name:    "generate",
		summary: "generate text from a GPT-2 checkpoint, many prompts at once (continuous batching)",
		detail: `Loads a GPT-2 checkpoint as Hugging Face distributes it (--weights: a directory
holding model.safetensors, with config.json and tokenizer files when present,
or the file itself), tokenizes the prompts with GPT-2's tokenizer and generates
up to --max-new-tokens tokens for each, --rows sequences at a time: a waiting
prompt takes a row as soon as one frees, every sequence's KV cache is allocated
when it starts, sized to its prompt and budget, and freed when it ends. The
steps (a prefill step and a decode step) are compiled and their graphs
recorded once, at start-up (docs/GENERATE.md).

Without --weights it writes a tiny random GPT-2 (2 layers, width 64, GPT-2's
vocabulary) to a temporary directory and runs that: the text is random, the
machinery is real. With one prompt the text streams to stdout as it is
generated; with several, each sequence is printed when it ends (--stream:
every piece as it comes, "[i] piece" lines). A summary follows on stderr:
tokens/s, time to first token and per output token (p50, p90), device memory,
graphs recorded, start-up time, and where sampled tokens were drawn (on the
device by default: --host-sampling reads every row's logits back instead, for
the same tokens); --json writes it with every sequence (text,
prompt and generated token ids, top-2 logit gaps, times). On sim the times are
the simulator's on this CPU, not a GPU's. Ctrl-C prints what was generated and
exits 130.`,
		flags: func(fs *flag.FlagSet) func(*env) error {
			weights := fs.String("weights", "", "GPT-2 checkpoint: a `dir`ectory with model.safetensors (and config.json, tokenizer files), or the file (default: a tiny random model)")
			var prompts stringList
			fs.Var(&prompts, "prompt", "a prompt (repeatable)")
			promptsFile := fs.String("prompts", "", "read prompts from `file`, one a line (\\n in a line is a newline)")
			maxNew := fs.Int("max-new-tokens", 32, "generate at most `n` tokens a sequence")
			temp := fs.Float64("temperature", 0, "sampling temperature; 0: greedy")
			topK := fs.Int("top-k", 0, "sample from the `k` most likely tokens, 0 to the vocabulary (0: all)")
			topP := fs.Float64("top-p", 1, "sample from the nucleus of probability `p`, in (0, 1] (1: all)")
			seed := fs.Uint64("seed", 0, "seed of the sampling")
			var stops stringList
			fs.Var(&stops, "stop", "end a sequence when its text contains `string` (repeatable); the end-of-text token always ends it")
			strategy := fs.String("strategy", string(sg.StrategyAuto), "replay `strategy`: "+strategyList())
			rows := fs.Int("rows", gpt2.DefaultRows, "decode `B` sequences at once")
			prefill := fs.Int("prefill-rows", gpt2.DefaultPrefillRows, "prefill prompts `n` tokens a step")
			buckets := fs.String("buckets", "", "comma-separated row counts: a decode graph per count instead of one of --rows masked rows (e.g. 1,2,4,8)")
			hostArgmax := fs.Bool("host-argmax", false, "greedy: read the logits back and take the argmax on the host instead of the device")
			hostSampling := fs.Bool("host-sampling", false, "sampling: read the logits back and draw on the host instead of the device (same tokens)")
			stream := fs.Bool("stream", false, "with several prompts, print every piece of text as it comes")
			device := fs.Int("device", 0, "device ordinal")
			jsonPath := fs.String("json", "", "write every sequence and the summary as JSON to `file` (\"-\": stdout, instead of the text)")
			return func(e *env) (err error) {
				g := &generation{e: e, maxNew: *maxNew, stops: stops, stream: *stream, json: *jsonPath,
					sampling: gpt2.Sampling{Temperature: *temp, TopK: *topK, TopP: *topP, Seed: *seed}}
				g.opts = gpt2.Options{Rows: *rows, PrefillRows: *prefill, Strategy: sg.Strategy(*strategy), HostArgmax: *hostArgmax, HostSampling: *hostSampling, Device: *device, Logger: e.log}
				if *buckets != "" {
					for _, f := range strings.Split(*buckets, ",") {
						n, err := strconv.Atoi(strings.TrimSpace(f))
						if err != nil || n < 1 {
							return usagef("--buckets %q: not a list of positive row counts", *buckets)
						}
						g.opts.Buckets = append(g.opts.Buckets, n)
					}
					if !slices.Contains(g.opts.Buckets, *rows) && *rows == gpt2.DefaultRows {
						g.opts.Rows = 0 // the largest bucket
					}
				}
				if _, err := sg.ParseStrategy(*strategy); err != nil {
					return usagef("--strategy: %v", err)
				}
				if *maxNew < 1 || *rows < 1 || *prefill < 1 {
					return usagef("--max-new-tokens, --rows and --prefill-rows must be positive")
				}
				if err := g.sampling.Check(); err != nil {
					return usagef("%v", err)
				}
				// The library takes top-p 0 as none; on the command line
				// the default is 1 and 0 is a mistake.
				if !(*topP > 0) {
					return usagef("--top-p %g outside (0, 1]", *topP)
				}
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				if g.sampling.Greedy() && (set["top-k"] || set["top-p"]) {
					return usagef("--top-k and --top-p need --temperature above 0 (0 is greedy)")
				}
				if err := checkOutput("json", *jsonPath); err != nil {
					return err
				}
				if g.texts, err = readPrompts(prompts, *promptsFile); err != nil {
					return err
				}
				// Unless asked, no more rows than prompts: the rows of a step
				// are computed whether they hold a sequence or not.
				if !set["rows"] && g.opts.Buckets == nil {
					g.opts.Rows = min(g.opts.Rows, len(g.texts))
				}
				g.fitPrefill = !set["prefill-rows"]
				return g.run(*weights)
			}
		},
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// readPrompts gathers --prompt values then --prompts lines; an empty list
// or an empty prompt is a usage error naming it.
func readPrompts(flags []string, file string) ([]string, error) {
	ps := slices.Clone(flags)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usagef("--prompts: %v", err)
		}
		for line := range strings.Lines(string(b)) {
			line = strings.TrimRight(line, "\r\n")
			if strings.TrimSpace(line) == "" {
				continue
			}
			ps = append(ps, strings.ReplaceAll(line, `\n`, "\n"))
		}
	}
	if len(ps) == 0 {
		return nil, usagef("no prompts: give --prompt TEXT (repeatable) or --prompts FILE")
	}
	for i, p := range ps {
		if p == "" {
			return nil, usagef("prompt %d is empty", i)
		}
	}
	return ps, nil
}

// generation is one run of the command.
type generation struct {
	e        *env
	texts    []string
	maxNew   int
	sampling gpt2.Sampling
	stops    []string
	stream   bool
	json     string
	opts     gpt2.Options

	// fitPrefill cuts the prefill step's rows to the longest prompt,
	// rounded up to a power of two.
	fitPrefill bool

	tok     *tokenizer.Tokenizer
	random  bool // weights generated here: the text is random
	decs    []*tokenizer.Decoder
	text    []strings.Builder
	printed []bool
}

func (g *generation) run(weights string) (err error) {
	e := g.e
	start := time.Now()
	dir := weights
	if weights == "" {
		tmp, err := os.MkdirTemp("", "stablegraph-gpt2-tiny-")
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()
		w, err := gpt2.Generate(gpt2.Tiny, tinySeed)
		if err != nil {
			return err
		}
		if err := w.Save(tmp, map[string]string{"generator": "stablegraph generate", "seed": strconv.Itoa(tinySeed)}); err != nil {
			return err
		}
		dir, g.random = tmp, true
		e.progress("generate: no --weights: a tiny random GPT-2 (%s) written to %s; its text is random", gpt2.Tiny, tmp)
	} else if st, err := os.Stat(weights); err == nil && !st.IsDir() {
		dir = filepath.Dir(weights)
	}
	w, err := gpt2.Load(cmpOr(weights, dir))
	if err != nil {
		return err
	}
	if g.tok, err = tokenizer.Load(dir); err != nil {
		return err
	}
	if w.Config.Vocab != tokenizer.VocabSize {
		return fmt.Errorf("the checkpoint's vocabulary has %d tokens; GPT-2's tokenizer has %d", w.Config.Vocab, tokenizer.VocabSize)
	}
	// Every request is checked before the device is touched.
	reqs := make([]gpt2.Request, len(g.texts))
	maxPos := w.Config.Positions
	for i, t := range g.texts {
		reqs[i] = gpt2.Request{Prompt: g.tok.Encode(t), MaxNewTokens: g.maxNew, Sampling: g.sampling}
		if err := gpt2.CheckRequest(w.Config, maxPos, reqs[i]); err != nil {
			return usagef("prompt %d: %v", i, err)
		}
	}
	if g.fitPrefill {
		longest := 1
		for _, r := range reqs {
			longest = max(longest, len(r.Prompt))
		}
		g.opts.PrefillRows = min(g.opts.PrefillRows, 1<<bitsLen(longest-1))
	}
	// The steps' bound: the longest sequence asked for, not the whole
	// context (the attention's scratch and the caches' declared size
	// follow it).
	g.opts.MaxPositions = 2
	for _, r := range reqs {
		g.opts.MaxPositions = max(g.opts.MaxPositions, len(r.Prompt)+r.MaxNewTokens)
	}
	if err := g.opts.Validate(w.Config); err != nil {
		return usagef("%v", err)
	}
	b, reason, err := e.open()
	if err != nil {
		return err
	}
	defer closeBackend(b, &err)
	defer func() {
		if perr := streamcache.Default.Purge(b); perr != nil {
			err = errors.Join(err, perr)
		}
	}()
	e.progress("generate: %s, %s, on backend %s", plural(len(reqs), "prompt", "prompts"), w.Source, shortReason(reason))
	if g.opts.Device < 0 || g.opts.Device >= b.DeviceCount() {
		return usagef("--device %d: backend %s has %d device(s)", g.opts.Device, b.Name(), b.DeviceCount())
	}
	bt, err := gpt2.NewBatcher(e.ctx, b, w, g.opts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, bt.Close()) }()
	st := bt.Stats()
	e.progress("generate: ready in %v: %s recorded (strategy %s), %s, %s at most, caches from a region of %s",
		st.Startup.Round(time.Millisecond), plural(int(st.Records), "graph", "graphs"), st.Requested, plural(bt.Options().Rows, "decode row", "decode rows"),
		plural(bt.Options().MaxPositions, "position", "positions"), byteSize(st.CacheRegion))

	n := len(reqs)
	g.decs, g.text, g.printed = make([]*tokenizer.Decoder, n), make([]strings.Builder, n), make([]bool, n)
	for i := range g.decs {
		g.decs[i] = g.tok.NewDecoder()
	}
	out := e.stdout
	if g.json == "-" {
		out = io.Discard
	}
	single := n == 1
	if single {
		fmt.Fprint(out, g.texts[0])
	}
	genStart := time.Now()
	res, gerr := bt.Generate(e.ctx, reqs, func(ev gpt2.Event) bool {
		keep := true
		if ev.Why != gpt2.StopToken {
			piece, derr := g.decs[ev.Seq].Add(ev.Token)
			if derr != nil {
				piece = "\uFFFD"
			}
			g.text[ev.Seq].WriteString(piece)
			switch {
			case single:
				fmt.Fprint(out, piece)
			case g.stream && piece != "":
				fmt.Fprintf(out, "[%d] %q\n", ev.Seq, piece)
			}
			for _, s := range g.stops {
				if strings.Contains(g.text[ev.Seq].String(), s) {
					keep = false
				}
			}
		}
		if (ev.Done || !keep) && !single && !g.stream {
			g.printSeq(out, ev.Seq)
		}
		return keep
	})
	elapsed := time.Since(genStart)
	for i := range g.text {
		g.text[i].WriteString(g.decs[i].Flush())
	}
	if single {
		fmt.Fprintln(out)
	} else if !g.stream {
		for i := range res {
			if !g.printed[i] && len(res[i].Tokens) > 0 {
				g.printSeq(out, i) // interrupted: what it had
			}
		}
	}
	sum := g.summary(b.Name(), bt, res, elapsed, time.Since(start))
	g.printSummary(sum)
	if g.json != "" {
		if werr := e.writeOutput(g.json, func(w io.Writer) error { return g.writeJSON(w, bt.Config(), reqs, res, sum) }); werr != nil {
			return errors.Join(gerr, fmt.Errorf("write %s: %w", g.json, werr))
		}
	}
	return gerr
}

// bitsLen is the number of bits of n (0 for 0).
func bitsLen(n int) int {
	b := 0
	for ; n > 0; n >>= 1 {
		b++
	}
	return b
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// printSeq prints sequence i whole, once.
func (g *generation) printSeq(out io.Writer, i int) {
	if g.printed[i] {
		return
	}
	g.printed[i] = true
	fmt.Fprintf(out, "--- %d ---\n%s%s\n", i, g.texts[i], g.text[i].String())
}

// genSummary is the run's figures.
type genSummary struct {
	Backend      string  `json:"backend"`
	Simulated    bool    `json:"simulated"`
	RandomModel  bool    `json:"random_model"`
	Strategy     string  `json:"strategy"`
	Requested    string  `json:"strategy_requested"`
	MaxPositions int     `json:"max_positions"`
	Rows         int     `json:"rows"`
	Buckets      []int   `json:"buckets,omitempty"`
	Sequences    int     `json:"sequences"`
	Tokens       int     `json:"tokens"`
	Seconds      float64 `json:"seconds"`
	TokensPerS   float64 `json:"tokens_per_s"`
	TTFTP50MS    float64 `json:"ttft_p50_ms"`
	TTFTP90MS    float64 `json:"ttft_p90_ms"`
	TPOTP50MS    float64 `json:"tpot_p50_ms"`
	TPOTP90MS    float64 `json:"tpot_p90_ms"`
	StartupMS    float64 `json:"startup_ms"`
	TotalMS      float64 `json:"total_ms"`
	Graphs       int64   `json:"graphs"`
	Records      int64   `json:"graphs_recorded"`
	Rerecords    int64   `json:"rerecords"`
	PatchedNodes int64   `json:"patched_nodes"`
	DecodeSteps  int64   `json:"decode_steps"`
	PrefillSteps int64   `json:"prefill_steps"`
	RowsActive   float64 `json:"mean_active_rows"`
	DeviceDraws  int64   `json:"device_draws"`
	CandDraws    int64   `json:"candidate_draws"`
	HostDraws    int64   `json:"host_draws"`
	Fallbacks    int64   `json:"fallbacks"`
	ReadbackB    uint64  `json:"readback_bytes"`
	HostSampling bool    `json:"host_sampling"`
	DeviceBytes  uint64  `json:"device_bytes"`
	WeightBytes  uint64  `json:"weight_bytes"`
	ExeBytes     uint64  `json:"executable_bytes"`
	CacheRegion  uint64  `json:"cache_region_bytes"`
	CachePeak    uint64  `json:"cache_peak_bytes"`
}

func (g *generation) summary(backend string, bt *gpt2.Batcher, res []gpt2.Result, elapsed, total time.Duration) genSummary {
	st := bt.Stats()
	s := genSummary{Backend: backend, Simulated: backend == "sim", RandomModel: g.random, Strategy: string(st.Strategy),
		Requested: string(st.Requested), MaxPositions: bt.Options().MaxPositions,
		Rows: bt.Options().Rows, Buckets: bt.Options().Buckets, Sequences: len(res), Seconds: elapsed.Seconds(),
		StartupMS: ms(st.Startup), TotalMS: ms(total), Graphs: st.Graphs, Records: st.Records, Rerecords: st.Rerecords,
		PatchedNodes: st.PatchedNodes, DecodeSteps: st.DecodeSteps, PrefillSteps: st.PrefillSteps,
		DeviceDraws: st.DeviceDraws, CandDraws: st.CandidateDraws, HostDraws: st.HostDraws, Fallbacks: st.Fallbacks,
		ReadbackB: st.ReadbackBytes, HostSampling: bt.Options().HostSampling,
		DeviceBytes: st.DeviceBytes(), WeightBytes: st.WeightBytes, ExeBytes: st.ExecutableBytes, CacheRegion: st.CacheRegion, CachePeak: st.CachePeak}
	var ttft, tpot []float64
	for _, r := range res {
		s.Tokens += len(r.Tokens)
		if len(r.Tokens) > 0 {
			ttft = append(ttft, ms(r.TTFT))
		}
		if len(r.Tokens) > 1 {
			tpot = append(tpot, ms(r.TPOT))
		}
	}
	if elapsed > 0 {
		s.TokensPerS = float64(s.Tokens) / elapsed.Seconds()
	}
	if st.DecodeSteps > 0 {
		s.RowsActive = float64(st.RowsActive) / float64(st.DecodeSteps)
	}
	s.TTFTP50MS, s.TTFTP90MS = quantile(ttft, 0.5), quantile(ttft, 0.9)
	s.TPOTP50MS, s.TPOTP90MS = quantile(tpot, 0.5), quantile(tpot, 0.9)
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile is the nearest-rank quantile q of v (0 for none).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[min(len(v)-1, int(math.Ceil(q*float64(len(v))))-1+boolInt(q == 0))]
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (g *generation) printSummary(s genSummary) {
	e := g.e
	clock := "wall clock"
	if s.Simulated {
		clock = "sim: the simulator's time on this CPU, not a GPU measurement"
	}
	e.progress("generate: %s, %s in %.2f s (%s): %.1f tokens/s", plural(s.Sequences, "sequence", "sequences"), plural(s.Tokens, "token", "tokens"), s.Seconds, clock, s.TokensPerS)
	e.progress("  time to first token p50 %.2f ms, p90 %.2f ms; per output token p50 %.2f ms, p90 %.2f ms", s.TTFTP50MS, s.TTFTP90MS, s.TPOTP50MS, s.TPOTP90MS)
	e.progress("  start-up %.0f ms; strategy %s (%s); %s recorded for %s, %d re-recorded, %s patched; %s (%.1f rows active on average), %s",
		s.StartupMS, s.Strategy, s.Requested, plural(int(s.Records), "graph", "graphs"), plural(int(s.Graphs), "step program", "step programs"), s.Rerecords,
		plural(int(s.PatchedNodes), "node", "nodes"), plural(int(s.DecodeSteps), "decode step", "decode steps"), s.RowsActive,
		plural(int(s.PrefillSteps), "prefill step", "prefill steps"))
	if s.Tokens > 0 {
		e.progress("  read back %s a token; sampled tokens drawn: %d on the device, %d from its candidates, %d fell back to the logits, %d on the host",
			byteSize(s.ReadbackB/uint64(s.Tokens)), s.DeviceDraws, s.CandDraws, s.Fallbacks, s.HostDraws)
	}
	e.progress("  device memory %s: weights %s, executables %s, KV-cache region %s (peak in use %s)",
		byteSize(s.DeviceBytes), byteSize(s.WeightBytes), byteSize(s.ExeBytes), byteSize(s.CacheRegion), byteSize(s.CachePeak))
	if s.RandomModel {
		e.progress("  (random weights: the text is random; pass --weights DIR for a real GPT-2)")
	}
}

func byteSize(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

type genSeqJSON struct {
	Index        int       `json:"index"`
	Prompt       string    `json:"prompt"`
	PromptTokens []int32   `json:"prompt_tokens"`
	Text         string    `json:"text"`
	Tokens       []int32   `json:"tokens"`
	Gaps         []float32 `json:"top2_gaps"`
	StopReason   string    `json:"stop_reason"`
	TTFTMS       float64   `json:"ttft_ms"`
	TPOTMS       float64   `json:"tpot_ms"`
}

func (g *generation) writeJSON(w io.Writer, c gpt2.Config, reqs []gpt2.Request, res []gpt2.Result, sum genSummary) error {
	doc := struct {
		Model     gpt2.Config  `json:"model"`
		Sequences []genSeqJSON `json:"sequences"`
		Summary   genSummary   `json:"summary"`
	}{Model: c, Summary: sum}
	for i, r := range res {
		gaps := r.Gaps
		for j := range gaps {
			if math.IsInf(float64(gaps[j]), 0) || math.IsNaN(float64(gaps[j])) {
				gaps[j] = -1 // JSON has no infinity: no runner-up
			}
		}
		doc.Sequences = append(doc.Sequences, genSeqJSON{Index: i, Prompt: g.texts[i], PromptTokens: reqs[i].Prompt,
			Text: g.text[i].String(), Tokens: nonNil(r.Tokens), Gaps: nonNil(gaps), StopReason: string(r.Reason),
			TTFTMS: ms(r.TTFT), TPOTMS: ms(r.TPOT)})
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return bw.Flush()
}

func nonNil[T any](v []T) []T {
	if v == nil {
		return []T{}
	}
	return v
}
