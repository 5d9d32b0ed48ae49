package cuda

import (
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

var _ gpu.GraphNodeReader = (*Backend)(nil)

// GraphMemcpyNodeParams implements gpu.GraphNodeReader for one-dimensional
// device-to-device copies (what cuMemcpyDtoDAsync captures into); other
// copies are gpu.ErrNotSupported.
func (b *Backend) GraphMemcpyNodeParams(n gpu.GraphNode) (gpu.MemcpyParams, error) {
	const op = "GraphMemcpyNodeParams"
	ni, dev, err := b.nodeDev(op, n)
	if err != nil {
		return gpu.MemcpyParams{}, err
	}
	if err := b.wantType(op, dev, ni, gpu.NodeMemcpy); err != nil {
		return gpu.MemcpyParams{}, err
	}
	var p cu.Memcpy3D
	if err := b.call(dev, "cuGraphMemcpyNodeGetParams", func() cu.Result { return b.d.GraphMemcpyNodeGetParams(ni.n, &p) }); err != nil {
		return gpu.MemcpyParams{}, err
	}
	device := func(t cu.MemoryType) bool { return t == cu.MemoryTypeDevice || t == cu.MemoryTypeUnified }
	if !device(p.SrcMemoryType) || !device(p.DstMemoryType) || max(p.Height, 1) != 1 || max(p.Depth, 1) != 1 ||
		p.SrcXInBytes != 0 || p.DstXInBytes != 0 || p.SrcY != 0 || p.DstY != 0 || p.SrcZ != 0 || p.DstZ != 0 {
		return gpu.MemcpyParams{}, errf(op, gpu.ErrNotSupported,
			"memcpy node %#x is not a one-dimensional device copy (memory types %d→%d, %d×%d×%d)",
			uint64(n), p.SrcMemoryType, p.DstMemoryType, p.WidthInBytes, p.Height, p.Depth)
	}
	return gpu.MemcpyParams{Dst: gpu.DevicePtr(p.DstDevice), Src: gpu.DevicePtr(p.SrcDevice), Size: p.WidthInBytes}, nil
}

// GraphMemsetNodeParams implements gpu.GraphNodeReader for one-row
// memsets; two-dimensional ones are gpu.ErrNotSupported.
func (b *Backend) GraphMemsetNodeParams(n gpu.GraphNode) (gpu.Memset, error) {
	const op = "GraphMemsetNodeParams"
	ni, dev, err := b.nodeDev(op, n)
	if err != nil {
		return gpu.Memset{}, err
	}
	if err := b.wantType(op, dev, ni, gpu.NodeMemset); err != nil {
		return gpu.Memset{}, err
	}
	var p cu.MemsetNodeParams
	if err := b.call(dev, "cuGraphMemsetNodeGetParams", func() cu.Result { return b.d.GraphMemsetNodeGetParams(ni.n, &p) }); err != nil {
		return gpu.Memset{}, err
	}
	if max(p.Height, 1) != 1 {
		return gpu.Memset{}, errf(op, gpu.ErrNotSupported, "memset node %#x sets %d rows", uint64(n), p.Height)
	}
	return gpu.Memset{Dst: gpu.DevicePtr(p.Dst), Value: p.Value, ElemSize: int(p.ElementSize), Count: p.Width}, nil
}
