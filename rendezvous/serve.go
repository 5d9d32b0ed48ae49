package rendezvous

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// Rank 0's side of Join: accept connections, check each one's hello on a
// goroutine of its own, and take the ranks that prove the token.

// serve is rank 0's Join.
func (g *Group) serve(ctx context.Context) error {
	cfg := g.cfg
	g.conns = make([]*peer, cfg.World)
	l := cfg.Listener
	if cfg.World == 1 {
		if l != nil {
			l.Close()
		}
		return nil // a world of one
	}
	if l == nil {
		var err error
		if l, err = (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.Listen); err != nil {
			return fmt.Errorf("rendezvous: rank 0 listen on %s: %w", cfg.Listen, err)
		}
	}
	a := &admission{g: g, ctx: ctx, l: l, greetings: make(chan greeting), failed: make(chan error, 1), quit: make(chan struct{})}
	defer a.shutdown()
	a.wg.Add(1)
	go a.accept()

	arrived := 1
	for arrived < cfg.World {
		var gr greeting
		select {
		case gr = <-a.greetings:
		case err := <-a.failed:
			err = fmt.Errorf("rendezvous: rank 0 accept on %s: %w", l.Addr(), err)
			g.abortPeers(err.Error())
			return err
		case <-ctx.Done():
			err := deadlineErr(ctx, fmt.Sprintf("rank 0 waited %v for ranks %v, which never arrived at %s%s",
				cfg.Timeout, g.missing(), l.Addr(), a.notes()))
			g.abortPeers(err.Error())
			return err
		}
		p, err := gr.p, gr.err
		if err == nil && g.conns[p.rank] != nil {
			err = reject(gr.conn, fmt.Sprintf("rank %d has already arrived (from %s)", p.rank, g.conns[p.rank].conn.RemoteAddr()))
		}
		if err == nil {
			if werr := p.send(frameWelcome, p.welcome); werr != nil {
				err = fmt.Errorf("send welcome to rank %d: %w", p.rank, werr)
			}
		}
		if err != nil {
			a.refused(gr, err)
			gr.conn.Close()
			continue
		}
		g.conns[p.rank] = p
		arrived++
	}
	for _, p := range g.conns[1:] {
		if err := p.send(frameStart, nil); err != nil {
			err = fmt.Errorf("%w: rank %d: send start: %v", ErrPeerLost, p.rank, err)
			g.abortPeers(err.Error())
			return err
		}
	}
	return nil
}

// greeting is the outcome of one connection's hello.
type greeting struct {
	conn    net.Conn
	p       *peer
	err     error
	dropped bool // closed by rank 0 to make room for a newer connection
}

// admission is rank 0's accepting of connections during Join.
type admission struct {
	g         *Group
	ctx       context.Context
	l         net.Listener
	greetings chan greeting
	failed    chan error // a permanent accept error
	quit      chan struct{}
	wg        sync.WaitGroup // the acceptor and the greeters

	mu          sync.Mutex
	pending     []net.Conn // accepted, hello not yet checked; oldest first
	closed      bool
	acceptErr   error // the last temporary accept error
	refusals    int
	lastRefusal string
}

// accept accepts connections until the listener is closed, retrying
// temporary errors (EMFILE and the like: the process or the system is out
// of descriptors for a moment) with back-off, and hands each connection to
// a greeter.
func (a *admission) accept() {
	defer a.wg.Done()
	var delay time.Duration
	for {
		conn, err := a.l.Accept()
		if err != nil {
			select {
			case <-a.quit:
				return // Join is over
			default:
			}
			if a.ctx.Err() != nil {
				return // serve reports the deadline
			}
			if !temporary(err) {
				a.failed <- err // buffered: the acceptor's only send
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			a.mu.Lock()
			a.acceptErr = err
			a.mu.Unlock()
			a.g.cfg.Logger.Warn("rendezvous: accept failed; retrying", "addr", a.l.Addr(), "err", err, "in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				continue
			case <-a.quit:
				t.Stop()
				return
			}
		}
		delay = 0
		a.admit(conn)
	}
}

// temporary reports whether an accept error may pass: running out of
// descriptors or buffers, or a connection that went away while queued.
func temporary(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// admit starts a greeter for conn, dropping the oldest pending connection
// when MaxPending are waiting already: a newcomer is as likely to be a real
// rank as any, while a connection that has stayed silent longest is the
// likeliest to be a stranger holding a place (a real rank answers its
// challenge within a round trip, and dials again if it was dropped).
func (a *admission) admit(conn net.Conn) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		conn.Close()
		return
	}
	if len(a.pending) >= a.g.cfg.MaxPending {
		oldest := a.pending[0]
		a.pending = a.pending[1:]
		oldest.Close() // its greeter's read fails; it reports and ends
	}
	a.pending = append(a.pending, conn)
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		p, err := a.g.greet(a.ctx, conn)
		if err != nil {
			conn.Close() // before it leaves the pending list: MaxPending bounds the open connections
		}
		dropped := !a.remove(conn)
		select {
		case a.greetings <- greeting{conn: conn, p: p, err: err, dropped: dropped && err != nil}:
		case <-a.quit:
			conn.Close()
		}
	}()
}

// remove takes conn off the pending list, reporting whether it was there
// (false: it was dropped for a newer one).
func (a *admission) remove(conn net.Conn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, c := range a.pending {
		if c == conn {
			a.pending = append(a.pending[:i], a.pending[i+1:]...)
			return true
		}
	}
	return false
}

// refused notes a connection that did not become a rank. Refusals of
// connections that did not prove the token are logged at debug level only
// (a flood must not flood the log); Join's timeout error reports the count
// and the last one.
func (a *admission) refused(gr greeting, err error) {
	reason := err.Error()
	if gr.dropped {
		reason = fmt.Sprintf("dropped for a newer connection (more than %d waited for their hello)", a.g.cfg.MaxPending)
	}
	from := "?"
	if ra := gr.conn.RemoteAddr(); ra != nil {
		from = ra.String()
	}
	a.mu.Lock()
	a.refusals++
	a.lastRefusal = fmt.Sprintf("%s: %s", from, reason)
	a.mu.Unlock()
	log := a.g.cfg.Logger.Debug
	if gr.p != nil || errors.Is(err, errAuthenticatedReject) {
		log = a.g.cfg.Logger.Warn // one of the job's own ranks, misconfigured
	}
	log("rendezvous: refused a connection", "from", from, "err", reason)
}

// notes says what Join's timeout error should add: refused connections and
// accept errors.
func (a *admission) notes() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := ""
	if a.refusals > 0 {
		s += fmt.Sprintf("; %d connection(s) refused, the last from %s", a.refusals, a.lastRefusal)
	}
	if a.acceptErr != nil {
		s += fmt.Sprintf("; accepting failed at times: %v", a.acceptErr)
	}
	return s
}

// shutdown ends the admission: pending greetings end and their connections
// close, and the listener closes.
func (a *admission) shutdown() {
	close(a.quit)
	a.mu.Lock()
	a.closed = true
	for _, c := range a.pending {
		c.Close()
	}
	a.mu.Unlock()
	a.l.Close()
	a.wg.Wait()
}

// errAuthenticatedReject marks refusals of peers that proved the token.
var errAuthenticatedReject = errors.New("refused a rank of this job")

// greet sends conn the challenge and reads and checks its hello, answering
// reject when it is refused. It runs on a goroutine of its own and reads
// only the immutable configuration: serve checks that the rank is not taken.
func (g *Group) greet(ctx context.Context, conn net.Conn) (*peer, error) {
	// A connection that says nothing must not hold a place for long.
	deadline := time.Now().Add(helloWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	rootNonce, err := nonce()
	if err != nil {
		return nil, err
	}
	if err := writeFrame(conn, frameChallenge, challenge{version: version, nonce: rootNonce}.encode()); err != nil {
		return nil, fmt.Errorf("send challenge: %w", err)
	}
	f, err := readFrame(conn, maxHello)
	if err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	refuse := func(format string, args ...any) (*peer, error) {
		return nil, reject(conn, fmt.Sprintf(format, args...))
	}
	if f.typ != frameHello {
		return refuse("expected hello, got %s", frameName(f.typ))
	}
	h, err := decodeHello(f.body)
	if err != nil {
		return refuse("%v", err)
	}
	if h.version != version {
		return refuse("protocol version %d, rank 0 speaks %d", h.version, version)
	}
	if !hmac.Equal(h.proof, proof(g.cfg.Token, roleRank, rootNonce, h.nonce, h.world, h.rank)) {
		// Nothing about the job in the answer: not the world, not whether
		// the rank exists.
		_ = reject(conn, notAuthenticated)
		return nil, fmt.Errorf("%w: a hello claiming rank %d did not prove the job token (another job's token, or a recorded hello replayed)",
			ErrRejected, h.rank)
	}
	// The peer holds the token: it is one of the job's ranks, and may be
	// told what is wrong.
	switch {
	case int(h.world) != g.cfg.World:
		return nil, fmt.Errorf("%w: %w", errAuthenticatedReject,
			reject(conn, fmt.Sprintf("rank %d says the world has %d ranks, rank 0 says %d", h.rank, h.world, g.cfg.World)))
	case h.rank == 0 || int(h.rank) >= g.cfg.World:
		return nil, fmt.Errorf("%w: %w", errAuthenticatedReject,
			reject(conn, fmt.Sprintf("rank %d out of range [1, %d)", h.rank, g.cfg.World)))
	}
	_ = conn.SetDeadline(time.Time{})
	return &peer{rank: int(h.rank), conn: conn, frames: make(chan frame, 16),
		welcome: proof(g.cfg.Token, roleRoot, rootNonce, h.nonce, h.world, h.rank)}, nil
}

// reject answers a refused connection with reason and returns the error
// that says so.
func reject(conn net.Conn, reason string) error {
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_ = writeFrame(conn, frameReject, []byte(reason))
	return fmt.Errorf("%w: %s", ErrRejected, reason)
}

func (g *Group) missing() []int {
	var m []int
	for r, p := range g.conns {
		if r > 0 && p == nil {
			m = append(m, r)
		}
	}
	return m
}

// abortPeers tells every connected peer why the group ends, and closes them.
func (g *Group) abortPeers(reason string) {
	for _, p := range g.conns {
		if p != nil {
			_ = p.send(frameAbort, []byte(reason))
			p.conn.Close()
		}
	}
}
