package cu

import (
	"strings"
	"testing"
)

func TestCandidates(t *testing.T) {
	if got := Candidates("/opt/x/libcuda.so.1"); len(got) != 1 || got[0] != "/opt/x/libcuda.so.1" {
		t.Errorf("Candidates(explicit) = %v, want only the explicit file", got)
	}
	got := Candidates("")
	if got[0] != "libcuda.so.1" {
		t.Errorf("first candidate %q, want the loader's libcuda.so.1", got[0])
	}
	for _, want := range []string{"libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1",
		"/usr/local/cuda-13.0/compat/libcuda.so.1", "/usr/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"} {
		if !contains(got, want) {
			t.Errorf("Candidates(\"\") lacks %s", want)
		}
	}
	if !contains(BLASCandidates(""), "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13") {
		t.Errorf("BLASCandidates lacks the GPU machine's cuBLAS")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestLoadErrorListsEveryPlace: a search that finds nothing names each
// candidate with its reason.
func TestLoadErrorListsEveryPlace(t *testing.T) {
	spec := libSpec{what: "libnothing", names: []string{"libnothing-sg.so.1", "libnothing-sg.so"},
		dirs: []string{"/nonexistent/a", "/nonexistent/b"}}
	_, _, _, err := resolve(spec, "", nil)
	le, ok := err.(*LoadError)
	if !ok {
		t.Fatalf("resolve error %T %v, want *LoadError", err, err)
	}
	want := spec.candidates("")
	if len(le.Tried) != len(want) || len(want) != 6 {
		t.Fatalf("tried %d places, want %d: %v", len(le.Tried), len(want), le)
	}
	msg := le.Error()
	for i, p := range want {
		if le.Tried[i].Path != p || le.Tried[i].Err == "" {
			t.Errorf("attempt %d = %+v, want %s with a reason", i, le.Tried[i], p)
		}
		if !strings.Contains(msg, p) {
			t.Errorf("message lacks %s: %s", p, msg)
		}
	}
}

// TestExplicitPathOnly: an explicit file is the only place tried.
func TestExplicitPathOnly(t *testing.T) {
	_, err := Open("/nonexistent/stablegraph/libcuda.so.1")
	le, ok := err.(*LoadError)
	if !ok || len(le.Tried) != 1 || le.Tried[0].Path != "/nonexistent/stablegraph/libcuda.so.1" {
		t.Fatalf("Open(explicit) = %v, want a LoadError naming only that file", err)
	}
	if _, err := OpenBLAS("/nonexistent/stablegraph/libcublas.so"); err == nil {
		t.Fatal("OpenBLAS of a missing file succeeded")
	}
}

// TestWrongLibrary: a library that loads but is not libcuda (libc here) is
// rejected with the missing required symbols named, not used.
func TestWrongLibrary(t *testing.T) {
	_, err := Open("libc.so.6")
	le, ok := err.(*LoadError)
	if !ok || len(le.Tried) != 1 {
		t.Fatalf("Open(libc.so.6) = %v, want a LoadError", err)
	}
	if !strings.Contains(le.Tried[0].Err, "cuInit") {
		t.Errorf("reason %q does not name the missing cuInit", le.Tried[0].Err)
	}
}
