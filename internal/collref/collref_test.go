package collref

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

func f32s(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func i64s(v ...int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// TestReduceRankOrder: sums are taken in rank order, so float results are
// the bits of ((s0 + s1) + s2), not of any other association.
func TestReduceRankOrder(t *testing.T) {
	sends := [][]byte{f32s(1e8, 1), f32s(1, 2), f32s(-1e8, 3)}
	got := Reduce(sends, gpu.Float32, gpu.Sum)
	// 1e8+1 rounds to 1e8 in float32, so rank order gives 0 where
	// 1e8+(-1e8)+1 would give 1.
	want := f32s(0, 6)
	if string(got) != string(want) {
		t.Fatalf("Reduce = %x, want %x", got, want)
	}
	if string(sends[0]) != string(f32s(1e8, 1)) {
		t.Fatal("Reduce wrote into its first input")
	}
}

func TestReduceMaxInt64(t *testing.T) {
	got := Reduce([][]byte{i64s(-5, 7), i64s(-9, 8), i64s(-1, -3)}, gpu.Int64, gpu.Max)
	if want := i64s(-1, 8); string(got) != string(want) {
		t.Fatalf("Reduce = %x, want %x", got, want)
	}
}
