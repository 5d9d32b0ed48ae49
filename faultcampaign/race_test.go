//go:build race

package faultcampaign_test

// raceEnabled: the race detector slows the campaign about fivefold, so CI
// (go test -race ./...) sweeps fewer workloads.
const raceEnabled = true
