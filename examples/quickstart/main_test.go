package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
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
		"step 19: y = [0.905 0.905 1.000 -0.462]",
	}
	if len(lines) != len(want)+1 {
		t.Fatalf("output:\n%s", out)
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("line %d: %q, want %q", i, lines[i], w)
		}
	}
	last := regexp.MustCompile(`^20 steps on (sim|cuda), strategy (patch|stable|pool) \(auto's choice\): \d+ graph launches, 0 re-records$`)
	if !last.MatchString(lines[len(want)]) {
		t.Errorf("last line %q does not match %s", lines[len(want)], last)
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
