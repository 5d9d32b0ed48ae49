package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/models/gpt2"
)

type genJSON struct {
	Model     gpt2.Config `json:"model"`
	Sequences []struct {
		Prompt       string    `json:"prompt"`
		PromptTokens []int32   `json:"prompt_tokens"`
		Text         string    `json:"text"`
		Tokens       []int32   `json:"tokens"`
		Gaps         []float32 `json:"top2_gaps"`
		StopReason   string    `json:"stop_reason"`
	} `json:"sequences"`
	Summary genSummary `json:"summary"`
}

// TestGenerateTiny: with no weights, generate writes a tiny random model,
// generates on sim, and says the text is random; the JSON holds the
// sequences and a summary whose graphs were recorded once.
func TestGenerateTiny(t *testing.T) {
	needSim(t)
	code, out, errs := runCLI(t, "--backend", "sim", "generate", "--prompt", "Hello", "--prompt", "Good morning, dear", "--max-new-tokens", "4", "--json", "-")
	if code != exitOK {
		t.Fatalf("code %d\nstderr:\n%s", code, errs)
	}
	var doc genJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Sequences) != 2 || doc.Sequences[0].PromptTokens[0] != 15496 || len(doc.Sequences[1].PromptTokens) != 4 {
		t.Fatalf("sequences %+v", doc.Sequences)
	}
	for i, s := range doc.Sequences {
		if len(s.Tokens) != 4 || s.StopReason != "budget" || s.Text == "" || len(s.Gaps) != 4 {
			t.Errorf("sequence %d: %+v", i, s)
		}
	}
	sum := doc.Summary
	if !sum.RandomModel || !sum.Simulated || sum.Tokens != 8 || sum.Rerecords != 0 || sum.Rows != 2 || sum.Requested != "auto" || sum.Strategy == "" || sum.MaxPositions != 4+4 {
		t.Errorf("summary %+v", sum)
	}
	for _, want := range []string{"text is random", "tokens/s", "time to first token p50", "graphs recorded", "start-up", "not a GPU measurement"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	// Text mode: one prompt streams after itself on stdout.
	code, out, errs = runCLI(t, "--backend", "sim", "generate", "--prompt", "Hello", "--max-new-tokens", "3")
	if code != exitOK || !strings.HasPrefix(out, "Hello") || len(out) <= len("Hello\n") {
		t.Errorf("code %d, stdout %q\n%s", code, out, errs)
	}
}

// tinyCheckpoint writes a one-layer random GPT-2 with GPT-2's vocabulary
// and 64 positions into a new directory.
func tinyCheckpoint(t *testing.T) (string, gpt2.Config) {
	t.Helper()
	c := gpt2.Config{Layers: 1, Width: 64, Heads: 4, Vocab: 50257, Positions: 64}
	w, err := gpt2.Generate(c, 3)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := w.Save(dir, nil); err != nil {
		t.Fatal(err)
	}
	return dir, c
}

// TestGenerateBadInput: each bad input fails naming what is wrong, before
// the backend is opened (no "on backend" line).
func TestGenerateBadInput(t *testing.T) {
	needSim(t)
	dir, c := tinyCheckpoint(t)
	long := strings.Repeat("word ", 70)
	promptsFile := filepath.Join(t.TempDir(), "prompts.txt")
	os.WriteFile(promptsFile, []byte("\n  \n"), 0o644)
	for _, cs := range []struct {
		name   string
		args   []string
		config func(gpt2.Config) gpt2.Config
		setup  func() (teardown func())
		code   int
		want   string
	}{
		{name: "no prompts", args: nil, code: exitUsage, want: "no prompts"},
		{name: "empty prompt list", args: []string{"--prompts", promptsFile}, code: exitUsage, want: "no prompts"},
		{name: "empty prompt", args: []string{"--prompt", ""}, code: exitUsage, want: "prompt 0 is empty"},
		{name: "prompts file", args: []string{"--prompts", filepath.Join(dir, "nope")}, code: exitUsage, want: "--prompts"},
		{name: "prompt too long", args: []string{"--prompt", "hi", "--prompt", long}, code: exitUsage, want: "prompt 1: prompt of 71 tokens is longer than the context of 64"},
		{name: "budget", args: []string{"--prompt", "hi", "--max-new-tokens", "64"}, code: exitUsage, want: "prompt 0: prompt of 1 tokens + 64 new tokens = 65, past the context of 64"},
		{name: "missing tensor", args: []string{"--prompt", "hi"}, code: exitFailure, want: `no tensor "h.1.ln_1.weight"`,
			config: func(c gpt2.Config) gpt2.Config { c.Layers = 2; return c }},
		{name: "wrong shape", args: []string{"--prompt", "hi"}, code: exitFailure, want: `tensor "wpe.weight" has shape [64 64], the config needs [32 64]`,
			config: func(c gpt2.Config) gpt2.Config { c.Positions = 32; return c }},
		{name: "unreadable tokenizer", args: []string{"--prompt", "hi"}, code: exitFailure, want: "tokenizer.json",
			setup: func() func() {
				p := filepath.Join(dir, "tokenizer.json")
				os.Mkdir(p, 0o755)
				return func() { os.Remove(p) }
			}},
		{name: "strategy", args: []string{"--prompt", "hi", "--strategy", "bogus"}, code: exitUsage, want: `bogus`},
		{name: "top-p above 1", args: []string{"--prompt", "hi", "--temperature", "1", "--top-p", "3"}, code: exitUsage, want: "top-p 3 outside (0, 1]"},
		{name: "top-p 0", args: []string{"--prompt", "hi", "--temperature", "1", "--top-p", "0"}, code: exitUsage, want: "--top-p 0 outside (0, 1]"},
		{name: "top-p negative", args: []string{"--prompt", "hi", "--temperature", "1", "--top-p", "-0.5"}, code: exitUsage, want: "top-p -0.5 outside (0, 1]"},
		{name: "temperature", args: []string{"--prompt", "hi", "--temperature", "-0.1"}, code: exitUsage, want: "temperature -0.1: must be 0 (greedy) or positive"},
		{name: "temperature NaN", args: []string{"--prompt", "hi", "--temperature", "NaN"}, code: exitUsage, want: "temperature NaN"},
		{name: "top-k negative", args: []string{"--prompt", "hi", "--temperature", "1", "--top-k", "-1"}, code: exitUsage, want: "top-k -1 is negative"},
		{name: "top-k past the vocabulary", args: []string{"--prompt", "hi", "--temperature", "1", "--top-k", "50258"}, code: exitUsage,
			want: "prompt 0: gpt2: top-k 50258 is more than the vocabulary of 50257 tokens"},
		{name: "top-k greedy", args: []string{"--prompt", "hi", "--top-k", "5"}, code: exitUsage, want: "need --temperature above 0"},
	} {
		cfg := c
		if cs.config != nil {
			cfg = cs.config(c)
		}
		if err := gpt2.WriteConfig(filepath.Join(dir, gpt2.ConfigFile), cfg); err != nil {
			t.Fatal(err)
		}
		teardown := func() {}
		if cs.setup != nil {
			teardown = cs.setup()
		}
		args := append([]string{"--backend", "sim", "generate", "--weights", dir}, cs.args...)
		code, out, errs := runCLI(t, args...)
		teardown()
		if code != cs.code || !strings.Contains(errs, cs.want) {
			t.Errorf("%s: code %d, want %d; stderr lacks %q:\n%s", cs.name, code, cs.code, cs.want, errs)
		}
		if strings.Contains(errs, "on backend") {
			t.Errorf("%s: the backend was opened before the error:\n%s", cs.name, errs)
		}
		if out != "" && cs.code == exitUsage {
			t.Errorf("%s: stdout %q", cs.name, out)
		}
	}
}

// TestGenerateInterrupted: cancelled once tokens stream, generate keeps
// what it printed, ends the line, and exits 130.
func TestGenerateInterrupted(t *testing.T) {
	needSim(t)
	dir, _ := tinyCheckpoint(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := 0
	stderr := &lineWriter{on: func(string) {}}
	out := &lineWriter{on: func(string) {
		if writes++; writes == 4 { // the prompt, then three pieces
			cancel()
		}
	}}
	code := runContext(ctx, []string{"--backend", "sim", "generate", "--weights", dir, "--prompt", "Hello", "--max-new-tokens", "40"}, out, stderr)
	text := out.buf.String()
	if code != exitInterrupted || !strings.Contains(stderr.buf.String(), "stablegraph generate: interrupted") {
		t.Fatalf("code %d\nstdout:\n%s\nstderr:\n%s", code, text, stderr.buf.String())
	}
	if !strings.HasPrefix(text, "Hello") || !strings.HasSuffix(text, "\n") || len(text) <= len("Hello\n") || !strings.Contains(stderr.buf.String(), "tokens/s") {
		t.Errorf("what was generated is not printed, or no summary:\n%q\n%s", text, stderr.buf.String())
	}
}

// TestGenerateSampled: with a seed, sampled tokens are the same run after
// run, drawn on the device (the default) or on the host (--host-sampling),
// under eager or the default strategy, and each sequence's alone or among
// others; the summary says where they were drawn. A stop string taken from
// a sequence's text ends it there.
func TestGenerateSampled(t *testing.T) {
	needSim(t)
	dir, _ := tinyCheckpoint(t)
	gen := func(extra ...string) genJSON {
		t.Helper()
		args := append([]string{"--backend", "sim", "generate", "--weights", dir, "--prompt", "Hello", "--prompt", "Once upon a time",
			"--max-new-tokens", "6", "--seed", "7", "--json", "-"}, extra...)
		code, out, errs := runCLI(t, args...)
		if code != exitOK {
			t.Fatalf("%v: code %d\n%s", extra, code, errs)
		}
		var doc genJSON
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, out)
		}
		return doc
	}
	for _, flags := range [][]string{{"--temperature", "1.3"}, {"--temperature", "0.9", "--top-k", "40"}, {"--temperature", "1", "--top-p", "0.9"}} {
		dev := gen(flags...)
		if s := dev.Summary; s.HostSampling || s.HostDraws != 0 || s.DeviceDraws+s.CandDraws+s.Fallbacks != int64(s.Tokens) || s.Tokens != 12 {
			t.Errorf("%v: device run's summary %+v", flags, s)
		}
		host := gen(append(flags, "--host-sampling")...)
		// (The random model's nucleus of 0.9 spans most of the vocabulary:
		// top-p falls back to the logits, reading as much back.)
		if s := host.Summary; !s.HostSampling || s.HostDraws != int64(s.Tokens) || (!slices.Contains(flags, "--top-p") && s.ReadbackB <= 4*dev.Summary.ReadbackB) {
			t.Errorf("%v: host run's summary %+v (the device run read back %d bytes)", flags, s, dev.Summary.ReadbackB)
		}
		eager := gen(append(flags, "--strategy", "eager")...)
		again := gen(flags...)
		for i, s := range dev.Sequences {
			for name, o := range map[string]genJSON{"--host-sampling": host, "eager": eager, "a second run": again} {
				if !slices.Equal(o.Sequences[i].Tokens, s.Tokens) {
					t.Errorf("%v: sequence %d: %v by default, %v with %s", flags, i, s.Tokens, o.Sequences[i].Tokens, name)
				}
			}
		}
		// The same seed with another seed differs somewhere.
		other := gen(append(flags, "--seed", "8")...)
		if slices.Equal(other.Sequences[0].Tokens, dev.Sequences[0].Tokens) && slices.Equal(other.Sequences[1].Tokens, dev.Sequences[1].Tokens) {
			t.Errorf("%v: seeds 7 and 8 gave the same tokens %v", flags, dev.Sequences[0].Tokens)
		}
	}
	// A stop string: the first three characters of sequence 1's text, which
	// its first tokens hold and its last does not.
	base := gen("--temperature", "1.3")
	s1 := base.Sequences[1]
	stop := string([]rune(s1.Text)[:3])
	if strings.HasSuffix(s1.Text, stop) && len(s1.Text) < 8 {
		t.Fatalf("sequence 1's text %q is too short to take a stop string from", s1.Text)
	}
	stopped := gen("--temperature", "1.3", "--stop", stop)
	got := stopped.Sequences[1]
	if got.StopReason != string(gpt2.StopCallback) || !strings.Contains(got.Text, stop) || len(got.Tokens) >= len(s1.Tokens) ||
		!slices.Equal(got.Tokens, s1.Tokens[:len(got.Tokens)]) {
		t.Errorf("--stop %q: sequence 1 %+v; without it %+v", stop, got, s1)
	}
}
