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
// Every graph a strategy records is counted by one helper that takes its
// cause, base.countRecord (base.go), so that Counters.Rerecords =
// MoveRerecords + UpdateFallbacks + RetryRerecords always holds. A refused
// update (errors.Is(err, gpu.ErrGraphUpdate); the *gpu.UpdateError's
// Result says why) is logged in full at debug level (base.refused) and
// counted by reason in Fallbacks when its re-record succeeds, so that
// Fallbacks sums to UpdateFallbacks. TestEveryRecordCounted holds every
// registered strategy to both, states rebound, updates refused and failed.
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
// # The contract
//
// The vocabulary every strategy shares lives in the contract files, and
// nowhere else: strategy.go (Strategy, Name and the strategies' names,
// Result, Lease, the optional capabilities and their fallbacks, Status),
// spec.go (Spec, Buffer, Class, Flow, Classes, the options groups'
// container Options, ChunkFinder), choice.go (Choice, Candidate),
// counters.go (Counters, Memory, Fallbacks), costs.go (Costs), errors.go.
// base.go holds what every strategy embeds: its Spec's backend, commands
// and logger, its counters, and the one helper that counts a recording
// with its cause. registry.go maps names to constructors.
//
// A Spec is everything a strategy is built from: the backend and the
// device's ordinal; the compiled commands (a graph.CommandBuffer, which
// launches the step, records and instantiates it over any address vector,
// updates and patches an instantiated graph, and can be extended with
// commands before and after the step over extra buffers); every buffer's
// name, class, size and flow (what the step reads before writing, what it
// writes, whether in full), split by class once (Classes); the
// executable's alignment, costs and how it polls and bounds its waits for
// the device; the strategies' options; whether the step holds collectives, and
// how the ranks agree on auto's choice then (Agreement, collective.go);
// the executable's kernels by name; and a logger. A strategy keeps what it
// needs and never reaches back into the executable. Buffers are indexed as
// the address vectors Run receives: params and outputs may move every
// step, states when rebound, temps and constants never.
//
// # The strategies
//
// A strategy is one unit: its file, named after it, holds its description
// (its type's doc: the one account of what it does, which the other
// documents point to), its options (a group of Options, with its
// defaults), what it counts, and its code.
//
//   - eager.go: every command launched every step, the reference.
//   - record.go, update.go, patch.go: a graph over the caller's addresses,
//     recorded again, updated whole, or patched node by node when they
//     move (callergraph.go holds what the three share).
//   - device.go: recorded once; the pointers move on the device, from a
//     patcher node before the first node it moves.
//   - stable.go, pool.go: persistent copies of the params and outputs
//     (copies.go holds what the two share, and their CopyOptions).
//   - remap.go: the caller's memory mapped into fixed ranges.
//   - auto.go, probe.go, bound.go, collective.go: the priced strategies
//     measured on the first steps, the fastest kept (agreed over the ranks
//     on a step with collectives).
//
// alias.go finds overlapping bindings (above).
//
// # Adding a strategy
//
//  1. A new file, named after the strategy, with its type and its doc, a
//     constructor func(Spec) (Strategy, error) that releases what it made
//     on error, Run, Counters (embed base, and count every recording with
//     base.countRecord), Close, and the optional capabilities it needs.
//     Run must leave the strategy usable after an error, and must give
//     eager's bits for every address pattern (fresh addresses every step
//     included). Options of its own are a group defined in the same file
//     (with a withDefaults method when it has defaults) and a field of
//     Options (spec.go), which the root's Options embeds.
//  2. A Name constant (strategy.go) and one line in the registry
//     (registry.go); with a model func(Spec) Candidate there, auto weighs
//     it too.
//  3. Its tests: a file named after it. TestStrategiesMatchEager
//     (registry_test.go) runs every registered strategy against eager
//     under fixed, ping-pong and random (fresh) addresses already, and
//     TestEveryRecordCounted holds it to the counting rule; add to
//     checkStats what the new one should count.
//
// A strategy that needs something the Spec lacks adds a field to Spec,
// filled in one place, the root's Executable.spec.
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
