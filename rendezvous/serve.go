package rendezvous

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Rank 0's side of Join: accept connections, greet each one (challenge,
// hello) on a goroutine of its own, welcome the ranks that prove the token,
// watch them until every rank has arrived, then take the roll call and
// start. The package doc gives the protocol and the flood policy.

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
	a := &admission{g: g, ctx: ctx, l: l, greetings: make(chan greeting), failed: make(chan error, 1), quit: make(chan struct{}),
		slots: make(chan struct{}, cfg.MaxPending), pending: map[net.Conn]*pendingConn{}, events: make(chan watchEvent)}
	defer a.shutdown()
	a.wg.Add(1)
	go a.accept()

	r := roster{g: g, a: a, arrived: 1, confirmed: make([]bool, cfg.World), left: make([]bool, cfg.World)}
	for !r.formed() {
		if !r.rolling && r.arrived == cfg.World {
			r.rollCall()
			continue
		}
		select {
		case gr := <-a.greetings:
			r.arrive(gr)
		case ev := <-a.events:
			r.heard(ev)
		case err := <-a.failed:
			err = fmt.Errorf("rendezvous: rank 0 accept on %s: %w", l.Addr(), err)
			g.abortPeers(err.Error())
			return err
		case <-ctx.Done():
			err := deadlineErr(ctx, fmt.Sprintf("rank 0 waited %v at %s for %s%s",
				cfg.Timeout, l.Addr(), r.missing(), a.notes()))
			g.abortPeers(err.Error())
			return err
		}
	}
	// Every rank answered the latest roll call: the group is formed. A
	// rank whose connection breaks now is lost after Join.
	for _, p := range g.conns[1:] {
		if err := p.send(frameStart, nil); err != nil && g.lost == nil {
			g.lost = fmt.Errorf("%w: rank %d: send start: %v", ErrPeerLost, p.rank, err)
		}
	}
	return nil
}

// roster is serve's account of the ranks during Join. Every welcomed rank
// has a watcher reading its connection, except the ranks that have
// answered the roll call under way (confirmed).
type roster struct {
	g         *Group
	a         *admission
	arrived   int    // ranks welcomed, rank 0 included
	left      []bool // by rank: lost its place, not welcomed since
	rolling   bool   // a roll call is under way: every rank has arrived
	confirmed []bool // by rank: answered the roll call under way
	nConf     int
}

func (r *roster) formed() bool { return r.rolling && r.nConf == r.g.cfg.World-1 }

// arrive takes a greeted connection: a rank welcomed, or a connection
// refused.
func (r *roster) arrive(gr greeting) {
	a, g := r.a, r.g
	if gr.err != nil {
		a.refused(gr, gr.err)
		return
	}
	p := gr.p
	if q := g.conns[p.rank]; q != nil {
		// Not authenticated: the rank dials again, and gets the place if
		// q's connection ends meanwhile (its watcher frees it).
		err := fmt.Errorf("%w: %w", errAuthenticatedReject, reject(p.conn, fmt.Sprintf("rank %d has already arrived (from %s)", p.rank, q.remote)))
		p.conn.Close()
		a.refused(gr, err)
		return
	}
	_ = p.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := writeFrame(p.conn, frameWelcome, p.welcome); err != nil {
		p.conn.Close()
		a.refused(gr, fmt.Errorf("send welcome to rank %d: %w", p.rank, err))
		return
	}
	g.conns[p.rank] = p
	r.left[p.rank] = false
	r.arrived++
	a.watch(p)
}

// rollCall asks every rank whether it is still there; a rank that cannot
// be sent the roll call loses its place.
func (r *roster) rollCall() {
	r.rolling = true
	var lost []*peer
	var why []error
	for _, p := range r.g.conns[1:] {
		if err := p.send(frameRoll, nil); err != nil {
			lost, why = append(lost, p), append(why, err)
			continue
		}
		p.owed++
	}
	for i, p := range lost {
		r.drop(p, fmt.Sprintf("send roll call: %v", why[i]))
	}
}

// heard takes what a watcher read: present, in answer to a roll call, or
// anything else, which ends the rank's place.
func (r *roster) heard(ev watchEvent) {
	p := ev.p
	if r.g.conns[p.rank] != p {
		return // dropped already
	}
	switch {
	case ev.err != nil:
		r.drop(p, fmt.Sprintf("its connection ended before the start: %v", ev.err))
	case ev.f.typ != framePresent || p.owed == 0:
		r.drop(p, fmt.Sprintf("it sent %s before the start", frameName(ev.f.typ)))
	default:
		p.owed--
		if r.rolling && p.owed == 0 {
			r.confirmed[p.rank] = true
			r.nConf++
			return
		}
		r.a.watch(p) // an answer to an earlier roll call
	}
}

// drop frees p's place: its connection closes, the roll call under way
// (if any) is called off, and the ranks that had answered it are watched
// again until the world is complete again.
func (r *roster) drop(p *peer, why string) {
	g := r.g
	p.conn.Close()
	g.conns[p.rank] = nil
	r.left[p.rank] = true
	r.arrived--
	if r.rolling {
		r.rolling = false
		for rank, ok := range r.confirmed {
			if ok {
				r.confirmed[rank] = false
				r.a.watch(g.conns[rank])
			}
		}
		r.nConf = 0
	}
	r.a.note(fmt.Sprintf("%s: rank %d lost its place: %s", p.remote, p.rank, why))
	g.cfg.Logger.Warn("rendezvous: a rank's connection failed before the start; its place is free again",
		"rank", p.rank, "from", p.remote, "why", why)
}

// greeting is the outcome of greeting one connection.
type greeting struct {
	conn     net.Conn
	p        *peer
	err      error
	squeezed bool // given only answerWait to answer, every place being taken
}

// watchEvent is what a watcher read from a welcomed rank's connection.
type watchEvent struct {
	p   *peer
	f   frame
	err error
}

// pendingConn is a connection being greeted.
type pendingConn struct {
	since, deadline time.Time
	squeezed        bool
}

// admission is rank 0's accepting of connections during Join.
type admission struct {
	g         *Group
	ctx       context.Context
	l         net.Listener
	greetings chan greeting
	events    chan watchEvent
	failed    chan error // a permanent accept error
	quit      chan struct{}
	// slots holds a token per connection being greeted: the acceptor takes
	// one before it accepts, so that at most MaxPending are greeted and the
	// others wait in the listen queue, in order.
	slots chan struct{}
	wg    sync.WaitGroup // the acceptor, the greeters and the watchers

	mu          sync.Mutex
	pending     map[net.Conn]*pendingConn
	closed      bool
	acceptErr   error // the last temporary accept error
	refusals    int
	lastRefusal string
}

// accept accepts connections until the listener is closed, each once a
// place is free, retrying temporary errors (EMFILE and the like: the
// process or the system is out of descriptors for a moment) with
// back-off, and hands each connection to a greeter.
func (a *admission) accept() {
	defer a.wg.Done()
	var delay time.Duration
	for {
		select {
		case a.slots <- struct{}{}:
		default:
			// Every place is taken: the connections greeted get only
			// answerWait, so the queue moves.
			a.squeeze()
			select {
			case a.slots <- struct{}{}:
			case <-a.quit:
				return
			}
		}
		conn, err := a.l.Accept()
		if err != nil {
			<-a.slots
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

// squeeze gives every connection being greeted at most answerWait from
// its challenge to answer.
func (a *admission) squeeze() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for conn, pc := range a.pending {
		if d := pc.since.Add(a.g.cfg.answerWait); d.Before(pc.deadline) {
			pc.deadline, pc.squeezed = d, true
			_ = conn.SetDeadline(d)
		}
	}
}

// admit greets conn on a goroutine of its own, holding one of the slots
// the acceptor took; the greeting goes to serve.
func (a *admission) admit(conn net.Conn) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		conn.Close()
		<-a.slots
		return
	}
	// A connection that says nothing must not hold a place for long.
	now := time.Now()
	deadline := now.Add(helloWait)
	if d, ok := a.ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	a.pending[conn] = &pendingConn{since: now, deadline: deadline}
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		p, err := a.g.greet(conn)
		a.mu.Lock()
		pc := a.pending[conn]
		delete(a.pending, conn)
		a.mu.Unlock()
		if err != nil {
			conn.Close() // before its slot is freed: MaxPending bounds the open connections
		} else {
			_ = conn.SetDeadline(time.Time{}) // off the pending list: no squeeze can set it again
		}
		<-a.slots
		select {
		case a.greetings <- greeting{conn: conn, p: p, err: err, squeezed: pc.squeezed}:
		case <-a.quit:
			conn.Close()
		}
	}()
}

// watch reads one frame from a welcomed rank's connection and hands it
// (or the error that ended the connection) to serve. Before the start a
// rank sends nothing but present, in answer to a roll call.
func (a *admission) watch(p *peer) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f, err := p.recv(maxHello)
		select {
		case a.events <- watchEvent{p: p, f: f, err: err}:
		case <-a.quit:
		}
	}()
}

// refused notes a connection that did not become a rank. Refusals of
// connections that did not prove the token are logged at debug level only
// (a flood must not flood the log); Join's timeout error reports the count
// and the last one.
func (a *admission) refused(gr greeting, err error) {
	reason := err.Error()
	if gr.squeezed && isTimeout(err) {
		reason = fmt.Sprintf("no hello within %v of the challenge, while %d connections were being greeted (MaxPending): %v",
			a.g.cfg.answerWait, a.g.cfg.MaxPending, err)
	}
	from := "?"
	if ra := gr.conn.RemoteAddr(); ra != nil {
		from = ra.String()
	}
	a.note(fmt.Sprintf("%s: %s", from, reason))
	log := a.g.cfg.Logger.Debug
	if gr.p != nil || errors.Is(err, errAuthenticatedReject) {
		log = a.g.cfg.Logger.Warn // one of the job's own ranks, misconfigured
	}
	log("rendezvous: refused a connection", "from", from, "err", reason)
}

// note counts a refusal for Join's timeout error.
func (a *admission) note(refusal string) {
	a.mu.Lock()
	a.refusals++
	a.lastRefusal = refusal
	a.mu.Unlock()
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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
// close, watchers end, and the listener closes.
func (a *admission) shutdown() {
	close(a.quit)
	a.mu.Lock()
	a.closed = true
	for c := range a.pending {
		c.Close()
	}
	a.mu.Unlock()
	a.l.Close()
	a.wg.Wait()
}

// errAuthenticatedReject marks refusals of peers that proved the token.
var errAuthenticatedReject = errors.New("refused a rank of this job")

// greet sends conn the challenge and reads and checks its hello, answering
// reject when it is refused. A rank that proves the token but claims a
// world of another size or a rank out of range is welcomed (rank 0 proves
// itself) and then refused with an authenticated reject, which the rank
// takes as final. It runs on a goroutine of its own and reads only the
// immutable configuration: serve checks that the rank is not taken, and
// sends welcome.
func (g *Group) greet(conn net.Conn) (*peer, error) {
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
	// told what is wrong, once rank 0 has proved itself.
	toRank, toRoot := sessionKeys(g.cfg.Token, rootNonce, h.nonce, h.world, h.rank)
	p := newPeer(int(h.rank), conn, toRank, toRoot)
	p.welcome = proof(g.cfg.Token, roleRoot, rootNonce, h.nonce, h.world, h.rank)
	var reason string
	switch {
	case int(h.world) != g.cfg.World:
		reason = fmt.Sprintf("rank %d says the world has %d ranks, rank 0 says %d", h.rank, h.world, g.cfg.World)
	case h.rank == 0 || int(h.rank) >= g.cfg.World:
		reason = fmt.Sprintf("rank %d out of range [1, %d)", h.rank, g.cfg.World)
	default:
		return p, nil
	}
	if err := writeFrame(conn, frameWelcome, p.welcome); err == nil {
		_ = p.send(frameReject, []byte(reason))
	}
	return nil, fmt.Errorf("%w: %w: %s", errAuthenticatedReject, ErrRejected, reason)
}

// reject answers a refused connection with reason, without authentication
// (the rank retries), and returns the error that says so.
func reject(conn net.Conn, reason string) error {
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_ = writeFrame(conn, frameReject, []byte(reason))
	return fmt.Errorf("%w: %s", ErrRejected, reason)
}

// missing names the ranks Join still waits for: those that never arrived,
// and those whose connection ended before the start.
func (r *roster) missing() string {
	var never, left []int
	for rank, p := range r.g.conns {
		switch {
		case rank == 0 || p != nil:
		case r.left[rank]:
			left = append(left, rank)
		default:
			never = append(never, rank)
		}
	}
	var s []string
	if len(never) > 0 {
		s = append(s, fmt.Sprintf("ranks %v, which never arrived", never))
	}
	if len(left) > 0 {
		s = append(s, fmt.Sprintf("ranks %v, which arrived but whose connection ended before the start", left))
	}
	return strings.Join(s, ", and ")
}

// abortPeers tells every welcomed rank why the group ends, and closes its
// connection.
func (g *Group) abortPeers(reason string) {
	for _, p := range g.conns {
		if p != nil {
			_ = p.sendAbort(reason)
			p.conn.Close()
		}
	}
}
