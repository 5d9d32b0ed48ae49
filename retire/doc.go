// Package retire defers the release of device buffers until the GPU has
// finished with them.
//
// # The timeline rule
//
// A Timeline is a counter that the GPU advances. After each submission the
// host signals the next point on the stream that ran it; the device writes
// that point when the stream reaches it, and Completed reports the highest
// point written. Points are signalled in order on one stream, so
// Completed() >= p means that every submission up to and including the one
// tagged p has finished on the device.
//
// A Batch retired at point p holds buffers whose last use was the submission
// tagged p. The Queue releases it only once the timeline has passed p, never
// earlier, so a kernel still in flight never touches a freed buffer. Point 0
// means "used by no submission": such a batch is released at once.
//
// # When batches are released
//
//   - Poll, and every Retire, reads the timeline without blocking and
//     releases every batch whose point has passed (Stats.ReleasedByPoll). A
//     batch is therefore released no later than the first poll after its
//     point passed.
//   - Bound. Retire does not let more than Options.MaxPending batches wait:
//     when the queue is full after polling, it waits for the oldest pending
//     point only, up to Options.WaitDeadline, and releases what that wait
//     covered (Stats.ReleasedByWait) before it adds the new batch. Pending
//     memory is thus at most MaxPending batches, unless that wait fails (the
//     batch is then added all the same and the error returned).
//   - Drain. Every explicit drain (a client synchronize, a readback that
//     waits for its stream, close) releases every pending batch at once
//     (Stats.ReleasedByDrain): Drain waits for the newest pending point;
//     DrainThrough serves a caller that has just synchronized the stream
//     and so knows the device passed a point without reading the timeline.
//   - ReleaseAll releases without consulting the timeline; it is only for a
//     caller that knows the device will not touch the buffers again (the
//     stream was synchronized and is idle, or dead after a fault).
//
// Waits are the timeline's: vmm.Timeline.Wait polls with yields for a
// short bounded time (1 ms by default), then sleeps with exponential
// back-off to 1 ms, and gives up at its deadline with an error wrapping
// gpu.ErrTimeout: a hung GPU yields an error, never a spinning core
// (docs/ARCHITECTURE.md, rule 3). A batch whose wait failed stays pending;
// the queue prefers holding memory to freeing it early.
//
// Release functions run in point order. Their errors are joined and
// returned by the call that ran them (Retire, Poll, Drain, ReleaseAll);
// nothing is swallowed.
//
// # Timelines
//
// Timeline is the small interface a Queue waits on, so a queue works over
// any counter the GPU advances. The module has one implementation,
// vmm.Timeline: a host-visible 8-byte word that StreamWriteValue64
// writes. A queue's user binds it to the one stream that signals it
// (vmm.Timeline.Bind), so that a wait behind a faulted stream ends at the
// fault and the word is not freed under a write still queued.
//
// # The deferred-free allocator
//
// Allocator allocates device memory with vmm.Allocate and frees it through a
// Queue: Free(a, point) retires a one-item batch whose release is a.Close()
// of a.Size() bytes, so a's memory is never released under a kernel still
// queued on the stream. It follows the Queue's rules above (Free polls, and
// waits for the oldest pending free when Options.MaxPending are pending);
// on top of them it refuses double frees and points never signalled,
// retries a release that failed at the next Poll or Drain, and, when the
// device is out of memory, polls and allocates once more if that released
// anything.
package retire
