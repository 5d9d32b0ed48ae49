package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sample() []Tensor {
	return []Tensor{
		{Name: "wte.weight", DType: "F32", Shape: []int64{2, 3}, Data: []byte("abcdefghijklmnopqrstuvwx")},
		{Name: "scalar", DType: "I32", Shape: []int64{}, Data: []byte{1, 0, 0, 0}},
		{Name: "empty", DType: "F32", Shape: []int64{0, 5}, Data: []byte{}},
		{Name: "h.0.bias", DType: "BF16", Shape: []int64{3}, Data: []byte{1, 2, 3, 4, 5, 6}},
	}
}

func encode(t testing.TB, ts []Tensor, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, ts, meta); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	meta := map[string]string{"format": "pt", "seed": "7"}
	b := encode(t, sample(), meta)
	if n := binary.LittleEndian.Uint64(b); (8+n)%8 != 0 || b[8] != '{' {
		t.Errorf("header of %d bytes is not padded to 8 or does not start with '{'", n)
	}
	f, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.Metadata, meta) {
		t.Errorf("metadata %v, want %v", f.Metadata, meta)
	}
	var names []string
	for _, in := range f.Tensors() {
		names = append(names, in.Name)
	}
	if want := []string{"wte.weight", "scalar", "empty", "h.0.bias"}; !reflect.DeepEqual(names, want) {
		t.Errorf("names %v, want %v (header order)", names, want)
	}
	for _, want := range sample() {
		got, err := f.ReadTensor(want.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got.DType != want.DType || !reflect.DeepEqual(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s: got %+v, want %+v", want.Name, got, want)
		}
	}
	if in, _ := f.Info("wte.weight"); in.Elements() != 6 || in.Size != 24 {
		t.Errorf("info %+v", in)
	}
	if _, err := f.ReadTensor("nope"); err == nil {
		t.Error("missing tensor read")
	}
}

// A file as another writer lays it out: data in another order than the
// header, no metadata, no padding.
func TestReadForeignLayout(t *testing.T) {
	header := `{"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}`
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(append(b, header...), 'x', 'y', 'z')
	f, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := f.ReadTensor("a")
	bt, _ := f.ReadTensor("b")
	if string(a.Data) != "z" || string(bt.Data) != "xy" || f.Metadata != nil {
		t.Errorf("a=%q b=%q meta=%v", a.Data, bt.Data, f.Metadata)
	}
}

func TestWriteFileAndOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := WriteFile(path, sample(), nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := f.ReadTensor("h.0.bias"); err != nil || !bytes.Equal(got.Data, sample()[3].Data) {
		t.Errorf("%v %v", got, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	if err := WriteFile(filepath.Join(t.TempDir(), "missing", "x"), sample(), nil); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

func TestWriteRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		ts   []Tensor
		want string
	}{
		{"short data", []Tensor{{Name: "a", DType: "F32", Shape: []int64{2}, Data: make([]byte, 4)}}, "needs 8"},
		{"dtype", []Tensor{{Name: "a", DType: "F31", Shape: []int64{1}, Data: make([]byte, 4)}}, "unknown dtype"},
		{"duplicate", []Tensor{{Name: "a", DType: "U8", Shape: []int64{1}, Data: []byte{1}}, {Name: "a", DType: "U8", Shape: []int64{1}, Data: []byte{1}}}, "twice"},
		{"reserved", []Tensor{{Name: metadataKey, DType: "U8", Shape: []int64{1}, Data: []byte{1}}}, "reserved"},
		{"negative", []Tensor{{Name: "a", DType: "U8", Shape: []int64{-1}, Data: nil}}, "negative"},
	} {
		if err := Write(&bytes.Buffer{}, c.ts, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// file builds a file from a raw header and n data bytes.
func file(header string, n int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), make([]byte, n)...)
}

func TestReadRejects(t *testing.T) {
	ok := `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	huge := binary.LittleEndian.AppendUint64(nil, MaxHeader+1)
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "shorter than"},
		{"header past the end", file(ok, 8)[:20], "does not fit"},
		{"header over the limit", append(huge, make([]byte, 64)...), "does not fit"},
		{"not an object", file(`[1,2]`, 0), "not a JSON object"},
		{"bad JSON", file(`{"a":`, 0), "header JSON"},
		{"trailing bytes in header", file(ok+`{}`, 8), "after its JSON object"},
		{"duplicate name", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), "twice"},
		{"unknown dtype", file(`{"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}`, 8), "unknown dtype"},
		{"unknown field", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}`, 8), "unknown field"},
		{"no shape", file(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, 8), "no shape"},
		{"negative dim", file(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, 8), "negative"},
		{"fractional dim", file(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}`, 8), "tensor \"a\""},
		{"overflowing shape", file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8), "overflows"},
		{"shape and bytes disagree", file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), "does not fill"},
		{"offsets reversed", file(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, 8), "not a range"},
		{"three offsets", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}`, 8), "not [begin, end]"},
		{"gap", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), "gap or an overlap"},
		{"overlap", file(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`, 3), "gap or an overlap"},
		{"data too long", file(ok, 9), "cover 8 bytes of data, the file has 9"},
		{"data too short", file(ok, 7), "the file has 7"},
		{"metadata not strings", file(`{"__metadata__":{"a":1}}`, 0), "map of strings"},
	} {
		_, err := Read(bytes.NewReader(c.b), int64(len(c.b)))
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrFormat saying %q", c.name, err, c.want)
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("open of a missing file: %v", err)
	}
}

// FuzzRead: any input is read or refused without a panic, and what is read
// writes back to a file that reads the same.
func FuzzRead(f *testing.F) {
	f.Add(encode(f, sample(), map[string]string{"k": "v"}))
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8))
	f.Add(file(`{}`, 0))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		var ts []Tensor
		for _, in := range r.Tensors() {
			tt, err := r.ReadTensor(in.Name)
			if err != nil {
				t.Fatalf("listed tensor %q unreadable: %v", in.Name, err)
			}
			ts = append(ts, tt)
		}
		again := encode(t, ts, r.Metadata)
		r2, err := Read(bytes.NewReader(again), int64(len(again)))
		if err != nil {
			t.Fatalf("rewritten file unreadable: %v", err)
		}
		for _, tt := range ts {
			got, err := r2.ReadTensor(tt.Name)
			if err != nil || !bytes.Equal(got.Data, tt.Data) || !reflect.DeepEqual(got.Shape, tt.Shape) {
				t.Fatalf("tensor %q changed on rewrite: %v", tt.Name, err)
			}
		}
	})
}
