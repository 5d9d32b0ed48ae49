// Package netsim gives the sim backend collectives between processes, so
// that the one-process-per-GPU path (launchers, the rendezvous, each rank's
// set-up and run) works, and is tested, without GPUs.
//
// It is a transport, nothing more: New makes a sim.Transport of a
// rendezvous group, and the sim, given it (sim.Config.Transport or
// (*sim.Backend).SetTransport), runs every communicator with one rank per
// process, exchanging the ranks' data through the group (gpu/sim's
// transport.go says how). The backend stays the sim itself, so each rank
// keeps every capability the sim has, and the collectives give the bits
// the sim gives with every rank in one process.
package netsim

import (
	"context"
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/rendezvous"
)

// Group is what the transport needs of a rendezvous: *rendezvous.Group is
// one.
type Group interface {
	AllGather(ctx context.Context, data []byte) ([][]byte, error)
	Rank() int
	World() int
	MaxMessage() int
}

// Transport carries the sim's collectives over a rendezvous group.
type Transport struct{ g Group }

var _ sim.Transport = (*Transport)(nil)

// New returns the transport of group g.
func New(g Group) *Transport { return &Transport{g: g} }

// Rank is this process's rank in the group.
func (t *Transport) Rank() int { return t.g.Rank() }

// World is the number of processes in the group.
func (t *Transport) World() int { return t.g.World() }

// MaxMessage is the group's.
func (t *Transport) MaxMessage() int { return t.g.MaxMessage() }

// AllGather is the group's, its timeouts wrapping gpu.ErrTimeout (which the
// sim reports as the collective's timeout; any other error is a rank lost).
func (t *Transport) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	parts, err := t.g.AllGather(ctx, data)
	if err != nil && errors.Is(err, rendezvous.ErrTimeout) && !errors.Is(err, gpu.ErrTimeout) {
		err = fmt.Errorf("%w: %w", gpu.ErrTimeout, err)
	}
	return parts, err
}
