package rendezvous

// Tests of the rendezvous under the attacks of a security audit: a
// continuous flood of silent connections, token holders whose connection
// dies before the start, a relay that rewrites frames after the handshake,
// an impostor at rank 0's address, and the race of a rank's own abort with
// its echo.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// quiet is a logger for tests whose refusals would be logged as warnings.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// flood keeps n silent connections open to addr: each dialer connects,
// reads (and ignores) whatever rank 0 sends until rank 0 closes the
// connection, then dials again at once, until stop is called.
type flood struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	dialed atomic.Int64
}

func startFlood(addr string, n int) *flood {
	f := &flood{stop: make(chan struct{})}
	for range n {
		f.wg.Go(func() {
			for {
				select {
				case <-f.stop:
					return
				default:
				}
				c, err := net.Dial("tcp", addr)
				if err != nil {
					select {
					case <-f.stop:
						return
					case <-time.After(time.Millisecond):
					}
					continue
				}
				f.dialed.Add(1)
				done := make(chan struct{})
				go func() {
					select {
					case <-f.stop:
						c.Close()
					case <-done:
					}
				}()
				io.Copy(io.Discard, c) // silent: never answers
				close(done)
				c.Close()
			}
		})
	}
	return f
}

func (f *flood) end() {
	close(f.stop)
	f.wg.Wait()
}

// slowLink relays connections to target with a one-way delay in each
// direction, as a link between two hosts has: a rank on another host than
// rank 0 answers its challenge a round trip later than a flood on rank 0's
// own host can open connections.
type slowLink struct {
	target string
	delay  time.Duration
}

func (s *slowLink) start(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	// pipe copies src to dst, each chunk delivered delay after it was read.
	pipe := func(dst, src net.Conn) {
		type chunk struct {
			due time.Time
			b   []byte
		}
		q := make(chan chunk, 1024)
		wg.Go(func() {
			defer dst.Close()
			for c := range q {
				time.Sleep(time.Until(c.due))
				if _, err := dst.Write(c.b); err != nil {
					return
				}
			}
		})
		defer close(q)
		for {
			b := make([]byte, 4096)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{time.Now().Add(s.delay), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", s.target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Go(func() { pipe(u, c) })
			wg.Go(func() { pipe(c, u) })
		}
	})
	return l.Addr().String()
}

// TestFloodDoesNotKeepRanksOut: a continuous flood of silent connections
// from rank 0's own host (8 to 64 dialers, each dialling again as soon as
// rank 0 closes its connection) must not keep a real rank out, whatever
// MaxPending. Rank 1 is on another host (a link of 20 ms each way) and
// starts only once the flood holds every place rank 0 has for connections
// that have not answered yet; it must join well within its deadline, in
// every one of many trials.
func TestFloodDoesNotKeepRanksOut(t *testing.T) {
	advNoLeak(t)
	trials := 32
	if testing.Short() {
		trials = 8
	}
	pendings := []int{8, 64}
	dialers := []int{8, 16, 64, 32}
	for i := range trials {
		maxPending, n := pendings[i%len(pendings)], dialers[(i/len(pendings))%len(dialers)]
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l := &countingListener{Listener: inner}
		addr := inner.Addr().String()
		cfg := Config{World: 2, Token: testToken, Timeout: 30 * time.Second, MaxPending: maxPending, Logger: quiet(),
			answerWait: 200 * time.Millisecond}
		root := make(chan error, 1)
		var g0 *Group
		go func() {
			c := cfg
			c.Listener = l
			var err error
			g0, err = Join(context.Background(), c)
			root <- err
		}()
		f := startFlood(addr, n)
		link := &slowLink{target: addr, delay: 20 * time.Millisecond}
		// Readiness: the flood holds every place it can (all its
		// connections, or MaxPending of them).
		for want := min(n, maxPending); ; {
			if open, _, _ := l.counts(); open >= want {
				break
			}
			select {
			case err := <-root:
				t.Fatalf("trial %d: rank 0 ended under the flood: %v", i, err)
			case <-time.After(time.Millisecond):
			}
		}
		c := cfg
		c.Addr, c.Rank, c.Timeout = link.start(t), 1, 20*time.Second
		start := time.Now()
		g1, err := Join(context.Background(), c)
		took := time.Since(start)
		dialed := f.dialed.Load()
		f.end()
		rerr := <-root
		if g1 != nil {
			g1.Close()
		}
		if g0 != nil {
			g0.Close()
		}
		if err != nil || rerr != nil {
			t.Fatalf("trial %d (MaxPending %d, %d dialers, %d connections dialled): rank 1 after %v: %v; rank 0: %v",
				i, maxPending, n, dialed, took.Round(time.Millisecond), err, rerr)
		}
		if _, most, _ := l.counts(); most > maxPending+1 {
			t.Fatalf("trial %d: %d connections open at once on rank 0, MaxPending %d and rank 1 allow %d", i, most, maxPending, maxPending+1)
		}
	}
}

// readWelcome reads rank 0's answer to a hello on c and fails unless it is
// welcome.
func readWelcome(t *testing.T, c net.Conn) {
	t.Helper()
	f, err := advAnswer(c, 5*time.Second)
	if err != nil || f.typ != frameWelcome {
		t.Fatalf("rank 0 answered the hello with %s, %v; want welcome", frameName(f.typ), err)
	}
}

// hangUp ends c as a process that dies would: with a FIN (close), or a
// reset (close with linger 0).
func hangUp(c net.Conn, reset bool) {
	if reset {
		c.(*net.TCPConn).SetLinger(0)
	}
	c.Close()
}

// TestDeadConnectionFreesItsSlot: a token holder sends a valid hello for
// rank 2 and its connection ends (closed or reset, before or after rank
// 0's welcome). Its place must be free again: the real ranks 1 and 2 then
// join, and the group works.
func TestDeadConnectionFreesItsSlot(t *testing.T) {
	for _, tc := range []struct {
		name               string
		readWelcome, reset bool
	}{
		{"closes after the hello", false, false},
		{"closes after welcome", true, false},
		{"resets after welcome", true, true},
		{"resets after the hello", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			advNoLeak(t)
			cfg := Config{World: 3, Token: testToken, Timeout: 10 * time.Second, Logger: quiet()}
			addr, root := advRoot(t, cfg)
			c, ch := advConnect(t, addr)
			if _, err := c.Write(advHello(ch, version, 3, 2, testToken)); err != nil {
				t.Fatal(err)
			}
			if tc.readWelcome {
				readWelcome(t, c)
			}
			hangUp(c, tc.reset)
			gs, err := advJoinAll(t, addr, cfg)
			if err != nil {
				t.Fatalf("real ranks: %v", err)
			}
			g0, err := root()
			if err != nil {
				t.Fatalf("rank 0: %v", err)
			}
			checkBroadcast(t, g0, gs[1:], "after a dead rank 2")
		})
	}
}

// checkBroadcast broadcasts a message from g0 and checks that every other
// group receives it.
func checkBroadcast(t *testing.T, g0 *Group, others []*Group, msg string) {
	t.Helper()
	done := make(chan error, len(others))
	for _, g := range others {
		go func() {
			data, err := g.Broadcast(context.Background(), nil)
			if err == nil && string(data) != msg {
				err = fmt.Errorf("rank %d received %q, want %q", g.Rank(), data, msg)
			}
			done <- err
		}()
	}
	if _, err := g0.Broadcast(context.Background(), []byte(msg)); err != nil {
		t.Fatal(err)
	}
	for range others {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoSuccessWithDeadMember: a token holder takes rank 2 (it reads rank
// 0's welcome) and its connection ends; the real rank 2 never comes. Rank
// 1 then arrives: no rank may report success, since rank 2 is dead. Both
// fail, rank 0 naming rank 2.
func TestNoSuccessWithDeadMember(t *testing.T) {
	for _, reset := range []bool{false, true} {
		t.Run(fmt.Sprintf("reset %v", reset), func(t *testing.T) {
			advNoLeak(t)
			cfg := Config{World: 3, Token: testToken, Timeout: 1500 * time.Millisecond, Logger: quiet()}
			addr, root := advRoot(t, cfg)
			c, ch := advConnect(t, addr)
			if _, err := c.Write(advHello(ch, version, 3, 2, testToken)); err != nil {
				t.Fatal(err)
			}
			readWelcome(t, c)
			hangUp(c, reset)
			c1 := cfg
			c1.Timeout = 10 * time.Second // rank 0 gives up first, and tells rank 1
			g1, err := advJoin(t, addr, c1, 1)
			if err == nil {
				t.Errorf("rank 1 joined a group whose rank 2 is dead (rank 1's group: %v)", g1.Err())
			}
			g0, rerr := root()
			if rerr == nil {
				t.Fatalf("rank 0 joined a group whose rank 2 is dead (its group: %v)", g0.Err())
			}
			if !errors.Is(rerr, ErrTimeout) || !strings.Contains(rerr.Error(), "ranks [2]") {
				t.Fatalf("rank 0: %v, want a timeout naming rank 2", rerr)
			}
			if !errors.Is(err, ErrAborted) {
				t.Fatalf("rank 1: %v, want rank 0's abort", err)
			}
		})
	}
}

// rewritingRelay relays connections between ranks and rank 0 (at target)
// frame by frame, and lets edit change or replace each frame rank 0 sends
// (the whole frame, length prefix included).
type rewritingRelay struct {
	target string
	edit   func(n int, f []byte) []byte // n counts the frames of data (type frameData) from rank 0
}

func (r *rewritingRelay) start(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", r.target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() { io.Copy(s, c); s.Close() })
			wg.Go(func() {
				defer c.Close()
				n := 0
				for {
					var hdr [4]byte
					if _, err := io.ReadFull(s, hdr[:]); err != nil {
						return
					}
					body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
					if _, err := io.ReadFull(s, body); err != nil {
						return
					}
					f := append(hdr[:], body...)
					if len(body) > 0 && body[0] == frameData {
						f = r.edit(n, f)
						n++
					}
					if _, err := c.Write(f); err != nil {
						return
					}
				}
			})
		}
	})
	return l.Addr().String()
}

// TestRelayCannotRewriteFrames: a relay between rank 1 and rank 0 passes
// the handshake untouched, then rewrites the broadcast (NCCL's id), or
// replays an earlier broadcast in place of a later one. Rank 1 must not
// take the relay's data: its Broadcast fails with ErrAuth, saying that a
// frame was altered, and the group fails.
func TestRelayCannotRewriteFrames(t *testing.T) {
	const real, fake = "nccl-id:0123456789abcdef", "attacker:0123456789abcde"
	var first []byte
	for _, tc := range []struct {
		name string
		edit func(n int, f []byte) []byte
	}{
		{"rewritten", func(n int, f []byte) []byte {
			return bytes.Replace(f, []byte(real), []byte(fake), 1)
		}},
		{"replayed", func(n int, f []byte) []byte {
			if n == 0 {
				first = bytes.Clone(f)
				return f
			}
			return first
		}},
		{"reordered", func(n int, f []byte) []byte {
			// The first broadcast is held back and sent after the
			// second.
			if n == 0 {
				first = bytes.Clone(f)
				return nil
			}
			return append(f, first...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{World: 2, Token: testToken, Timeout: 10 * time.Second, Logger: quiet()}
			addr, root := advRoot(t, cfg)
			relay := &rewritingRelay{target: addr, edit: tc.edit}
			via := relay.start(t)
			type res struct {
				data [][]byte
				err  error
			}
			got := make(chan res, 1)
			go func() {
				var r res
				g, err := advJoin(t, via, cfg, 1)
				if err != nil {
					r.err = err
					got <- r
					return
				}
				for range 2 {
					data, err := g.Broadcast(context.Background(), nil)
					if err != nil {
						r.err = err
						break
					}
					r.data = append(r.data, data)
				}
				got <- r
			}()
			g0, err := root()
			if err != nil {
				t.Fatal(err)
			}
			msgs := []string{real, strings.ToUpper(real)}
			for _, m := range msgs {
				if _, err := g0.Broadcast(context.Background(), []byte(m)); err != nil {
					break // the group may fail on rank 0 once rank 1 has
				}
			}
			r := <-got
			for i, d := range r.data {
				if string(d) != msgs[i] {
					t.Fatalf("rank 1 took broadcast %d as %q from the relay, want %q or an error", i, d, msgs[i])
				}
			}
			if !errors.Is(r.err, ErrAuth) || !strings.Contains(r.err.Error(), "altered") {
				t.Fatalf("rank 1: %v after %d broadcasts, want ErrAuth saying the frame was altered", r.err, len(r.data))
			}
		})
	}
}

// impostor listens where the ranks dial rank 0. It answers its first
// connections itself, one behaviour each, then relays every later
// connection to the real rank 0 at target.
type impostor struct {
	target string
	acts   []func(c net.Conn)
	served atomic.Int64
}

func (p *impostor) start(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() { close(done); l.Close(); wg.Wait() })
	wg.Go(func() {
		for i := 0; ; i++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if i < len(p.acts) {
				act := p.acts[i]
				wg.Go(func() {
					defer c.Close()
					act(c)
					p.served.Add(1)
					// Hold the connection open: the rank, not the
					// impostor, must give up on it.
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					select {
					case <-done:
					default:
						io.Copy(io.Discard, c)
					}
				})
				continue
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() {
				go func() { <-done; c.Close(); s.Close() }()
				go func() { io.Copy(s, c); s.Close() }()
				io.Copy(c, s)
				c.Close()
			})
		}
	})
	return l.Addr().String()
}

// impostorChallenge sends a valid challenge and reads the rank's hello.
func impostorChallenge(c net.Conn) {
	ch := challenge{version: version, nonce: bytes.Repeat([]byte{5}, nonceLen)}
	writeFrame(c, frameChallenge, ch.encode())
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	readFrame(c, maxHello)
}

// TestImpostorAnswersAreRetried: an impostor at rank 0's address answers
// the rank's first connections without holding the token (an abort, a
// reject, a welcome without the proof, a challenge of another version,
// garbage, a frame too long). None of these is final: the rank dials
// again until the real rank 0 answers, and joins.
func TestImpostorAnswersAreRetried(t *testing.T) {
	advNoLeak(t)
	cfg := Config{World: 2, Token: testToken, Timeout: 20 * time.Second, Logger: quiet()}
	addr, root := advRoot(t, cfg)
	imp := &impostor{target: addr, acts: []func(net.Conn){
		func(c net.Conn) { writeFrame(c, frameAbort, []byte("\x1b[2Jrank 0 gave up")) },
		func(c net.Conn) { impostorChallenge(c); writeFrame(c, frameReject, []byte("go away")) },
		func(c net.Conn) { impostorChallenge(c); writeFrame(c, frameAbort, []byte("boom")) },
		func(c net.Conn) { impostorChallenge(c); writeFrame(c, frameWelcome, make([]byte, proofLen)) },
		func(c net.Conn) { writeFrame(c, frameChallenge, []byte("SGRV\x09")) },
		func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) },
		func(c net.Conn) { c.Write([]byte{0x7f, 0xff, 0xff, 0xff}) },
	}}
	via := imp.start(t)
	g1, err := advJoin(t, via, cfg, 1)
	if err != nil {
		t.Fatalf("rank 1 after %d impostor answers: %v", imp.served.Load(), err)
	}
	g0, err := root()
	if err != nil {
		t.Fatal(err)
	}
	if n := imp.served.Load(); n != int64(len(imp.acts)) {
		t.Fatalf("the impostor answered %d connections, want %d", n, len(imp.acts))
	}
	checkBroadcast(t, g0, []*Group{g1}, "id")
}

// TestPeerTextIsEscapedAndBounded: what a peer that has not proved the
// token says reaches the rank's error escaped (no raw control or escape
// codes) and truncated, and a frame longer than a hello is refused by its
// length before it is read.
func TestPeerTextIsEscapedAndBounded(t *testing.T) {
	const marker = "MARKER-OF-THE-LONG-FRAME"
	for _, tc := range []struct {
		name  string
		act   func(c net.Conn)
		check func(t *testing.T, err error)
	}{
		{"escape codes in a reject", func(c net.Conn) {
			impostorChallenge(c)
			writeFrame(c, frameReject, []byte("\x1b[31mred\x1b[0m \x1b]0;title\x07 \r\x00\xff"+strings.Repeat("A", 900)))
		}, func(t *testing.T, err error) {
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), `\x1b[31mred`) {
				t.Fatalf("%q: want ErrRejected with the escape codes escaped", err)
			}
			if len(err.Error()) > 1200 {
				t.Fatalf("the error is %d bytes long: peer text is not truncated", len(err.Error()))
			}
		}},
		{"escape codes in an abort", func(c net.Conn) {
			writeFrame(c, frameAbort, []byte("\x1b[2J\x1b[Hboom\n"))
		}, func(t *testing.T, err error) {
			if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), `\x1b[2J\x1b[Hboom\n`) {
				t.Fatalf("%q: want ErrAborted with the escape codes escaped", err)
			}
		}},
		{"a reject longer than a hello", func(c net.Conn) {
			impostorChallenge(c)
			writeFrame(c, frameReject, []byte(marker+strings.Repeat("B", 64<<10)))
		}, func(t *testing.T, err error) {
			if strings.Contains(err.Error(), marker) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("%.300q: want the frame refused by its length, unread", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			imp := &impostor{target: "127.0.0.1:1"}
			for range 100 {
				imp.acts = append(imp.acts, tc.act)
			}
			l.Close()
			via := imp.start(t)
			_, err = Join(context.Background(), Config{Addr: via, Rank: 1, World: 2, Token: testToken, Timeout: time.Second})
			if err == nil {
				t.Fatal("joined an impostor")
			}
			for _, c := range err.Error() {
				if c < 0x20 || c == 0x7f {
					t.Fatalf("the error carries the control character %q: %q", c, err)
				}
			}
			tc.check(t, err)
			if !errors.Is(err, ErrTimeout) || imp.served.Load() < 2 {
				t.Fatalf("%v after %d answers: want a timeout after retries", err, imp.served.Load())
			}
		})
	}
}

// abortWaitConn makes the race of a rank's abort with its echo lose every
// time: when the rank writes an abort, the write returns only once the
// group has an error (its own, or the echo's).
type abortWaitConn struct {
	net.Conn
	g *Group
}

func (c *abortWaitConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if len(b) > 4 && b[4] == frameAbort {
		for deadline := time.Now().Add(10 * time.Second); c.g.Err() == nil && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	return n, err
}

// TestOwnAbortIsKept: a rank's group ended by its own Abort keeps its own
// AbortError (Rank is the rank itself), even when an echo of the abort from
// rank 0 arrives before Abort returns: the command line's watcher must not
// take a rank's own abort for another rank's failure. Rank 1 here is wired
// by hand to a rank 0 that echoes every abort, over a pipe whose abort
// write returns only once the group has failed; with real ranks, rank 0
// relays the abort to the others and not back to its sender.
func TestOwnAbortIsKept(t *testing.T) {
	rank1, rank0 := net.Pipe()
	g := &Group{cfg: Config{Rank: 1, World: 2, MaxMessage: 1 << 10, Logger: quiet()}, done: make(chan struct{})}
	p := &peer{rank: 0, conn: &abortWaitConn{Conn: rank1, g: g}, frames: make(chan frame, 16)}
	g.conns = []*peer{p}
	g.wg.Add(1)
	go g.read(p)
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		if f, err := readFrame(rank0, 1<<10); err == nil && f.typ == frameAbort {
			writeFrame(rank0, frameAbort, []byte("rendezvous: aborted by rank 1: no communicator"))
		}
	}()
	g.Abort("no communicator")
	var own *AbortError
	if !errors.As(g.Err(), &own) || own.Rank != 1 || own.Reason != "no communicator" {
		t.Errorf("rank 1's error after its own abort: %v", g.Err())
	}
	<-echoed
	rank0.Close()
	g.Close()

	// Real ranks: the others learn of rank 1's abort, and rank 1 keeps
	// its own.
	gs, errs := joinAll(t, listen(t), 3, 5*time.Second, nil)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	gs[1].Abort("no communicator")
	for r, g := range gs {
		<-g.Done()
		if !errors.As(g.Err(), &own) || !strings.Contains(own.Reason, "no communicator") || (r == 1 && own.Rank != 1) {
			t.Fatalf("rank %d: %v", r, g.Err())
		}
	}
}

// TestAddrNeedsAPort: a rank other than 0 refuses an address without a
// port (or with port 0) at once, instead of dialling it until the deadline.
func TestAddrNeedsAPort(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:", "127.0.0.1:0", "127.0.0.1", ":29500", "127.0.0.1:70000"} {
		start := time.Now()
		_, err := Join(context.Background(), Config{Addr: addr, Rank: 1, World: 2, Token: testToken, Timeout: time.Minute})
		if err == nil || !strings.Contains(err.Error(), "Config.Addr") {
			t.Errorf("%q: %v, want an error naming Config.Addr", addr, err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("%q: refused after %v", addr, d)
		}
	}
}

// TestPeerText: text from a peer is escaped as Go escapes it, printable
// text (accents included) is kept, and it is cut at the limit.
func TestPeerText(t *testing.T) {
	for _, tc := range []struct {
		in    string
		limit int
		want  string
	}{
		{"plain text, été", 64, "plain text, été"},
		{"\x1b[31mred\x1b[0m", 64, `\x1b[31mred\x1b[0m`},
		{"a\nb\tc\r\x00\x07\x7f", 64, `a\nb\tc\r\x00\a\x7f`},
		{"bad \xff\xfe utf-8", 64, `bad \xff\xfe utf-8`},
		{`a \x1b that was typed`, 64, `a \\x1b that was typed`},
		{"\u202eright-to-left override", 64, `\u202eright-to-left override`},
		{strings.Repeat("x", 300), 256, strings.Repeat("x", 256) + "... (44 more bytes)"},
	} {
		if got := peerText([]byte(tc.in), tc.limit); got != tc.want {
			t.Errorf("peerText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLastAnswerIsKept: a rank with another job's token is refused until
// rank 0 gives up; its later attempts find nobody listening. Its error at
// the deadline still says what rank 0 answered, not only that the last
// connection was refused.
func TestLastAnswerIsKept(t *testing.T) {
	t.Parallel() // waits out two deadlines
	l := listen(t)
	addr := l.Addr().String()
	root := make(chan error, 1)
	go func() {
		_, err := Join(context.Background(), Config{Listener: l, World: 2, Token: testToken, Timeout: 2 * time.Second, Logger: quiet()})
		root <- err
	}()
	// Seconds on both sides of rank 0's deadline, for a loaded machine:
	// rank 1 must be refused before it and dial once after it.
	_, err := Join(context.Background(), Config{Addr: addr, Rank: 1, World: 2, Token: "another-job-token-0123456789", Timeout: 5 * time.Second})
	if rerr := <-root; !errors.Is(rerr, ErrTimeout) {
		t.Fatalf("rank 0: %v", rerr)
	}
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrRejected) ||
		!strings.Contains(err.Error(), "not authenticated (is the job token the same on every rank?)") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("rank 1: %v; want a timeout that names rank 0's answer and the refused connection after it", err)
	}
}
