package rendezvous

// Adversarial tests: raw TCP clients on 127.0.0.1 that send garbage,
// oversized or truncated frames, wrong tokens, duplicate or impossible
// ranks, that stay silent, or that break the protocol after joining; and a
// fake rank 0 that does the same to a dialing rank. In every case the
// rendezvous must answer with a clear error (or refuse the connection and
// go on waiting for the real rank), never hang past its deadline, and the
// real ranks must still get in.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// advRoot starts rank 0 of a world on a loopback listener and returns its
// address and a function that waits for its Join.
func advRoot(t *testing.T, cfg Config) (string, func() (*Group, error)) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener, cfg.Rank = l, 0
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) // refusals are logged as warnings
	}
	type res struct {
		g   *Group
		err error
	}
	ch := make(chan res, 1)
	go func() {
		g, err := Join(context.Background(), cfg)
		ch <- res{g, err}
	}()
	var once sync.Once
	var r res
	wait := func() (*Group, error) {
		once.Do(func() {
			r = <-ch
			if r.g != nil {
				t.Cleanup(func() { r.g.Close() })
			}
		})
		return r.g, r.err
	}
	t.Cleanup(func() { wait() })
	return l.Addr().String(), wait
}

// advJoin joins rank r of the world at addr (a real rank).
func advJoin(t *testing.T, addr string, cfg Config, r int) (*Group, error) {
	t.Helper()
	cfg.Addr, cfg.Rank, cfg.Listener = addr, r, nil
	g, err := Join(context.Background(), cfg)
	if g != nil {
		t.Cleanup(func() { g.Close() })
	}
	return g, err
}

// advJoinAll joins ranks 1 to world-1 at once (Join returns only when
// every rank has arrived) and returns their groups by rank.
func advJoinAll(t *testing.T, addr string, cfg Config) ([]*Group, error) {
	t.Helper()
	gs := make([]*Group, cfg.World)
	errs := make([]error, cfg.World)
	var wg sync.WaitGroup
	for r := 1; r < cfg.World; r++ {
		wg.Go(func() {
			c := cfg
			c.Addr, c.Rank, c.Listener = addr, r, nil
			gs[r], errs[r] = Join(context.Background(), c)
		})
	}
	wg.Wait()
	for _, g := range gs {
		if g != nil {
			t.Cleanup(func() { g.Close() })
		}
	}
	return gs, errors.Join(errs...)
}

func advDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// advFrame encodes one frame by hand: the length prefix is given, so that
// it can lie.
func advFrame(length uint32, typ byte, body []byte) []byte {
	b := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(b, length)
	b[4] = typ
	return append(b, body...)
}

// advHello is a hello frame with the given fields.
func advHello(ver byte, world, rank uint32, token string) []byte {
	h := hello{version: ver, world: world, rank: rank, token: token}
	body := h.encode()
	return advFrame(uint32(1+len(body)), frameHello, body)
}

// advAnswer reads rank 0's answer on c, within d: a frame, or the error
// (io.EOF: closed without an answer).
func advAnswer(c net.Conn, d time.Duration) (frame, error) {
	c.SetReadDeadline(time.Now().Add(d))
	return readFrame(c, 1<<20)
}

// TestAdversarialHellosAreRefused sends every kind of bad first message to
// a waiting rank 0, each on its own connection, and checks the answer: a
// reject frame with a reason for a readable hello, or a closed connection
// for a frame that cannot be read. Rank 0 keeps waiting, and the real
// ranks join afterwards.
func TestAdversarialHellosAreRefused(t *testing.T) {
	advNoLeak(t)
	const token = "the-job-token"
	cfg := Config{World: 3, Token: token, Timeout: 10 * time.Second, MaxMessage: 1024}
	addr, root := advRoot(t, cfg)
	big := make([]byte, 4)
	binary.BigEndian.PutUint32(big, 0xffffffff)
	for _, tc := range []struct {
		name   string
		msg    []byte
		reject string // "" when the connection must be closed without an answer
	}{
		{"zero length", []byte{0, 0, 0, 0}, ""},
		{"length 2^32-1", big, ""},
		{"length one over a hello's maximum", advFrame(uint32(maxHello+2), frameHello, nil), ""},
		{"truncated frame", advFrame(100, frameHello, []byte("SGRV")), ""},
		{"half a length", []byte{0, 0}, ""},
		{"http request", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), ""},
		{"not a hello", advFrame(1, frameBarrier, nil), "expected hello, got barrier"},
		{"unknown frame type", advFrame(1, 0xee, nil), "expected hello, got type 238"},
		{"hello without magic", advFrame(14, frameHello, []byte("XXXX\x01\x00\x00\x00\x03\x00\x00\x00\x01")), "not a rendezvous hello"},
		{"hello too short", advFrame(5, frameHello, []byte("SGRV")), "not a rendezvous hello"},
		{"wrong version", advHello(99, 3, 1, token), "protocol version 99"},
		{"wrong token", advHello(version, 3, 1, "another-job"), "another job's token"},
		{"token prefix", advHello(version, 3, 1, token[:5]), "another job's token"},
		{"token with a NUL", advHello(version, 3, 1, token+"\x00"), "another job's token"},
		{"empty token", advHello(version, 3, 1, ""), "another job's token"},
		{"wrong world", advHello(version, 4, 1, token), "says the world has 4 ranks"},
		{"rank 0 claimed", advHello(version, 3, 0, token), "rank 0 out of range"},
		{"rank = world", advHello(version, 3, 3, token), "rank 3 out of range"},
		{"rank 2^32-1", advHello(version, 3, 0xffffffff, token), "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := advDial(t, addr)
			if _, err := c.Write(tc.msg); err != nil {
				t.Fatal(err)
			}
			if tc.name == "truncated frame" || tc.name == "half a length" {
				// The sender stops mid-frame and hangs up.
				c.(*net.TCPConn).CloseWrite()
			}
			f, err := advAnswer(c, 7*time.Second)
			if tc.reject == "" {
				if err == nil {
					t.Fatalf("answered %s %q, want the connection closed", frameName(f.typ), f.body)
				}
				if isTimeout(err) {
					t.Fatalf("rank 0 neither answered nor closed the connection: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if f.typ != frameReject || !strings.Contains(string(f.body), tc.reject) {
				t.Fatalf("answered %s %q, want reject %q", frameName(f.typ), f.body, tc.reject)
			}
			if strings.Contains(string(f.body), token) {
				t.Fatalf("the reject reveals the job token: %q", f.body)
			}
			// And it hangs up after the reject.
			if _, err := advAnswer(c, 3*time.Second); err == nil || isTimeout(err) {
				t.Fatalf("the connection stays open after the reject: %v", err)
			}
		})
	}
	if _, err := advJoinAll(t, addr, cfg); err != nil {
		t.Fatalf("real ranks: %v", err)
	}
	if _, err := root(); err != nil {
		t.Fatalf("rank 0: %v", err)
	}
}

// advNoLeak checks, after the test and its cleanups, that no goroutine it
// started is left (Join's greeters and readers included).
func advNoLeak(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// isTimeout tells a read deadline apart from a closed connection.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestDuplicateRanksByRawClients: two raw clients claim rank 1 with the
// right token. Whichever hello rank 0 reads second is refused ("already
// arrived"); the other keeps rank 1 and gets start once the world is
// complete. A real duplicate rank 1 is refused the same way.
func TestDuplicateRanksByRawClients(t *testing.T) {
	cfg := Config{World: 3, Token: "tok", Timeout: 10 * time.Second}
	addr, root := advRoot(t, cfg)
	type answer struct {
		i   int
		f   frame
		err error
	}
	answers := make(chan answer, 2)
	conns := []net.Conn{advDial(t, addr), advDial(t, addr)}
	for i, c := range conns {
		if _, err := c.Write(advHello(version, 3, 1, "tok")); err != nil {
			t.Fatal(err)
		}
		go func() {
			f, err := advAnswer(c, 8*time.Second)
			answers <- answer{i, f, err}
		}()
	}
	first := <-answers
	if first.err != nil || first.f.typ != frameReject || !strings.Contains(string(first.f.body), "rank 1 has already arrived") {
		t.Fatalf("duplicate rank 1: %v %s %q", first.err, frameName(first.f.typ), first.f.body)
	}
	if _, err := advJoin(t, addr, cfg, 1); !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "already arrived") {
		t.Fatalf("real duplicate rank 1: %v", err)
	}
	// Rank 2 completes the world; the raw rank 1 that kept its place gets
	// start.
	if _, err := advJoin(t, addr, cfg, 2); err != nil {
		t.Fatal(err)
	}
	if kept := <-answers; kept.err != nil || kept.f.typ != frameStart {
		t.Fatalf("raw rank 1 (connection %d): %v %s", kept.i, kept.err, frameName(kept.f.typ))
	}
	if _, err := root(); err != nil {
		t.Fatal(err)
	}
}

// TestGarbageFlood opens many connections at once that send random bytes,
// and checks that the real ranks still join well within the deadline.
func TestGarbageFlood(t *testing.T) {
	cfg := Config{World: 3, Token: "tok", Timeout: 10 * time.Second, MaxMessage: 4096}
	addr, root := advRoot(t, cfg)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return // the backlog may refuse some: fine
			}
			defer c.Close()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			junk := make([]byte, 1+r.IntN(64))
			for j := range junk {
				junk[j] = byte(r.Uint32())
			}
			if i%4 == 0 {
				// A plausible length and type, then junk.
				junk = append(advFrame(uint32(len(junk)+1), frameHello, nil), junk...)
			}
			c.Write(junk)
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(8 * time.Second))
			io.Copy(io.Discard, c)
		})
	}
	start := time.Now()
	gs, err := advJoinAll(t, addr, cfg)
	if err != nil {
		t.Fatalf("real ranks: %v", err)
	}
	gs = gs[1:]
	g0, err := root()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("the real ranks took %v to join among the garbage", d)
	}
	wg.Wait()
	// The group works.
	done := make(chan error, 2)
	for _, g := range gs {
		go func() {
			data, err := g.Broadcast(context.Background(), nil)
			if err == nil && string(data) != "id" {
				err = errors.New("wrong broadcast data " + string(data))
			}
			done <- err
		}()
	}
	if _, err := g0.Broadcast(context.Background(), []byte("id")); err != nil {
		t.Fatal(err)
	}
	for range gs {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestSilentConnectionsDoNotStarveRealRanks: connections that connect and
// say nothing (a port scanner, a stuck client) must not keep the real ranks
// out until the deadline. Rank 0 reads hellos one connection at a time,
// each for up to helloWait (5 s) or the Join deadline: two silent
// connections ahead of the real ranks delay them by up to twice that.
func TestSilentConnectionsDoNotStarveRealRanks(t *testing.T) {
	advNoLeak(t)
	cfg := Config{World: 2, Token: "tok", Timeout: 4 * time.Second}
	addr, root := advRoot(t, cfg)
	for range 2 {
		advDial(t, addr) // silent
	}
	time.Sleep(50 * time.Millisecond) // they are first in the accept queue
	start := time.Now()
	_, err := advJoin(t, addr, cfg, 1)
	_, rerr := root()
	if err != nil || rerr != nil {
		t.Fatalf("rank 1 joined after %v: %v; rank 0: %v", time.Since(start).Round(time.Millisecond), err, rerr)
	}
}

// TestPeerBreaksProtocolAfterJoin: a raw rank joins properly, then sends
// frames that break the protocol. Rank 0's next collective call fails with
// an error naming the rank and the problem, and rank 0 relays the failure
// to the real rank, which fails with ErrAborted.
func TestPeerBreaksProtocolAfterJoin(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
		want error
		text string
	}{
		{"oversized length", []byte{0x7f, 0xff, 0xff, 0xff}, ErrPeerLost, "malformed"},
		{"zero length", []byte{0, 0, 0, 0}, ErrPeerLost, "malformed"},
		{"unknown type", advFrame(1, 0x42, nil), ErrMalformed, "rank 1 sent type 66"},
		{"second hello", advHello(version, 3, 1, "tok"), ErrMalformed, "rank 1 sent hello after start"},
		{"data instead of barrier", advFrame(3, frameData, []byte("xx")), ErrMalformed, "rank 1 sent data while rank 0 expects barrier"},
		{"hang up without bye", nil, ErrPeerLost, "rank 1: connection ended without goodbye"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{World: 3, Token: "tok", Timeout: 5 * time.Second}
			addr, root := advRoot(t, cfg)
			c := advDial(t, addr)
			if _, err := c.Write(advHello(version, 3, 1, "tok")); err != nil {
				t.Fatal(err)
			}
			real := make(chan *Group, 1)
			go func() {
				g, err := advJoin(t, addr, cfg, 2)
				if err != nil {
					t.Error(err)
				}
				real <- g
			}()
			if f, err := advAnswer(c, 5*time.Second); err != nil || f.typ != frameStart {
				t.Fatalf("raw rank 1: %v %s", err, frameName(f.typ))
			}
			g0, err := root()
			if err != nil {
				t.Fatal(err)
			}
			g2 := <-real
			if g2 == nil {
				return
			}
			if tc.msg == nil {
				c.Close()
			} else if _, err := c.Write(tc.msg); err != nil {
				t.Fatal(err)
			}
			rankTwo := make(chan error, 1)
			go func() { rankTwo <- g2.Barrier(context.Background()) }()
			err = g0.Barrier(context.Background())
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("rank 0: %v, want %v with %q", err, tc.want, tc.text)
			}
			select {
			case <-g0.Done():
			case <-time.After(time.Second):
				t.Fatal("rank 0's group is not failed")
			}
			if err := <-rankTwo; !errors.Is(err, ErrAborted) && !errors.Is(err, ErrPeerLost) {
				t.Fatalf("rank 2: %v, want the failure relayed", err)
			}
			if _, err := g0.Broadcast(context.Background(), []byte("x")); err == nil {
				t.Fatal("a failed group still broadcasts")
			}
		})
	}
}

// TestFakeRankZero: a dialing rank talks to a rank 0 that misbehaves. Join
// must fail with a clear error before its deadline, never hang or accept.
func TestFakeRankZero(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer []byte // nil: say nothing
		close  bool
		want   error
		text   string
	}{
		{"oversized answer", []byte{0x7f, 0xff, 0xff, 0xff}, false, ErrPeerLost, "frame of"},
		{"zero length", []byte{0, 0, 0, 0}, false, ErrPeerLost, "frame of 0 bytes"},
		{"unexpected frame", advFrame(1, frameBarrier, nil), false, ErrMalformed, "expected start from rank 0, got barrier"},
		{"garbage type", advFrame(1, 0x99, nil), false, ErrMalformed, "got type 153"},
		{"reject", advFrame(8, frameReject, []byte("go away")), false, ErrRejected, "go away"},
		{"abort", advFrame(5, frameAbort, []byte("boom")), false, ErrAborted, "boom"},
		{"closes at once", nil, true, ErrPeerLost, "waiting for start"},
		{"truncated", advFrame(50, frameStart, nil), true, ErrPeerLost, "unexpected EOF"},
		{"silent", nil, false, ErrTimeout, "waited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got := make(chan []byte, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					got <- nil
					return
				}
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				f, _ := readFrame(c, 1<<20)
				got <- f.body
				if tc.answer != nil {
					c.Write(tc.answer)
				}
				if tc.close {
					return
				}
				time.Sleep(2 * time.Second)
			}()
			start := time.Now()
			_, err = Join(context.Background(), Config{Addr: l.Addr().String(), Rank: 1, World: 2, Token: "tok", Timeout: time.Second})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Join: %v, want %v with %q", err, tc.want, tc.text)
			}
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Fatalf("Join took %v with a 1 s timeout", d)
			}
			if h, err := decodeHello(<-got); err != nil || h.rank != 1 || h.token != "tok" {
				t.Fatalf("the fake rank 0 got %+v, %v", h, err)
			}
		})
	}
}

// TestBigTokenHellos: a hello with the longest token a rank may have (a
// wrong one) is read and refused like any wrong token; one byte more and
// rank 0 does not even read it (a hello is small; the job's MaxMessage is
// for broadcasts), so that many connections at once cannot make it hold
// MaxMessage bytes each.
func TestBigTokenHellos(t *testing.T) {
	cfg := Config{World: 2, Token: "tok", Timeout: 10 * time.Second}
	addr, root := advRoot(t, cfg)
	c := advDial(t, addr)
	if _, err := c.Write(advHello(version, 2, 1, strings.Repeat("x", maxToken))); err != nil {
		t.Fatal(err)
	}
	f, err := advAnswer(c, 5*time.Second)
	if err != nil || f.typ != frameReject || !strings.Contains(string(f.body), "another job's token") {
		t.Fatalf("%v %s %q", err, frameName(f.typ), f.body)
	}
	if bytes.Contains(f.body, []byte("xxxxxxxx")) {
		t.Fatal("the reject echoes the token")
	}
	c = advDial(t, addr)
	if _, err := c.Write(advHello(version, 2, 1, strings.Repeat("x", maxToken+1))); err != nil {
		t.Fatal(err)
	}
	if f, err := advAnswer(c, 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("a hello over the maximum: %v %s, want the connection closed", err, frameName(f.typ))
	}
	if _, err := advJoin(t, addr, cfg, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := root(); err != nil {
		t.Fatal(err)
	}
}
