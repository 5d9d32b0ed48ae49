// Package rendezvous lets the processes of one job, one per GPU, find each
// other over TCP before they create their NCCL communicator: rank 0 listens,
// the other ranks connect to it, and the group then shares small messages
// (NCCL's unique id, with Broadcast; every rank's data, with AllGather) and
// synchronises (Barrier). It does no collective communication of its own on
// GPUs: NCCL does that. Launch reads where a job's launcher (torchrun,
// srun, mpirun, a Kubernetes Job) says this process stands: its rank, the
// world and rank 0's address (docs/MULTI-GPU.md).
//
// # Security
//
// Whoever can reach rank 0's port can try to join, so every job has a
// secret token (Config.Token, at least MinTokenLen bytes; required for a
// world of more than one rank) that no rank sends: each side proves it
// holds it. Rank 0 answers every connection with a challenge (a fresh
// nonce); the rank answers with an HMAC-SHA256, keyed by the token, of both
// nonces, the world and its rank; rank 0 checks it in constant time and
// proves itself back the same way (welcome) before the rank trusts anything
// it says. A stranger without the token gets nothing: its hello is refused
// with the bare reason "not authenticated" (no rank count, no hint of the
// token), it cannot take a rank's place, and a hello recorded from the
// network cannot be replayed (the nonce differs on every connection).
//
// After welcome every frame, both ways, carries an HMAC-SHA256 of its
// sequence number on the connection, its type and its payload, keyed by a
// key of its direction derived from the token and both nonces: a relay
// that passes the handshake cannot change, replay, drop or reorder a frame
// (NCCL's id in a broadcast) without the receiver failing the group with
// ErrAuth.
//
// Until rank 0 has proved the token, a rank believes nothing it is told: a
// reject, an abort, a malformed frame or another protocol version from the
// peer at rank 0's address (an impostor, or a port reused by another job)
// makes it dial again, with back-off, until its deadline; the timeout error
// then wraps the last answer. It reads at most a hello's worth of bytes
// per frame from such a peer, and quotes what it said escaped and cut
// short (no raw control characters or terminal escape codes reach a log).
//
// Flood: rank 0 greets at most Config.MaxPending connections at a time
// (sends the challenge and waits for the hello); further connections wait,
// in the order they arrived, in the listen queue of the kernel, unaccepted.
// A connection has five seconds to answer its challenge, but while every
// place is taken only one: silent connections then make way for the next in
// the queue at that pace, and a real rank, which answers within a round
// trip, gets in after at most the queue ahead of it divided by MaxPending
// seconds, whatever the rate of the flood. No connection is dropped early for a newcomer. A flood larger
// than the kernel's listen queue (net.core.somaxconn) makes new
// connections wait for the kernel's retries instead; keep the port behind
// a firewall that only the job's hosts pass. Accept errors such as EMFILE
// (too many open files) are retried with back-off until the deadline.
//
// The rendezvous authenticates but does not encrypt: what is broadcast
// (NCCL's id, which names the address of NCCL's own bootstrap) crosses the
// network in the clear, as NCCL's traffic does. Run jobs on a network only
// the job's hosts share.
//
// # Protocol
//
// Every message is a frame: a 4-byte big-endian length n, then n bytes, the
// first of which is the frame type. Until welcome a frame longer than a
// hello (1 KiB) is malformed; after it, one whose payload is longer than
// Config.MaxMessage (besides its 32-byte authentication code). A frame of
// length 0 is malformed. A malformed frame ends the connection.
//
//  1. A rank other than 0 dials rank 0's address, retrying with back-off
//     until the deadline (rank 0 may not be listening yet).
//  2. Rank 0 sends challenge (a magic, the protocol version, a nonce); the
//     rank sends hello (the magic, the version, the world size, its rank, a
//     nonce of its own and its proof). A hello that is malformed, of another
//     version or does not prove the token is answered with reject and the
//     connection closed; so is one for a rank that another live connection
//     holds ("already arrived": the rank dials again, and gets in if that
//     connection ends). These rejects are not authenticated, and the rank
//     retries after them.
//  3. Rank 0 sends welcome (its own proof). From here on frames carry
//     their authentication code. A hello for a world of another size or a
//     rank out of range is then refused with an authenticated reject, which
//     is final.
//  4. While it waits for the others, rank 0 watches each welcomed
//     connection: one that ends, or sends anything, before the start loses
//     its place, which the rank may take again by dialling again.
//  5. Once every rank has arrived, rank 0 sends roll call to every rank,
//     which answers present; once every rank has answered (a rank lost in
//     the meantime loses its place, and the roll call is repeated when the
//     world is complete again), rank 0 sends start. Join returns on a rank
//     when start comes, on rank 0 once it has sent start to every rank: it
//     never returns a group for which a rank had not proved that it was
//     alive after every rank had arrived, and Join is also a barrier. A rank
//     that dies after answering the roll call is a peer lost after Join, as
//     one that dies later is.
//  6. After Join: Broadcast sends data from rank 0; AllGather sends gather
//     to rank 0, which answers gathered once it has every rank's; Barrier
//     sends barrier to rank 0, which answers release once it has every
//     rank's; Close sends bye.
//
// # Failure
//
// Nothing waits forever. Join waits at most Config.Timeout for every rank;
// on rank 0 the error names the ranks that never arrived (or whose
// connection ended before the start) and the last connection refused (and the ranks that did arrive are told, with abort),
// on the others it says which address could not be reached or what rank 0
// answered. After Join every connection is read by its own goroutine: a peer
// whose connection ends without bye (its process died), or whose frames are
// malformed or fail their authentication code, fails the group, and rank 0
// relays the reason to the others with abort (not back to the rank it
// came from). A failed group closes Done, and every later or waiting
// Broadcast, AllGather and Barrier returns the error, which wraps
// ErrPeerLost (or ErrAborted, for a reason given by Abort; ErrAuth, for a
// frame altered on the way). A group records why it failed before it tells
// anyone, so a rank's own Abort stays its error (an AbortError of its own
// rank) whatever it hears afterwards. Callers that run long GPU work
// between rendezvous calls watch Done to give up at once when a peer is
// lost instead of waiting in a collective for a rank that is gone.
//
// # Concurrency
//
// A Group's methods are safe for concurrent use, but every rank must call
// Broadcast, AllGather and Barrier in the same order, as with collectives.
package rendezvous

import (
	"context"
	"crypto/hmac"
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
// context's error), except the checks of Config and ParseLaunch.
var (
	// ErrTimeout: a rank did not arrive, or an answer did not come, before
	// the deadline.
	ErrTimeout = errors.New("rendezvous: timeout")
	// ErrRejected: rank 0 refused this rank (a hello that did not prove
	// the job's token, a rank already taken, another world size or
	// protocol version). A reject that rank 0 sent before proving the
	// token is retried until the deadline, and the timeout error wraps it.
	ErrRejected = errors.New("rendezvous: rejected")
	// ErrAuth: the peer that answered at rank 0's address did not prove
	// that it holds the job's token (retried until the deadline, as
	// ErrRejected), or a frame after the handshake failed its
	// authentication code: it was altered, replayed, dropped or reordered
	// on the way.
	ErrAuth = errors.New("rendezvous: not authenticated")
	// ErrNoToken: the configuration has no job token, or one too short, for
	// a world of more than one rank.
	ErrNoToken = errors.New("rendezvous: no job token")
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

// AbortError is the error of a group ended by Abort: Rank is the rank whose
// abort this rank learnt of (itself, or the rank that told it: rank 0
// relays the aborts of the others), Reason what it said. It wraps
// ErrAborted.
type AbortError struct {
	Rank   int
	Reason string
}

func (e *AbortError) Error() string {
	return fmt.Sprintf("%v by rank %d: %s", ErrAborted, e.Rank, e.Reason)
}

func (e *AbortError) Unwrap() error { return ErrAborted }

// Defaults and limits of Config.
const (
	DefaultTimeout    = 60 * time.Second
	DefaultMaxMessage = 1 << 20
	DefaultMaxPending = 64
	// MinTokenLen is the shortest job token accepted: a token is a shared
	// secret, and a short one can be guessed.
	MinTokenLen = 16
	// MaxTokenLen bounds the job token.
	MaxTokenLen = 4096
)

// helloWait bounds how long rank 0 waits for a new connection's hello.
const helloWait = 5 * time.Second

// answerWait bounds how long a connection may take to answer its
// challenge while every place for such connections is taken (MaxPending):
// a real rank answers within a round trip, and a silent connection must
// make way for the next in the queue.
const answerWait = time.Second

// maxWorld bounds Config.World.
const maxWorld = 1 << 16

// Config configures Join. Zero fields take the defaults given.
type Config struct {
	// Addr is rank 0's host:port: where the others connect, and where rank 0
	// listens unless Listen or Listener says otherwise.
	Addr string
	// Listen, on rank 0 only, is where it listens when Listener is nil
	// (":29500" listens on every interface). Default Addr. Launch sets it to
	// every interface at Addr's port when Addr's host is not a loopback
	// address: rank 0's host name as the other hosts resolve it need not be
	// an address of rank 0's host as it resolves it itself.
	Listen string
	// Listener, on rank 0 only, is used instead of listening (tests listen
	// on 127.0.0.1 port 0 and give the port to the others). Join closes it
	// when every rank has arrived or Join fails.
	Listener net.Listener
	// Rank is this process's rank, 0 <= Rank < World.
	Rank int
	// World is the number of ranks, at least 1.
	World int
	// Token is the job's secret, the same on every rank, at least
	// MinTokenLen bytes: each side proves it holds it without sending it.
	// Required when World > 1. Pass it to the processes by environment or
	// a file (Launch reads STABLEGRAPH_TOKEN and STABLEGRAPH_TOKEN_FILE),
	// never on a command line, which every user of the host can read.
	Token string
	// Timeout bounds Join, and Broadcast, AllGather and Barrier when their
	// context has no deadline. Default DefaultTimeout.
	Timeout time.Duration
	// MaxMessage bounds the payload of one message in bytes (AllGather's
	// answer holds every rank's part). Default DefaultMaxMessage.
	MaxMessage int
	// MaxPending, on rank 0 only, bounds the connections rank 0 greets
	// at a time (accepted, hello not yet checked). Further connections wait
	// unaccepted, in the order they came, in the kernel's listen queue;
	// while MaxPending are greeted, each has only a second to answer its
	// challenge. Default DefaultMaxPending.
	MaxPending int
	// Logger receives debug logs. Default slog.Default().
	Logger *slog.Logger

	// answerWait replaces the package's answerWait when set (tests).
	answerWait time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxMessage <= 0 {
		c.MaxMessage = DefaultMaxMessage
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Listen == "" {
		c.Listen = c.Addr
	}
	if c.answerWait <= 0 {
		c.answerWait = answerWait
	}
	var addrErr error
	if c.World > 1 && c.Rank != 0 && c.Addr != "" {
		addrErr = CheckAddr(c.Addr)
	}
	switch {
	case c.World < 1 || c.World > maxWorld:
		return c, fmt.Errorf("rendezvous: world size %d (1 to %d)", c.World, maxWorld)
	case c.Rank < 0 || c.Rank >= c.World:
		return c, fmt.Errorf("rendezvous: rank %d out of range [0, %d)", c.Rank, c.World)
	case c.World > 1 && c.Rank == 0 && c.Listener == nil && c.Listen == "":
		return c, errors.New("rendezvous: rank 0 has no address to listen on (Config.Addr, Listen or Listener)")
	case c.World > 1 && c.Rank != 0 && c.Addr == "":
		return c, fmt.Errorf("rendezvous: rank %d has no address of rank 0 to connect to (Config.Addr)", c.Rank)
	case addrErr != nil:
		return c, fmt.Errorf("rendezvous: rank %d: Config.Addr %q is not rank 0's host:port: %w", c.Rank, c.Addr, addrErr)
	case c.World > 1 && c.Token == "":
		return c, fmt.Errorf("%w: a world of %d ranks needs a job token, the same secret on every rank (set %s or %s)",
			ErrNoToken, c.World, EnvToken, EnvTokenFile)
	case c.World > 1 && len(c.Token) < MinTokenLen:
		return c, fmt.Errorf("%w: the job token has %d bytes, fewer than %d; use a random one (32 hex digits or more)",
			ErrNoToken, len(c.Token), MinTokenLen)
	case len(c.Token) > MaxTokenLen:
		return c, fmt.Errorf("%w: the job token has %d bytes, more than %d", ErrNoToken, len(c.Token), MaxTokenLen)
	}
	return c, nil
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
	ops      sync.Mutex // serialises Broadcast, AllGather and Barrier
	lost     error      // rank 0: a rank lost as start was sent (serve's, then Join's)
}

// peer is one connection, read by its own goroutine into frames.
type peer struct {
	rank   int
	conn   net.Conn
	frames chan frame
	remote string // conn's remote address, for messages

	wmu sync.Mutex // serialises writes; guards sendSeq
	// The keys of the frames' authentication codes, nil before welcome
	// (the frames of the handshake carry none).
	sendKey, recvKey []byte
	sendSeq          uint64 // the next frame sent; guarded by wmu
	recvSeq          uint64 // the next frame received; only its one reader at a time uses it

	bye bool // the peer said bye; guarded by Group.mu

	// On rank 0, during Join: the proof that welcomes the rank, and the
	// roll calls sent that it has not answered (serve's only).
	welcome []byte
	owed    int
}

func newPeer(rank int, conn net.Conn, sendKey, recvKey []byte) *peer {
	p := &peer{rank: rank, conn: conn, frames: make(chan frame, 16), sendKey: sendKey, recvKey: recvKey, remote: "?"}
	if ra := conn.RemoteAddr(); ra != nil {
		p.remote = ra.String()
	}
	return p
}

// send writes one frame, with its authentication code once the peer has
// keys.
func (p *peer) send(typ byte, body []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if p.sendKey == nil {
		return writeFrame(p.conn, typ, body)
	}
	mac := frameMAC(p.sendKey, p.sendSeq, typ, body)
	p.sendSeq++
	return writeFrame(p.conn, typ, body, mac)
}

// sendAbort tells the peer why the group ends, the reason cut to
// maxReason bytes.
func (p *peer) sendAbort(reason string) error {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	return p.send(frameAbort, []byte(reason))
}

// recv reads one frame whose payload is at most max bytes and checks its
// authentication code once the peer has keys: a frame that fails it is
// ErrAuth.
func (p *peer) recv(max int) (frame, error) {
	if p.recvKey == nil {
		return readFrame(p.conn, max)
	}
	f, err := readFrame(p.conn, max+macLen)
	if err != nil {
		return frame{}, err
	}
	if len(f.body) < macLen || !hmac.Equal(f.body[len(f.body)-macLen:], frameMAC(p.recvKey, p.recvSeq, f.typ, f.body[:len(f.body)-macLen])) {
		return frame{}, fmt.Errorf("%w: frame %d from rank %d (%d bytes, said to be %s) fails its authentication code: it was altered, replayed or reordered on the way (something between the ranks rewrites their connection)",
			ErrAuth, p.recvSeq, p.rank, len(f.body)+1, frameName(f.typ))
	}
	p.recvSeq++
	return frame{typ: f.typ, body: f.body[:len(f.body)-macLen]}, nil
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
	if g.lost != nil {
		// A rank answered the roll call, then its connection broke before
		// start reached it: lost after Join, as if a moment later.
		g.fail(g.lost, -1)
	}
	return g, nil
}

// deadlineErr turns the end of ctx into ErrTimeout (or ctx's cancellation).
func deadlineErr(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s", ErrTimeout, what)
	}
	return fmt.Errorf("rendezvous: %s: %w", what, ctx.Err())
}

// read reads p's frames into p.frames until the connection ends. An end
// without bye, a malformed frame, one that fails its authentication code
// or an abort fails the group.
func (g *Group) read(p *peer) {
	defer g.wg.Done()
	defer close(p.frames)
	for {
		f, err := p.recv(g.cfg.MaxMessage)
		if err != nil {
			g.mu.Lock()
			bye := p.bye
			g.mu.Unlock()
			select {
			case <-g.done:
				return // closed or failed already
			default:
			}
			switch {
			case bye && errors.Is(err, io.EOF):
				return
			case errors.Is(err, ErrAuth):
				g.fail(err, -1)
			default:
				g.fail(fmt.Errorf("%w: rank %d: connection ended without goodbye: %v", ErrPeerLost, p.rank, err), p.rank)
			}
			return
		}
		switch f.typ {
		case frameBye:
			g.mu.Lock()
			p.bye = true
			g.mu.Unlock()
			continue
		case frameAbort:
			g.fail(&AbortError{Rank: p.rank, Reason: peerText(f.body, maxReason)}, p.rank)
			return
		case frameData, frameBarrier, frameRelease, frameGather, frameGathered:
		default:
			g.fail(fmt.Errorf("%w: rank %d sent %s after start", ErrMalformed, p.rank, frameName(f.typ)), -1)
			return
		}
		select {
		case p.frames <- f:
		case <-g.done:
			return
		}
	}
}

// fail ends the group with err, once. It records err before it tells
// anyone, so that whatever comes back (an echo of this rank's own abort)
// finds the group failed already and changes nothing; then it tells the
// peers why with abort, except the rank whose connection failed or whose
// abort this is (skip; -1 for none): rank 0 every rank, the others rank 0.
// Done is closed last, once the peers have been told.
func (g *Group) fail(err error, skip int) {
	g.failOnce.Do(func() {
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
		g.cfg.Logger.Debug("rendezvous: group failed", "rank", g.cfg.Rank, "err", err)
		if !errors.Is(err, ErrClosed) {
			for _, p := range g.conns {
				if p != nil && p.rank != skip {
					_ = p.sendAbort(err.Error())
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

// MaxMessage is the most bytes one message may carry (Config.MaxMessage).
func (g *Group) MaxMessage() int { return g.cfg.MaxMessage }

// Done is closed when the group fails (a peer lost, an abort) or is closed.
func (g *Group) Done() <-chan struct{} { return g.done }

// Err is why Done was closed, nil while it is open.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Abort ends the group on every rank with reason: the others' waiting and
// later calls fail with ErrAborted, and this rank's with an AbortError of
// its own rank. On a group that has failed already it does nothing.
func (g *Group) Abort(reason string) {
	g.fail(&AbortError{Rank: g.cfg.Rank, Reason: reason}, -1)
}

// beginOp starts a collective operation: it takes the operations lock,
// checks that the group is usable and bounds ctx as opContext does. end
// cancels that context and releases the lock.
func (g *Group) beginOp(ctx context.Context) (_ context.Context, end func(), _ error) {
	g.ops.Lock()
	if err := g.check(); err != nil {
		g.ops.Unlock()
		return nil, nil, err
	}
	ctx, cancel := g.opContext(ctx)
	return ctx, func() {
		cancel()
		g.ops.Unlock()
	}, nil
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
			g.fail(err, -1)
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
	ctx, end, err := g.beginOp(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
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
			g.fail(err, -1)
			return nil, err
		}
	}
	return slices.Clone(data), nil
}

// AllGather sends data from every rank to every rank: it returns each
// rank's data, by rank, on every rank. The parts together, with 4 bytes per
// rank besides, must fit in Config.MaxMessage.
func (g *Group) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	ctx, end, err := g.beginOp(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	world := g.cfg.World
	if partsLen(len(data)) > g.cfg.MaxMessage {
		err := fmt.Errorf("rendezvous: rank %d: all-gather of %d bytes exceeds the %d-byte maximum", g.cfg.Rank, len(data), g.cfg.MaxMessage)
		g.Abort(err.Error()) // the others would wait for this rank's part
		return nil, err
	}
	if g.cfg.Rank != 0 {
		p := g.conns[0]
		if err := p.send(frameGather, data); err != nil {
			err = fmt.Errorf("%w: rank 0: send gather: %v", ErrPeerLost, err)
			g.fail(err, -1)
			return nil, err
		}
		f, err := g.next(ctx, p, frameGathered, "gathered data")
		if err != nil {
			return nil, err
		}
		parts, err := decodeParts(f.body, world)
		if err != nil {
			g.fail(err, -1)
			return nil, err
		}
		return parts, nil
	}
	parts := make([][]byte, world)
	parts[0] = slices.Clone(data)
	lens := []int{len(data)}
	for _, p := range g.conns[1:] {
		f, err := g.next(ctx, p, frameGather, "its part of an all-gather")
		if err != nil {
			return nil, err
		}
		parts[p.rank] = f.body
		lens = append(lens, len(f.body))
	}
	if n := partsLen(lens...); n > g.cfg.MaxMessage {
		err := fmt.Errorf("rendezvous: all-gather of %d bytes in all exceeds the %d-byte maximum", n, g.cfg.MaxMessage)
		g.fail(err, -1)
		return nil, err
	}
	all := encodeParts(parts)
	for _, p := range g.conns[1:] {
		if err := p.send(frameGathered, all); err != nil {
			err = fmt.Errorf("%w: rank %d: send gathered data: %v", ErrPeerLost, p.rank, err)
			g.fail(err, -1)
			return nil, err
		}
	}
	return parts, nil
}

// Barrier returns once every rank has called it.
func (g *Group) Barrier(ctx context.Context) error {
	ctx, end, err := g.beginOp(ctx)
	if err != nil {
		return err
	}
	defer end()
	if g.cfg.Rank != 0 {
		p := g.conns[0]
		if err := p.send(frameBarrier, nil); err != nil {
			err = fmt.Errorf("%w: rank 0: send barrier: %v", ErrPeerLost, err)
			g.fail(err, -1)
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
			g.fail(err, -1)
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
	g.fail(ErrClosed, -1)
	for _, p := range g.conns {
		if p != nil {
			p.conn.Close()
		}
	}
	g.wg.Wait()
	return nil
}
