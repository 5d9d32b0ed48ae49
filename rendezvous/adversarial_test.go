package rendezvous

// Adversarial tests: raw TCP clients on 127.0.0.1 that send garbage,
// oversized or truncated frames, hellos without the token or replayed,
// duplicate or impossible ranks, that stay silent, flood rank 0 with
// connections, or break the protocol after joining; a listener whose Accept
// fails; and a fake rank 0 that misbehaves or does not hold the token. In
// every case the rendezvous must answer with a clear error (or refuse the
// connection and go on waiting for the real rank), tell a stranger nothing
// about the job, never hang past its deadline, and the real ranks must still
// get in.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// advChallenge reads rank 0's challenge on c.
func advChallenge(t *testing.T, c net.Conn) challenge {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := readFrame(c, maxHello)
	if err != nil || f.typ != frameChallenge {
		t.Fatalf("rank 0 sent %s, %v; want a challenge", frameName(f.typ), err)
	}
	ch, err := decodeChallenge(f.body)
	if err != nil || ch.version != version {
		t.Fatalf("challenge %+v, %v", ch, err)
	}
	c.SetReadDeadline(time.Time{})
	return ch
}

// advHello is a hello frame answering ch with the given fields, its proof
// made with token.
func advHello(ch challenge, ver byte, world, rank uint32, token string) []byte {
	n := bytes.Repeat([]byte{7}, nonceLen)
	h := hello{version: ver, world: world, rank: rank, nonce: n, proof: proof(token, roleRank, ch.nonce, n, world, rank)}
	body := h.encode()
	return advFrame(uint32(1+len(body)), frameHello, body)
}

// advConnect dials rank 0 and reads its challenge.
func advConnect(t *testing.T, addr string) (net.Conn, challenge) {
	t.Helper()
	c := advDial(t, addr)
	return c, advChallenge(t, c)
}

// advSession is a raw rank's end of its connection once rank 0 has
// welcomed it: frames with their authentication codes, keyed as for a
// hello of advHello's (its nonce) for the world and rank given.
func advSession(c net.Conn, ch challenge, token string, world, rank uint32) *peer {
	toRank, toRoot := sessionKeys(token, ch.nonce, bytes.Repeat([]byte{7}, nonceLen), world, rank)
	return newPeer(0, c, toRoot, toRank)
}

// advMACFrame is frame seq of rank 0's session with the rank of hello h,
// with its authentication code.
func advMACFrame(token string, ch challenge, h hello, seq uint64, typ byte, body []byte) []byte {
	toRank, _ := sessionKeys(token, ch.nonce, h.nonce, h.world, h.rank)
	var b bytes.Buffer
	writeFrame(&b, typ, body, frameMAC(toRank, seq, typ, body))
	return b.Bytes()
}

// advAwaitStart plays a raw rank after welcome: it answers rank 0's roll
// calls until start, within d.
func advAwaitStart(p *peer, d time.Duration) error {
	p.conn.SetReadDeadline(time.Now().Add(d))
	defer p.conn.SetReadDeadline(time.Time{})
	for {
		f, err := p.recv(1 << 20)
		if err != nil {
			return err
		}
		switch f.typ {
		case frameRoll:
			if err := p.send(framePresent, nil); err != nil {
				return err
			}
		case frameStart:
			return nil
		default:
			return fmt.Errorf("rank 0 sent %s %q while the raw rank waits for start", frameName(f.typ), f.body)
		}
	}
}

// advAnswer reads rank 0's answer on c, within d: a frame, or the error
// (io.EOF: closed without an answer).
func advAnswer(c net.Conn, d time.Duration) (frame, error) {
	c.SetReadDeadline(time.Now().Add(d))
	return readFrame(c, 1<<20)
}

// TestAdversarialHellosAreRefused sends every kind of bad first message to
// a waiting rank 0, each on its own connection after reading its challenge,
// and checks the answer: a reject frame with a reason for a readable hello,
// or a closed connection for a frame that cannot be read. A hello that does
// not prove the token gets the bare "not authenticated", whatever else it
// claims: a stranger learns neither the world size nor which ranks exist.
// Rank 0 keeps waiting, and the real ranks join afterwards.
func TestAdversarialHellosAreRefused(t *testing.T) {
	advNoLeak(t)
	const token = testToken
	cfg := Config{World: 3, Token: token, Timeout: 10 * time.Second, MaxMessage: 1024}
	addr, root := advRoot(t, cfg)
	big := make([]byte, 4)
	binary.BigEndian.PutUint32(big, 0xffffffff)
	fixed := func(b []byte) func(challenge) []byte { return func(challenge) []byte { return b } }
	hi := func(ver byte, world, rank uint32, token string) func(challenge) []byte {
		return func(ch challenge) []byte { return advHello(ch, ver, world, rank, token) }
	}
	for _, tc := range []struct {
		name   string
		msg    func(challenge) []byte
		reject string // "" when the connection must be closed without an answer
	}{
		{"zero length", fixed([]byte{0, 0, 0, 0}), ""},
		{"length 2^32-1", fixed(big), ""},
		{"length one over a hello's maximum", fixed(advFrame(uint32(maxHello+2), frameHello, nil)), ""},
		{"truncated frame", fixed(advFrame(100, frameHello, []byte("SGRV"))), ""},
		{"half a length", fixed([]byte{0, 0}), ""},
		{"http request", fixed([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")), ""},
		{"not a hello", fixed(advFrame(1, frameBarrier, nil)), "expected hello, got barrier"},
		{"unknown frame type", fixed(advFrame(1, 0xee, nil)), "expected hello, got type 238"},
		{"hello without magic", fixed(advFrame(14, frameHello, []byte("XXXX\x02\x00\x00\x00\x03\x00\x00\x00\x01"))), "not a rendezvous hello"},
		{"hello too short", fixed(advFrame(5, frameHello, []byte("SGRV"))), "not a rendezvous hello"},
		{"hello one byte short", func(ch challenge) []byte {
			b := advHello(ch, version, 3, 1, token)
			return append(advFrame(uint32(len(b)-5), frameHello, nil), b[5:len(b)-1]...)
		}, "not a rendezvous hello"},
		{"wrong version", hi(99, 3, 1, token), "protocol version 99"},
		{"version 1 hello with the token in clear", fixed(advFrame(uint32(1+13+len(token)), frameHello,
			append([]byte("SGRV\x01\x00\x00\x00\x03\x00\x00\x00\x01"), token...))), "protocol version 1"},
		{"wrong token", hi(version, 3, 1, "another-job-token-0123456789"), notAuthenticated},
		{"token prefix", hi(version, 3, 1, token[:5]), notAuthenticated},
		{"token with a NUL", hi(version, 3, 1, token+"\x00"), notAuthenticated},
		{"empty token", hi(version, 3, 1, ""), notAuthenticated},
		{"proof for another rank", func(ch challenge) []byte {
			b := advHello(ch, version, 3, 2, token)
			binary.BigEndian.PutUint32(b[5+len(magic)+1+4:], 1) // claims rank 1
			return b
		}, notAuthenticated},
		{"proof of rank 0's role", func(ch challenge) []byte {
			n := bytes.Repeat([]byte{7}, nonceLen)
			h := hello{version: version, world: 3, rank: 1, nonce: n, proof: proof(token, roleRoot, ch.nonce, n, 3, 1)}
			return advFrame(uint32(1+helloLen), frameHello, h.encode())
		}, notAuthenticated},
		{"proof over another challenge", func(ch challenge) []byte {
			other := challenge{version: version, nonce: bytes.Repeat([]byte{1}, nonceLen)}
			return advHello(other, version, 3, 1, token)
		}, notAuthenticated},
		{"wrong token and wrong world", hi(version, 4, 1, "another-job-token-0123456789"), notAuthenticated},
		{"wrong token and rank out of range", hi(version, 3, 7, "another-job-token-0123456789"), notAuthenticated},
		{"wrong world", hi(version, 4, 1, token), "says the world has 4 ranks"},
		{"rank 0 claimed", hi(version, 3, 0, token), "rank 0 out of range"},
		{"rank = world", hi(version, 3, 3, token), "rank 3 out of range"},
		{"rank 2^32-1", hi(version, 3, 0xffffffff, token), "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ch := advConnect(t, addr)
			msg := tc.msg(ch)
			if _, err := c.Write(msg); err != nil {
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
			if f.typ == frameWelcome {
				// A rank that proved the token is refused after rank 0
				// has proved itself, with an authenticated reject.
				h, err := decodeHello(msg[5:])
				if err != nil || !bytes.Equal(f.body, proof(token, roleRoot, ch.nonce, h.nonce, h.world, h.rank)) {
					t.Fatalf("welcome without rank 0's proof (%v)", err)
				}
				c.SetReadDeadline(time.Now().Add(7 * time.Second))
				if f, err = advSession(c, ch, token, h.world, h.rank).recv(1 << 20); err != nil {
					t.Fatalf("no reject after welcome: %v", err)
				}
			}
			if f.typ != frameReject || !strings.Contains(string(f.body), tc.reject) {
				t.Fatalf("answered %s %q, want reject %q", frameName(f.typ), f.body, tc.reject)
			}
			if tc.reject == notAuthenticated && string(f.body) != notAuthenticated {
				t.Fatalf("the reject of a stranger says more than %q: %q", notAuthenticated, f.body)
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

// TestDuplicateRanksByRawClients: two raw clients claim rank 1 with the
// token, and stay connected. Whichever hello rank 0 takes second is refused
// ("already arrived", before welcome: a rank retries after it, in case the
// holder's connection ends); the other keeps rank 1, gets welcome with rank
// 0's valid proof, and start once the world is complete and it has answered
// the roll call. A real duplicate rank 1 is refused the same way, again and
// again until its deadline, and its error says why.
func TestDuplicateRanksByRawClients(t *testing.T) {
	cfg := Config{World: 3, Token: testToken, Timeout: 10 * time.Second}
	addr, root := advRoot(t, cfg)
	type answer struct {
		i   int
		f   frame
		err error
	}
	answers := make(chan answer, 2)
	for i := range 2 {
		c, ch := advConnect(t, addr)
		if _, err := c.Write(advHello(ch, version, 3, 1, testToken)); err != nil {
			t.Fatal(err)
		}
		go func() {
			f, err := advAnswer(c, 8*time.Second)
			if err == nil && f.typ == frameWelcome {
				rankNonce := bytes.Repeat([]byte{7}, nonceLen)
				if !bytes.Equal(f.body, proof(testToken, roleRoot, ch.nonce, rankNonce, 3, 1)) {
					err = errors.New("welcome without rank 0's proof")
				} else if err = advAwaitStart(advSession(c, ch, testToken, 3, 1), 8*time.Second); err == nil {
					f.typ = frameStart
				}
			}
			answers <- answer{i, f, err}
		}()
	}
	first := <-answers
	if first.err != nil || first.f.typ != frameReject || !strings.Contains(string(first.f.body), "rank 1 has already arrived") {
		t.Fatalf("duplicate rank 1: %v %s %q", first.err, frameName(first.f.typ), first.f.body)
	}
	dup := cfg
	dup.Timeout = time.Second
	if _, err := advJoin(t, addr, dup, 1); !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "already arrived") {
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
	cfg := Config{World: 3, Token: testToken, Timeout: 10 * time.Second, MaxMessage: 4096}
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
	cfg := Config{World: 2, Token: testToken, Timeout: 4 * time.Second}
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
// frames that break the protocol (with valid authentication codes, or
// without). Rank 0's next collective call fails with an error naming the
// rank and the problem, and rank 0 relays the failure to the real rank,
// which fails with ErrAborted.
func TestPeerBreaksProtocolAfterJoin(t *testing.T) {
	mac := func(typ byte, body []byte) func(*peer) []byte {
		return func(p *peer) []byte {
			var b bytes.Buffer
			writeFrame(&b, typ, body, frameMAC(p.sendKey, p.sendSeq, typ, body))
			return b.Bytes()
		}
	}
	raw := func(b []byte) func(*peer) []byte { return func(*peer) []byte { return b } }
	for _, tc := range []struct {
		name string
		msg  func(*peer) []byte
		want error
		text string
	}{
		{"oversized length", raw([]byte{0x7f, 0xff, 0xff, 0xff}), ErrPeerLost, "malformed"},
		{"zero length", raw([]byte{0, 0, 0, 0}), ErrPeerLost, "malformed"},
		{"unknown type", mac(0x42, nil), ErrMalformed, "rank 1 sent type 66"},
		{"second hello", mac(frameHello, make([]byte, helloLen)), ErrMalformed, "rank 1 sent hello after start"},
		{"data instead of barrier", mac(frameData, []byte("xx")), ErrMalformed, "rank 1 sent data while rank 0 expects barrier"},
		{"barrier without its code", raw(advFrame(1, frameBarrier, nil)), ErrAuth, "frame 1 from rank 1"},
		{"barrier with another's code", func(p *peer) []byte {
			var b bytes.Buffer
			writeFrame(&b, frameBarrier, nil, frameMAC(p.recvKey, p.sendSeq, frameBarrier, nil))
			return b.Bytes()
		}, ErrAuth, "altered, replayed or reordered"},
		{"barrier replayed", func(p *peer) []byte {
			var b bytes.Buffer
			writeFrame(&b, frameBarrier, nil, frameMAC(p.sendKey, p.sendSeq-1, frameBarrier, nil))
			return b.Bytes()
		}, ErrAuth, "altered, replayed or reordered"},
		{"hang up without bye", nil, ErrPeerLost, "rank 1: connection ended without goodbye"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{World: 3, Token: testToken, Timeout: 5 * time.Second}
			addr, root := advRoot(t, cfg)
			c, ch := advConnect(t, addr)
			if _, err := c.Write(advHello(ch, version, 3, 1, testToken)); err != nil {
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
			if f, err := advAnswer(c, 5*time.Second); err != nil || f.typ != frameWelcome {
				t.Fatalf("raw rank 1: %v %s", err, frameName(f.typ))
			}
			p := advSession(c, ch, testToken, 3, 1)
			if err := advAwaitStart(p, 5*time.Second); err != nil {
				t.Fatalf("raw rank 1: %v", err)
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
			} else if _, err := c.Write(tc.msg(p)); err != nil {
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

// TestFakeRankZero: a dialing rank talks to a rank 0 that misbehaves or
// does not hold the token. Join must fail with a clear error by its
// deadline, never hang, and never take a peer that did not prove the token
// for rank 0. The fake answers every connection the same way: the rank
// dials again after every answer that comes before rank 0's proof, so
// those end at the deadline with ErrTimeout wrapping the last answer;
// after the proof, the first failure is final.
func TestFakeRankZero(t *testing.T) {
	const other = "another-job-token-0123456789"
	validChallenge := func(ch challenge) []byte { return advFrame(uint32(1+challengeLen), frameChallenge, ch.encode()) }
	welcome := func(token string, ch challenge, h hello) []byte {
		return advFrame(1+proofLen, frameWelcome, proof(token, roleRoot, ch.nonce, h.nonce, h.world, h.rank))
	}
	for _, tc := range []struct {
		name  string
		first func(ch challenge) []byte          // instead of a challenge; nil: a valid challenge
		then  func(ch challenge, h hello) []byte // after the hello; nil: say nothing
		close bool
		want  error
		text  string
	}{
		{"closes at once", func(challenge) []byte { return nil }, nil, true, ErrTimeout, "closed the connection before its challenge"},
		{"silent", func(challenge) []byte { return nil }, nil, false, ErrTimeout, "for rank 0's challenge"},
		{"oversized instead of a challenge", func(challenge) []byte { return []byte{0x7f, 0xff, 0xff, 0xff} }, nil, false, ErrMalformed, "frame of"},
		{"barrier instead of a challenge", func(challenge) []byte { return advFrame(1, frameBarrier, nil) }, nil, false, ErrMalformed, "expected a challenge from the peer"},
		{"abort instead of a challenge", func(challenge) []byte { return advFrame(5, frameAbort, []byte("boom")) }, nil, false, ErrAborted, "boom"},
		{"challenge without magic", func(challenge) []byte { return advFrame(6, frameChallenge, []byte("XXXX\x02")) }, nil, false, ErrMalformed, "not a rendezvous challenge"},
		{"challenge of version 1", func(challenge) []byte { return advFrame(6, frameChallenge, []byte("SGRV\x01")) }, nil, false, ErrRejected, "speaks protocol version 1"},
		{"challenge without a nonce", func(challenge) []byte { return advFrame(6, frameChallenge, []byte{'S', 'G', 'R', 'V', version}) }, nil, false, ErrMalformed, "challenge of 5 bytes"},
		{"reject", nil, func(challenge, hello) []byte { return advFrame(8, frameReject, []byte("go away")) }, false, ErrRejected, "go away"},
		{"reject for the token", nil, func(challenge, hello) []byte {
			return advFrame(uint32(1+len(notAuthenticated)), frameReject, []byte(notAuthenticated))
		}, false, ErrRejected, "is the job token the same on every rank?"},
		{"abort", nil, func(challenge, hello) []byte { return advFrame(5, frameAbort, []byte("boom")) }, false, ErrAborted, "boom"},
		{"welcome without the token", nil, func(ch challenge, h hello) []byte { return welcome(other, ch, h) }, false, ErrAuth, "not this job's rank 0"},
		{"welcome of another connection", nil, func(ch challenge, h hello) []byte {
			ch.nonce = bytes.Repeat([]byte{3}, nonceLen)
			return welcome(testToken, ch, h)
		}, false, ErrAuth, "without proving the job token"},
		{"welcome of the rank's role", nil, func(ch challenge, h hello) []byte {
			return advFrame(1+proofLen, frameWelcome, proof(testToken, roleRank, ch.nonce, h.nonce, h.world, h.rank))
		}, false, ErrAuth, "without proving"},
		{"start without welcome", nil, func(challenge, hello) []byte { return advFrame(1, frameStart, nil) }, false, ErrMalformed, "expected welcome"},
		{"closes after the hello", nil, func(challenge, hello) []byte { return nil }, true, ErrTimeout, "closed the connection before welcoming rank 1"},
		// A rank 0 that holds the token and then misbehaves.
		{"welcome, then oversized", nil, func(ch challenge, h hello) []byte {
			return append(welcome(testToken, ch, h), 0x7f, 0xff, 0xff, 0xff)
		}, false, ErrPeerLost, "frame of"},
		{"welcome, then garbage type", nil, func(ch challenge, h hello) []byte {
			return append(welcome(testToken, ch, h), advMACFrame(testToken, ch, h, 0, 0x99, nil)...)
		}, false, ErrMalformed, "got type 153"},
		{"welcome, then start without its code", nil, func(ch challenge, h hello) []byte {
			return append(welcome(testToken, ch, h), advFrame(1, frameStart, nil)...)
		}, false, ErrAuth, "fails its authentication code"},
		{"welcome, then a frame out of sequence", nil, func(ch challenge, h hello) []byte {
			return append(welcome(testToken, ch, h), advMACFrame(testToken, ch, h, 1, frameStart, nil)...)
		}, false, ErrAuth, "fails its authentication code"},
		{"welcome, then truncated", nil, func(ch challenge, h hello) []byte {
			return append(welcome(testToken, ch, h), advFrame(50, frameStart, nil)...)
		}, true, ErrPeerLost, "unexpected EOF"},
		{"welcome, then closes", nil, func(ch challenge, h hello) []byte { return welcome(testToken, ch, h) }, true, ErrPeerLost, "waiting for start"},
		{"welcome, then abort", nil, func(ch challenge, h hello) []byte {
			return append(welcome(testToken, ch, h), advMACFrame(testToken, ch, h, 0, frameAbort, []byte("boom"))...)
		}, false, ErrAborted, "boom"},
		{"welcome, then an authenticated reject", nil, func(ch challenge, h hello) []byte {
			return append(welcome(testToken, ch, h), advMACFrame(testToken, ch, h, 0, frameReject, []byte("rank 1 out of range"))...)
		}, false, ErrRejected, "rank 1 out of range"},
		{"welcome, then silent", nil, func(ch challenge, h hello) []byte { return welcome(testToken, ch, h) }, false, ErrTimeout, "for the other ranks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			hellos := make(chan []byte, 100)
			done := make(chan struct{})
			hold := func() { // keep the connection open until the test ends
				select {
				case <-done:
				case <-time.After(1500 * time.Millisecond):
				}
			}
			var wg sync.WaitGroup
			defer wg.Wait()
			defer close(done)
			defer l.Close()
			wg.Go(func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					wg.Go(func() {
						defer c.Close()
						ch := challenge{version: version, nonce: bytes.Repeat([]byte{9}, nonceLen)}
						first := validChallenge(ch)
						if tc.first != nil {
							first = tc.first(ch)
						}
						c.Write(first)
						if tc.first != nil {
							if !tc.close {
								hold()
							}
							return
						}
						c.SetReadDeadline(time.Now().Add(2 * time.Second))
						f, err := readFrame(c, maxHello)
						if err != nil {
							return
						}
						hellos <- f.body
						h, _ := decodeHello(f.body)
						if tc.then != nil {
							c.Write(tc.then(ch, h))
						}
						if !tc.close {
							hold()
						}
					})
				}
			})
			start := time.Now()
			_, err = Join(context.Background(), Config{Addr: l.Addr().String(), Rank: 1, World: 2, Token: testToken, Timeout: 500 * time.Millisecond})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Join: %v, want %v with %q", err, tc.want, tc.text)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("Join took %v with a 500 ms timeout", d)
			}
			if tc.first != nil {
				return
			}
			// The hello proves the token without carrying it.
			body := <-hellos
			h, err := decodeHello(body)
			ch := challenge{version: version, nonce: bytes.Repeat([]byte{9}, nonceLen)}
			if err != nil || h.rank != 1 || h.world != 2 || !bytes.Equal(h.proof, proof(testToken, roleRank, ch.nonce, h.nonce, 2, 1)) {
				t.Fatalf("the fake rank 0 got %+v, %v", h, err)
			}
			if bytes.Contains(body, []byte(testToken)) {
				t.Fatal("the hello carries the job token")
			}
		})
	}
}

// TestStrangerGetsNothing: strangers without the token connect before the
// real ranks, claim their ranks, and replay a real rank's hello recorded off
// the wire. They get only the challenge and "not authenticated", never the
// broadcast; the real ranks all get in and receive it.
func TestStrangerGetsNothing(t *testing.T) {
	advNoLeak(t)
	cfg := Config{World: 3, Token: testToken, Timeout: 10 * time.Second}
	addr, root := advRoot(t, cfg)
	// Strangers claiming ranks 1 and 2 with a guessed token, first in line.
	var strangers []net.Conn
	for _, rank := range []uint32{1, 2} {
		c, ch := advConnect(t, addr)
		if _, err := c.Write(advHello(ch, version, 3, rank, "guessed-token-0123456789abcdef")); err != nil {
			t.Fatal(err)
		}
		strangers = append(strangers, c)
	}
	// Rank 1 joins through a proxy that records what it sends.
	rec := &recordingProxy{target: addr}
	proxyAddr := rec.start(t)
	got := make(chan []byte, 2)
	errs := make(chan error, 2)
	join := func(r int, a string) {
		c := cfg
		c.Addr, c.Rank = a, r
		g, err := Join(context.Background(), c)
		if err != nil {
			errs <- err
			return
		}
		defer g.Close()
		data, err := g.Broadcast(context.Background(), nil)
		got <- data
		errs <- err
	}
	go join(1, proxyAddr)
	// An eavesdropper replays rank 1's hello as soon as it has crossed the
	// wire, on a connection of its own, before rank 2 completes the world.
	helloBytes := rec.firstFrameFromClient(t)
	c, _ := advConnect(t, addr)
	if _, err := c.Write(helloBytes); err != nil {
		t.Fatal(err)
	}
	strangers = append(strangers, c)
	time.Sleep(100 * time.Millisecond) // rank 0 has read it
	go join(2, addr)
	g0, err := root()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g0.Broadcast(context.Background(), []byte("nccl-id")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if d := <-got; string(d) != "nccl-id" {
			t.Fatalf("a real rank received %q", d)
		}
	}
	for i, c := range strangers {
		var frames []string
		for {
			f, err := advAnswer(c, 3*time.Second)
			if err != nil {
				if isTimeout(err) {
					t.Fatalf("stranger %d: the connection stays open", i)
				}
				break
			}
			frames = append(frames, fmt.Sprintf("%s %q", frameName(f.typ), f.body))
		}
		if len(frames) != 1 || frames[0] != fmt.Sprintf("reject %q", notAuthenticated) {
			t.Fatalf("stranger %d received %v, want only the bare reject", i, frames)
		}
	}
}

// recordingProxy relays one connection to target and records the first
// frame the client sends after the challenge (a rank's hello).
type recordingProxy struct {
	target string
	hello  chan []byte
}

func (p *recordingProxy) start(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.hello = make(chan []byte, 1)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			return
		}
		defer s.Close()
		wg.Go(func() { io.Copy(c, s); c.Close() })
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		p.hello <- append(hdr[:], body...)
		s.Write(append(hdr[:], body...))
		io.Copy(s, c)
	})
	return l.Addr().String()
}

func (p *recordingProxy) firstFrameFromClient(t *testing.T) []byte {
	t.Helper()
	select {
	case b := <-p.hello:
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy saw no hello")
		return nil
	}
}

// flakyListener fails Accept with err for its first fails calls (forever
// with fails < 0), then accepts.
type flakyListener struct {
	net.Listener
	err   error
	fails atomic.Int64
	calls atomic.Int64
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.calls.Add(1)
	if n := l.fails.Load(); n != 0 {
		if n > 0 {
			l.fails.Add(-1)
		}
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsAreRetried: an Accept failing with EMFILE (the process is
// out of descriptors) is retried with back-off, and Join succeeds once it
// passes; one failing until the deadline ends Join with a timeout that says
// why, without spinning; a permanent error ends Join at once.
func TestAcceptErrorsAreRetried(t *testing.T) {
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	for _, tc := range []struct {
		name  string
		err   error
		fails int64
		want  string // "" when Join succeeds
	}{
		{"EMFILE for a while", emfile, 6, ""},
		{"ECONNABORTED once", &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ECONNABORTED)}, 1, ""},
		{"EMFILE until the deadline", emfile, -1, "too many open files"},
		{"a permanent error", errors.New("listener broken"), -1, "listener broken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			advNoLeak(t)
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := &flakyListener{Listener: inner, err: tc.err}
			l.fails.Store(tc.fails)
			timeout := 10 * time.Second
			if tc.want != "" {
				timeout = time.Second
			}
			cfg := Config{World: 2, Token: testToken, Timeout: timeout, Listener: l,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if tc.want != "" && tc.err != emfile {
				// A permanent error ends Join at once: far from the deadline.
				cfg.Timeout = time.Minute
			}
			rank1 := make(chan *Group, 1)
			go func() {
				g, _ := advJoin(t, inner.Addr().String(), Config{World: 2, Token: testToken, Timeout: timeout}, 1)
				rank1 <- g
			}()
			start := time.Now()
			g0, err := Join(context.Background(), cfg)
			d := time.Since(start)
			if g0 != nil {
				defer g0.Close()
			}
			g1 := <-rank1
			if tc.want == "" {
				if err != nil || g1 == nil {
					t.Fatalf("rank 0: %v; rank 1 joined: %v", err, g1 != nil)
				}
				if n := l.calls.Load(); n < tc.fails+1 {
					t.Fatalf("Accept called %d times", n)
				}
				if _, err := g0.Broadcast(context.Background(), []byte("x")); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("rank 0: %v, want %q", err, tc.want)
			}
			if tc.err == emfile {
				if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "ranks [1]") {
					t.Fatalf("rank 0: %v, want a timeout naming rank 1", err)
				}
				// Back-off from 5 ms doubling: a dozen calls in a second,
				// not thousands.
				if n := l.calls.Load(); n > 20 {
					t.Fatalf("Accept called %d times in %v: no back-off", n, d)
				}
			} else if d > 20*time.Second {
				t.Fatalf("a permanent accept error took %v to end Join", d)
			}
		})
	}
}

// countingListener counts the connections it accepted that are still
// open, and the most open at once.
type countingListener struct {
	net.Listener
	mu             sync.Mutex
	open, max, all int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.open++
	l.all++
	l.max = max(l.max, l.open)
	l.mu.Unlock()
	return &countedConn{Conn: c, l: l}, nil
}

func (l *countingListener) counts() (open, most, all int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.max, l.all
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// TestConnectionFloodIsCapped: a flood of connections that say nothing
// holds at most MaxPending connections open on rank 0 at any time (the
// others wait unaccepted in the listen queue; while every place is taken,
// each silent one gets only answerWait and then makes way), and the real
// ranks, arriving after the flood, still join at once.
func TestConnectionFloodIsCapped(t *testing.T) {
	advNoLeak(t)
	const (
		maxPending = 4
		flood      = 40
		world      = 3
	)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{Listener: inner}
	addr := inner.Addr().String()
	cfg := Config{World: world, Token: testToken, Timeout: 20 * time.Second, MaxPending: maxPending,
		Listener: l, Logger: quiet(), answerWait: 50 * time.Millisecond}
	root := make(chan error, 1)
	var g0 *Group
	go func() {
		var err error
		g0, err = Join(context.Background(), cfg)
		root <- err
	}()
	var held []net.Conn
	for range flood {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// Every silent connection is accepted in turn, and closed.
	for {
		if open, _, all := l.counts(); all == flood && open == 0 {
			break
		}
		select {
		case err := <-root:
			t.Fatalf("rank 0 ended: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, most, _ := l.counts(); most > maxPending {
		t.Fatalf("%d silent connections held open at once, MaxPending is %d", most, maxPending)
	}
	start := time.Now()
	gs, err := advJoinAll(t, addr, Config{World: world, Token: testToken, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("real ranks: %v", err)
	}
	if err := <-root; err != nil {
		t.Fatal(err)
	}
	defer g0.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the real ranks took %v to join after the flood", d)
	}
	if _, most, _ := l.counts(); most > maxPending+world-1 {
		t.Fatalf("%d connections open at once on rank 0; MaxPending %d and %d ranks allow %d", most, maxPending, world-1, maxPending+world-1)
	}
	checkBroadcast(t, g0, gs[1:], "id")
}

// TestTokenRequired: a world of more than one rank needs a token of at
// least MinTokenLen bytes on every rank; rank 0 refuses to listen without
// one, on a loopback address or any other, and closes a listener it was
// given.
func TestTokenRequired(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"rank 0 on loopback", Config{Rank: 0, World: 2, Addr: "127.0.0.1:0"}, EnvToken},
		{"rank 0 on every interface", Config{Rank: 0, World: 2, Addr: "0.0.0.0:0"}, EnvTokenFile},
		{"rank 0 on an external address", Config{Rank: 0, World: 2, Addr: "192.0.2.1:29500", Listen: ":0"}, "needs a job token"},
		{"rank 1", Config{Rank: 1, World: 2, Addr: "127.0.0.1:1"}, "needs a job token"},
		{"a short token", Config{Rank: 0, World: 2, Addr: "127.0.0.1:0", Token: "secret"}, "6 bytes, fewer than 16"},
		{"a huge token", Config{Rank: 0, World: 2, Addr: "127.0.0.1:0", Token: strings.Repeat("x", MaxTokenLen+1)}, "more than 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &countingListener{Listener: listen(t)}
			if tc.cfg.Rank == 0 {
				tc.cfg.Listener = l
			}
			start := time.Now()
			_, err := Join(context.Background(), tc.cfg)
			if !errors.Is(err, ErrNoToken) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Join: %v, want %v with %q", err, ErrNoToken, tc.want)
			}
			if time.Since(start) > 20*time.Second { // the default timeout is a minute
				t.Fatal("Join waited before refusing")
			}
			if tc.cfg.Rank == 0 {
				if _, err := l.Listener.Accept(); !errors.Is(err, net.ErrClosed) {
					t.Fatalf("the listener was left open: %v", err)
				}
			}
		})
	}
	// A world of one has no peer to authenticate.
	g, err := Join(context.Background(), Config{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
}
