package main

// The backends register themselves with gpu.Register from init.
import (
	_ "stablegraph/gpu/cuda"
	_ "stablegraph/gpu/sim"
)
