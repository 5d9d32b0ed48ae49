// Package rendezvous lets the processes of one job, one per GPU, find each
// other over TCP before they create their NCCL communicator: rank 0 listens,
// the other ranks connect to it, and the group then shares small messages
// (NCCL's unique id, with Broadcast) and synchronises (Barrier). It does no
// collective communication of its own: NCCL does that.
//
// # Protocol
//
// Every message is a frame: a 4-byte big-endian length n, then n bytes, the
// first of which is the frame type. A frame longer than Config.MaxMessage+1
// bytes, or of length 0, is malformed and ends the connection.
//
//  1. A rank other than 0 dials Config.Addr, retrying with backoff until the
//     deadline (rank 0 may not be listening yet), and sends hello: a magic,
//     the protocol version, the world size, its rank and the job token.
//  2. Rank 0 accepts connections until every rank has said hello. A hello
//     that is malformed, of another version, world or token, or for a rank
//     already taken or out of range is answered with reject (and the reason)
//     and the connection closed; the rank it names is still awaited.
//  3. Once all have arrived rank 0 sends start to each: Join returns on every
//     rank at about the same time, so Join is also a barrier.
//  4. After Join: Broadcast sends data from rank 0; Barrier sends barrier to
//     rank 0, which answers release once it has every rank's; Close sends bye.
//
// # Failure
//
// Nothing waits forever. Join waits at most Config.Timeout for every rank;
// on rank 0 the error names the ranks that never arrived (and the ranks that
// did are told, with abort), on the others it says which address could not
// be reached or what rank 0 answered. After Join every connection is read by
// its own goroutine: a peer whose connection ends without bye (its process
// died), or whose frames are malformed, fails the group, and rank 0 relays
// the reason to the others with abort. A failed group closes Done, and every
// later or waiting Broadcast and Barrier returns the error, which wraps
// ErrPeerLost (or ErrAborted, for a reason given by Abort). Callers that run
// long GPU work between rendezvous calls watch Done to give up at once when a
// peer is lost instead of waiting in a collective for a rank that is gone.
//
// # Concurrency
//
// A Group's methods are safe for concurrent use, but every rank must call
// Broadcast and Barrier in the same order, as with collectives.
package rendezvous

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"
)

// Errors. Every error this package returns wraps one of them (or the
// context's error).
var (
	// ErrTimeout: a rank did not arrive, or an answer did not come, before
	// the deadline.
	ErrTimeout = errors.New("rendezvous: timeout")
	// ErrRejected: rank 0 refused this rank (another job's token, a rank
	// already taken, another world size or protocol version).
	ErrRejected = errors.New("rendezvous: rejected")
	// ErrMalformed: a peer sent a frame that breaks the protocol (bad
	// length, unknown type, oversized message, unexpected frame).
	ErrMalformed = errors.New("rendezvous: malformed message")
	// ErrPeerLost: a peer's connection ended without a goodbye (its process
	// died) or broke the protocol; the group cannot continue.
	ErrPeerLost = errors.New("rendezvous: peer lost")
	// ErrAborted: a rank called Abort; the group cannot continue.
	ErrAborted = errors.New("rendezvous: aborted")
	// ErrClosed: the group was closed by this process.
	ErrClosed = errors.New("rendezvous: closed")
)

// Defaults of Config.
const (
	DefaultTimeout    = 60 * time.Second
	DefaultMaxMessage = 1 << 20
)

// helloWait bounds how long rank 0 waits for a new connection's hello.
const helloWait = 5 * time.Second

// maxWorld bounds Config.World.
const maxWorld = 1 << 16

// maxToken bounds Config.Token; a hello is thus at most maxHello bytes,
// which bounds what rank 0 reads from a connection before it knows it is a
// rank (hellos are read concurrently, so this bounds memory too).
const (
	maxToken = 4096
	maxHello = len(magic) + 9 + maxToken
)

// Config configures Join. Zero fields take the defaults given.
type Config struct {
	// Addr is rank 0's host:port: where rank 0 listens (unless Listener is
	// set) and the others connect.
	Addr string
	// Listener, on rank 0 only, is used instead of listening on Addr (tests
	// listen on 127.0.0.1 port 0 and give the port to the others). Join
	// closes it when every rank has arrived or Join fails.
	Listener net.Listener
	// Rank is this process's rank, 0 <= Rank < World.
	Rank int
	// World is the number of ranks, at least 1.
	World int
	// Token identifies the job: rank 0 refuses a peer whose token differs
	// (another job using the same port). Default "".
	Token string
	// Timeout bounds Join, and Broadcast and Barrier when their context has
	// no deadline. Default DefaultTimeout.
	Timeout time.Duration
	// MaxMessage bounds the payload of one message in bytes. Default
	// DefaultMaxMessage.
	MaxMessage int
	// Logger receives debug logs. Default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxMessage <= 0 {
		c.MaxMessage = DefaultMaxMessage
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.World < 1 || c.World > maxWorld:
		return c, fmt.Errorf("rendezvous: world size %d (1 to %d)", c.World, maxWorld)
	case c.Rank < 0 || c.Rank >= c.World:
		return c, fmt.Errorf("rendezvous: rank %d out of range [0, %d)", c.Rank, c.World)
	case c.Addr == "" && (c.Rank != 0 || c.Listener == nil) && c.World > 1:
		return c, errors.New("rendezvous: no address")
	case len(c.Token) > maxToken:
		return c, fmt.Errorf("rendezvous: token longer than %d bytes", maxToken)
	}
	return c, nil
}

// Frame types.
const (
	frameHello byte = iota + 1
	frameReject
	frameStart
	frameData
	frameBarrier
	frameRelease
	frameAbort
	frameBye
)

var frameNames = map[byte]string{frameHello: "hello", frameReject: "reject", frameStart: "start", frameData: "data",
	frameBarrier: "barrier", frameRelease: "release", frameAbort: "abort", frameBye: "bye"}

func frameName(t byte) string {
	if n, ok := frameNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type %d", t)
}

const (
	magic   = "SGRV"
	version = 1
)

type frame struct {
	typ  byte
	body []byte
}

// writeFrame writes one frame.
func writeFrame(w io.Writer, typ byte, body []byte) error {
	buf := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(buf, uint32(1+len(body)))
	buf[4] = typ
	copy(buf[5:], body)
	_, err := w.Write(buf)
	return err
}

// readFrame reads one frame whose payload is at most max bytes.
func readFrame(r io.Reader, max int) (frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || uint64(n) > uint64(max)+1 {
		return frame{}, fmt.Errorf("%w: frame of %d bytes (at most %d)", ErrMalformed, n, max+1)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	return frame{typ: buf[0], body: buf[1:]}, nil
}

// hello is what a rank says when it connects.
type hello struct {
	version     byte
	world, rank uint32
	token       string
}

func (h hello) encode() []byte {
	var b bytes.Buffer
	b.WriteString(magic)
	b.WriteByte(h.version)
	binary.Write(&b, binary.BigEndian, h.world)
	binary.Write(&b, binary.BigEndian, h.rank)
	b.WriteString(h.token)
	return b.Bytes()
}

func decodeHello(body []byte) (hello, error) {
	if len(body) < len(magic)+9 || string(body[:len(magic)]) != magic {
		return hello{}, fmt.Errorf("%w: not a rendezvous hello", ErrMalformed)
	}
	b := body[len(magic):]
	return hello{version: b[0], world: binary.BigEndian.Uint32(b[1:]), rank: binary.BigEndian.Uint32(b[5:]), token: string(b[9:])}, nil
}

// Group is a joined rendezvous: this rank's connections to the others
// (rank 0 holds one per peer, the others one to rank 0).
type Group struct {
	cfg   Config
	conns []*peer // rank 0: by rank (nil at 0); others: [0] is rank 0

	done     chan struct{} // closed when the group fails or is closed
	failOnce sync.Once
	mu       sync.Mutex
	err      error // why done was closed
	wg       sync.WaitGroup
	ops      sync.Mutex // serialises Broadcast and Barrier
}

// peer is one connection, read by its own goroutine into frames.
type peer struct {
	rank   int
	conn   net.Conn
	frames chan frame
	wmu    sync.Mutex // serialises writes
	bye    bool       // the peer said bye; guarded by Group.mu
}

func (p *peer) send(typ byte, body []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return writeFrame(p.conn, typ, body)
}

// Join joins the rendezvous: rank 0 waits for every other rank, the others
// connect to rank 0, all within cfg.Timeout (and ctx). It returns once every
// rank has arrived.
func Join(ctx context.Context, cfg Config) (*Group, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	g := &Group{cfg: cfg, done: make(chan struct{})}
	if cfg.Rank == 0 {
		err = g.serve(ctx)
	} else {
		err = g.dial(ctx)
	}
	if err != nil {
		return nil, err
	}
	for _, p := range g.conns {
		if p != nil {
			g.wg.Add(1)
			go g.read(p)
		}
	}
	cfg.Logger.Debug("rendezvous: joined", "rank", cfg.Rank, "world", cfg.World, "addr", cfg.Addr)
	return g, nil
}

// deadlineErr turns the end of ctx into ErrTimeout (or ctx's cancellation).
func deadlineErr(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s", ErrTimeout, what)
	}
	return fmt.Errorf("rendezvous: %s: %w", what, ctx.Err())
}

// serve is rank 0's Join.
func (g *Group) serve(ctx context.Context) error {
	cfg := g.cfg
	l := cfg.Listener
	if l == nil && cfg.World > 1 {
		var err error
		if l, err = (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.Addr); err != nil {
			return fmt.Errorf("rendezvous: rank 0 listen on %s: %w", cfg.Addr, err)
		}
	}
	g.conns = make([]*peer, cfg.World)
	if l == nil {
		return nil // a world of one
	}
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	// Each connection's hello is read by a goroutine of its own (for at
	// most helloWait), so that a connection that stays silent or trickles
	// bytes cannot hold up the ranks behind it; ranks are taken here, one
	// greeting at a time.
	type greeting struct {
		conn net.Conn
		p    *peer
		err  error
	}
	greetings := make(chan greeting)
	acceptErr := make(chan error, 1)
	quit := make(chan struct{})
	var (
		wg      sync.WaitGroup
		pmu     sync.Mutex
		pending = map[net.Conn]bool{} // accepted, greeting not yet taken
		done    bool
	)
	defer func() {
		// Greetings still being read end now: their connections close.
		close(quit)
		pmu.Lock()
		done = true
		for c := range pending {
			c.Close()
		}
		pmu.Unlock()
		l.Close()
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			pmu.Lock()
			if done {
				conn.Close()
			}
			pending[conn] = true
			pmu.Unlock()
			wg.Add(1) // the acceptor's own count keeps the group above zero
			go func() {
				defer wg.Done()
				p, err := g.greet(ctx, conn)
				select {
				case greetings <- greeting{conn, p, err}:
				case <-quit:
					conn.Close()
				}
			}()
		}
	}()
	arrived := 1
	for arrived < cfg.World {
		var gr greeting
		select {
		case gr = <-greetings:
			pmu.Lock()
			delete(pending, gr.conn)
			pmu.Unlock()
		case err := <-acceptErr:
			if ctx.Err() != nil {
				err = deadlineErr(ctx, fmt.Sprintf("rank 0 waited %v for ranks %v, which never arrived at %s", cfg.Timeout, g.missing(), l.Addr()))
			} else {
				err = fmt.Errorf("rendezvous: rank 0 accept on %s: %w", l.Addr(), err)
			}
			g.abortPeers(err.Error())
			return err
		}
		p, err := gr.p, gr.err
		if err == nil && g.conns[p.rank] != nil {
			err = reject(gr.conn, fmt.Sprintf("rank %d has already arrived (from %s)", p.rank, g.conns[p.rank].conn.RemoteAddr()))
		}
		if err != nil {
			cfg.Logger.Warn("rendezvous: refused a connection", "from", gr.conn.RemoteAddr(), "err", err)
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

// greet reads and checks a connection's hello, answering reject when it is
// refused. It runs on a goroutine of its own and reads only the immutable
// configuration: serve checks that the rank is not taken.
func (g *Group) greet(ctx context.Context, conn net.Conn) (*peer, error) {
	// A connection that says nothing must not hold up the others for long.
	deadline := time.Now().Add(helloWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetReadDeadline(deadline)
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
	switch {
	case h.version != version:
		return refuse("protocol version %d, rank 0 speaks %d", h.version, version)
	case h.token != g.cfg.Token:
		return refuse("rank %d has another job's token", h.rank)
	case int(h.world) != g.cfg.World:
		return refuse("rank %d says the world has %d ranks, rank 0 says %d", h.rank, h.world, g.cfg.World)
	case h.rank == 0 || int(h.rank) >= g.cfg.World:
		return refuse("rank %d out of range [1, %d)", h.rank, g.cfg.World)
	}
	_ = conn.SetReadDeadline(time.Time{})
	return &peer{rank: int(h.rank), conn: conn, frames: make(chan frame, 16)}, nil
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

// dial is Join for ranks other than 0.
func (g *Group) dial(ctx context.Context) error {
	cfg := g.cfg
	var conn net.Conn
	backoff := 10 * time.Millisecond
	var last error
	for {
		d := net.Dialer{Timeout: time.Second, KeepAlive: 15 * time.Second}
		c, err := d.DialContext(ctx, "tcp", cfg.Addr)
		if err == nil {
			conn = c
			break
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
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer stop()
	p := &peer{rank: 0, conn: conn, frames: make(chan frame, 16)}
	h := hello{version: version, world: uint32(cfg.World), rank: uint32(cfg.Rank), token: cfg.Token}
	if err := p.send(frameHello, h.encode()); err != nil {
		conn.Close()
		return fmt.Errorf("%w: rank %d: send hello to %s: %v", ErrPeerLost, cfg.Rank, cfg.Addr, err)
	}
	f, err := readFrame(conn, cfg.MaxMessage)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return deadlineErr(ctx, fmt.Sprintf("rank %d waited %v at %s for the other ranks", cfg.Rank, cfg.Timeout, cfg.Addr))
		}
		return fmt.Errorf("%w: rank %d: waiting for start from rank 0 at %s: %v", ErrPeerLost, cfg.Rank, cfg.Addr, err)
	}
	switch f.typ {
	case frameStart:
		_ = conn.SetReadDeadline(time.Time{})
		g.conns = []*peer{p}
		return nil
	case frameReject:
		conn.Close()
		return fmt.Errorf("%w: rank %d by rank 0 at %s: %s", ErrRejected, cfg.Rank, cfg.Addr, f.body)
	case frameAbort:
		conn.Close()
		return fmt.Errorf("%w: rank 0 at %s gave up: %s", ErrAborted, cfg.Addr, f.body)
	}
	conn.Close()
	return fmt.Errorf("%w: rank %d: expected start from rank 0, got %s", ErrMalformed, cfg.Rank, frameName(f.typ))
}

// read reads p's frames into p.frames until the connection ends. An end
// without bye, a malformed frame or an abort fails the group.
func (g *Group) read(p *peer) {
	defer g.wg.Done()
	defer close(p.frames)
	for {
		f, err := readFrame(p.conn, g.cfg.MaxMessage)
		if err != nil {
			g.mu.Lock()
			bye := p.bye
			g.mu.Unlock()
			select {
			case <-g.done:
				return // closed or failed already
			default:
			}
			if bye && errors.Is(err, io.EOF) {
				return
			}
			g.fail(fmt.Errorf("%w: rank %d: connection ended without goodbye: %v", ErrPeerLost, p.rank, err))
			return
		}
		switch f.typ {
		case frameBye:
			g.mu.Lock()
			p.bye = true
			g.mu.Unlock()
			continue
		case frameAbort:
			g.fail(fmt.Errorf("%w by rank %d: %s", ErrAborted, p.rank, f.body))
			return
		case frameData, frameBarrier, frameRelease:
		default:
			g.fail(fmt.Errorf("%w: rank %d sent %s after start", ErrMalformed, p.rank, frameName(f.typ)))
			return
		}
		select {
		case p.frames <- f:
		case <-g.done:
			return
		}
	}
}

// fail ends the group with err, once: rank 0 tells the others why.
func (g *Group) fail(err error) {
	g.failOnce.Do(func() {
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
		g.cfg.Logger.Debug("rendezvous: group failed", "rank", g.cfg.Rank, "err", err)
		if g.cfg.Rank == 0 && !errors.Is(err, ErrClosed) {
			for _, p := range g.conns {
				if p != nil {
					_ = p.send(frameAbort, []byte(err.Error()))
				}
			}
		}
		close(g.done)
	})
}

// Rank is this process's rank.
func (g *Group) Rank() int { return g.cfg.Rank }

// World is the number of ranks.
func (g *Group) World() int { return g.cfg.World }

// Done is closed when the group fails (a peer lost, an abort) or is closed.
func (g *Group) Done() <-chan struct{} { return g.done }

// Err is why Done was closed, nil while it is open.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Abort ends the group on every rank with reason: the others' waiting and
// later calls fail with ErrAborted.
func (g *Group) Abort(reason string) {
	for _, p := range g.conns {
		if p != nil {
			_ = p.send(frameAbort, []byte(reason))
		}
	}
	g.fail(fmt.Errorf("%w by rank %d: %s", ErrAborted, g.cfg.Rank, reason))
}

// opContext bounds a call by cfg.Timeout when ctx has no deadline.
func (g *Group) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, g.cfg.Timeout)
}

// next waits for p's next frame, which must be of type want.
func (g *Group) next(ctx context.Context, p *peer, want byte, what string) (frame, error) {
	select {
	case f, ok := <-p.frames:
		if !ok {
			if err := g.Err(); err != nil {
				return frame{}, err
			}
			return frame{}, fmt.Errorf("%w: rank %d left", ErrPeerLost, p.rank)
		}
		if f.typ != want {
			err := fmt.Errorf("%w: rank %d sent %s while rank %d expects %s", ErrMalformed, p.rank, frameName(f.typ), g.cfg.Rank, frameName(want))
			g.fail(err)
			return frame{}, err
		}
		return f, nil
	case <-g.done:
		return frame{}, g.Err()
	case <-ctx.Done():
		return frame{}, deadlineErr(ctx, fmt.Sprintf("rank %d waited for %s from rank %d", g.cfg.Rank, what, p.rank))
	}
}

func (g *Group) check() error {
	select {
	case <-g.done:
		return g.Err()
	default:
		return nil
	}
}

// Broadcast sends data from rank 0 to every rank and returns it on every
// rank (the argument is ignored on the others). At most Config.MaxMessage
// bytes.
func (g *Group) Broadcast(ctx context.Context, data []byte) ([]byte, error) {
	g.ops.Lock()
	defer g.ops.Unlock()
	if err := g.check(); err != nil {
		return nil, err
	}
	ctx, cancel := g.opContext(ctx)
	defer cancel()
	if g.cfg.Rank != 0 {
		f, err := g.next(ctx, g.conns[0], frameData, "broadcast data")
		if err != nil {
			return nil, err
		}
		return f.body, nil
	}
	if len(data) > g.cfg.MaxMessage {
		return nil, fmt.Errorf("rendezvous: broadcast of %d bytes exceeds the %d-byte maximum", len(data), g.cfg.MaxMessage)
	}
	for _, p := range g.conns[1:] {
		if err := p.send(frameData, data); err != nil {
			err = fmt.Errorf("%w: rank %d: send broadcast: %v", ErrPeerLost, p.rank, err)
			g.fail(err)
			return nil, err
		}
	}
	return slices.Clone(data), nil
}

// Barrier returns once every rank has called it.
func (g *Group) Barrier(ctx context.Context) error {
	g.ops.Lock()
	defer g.ops.Unlock()
	if err := g.check(); err != nil {
		return err
	}
	ctx, cancel := g.opContext(ctx)
	defer cancel()
	if g.cfg.Rank != 0 {
		p := g.conns[0]
		if err := p.send(frameBarrier, nil); err != nil {
			err = fmt.Errorf("%w: rank 0: send barrier: %v", ErrPeerLost, err)
			g.fail(err)
			return err
		}
		_, err := g.next(ctx, p, frameRelease, "barrier release")
		return err
	}
	for _, p := range g.conns[1:] {
		if _, err := g.next(ctx, p, frameBarrier, "barrier"); err != nil {
			return err
		}
	}
	for _, p := range g.conns[1:] {
		if err := p.send(frameRelease, nil); err != nil {
			err = fmt.Errorf("%w: rank %d: send release: %v", ErrPeerLost, p.rank, err)
			g.fail(err)
			return err
		}
	}
	return nil
}

// Close says goodbye to the peers and closes the connections. Peers do not
// treat a closed connection after goodbye as a lost peer. Close is
// idempotent.
func (g *Group) Close() error {
	select {
	case <-g.done:
	default:
		for _, p := range g.conns {
			if p != nil {
				_ = p.send(frameBye, nil)
			}
		}
	}
	g.fail(ErrClosed)
	for _, p := range g.conns {
		if p != nil {
			p.conn.Close()
		}
	}
	g.wg.Wait()
	return nil
}
