// Package vmm layers ownership over the gpu interface's virtual memory
// management: physical chunks, address reservations, mappings and access,
// plus the module's one host-visible timeline and the policy every wait on
// it follows. (The allocator whose frees wait for the timeline is
// retire.Allocator.)
// Every helper that takes several driver steps releases everything it
// created when a later step fails, so no error path leaks a handle.
//
// # States
//
// Like the Go runtime's mem.go (None, Reserved, Prepared, Ready), this
// package names the states a piece of device memory moves through and
// documents each helper by the transition it makes:
//
//	None        Nothing exists: no chunk, no address.
//	Created     A physical chunk exists (MemCreate). It uses device memory,
//	            but no address refers to it.
//	Reserved    A virtual address range exists (MemAddressReserve) with no
//	            memory behind it; any access faults.
//	Mapped      A chunk is mapped into the range (MemMap). The memory has an
//	            address, but device code on every device still faults: no
//	            device has been granted access.
//	Accessible  MemSetAccess granted read-write access to the owning device
//	            and the peers asked for; kernels on those devices may use the
//	            range, kernels on other devices fault.
//
// Created and Reserved are independent (a chunk and a range); Mapped and
// Accessible need both. One chunk may be mapped into several ranges at
// once (Allocation.Chunk, MapRange): the remap strategy of package replay
// maps the chunks of the caller's buffers into ranges of its own. The transitions, each with the helper that makes it
// and the driver call underneath:
//
//	None → Created                 Create                      MemCreate
//	Created → None                 PhysicalAllocation.Release  MemRelease
//	None → Reserved                Reserve                     MemAddressReserve
//	Reserved → None                Reservation.Free            MemAddressFree
//	Created+Reserved → Mapped      Map, MapRange (a part)      MemMap
//	Mapped → Accessible            Mapping.SetAccess           MemSetAccess
//	Mapped, Accessible → Created+Reserved
//	                               Mapping.Close               MemUnmap (access goes with it)
//	None → Accessible              Allocate                    the four above, in order
//	Accessible → None              Allocation.Close            MemUnmap, MemAddressFree, MemRelease
//
// A reservation can be freed only when nothing is mapped in it. A chunk
// released while still mapped stays alive until its last mapping goes, as in
// CUDA; Allocation.Close still unmaps first and releases last, so that
// each step leaves a state the table names.
//
// # Errors and cleanup
//
// Allocate undoes the steps it completed in reverse order when a step fails,
// and returns an *AllocateError naming the step (the gpu method name) that
// failed; if an undo step fails too, its error is joined to the original, so
// nothing is swallowed. Every Close, Free and Release reports its driver
// error; a handle whose release failed stays open, so the call may be
// retried, and a second release after success is gpu.ErrInvalidHandle.
//
// The helpers take a Driver (a backend's devices) and find its virtual
// memory, an optional capability, with gpu.VirtualMemoryOf; sizes are
// rounded up to the device's allocation granularity. A backend or device
// without virtual memory management gives gpu.ErrNotSupported before any
// handle is created; a Timeline likewise needs gpu.StreamMemOps
// (gpu.StreamMemOpsOf).
//
// # Timelines and deferred frees
//
// A Timeline is an 8-byte counter in pinned host memory that streams advance
// with StreamWriteValue64 and the host reads without synchronizing. It is
// the one timeline type of the module: a pool executable waits on it for
// its slots (package replay), and each device of a client retires freed
// buffers on it (package retire, through package client); a user that
// signals from one stream binds it to that stream (Timeline.Bind), so that
// its waits end at a fault of the stream and Close does not free the word
// under a write still queued. Deferred frees live in package retire, which
// imports this one: retire.Allocator allocates with Allocate and retires
// each free on a retirement queue at the timeline point of the last work
// that used the memory, releasing it only once the timeline has reached
// that point. Every timeline wait follows a WaitPolicy: yields between
// reads for a short bounded time, then sleeps growing to a cap, never past
// its deadline.
//
// # Concurrency
//
// Every type in this package is safe for concurrent use; each guards its
// own state with a mutex held across its (short, non-blocking) driver calls
// and never across a wait.
package vmm
