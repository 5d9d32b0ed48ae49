package gputest

import (
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/patchtable"
	"github.com/stablegraph/stablegraph/kernels"
)

// Mutants of the device-update capability (see mutants_test.go). They embed
// *sim.Backend, so that they keep gpu.DeviceUpdates.

func init() { mutants = append(mutants, devUpdateMutants...) }

// optInIgnored hands out DevNodes without opting nodes in: nothing is
// device-updatable, so no rule applies and the patcher changes nothing.
type optInIgnored struct{ *sim.Backend }

func (optInIgnored) GraphKernelNodeSetDeviceUpdatable(n gpu.GraphNode, on bool) (gpu.DevNode, error) {
	if !on {
		return 0, nil
	}
	return gpu.DevNode(0xd000 + n), nil
}

// optOutAllowed lets nodes opt out (doing nothing).
type optOutAllowed struct{ *sim.Backend }

func (m optOutAllowed) GraphKernelNodeSetDeviceUpdatable(n gpu.GraphNode, on bool) (gpu.DevNode, error) {
	if !on {
		return 0, nil
	}
	return m.Backend.GraphKernelNodeSetDeviceUpdatable(n, on)
}

// launchUploads uploads before every launch, so that a missing upload is
// never refused.
type launchUploads struct{ *sim.Backend }

func (m launchUploads) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	if err := m.Backend.GraphUpload(x, s); err != nil {
		return err
	}
	return m.Backend.GraphLaunch(x, s)
}

// rootUnordered adds the node that should run before others with no
// dependents.
type rootUnordered struct{ *sim.Backend }

func (m rootUnordered) GraphAddKernelNodeBefore(g gpu.Graph, p gpu.KernelParams, _ []gpu.GraphNode) (gpu.GraphNode, error) {
	return m.Backend.GraphAddKernelNode(g, nil, p)
}

// patcherInert loads a patcher that advances its control block and applies
// nothing.
type patcherInert struct{ *sim.Backend }

func (m patcherInert) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	if img != nil && img.Name == kernels.PatcherModule().Name {
		img2 := *img
		k := kernels.PatcherSpec()
		k.Ref = func(mem gpu.Memory, _ gpu.LaunchConfig, a []gpu.Arg) error {
			c := make([]byte, patchtable.CtlSize)
			if err := mem.Read(a[0].AsPtr(), c); err != nil {
				return err
			}
			c[0]++ // seq, little-endian, small in the tests
			return mem.Write(a[0].AsPtr(), c)
		}
		img2.Kernels = []gpu.KernelSpec{k}
		img = &img2
	}
	return m.Backend.ModuleLoad(dev, img)
}

var devUpdateMutants = []mutant{
	{"opt-in-ignored", []string{"DeviceUpdates/OptIn", "DeviceUpdates/InstantiateOnce", "DeviceUpdates/NoExecUpdate",
		"DeviceUpdates/UploadBeforeLaunch", "DeviceUpdates/PatchChainSameLaunch", "DeviceUpdates/NotNested"},
		func(b *sim.Backend) gpu.Backend { return optInIgnored{b} }},
	{"opt-out-allowed", []string{"DeviceUpdates/OptIn"},
		func(b *sim.Backend) gpu.Backend { return optOutAllowed{b} }},
	{"launch-uploads", []string{"DeviceUpdates/UploadBeforeLaunch", "DeviceUpdates/HostChangeKeepsDeviceState"},
		func(b *sim.Backend) gpu.Backend { return launchUploads{b} }},
	{"before-unordered", []string{"DeviceUpdates/NodeBefore", "DeviceUpdates/HostChangeKeepsDeviceState", "DeviceUpdates/PatchChainSameLaunch", "DeviceUpdates/PatcherCounts"},
		func(b *sim.Backend) gpu.Backend { return rootUnordered{b} }},
	{"patcher-inert", []string{"DeviceUpdates/PatchChainSameLaunch", "DeviceUpdates/PatcherFromStream", "DeviceUpdates/PatcherCounts"},
		func(b *sim.Backend) gpu.Backend { return patcherInert{b} }},
}
