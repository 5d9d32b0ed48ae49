package cu

import (
	"reflect"
	"testing"
	"unsafe"
)

// The layouts of devupdate.go, as TestStructLayouts checks the others:
// CUlaunchAttributeValue is a 64-byte union (char pad[64]) whose
// deviceUpdatableKernelNode member is {int deviceUpdatable; CUgraphDeviceNode
// devNode} with devNode at 8 (cuda.h of CUDA 12.4 and 13.0).
func TestDevUpdateLayouts(t *testing.T) {
	for _, l := range []layout{
		{"CUlaunchAttributeValue", 64, map[string]uintptr{"DeviceUpdatableKernelNode": 0},
			reflect.TypeFor[LaunchAttributeValue]()},
		{"CUlaunchAttributeValue.deviceUpdatableKernelNode", 16, map[string]uintptr{"DeviceUpdatable": 0, "DevNode": 8},
			reflect.TypeFor[DeviceUpdatableKernelNode]()},
	} {
		if got := l.typ.Size(); got != l.size {
			t.Errorf("sizeof %s: Go %d, C %d", l.name, got, l.size)
		}
		if got := l.typ.Align(); got != 8 {
			t.Errorf("alignof %s: Go %d, C 8 (it holds pointers)", l.name, got)
		}
		got := fieldOffsets(l.typ)
		for name, want := range l.fields {
			if off, ok := got[name]; !ok || off != want {
				t.Errorf("offsetof %s.%s: Go %d (present %v), C %d", l.name, name, off, ok, want)
			}
		}
		if len(got) != len(l.fields) {
			t.Errorf("%s: Go type has %d named fields, the table %d", l.name, len(got), len(l.fields))
		}
	}
	if unsafe.Sizeof(GraphDeviceNode(0)) != 8 || unsafe.Sizeof(LaunchAttributeID(0)) != 4 {
		t.Errorf("CUgraphDeviceNode is a pointer, CUlaunchAttributeID a 32-bit enum")
	}
	if LaunchAttributeDeviceUpdatableKernelNode != 13 {
		t.Errorf("CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE = %d, want 13", LaunchAttributeDeviceUpdatableKernelNode)
	}
}

// TestDevUpdateWrappers checks what the wrappers hand the driver: argument
// order, the attribute value's bytes, and cuGraphAddDependencies_v2 with
// default edge data before the original.
func TestDevUpdateWrappers(t *testing.T) {
	var got []string
	var args []StubArgs
	var val LaunchAttributeValue
	stub := func(name string, a StubArgs) Result {
		got = append(got, name)
		args = append(args, a)
		if name == "cuGraphKernelNodeSetAttribute" {
			val = *argPtr[LaunchAttributeValue](&a, 2)
		}
		if name == "cuGraphKernelNodeGetAttribute" {
			argPtr[LaunchAttributeValue](&a, 2).DeviceUpdatableKernelNode = DeviceUpdatableKernelNode{DeviceUpdatable: 1, DevNode: 0x7000}
		}
		return Success
	}
	d := NewStub("stub", stub)
	in := LaunchAttributeValue{DeviceUpdatableKernelNode: DeviceUpdatableKernelNode{DeviceUpdatable: 1}}
	if r := d.GraphKernelNodeSetAttribute(0x10, LaunchAttributeDeviceUpdatableKernelNode, &in); r != Success {
		t.Fatal(r)
	}
	raw := (*[64]byte)(unsafe.Pointer(&val))
	if raw[0] != 1 || args[0].A[0] != 0x10 || args[0].A[1] != 13 || args[0].N != 3 {
		t.Errorf("cuGraphKernelNodeSetAttribute got args %v and value % x", args[0].A[:3], raw[:16])
	}
	for i, b := range raw[1:] {
		if b != 0 {
			t.Errorf("value byte %d = %#x, want 0", i+1, b)
		}
	}
	var out LaunchAttributeValue
	if r := d.GraphKernelNodeGetAttribute(0x10, LaunchAttributeDeviceUpdatableKernelNode, &out); r != Success ||
		out.DeviceUpdatableKernelNode.DevNode != 0x7000 {
		t.Errorf("cuGraphKernelNodeGetAttribute: %v, %+v", r, out)
	}
	from, to := []GraphNode{1, 1}, []GraphNode{2, 3}
	got, args = nil, nil
	if r := d.GraphAddDependencies(0x20, from, to); r != Success || got[0] != "cuGraphAddDependencies_v2" ||
		args[0].N != 5 || args[0].A[0] != 0x20 || args[0].A[3] != 0 || args[0].A[4] != 2 ||
		unsafe.Slice(argPtr[GraphNode](&args[0], 2), 2)[1] != 3 {
		t.Errorf("cuGraphAddDependencies_v2: %v %v args %v", r, got, args)
	}
	old := NewStub("stub", stub, "cuGraphAddDependencies_v2")
	got, args = nil, nil
	if r := old.GraphAddDependencies(0x20, from, to); r != Success || got[0] != "cuGraphAddDependencies" || args[0].N != 4 || args[0].A[3] != 2 {
		t.Errorf("fallback to cuGraphAddDependencies: %v %v %v", r, got, args)
	}
	if r := d.GraphAddDependencies(0x20, from, to[:1]); r != ErrorInvalidValue {
		t.Errorf("mismatched edge lists: %v", r)
	}
	if r := d.GraphAddDependencies(0x20, nil, nil); r != ErrorInvalidValue {
		t.Errorf("no edges: %v", r)
	}
	var n uint64
	got, args = nil, nil
	if r := d.GraphGetRootNodes(0x30, nil, &n); r != Success || args[0].A[1] != 0 || got[0] != "cuGraphGetRootNodes" {
		t.Errorf("cuGraphGetRootNodes(count): %v %v", r, args)
	}
	for _, name := range []string{"cuGraphKernelNodeSetAttribute", "cuGraphKernelNodeGetAttribute", "cuGraphUpload",
		"cuGraphGetRootNodes", "cuGraphAddDependencies_v2", "cuGraphAddDependencies", "cuGraphDestroyNode"} {
		if !d.Has(name) {
			t.Errorf("%s is not in the symbol table", name)
		}
	}
}

// argPtr returns argument i of a stubbed call as the pointer it is.
func argPtr[T any](a *StubArgs, i int) *T { return *(**T)(unsafe.Pointer(&a.A[i])) }
