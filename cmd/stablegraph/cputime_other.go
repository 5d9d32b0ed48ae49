//go:build !unix

package main

import "time"

// processCPU is the CPU time this process has used, and true; false where
// the platform cannot say (here).
func processCPU() (time.Duration, bool) { return 0, false }
