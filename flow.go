package stablegraph

import (
	"cmp"
	"slices"
)

// bufFlow says how a step uses one buffer, for the strategies that give
// params and outputs a persistent copy of their own (stable, pool): to have
// the same effect on the caller's memory as eager, which works in the
// caller's buffers directly, they copy in every buffer whose caller
// contents the step can see, and copy out every buffer the step writes.
type bufFlow struct {
	// written: some command writes part of the buffer.
	written bool
	// readFirst: some command reads a byte that no earlier command wrote
	// in the step, so the caller's contents matter (every param; an output
	// read before it is written, or written only in part and read).
	readFirst bool
	// full: the step's writes cover the whole buffer. A buffer written in
	// part keeps the caller's bytes elsewhere, which a copy out of the
	// whole buffer must not overwrite with stale ones.
	full bool
}

// needsCopyIn reports whether a buffer copied back to the caller after the
// step (copiedOut) must be copied in before it.
func (f bufFlow) needsCopyIn(copiedOut bool) bool {
	return f.readFirst || (copiedOut && !f.full)
}

// span is a half-open byte range [lo, hi).
type span struct{ lo, hi int64 }

// analyseFlow walks the commands in order, keeping for each buffer the bytes
// written so far. Within a command reads come before writes: an InOut slice
// reads what was there before the command.
func analyseFlow(bufs []bufDecl, cmds []cmdDecl) []bufFlow {
	nbufs := len(bufs)
	sizes := make([]int64, nbufs)
	for i := range bufs {
		sizes[i] = bufs[i].size
	}
	flow := make([]bufFlow, nbufs)
	written := make([][]span, nbufs)
	for i := range cmds {
		c := &cmds[i]
		for _, a := range c.args {
			if a.IsSlice() && a.access&Read != 0 && a.slice.n > 0 {
				id := a.slice.buf.id
				if !covers(written[id], span{a.slice.off, a.slice.off + a.slice.n}) {
					flow[id].readFirst = true
				}
			}
		}
		for _, a := range c.args {
			if a.IsSlice() && a.access&Write != 0 && a.slice.n > 0 {
				id := a.slice.buf.id
				flow[id].written = true
				written[id] = addSpan(written[id], span{a.slice.off, a.slice.off + a.slice.n})
			}
		}
	}
	for id, ss := range written {
		flow[id].full = len(ss) == 1 && ss[0].lo == 0 && ss[0].hi >= sizes[id]
	}
	return flow
}

// covers reports whether the sorted, disjoint, non-adjacent spans ss cover
// all of s.
func covers(ss []span, s span) bool {
	for _, x := range ss {
		if x.lo <= s.lo && s.hi <= x.hi {
			return true
		}
	}
	return false
}

// addSpan adds s to the sorted, disjoint spans ss, merging what touches it.
func addSpan(ss []span, s span) []span {
	out := ss[:0:0]
	for _, x := range ss {
		if x.hi < s.lo || s.hi < x.lo {
			out = append(out, x)
			continue
		}
		s = span{min(s.lo, x.lo), max(s.hi, x.hi)}
	}
	out = append(out, s)
	slices.SortFunc(out, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	return out
}
