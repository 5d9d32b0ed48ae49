package cu

import (
	"structs"
	"unsafe"
)

// Device-updatable kernel nodes (CUDA 12.4) and root-node edits of graphs:
// the launch attribute that opts a kernel node in, graph upload, and the
// graph edits that make a new node the root of an existing graph.

// GraphDeviceNode is CUgraphDeviceNode (the runtime's
// cudaGraphDeviceNode_t): a device-updatable node as device code names it.
type GraphDeviceNode uintptr

// LaunchAttributeID is CUlaunchAttributeID, which CUkernelNodeAttrID is.
type LaunchAttributeID uint32

// LaunchAttributeDeviceUpdatableKernelNode is
// CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE (CUDA 12.4+): set on a
// kernel node with deviceUpdatable = 1 to make it device-updatable; reading
// it back gives the node's devNode.
const LaunchAttributeDeviceUpdatableKernelNode LaunchAttributeID = 13

// Launch attributes read back from captured library kernels, which a node
// rebuilt from its parameters alone would lose (cuda/attrs.go).
const (
	LaunchAttributeCooperative      LaunchAttributeID = 2
	LaunchAttributeClusterDimension LaunchAttributeID = 4
)

// DeviceUpdatableKernelNode is the deviceUpdatableKernelNode member of
// CUlaunchAttributeValue (16 bytes): {int deviceUpdatable; CUgraphDeviceNode
// devNode}.
type DeviceUpdatableKernelNode struct {
	_               structs.HostLayout
	DeviceUpdatable int32
	_               [4]byte
	DevNode         GraphDeviceNode
}

// LaunchAttributeValue is CUlaunchAttributeValue, also CUkernelNodeAttrValue:
// a 64-byte union (char pad[64] is its largest member). Only the member this
// project uses is named; the rest must be zero.
type LaunchAttributeValue struct {
	_                         structs.HostLayout
	DeviceUpdatableKernelNode DeviceUpdatableKernelNode
	_                         [48]byte
}

// GraphKernelNodeSetAttribute sets attribute attr of kernel node n to *v.
func (d *Driver) GraphKernelNodeSetAttribute(n GraphNode, attr LaunchAttributeID, v *LaunchAttributeValue) Result {
	return d.call3(symGraphKernelNodeSetAttribute, uintptr(n), uintptr(attr), uintptr(unsafe.Pointer(v)))
}

// GraphKernelNodeGetAttribute reads attribute attr of kernel node n into *v.
func (d *Driver) GraphKernelNodeGetAttribute(n GraphNode, attr LaunchAttributeID, v *LaunchAttributeValue) Result {
	return d.call3(symGraphKernelNodeGetAttribute, uintptr(n), uintptr(attr), uintptr(unsafe.Pointer(v)))
}

// GraphUpload uploads executable graph x to its device, ordered on s.
func (d *Driver) GraphUpload(x GraphExec, s Stream) Result {
	return d.call2(symGraphUpload, uintptr(x), uintptr(s))
}

// GraphGetRootNodes fills nodes (nil to only count) with g's nodes that have
// no dependencies and sets *count to their number.
func (d *Driver) GraphGetRootNodes(g Graph, nodes []GraphNode, count *uint64) Result {
	*count = uint64(len(nodes))
	var p *GraphNode
	if len(nodes) > 0 {
		p = &nodes[0]
	}
	return d.call3(symGraphGetRootNodes, uintptr(g), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(count)))
}

// GraphAddDependencies adds the edges from[i] -> to[i] to g (from and to of
// the same, nonzero length). It uses cuGraphAddDependencies_v2 (CUDA 12.3+,
// default edge data) and falls back to the original.
func (d *Driver) GraphAddDependencies(g Graph, from, to []GraphNode) Result {
	if len(from) == 0 || len(from) != len(to) {
		return ErrorInvalidValue
	}
	if d.fns[symGraphAddDependenciesV2] != 0 {
		return d.call5(symGraphAddDependenciesV2, uintptr(g), uintptr(unsafe.Pointer(&from[0])), uintptr(unsafe.Pointer(&to[0])), 0, uintptr(len(from)))
	}
	return d.call4(symGraphAddDependenciesV1, uintptr(g), uintptr(unsafe.Pointer(&from[0])), uintptr(unsafe.Pointer(&to[0])), uintptr(len(from)))
}

// GraphDestroyNode removes node n, and its edges, from its graph.
func (d *Driver) GraphDestroyNode(n GraphNode) Result {
	return d.call1(symGraphDestroyNode, uintptr(n))
}

// Raw is the union's 64 bytes, for the members this package does not name
// (the cluster dimension is its first three uint32).
func (v *LaunchAttributeValue) Raw() *[64]byte { return (*[64]byte)(unsafe.Pointer(v)) }
