// Package safetensors reads and writes the safetensors format, the tensor
// file format of the Hugging Face ecosystem, so that the gpt2-decode
// workload and its PyTorch peer load exactly the same weights (and a real
// GPT-2 checkpoint can be run).
//
// A file is an 8-byte little-endian header length n, n bytes of JSON, then
// the tensors' bytes. The JSON object maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the bytes
// after the header) and may hold "__metadata__", a map of strings. The
// tensors' byte ranges must tile the data exactly: no gap, no overlap, no
// trailing byte. Data is little-endian and row-major.
//
// The format is small enough that a reader of a few hundred lines with
// strict checks beats a dependency: the Go package there is
// (nlpodyssey/safetensors) has no release, reads a whole file into memory
// and brings a test library along, where this one reads tensors one at a
// time with ReadAt (GPT-2 small is 500 MB).
package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
)

// ErrFormat is wrapped by every error about a malformed file.
var ErrFormat = errors.New("safetensors: malformed file")

// MaxHeader is the largest header Read accepts, in bytes (the reference
// implementation's limit).
const MaxHeader = 100 << 20

// dtypeSizes are the element sizes of the format's dtypes.
var dtypeSizes = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// DTypeSize is the size in bytes of one element of dtype, 0 if the format
// has no such dtype.
func DTypeSize(dtype string) int64 { return dtypeSizes[dtype] }

// Tensor is a named tensor with its bytes.
type Tensor struct {
	Name  string
	DType string // "F32", "I32", ... (DTypeSize lists them)
	Shape []int64
	Data  []byte
}

// Info describes a tensor of a file without its bytes.
type Info struct {
	Name  string
	DType string
	Shape []int64
	// Offset and Size are the tensor's byte range within the data section.
	Offset, Size int64
}

// Elements is the product of the shape (1 for a scalar).
func (i Info) Elements() int64 {
	n, _ := elements(i.Shape)
	return n
}

// elements multiplies the shape out, failing on negative dimensions or
// overflow of int64.
func elements(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension %d in shape %v", d, shape)
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("shape %v overflows", shape)
		}
		n *= d
	}
	return n, nil
}

type headerEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

const metadataKey = "__metadata__"

// Write writes tensors (in the given order) and metadata to w.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	header, err := encodeHeader(tensors, metadata)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
	if _, err := bw.Write(n[:]); err != nil {
		return err
	}
	if _, err := bw.Write(header); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := bw.Write(t.Data); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// encodeHeader is the JSON header of tensors, padded with spaces to a
// multiple of 8 bytes so that the data starts aligned.
func encodeHeader(tensors []Tensor, metadata map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	seen := map[string]bool{}
	var off int64
	for i, t := range tensors {
		switch {
		case t.Name == "" || t.Name == metadataKey:
			return nil, fmt.Errorf("safetensors: tensor %d has the reserved or empty name %q", i, t.Name)
		case seen[t.Name]:
			return nil, fmt.Errorf("safetensors: tensor %q given twice", t.Name)
		case DTypeSize(t.DType) == 0:
			return nil, fmt.Errorf("safetensors: tensor %q has unknown dtype %q", t.Name, t.DType)
		}
		seen[t.Name] = true
		n, err := elements(t.Shape)
		if err != nil {
			return nil, fmt.Errorf("safetensors: tensor %q: %v", t.Name, err)
		}
		if want := n * DTypeSize(t.DType); int64(len(t.Data)) != want {
			return nil, fmt.Errorf("safetensors: tensor %q has %d bytes, its shape %v of %s needs %d", t.Name, len(t.Data), t.Shape, t.DType, want)
		}
		e := headerEntry{DType: t.DType, Shape: t.Shape, DataOffsets: []int64{off, off + int64(len(t.Data))}}
		if e.Shape == nil {
			e.Shape = []int64{}
		}
		if err := writeEntry(&buf, i > 0, t.Name, e); err != nil {
			return nil, err
		}
		off += int64(len(t.Data))
	}
	if len(metadata) > 0 {
		if err := writeEntry(&buf, len(tensors) > 0, metadataKey, metadata); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	for buf.Len()%8 != 0 {
		buf.WriteByte(' ')
	}
	return buf.Bytes(), nil
}

func writeEntry(buf *bytes.Buffer, comma bool, key string, v any) error {
	if comma {
		buf.WriteByte(',')
	}
	k, err := json.Marshal(key)
	if err != nil {
		return err
	}
	val, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf.Write(k)
	buf.WriteByte(':')
	buf.Write(val)
	return nil
}

// WriteFile writes the file at path atomically: into a temporary file in the
// same directory, renamed over path once complete.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Close(), os.Remove(f.Name()))
		}
	}()
	if err := Write(f, tensors, metadata); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil { // CreateTemp's 0600 is for secrets
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return errors.Join(err, os.Remove(f.Name()))
	}
	return nil
}

// File is a safetensors file opened for reading: its header parsed and
// checked, tensors read on demand. It is safe for concurrent reads when its
// io.ReaderAt is.
type File struct {
	// Metadata is the header's "__metadata__" (nil when absent).
	Metadata map[string]string
	infos    []Info // in header order
	byName   map[string]int
	r        io.ReaderAt
	data     int64 // offset of the data section in r
	closer   io.Closer
}

// Open opens and checks the file at path.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	sf, err := Read(f, st.Size())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", path, err), f.Close())
	}
	sf.closer = f
	return sf, nil
}

// Read checks the header of the size-byte file r and returns it for reading
// tensors. Every malformed header wraps ErrFormat.
func Read(r io.ReaderAt, size int64) (*File, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrFormat}, args...)...)
	}
	if size < 8 {
		return nil, bad("%d bytes, shorter than the 8-byte header length", size)
	}
	var nb [8]byte
	if _, err := r.ReadAt(nb[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(nb[:])
	if n > MaxHeader || int64(n) > size-8 {
		return nil, bad("header length %d does not fit (file %d bytes, limit %d)", n, size, MaxHeader)
	}
	header := make([]byte, n)
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("safetensors: read header: %w", err)
	}
	f := &File{r: r, data: 8 + int64(n), byName: map[string]int{}}
	if err := f.parseHeader(header); err != nil {
		return nil, bad("%v", err)
	}
	if err := f.checkTiling(size - f.data); err != nil {
		return nil, bad("%v", err)
	}
	return f, nil
}

func (f *File) parseHeader(header []byte) error {
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("header is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("header JSON: %v", err)
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("header JSON: key %v is not a string", tok)
		}
		if seen[key] {
			return fmt.Errorf("%q appears twice in the header", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("header JSON: value of %q: %v", key, err)
		}
		if key == metadataKey {
			if err := json.Unmarshal(raw, &f.Metadata); err != nil {
				return fmt.Errorf("%s is not a map of strings: %v", metadataKey, err)
			}
			continue
		}
		var e headerEntry
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&e); err != nil {
			return fmt.Errorf("tensor %q: %v", key, err)
		}
		size := DTypeSize(e.DType)
		if size == 0 {
			return fmt.Errorf("tensor %q: unknown dtype %q", key, e.DType)
		}
		if e.Shape == nil {
			return fmt.Errorf("tensor %q has no shape", key)
		}
		elems, err := elements(e.Shape)
		if err != nil {
			return fmt.Errorf("tensor %q: %v", key, err)
		}
		if len(e.DataOffsets) != 2 {
			return fmt.Errorf("tensor %q: data_offsets %v is not [begin, end]", key, e.DataOffsets)
		}
		b, end := e.DataOffsets[0], e.DataOffsets[1]
		if b < 0 || end < b {
			return fmt.Errorf("tensor %q: data offsets [%d, %d) are not a range", key, b, end)
		}
		if elems > math.MaxInt64/size || elems*size != end-b {
			return fmt.Errorf("tensor %q: shape %v of %s does not fill its %d bytes", key, e.Shape, e.DType, end-b)
		}
		f.byName[key] = len(f.infos)
		f.infos = append(f.infos, Info{Name: key, DType: e.DType, Shape: e.Shape, Offset: b, Size: end - b})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return fmt.Errorf("header JSON is not one object")
	}
	if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimSpace(rest)) > 0 {
		return fmt.Errorf("header has bytes after its JSON object")
	}
	return nil
}

// checkTiling checks that the tensors' ranges tile the data section of
// dataSize bytes exactly.
func (f *File) checkTiling(dataSize int64) error {
	order := make([]int, len(f.infos))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		x, y := f.infos[order[a]], f.infos[order[b]]
		return x.Offset < y.Offset || x.Offset == y.Offset && x.Size < y.Size
	})
	var at int64
	for _, i := range order {
		in := f.infos[i]
		if in.Offset != at {
			return fmt.Errorf("tensor %q starts at byte %d of the data, expected %d (a gap or an overlap)", in.Name, in.Offset, at)
		}
		at += in.Size
	}
	if at != dataSize {
		return fmt.Errorf("the tensors cover %d bytes of data, the file has %d", at, dataSize)
	}
	return nil
}

// Tensors describes the file's tensors in header order.
func (f *File) Tensors() []Info {
	out := slices.Clone(f.infos)
	for i := range out {
		out[i].Shape = slices.Clone(out[i].Shape)
	}
	return out
}

// Info describes the tensor called name.
func (f *File) Info(name string) (Info, bool) {
	i, ok := f.byName[name]
	if !ok {
		return Info{}, false
	}
	in := f.infos[i]
	in.Shape = slices.Clone(in.Shape)
	return in, true
}

// ReadTensor reads the tensor called name.
func (f *File) ReadTensor(name string) (Tensor, error) {
	in, ok := f.Info(name)
	if !ok {
		return Tensor{}, fmt.Errorf("safetensors: no tensor %q", name)
	}
	data := make([]byte, in.Size)
	if _, err := f.r.ReadAt(data, f.data+in.Offset); err != nil {
		return Tensor{}, fmt.Errorf("safetensors: read tensor %q: %w", name, err)
	}
	return Tensor{Name: name, DType: in.DType, Shape: in.Shape, Data: data}, nil
}

// Close closes the file Open opened (nothing for Read's).
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	err := f.closer.Close()
	f.closer = nil
	return err
}

// ShapeString formats a shape as [a b c], for errors.
func ShapeString(shape []int64) string {
	b := []byte{'['}
	for i, d := range shape {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, d, 10)
	}
	return string(append(b, ']'))
}
