package gputest

// streamWaitCoverage is the coverage table (coverage.go) of the optional
// gpu.StreamWaits interface: each method and the StreamWaits subtests that
// exercise it. TestStreamWaitCoverageTable checks it against the interface
// and the suite; Run checks that each listed subtest calls the method
// (through streamWaitsRecorder).
var streamWaitCoverage = map[string][]string{
	"StreamWaitsSupported": {"StreamWaits/GateHoldsStream", "StreamWaits/Errors"},
	"StreamWaitValue64":    {"StreamWaits/GateHoldsStream", "StreamWaits/Cyclic", "StreamWaits/OpenedByStream", "StreamWaits/Errors"},
}
