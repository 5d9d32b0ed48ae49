package workload

import (
	"runtime"
	"testing"

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
