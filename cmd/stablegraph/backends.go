package main

// The backends register themselves with gpu.Register from init.
import (
	_ "github.com/stablegraph/stablegraph/gpu/cuda"
	_ "github.com/stablegraph/stablegraph/gpu/sim"
)
