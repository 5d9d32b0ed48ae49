// Package collref is the host reference of a collective's reduction, used
// by the sim for its communicators of devices of one process and of one
// rank per process alike (gpu/sim's collectives.go and transport.go): the
// same inputs give the same bits whichever way the ranks meet.
package collref

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Reduce combines equal-length buffers element by element in rank order:
// acc = s0; acc = acc ∘ s1; ... It returns a new buffer. Values of dt are
// little-endian; op is gpu.Sum or gpu.Max.
func Reduce(sends [][]byte, dt gpu.DataType, op gpu.ReduceOp) []byte {
	out := slices.Clone(sends[0])
	le := binary.LittleEndian
	for _, s := range sends[1:] {
		switch dt {
		case gpu.Float32:
			for i := 0; i+4 <= len(out); i += 4 {
				x, y := math.Float32frombits(le.Uint32(out[i:])), math.Float32frombits(le.Uint32(s[i:]))
				le.PutUint32(out[i:], math.Float32bits(combine(x, y, op)))
			}
		case gpu.Float64:
			for i := 0; i+8 <= len(out); i += 8 {
				x, y := math.Float64frombits(le.Uint64(out[i:])), math.Float64frombits(le.Uint64(s[i:]))
				le.PutUint64(out[i:], math.Float64bits(combine(x, y, op)))
			}
		case gpu.Int32:
			for i := 0; i+4 <= len(out); i += 4 {
				le.PutUint32(out[i:], uint32(combine(int32(le.Uint32(out[i:])), int32(le.Uint32(s[i:])), op)))
			}
		case gpu.Int64:
			for i := 0; i+8 <= len(out); i += 8 {
				le.PutUint64(out[i:], uint64(combine(int64(le.Uint64(out[i:])), int64(le.Uint64(s[i:])), op)))
			}
		}
	}
	return out
}

func combine[T float32 | float64 | int32 | int64](x, y T, op gpu.ReduceOp) T {
	if op == gpu.Max {
		return max(x, y)
	}
	return x + y
}
