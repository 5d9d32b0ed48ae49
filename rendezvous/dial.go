package rendezvous

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"net"
	"time"
)

// The side of Join of ranks other than 0: dial rank 0, answer its
// challenge, check its proof, wait for start.

// dial is Join for ranks other than 0. It dials again, with back-off, when
// rank 0 is not listening yet or closes the connection before welcoming
// this rank (it dropped it under a flood of connections, or restarted).
func (g *Group) dial(ctx context.Context) error {
	cfg := g.cfg
	backoff := 10 * time.Millisecond
	var last error
	for {
		d := net.Dialer{Timeout: time.Second, KeepAlive: 15 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
		if err == nil {
			var final bool
			if final, err = g.handshake(ctx, conn); err == nil {
				return nil
			} else if final {
				return err
			}
		}
		last = err
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return deadlineErr(ctx, fmt.Sprintf("rank %d could not reach rank 0 at %s within %v (last error: %v)", cfg.Rank, cfg.Addr, cfg.Timeout, last))
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// handshake joins over conn. final is false for an error after which
// dialling again may succeed; conn is closed on every error.
func (g *Group) handshake(ctx context.Context, conn net.Conn) (final bool, err error) {
	cfg := g.cfg
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	waited := func(what string) error {
		return deadlineErr(ctx, fmt.Sprintf("rank %d waited %v at %s for %s", cfg.Rank, cfg.Timeout, cfg.Addr, what))
	}
	f, err := readFrame(conn, maxHello)
	if err != nil {
		if ctx.Err() != nil {
			return true, waited("rank 0's challenge")
		}
		if errors.Is(err, ErrMalformed) {
			return true, fmt.Errorf("rank %d: the peer at %s: %w", cfg.Rank, cfg.Addr, err)
		}
		return false, fmt.Errorf("the peer at %s closed the connection before its challenge: %v", cfg.Addr, err)
	}
	switch f.typ {
	case frameChallenge:
	case frameAbort:
		return true, fmt.Errorf("%w: rank 0 at %s gave up: %s", ErrAborted, cfg.Addr, f.body)
	default:
		return true, fmt.Errorf("%w: rank %d: expected a challenge from rank 0 at %s, got %s", ErrMalformed, cfg.Rank, cfg.Addr, frameName(f.typ))
	}
	c, err := decodeChallenge(f.body)
	if err != nil {
		return true, fmt.Errorf("rank %d: the peer at %s: %w", cfg.Rank, cfg.Addr, err)
	}
	if c.version != version {
		return true, fmt.Errorf("%w: rank 0 at %s speaks protocol version %d, rank %d speaks %d (run the same stablegraph on every rank)",
			ErrRejected, cfg.Addr, c.version, cfg.Rank, version)
	}
	rankNonce, err := nonce()
	if err != nil {
		return true, err
	}
	world, rank := uint32(cfg.World), uint32(cfg.Rank)
	p := &peer{rank: 0, conn: conn, frames: make(chan frame, 16)}
	h := hello{version: version, world: world, rank: rank, nonce: rankNonce, proof: proof(cfg.Token, roleRank, c.nonce, rankNonce, world, rank)}
	if err := p.send(frameHello, h.encode()); err != nil {
		return false, fmt.Errorf("rank %d: send hello to %s: %v", cfg.Rank, cfg.Addr, err)
	}
	f, err = readFrame(conn, cfg.MaxMessage)
	if err != nil {
		if ctx.Err() != nil {
			return true, waited("rank 0's answer")
		}
		if errors.Is(err, ErrMalformed) {
			return true, fmt.Errorf("rank %d: the peer at %s: %w", cfg.Rank, cfg.Addr, err)
		}
		return false, fmt.Errorf("rank 0 at %s closed the connection before welcoming rank %d: %v", cfg.Addr, cfg.Rank, err)
	}
	switch f.typ {
	case frameWelcome:
		if !hmac.Equal(f.body, proof(cfg.Token, roleRoot, c.nonce, rankNonce, world, rank)) {
			return true, fmt.Errorf("%w: the peer at %s welcomed rank %d without proving the job token: it is not this job's rank 0 (another job on the port?)",
				ErrAuth, cfg.Addr, cfg.Rank)
		}
	case frameReject:
		hint := ""
		if string(f.body) == notAuthenticated {
			hint = " (is the job token the same on every rank?)"
		}
		return true, fmt.Errorf("%w: rank %d by rank 0 at %s: %s%s", ErrRejected, cfg.Rank, cfg.Addr, f.body, hint)
	case frameAbort:
		return true, fmt.Errorf("%w: rank 0 at %s gave up: %s", ErrAborted, cfg.Addr, f.body)
	default:
		return true, fmt.Errorf("%w: rank %d: expected welcome from rank 0 at %s, got %s", ErrMalformed, cfg.Rank, cfg.Addr, frameName(f.typ))
	}
	// Rank 0 proved the token: from here on it is trusted, and an ended
	// connection means it is gone.
	f, err = readFrame(conn, cfg.MaxMessage)
	if err != nil {
		if ctx.Err() != nil {
			return true, waited("the other ranks")
		}
		return true, fmt.Errorf("%w: rank %d: waiting for start from rank 0 at %s: %v", ErrPeerLost, cfg.Rank, cfg.Addr, err)
	}
	switch f.typ {
	case frameStart:
		_ = conn.SetDeadline(time.Time{})
		g.conns = []*peer{p}
		return false, nil
	case frameAbort:
		return true, fmt.Errorf("%w: rank 0 at %s gave up: %s", ErrAborted, cfg.Addr, f.body)
	}
	return true, fmt.Errorf("%w: rank %d: expected start from rank 0, got %s", ErrMalformed, cfg.Rank, frameName(f.typ))
}
