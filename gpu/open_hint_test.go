package gpu

import (
	"errors"
	"strings"
	"testing"
)

// TestOpenNotBuiltIn: without the built-in backends registered (this
// package's tests import neither), Open says which import registers them.
func TestOpenNotBuiltIn(t *testing.T) {
	if _, ok := std.lookup("sim"); ok {
		t.Skip("sim is registered in this test binary")
	}
	_, _, err := Open("auto", Config{})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "sim: not built in") ||
		!strings.Contains(err.Error(), `import "github.com/stablegraph/stablegraph", which registers sim and cuda`) {
		t.Errorf("Open(auto): %v", err)
	}
	_, _, err = Open("sim", Config{})
	if err == nil || !strings.Contains(err.Error(), "blank-import github.com/stablegraph/stablegraph/gpu/sim") {
		t.Errorf("Open(sim): %v", err)
	}
	_, _, err = Open("tpu", Config{})
	if err == nil || strings.Contains(err.Error(), "import") {
		t.Errorf("Open(tpu) should name no import: %v", err)
	}
}

// TestBriefCutsAtWords: the auto reason keeps each backend's error brief,
// never cutting a word.
func TestBriefCutsAtWords(t *testing.T) {
	long := strings.Repeat("cannot load libcuda.so.1: no such file; ", 10)
	got := brief(errors.New(long))
	kept := strings.TrimSuffix(got, " … (open it by name for the whole error)")
	if kept == got || len(kept) > briefLen || !strings.HasPrefix(long, kept) || long[len(kept)] != ' ' && long[len(kept)] != ';' {
		t.Errorf("brief: %q", got)
	}
	if got := brief(errors.New(strings.Repeat("é", 100))); !strings.HasPrefix(got, strings.Repeat("é", 80)+" …") {
		t.Errorf("brief of one long word: %q", got)
	}
	if got := brief(errors.New("short")); got != "short" {
		t.Errorf("brief(short) = %q", got)
	}
}
