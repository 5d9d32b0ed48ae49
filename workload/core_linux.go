package workload

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// holdCore keeps the calling goroutine on its OS thread, and that thread
// on the CPU it runs on now, until release: every step's host calls then
// run on one core, whose caches and clock the previous step left warm,
// rather than wherever the scheduler wakes the thread after a wait. Where
// the affinity cannot be set (a CPU set that forbids it), the thread is
// still held.
func holdCore() (release func()) {
	runtime.LockOSThread()
	var old unix.CPUSet
	var cpu uint32
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return runtime.UnlockOSThread
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); errno != 0 {
		return runtime.UnlockOSThread
	}
	var one unix.CPUSet
	one.Set(int(cpu))
	if unix.SchedSetaffinity(0, &one) != nil {
		return runtime.UnlockOSThread
	}
	return func() {
		// The thread goes back to the pool with the CPUs it had.
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}
