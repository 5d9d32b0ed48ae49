package replay

import (
	"cmp"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Aliasing: buffers bound by the caller that share device memory.
//
// Frameworks bind an output onto a param's memory (an in-place update,
// a donated buffer), two outputs onto one buffer, or views that overlap in
// part. Eager runs every command in the caller's memory, so a command that
// reads a param after another wrote an output over it sees the new bytes:
// that is the semantics every strategy must give. The strategies that work
// in the caller's memory (eager, record, update, patch) give it by nature.
// Those that run the step over copies of their own (stable, pool) give it by
// laying their copies of each group of overlapping buffers out as the
// caller's are (copies.go): the same relative offsets, so the body reads and
// writes the same bytes through the same aliases, and the copies in and out
// move the same bytes.
//
// Overlaps is the one analysis both the executable (to refuse aliasing a
// strategy does not handle) and the copy strategies (to lay out their
// copies) use: a sort of the bound buffers by address, then one sweep that
// joins each buffer to the group of the one before when they overlap.
// O(n log n) in the buffers bound; its scratch is kept, so a steady-state
// step allocates nothing.

// Overlaps finds the groups of overlapping buffers among those bound for a
// step. The zero value is ready to use; it is not safe for concurrent use.
type Overlaps struct {
	spans  []aliasSpan // sorted by address; each group's spans are contiguous
	groups []aliasGroup
	hazard int   // groups that hold a written buffer among two or more
	at     []int // per buffer id, its index in spans; -1 for an id never analysed or without memory
}

// aliasSpan is one buffer's memory, [lo, hi).
type aliasSpan struct {
	buf     int
	lo, hi  uint64
	written bool
	group   int // index in groups; -1 for a buffer that overlaps none
}

// aliasGroup is a run of spans (spans[first:end]) whose union is one
// interval [lo, hi) that no other span touches.
type aliasGroup struct {
	first, end int
	lo, hi     uint64
	written    bool // some member is written by the step
}

// hazardous reports whether the group changes what a step computes unless
// its members are kept overlapping: two or more buffers, one of them
// written (two params read alone may share memory harmlessly).
func (g *aliasGroup) hazardous() bool { return g.end-g.first > 1 && g.written }

// Find analyses the buffers ids of bufs at addrs. Buffers of size zero
// overlap nothing.
func (o *Overlaps) Find(bufs []Buffer, ids []int, addrs []gpu.DevicePtr) {
	o.spans = o.spans[:0]
	o.groups = o.groups[:0]
	o.hazard = 0
	if len(o.at) < len(bufs) {
		o.at = make([]int, len(bufs))
		for i := range o.at {
			o.at[i] = -1
		}
	}
	for _, id := range ids {
		o.at[id] = -1
		d := &bufs[id]
		if d.Size <= 0 {
			continue
		}
		lo := uint64(addrs[id])
		o.spans = append(o.spans, aliasSpan{buf: id, lo: lo, hi: lo + uint64(d.Size),
			written: d.Class == Output || d.Flow.Written, group: -1})
	}
	if len(o.spans) < 2 {
		o.index()
		return
	}
	o.sort()
	start, hi := 0, o.spans[0].hi
	for i := 1; i <= len(o.spans); i++ {
		if i < len(o.spans) && o.spans[i].lo < hi {
			hi = max(hi, o.spans[i].hi)
			continue
		}
		if i-start > 1 {
			g := aliasGroup{first: start, end: i, lo: o.spans[start].lo, hi: hi}
			for k := start; k < i; k++ {
				o.spans[k].group = len(o.groups)
				g.written = g.written || o.spans[k].written
			}
			if g.hazardous() {
				o.hazard++
			}
			o.groups = append(o.groups, g)
		}
		if i < len(o.spans) {
			start, hi = i, o.spans[i].hi
		}
	}
	o.index()
}

// sort orders the spans by address, then buffer: an insertion sort for
// the few buffers a step binds (no call per comparison), the library's
// beyond.
func (o *Overlaps) sort() {
	sp := o.spans
	if len(sp) > 24 {
		slices.SortFunc(sp, func(a, b aliasSpan) int {
			if c := cmp.Compare(a.lo, b.lo); c != 0 {
				return c
			}
			return cmp.Compare(a.buf, b.buf)
		})
		return
	}
	for i := 1; i < len(sp); i++ {
		x := sp[i]
		j := i
		for ; j > 0 && (sp[j-1].lo > x.lo || sp[j-1].lo == x.lo && sp[j-1].buf > x.buf); j-- {
			sp[j] = sp[j-1]
		}
		sp[j] = x
	}
}

// index records where each buffer's span is.
func (o *Overlaps) index() {
	for k := range o.spans {
		o.at[o.spans[k].buf] = k
	}
}

// Hazard reports whether some buffers overlap with one of them written by
// the step: a strategy that copies them apart would compute another result
// than eager.
func (o *Overlaps) Hazard() bool { return o.hazard > 0 }

// Any reports whether any two buffers overlap.
func (o *Overlaps) Any() bool { return len(o.groups) > 0 }

// Conflict returns two overlapping buffers of the first hazardous group in
// address order, one of them written, for errors; ok is false when there
// is none.
func (o *Overlaps) Conflict() (a, b int, ok bool) { return o.ConflictWith(nil) }

// ConflictWith is Conflict restricted to the pairs in which with holds for
// one buffer at least (nil: any pair).
func (o *Overlaps) ConflictWith(with func(id int) bool) (a, b int, ok bool) {
	for gi := range o.groups {
		g := &o.groups[gi]
		if !g.hazardous() {
			continue
		}
		for i := g.first; i < g.end; i++ {
			x := &o.spans[i]
			for j := i + 1; j < g.end && o.spans[j].lo < x.hi; j++ {
				y := &o.spans[j]
				if !x.written && !y.written {
					continue
				}
				if with == nil || with(x.buf) || with(y.buf) {
					return x.buf, y.buf, true
				}
			}
		}
	}
	return 0, 0, false
}

// spanOf returns buffer id's span in the last Find, nil when id was not
// analysed or has no memory.
func (o *Overlaps) spanOf(id int) *aliasSpan {
	if id >= len(o.at) || o.at[id] < 0 {
		return nil
	}
	return &o.spans[o.at[id]]
}
