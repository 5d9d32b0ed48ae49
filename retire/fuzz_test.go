package retire

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// fuzzTimeline is a Timeline the fuzzer drives: Completed moves only when
// the input says so, and Wait either lets the device catch up to the point
// at once (a GPU that finishes) or fails at once with gpu.ErrTimeout (a
// stalled one), so that no fuzz iteration sleeps.
type fuzzTimeline struct {
	completed atomic.Uint64
	stalled   bool
	failed    int // waits that failed
}

func (f *fuzzTimeline) Completed() uint64 { return f.completed.Load() }

func (f *fuzzTimeline) Wait(_ context.Context, point uint64, _ time.Duration) error {
	if f.completed.Load() >= point {
		return nil
	}
	if f.stalled {
		f.failed++
		return fmt.Errorf("fuzz timeline stalled at %d, waiting for %d: %w", f.completed.Load(), point, gpu.ErrTimeout)
	}
	f.completed.Store(point)
	return nil
}

var errFuzzRelease = errors.New("fuzz: release failed")

// FuzzQueue drives a Queue with a random sequence of retires (batches of
// random sizes at random points, in and out of order, some releases
// failing), timeline advances, stalls, polls, drains and forced releases,
// against a model of the pending batches. After every operation it checks
// the retirement rule and the bookkeeping:
//
//   - no batch is released before the timeline passed its point (or the
//     caller vouched for it: DrainThrough, ReleaseAll), and none twice;
//   - batches are released in point order, and a poll leaves no batch whose
//     point has passed;
//   - with a timeline that keeps up, Retire keeps at most MaxPending
//     batches pending;
//   - Stats agree with the model: pending batches and bytes, peak bytes,
//     released batches by cause, release errors;
//   - an operation returns an error exactly when a release it ran failed
//     or its wait failed, and the error wraps the release's error;
//   - at the end ReleaseAll releases every batch still pending, exactly once.
func FuzzQueue(f *testing.F) {
	f.Add(uint8(3), []byte{0, 1, 10, 0, 2, 10, 1, 1, 2, 0, 3, 5, 3, 0, 4, 0})
	f.Add(uint8(1), []byte{0, 5, 1, 0, 3, 1, 6, 0, 0, 7, 2, 2, 1, 6, 1, 1, 9, 0, 3, 0, 5, 0})
	f.Add(uint8(2), []byte{6, 1, 0, 1, 1, 0, 2, 1, 0, 3, 1, 3, 0, 6, 0, 4, 2, 5, 0})
	f.Add(uint8(0), []byte{0, 0, 0, 0, 0, 0, 2, 0})
	f.Add(uint8(7), []byte{0, 9, 200, 0, 3, 100, 0, 7, 255, 0, 1, 17, 1, 4, 4, 3, 6, 1, 0, 2, 2, 3, 0})
	f.Fuzz(func(t *testing.T, maxPending uint8, ops []byte) {
		tl := &fuzzTimeline{}
		q := NewQueue(tl, Options{MaxPending: int(maxPending%8) + 1})
		ctx := context.Background()

		type batchModel struct {
			id       int
			point    uint64
			bytes    uint64
			items    int
			released int // items released
			failing  int // items whose release fails
		}
		var (
			batches   []*batchModel
			pending   = map[int]*batchModel{}
			allowed   uint64 // the highest point the current operation may release
			lastPoint uint64 // the point of the last release within an operation
			ranFails  int    // failing releases run by the current operation
			failsRun  uint64 // all failing releases run
			released  uint64 // batches fully released
			peak      uint64
			adding    = -1 // the batch the current Retire adds
		)
		next := func(i *int) int {
			if *i >= len(ops) {
				return 0
			}
			*i++
			return int(ops[*i-1])
		}
		pendingBytes := func() uint64 {
			var n uint64
			for _, b := range pending {
				n += b.bytes
			}
			return n
		}
		mkBatch := func(point uint64, sizes []uint64, failMask int) (Batch, *batchModel) {
			m := &batchModel{id: len(batches), point: point, items: len(sizes)}
			batches = append(batches, m)
			var b Batch
			for k, sz := range sizes {
				m.bytes += sz
				fail := failMask&(1<<k) != 0
				if fail {
					m.failing++
				}
				b = append(b, Item{Bytes: sz, Release: func() error {
					if m.released >= m.items {
						t.Fatalf("batch %d (point %d) released more than once", m.id, m.point)
					}
					if _, ok := pending[m.id]; !ok {
						t.Fatalf("batch %d released while not pending", m.id)
					}
					if m.point > allowed && m.point > tl.Completed() {
						t.Fatalf("batch %d released at point %d before the timeline passed it (completed %d, allowed %d)",
							m.id, m.point, tl.Completed(), allowed)
					}
					// Within one pass releases go in point order; the batch
					// Retire adds is released by a pass of its own, after the
					// passes that made room for it.
					if m.point < lastPoint && m.id != adding {
						t.Fatalf("batch %d (point %d) released after a batch of point %d", m.id, m.point, lastPoint)
					}
					lastPoint = m.point
					m.released++
					if m.released == m.items {
						delete(pending, m.id)
						released++
					}
					if fail {
						ranFails++
						failsRun++
						return fmt.Errorf("item %d of batch %d: %w", k, m.id, errFuzzRelease)
					}
					return nil
				}})
			}
			return b, m
		}
		begin := func(limit uint64) {
			allowed, lastPoint, ranFails = limit, 0, 0
		}
		// checkErr checks an operation's error: present exactly when a
		// release failed or the wait did.
		checkErr := func(op string, err error, waitFailed bool) {
			t.Helper()
			switch {
			case ranFails > 0 && !errors.Is(err, errFuzzRelease):
				t.Fatalf("%s ran %d failing releases but returned %v", op, ranFails, err)
			case ranFails == 0 && !waitFailed && err != nil:
				t.Fatalf("%s failed with nothing failing: %v", op, err)
			case waitFailed && err == nil:
				t.Fatalf("%s: its wait failed but it returned no error", op)
			}
		}
		// checkPolled: after a poll nothing whose point passed is pending.
		checkPolled := func(op string) {
			t.Helper()
			c := tl.Completed()
			for _, b := range pending {
				if b.point <= c {
					t.Fatalf("%s left batch %d (point %d) pending with the timeline at %d", op, b.id, b.point, c)
				}
			}
		}
		checkStats := func(op string) {
			t.Helper()
			st := q.Stats()
			if st.PendingBatches != len(pending) {
				t.Fatalf("%s: Stats says %d batches pending, the model %d", op, st.PendingBatches, len(pending))
			}
			if st.PendingBytes != pendingBytes() {
				t.Fatalf("%s: Stats says %d bytes pending, the model %d", op, st.PendingBytes, pendingBytes())
			}
			peak = max(peak, st.PendingBytes)
			if st.PeakPendingBytes < peak || st.PeakPendingBytes < st.PendingBytes {
				t.Fatalf("%s: peak %d below pending %d (model peak %d)", op, st.PeakPendingBytes, st.PendingBytes, peak)
			}
			if st.ReleaseErrors != failsRun {
				t.Fatalf("%s: Stats counts %d release errors, the model %d", op, st.ReleaseErrors, failsRun)
			}
			if got := st.Released() + uint64(st.PendingBatches); got != uint64(len(batches)) {
				t.Fatalf("%s: released %d + pending %d != retired %d", op, st.Released(), st.PendingBatches, len(batches))
			}
			if st.Released() != released {
				t.Fatalf("%s: Stats counts %d batches released, the model %d", op, st.Released(), released)
			}
		}

		for i := 0; i < len(ops); {
			switch op := next(&i) % 8; op {
			case 0, 1: // Retire a batch: point relative to the timeline
				nitems := 1 + next(&i)%3
				sizes := make([]uint64, nitems)
				for k := range sizes {
					sizes[k] = uint64(next(&i)) * 256
				}
				var point uint64
				switch d := next(&i); d % 4 {
				case 0:
					point = 0
				case 1:
					point = tl.Completed() - min(tl.Completed(), uint64(d/4%4))
				default:
					point = tl.Completed() + uint64(d/4%16) + 1
				}
				fails := 0
				if op == 1 {
					fails = next(&i)
				}
				b, m := mkBatch(point, sizes, fails)
				pending[m.id] = m
				failedBefore := tl.failed
				begin(tl.Completed())
				adding = m.id
				err := q.Retire(ctx, b, point)
				adding = -1
				waitFailed := tl.failed > failedBefore
				if waitFailed && !errors.Is(err, gpu.ErrTimeout) {
					t.Fatalf("Retire: the wait for the oldest batch failed but Retire returned %v", err)
				}
				checkErr("Retire", err, waitFailed)
				if !tl.stalled && q.Stats().PendingBatches > q.Options().MaxPending {
					t.Fatalf("Retire left %d batches pending with a timeline that keeps up (max %d)", q.Stats().PendingBatches, q.Options().MaxPending)
				}
				checkPolled("Retire")
				checkStats("Retire")
			case 2: // the device advances
				tl.completed.Add(uint64(next(&i) % 8))
			case 3: // Poll
				begin(tl.Completed())
				checkErr("Poll", q.Poll(), false)
				checkPolled("Poll")
				checkStats("Poll")
			case 4: // Drain
				begin(0)
				var newest uint64
				for _, b := range pending {
					newest = max(newest, b.point)
				}
				failedBefore := tl.failed
				err := q.Drain(ctx)
				if tl.failed > failedBefore {
					if !errors.Is(err, gpu.ErrTimeout) {
						t.Fatalf("Drain with a stalled timeline: %v", err)
					}
					checkStats("Drain")
					break
				}
				checkErr("Drain", err, false)
				for _, b := range pending {
					if b.point <= newest {
						t.Fatalf("Drain left batch %d (point %d) pending", b.id, b.point)
					}
				}
				checkStats("Drain")
			case 5: // DrainThrough a point the caller vouches for
				p := tl.Completed() + uint64(next(&i)%4)
				begin(p)
				checkErr("DrainThrough", q.DrainThrough(p), false)
				for _, b := range pending {
					if b.point <= p {
						t.Fatalf("DrainThrough(%d) left batch %d (point %d) pending", p, b.id, b.point)
					}
				}
				checkStats("DrainThrough")
			case 6: // the device stalls or resumes
				tl.stalled = !tl.stalled
			case 7: // ReleaseAll
				begin(^uint64(0))
				checkErr("ReleaseAll", q.ReleaseAll(), false)
				clear(pending)
				if st := q.Stats(); st.PendingBatches != 0 || st.PendingBytes != 0 {
					t.Fatalf("ReleaseAll left %d batches (%d bytes)", st.PendingBatches, st.PendingBytes)
				}
				checkStats("ReleaseAll")
			}
		}
		begin(^uint64(0))
		checkErr("final ReleaseAll", q.ReleaseAll(), false)
		clear(pending)
		for _, b := range batches {
			if b.released != b.items {
				t.Fatalf("batch %d (point %d): %d of %d items released", b.id, b.point, b.released, b.items)
			}
		}
		checkStats("final")
		if st := q.Stats(); st.PendingBatches != 0 || st.Released() != uint64(len(batches)) {
			t.Fatalf("at the end: %d pending, %d of %d released", st.PendingBatches, st.Released(), len(batches))
		}
	})
}
