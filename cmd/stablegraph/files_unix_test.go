//go:build unix

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// limitFileSize sets this process's RLIMIT_FSIZE (ulimit -f) to n bytes.
func limitFileSize(n uint64) error {
	return syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: n})
}

// TestFileSizeLimit: under ulimit -f a report that does not fit fails the
// command (exit 1, saying why) and the file that was there stays whole,
// for --json and --plot alike.
func TestFileSizeLimit(t *testing.T) {
	needSim(t)
	for _, flag := range []string{"--json", "--plot"} {
		dir := t.TempDir()
		path := filepath.Join(dir, "out.svg")
		if flag == "--json" {
			path = filepath.Join(dir, "out.json")
		}
		if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], append([]string{"--backend", "sim", "bench", "--steps", "2", "--strategies", "patch", flag, path}, tiny...)...)
		cmd.Env = append(os.Environ(), "STABLEGRAPH_TEST_RUN_MAIN=1", "STABLEGRAPH_TEST_FSIZE=512")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != exitFailure || !strings.Contains(stderr.String(), "file too large") {
			t.Errorf("%s: exit %d, want %d saying the file is too large; stderr:\n%s", flag, code, exitFailure, stderr.String())
		}
		if got, err := os.ReadFile(path); string(got) != "old" {
			t.Errorf("%s: the old file now holds %d bytes (%v): %.20q", flag, len(got), err, got)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("%s: left in the directory: %v", flag, entries)
		}
	}
}

// TestJSONToFIFO: --json to a FIFO writes the report into it, and leaves
// the FIFO a FIFO.
func TestJSONToFIFO(t *testing.T) {
	needSim(t)
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	got := make(chan []byte, 1)
	go func() {
		// A reader that comes back until it has data: the command may
		// open the FIFO more than once.
		for {
			r, err := os.Open(path)
			if err != nil {
				got <- nil
				return
			}
			b, _ := io.ReadAll(r)
			r.Close()
			if len(b) > 0 {
				got <- b
				return
			}
		}
	}()
	args := append([]string{"--backend", "sim", "bench", "--steps", "2", "--strategies", "patch", "--json", path}, tiny...)
	if code, _, errs := runCLI(t, args...); code != exitOK {
		t.Errorf("exit %d; stderr:\n%s", code, errs)
	}
	if b := <-got; !json.Valid(b) {
		t.Errorf("the reader got %.40q", b)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		t.Errorf("the FIFO is gone or replaced: %v", err)
	}
}

// TestJSONToDevice: --json to a device that refuses the write (a node of
// /dev/full's device: no space left) fails the command and leaves the node
// where it was. It needs to make a device node (root).
func TestJSONToDevice(t *testing.T) {
	needSim(t)
	path := filepath.Join(t.TempDir(), "full")
	if err := syscall.Mknod(path, syscall.S_IFCHR|0o666, 1<<8|7); err != nil {
		t.Skip("cannot make a device node here:", err)
	}
	if f, err := os.OpenFile(path, os.O_WRONLY, 0); err != nil {
		t.Skip("device nodes do not open here (nodev):", err)
	} else {
		f.Close()
	}
	args := append([]string{"--backend", "sim", "bench", "--steps", "2", "--strategies", "patch", "--json", path}, tiny...)
	code, _, errs := runCLI(t, args...)
	if code != exitFailure || !strings.Contains(errs, "no space left") {
		t.Errorf("exit %d, want %d saying there is no space left; stderr:\n%s", code, exitFailure, errs)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		t.Errorf("the device node is gone or replaced: %v", err)
	}
}
