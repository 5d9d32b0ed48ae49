package tokenizer

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// awkward is text that byte-level BPE must round-trip exactly.
var awkward = []string{
	"",
	"Hello world",
	"  leading and   inner    runs of spaces   ",
	"tabs\tand\nnewlines\r\n\n\n and a trailing newline\n",
	"Unicode: naïve café, Ελληνικά, русский, 日本語のテキスト, עברית, हिन्दी",
	"emoji 😀👍🏽 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
	"combining e\u0301 and zero-width\u200bjoiner",
	"<|endoftext|> is text here",
	"numbers 12345678901234567890 and 3.14159, 1e-5",
	"code: func main() { fmt.Println(\"hi\") } // ok?",
	"'s 't 're 've 'm 'll 'd contractions, I'm you'll",
	strings.Repeat("ab", 300),
}

func TestRoundTrip(t *testing.T) {
	tk := New()
	for _, s := range awkward {
		ids := tk.Encode(s)
		got, err := tk.Decode(ids)
		if err != nil || got != s {
			t.Errorf("%q: encoded to %v, decoded to %q (%v)", s, ids, got, err)
		}
		if s == "" && len(ids) != 0 {
			t.Errorf("empty text: %d tokens", len(ids))
		}
		for _, id := range ids {
			if id < 0 || id >= EndOfText {
				t.Errorf("%q: id %d outside the ordinary tokens", s, id)
			}
		}
	}
}

// TestKnownIDs pins ids that Hugging Face's GPT2Tokenizer gives.
func TestKnownIDs(t *testing.T) {
	tk := New()
	for _, c := range []struct {
		text string
		ids  []int32
	}{
		{"Hello world", []int32{15496, 995}},
		{"Hello", []int32{15496}},
		{" the", []int32{262}},
		{"!", []int32{0}},
	} {
		if got := tk.Encode(c.text); !slices.Equal(got, c.ids) {
			t.Errorf("%q: %v, want %v", c.text, got, c.ids)
		}
	}
	if got, err := tk.Decode([]int32{EndOfText}); err != nil || got != EndOfTextText {
		t.Errorf("end of text decodes to %q, %v", got, err)
	}
	if _, err := tk.Decode([]int32{VocabSize}); err == nil {
		t.Error("id 50257 decoded")
	}
}

// TestDecoderStreams: token by token, the Decoder yields only whole
// characters and in all the same text as Decode.
func TestDecoderStreams(t *testing.T) {
	tk := New()
	for _, s := range awkward {
		d := tk.NewDecoder()
		var sb strings.Builder
		for _, id := range tk.Encode(s) {
			part, err := d.Add(id)
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.ValidString(part) {
				t.Errorf("%q: a piece %q is not valid UTF-8", s, part)
			}
			sb.WriteString(part)
		}
		sb.WriteString(d.Flush())
		if sb.String() != s {
			t.Errorf("streamed %q, want %q", sb.String(), s)
		}
	}
	// A character split over tokens waits for its last byte: 😀 alone is
	// several byte tokens.
	ids := tk.Encode("😀")
	if len(ids) < 2 {
		t.Skipf("😀 is one token: %v", ids)
	}
	d := tk.NewDecoder()
	if part, _ := d.Add(ids[0]); part != "" {
		t.Errorf("first byte token of 😀 gave %q", part)
	}
}

// TestFilesRoundTrip: the files WriteFiles writes hold GPT-2's 50,000
// merges and load back as GPT-2's vocabulary; a changed vocabulary and
// unreadable files are refused, naming the file.
func TestFilesRoundTrip(t *testing.T) {
	tk := New()
	dir := t.TempDir()
	if err := tk.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, MergesFile))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	f.Close()
	// GPT-2's merges.txt: a version line, then "Ġ t" first, 50,000 in all.
	if len(lines) != 50001 || lines[0] != "#version: 0.2" || lines[1] != "Ġ t" {
		t.Errorf("merges.txt: %d lines, first %q", len(lines), lines[:min(2, len(lines))])
	}
	got, err := Load(dir)
	if err != nil || !strings.Contains(got.Source, VocabFile) {
		t.Fatalf("load: %v, %v", got, err)
	}
	if ids := got.Encode("Hello world"); !slices.Equal(ids, []int32{15496, 995}) {
		t.Errorf("loaded tokenizer: %v", ids)
	}
	if got, err := Load(t.TempDir()); err != nil || !strings.Contains(got.Source, "built-in") {
		t.Errorf("no files: %v, %v", got, err)
	}

	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, VocabFile), []byte(`{"a": 0, "b": 1}`), 0o644)
	os.WriteFile(filepath.Join(bad, MergesFile), []byte("#version: 0.2\na b\n"), 0o644)
	if _, err := Load(bad); !errors.Is(err, ErrForeignVocab) || !strings.Contains(err.Error(), VocabFile) {
		t.Errorf("a foreign vocabulary: %v", err)
	}
	os.WriteFile(filepath.Join(bad, VocabFile), []byte(`{not json`), 0o644)
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), VocabFile) {
		t.Errorf("malformed vocab.json: %v", err)
	}
	unreadable := t.TempDir()
	if err := os.Mkdir(filepath.Join(unreadable, TokenizerFile), 0o755); err != nil { // a directory: unreadable as a file
		t.Fatal(err)
	}
	if _, err := Load(unreadable); err == nil || !strings.Contains(err.Error(), TokenizerFile) {
		t.Errorf("unreadable tokenizer.json: %v", err)
	}
	noMerges := t.TempDir()
	os.Rename(filepath.Join(dir, VocabFile), filepath.Join(noMerges, VocabFile))
	if _, err := Load(noMerges); err == nil || !strings.Contains(err.Error(), MergesFile) {
		t.Errorf("vocab.json without merges.txt: %v", err)
	}
}
