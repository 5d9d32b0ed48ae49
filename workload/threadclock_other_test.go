//go:build !linux

package workload

import "time"

// threadCPU: no per-thread CPU clock here.
func threadCPU() (time.Duration, bool) { return 0, false }

// threadSwitches: no per-thread context switch count here.
func threadSwitches() (int64, bool) { return 0, false }
