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
// Read is strict where encoding/json is lenient, since a lenient reader
// reads another file than the writer meant: a key given twice in any
// object (the last would win), an empty tensor name, a header that is not
// UTF-8 or a string with an unpaired surrogate escape (replaced by U+FFFD),
// a number with a fraction or a leading zero, any field beyond the three
// are errors wrapping ErrFormat. Its cost is bounded: a header is at most
// MaxHeader bytes and MaxTensors tensors, parsed in one pass with one
// allocation per tensor (its name) beyond tables sized once.
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
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/stablegraph/stablegraph/internal/atomicfile"
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

// dtypes holds each dtype's name (shared by every tensor of that dtype:
// no string per tensor) and size.
var dtypes = func() map[string]struct {
	name string
	size int64
} {
	m := map[string]struct {
		name string
		size int64
	}{}
	for name, size := range dtypeSizes {
		m[name] = struct {
			name string
			size int64
		}{name, size}
	}
	return m
}()

// MaxTensors is the most tensors Read accepts in one file: far more than a
// checkpoint holds, few enough that a header of tiny tensors stays cheap.
const MaxTensors = 1 << 18

// maxTensors is MaxTensors, lowered by tests.
var maxTensors = MaxTensors

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
		case !utf8.ValidString(t.Name):
			// encoding/json would replace the bad bytes: another name.
			return nil, fmt.Errorf("safetensors: tensor %d's name %q is not valid UTF-8", i, t.Name)
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
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("safetensors: metadata %q: %q is not valid UTF-8", k, v)
		}
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

// WriteFile writes the file at path whole or not at all
// (internal/atomicfile): into a temporary file in the same directory,
// synced and renamed over path once complete; on error the file that was
// there is left as it was.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	if err := atomicfile.WriteFile(path, func(w io.Writer) error { return Write(w, tensors, metadata) }); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
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
	dims     []int64 // every shape, one after the other
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
// tensors. Every malformed header wraps ErrFormat. Reading takes time and
// memory in proportion to the header, which is at most MaxHeader bytes
// and MaxTensors tensors.
func Read(r io.ReaderAt, size int64) (*File, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrFormat}, args...)...)
	}
	if size < 8 {
		return nil, bad("%d bytes, shorter than the 8-byte header length", size)
	}
	var nb [8]byte
	if err := readAt(r, nb[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(nb[:])
	if n > MaxHeader || n > uint64(size-8) {
		return nil, bad("header length %d does not fit (file %d bytes, limit %d)", n, size, MaxHeader)
	}
	header := make([]byte, n)
	if err := readAt(r, header, 8); err != nil {
		return nil, fmt.Errorf("safetensors: read header: %w", err)
	}
	f := &File{r: r, data: 8 + int64(n)}
	if err := f.parseHeader(header); err != nil {
		return nil, bad("%v", err)
	}
	if err := f.checkTiling(size - f.data); err != nil {
		return nil, bad("%v", err)
	}
	return f, nil
}

// readAt fills b from r at off: the whole of b or an error (ReadAt may
// report io.EOF with the last bytes, and bytes.Reader does for an empty
// read at the end).
func readAt(r io.ReaderAt, b []byte, off int64) error {
	if len(b) == 0 {
		return nil
	}
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// parseHeader parses and checks the header's JSON. The parser is the
// format's own, not encoding/json: it refuses what encoding/json lets
// through (a key given twice in an object, last one winning; invalid UTF-8
// or an unpaired surrogate escape, replaced by U+FFFD) and allocates little
// per tensor (its name, its Info), so that a header of a million tiny
// tensors costs no more than its bytes, up to MaxTensors.
func (f *File) parseHeader(header []byte) error {
	if i := invalidUTF8(header); i >= 0 {
		return fmt.Errorf("header is not valid UTF-8 (byte %d)", i)
	}
	p := &parser{b: header}
	p.ws()
	if !p.eat('{') {
		return fmt.Errorf("header is not a JSON object")
	}
	// Sized once from a count of the key every entry has (an estimate: a
	// name may hold it too), so that no table is copied as it grows.
	hint := min(bytes.Count(header, []byte(`"data_offsets"`)), maxTensors+1)
	f.byName = make(map[string]int, hint)
	f.infos = make([]Info, 0, hint)
	f.dims = make([]int64, 0, 2*hint)
	metadata := false
	for first := true; ; first = false {
		p.ws()
		if p.eat('}') {
			break
		}
		if !first {
			if !p.eat(',') {
				return p.errorf("expected ',' or '}' after a tensor")
			}
			p.ws()
		}
		kb, err := p.key()
		if err != nil {
			return err
		}
		key := string(kb)
		if key == metadataKey {
			if metadata {
				return fmt.Errorf("%q appears twice in the header", key)
			}
			metadata = true
			if f.Metadata, err = p.metadata(); err != nil {
				return fmt.Errorf("%s: %w", metadataKey, err)
			}
			continue
		}
		if key == "" {
			return p.errorf("a tensor has an empty name")
		}
		if _, ok := f.byName[key]; ok {
			return fmt.Errorf("%q appears twice in the header", key)
		}
		if len(f.infos) >= maxTensors {
			return fmt.Errorf("more than %d tensors in the header (the limit)", maxTensors)
		}
		in, err := p.entry(f, key)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", key, err)
		}
		f.byName[key] = len(f.infos)
		f.infos = append(f.infos, in)
	}
	// The writer pads the header with spaces to align the data.
	p.ws()
	if p.i < len(p.b) {
		return p.errorf("header has bytes after its JSON object")
	}
	return nil
}

// invalidUTF8 is the offset of the first byte of b that is not valid
// UTF-8, -1 when there is none.
func invalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// parser reads the header's JSON (RFC 8259) from b at i: whitespace,
// strings, integers, arrays of integers and the two kinds of objects of the
// format. It never skips a value it does not know.
type parser struct {
	b []byte
	i int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("header JSON at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// eat consumes c when it comes next.
func (p *parser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// key reads an object's key and the colon after it: a slice of the header
// when it has no escape.
func (p *parser) key() ([]byte, error) {
	k, err := p.strBytes()
	if err != nil {
		return nil, err
	}
	p.ws()
	if !p.eat(':') {
		return nil, p.errorf("expected ':' after the key %q", k)
	}
	p.ws()
	return k, nil
}

// object reads the members of an object whose '{' comes next, calling
// member after each key with the parser at the value (member refuses a
// key given twice).
func (p *parser) object(member func(key []byte) error) error {
	if !p.eat('{') {
		return p.errorf("expected an object")
	}
	for first := true; ; first = false {
		p.ws()
		if p.eat('}') {
			return nil
		}
		if !first {
			if !p.eat(',') {
				return p.errorf("expected ',' or '}'")
			}
			p.ws()
		}
		k, err := p.key()
		if err != nil {
			return err
		}
		if err := member(k); err != nil {
			return err
		}
	}
}

// metadata reads "__metadata__": an object of strings, or null.
func (p *parser) metadata() (map[string]string, error) {
	if p.literal("null") {
		return nil, nil
	}
	m := map[string]string{}
	err := p.object(func(kb []byte) error {
		k := string(kb)
		if _, ok := m[k]; ok {
			return fmt.Errorf("key %q given twice", k)
		}
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return fmt.Errorf("value of %q is not a string (the metadata is a map of strings)", k)
		}
		v, err := p.str()
		m[k] = v
		return err
	})
	return m, err
}

// entry reads a tensor's entry: {"dtype", "shape", "data_offsets"}, each
// once, nothing else.
func (p *parser) entry(f *File, name string) (Info, error) {
	in := Info{Name: name}
	var shape, offsets bool
	var off [2]int64
	elemSize := int64(0)
	err := p.object(func(k []byte) error {
		switch string(k) {
		case "dtype":
			if in.DType != "" {
				return fmt.Errorf("field %q given twice", k)
			}
		case "shape":
			if shape {
				return fmt.Errorf("field %q given twice", k)
			}
		case "data_offsets":
			if offsets {
				return fmt.Errorf("field %q given twice", k)
			}
		}
		switch string(k) {
		case "dtype":
			if p.i >= len(p.b) || p.b[p.i] != '"' {
				return p.errorf("dtype is not a string")
			}
			d, err := p.strBytes()
			if err != nil {
				return err
			}
			dt, ok := dtypes[string(d)]
			if !ok {
				return fmt.Errorf("unknown dtype %q", d)
			}
			in.DType, elemSize = dt.name, dt.size
		case "shape":
			n := len(f.dims)
			var err error
			if f.dims, err = p.ints(f.dims, -1); err != nil {
				return fmt.Errorf("shape: %w", err)
			}
			in.Shape, shape = f.dims[n:len(f.dims):len(f.dims)], true
		case "data_offsets":
			n := len(f.dims)
			got, err := p.ints(f.dims, 3)
			if err != nil {
				return fmt.Errorf("data_offsets: %w", err)
			}
			// Read into the shapes' space, then given back.
			f.dims = got[:n]
			if len(got)-n != 2 {
				return fmt.Errorf("data_offsets %v is not [begin, end]", got[n:])
			}
			off, offsets = [2]int64{got[n], got[n+1]}, true
		default:
			return fmt.Errorf("unknown field %q", k)
		}
		return nil
	})
	switch {
	case err != nil:
		return in, err
	case in.DType == "":
		return in, fmt.Errorf("no dtype")
	case !shape:
		return in, fmt.Errorf("has no shape")
	case !offsets:
		return in, fmt.Errorf("no data_offsets")
	}
	elems, err := elements(in.Shape)
	if err != nil {
		return in, err
	}
	b, end := off[0], off[1]
	if b < 0 || end < b {
		return in, fmt.Errorf("data offsets [%d, %d) are not a range", b, end)
	}
	if elems > math.MaxInt64/elemSize || elems*elemSize != end-b {
		return in, fmt.Errorf("shape %v of %s does not fill its %d bytes", in.Shape, in.DType, end-b)
	}
	in.Offset, in.Size = b, end-b
	return in, nil
}

// literal consumes word when it comes next.
func (p *parser) literal(word string) bool {
	if strings.HasPrefix(string(p.b[p.i:min(len(p.b), p.i+len(word))]), word) {
		p.i += len(word)
		return true
	}
	return false
}

// ints appends to dst the integers of an array of at most max (-1: any
// number) whose '[' comes next.
func (p *parser) ints(dst []int64, max int) ([]int64, error) {
	n0 := len(dst)
	if !p.eat('[') {
		return dst, p.errorf("expected an array of integers")
	}
	for first := true; ; first = false {
		p.ws()
		if p.eat(']') {
			return dst, nil
		}
		if !first {
			if !p.eat(',') {
				return dst, p.errorf("expected ',' or ']'")
			}
			p.ws()
		}
		if max >= 0 && len(dst)-n0 >= max {
			return dst, p.errorf("more than %d integers", max)
		}
		v, err := p.int()
		if err != nil {
			return dst, err
		}
		dst = append(dst, v)
	}
}

// int reads an integer: JSON's number without fraction or exponent, in
// int64.
func (p *parser) int() (int64, error) {
	start := p.i
	neg := p.eat('-')
	digits := p.i
	var v int64
	for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
		d := int64(p.b[p.i] - '0')
		if v > (math.MaxInt64-d)/10 {
			return 0, p.errorf("integer %s... out of range", p.b[start:p.i])
		}
		v = 10*v + d
		p.i++
	}
	switch {
	case p.i == digits:
		return 0, p.errorf("expected an integer")
	case p.b[digits] == '0' && p.i-digits > 1:
		return 0, p.errorf("integer %s has a leading zero", p.b[start:p.i])
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, p.errorf("number %s... is not an integer", p.b[start:p.i+1])
	}
	if neg {
		v = -v
	}
	return v, nil
}

// str reads a string whose '"' comes next.
func (p *parser) str() (string, error) {
	b, err := p.strBytes()
	return string(b), err
}

// strBytes reads a string whose '"' comes next: a slice of the header
// when it has no escape. The header is valid UTF-8 (parseHeader checked);
// a control character and an unpaired surrogate escape are errors.
func (p *parser) strBytes() ([]byte, error) {
	if !p.eat('"') {
		return nil, p.errorf("expected a string")
	}
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], nil
		case c == '\\':
			return p.escaped(start)
		case c < 0x20:
			return nil, p.errorf("control character %#x in a string", c)
		}
		p.i++
	}
	return nil, p.errorf("unterminated string")
}

// escaped reads the rest of a string that began at start and has an
// escape at p.i.
func (p *parser) escaped(start int) ([]byte, error) {
	out := slices.Clone(p.b[start:p.i])
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return out, nil
		case c < 0x20:
			return nil, p.errorf("control character %#x in a string", c)
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			break
		}
		e := p.b[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return nil, err
			}
			if utf16.IsSurrogate(r) {
				lo := rune(-1)
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					p.i += 2
					if lo, err = p.hex4(); err != nil {
						return nil, err
					}
				}
				if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
					return nil, p.errorf("unpaired UTF-16 surrogate escape in a string")
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, p.errorf("invalid escape \\%c in a string", e)
		}
	}
	return nil, p.errorf("unterminated string")
}

// hex4 reads the four hex digits of a \u escape.
func (p *parser) hex4() (rune, error) {
	if p.i+4 > len(p.b) {
		return 0, p.errorf("short \\u escape")
	}
	v, err := strconv.ParseUint(string(p.b[p.i:p.i+4]), 16, 16)
	if err != nil {
		return 0, p.errorf("invalid \\u escape %q", p.b[p.i:p.i+4])
	}
	p.i += 4
	return rune(v), nil
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
	if err := readAt(f.r, data, f.data+in.Offset); err != nil {
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
