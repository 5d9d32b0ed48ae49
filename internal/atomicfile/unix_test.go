//go:build unix

package atomicfile

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

const canLimitFileSize = true

// limitFileSize sets this process's RLIMIT_FSIZE (ulimit -f) to n bytes.
func limitFileSize(n uint64) error {
	return syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: n})
}

// TestFIFO: a FIFO is written in place and never removed: not when its
// reader goes away mid-write (EPIPE), not when the writer fails. Check
// does not wait for a reader.
func TestFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	if err := Check(path); err != nil {
		t.Errorf("Check of a FIFO without a reader: %v", err)
	}
	for _, c := range []struct {
		name     string
		readOnly int // bytes the reader takes before closing; -1: all
		fn       func(io.Writer) error
	}{
		{"reader leaves", 16, func(w io.Writer) error {
			_, err := w.Write(bytes.Repeat([]byte("x"), 1<<20))
			return err
		}},
		{"writer fails", -1, func(w io.Writer) error {
			io.WriteString(w, "half")
			return errors.New("boom")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := make(chan []byte)
			go func() {
				r, err := os.Open(path)
				if err != nil {
					got <- nil
					return
				}
				var b []byte
				if c.readOnly < 0 {
					b, _ = io.ReadAll(r)
				} else {
					b = make([]byte, c.readOnly)
					io.ReadFull(r, b)
				}
				r.Close()
				got <- b
			}()
			if err := WriteFile(path, c.fn); err == nil {
				t.Error("the write succeeded")
			}
			if b := <-got; len(b) == 0 {
				t.Error("the reader got nothing")
			}
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
				t.Errorf("the FIFO is gone or replaced: %v %v", fi, err)
			}
		})
	}
}
