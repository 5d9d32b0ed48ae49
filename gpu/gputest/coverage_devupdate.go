package gputest

// devUpdateCoverage is the coverage table (coverage.go) of the optional
// gpu.DeviceUpdates interface: each method and the DeviceUpdates subtests
// that exercise it. TestDevUpdateCoverageTable checks it against the
// interface and the suite; Run checks that each listed subtest calls the
// method (through devUpdatesRecorder).
var devUpdateCoverage = map[string][]string{
	"DeviceUpdatesSupported":            {"DeviceUpdates/OptIn", "DeviceUpdates/Errors"},
	"GraphKernelNodeSetDeviceUpdatable": {"DeviceUpdates/OptIn", "DeviceUpdates/NotNested", "DeviceUpdates/Errors"},
	"GraphKernelNodeDevNode":            {"DeviceUpdates/OptIn", "DeviceUpdates/Errors"},
	"GraphAddKernelNodeBefore":          {"DeviceUpdates/NodeBefore", "DeviceUpdates/HostChangeKeepsDeviceState", "DeviceUpdates/PatchChainSameLaunch", "DeviceUpdates/Errors"},
	"GraphUpload":                       {"DeviceUpdates/UploadBeforeLaunch", "DeviceUpdates/PatchChainSameLaunch", "DeviceUpdates/Errors"},
}
