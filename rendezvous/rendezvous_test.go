package rendezvous

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// testToken is the job token of the tests' jobs.
const testToken = "the-job-token-0123456789abcdef"

// loadedTimeout is the rendezvous timeout of tests whose ranks must do
// something before it passes (arrive, be refused, dial once): room for a
// loaded machine to schedule them, where the tests wait for it in full.
const loadedTimeout = 3 * time.Second

// listen returns a loopback listener on a free port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// joinAll joins world ranks (skipping those in skip, and using cfgs' hooks)
// and returns the groups and errors by rank.
func joinAll(t *testing.T, l net.Listener, world int, timeout time.Duration, edit func(r int, c *Config)) ([]*Group, []error) {
	t.Helper()
	gs := make([]*Group, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		cfg := Config{Addr: l.Addr().String(), Rank: r, World: world, Token: testToken, Timeout: timeout}
		if r == 0 {
			cfg.Listener = l
		}
		skip := false
		if edit != nil {
			edit(r, &cfg)
			skip = cfg.World == 0
		}
		if skip {
			continue
		}
		wg.Go(func() { gs[r], errs[r] = Join(context.Background(), cfg) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, g := range gs {
			if g != nil {
				g.Close()
			}
		}
	})
	return gs, errs
}

func TestJoinBroadcastBarrier(t *testing.T) {
	const world = 4
	gs, errs := joinAll(t, listen(t), world, 5*time.Second, nil)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	id := bytes.Repeat([]byte{0xab}, 128)
	got := make([][]byte, world)
	errs = make([]error, world)
	var wg sync.WaitGroup
	for r, g := range gs {
		wg.Go(func() {
			var data []byte
			if r == 0 {
				data = id
			}
			if got[r], errs[r] = g.Broadcast(context.Background(), data); errs[r] != nil {
				return
			}
			for range 3 {
				if errs[r] = g.Barrier(context.Background()); errs[r] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, b := range got {
		if !bytes.Equal(b, id) {
			t.Fatalf("rank %d received %x", r, b)
		}
	}
	for _, g := range gs {
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(g.Err(), ErrClosed) {
			t.Fatalf("Err after Close = %v", g.Err())
		}
	}
}

func TestWorldOfOne(t *testing.T) {
	g, err := Join(context.Background(), Config{Rank: 0, World: 1})
	if err != nil {
		t.Fatal(err)
	}
	data, err := g.Broadcast(context.Background(), []byte("x"))
	if err != nil || string(data) != "x" {
		t.Fatalf("Broadcast = %q, %v", data, err)
	}
	if err := g.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.Close()
}

// TestRankNeverArrives: rank 0 gives up at its deadline naming the rank
// that never came. The deadline leaves a loaded machine time to start rank
// 1, which must not be named.
func TestRankNeverArrives(t *testing.T) {
	t.Parallel() // waits out a deadline
	start := time.Now()
	_, errs := joinAll(t, listen(t), 3, loadedTimeout, func(r int, c *Config) {
		if r == 2 {
			c.World = 0 // never starts
		}
	})
	if d := time.Since(start); d > loadedTimeout+30*time.Second {
		t.Fatalf("Join took %v with a %v timeout", d, loadedTimeout)
	}
	if !errors.Is(errs[0], ErrTimeout) || !strings.Contains(errs[0].Error(), "ranks [2]") {
		t.Fatalf("rank 0: %v, want a timeout naming rank 2", errs[0])
	}
	// Rank 1 was told why, or timed out itself.
	if !errors.Is(errs[1], ErrAborted) && !errors.Is(errs[1], ErrTimeout) {
		t.Fatalf("rank 1: %v", errs[1])
	}
}

// TestRankZeroNeverArrives: a rank whose rank 0 never listens gives up at
// its deadline, naming the refused connection (its first attempt must come
// before the deadline, even on a loaded machine).
func TestRankZeroNeverArrives(t *testing.T) {
	t.Parallel() // waits out a deadline
	l := listen(t)
	addr := l.Addr().String()
	l.Close() // nobody listens: connections are refused until the deadline
	start := time.Now()
	_, err := Join(context.Background(), Config{Addr: addr, Rank: 1, World: 2, Token: testToken, Timeout: loadedTimeout})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "could not join rank 0") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > loadedTimeout+30*time.Second {
		t.Fatalf("Join took %v", d)
	}
}

func TestRejections(t *testing.T) {
	t.Parallel() // waits out a deadline
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"token", func(c *Config) { c.Token = "another job's token" }, "not authenticated (is the job token the same on every rank?)"},
		{"world", func(c *Config) { c.World = 5 }, "says the world has 5 ranks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, errs := joinAll(t, listen(t), 3, loadedTimeout, func(r int, c *Config) {
				if r == 2 {
					tc.edit(c)
					c.Rank = 2
				}
			})
			if !errors.Is(errs[2], ErrRejected) || !strings.Contains(errs[2].Error(), tc.want) {
				t.Fatalf("rank 2: %v, want rejected: %s", errs[2], tc.want)
			}
			if !errors.Is(errs[0], ErrTimeout) {
				t.Fatalf("rank 0: %v, want a timeout (rank 2 never arrived as it should)", errs[0])
			}
		})
	}
}

// TestDuplicateRank: a process claiming a rank that a live connection
// holds is refused ("already arrived") until its deadline; once the holder's
// connection ends, the rank is free again and the group forms.
func TestDuplicateRank(t *testing.T) {
	t.Parallel() // waits out a deadline
	l := listen(t)
	addr := l.Addr().String()
	root := make(chan error, 1)
	var rootG *Group
	go func() {
		var err error
		rootG, err = Join(context.Background(), Config{Listener: l, Rank: 0, World: 3, Token: testToken, Timeout: 10 * time.Second, Logger: quiet()})
		root <- err
	}()
	// A holder of the token takes rank 1.
	c, ch := advConnect(t, addr)
	if _, err := c.Write(advHello(ch, version, 3, 1, testToken)); err != nil {
		t.Fatal(err)
	}
	if f, err := advAnswer(c, 5*time.Second); err != nil || f.typ != frameWelcome {
		t.Fatalf("rank 0 answered %s, %v; want welcome", frameName(f.typ), err)
	}
	_, err := Join(context.Background(), Config{Addr: addr, Rank: 1, World: 3, Token: testToken, Timeout: loadedTimeout})
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "rank 1 has already arrived") {
		t.Fatalf("duplicate rank 1: %v", err)
	}
	c.Close()
	gs := make([]*Group, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := 1; r < 3; r++ {
		wg.Go(func() {
			gs[r], errs[r] = Join(context.Background(), Config{Addr: addr, Rank: r, World: 3, Token: testToken, Timeout: 10 * time.Second})
		})
	}
	wg.Wait()
	for _, g := range gs[1:] {
		if g != nil {
			defer g.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := <-root; err != nil {
		t.Fatal(err)
	}
	rootG.Close()
}

// raw connects to addr and sends b, returning what rank 0 answers.
func raw(t *testing.T, addr string, b []byte) frame {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if f, err := readFrame(c, 1<<20); err != nil || f.typ != frameChallenge {
		t.Fatalf("rank 0 sent %s, %v; want a challenge", frameName(f.typ), err)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	f, err := readFrame(c, 1<<20)
	if err != nil {
		return frame{typ: 0, body: []byte(err.Error())}
	}
	return f
}

func TestMalformedAndOversizedConnectionsAreRefused(t *testing.T) {
	l := listen(t)
	addr := l.Addr().String()
	done := make(chan error, 1)
	var root *Group
	go func() {
		var err error
		root, err = Join(context.Background(), Config{Listener: l, Rank: 0, World: 2, Token: testToken, Timeout: 5 * time.Second, MaxMessage: 256})
		done <- err
	}()
	oversized := make([]byte, 4)
	binary.BigEndian.PutUint32(oversized, 1<<30)
	var notHello bytes.Buffer
	writeFrame(&notHello, frameHello, []byte("HTTP/1.1 GET /"))
	var barrier bytes.Buffer
	writeFrame(&barrier, frameBarrier, nil)
	for name, msg := range map[string][]byte{"oversized": oversized, "not a hello": notHello.Bytes(), "wrong frame": barrier.Bytes()} {
		f := raw(t, addr, msg)
		if name == "oversized" {
			// Closed without an answer: the length alone is refused.
			if f.typ != 0 {
				t.Fatalf("%s: answered %s", name, frameName(f.typ))
			}
			continue
		}
		if f.typ != frameReject {
			t.Fatalf("%s: answered %s %q, want reject", name, frameName(f.typ), f.body)
		}
	}
	// The real rank 1 still gets in.
	g, err := Join(context.Background(), Config{Addr: addr, Rank: 1, World: 2, Token: testToken, Timeout: 5 * time.Second, MaxMessage: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := root.Broadcast(context.Background(), make([]byte, 257)); err == nil {
		t.Fatal("a broadcast over the maximum was sent")
	}
}

func TestPeerLostFailsTheOthers(t *testing.T) {
	for _, who := range []int{0, 2} {
		t.Run(fmt.Sprintf("rank %d dies", who), func(t *testing.T) {
			const world = 3
			gs, errs := joinAll(t, listen(t), world, 5*time.Second, nil)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			// The process of rank who dies: its connections end with no
			// goodbye.
			for _, p := range gs[who].conns {
				if p != nil {
					p.conn.Close()
				}
			}
			start := time.Now()
			for r, g := range gs {
				if r == who {
					continue
				}
				err := g.Barrier(context.Background())
				if !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrAborted) {
					t.Fatalf("rank %d: Barrier = %v, want the lost peer", r, err)
				}
				select {
				case <-g.Done():
				case <-time.After(time.Second):
					t.Fatalf("rank %d: Done not closed", r)
				}
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("failing took %v", d)
			}
		})
	}
}

func TestAbort(t *testing.T) {
	const world = 3
	gs, errs := joinAll(t, listen(t), world, 5*time.Second, nil)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	gs[1].Abort("out of memory")
	for r, g := range gs {
		select {
		case <-g.Done():
		case <-time.After(3 * time.Second):
			t.Fatalf("rank %d: not aborted", r)
		}
		if !errors.Is(g.Err(), ErrAborted) || !strings.Contains(g.Err().Error(), "out of memory") {
			t.Fatalf("rank %d: %v", r, g.Err())
		}
	}
}

func TestBarrierTimeout(t *testing.T) {
	gs, errs := joinAll(t, listen(t), 2, 5*time.Second, nil)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := gs[0].Barrier(ctx); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Barrier without rank 1 = %v, want a timeout", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{World: 0}, {World: 2, Rank: 2, Addr: "x:1"}, {World: 2, Rank: 1}} {
		if _, err := Join(context.Background(), c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestAllGather: every rank gets every rank's data, by rank, for parts of
// any size (empty ones too), several times in a row.
func TestAllGather(t *testing.T) {
	const world = 3
	gs, errs := joinAll(t, listen(t), world, 5*time.Second, nil)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		data := func(r int) []byte { return bytes.Repeat([]byte{byte(r + 1)}, (r*7+round*3)%11) }
		got := make([][][]byte, world)
		var wg sync.WaitGroup
		for r, g := range gs {
			wg.Go(func() { got[r], errs[r] = g.AllGather(context.Background(), data(r)) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for r := range world {
			if len(got[r]) != world {
				t.Fatalf("round %d: rank %d got %d parts", round, r, len(got[r]))
			}
			for from, part := range got[r] {
				if !bytes.Equal(part, data(from)) {
					t.Fatalf("round %d: rank %d got %x from rank %d, want %x", round, r, part, from, data(from))
				}
			}
		}
	}
}

// TestAllGatherFailures: a part or a whole over MaxMessage, and ranks that
// call different operations, fail every rank with an error instead of
// leaving any waiting.
func TestAllGatherFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(r int, g *Group) error
		want string
	}{
		{"one part too big", func(r int, g *Group) error {
			_, err := g.AllGather(context.Background(), make([]byte, 70*(r%2)+1))
			return err
		}, "exceeds the 64-byte maximum"},
		{"the whole too big", func(r int, g *Group) error {
			_, err := g.AllGather(context.Background(), make([]byte, 20))
			return err
		}, "in all exceeds the 64-byte maximum"},
		{"barrier against all-gather", func(r int, g *Group) error {
			if r == 1 {
				return g.Barrier(context.Background())
			}
			_, err := g.AllGather(context.Background(), []byte("x"))
			return err
		}, "rank 1 sent barrier while rank 0 expects gather"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const world = 3
			gs, errs := joinAll(t, listen(t), world, 5*time.Second, func(r int, c *Config) { c.MaxMessage = 64 })
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var wg sync.WaitGroup
			for r, g := range gs {
				wg.Go(func() { errs[r] = tc.call(r, g) })
			}
			wg.Wait()
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("the ranks took %v to fail", d)
			}
			found := false
			for r, err := range errs {
				if err == nil {
					t.Fatalf("rank %d succeeded", r)
				}
				found = found || strings.Contains(err.Error(), tc.want)
			}
			if !found {
				t.Fatalf("no rank says %q: %v", tc.want, errs)
			}
		})
	}
}
