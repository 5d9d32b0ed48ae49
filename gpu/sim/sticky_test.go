package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestStickyErrorSaysHowToRecover: after a kernel faults, a later call's
// error names the kernel, says how to recover with calls the caller has
// (gpu.Backend has no ResetDevice: the optional gpu.DeviceResetter, which
// the backend opened through gpu.Open implements), and doing what it says
// recovers the device.
func TestStickyErrorSaysHowToRecover(t *testing.T) {
	var b gpu.Backend = newSim(t, Config{})
	raw := b.(*Backend)
	k := loadKernels(t, raw, 0)
	s := newStream(t, raw, 0)
	y := alloc(t, raw, 0, 16)
	must(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(1000), fillArgs(y, 1, 1000), s))
	err := b.StreamSynchronize(s)
	wantFault(t, err)
	err = b.StreamSynchronize(s)
	for _, want := range []string{"sg_fill", "is sticky on device 0", "gpu.DeviceResetter", "ResetDevice(0)", "close the backend and open a new one"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("later call: %v; want it to say %q", err, want)
		}
	}
	if !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Errorf("later call: %v, want the fault", err)
	}
	r, ok := b.(gpu.DeviceResetter)
	if !ok {
		t.Fatal("the message names gpu.DeviceResetter, which the sim backend does not implement")
	}
	must(t, r.ResetDevice(0))
	must(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(4), fillArgs(y, 3, 4), s))
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, raw, y, 4), 3)
}
