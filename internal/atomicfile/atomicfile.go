// Package atomicfile writes files whole or not at all. It is the one way
// the stablegraph command and its packages write a file (reports, charts,
// safetensors weights and dumps, CPU profiles).
//
// # The rule
//
// A regular file (or a path that does not exist yet) is written to a
// temporary file in the same directory, synced, and renamed over the
// target: a reader sees the old contents or the new ones, never a part,
// and a write that fails (a full disk, a file size limit, an error of the
// caller's writer, an interrupted process) leaves the old file as it was.
// The temporary file, named "."+base+".tmp-"+random, is removed on
// failure; a process killed mid-write may leave one behind, never a
// truncated target. A new file gets the mode os.Create would give it
// (0666 less the umask), a replaced one keeps its permission bits, and a
// target its user may not write is refused as os.Create would refuse it
// (rename would replace it anyway). A symbolic link is followed: the file
// it names is replaced and the link kept.
//
// A target that is not a regular file (a device such as /dev/null, a FIFO,
// a socket) cannot be replaced: it is opened and written in place, for
// appending, and is never removed, whatever happens. So is a path through
// /proc (/dev/stdout, /dev/fd/N: a descriptor the caller already has open,
// which the shell may have pointed at a file).
//
// Nothing here removes a path this package did not create.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// File is a file being written. Write to it, then Commit to put it in
// place, or Abort to drop it; after either, the other does nothing. A File
// is not safe for concurrent use.
type File struct {
	f      *os.File
	path   string // as given
	target string // the file renamed over at Commit; "" when written in place
	done   bool
}

// Create starts writing the file at path (see the package doc for what
// happens to a file that exists there). Nothing is visible at path before
// Commit, unless path is written in place.
func Create(path string) (*File, error) {
	target, inPlace, err := resolve(path)
	if err != nil {
		return nil, err
	}
	if inPlace {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return nil, err
		}
		return &File{f: f, path: path}, nil
	}
	mode, exists, err := modeFor(target)
	if err != nil {
		return nil, err
	}
	f, err := createTemp(target)
	if err != nil {
		return nil, err
	}
	if exists {
		// Before any byte is written: the old file's readers only.
		if err := f.Chmod(mode); err != nil {
			return nil, errors.Join(err, f.Close(), os.Remove(f.Name()))
		}
	}
	return &File{f: f, path: path, target: target}, nil
}

// Name is the path Create was given.
func (f *File) Name() string { return f.path }

// Write writes to the file (to the temporary file until Commit).
func (f *File) Write(p []byte) (int, error) {
	if f.done {
		return 0, fmt.Errorf("atomicfile: write %s: %w", f.path, os.ErrClosed)
	}
	return f.f.Write(p)
}

// Commit syncs the file and renames it over the target, then syncs the
// directory so that the rename outlives a crash. On error the target is as
// it was and the temporary file is gone. A file written in place is synced
// (when it can be) and closed.
func (f *File) Commit() error {
	if f.done {
		return nil
	}
	f.done = true
	if f.target == "" {
		err := f.f.Sync()
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
			err = nil // a device or a pipe: nothing to sync
		}
		return errors.Join(err, f.f.Close())
	}
	tmp := f.f.Name()
	if err := errors.Join(f.f.Sync(), f.f.Close()); err != nil {
		return errors.Join(fmt.Errorf("atomicfile: %s: %w", f.path, err), os.Remove(tmp))
	}
	if err := os.Rename(tmp, f.target); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return syncDir(filepath.Dir(f.target))
}

// Abort drops what was written: the temporary file is closed and removed,
// the target left as it was. A file written in place is only closed: what
// was written to it stays, and it is never removed.
func (f *File) Abort() error {
	if f.done {
		return nil
	}
	f.done = true
	err := f.f.Close()
	if f.target != "" {
		err = errors.Join(err, os.Remove(f.f.Name()))
	}
	return err
}

// WriteFile writes the file at path with fn, whole or not at all: the
// first error of fn, of the write or of the commit is returned, and then
// the old file (if any) is left as it was.
func WriteFile(path string, fn func(io.Writer) error) error {
	f, err := Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		return errors.Join(err, f.Abort())
	}
	return f.Commit()
}

// Check reports whether the file at path could be written by Create,
// without changing anything there: for a regular file or a new one, a
// temporary file is created in its directory and removed; an existing
// regular file must be writable; a target written in place must open for
// writing (a FIFO with no reader yet counts as writable). It is for a
// command to fail on a bad path before a long run rather than after it.
func Check(path string) error {
	target, inPlace, err := resolve(path)
	if err != nil {
		return err
	}
	if inPlace {
		// Non-blocking: opening a FIFO for writing would wait for a
		// reader.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0)
		if errors.Is(err, syscall.ENXIO) {
			return nil // a FIFO with no reader yet
		}
		if err != nil {
			return err
		}
		return f.Close()
	}
	if _, _, err := modeFor(target); err != nil {
		return err
	}
	f, err := createTemp(target)
	if err != nil {
		return err
	}
	return errors.Join(f.Close(), os.Remove(f.Name()))
}

// maxLinks bounds the symbolic links resolve follows, as the kernel does.
const maxLinks = 40

// resolve follows the symbolic links of path to the file a write replaces
// (which may not exist yet), or says that path is written in place: it is
// not a regular file, or a link on the way lies under /proc.
func resolve(path string) (target string, inPlace bool, err error) {
	target = path
	for range maxLinks {
		fi, err := os.Lstat(target)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return target, false, nil
		case err != nil:
			return "", false, err
		case fi.Mode()&fs.ModeSymlink != 0:
			if isProc(target) {
				return "", true, nil
			}
			dest, err := os.Readlink(target)
			if err != nil {
				return "", false, err
			}
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(filepath.Dir(target), dest)
			}
			target = dest
		case fi.IsDir():
			return "", false, &fs.PathError{Op: "write", Path: path, Err: syscall.EISDIR}
		case !fi.Mode().IsRegular():
			return "", true, nil
		default:
			return target, false, nil
		}
	}
	return "", false, &fs.PathError{Op: "write", Path: path, Err: syscall.ELOOP}
}

// isProc reports whether path lies under /proc, where a link is a
// descriptor of a process rather than a path to replace.
func isProc(path string) bool {
	abs, err := filepath.Abs(path)
	return err == nil && (abs == "/proc" || strings.HasPrefix(abs, "/proc/"))
}

// modeFor returns the permission bits a replacement of target keeps, when
// target exists, and refuses a target its user may not write.
func modeFor(target string) (mode fs.FileMode, exists bool, err error) {
	fi, err := os.Stat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	// Opened, not truncated: the permission check of os.Create.
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		return 0, false, err
	}
	if err := f.Close(); err != nil {
		return 0, false, err
	}
	return fi.Mode().Perm(), true, nil
}

// createTemp creates a new file beside target, with the mode os.Create
// gives (0666 less the umask; os.CreateTemp's 0600 is for secrets).
func createTemp(target string) (*os.File, error) {
	dir, base := filepath.Split(target)
	if dir == "" {
		dir = "."
	}
	for range 1000 {
		name := filepath.Join(dir, "."+base+".tmp-"+strconv.FormatUint(rand.Uint64(), 36))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, &fs.PathError{Op: "createtemp", Path: filepath.Join(dir, "."+base+".tmp-*"), Err: fs.ErrExist}
}

// syncDir syncs the directory dir, where a file system allows it.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
		err = nil
	}
	return errors.Join(err, d.Close())
}
