package atomicfile

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain runs a child's write when the environment asks for one
// (childWrite), so that a test can limit or kill a process mid-write.
func TestMain(m *testing.M) {
	if path := os.Getenv("ATOMICFILE_TEST_CHILD"); path != "" {
		os.Exit(childWrite(path, os.Getenv("ATOMICFILE_TEST_MODE")))
	}
	os.Exit(m.Run())
}

// childWrite writes 1 MiB to path: under a file size limit (mode "fsize")
// it prints the error it got; mode "hang" writes half, says "ready" and
// waits to be killed.
func childWrite(path, mode string) int {
	if mode == "fsize" {
		if err := limitFileSize(4096); err != nil {
			fmt.Println("setrlimit:", err)
			return 2
		}
	}
	err := WriteFile(path, func(w io.Writer) error {
		half := bytes.Repeat([]byte("new "), 128<<10/4)
		if _, err := w.Write(half); err != nil {
			return err
		}
		if mode == "hang" {
			fmt.Println("ready")
			select {}
		}
		_, err := w.Write(bytes.Repeat(half, 7))
		return err
	})
	fmt.Println("error:", err)
	return 0
}

// leftovers lists the entries of dir other than keep.
func leftovers(t *testing.T, dir string, keep ...string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !contains(keep, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func writeString(s string) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := io.WriteString(w, s)
		return err
	}
}

// TestWriteFile: a new file gets os.Create's mode, a replaced one keeps
// its own; nothing else is left in the directory.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref")
	f, err := os.Create(ref)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	path := filepath.Join(dir, "out.json")
	if err := WriteFile(path, writeString("one")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	fi, _ := os.Stat(path)
	rfi, _ := os.Stat(ref)
	if string(got) != "one" || fi.Mode() != rfi.Mode() {
		t.Errorf("new file: %q mode %v, want %q mode %v (os.Create's)", got, fi.Mode(), "one", rfi.Mode())
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, writeString("two")); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(path)
	fi, _ = os.Stat(path)
	if string(got) != "two" || fi.Mode().Perm() != 0o600 {
		t.Errorf("replaced file: %q mode %v, want %q mode 0600", got, fi.Mode(), "two")
	}
	if l := leftovers(t, dir, "ref", "out.json"); l != nil {
		t.Errorf("left behind: %v", l)
	}
}

// TestFailedWriteKeepsOld: a writer that fails mid-way leaves the old file
// as it was and no temporary file; a new path is not created.
func TestFailedWriteKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := WriteFile(path, func(w io.Writer) error {
		if _, err := w.Write(bytes.Repeat([]byte("x"), 1<<16)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("error %v, want the writer's", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("old file now holds %.20q", got)
	}
	fresh := filepath.Join(dir, "new.json")
	if err := WriteFile(fresh, func(io.Writer) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("error %v", err)
	}
	if l := leftovers(t, dir, "out.json"); l != nil {
		t.Errorf("left behind: %v", l)
	}
}

// TestCreateCommitAbort: nothing is visible at the path before Commit;
// Abort leaves the old file; a write after Commit fails.
func TestCreateCommitAbort(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cpu.prof")
	f, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(f, "profile")
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the target exists before Commit: %v", err)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(f, "more"); err == nil {
		t.Error("write after Commit succeeded")
	}
	if err := f.Abort(); err != nil {
		t.Errorf("Abort after Commit: %v", err)
	}
	f, err = Create(path)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(f, "half")
	if err := f.Abort(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "profile" {
		t.Errorf("after Abort: %q", got)
	}
	if l := leftovers(t, dir, "cpu.prof"); l != nil {
		t.Errorf("left behind: %v", l)
	}
}

// TestReadOnly: a directory where no file can be created, and a file its
// user may not write, fail and stay as they were (rename would replace
// the read-only file).
func TestReadOnly(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes regardless of permissions")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	if err := WriteFile(path, writeString("new")); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("write in a read-only directory: %v", err)
	}
	if err := Check(path); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Check in a read-only directory: %v", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("file now %q", got)
	}
	os.Chmod(dir, 0o755)
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, writeString("new")); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("write over a read-only file: %v", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("read-only file now %q", got)
	}
}

// child starts this test binary writing path in mode (childWrite).
func child(t *testing.T, path, mode string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_TEST_CHILD="+path, "ATOMICFILE_TEST_MODE="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, bufio.NewScanner(out)
}

// TestFileSizeLimit: over RLIMIT_FSIZE (ulimit -f) the write fails with
// "file too large" and the old file stays whole.
func TestFileSizeLimit(t *testing.T) {
	if !canLimitFileSize {
		t.Skip("no RLIMIT_FSIZE here")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, sc := child(t, path, "fsize")
	var out strings.Builder
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "error: ") || strings.Contains(out.String(), "error: <nil>") {
		t.Fatalf("the write over the limit did not fail:\n%s", out.String())
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("old file now holds %d bytes: %.20q", len(got), got)
	}
	if l := leftovers(t, dir, "out.json"); l != nil {
		t.Errorf("left behind: %v", l)
	}
}

// TestKilledMidWrite: a process killed while writing leaves the old file
// whole (and at most its temporary file).
func TestKilledMidWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, sc := child(t, path, "hang")
	if !sc.Scan() || sc.Text() != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child said %q, want ready", sc.Text())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("old file now holds %d bytes: %.20q", len(got), got)
	}
	for _, name := range leftovers(t, dir, "out.json") {
		if !strings.HasPrefix(name, ".out.json.tmp-") {
			t.Errorf("unexpected file %s", name)
		}
	}
}

// TestSymlink: a link is followed, the file it names replaced and the
// link kept.
func TestSymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real.json")
	link := filepath.Join(dir, "link.json")
	if err := os.WriteFile(real, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real.json", link); err != nil {
		t.Skip("no symbolic links here:", err)
	}
	if err := WriteFile(link, writeString("new")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(link)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v %v", fi.Mode(), err)
	}
	if got, _ := os.ReadFile(real); string(got) != "new" {
		t.Errorf("linked file holds %q", got)
	}
	dangling := filepath.Join(dir, "dangling.json")
	if err := os.Symlink("made.json", dangling); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(dangling, writeString("made")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "made.json")); string(got) != "made" {
		t.Errorf("file behind a dangling link holds %q", got)
	}
}

// TestDevice: a device is written in place and never removed, also when
// the write fails (/dev/full: no space left).
func TestDevice(t *testing.T) {
	for _, dev := range []string{"/dev/null", "/dev/full"} {
		before, err := os.Stat(dev)
		if err != nil || before.Mode()&fs.ModeDevice == 0 {
			t.Skipf("no %s here", dev)
		}
		if err := Check(dev); err != nil {
			t.Errorf("Check(%s): %v", dev, err)
		}
		err = WriteFile(dev, writeString("data"))
		if (dev == "/dev/full") != (err != nil) {
			t.Errorf("write to %s: %v", dev, err)
		}
		after, err := os.Stat(dev)
		if err != nil || after.Mode() != before.Mode() || !os.SameFile(before, after) {
			t.Errorf("%s changed: %v, %v", dev, after, err)
		}
	}
	dir := t.TempDir()
	if err := WriteFile(dir, writeString("x")); err == nil {
		t.Error("a directory was written")
	}
	if err := Check(dir); err == nil {
		t.Error("Check passed a directory")
	}
	if err := Check(filepath.Join(dir, "no", "such", "dir", "x.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Check of a missing directory: %v", err)
	}
	if l := leftovers(t, dir); l != nil {
		t.Errorf("Check left %v", l)
	}
}
