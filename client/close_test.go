package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/client"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/streamcache"
)

// TestClientCloseCancelledContextIsDeterministic: ctx bounds Close's waits
// and nothing else. A client with nothing to wait for (never used, or its
// work done) closes with a context already cancelled, every time (it used
// to pick at random between the free semaphore and the done context, and
// then release nothing), and closing it again returns nil, every time.
// Sampled by count: 200 rounds each. A nil context is an error, not a
// panic.
func TestClientCloseCancelledContextIsDeterministic(t *testing.T) {
	const rounds = 200
	done, cancel := context.WithCancel(context.Background())
	cancel()
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	y := e.alloc(0, 64)
	defer func() {
		if err := e.b.MemFree(y); err != nil {
			t.Error(err)
		}
	}()
	base := e.b.LiveHandles()
	for _, used := range []bool{false, true} {
		for i := range rounds {
			c := e.open(client.Options{})
			if used {
				s, err := c.Stream(0, 0)
				if err != nil {
					t.Fatal(err)
				}
				e.launch(0, kernels.Fill, 16, s, gpu.Ptr(y), gpu.F32(1), gpu.I32(16))
				if _, err := c.Submitted(0, 0); err != nil {
					t.Fatal(err)
				}
				if err := c.Synchronize(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.CloseContext(done); err != nil {
				t.Fatalf("used %v, round %d: nothing to wait for, yet Close says %v", used, i, err)
			}
			for j := range 5 {
				if err := c.CloseContext(done); err != nil {
					t.Fatalf("used %v, round %d: Close %d of a closed client: %v", used, i, j+2, err)
				}
			}
			// The streams went back to the cache: nothing else is live.
			if err := e.cache.Purge(e.b); err != nil {
				t.Fatal(err)
			}
			if live := e.b.LiveHandles(); live != base {
				t.Fatalf("used %v, round %d: live handles %s after Close, want %s", used, i, live, base)
			}
		}
	}
	c := e.open(client.Options{})
	var nilCtx context.Context
	if err := c.CloseContext(nilCtx); !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), "nil context.Context") {
		t.Errorf("nil context: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestClientCloseWaitingForAnotherClose: while a Close waits for a stream
// held by a gated kernel, a Close with a cancelled context says it was
// waiting for another Close and releases nothing; once the first has
// released everything, one with a cancelled context returns nil. The first
// Close is known to be in its wait when it polls the stuck stream.
func TestClientCloseWaitingForAnotherClose(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	gate := make(chan struct{})
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(gate)
		}
	}
	defer open()
	e.load(0, gateModule(gate))
	c := e.open(client.Options{})
	s, err := c.Stream(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	x, y := e.alloc(0, 64), e.alloc(0, 64)
	defer func() {
		for _, p := range []gpu.DevicePtr{x, y} {
			if err := e.b.MemFree(p); err != nil {
				t.Error(err)
			}
		}
	}()
	e.launch(0, "gated_copy", 16, s, gpu.Ptr(y), gpu.Ptr(x), gpu.I32(16))
	if _, err := c.Submitted(0, 0); err != nil {
		t.Fatal(err)
	}
	queries := e.b.Calls("StreamQuery")
	first := make(chan error, 1)
	go func() { first <- c.CloseContext(context.Background()) }()
	for e.b.Calls("StreamQuery") == queries {
		select {
		case err := <-first:
			t.Fatalf("the first Close returned with the stream held: %v", err)
		default:
		}
		time.Sleep(100 * time.Microsecond)
	}
	for range 20 {
		err := c.CloseContext(done)
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "waiting for another Close to finish") {
			t.Fatalf("another Close in progress, cancelled context: %v", err)
		}
	}
	open()
	if err := <-first; err != nil {
		t.Fatalf("the first Close, once the stream is idle: %v", err)
	}
	for range 20 {
		if err := c.CloseContext(done); err != nil {
			t.Fatalf("closed client, cancelled context: %v", err)
		}
	}
}
