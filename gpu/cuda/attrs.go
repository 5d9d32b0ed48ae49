package cuda

import (
	"encoding/binary"
	"errors"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// launchAttrs refuses (gpu.ErrNotSupported) a kernel node whose launch
// attributes gpu.KernelParams cannot carry: a thread-block cluster or a
// cooperative launch, which a library may set when it launches. A node
// made again from its KernelParams alone (a flattened trace, a template's
// graph) would launch without them, so such a node must stay inside the
// graph it was captured in. A driver without cuGraphKernelNodeGetAttribute
// cannot say, nor one that reports an attribute as invalid (not set); such
// nodes pass.
func (b *Backend) launchAttrs(op string, dev int, n cu.GraphNode) error {
	if !b.d.Has("cuGraphKernelNodeGetAttribute") {
		return nil
	}
	get := func(attr cu.LaunchAttributeID) (*[64]byte, error) {
		var v cu.LaunchAttributeValue
		err := b.call(dev, "cuGraphKernelNodeGetAttribute", func() cu.Result {
			return b.d.GraphKernelNodeGetAttribute(n, attr, &v)
		})
		if errors.Is(err, gpu.ErrInvalidValue) {
			return new([64]byte), nil
		}
		return v.Raw(), err
	}
	v, err := get(cu.LaunchAttributeClusterDimension)
	if err != nil {
		return err
	}
	x, y, z := binary.LittleEndian.Uint32(v[0:]), binary.LittleEndian.Uint32(v[4:]), binary.LittleEndian.Uint32(v[8:])
	if x > 1 || y > 1 || z > 1 {
		return errf(op, gpu.ErrNotSupported, "the kernel node launches thread-block clusters of %d×%d×%d, which its parameters alone do not carry", x, y, z)
	}
	if v, err = get(cu.LaunchAttributeCooperative); err != nil {
		return err
	}
	if binary.LittleEndian.Uint32(v[0:]) != 0 {
		return errf(op, gpu.ErrNotSupported, "the kernel node is a cooperative launch, which its parameters alone do not carry")
	}
	return nil
}
