package gpu

// StreamWaits is an optional interface: a stream that waits for a value in
// memory (CUDA's cuStreamWaitValue64 with CU_STREAM_WAIT_VALUE_GEQ). Use
// StreamWaitsOf to get it.
//
// Its use in stablegraph is a gate: a stream held behind a word of mapped
// host memory (HostAlloc) until the host stores a value into it, so that
// everything the host enqueues meanwhile reaches the device at once and
// events around it time the device's work alone (package workload).
//
// The host may write the word with HostMem.Store64; a StreamWriteValue64 on
// another stream may write it too. Nothing else orders the waiting stream:
// an event recorded behind the wait completes only once the condition holds,
// and a stream that waits for a value nobody writes waits for ever (so do
// StreamSynchronize and StreamDestroy's pending work, as on a GPU). The
// caller must keep the memory alive until the wait is over.
type StreamWaits interface {
	// StreamWaitsSupported returns nil when streams of device dev can
	// wait for values, else an error wrapping ErrNotSupported that says
	// why (no 64-bit stream memory operations, a driver without the entry
	// point).
	StreamWaitsSupported(dev int) error
	// StreamWaitValue64 makes later work on s wait until the 8 bytes at p
	// (8-byte aligned, in mapped host memory or device memory), read as a
	// little-endian uint64, are at least v in CUDA's cyclic sense:
	// int64(*p - v) >= 0. A null or misaligned p is ErrInvalidValue, a
	// dead stream ErrInvalidHandle. On a capturing stream it is refused
	// with ErrNotSupported and the capture is left as it was (CUDA would
	// record a wait node; stablegraph never needs one).
	StreamWaitValue64(s Stream, p DevicePtr, v uint64) error
}

// WaitValueReached is the condition of StreamWaitValue64: the word cur has
// reached v in CUDA's cyclic order (CU_STREAM_WAIT_VALUE_GEQ), which keeps
// working across a wrap of the counter.
func WaitValueReached(cur, v uint64) bool { return int64(cur-v) >= 0 }
