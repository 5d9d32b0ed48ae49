package cu

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// libSpec says where to look for one library.
type libSpec struct {
	what  string   // "libcuda", for messages
	names []string // file names, most specific first
	dirs  []string // directories tried after the dynamic loader's own search
}

// The driver library is normally on the loader's path (ldconfig): the bare
// names come first so that LD_LIBRARY_PATH and the system's driver win. The
// directories cover installs that are not (containers, WSL, the CUDA
// forward-compatibility package). The compat directories come last: their
// libcuda may be older than the system driver (on this project's GPU machine
// it is 580.95 under a 580.159 kernel module).
var cudaSpec = libSpec{
	what:  "libcuda",
	names: []string{"libcuda.so.1", "libcuda.so"},
	dirs: []string{
		"/usr/lib/x86_64-linux-gnu",
		"/usr/lib64",
		"/usr/lib",
		"/usr/local/nvidia/lib64",
		"/usr/lib/wsl/lib",
		"/usr/local/cuda/compat",
		"/usr/local/cuda-13.0/compat",
	},
}

// cuBLAS is usually not on the loader's path: toolkits put it in
// /usr/local/cuda/lib64, Python wheels in site-packages/nvidia/.../lib (the
// path on this project's GPU machine is listed).
var blasSpec = libSpec{
	what:  "libcublas",
	names: []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"},
	dirs: []string{
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/local/cuda-13.0/lib64",
		"/usr/lib/x86_64-linux-gnu",
		"/usr/lib64",
		"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib",
		"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cublas/lib",
	},
}

// candidates lists the files tried for spec: only explicit when it is set,
// else the bare names (the dynamic loader's search) and then every name in
// every directory.
func (spec libSpec) candidates(explicit string) []string {
	if explicit != "" {
		return []string{explicit}
	}
	out := append([]string(nil), spec.names...)
	for _, d := range spec.dirs {
		for _, n := range spec.names {
			out = append(out, filepath.Join(d, n))
		}
	}
	return out
}

// Candidates returns the files Open tries for libcuda, in order: explicit
// alone when it is not empty, else the standard names and directories.
func Candidates(explicit string) []string { return cudaSpec.candidates(explicit) }

// BLASCandidates is Candidates for libcublas.
func BLASCandidates(explicit string) []string { return blasSpec.candidates(explicit) }

// Attempt is one candidate a load tried and why it was not used.
type Attempt struct {
	Path string
	Err  string
}

// LoadError reports that no candidate of a library could be used. It lists
// every attempt, in order.
type LoadError struct {
	Library string // "libcuda" or "libcublas"
	Tried   []Attempt
}

func (e *LoadError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cannot load %s; tried %d places:", e.Library, len(e.Tried))
	for _, a := range e.Tried {
		fmt.Fprintf(&b, " [%s: %s]", a.Path, a.Err)
	}
	return b.String()
}

// symSpec is one C function a library wrapper needs: its names, preferred
// first (a newer versioned symbol, then the older one with the same
// signature), and whether loading fails without it.
type symSpec struct {
	names    []string
	required bool
}

// resolve opens the first candidate that loads and exports every required
// symbol of syms, and returns its handle, path and resolved symbols (0 where
// an optional symbol is missing).
func resolve(spec libSpec, explicit string, syms []symSpec) (uintptr, string, []uintptr, error) {
	le := &LoadError{Library: spec.what}
	for _, path := range spec.candidates(explicit) {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			le.Tried = append(le.Tried, Attempt{Path: path, Err: err.Error()})
			continue
		}
		fns := make([]uintptr, len(syms))
		var missing []string
		for i, s := range syms {
			for _, name := range s.names {
				if p, err := purego.Dlsym(h, name); err == nil && p != 0 {
					fns[i] = p
					break
				}
			}
			if fns[i] == 0 && s.required {
				missing = append(missing, s.names[0])
			}
		}
		if len(missing) > 0 {
			// Not the library we want (a stub, an unrelated file):
			// close it and move on.
			_ = purego.Dlclose(h)
			le.Tried = append(le.Tried, Attempt{Path: path, Err: "missing required symbols " + strings.Join(missing, ", ")})
			continue
		}
		return h, path, fns, nil
	}
	return 0, "", nil, le
}

// cache holds loaded libraries for the life of the process, keyed by the
// explicit path asked for ("" for the candidate search). Libraries are never
// closed.
var cache struct {
	sync.Mutex
	drivers map[string]*Driver
	blas    map[string]*BLAS
	nccl    map[string]*NCCL
	lt      map[string]*BLASLt
}
