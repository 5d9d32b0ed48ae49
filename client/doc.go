// Package client holds what a process needs on its devices for its
// lifetime, beside the executables it runs: streams taken from a stream
// cache (package streamcache), one timeline and one retirement queue per
// device (packages vmm and retire), so that buffers freed while work is in
// flight are released only once the device is done with them, and
// completion callbacks. An Executable (package stablegraph) runs on any
// stream; a Client supplies streams and retires the caller's buffers
// around the steps.
//
//	c, err := client.Open(backend, client.Options{})
//	defer c.Close()
//	s, _ := c.Stream(0, 0)
//	outs, err := exe.Run(ctx, s, bindings)
//	point, err := c.Submitted(0, 0)
//	err = c.Retire(ctx, 0, retire.Batch{{Bytes: n, Release: free}}, point)
//
// # Timelines and retirement
//
// Each device has one timeline, bound to its stream 0. After submitting
// work, the caller calls Submitted with the stream it used; work on another
// stream is first joined into stream 0 (an event), so that one ordered
// timeline covers every stream. Buffers freed after that submission are
// handed to Retire with the point Submitted returned; they are released
// once the device passes it (package retire). Synchronize, Readback and
// Close are explicit drains: they release every pending batch.
//
// # Lifetime
//
// Open is cheap: it takes streams from the cache and starts nothing
// else; a device's timeline is made at its first Submitted or Retire, the
// helper goroutine at the first After. Close waits for the streams, drains
// the helper (every callback runs before the events and streams it touches
// are released), drains the retirement queues, frees the timelines and
// events, and gives the streams back to the cache, which keeps only the
// idle and healthy ones. The Client does not own the backend: close the
// client, purge the cache for the backend (streamcache.Cache.Purge), then
// close the backend.
//
// Driver calls are made from whichever goroutine calls a method, and from
// the helper goroutine; the backend makes the right device context current
// for each (see package gpu).
//
// # Locks
//
// Client.life (shared by every call, exclusive only to mark the client
// closed) comes first; under it a device's mu (timeline creation and
// submission marks), the helper's mu, a stream's mu and a device's evMu
// are each taken alone. Only life's shared side is held across a wait
// for the device (so that Close waits for the calls in progress); a
// retirement queue waits with its own lock released.
package client
