package perrank

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

func TestEach(t *testing.T) {
	var ran atomic.Int64
	boom := errors.New("boom")
	err := Each(4, func(r int) error {
		ran.Add(1 << (4 * r))
		if r == 2 {
			return boom
		}
		return nil
	})
	if ran.Load() != 0x1111 {
		t.Errorf("ranks run: %#x, want each of 4 once", ran.Load())
	}
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "rank 2: boom") || strings.Contains(err.Error(), "rank 0") {
		t.Errorf("Each = %v, want rank 2's error alone, naming it", err)
	}
	if err := Each(3, func(int) error { return nil }); err != nil {
		t.Errorf("Each with no failure = %v", err)
	}
}
