//go:build !linux

package workload

import "runtime"

// holdCore keeps the calling goroutine on its OS thread until release
// (on Linux, also that thread on its CPU: core_linux.go).
func holdCore() (release func()) {
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}
