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
// challenge, check its proof, answer its roll calls, wait for start.

// dial is Join for ranks other than 0. It dials again, with back-off, when
// rank 0 is not listening yet, and after every failure that comes before
// rank 0 has proved the token (a connection closed, a reject, an abort,
// garbage: it may come from an impostor at rank 0's address, or from rank
// 0 itself freeing a place); once rank 0 has welcomed this rank with its
// proof, every failure is final. At the deadline the error wraps
// ErrTimeout and the last failure.
func (g *Group) dial(ctx context.Context) error {
	cfg := g.cfg
	backoff := 10 * time.Millisecond
	// last is the last failure, answer the last thing a peer said (a
	// reject, an abort, garbage): a later refused connection must not hide
	// it.
	var last, answer, waiting error
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
		var w *waitError
		switch {
		case errors.As(err, &w):
			waiting = err // the deadline came during this attempt
		case ctx.Err() == nil || last == nil:
			last = err
			if isAnswer(err) {
				answer = err
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return g.gaveUp(ctx, waiting, answer, last)
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// waitError is an attempt that the deadline ended while it waited for
// rank 0.
type waitError struct{ what string }

func (e *waitError) Error() string { return "waited for " + e.what }

// isAnswer reports whether a failed attempt ended on something the peer
// said, rather than on a connection refused or closed.
func isAnswer(err error) bool {
	for _, e := range []error{ErrRejected, ErrAborted, ErrAuth, ErrMalformed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// gaveUp is the error of a rank that did not join by the deadline: what it
// was waiting for when the deadline came, the last answer a peer gave, and
// the last failure.
func (g *Group) gaveUp(ctx context.Context, waiting, answer, last error) error {
	cfg := g.cfg
	what := fmt.Sprintf("rank %d could not join rank 0 at %s within %v", cfg.Rank, cfg.Addr, cfg.Timeout)
	if waiting != nil {
		what += " (it " + waiting.Error() + ")"
	}
	sentinel := ErrTimeout
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		sentinel = ctx.Err()
	}
	switch {
	case last == nil:
		return fmt.Errorf("rendezvous: %s: %w", what, sentinel)
	case answer != nil && answer != last:
		return fmt.Errorf("rendezvous: %s: %w; the last answer: %w; the last attempt: %v", what, sentinel, answer, last)
	}
	return fmt.Errorf("rendezvous: %s: %w; the last attempt: %w", what, sentinel, last)
}

// handshake joins over conn. final is false for an error after which
// dialling again may succeed (everything before rank 0's proof); conn is
// closed on every error.
func (g *Group) handshake(ctx context.Context, conn net.Conn) (final bool, err error) {
	cfg := g.cfg
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	// Before rank 0's proof: the peer may be anyone; nothing it says is
	// final, and what it says is quoted escaped.
	peerAt := fmt.Sprintf("the peer at %s (not authenticated yet)", cfg.Addr)
	said := func(f frame) error {
		switch f.typ {
		case frameReject:
			hint := ""
			if string(f.body) == notAuthenticated {
				hint = " (is the job token the same on every rank?)"
			}
			return fmt.Errorf("%w: rank %d by %s: %s%s", ErrRejected, cfg.Rank, peerAt, peerText(f.body, maxPeerText), hint)
		case frameAbort:
			return fmt.Errorf("%w: %s gave up: %s", ErrAborted, peerAt, peerText(f.body, maxPeerText))
		}
		return nil
	}
	f, err := readFrame(conn, maxHello)
	if err != nil {
		if ctx.Err() != nil {
			return false, &waitError{"rank 0's challenge"}
		}
		if errors.Is(err, ErrMalformed) {
			return false, fmt.Errorf("rank %d: %s: %w", cfg.Rank, peerAt, err)
		}
		return false, fmt.Errorf("%s closed the connection before its challenge: %v", peerAt, err)
	}
	if err := said(f); err != nil {
		return false, err
	}
	if f.typ != frameChallenge {
		return false, fmt.Errorf("%w: rank %d: expected a challenge from %s, got %s", ErrMalformed, cfg.Rank, peerAt, frameName(f.typ))
	}
	c, err := decodeChallenge(f.body)
	if err != nil {
		return false, fmt.Errorf("rank %d: %s: %w", cfg.Rank, peerAt, err)
	}
	if c.version != version {
		return false, fmt.Errorf("%w: %s speaks protocol version %d, rank %d speaks %d (run the same stablegraph on every rank)",
			ErrRejected, peerAt, c.version, cfg.Rank, version)
	}
	rankNonce, err := nonce()
	if err != nil {
		return true, err
	}
	world, rank := uint32(cfg.World), uint32(cfg.Rank)
	h := hello{version: version, world: world, rank: rank, nonce: rankNonce, proof: proof(cfg.Token, roleRank, c.nonce, rankNonce, world, rank)}
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := writeFrame(conn, frameHello, h.encode()); err != nil {
		return false, fmt.Errorf("rank %d: send hello to %s: %v", cfg.Rank, cfg.Addr, err)
	}
	f, err = readFrame(conn, maxHello)
	if err != nil {
		if ctx.Err() != nil {
			return false, &waitError{"rank 0's answer to its hello"}
		}
		if errors.Is(err, ErrMalformed) {
			return false, fmt.Errorf("rank %d: %s: %w", cfg.Rank, peerAt, err)
		}
		return false, fmt.Errorf("%s closed the connection before welcoming rank %d: %v", peerAt, cfg.Rank, err)
	}
	if err := said(f); err != nil {
		return false, err
	}
	if f.typ != frameWelcome {
		return false, fmt.Errorf("%w: rank %d: expected welcome from %s, got %s", ErrMalformed, cfg.Rank, peerAt, frameName(f.typ))
	}
	if !hmac.Equal(f.body, proof(cfg.Token, roleRoot, c.nonce, rankNonce, world, rank)) {
		return false, fmt.Errorf("%w: %s welcomed rank %d without proving the job token: it is not this job's rank 0 (another job on the port?)",
			ErrAuth, peerAt, cfg.Rank)
	}
	// Rank 0 proved the token: from here on it is trusted, every frame
	// carries its authentication code, and an ended connection means it is
	// gone.
	toRank, toRoot := sessionKeys(cfg.Token, c.nonce, rankNonce, world, rank)
	p := newPeer(0, conn, toRoot, toRank)
	for {
		f, err := p.recv(cfg.MaxMessage)
		if err != nil {
			if ctx.Err() != nil {
				return true, deadlineErr(ctx, fmt.Sprintf("rank %d waited %v at %s for the other ranks", cfg.Rank, cfg.Timeout, cfg.Addr))
			}
			if errors.Is(err, ErrAuth) {
				return true, err
			}
			return true, fmt.Errorf("%w: rank %d: waiting for start from rank 0 at %s: %v", ErrPeerLost, cfg.Rank, cfg.Addr, err)
		}
		switch f.typ {
		case frameRoll:
			if err := p.send(framePresent, nil); err != nil {
				return true, fmt.Errorf("%w: rank %d: answer rank 0's roll call at %s: %v", ErrPeerLost, cfg.Rank, cfg.Addr, err)
			}
			continue
		case frameStart:
			if !stop() {
				// The deadline came with start: rank 0 sees this rank
				// leave, and the group fails there.
				return true, deadlineErr(ctx, fmt.Sprintf("rank %d waited %v at %s for the other ranks", cfg.Rank, cfg.Timeout, cfg.Addr))
			}
			_ = conn.SetDeadline(time.Time{})
			g.conns = []*peer{p}
			return false, nil
		case frameReject:
			return true, fmt.Errorf("%w: rank %d by rank 0 at %s: %s", ErrRejected, cfg.Rank, cfg.Addr, peerText(f.body, maxReason))
		case frameAbort:
			return true, fmt.Errorf("%w: rank 0 at %s gave up: %s", ErrAborted, cfg.Addr, peerText(f.body, maxReason))
		}
		return true, fmt.Errorf("%w: rank %d: expected start from rank 0, got %s", ErrMalformed, cfg.Rank, frameName(f.typ))
	}
}
