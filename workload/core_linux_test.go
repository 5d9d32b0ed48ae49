package workload

import (
	"runtime"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/internal/commtest"

	"golang.org/x/sys/unix"
)

// TestHoldCore: the held thread may run on one CPU only, and release gives
// it back the CPUs it had.
func TestHoldCore(t *testing.T) {
	runtime.LockOSThread() // the checks below must see the held thread
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Skipf("no affinity here: %v", err)
	}
	release := holdCore()
	var held unix.CPUSet
	if err := unix.SchedGetaffinity(0, &held); err != nil {
		t.Fatal(err)
	}
	if n := held.Count(); n != 1 {
		t.Errorf("held on %d CPUs, want 1", n)
	}
	release()
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("after release the thread may run on %d CPUs, %d before", after.Count(), before.Count())
	}
}

// TestHoldForRanks: a rank of several is held on its thread but not pinned
// to a CPU (two ranks could start on one); a single rank is pinned.
func TestHoldForRanks(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil || before.Count() < 2 {
		t.Skipf("affinity %v, %d CPUs", err, before.Count())
	}
	b := openSimN(t, 2, 30*time.Second)
	ws, err := ForRanks("dp", dpShape, commtest.Comms(t, b, 2))
	if err != nil {
		t.Fatal(err)
	}
	release := holdFor(ws[0])
	var held unix.CPUSet
	if err := unix.SchedGetaffinity(0, &held); err != nil {
		t.Fatal(err)
	}
	release()
	if held != before {
		t.Errorf("a rank of 2 was pinned to %d CPUs of %d", held.Count(), before.Count())
	}
	release = holdFor(small(t, "mlp"))
	if err := unix.SchedGetaffinity(0, &held); err != nil {
		t.Fatal(err)
	}
	release()
	if held.Count() != 1 {
		t.Errorf("a single rank was held on %d CPUs", held.Count())
	}
}
