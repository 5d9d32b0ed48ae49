// Package tokenizer is GPT-2's byte-level BPE tokenizer: text to token ids
// and back, with GPT-2's vocabulary of 50,257 tokens built into the binary
// (nothing is fetched at run time).
//
// The BPE itself is github.com/tiktoken-go/tokenizer, a maintained pure-Go
// port of OpenAI's tiktoken, whose r50k_base encoding is GPT-2's: the same
// pre-tokenizing pattern, the same 50,000 merges, token ids equal to
// Hugging Face's GPT2Tokenizer ids. Only its r50k_base codec is linked.
// A checkpoint's own tokenizer files (vocab.json and merges.txt, or
// tokenizer.json) are read and checked against that vocabulary (Load):
// another vocabulary is refused rather than mis-encoded. WriteFiles writes
// vocab.json and merges.txt for tools that read them (transformers), from
// the built-in vocabulary.
//
// A Tokenizer is safe for concurrent use; a Decoder is not.
package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/stablegraph/stablegraph/internal/atomicfile"
	"github.com/tiktoken-go/tokenizer/codec"
)

// VocabSize is the number of GPT-2 tokens, EndOfText included.
const VocabSize = 50257

// EndOfText is the id of "<|endoftext|>", GPT-2's only special token.
const EndOfText = 50256

// EndOfTextText is how EndOfText is written.
const EndOfTextText = "<|endoftext|>"

// Tokenizer encodes and decodes GPT-2 tokens.
type Tokenizer struct {
	c *codec.Codec
	// Source says where the vocabulary came from, for reports.
	Source string
}

var (
	shared     *codec.Codec
	sharedOnce sync.Once
	pieces     [][]byte // token id → bytes, built once
	piecesOnce sync.Once
)

// New returns the tokenizer with the built-in vocabulary.
func New() *Tokenizer {
	sharedOnce.Do(func() { shared = codec.NewR50kBase() })
	return &Tokenizer{c: shared, Source: "built-in GPT-2 vocabulary (r50k_base)"}
}

// Encode returns the token ids of text. Text is split as GPT-2 splits it,
// so "<|endoftext|>" written in text is encoded as ordinary text.
func (t *Tokenizer) Encode(text string) []int32 {
	ids, _, err := t.c.Encode(text)
	if err != nil {
		// The codec fails only on a pattern engine error, which GPT-2's
		// pattern cannot raise on any string (regexp2 has no timeout set);
		// encode byte by byte rather than lose text if it ever did.
		return t.encodeBytes(text)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// encodeBytes encodes text one byte a token: a fallback that round-trips.
func (t *Tokenizer) encodeBytes(text string) []int32 {
	ps := vocabPieces(t.c)
	byByte := map[byte]int32{}
	for id, p := range ps {
		if len(p) == 1 {
			byByte[p[0]] = int32(id)
		}
	}
	out := make([]int32, len(text))
	for i := range len(text) {
		out[i] = byByte[text[i]]
	}
	return out
}

// Bytes returns the bytes of ids, joined. A token may end inside a UTF-8
// character that the next one completes, so the bytes of a prefix of a
// sequence need not be valid UTF-8 (see Decoder).
func (t *Tokenizer) Bytes(ids []int32) ([]byte, error) {
	ps := vocabPieces(t.c)
	var b []byte
	for _, id := range ids {
		if id < 0 || int(id) >= len(ps) || ps[id] == nil {
			return nil, fmt.Errorf("tokenizer: token id %d outside GPT-2's vocabulary of %d", id, VocabSize)
		}
		b = append(b, ps[id]...)
	}
	return b, nil
}

// Decode returns the text of ids; bytes that are not valid UTF-8 are
// replaced by U+FFFD, as transformers' decode does.
func (t *Tokenizer) Decode(ids []int32) (string, error) {
	b, err := t.Bytes(ids)
	if err != nil {
		return "", err
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

// vocabPieces returns the bytes of every token id.
func vocabPieces(c *codec.Codec) [][]byte {
	piecesOnce.Do(func() {
		pieces = make([][]byte, VocabSize)
		for id := range uint(EndOfText) {
			s, err := c.Decode([]uint{id})
			if err == nil {
				pieces[id] = []byte(s)
			}
		}
		pieces[EndOfText] = []byte(EndOfTextText)
	})
	return pieces
}

// Decoder turns a stream of tokens into text as it comes, holding back
// the bytes of a UTF-8 character until the token that completes it.
type Decoder struct {
	t       *Tokenizer
	pending []byte
}

// NewDecoder returns a Decoder over t.
func (t *Tokenizer) NewDecoder() *Decoder { return &Decoder{t: t} }

// Add adds a token and returns the text it completes ("" while a
// character is incomplete).
func (d *Decoder) Add(id int32) (string, error) {
	b, err := d.t.Bytes([]int32{id})
	if err != nil {
		return "", err
	}
	d.pending = append(d.pending, b...)
	// Emit up to the last character's start when that character is
	// incomplete (at most 3 bytes of a 4-byte one wait), else everything.
	n := len(d.pending)
	for cut := n - 1; cut >= max(0, n-utf8.UTFMax); cut-- {
		if utf8.RuneStart(d.pending[cut]) {
			if !utf8.FullRune(d.pending[cut:]) {
				n = cut
			}
			break
		}
	}
	out := strings.ToValidUTF8(string(d.pending[:n]), "\uFFFD")
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return out, nil
}

// Flush returns what is held back, invalid bytes replaced.
func (d *Decoder) Flush() string {
	out := strings.ToValidUTF8(string(d.pending), "\uFFFD")
	d.pending = d.pending[:0]
	return out
}

// byteToRune is GPT-2's bytes_to_unicode: every byte as a printable
// character, so that vocab.json and merges.txt hold text.
func byteToRune() [256]rune {
	var m [256]rune
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}

func encodeByteLevel(b []byte, m *[256]rune) string {
	var sb strings.Builder
	for _, c := range b {
		sb.WriteRune(m[c])
	}
	return sb.String()
}

// vocabJSON is the built-in vocabulary as vocab.json holds it.
func vocabJSON(ps [][]byte) map[string]int {
	m := byteToRune()
	v := make(map[string]int, len(ps))
	for id, p := range ps {
		if id == EndOfText {
			v[EndOfTextText] = id
			continue
		}
		v[encodeByteLevel(p, &m)] = id
	}
	return v
}

// merges derives GPT-2's merge list from the vocabulary's ranks (a token's
// id is its rank): token r is the merge of the two parts that byte-pair
// encoding with the merges of lower rank splits it into.
func merges(ps [][]byte) ([][2][]byte, error) {
	rank := make(map[string]int, len(ps))
	for id, p := range ps[:EndOfText] {
		rank[string(p)] = id
	}
	var out [][2][]byte
	for id := 256; id < EndOfText; id++ {
		parts := bpe(ps[id], rank, id)
		if len(parts) != 2 {
			return nil, fmt.Errorf("tokenizer: token %d (%q) does not split into two lower-ranked tokens", id, ps[id])
		}
		out = append(out, [2][]byte{parts[0], parts[1]})
	}
	return out, nil
}

// bpe splits b by merging, lowest rank first, adjacent parts whose join
// has a rank below limit.
func bpe(b []byte, rank map[string]int, limit int) [][]byte {
	parts := make([][]byte, len(b))
	for i := range b {
		parts[i] = b[i : i+1]
	}
	for {
		best, at := limit, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := rank[string(parts[i])+string(parts[i+1])]; ok && r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			return parts
		}
		joined := append(append([]byte(nil), parts[at]...), parts[at+1]...)
		parts = append(append(parts[:at:at], joined), parts[at+2:]...)
	}
}

// Names of the tokenizer files Load reads and WriteFiles writes.
const (
	VocabFile     = "vocab.json"
	MergesFile    = "merges.txt"
	TokenizerFile = "tokenizer.json"
)

// ErrForeignVocab is returned by Load for tokenizer files whose vocabulary
// is not GPT-2's.
var ErrForeignVocab = errors.New("tokenizer: not GPT-2's vocabulary")

// Load returns the tokenizer for a checkpoint directory: when dir holds
// vocab.json (with merges.txt) or tokenizer.json, they are read and must
// hold GPT-2's vocabulary (ErrForeignVocab otherwise; an unreadable or
// malformed file is an error naming it); with none of them, the built-in
// vocabulary.
func Load(dir string) (*Tokenizer, error) {
	t := New()
	for _, name := range []string{VocabFile, TokenizerFile} {
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		vocab := map[string]int{}
		if name == TokenizerFile {
			var tj struct {
				Model struct {
					Type  string         `json:"type"`
					Vocab map[string]int `json:"vocab"`
				} `json:"model"`
			}
			if err := json.Unmarshal(b, &tj); err != nil {
				return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
			}
			if tj.Model.Type != "BPE" {
				return nil, fmt.Errorf("tokenizer: %s: model type %q, not GPT-2's BPE: %w", path, tj.Model.Type, ErrForeignVocab)
			}
			vocab = tj.Model.Vocab
		} else if err := json.Unmarshal(b, &vocab); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
		}
		if name == VocabFile {
			if _, err := os.ReadFile(filepath.Join(dir, MergesFile)); err != nil {
				return nil, fmt.Errorf("tokenizer: %s has no readable %s beside it: %w", path, MergesFile, err)
			}
		}
		if err := sameVocab(vocab, vocabJSON(vocabPieces(t.c))); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
		}
		t.Source = path + " (checked: GPT-2's vocabulary)"
		return t, nil
	}
	return t, nil
}

// sameVocab reports the first difference of got from GPT-2's want.
func sameVocab(got, want map[string]int) error {
	// added tokens beyond EndOfText are not part of vocab.json's GPT-2.
	if len(got) != len(want) {
		return fmt.Errorf("%d tokens, GPT-2 has %d: %w", len(got), len(want), ErrForeignVocab)
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if id, ok := got[k]; !ok || id != want[k] {
			return fmt.Errorf("token %q is id %d (present: %v), GPT-2's is %d: %w", k, id, ok, want[k], ErrForeignVocab)
		}
	}
	return nil
}

// WriteFiles writes vocab.json and merges.txt (GPT2Tokenizer's files)
// into dir from the built-in vocabulary, each whole or not at all.
func (t *Tokenizer) WriteFiles(dir string) error {
	ps := vocabPieces(t.c)
	vj, err := json.Marshal(vocabJSON(ps))
	if err != nil {
		return err
	}
	ms, err := merges(ps)
	if err != nil {
		return err
	}
	m := byteToRune()
	var mb bytes.Buffer
	mb.WriteString("#version: 0.2\n")
	for _, p := range ms {
		mb.WriteString(encodeByteLevel(p[0], &m) + " " + encodeByteLevel(p[1], &m) + "\n")
	}
	if err := writeWhole(filepath.Join(dir, VocabFile), vj); err != nil {
		return err
	}
	return writeWhole(filepath.Join(dir, MergesFile), mb.Bytes())
}

func writeWhole(path string, data []byte) error {
	if err := atomicfile.WriteFile(path, func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
		return fmt.Errorf("tokenizer: write %s: %w", path, err)
	}
	return nil
}
