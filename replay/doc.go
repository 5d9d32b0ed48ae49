// Package replay holds the replay strategies of stablegraph: the ways of
// running a compiled step every step when the caller's buffers move to new
// addresses between steps. An Executable (package stablegraph) owns one
// Strategy, built by New from a Spec, and calls it through the interfaces
// of this package only; it never knows which strategy it holds.
//
// # Why a public package
//
// The types the strategies report (Counters, Choice, Candidate, Costs) and
// the names they answer to (Name) are part of stablegraph's public API:
// Executable.Stats, Choice and Options use them. Defined here, beside the
// code that fills them, the root package re-exports them by alias
// (stablegraph.Counters is replay.Counters), so users keep one set of
// names, documented where they are produced, and no type is mirrored field
// by field. The rest is public for the same reason database/sql/driver is:
// a strategy is written against Strategy and Spec, and reading them is how
// one learns what a strategy may rely on. The registry itself is closed:
// strategies are added in this package (below), so the Spec may still
// grow with each new strategy without breaking anyone.
//
// # The interface
//
// A Strategy has three required methods: Run (enqueue one step with every
// buffer at the addresses given), Counters (what it did) and Close. The
// rest are optional capabilities, found by type assertion as database/sql
// finds a driver's, each with its fallback in one function (strategy.go):
//
//   - Acquirer: the next step may have to wait for a resource (pool's
//     slots, device's patch tables); the executable waits without its
//     lock.
//   - OutputLeaser: outputs may be the strategy's own memory, leased to the
//     caller (pool's zero-copy outputs); then they need not be bound.
//   - MemoryHolder: device memory of its own (stable's copies, pool's slots).
//   - Chooser: it runs a strategy of its choosing (auto) and says why.
//   - WarmUpper: steps to reach its steady state, so auto measures it after.
//   - AliasSafe: it gives eager's results when bound buffers overlap
//     (below); without it the executable refuses such bindings.
//   - FallbackReporter: why its graph updates were refused, by reason
//     (every strategy embedding base has it).
//
// Every re-record a strategy makes is counted with its cause
// (Counters.Rerecords = MoveRerecords + UpdateFallbacks + RetryRerecords):
// record through recorded.record and copies.go's record, which take the
// cause. A refused update (errors.Is(err, gpu.ErrGraphUpdate); the
// *gpu.UpdateError's Result says why) is logged in full at debug level
// (base.refused) and counted by reason when its re-record succeeds.
//
// # Aliasing
//
// The caller may bind buffers onto one another: an output onto the param
// it is computed from, two outputs onto one address, partial overlaps.
// Eager, record, update and patch compute in the caller's memory, so they
// give eager's semantics by nature. Stable and pool compute over copies of
// their own; copied apart, an overlap would read stale bytes. They could
// refuse such bindings, or run such a step through a strategy that uses
// the caller's addresses (patch); they do neither: for a step whose bound
// buffers overlap, one of them written (Overlaps, alias.go: a sort by
// address, O(n log n), no allocation in the steady state), they lay their
// copies of each overlapping group out as the caller's are, the same
// relative offsets in one region of their own memory (copies.go, "Aliased
// layouts"), and run a graph recorded over that layout. Why this and not
// the others: in-place updates are what frameworks do every step, and this
// keeps such steps what the strategy is for, one launch with only copy
// nodes updated when the caller's buffers move (each pattern of overlaps
// has its graph, a few kept per set of copies); it stays inside the
// strategy, so auto's probes measure what will run; it works with
// zero-copy outputs; and refusing would break callers whose bindings eager
// accepts. Pool's slots are sized for it (a few alignment units more);
// stable allocates the area at its first aliased step. Counters.AliasedSteps
// counts those steps.
//
// A strategy of another kind implements AliasSafe only if it gives eager's
// results for overlapping bindings; otherwise the executable refuses them
// with ErrInvalidBinding naming two of the buffers, so that nothing
// computes other bits silently.
//
// # The spec
//
// A Spec is everything a strategy is built from: the backend and device;
// the compiled commands (a graph.CommandBuffer, which launches the step,
// records and instantiates it over any address vector, updates and
// patches an instantiated graph, and can be extended with commands before
// and after the step over extra buffers); every buffer's name, class, size
// and flow (what the step reads before writing, what it writes, whether in
// full); the options that concern strategies; whether the step holds
// collectives; the executable's kernels by name; and a logger. A strategy keeps what it needs and never
// reaches back into the executable. Buffers are indexed as the address
// vectors Run receives: params and outputs may move every step, states
// when rebound, temps and constants never.
//
// # The strategies
//
// One file each: eager.go launches every command every step (the
// reference); record.go re-records on every move; update.go applies a
// whole-graph exec update; patch.go updates in place the nodes whose
// buffers moved (recorded.go holds what those three share); device.go
// records once and moves the pointers on the device, from the patcher
// node at the graph's root (graph.RecordDevice says what moves where);
// stable.go and
// pool.go run over persistent copies of the params and outputs, the copies
// planned in copies.go (pool.go says how a slot is picked and released);
// remap.go records once over virtual ranges of its own and maps the
// physical memory behind the caller's moved buffers into them every step
// (the caller's memory comes from package remappable, found through
// Options.Remappable); auto.go chooses among the strategies that price
// themselves (Costs, costs.go) and probe.go measures them on the first
// steps.
//
// # The host side of a moving step
//
// A decode loop waits for each step before the next, so what a step costs
// the host is latency the user sees. The strategies that move nodes from
// the host (patch, and device for its lead command and its inline
// patcher) pay the driver's own price and next to nothing of their own:
// the nodes they move are prepared once as a gpu.KernelNodeSet (the
// parameters checked and packed in the driver's form at the first move), a
// step rewrites in place only the pointer words of the nodes that moved,
// and one Apply hands them to the driver, one call per node, the context
// made current once (internal/graph/hostset.go). Nothing is allocated per step, on
// sim or CUDA (TestStubStepAllocatesNothing in package gpu/cuda runs whole
// executables over a stubbed driver). When many nodes of a small graph
// move, one whole-graph update from the host template (the graph the exec
// was made from, its nodes set in place, internal/graph/whole.go) costs less than
// an update per node; patch prices both with Costs every step and takes
// the cheaper (patch.go). stablegraph bench-driver measures the driver's
// prices (node updates by parameter block size, idle and in flight, steps
// of m updates, whole-graph updates per node), and bench sets every
// strategy's host time per moved node beside them, measured in the same
// run.
//
// # How auto ranks
//
// A step awaited before the next is bound by its latency, about its host
// time then its GPU time; steps back to back by the larger of the two. Auto
// ranks the candidates it measured by the bound Options.AutoBound names
// (Bound, bound.go: latency by default), then by the other, then by host
// time, never by GPU time alone: a candidate whose host time exceeds its
// GPU time is bound by its host time (a patch moving a long chain's every
// node has slightly less GPU time than stable and several times its host
// time, and loses). It measures them as stablegraph bench measures a step
// (probe.go): the stream held behind a gate while the candidate enqueues
// it, so that the host time is the clock's and the GPU time the device's
// work alone, whether the caller awaits each step or not, in rounds that
// interleave the candidates, so that a slow phase of the host falls on all
// of them. Its probe steps count in no counter but ProbeSteps, so that the
// counters are those of the strategy that runs, with the graphs the one
// kept recorded while probing, which it runs
// (testdata/probe_picks.txt holds the ranking's cases). On a step with
// collectives the ranks decide together, each candidate ranked by the
// slowest rank's times (collective.go), so that every rank runs the same
// strategy.
//
// # Adding a strategy
//
//  1. A new file, named after the strategy, with its type, a constructor
//     func(Spec) (Strategy, error) that releases what it made on error, Run,
//     Counters (embed base), Close, and the optional capabilities it needs.
//     Run must leave the strategy usable after an error, and must give
//     eager's bits for every address pattern (fresh addresses every step
//     included).
//  2. A Name constant and one line in the registry (registry.go); with a
//     model func(Spec) Candidate there, auto weighs it too.
//  3. Its tests: a file named after it. TestStrategiesMatchEager
//     (registry_test.go) runs every registered strategy against eager
//     under fixed, ping-pong and random (fresh) addresses already; add to
//     its checkStats what the new one should count.
//
// A strategy that needs something the Spec lacks adds a field to Spec (or
// Options), filled in one place, the root's Executable.spec.
//
// # Concurrency
//
// The executable serialises Run, Acquire, Counters and Close under its
// lock; a strategy needs no lock of its own for them. Memory, Choice and
// Status are called without that lock; a strategy that changes what they
// report guards it with its own lock, taken after the executable's (lock
// order: the executable's, then the strategy's: pool's leases, auto's
// info). A Lease may be released from any goroutine. Run may wait for the
// device under the executable's lock only where the strategy exists to
// measure that wait (remap, before it unmaps a range).
package replay
