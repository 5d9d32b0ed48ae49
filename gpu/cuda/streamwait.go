package cuda

import (
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// Stream waits on memory values (gpu.StreamWaits): cuStreamWaitValue64_v2
// with CU_STREAM_WAIT_VALUE_GEQ. It needs what StreamWriteValue64 needs (the
// device's 64-bit stream memory operations, attribute 122) and the entry
// point itself.

var _ gpu.StreamWaits = (*Backend)(nil)

// StreamWaitsSupported implements gpu.StreamWaits.
func (b *Backend) StreamWaitsSupported(dev int) error {
	return b.waitsSupported("StreamWaitsSupported", dev)
}

// waitsSupported is StreamWaitsSupported's answer, with errors naming op.
func (b *Backend) waitsSupported(op string, dev int) error {
	d, err := b.device(op, dev)
	if err != nil {
		return err
	}
	if !d.props.StreamMemOps {
		return errf(op, gpu.ErrNotSupported, "device %d (%s) has no 64-bit stream memory operations", dev, d.props.Name)
	}
	if !b.d.Has("cuStreamWaitValue64_v2") {
		return errf(op, gpu.ErrNotSupported, "the driver (%s) does not export cuStreamWaitValue64_v2", b.d.Path)
	}
	return nil
}

// StreamWaitValue64 implements gpu.StreamWaits. A capturing stream is
// refused before the driver sees the call, so that both backends leave the
// capture alone (CUDA would record a wait node, which no gpu.NodeType
// names); that costs one cuStreamIsCapturing per call.
func (b *Backend) StreamWaitValue64(s gpu.Stream, p gpu.DevicePtr, v uint64) error {
	const op = "StreamWaitValue64"
	dev, cs, err := b.stream(op, s)
	if err != nil {
		return err
	}
	if err := b.waitsSupported(op, dev); err != nil {
		return err
	}
	if p == 0 || p%8 != 0 {
		return errf(op, gpu.ErrInvalidValue, "address %#x is null or not 8-byte aligned", uint64(p))
	}
	capturing, err := b.capturing(dev, cs)
	if err != nil {
		return err
	}
	if capturing {
		return errf(op, gpu.ErrNotSupported, "stream %#x is capturing: a wait on a memory value is not recorded into graphs (the capture goes on without it)", uint64(s))
	}
	return b.call(dev, "cuStreamWaitValue64_v2", func() cu.Result {
		return b.d.StreamWaitValue64(cs, cu.DevicePtr(p), v, cu.StreamWaitValueGEQ)
	})
}
