package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestMain runs the program itself when the environment asks for it, so
// that TestQuickstart runs main exactly as "go run" does.
func TestMain(m *testing.M) {
	if os.Getenv("QUICKSTART_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestQuickstart runs the program (on sim without a GPU) and checks its
// output: the layer's values at every printed step, whatever strategy auto
// keeps, and that auto ended on a graph strategy that never re-records.
func TestQuickstart(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "QUICKSTART_RUN_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	// tanh of x·I + b, b = (0.5, -0.5), x = ((1, 2), (step, 0)).
	want := []string{
		"step  0: y = [0.905 0.905 0.462 -0.462]",
		"step  1: y = [0.905 0.905 0.905 -0.462]",
		"step  2: y = [0.905 0.905 0.987 -0.462]",
		"step 59: y = [0.905 0.905 1.000 -0.462]",
	}
	if len(lines) != len(want)+1 {
		t.Fatalf("output:\n%s", out)
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("line %d: %q, want %q", i, lines[i], w)
		}
	}
	last := regexp.MustCompile(`^60 steps on (sim|cuda), strategy (patch|stable|pool) \(auto's choice after (\d+) probe steps\): (\d+) graph launches, 0 re-records$`)
	m := last.FindStringSubmatch(lines[len(want)])
	if m == nil {
		t.Fatalf("last line %q does not match %s", lines[len(want)], last)
	}
	// Once auto has chosen, every step is one launch of the kept graph.
	probes, launches := atoi(t, m[3]), atoi(t, m[4])
	if probes < 1 || probes >= 60 || launches != 60-probes {
		t.Errorf("%d probe steps and %d graph launches in 60 steps, want one launch a step after probing", probes, launches)
	}
}

// TestREADMEShowsIt: README.md shows this program in full, as it is.
func TestREADMEShowsIt(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, []byte("```go\n"+string(src)+"```\n")) {
		t.Error("README.md does not show examples/quickstart/main.go in full in a go code block: copy it there")
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
