package streamcache

import (
	"errors"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// fakeStreams is an in-memory Streams whose query answers the test sets.
type fakeStreams struct {
	mu        sync.Mutex
	next      gpu.Stream
	live      map[gpu.Stream]bool
	busy      map[gpu.Stream]bool
	broken    map[gpu.Stream]error
	destroyed int
	created   int
}

func newFake() *fakeStreams {
	return &fakeStreams{live: map[gpu.Stream]bool{}, busy: map[gpu.Stream]bool{}, broken: map[gpu.Stream]error{}}
}

func (f *fakeStreams) StreamCreate(dev int, flags gpu.StreamFlags, prio int) (gpu.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	f.live[f.next] = true
	f.created++
	return f.next, nil
}

func (f *fakeStreams) StreamQuery(s gpu.Stream) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[s]; !ok {
		return false, gpu.ErrInvalidHandle
	}
	if err := f.broken[s]; err != nil {
		return false, err
	}
	return !f.busy[s], nil
}

func (f *fakeStreams) StreamDestroy(s gpu.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[s]; !ok {
		return gpu.ErrInvalidHandle
	}
	delete(f.live, s)
	f.destroyed++
	return nil
}

func (f *fakeStreams) liveCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

var k0 = Key{Device: 0, Flags: gpu.StreamNonBlocking}

func TestGetPutHitMiss(t *testing.T) {
	c := New(Options{})
	f := newFake()
	s1, err := c.Get(f, k0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(f, k0, s1, nil); err != nil {
		t.Fatal(err)
	}
	s2, err := c.Get(f, k0)
	if err != nil {
		t.Fatal(err)
	}
	if s2 != s1 {
		t.Fatalf("Get after Put returned %d, want the cached %d", s2, s1)
	}
	// Another key, and another backend, never share streams.
	s3, _ := c.Get(f, Key{Device: 1})
	g := newFake()
	s4, _ := c.Get(g, k0)
	st := c.Stats()
	if st.Hits != 1 || st.Misses != 3 || st.Discards != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, p := range []struct {
		b Streams
		k Key
		s gpu.Stream
	}{{f, k0, s2}, {f, Key{Device: 1}, s3}, {g, k0, s4}} {
		if err := c.Put(p.b, p.k, p.s, nil); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.Idle != 3 {
		t.Fatalf("idle %d", st.Idle)
	}
	if err := c.Purge(f); err != nil {
		t.Fatal(err)
	}
	if f.liveCount() != 0 || g.liveCount() != 1 {
		t.Fatalf("Purge(f) left f with %d and g with %d live streams", f.liveCount(), g.liveCount())
	}
	if err := c.PurgeAll(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Idle != 0 || st.DiscardedPurged != 3 || g.liveCount() != 0 {
		t.Fatalf("stats %+v, g live %d", st, g.liveCount())
	}
}

func TestPutReportedErrorDestroys(t *testing.T) {
	c := New(Options{})
	f := newFake()
	s, _ := c.Get(f, k0)
	if err := c.Put(f, k0, s, errors.New("kernel faulted")); err != nil {
		t.Fatal(err)
	}
	if f.liveCount() != 0 {
		t.Fatal("a stream reported failed was kept")
	}
	if st := c.Stats(); st.DiscardedFailed != 1 || st.Idle != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPutQueryErrorDestroys(t *testing.T) {
	c := New(Options{})
	f := newFake()
	s, _ := c.Get(f, k0)
	fault := errors.New("sticky fault")
	f.broken[s] = fault
	err := c.Put(f, k0, s, nil)
	if !errors.Is(err, fault) {
		t.Fatalf("Put of a stream whose query fails = %v, want the query error", err)
	}
	s2, _ := c.Get(f, k0)
	if s2 == s {
		t.Fatal("a failed stream was handed out again")
	}
	if st := c.Stats(); st.DiscardedFailed != 1 || st.Hits != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPutBusyDestroys(t *testing.T) {
	c := New(Options{})
	f := newFake()
	s, _ := c.Get(f, k0)
	f.busy[s] = true
	if err := c.Put(f, k0, s, nil); err != nil {
		t.Fatal(err)
	}
	if f.liveCount() != 0 {
		t.Fatal("a busy stream was cached")
	}
	if st := c.Stats(); st.DiscardedBusy != 1 || st.Idle != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestGetRechecksCachedStream(t *testing.T) {
	c := New(Options{})
	f := newFake()
	s, _ := c.Get(f, k0)
	if err := c.Put(f, k0, s, nil); err != nil {
		t.Fatal(err)
	}
	f.broken[s] = errors.New("device faulted while cached")
	s2, err := c.Get(f, k0)
	if err != nil {
		t.Fatal(err)
	}
	if s2 == s {
		t.Fatal("a stream that failed while cached was handed out")
	}
	if st := c.Stats(); st.DiscardedFailed != 1 || st.Misses != 2 || st.Hits != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBoundedPerKey(t *testing.T) {
	c := New(Options{MaxIdlePerKey: 2})
	f := newFake()
	var ss []gpu.Stream
	for i := 0; i < 5; i++ {
		s, _ := c.Get(f, k0)
		ss = append(ss, s)
	}
	for _, s := range ss {
		if err := c.Put(f, k0, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.Idle != 2 || st.DiscardedFull != 3 || f.liveCount() != 2 {
		t.Fatalf("stats %+v, live %d", st, f.liveCount())
	}
	if err := c.PurgeAll(); err != nil {
		t.Fatal(err)
	}
}

func TestDisabledCacheKeepsNothing(t *testing.T) {
	c := New(Options{MaxIdlePerKey: -1})
	f := newFake()
	s, _ := c.Get(f, k0)
	if err := c.Put(f, k0, s, nil); err != nil {
		t.Fatal(err)
	}
	if f.liveCount() != 0 || c.Stats().Idle != 0 {
		t.Fatal("a cache with MaxIdlePerKey -1 kept a stream")
	}
}

func TestDefaults(t *testing.T) {
	if got := New(Options{}).Options().MaxIdlePerKey; got != 16 {
		t.Fatalf("default MaxIdlePerKey %d", got)
	}
	if Default == nil {
		t.Fatal("no process-wide cache")
	}
}

// uncomparable is a backend whose dynamic type cannot key a map.
type uncomparable struct{ _ []int }

func (uncomparable) StreamCreate(int, gpu.StreamFlags, int) (gpu.Stream, error) { return 1, nil }
func (uncomparable) StreamQuery(gpu.Stream) (bool, error)                       { return true, nil }
func (uncomparable) StreamDestroy(gpu.Stream) error                             { return nil }

func TestUncomparableBackendIsAnError(t *testing.T) {
	c := New(Options{})
	_, err := c.Get(uncomparable{}, k0)
	if !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("Get with an uncomparable backend = %v", err)
	}
}

func TestConcurrentGetPut(t *testing.T) {
	c := New(Options{MaxIdlePerKey: 4})
	f := newFake()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				s, err := c.Get(f, k0)
				if err != nil {
					t.Error(err)
					return
				}
				if err := c.Put(f, k0, s, nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := c.Stats()
	if st.Hits+st.Misses != 1600 || st.Idle > 4 || f.liveCount() != st.Idle {
		t.Fatalf("stats %+v, live %d", st, f.liveCount())
	}
	if err := c.PurgeAll(); err != nil || f.liveCount() != 0 {
		t.Fatalf("purge: %v, live %d", err, f.liveCount())
	}
}
