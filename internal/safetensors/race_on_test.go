//go:build race

package safetensors

// raceEnabled: the race detector slows every byte the parser reads.
const raceEnabled = true
