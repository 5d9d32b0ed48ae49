// Package gpu is the backend-neutral device interface of stablegraph.
//
// It plays the role that database/sql/driver plays for databases: it names
// the small core every backend provides (Backend: devices, streams, events,
// device memory, modules and kernels, graphs) and the optional capabilities
// a backend may add (capability.go), and nothing else. Policy (allocation, replay strategies, stream caching,
// locking above the driver) lives in the packages built on top of it.
//
// # Two audiences
//
// Users of stablegraph rarely touch this package directly: they write
// programs against the root package and let it drive a Backend. Backend
// authors implement Backend and register a Driver from an init function:
//
//	func init() { gpu.Register("sim", simDriver{}) }
//
// docs/ARCHITECTURE.md ("Adding a backend") walks a new backend through it.
//
// Open picks a registered driver by name; "auto" tries the drivers by the
// Priority each reports (hardware before simulators: "cuda" when its
// library loads and finds a device, else "sim"), returning the reason for
// its choice. Each backend owns its configuration (a type of its package,
// such as sim.Config or cuda.Config), passed in Config.Backends; Config
// itself holds only what every backend reads.
//
// # Handles
//
// Streams, events, allocations, graphs and so on are opaque typed handles
// (Stream, Event, PhysMem, Graph, ...). Their numeric value means something
// only to the backend that issued them. The zero value of every handle type
// is invalid; a backend returns ErrInvalidHandle for it.
//
// # Concurrency
//
// A Backend is safe for concurrent use by multiple goroutines, with one
// exception taken from the CUDA driver documentation: a Graph, and the
// GraphExec instantiated from it, must not be used from two goroutines at
// once (building, instantiating, cloning, updating and launching one graph
// must be serialised by the caller). Work submitted to one Stream runs in
// submission order; work on different streams may overlap.
//
// # Contexts
//
// Every handle belongs to one device. A backend makes that device's context
// current on the calling OS thread for each call, including destruction and
// queries made from other goroutines or finalizers; callers never manage
// contexts themselves.
//
// # Errors
//
// Every error a backend returns wraps one of the sentinels in errors.go, so
// callers test with errors.Is. Backend errors also name the entry point that
// failed and, for CUDA, keep the CUresult name and number (see Error).
//
// # Optional capabilities
//
// What not every backend or device has is an optional interface, found by
// type assertion in one file, capability.go, whose helpers return
// ErrNotSupported with the reason when a backend or device cannot do it
// and say what the caller does instead: virtual memory (VirtualMemoryOf),
// host timeline memory and stream writes (StreamMemOpsOf), collectives
// (CollectivesOf), GEMM (GemmOf: matrix products with a bias, a caller's
// workspace and a preparation step outside capture; AlignClass is the
// alignment libraries choose kernels by), GraphNodeReader (memcpy and
// memset nodes read back), allocation extents (AddressRangerOf, extent.go,
// which CheckBinding uses to refuse a range larger than the memory behind
// it), device-side graph updates (DeviceUpdatesOf, devupdate.go: kernel
// nodes whose parameters a kernel changes while the graph runs), stream
// waits (StreamWaitsOf, streamwait.go: a stream held until a word of memory
// reaches a value), handle counts, device reset and fault injection.
// Capabilities lists them for a backend. DeviceProps' VMM and StreamMemOps
// flags describe a device for reports; code never reads them to decide.
//
// # Device code
//
// A ModuleImage holds kernel specs with Go references (what the sim runs)
// and, through Code, device code per Target: PTX, a cubin per
// architecture, an AMD code object. A backend asks CodeFor the formats it
// loads, in its order of preference.
//
// # Refused graph updates
//
// A graph exec update the backend cannot apply, whole-graph or per node, is
// an *UpdateError wrapping ErrGraphUpdate, the same on every backend for the
// same situation (the Graphs interface lists them); the exec graph is
// unchanged and re-instantiating is the way forward. Bad input to the same
// calls is ErrInvalidValue or ErrInvalidHandle, which re-recording would not
// cure.
package gpu
