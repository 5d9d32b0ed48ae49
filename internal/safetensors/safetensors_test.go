package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
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
		// The audit's: what encoding/json let through.
		{"empty name", file(`{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), "empty name"},
		{"dtype twice", file(`{"a":{"dtype":"F32","dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), `field "dtype" given twice`},
		{"shape twice", file(`{"a":{"dtype":"U8","shape":[2],"shape":[1],"data_offsets":[0,1]}}`, 1), `field "shape" given twice`},
		{"offsets twice", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,2],"data_offsets":[0,1]}}`, 1), `field "data_offsets" given twice`},
		{"metadata key twice", file(`{"__metadata__":{"k":"a","k":"b"}}`, 0), `key "k" given twice`},
		{"metadata twice", file(`{"__metadata__":{"k":"a"},"__metadata__":{}}`, 0), "twice"},
		{"invalid UTF-8 name", file("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1), "not valid UTF-8 (byte 3)"},
		{"unpaired surrogate", file(`{"a\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), "unpaired UTF-16 surrogate"},
		{"low surrogate first", file(`{"\udc00\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), "unpaired UTF-16 surrogate"},
		{"bad escape", file(`{"a\x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), "invalid escape"},
		{"control character", file("{\"a\n\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1), "control character"},
		{"leading zero", file(`{"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}`, 1), "leading zero"},
		{"huge offset", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,99999999999999999999]}}`, 1), "out of range"},
		{"no dtype", file(`{"a":{"shape":[1],"data_offsets":[0,1]}}`, 1), "no dtype"},
		{"no offsets", file(`{"a":{"dtype":"U8","shape":[1]}}`, 1), "no data_offsets"},
		{"null shape", file(`{"a":{"dtype":"U8","shape":null,"data_offsets":[0,1]}}`, 1), "shape"},
		{"trailing comma", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},}`, 1), "expected a string"},
		{"empty header", file(``, 0), "not a JSON object"},
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

// TestReadTensorAtEnd: a zero-size tensor at the very end of the data reads
// through a bytes.Reader (whose ReadAt reports io.EOF for an empty read at
// the end) as through a file, and a ReaderAt that reports io.EOF with the
// last bytes is no error.
func TestReadTensorAtEnd(t *testing.T) {
	ts := []Tensor{
		{Name: "a", DType: "U8", Shape: []int64{3}, Data: []byte{1, 2, 3}},
		{Name: "z", DType: "F32", Shape: []int64{0}, Data: []byte{}},
	}
	b := encode(t, ts, nil)
	path := filepath.Join(t.TempDir(), "z.safetensors")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	byFile, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer byFile.Close()
	for name, r := range map[string]io.ReaderAt{"bytes.Reader": bytes.NewReader(b), "eofAtEnd": eofAtEnd{bytes.NewReader(b)}, "file": nil} {
		f := byFile
		if r != nil {
			if f, err = Read(r, int64(len(b))); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		for _, want := range ts {
			got, err := f.ReadTensor(want.Name)
			if err != nil || !bytes.Equal(got.Data, want.Data) {
				t.Errorf("%s: tensor %s: %v, %v", name, want.Name, got.Data, err)
			}
		}
	}
}

// eofAtEnd is a ReaderAt that reports io.EOF with a read that reaches the
// end, as io.ReaderAt allows.
type eofAtEnd struct{ r *bytes.Reader }

func (e eofAtEnd) ReadAt(p []byte, off int64) (int, error) {
	n, err := e.r.ReadAt(p, off)
	if err == nil && off+int64(n) == e.r.Size() {
		err = io.EOF
	}
	return n, err
}

// TestEscapedNames: names with escapes, a surrogate pair and non-ASCII
// characters read as written, and write back the same.
func TestEscapedNames(t *testing.T) {
	header := `{"q\"\\\/\b\f\n\r\t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},` +
		`"\u00e9\ud83d\ude00é":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"__metadata__":{"k\u0041":"v\n"}}`
	b := file(header, 2)
	f, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range f.Tensors() {
		names = append(names, in.Name)
	}
	if want := []string{"q\"\\/\b\f\n\r\t", "é😀é"}; !reflect.DeepEqual(names, want) {
		t.Errorf("names %q, want %q", names, want)
	}
	if !reflect.DeepEqual(f.Metadata, map[string]string{"kA": "v\n"}) {
		t.Errorf("metadata %q", f.Metadata)
	}
	if err := Write(io.Discard, []Tensor{{Name: "a\xff", DType: "U8", Shape: []int64{1}, Data: []byte{0}}}, nil); err == nil {
		t.Error("Write took a name that is not UTF-8")
	}
}

// tinyFile is a file of n one-byte tensors.
func tinyFile(n int) []byte {
	h := []byte{'{'}
	for i := range n {
		if i > 0 {
			h = append(h, ',')
		}
		h = strconv.AppendInt(append(h, `"t`...), int64(i), 10)
		h = strconv.AppendInt(append(h, `":{"dtype":"U8","shape":[1],"data_offsets":[`...), int64(i), 10)
		h = strconv.AppendInt(append(h, ','), int64(i+1), 10)
		h = append(h, "]}"...)
	}
	h = append(h, '}')
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(h)+n), uint64(len(h)))
	return append(append(b, h...), make([]byte, n)...)
}

// allocated is the bytes fn allocates.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestManyTinyTensors: a header of more tiny tensors than the limit is
// refused once the limit is passed, having allocated little beyond the
// header; below the limit a header costs memory in proportion to its size.
// The audit's header of 1.5 million tensors is read at the real limit
// where the race detector does not slow every byte down; the limit is
// lowered for the rest.
func TestManyTinyTensors(t *testing.T) {
	refused := func(n, limit int) {
		t.Helper()
		b := tinyFile(n)
		hlen := binary.LittleEndian.Uint64(b)
		var err error
		start := time.Now()
		alloc := allocated(func() { _, err = Read(bytes.NewReader(b), int64(len(b))) })
		took := time.Since(start)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), fmt.Sprintf("more than %d tensors", limit)) {
			t.Errorf("%d tensors: %v", n, err)
		}
		// The header itself, and what the tensors up to the limit hold.
		if bound := hlen + uint64(limit)*256; alloc > bound {
			t.Errorf("%d tensors: %d KiB allocated, want at most %d KiB", n, alloc>>10, bound>>10)
		}
		t.Logf("%d tensors (a %d KiB header), limit %d: refused in %v, %d KiB allocated", n, hlen>>10, limit, took.Round(time.Millisecond), alloc>>10)
	}
	if !raceEnabled && !testing.Short() {
		refused(1_500_000, MaxTensors)
	}
	defer func(old int) { maxTensors = old }(maxTensors)
	maxTensors = 1 << 12
	refused(1_500_000/64, maxTensors)

	n := maxTensors
	b := tinyFile(n)
	var f *File
	var err error
	alloc := allocated(func() { f, err = Read(bytes.NewReader(b), int64(len(b))) })
	if err != nil || len(f.Tensors()) != n {
		t.Fatal(err)
	}
	if perByte := float64(alloc) / float64(len(b)); perByte > maxAllocPerByte {
		t.Errorf("%d tensors: %.1f bytes allocated per byte of file, want at most %d", n, perByte, maxAllocPerByte)
	}
}

// maxAllocPerByte bounds what Read allocates per byte of the file it reads
// (the header's copy, a tensor's Info, name and shape, the index by name).
const maxAllocPerByte = 8

// FuzzRead: any input is read or refused without a panic; what is read
// writes back to a file that reads the same; what is accepted is what the
// format allows (no key given twice in an object, no name that only
// encoding/json's replacement of bad UTF-8 made), and reading costs memory
// in proportion to the input. The seed corpus (testdata/fuzz/FuzzRead)
// holds the audit's inputs: an empty name, keys given twice, invalid
// UTF-8, an unpaired surrogate, a zero-size tensor at the end; the header
// of many tiny tensors is added here.
func FuzzRead(f *testing.F) {
	f.Add(encode(f, sample(), map[string]string{"k": "v"}))
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8))
	f.Add(file(`{}`, 0))
	f.Add([]byte{1, 2, 3})
	f.Add(tinyFile(1500))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r *File
		var err error
		alloc := allocated(func() { r, err = Read(bytes.NewReader(b), int64(len(b))) })
		if limit := maxAllocPerByte*uint64(len(b)) + 256<<10; alloc > limit {
			t.Fatalf("reading %d bytes allocated %d (limit %d): err %v", len(b), alloc, limit, err)
		}
		if err != nil {
			return
		}
		header := b[8:r.data]
		if k, ok := repeatedKey(header); ok {
			t.Fatalf("accepted a header with key %q given twice in an object", k)
		}
		var ts []Tensor
		for _, in := range r.Tensors() {
			if strings.ContainsRune(in.Name, utf8.RuneError) && !bytes.Contains(header, []byte("\uFFFD")) &&
				!bytes.Contains(bytes.ToLower(header), []byte(`\ufffd`)) {
				t.Fatalf("name %q has U+FFFD the header does not: bad UTF-8 replaced", in.Name)
			}
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

// repeatedKey finds a key given twice in one object of the JSON document
// doc, by encoding/json's tokens (an oracle independent of the parser).
func repeatedKey(doc []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	type frame struct {
		object bool
		keys   map[string]bool
		atKey  bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.atKey {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return k, true
				}
				top.keys[k] = true
				top.atKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, atKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object's next token is a key.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].atKey = true
		}
	}
}
