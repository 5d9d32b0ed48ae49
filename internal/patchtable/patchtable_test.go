package patchtable

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

func TestPatchRecords(t *testing.T) {
	slots := EncodeSlots([]Slot{{Node: 0x1122334455667788, Offset: 8}, {Node: 7, Offset: 0x10203, Add: 0x0a0b}})
	want := []byte{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0,
		7, 0, 0, 0, 0, 0, 0, 0, 0x0b, 0x0a, 0, 0, 0, 0, 0, 0, 3, 2, 1, 0, 0, 0, 0, 0}
	if !bytes.Equal(slots, want) {
		t.Errorf("EncodeSlots = % x\nwant % x", slots, want)
	}
	table := bytes.Repeat([]byte{0xee}, int(Stride(3)))
	if err := Write(table, 0x0102, []Update{{Slot: 1, Value: 0xaabb}, {Slot: 0x0304, Count: 3, Value: 5}}); err != nil {
		t.Fatal(err)
	}
	// Header: seq, 2 updates, 4 slot writes; then {slot, start, value}.
	want = []byte{2, 1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0,
		1, 0, 0, 0, 0, 0, 0, 0, 0xbb, 0xaa, 0, 0, 0, 0, 0, 0,
		4, 3, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(table[:48], want) || !bytes.Equal(table[48:], bytes.Repeat([]byte{0xee}, 16)) {
		t.Errorf("Write = % x", table)
	}
	if err := Write(table[:40], 1, make([]Update, 2)); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("table too small: %v", err)
	}
	// The writer refuses what does not fit and leaves the header alone.
	w := NewWriter(table[:32])
	if err := w.Add(0, 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(1, 1, 1); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("second update in a one-update table: %v", err)
	}
	if err := w.Add(1, 0, 1); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("update of zero slots: %v", err)
	}
	if w.Updates() != 1 || w.Writes() != 1 || lend.Uint64(table) != 0x0102 {
		t.Errorf("after refused updates: %d updates, %d writes, header seq %#x", w.Updates(), w.Writes(), lend.Uint64(table))
	}
	big := NewWriter(make([]byte, Stride(2)))
	if err := big.Add(0, 1<<31, 0); err != nil {
		t.Fatal(err)
	}
	if err := big.Add(0, 1<<31, 0); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("2^32 slot writes in one table: %v", err)
	}
	c := Ctl{Seq: 9, Done: 1, Failed: 2, Skipped: 3, FirstEntry: 4, FirstCode: 1}
	got, err := DecodeCtl(c.Encode())
	if err != nil || got != c {
		t.Errorf("control block round trip: %+v, %v; want %+v", got, err, c)
	}
	if _, err := DecodeCtl(make([]byte, 31)); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("short control block: %v", err)
	}
	h := gpu.HostMem{Bytes: make([]byte, 32)}
	lend.PutUint64(h.Bytes[16:], 7)
	lend.PutUint64(h.Bytes[24:], 2|5<<32)
	if m := ReadMirror(h, 16); m != (Mirror{Seq: 7, Failed: 2, Skipped: 5}) {
		t.Errorf("ReadMirror = %+v", m)
	}
}
