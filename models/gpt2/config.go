package gpt2

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/stablegraph/stablegraph/internal/atomicfile"
)

// Config is the shape of a GPT-2 model.
type Config struct {
	Layers    int // transformer blocks (n_layer)
	Width     int // model width d (n_embd)
	Heads     int // attention heads (n_head); Width/Heads is the head dimension
	Vocab     int // vocabulary size (vocab_size)
	Positions int // context length: learned positions (n_positions)
	// Eps is the layer norm's epsilon (layer_norm_epsilon). Zero means
	// GPT-2's 1e-5.
	Eps float64
}

// The shapes GPT-2 was published in, and Tiny, the shape the tests and
// `stablegraph generate` on sim use (GPT-2's vocabulary, so that the real
// tokenizer applies, with a width of 64).
var (
	Small  = Config{Layers: 12, Width: 768, Heads: 12, Vocab: 50257, Positions: 1024}
	Medium = Config{Layers: 24, Width: 1024, Heads: 16, Vocab: 50257, Positions: 1024}
	Large  = Config{Layers: 36, Width: 1280, Heads: 20, Vocab: 50257, Positions: 1024}
	XL     = Config{Layers: 48, Width: 1600, Heads: 25, Vocab: 50257, Positions: 1024}
	Tiny   = Config{Layers: 2, Width: 64, Heads: 4, Vocab: 50257, Positions: 256}
)

// DefaultEps is GPT-2's layer-norm epsilon.
const DefaultEps = 1e-5

// headsByWidth are the head counts of the published shapes, which
// InferConfig uses when no config.json says: the tensors' shapes cannot
// tell the head count.
var headsByWidth = map[int]int{Small.Width: Small.Heads, Medium.Width: Medium.Heads, Large.Width: Large.Heads, XL.Width: XL.Heads}

// HeadDim is the width of one head.
func (c Config) HeadDim() int { return c.Width / c.Heads }

// eps is Eps with its default.
func (c Config) eps() float64 {
	if c.Eps == 0 {
		return DefaultEps
	}
	return c.Eps
}

// Stride is the floats between two positions of a KV cache: every layer's
// keys and values of one position (kernels/gpt2.go, KV caches).
func (c Config) Stride() int { return c.Layers * 2 * c.Width }

// CacheBytes is the size of a KV cache holding positions positions.
func (c Config) CacheBytes(positions int) int64 {
	return int64(positions) * int64(c.Stride()) * 4
}

func (c Config) String() string {
	return fmt.Sprintf("layers=%d width=%d heads=%d vocab=%d positions=%d", c.Layers, c.Width, c.Heads, c.Vocab, c.Positions)
}

// Limits keep every size within the kernels' int32 arguments and the
// attention's shared memory (kernels.DecodeAttentionConfig).
const (
	MaxLayers    = 96
	MaxWidth     = 8192
	MaxVocab     = 1 << 20
	MaxPositions = 8192
)

// Check reports a shape the model cannot run, saying why.
func (c Config) Check() error {
	switch {
	case c.Layers <= 0 || c.Width <= 0 || c.Heads <= 0 || c.Vocab <= 0 || c.Positions <= 0:
		return fmt.Errorf("gpt2: config %s: every size must be positive", c)
	case c.Layers > MaxLayers || c.Width > MaxWidth || c.Vocab > MaxVocab || c.Positions > MaxPositions:
		return fmt.Errorf("gpt2: config %s too large (at most %d layers, width %d, vocab %d, %d positions)", c, MaxLayers, MaxWidth, MaxVocab, MaxPositions)
	case c.Width%c.Heads != 0:
		return fmt.Errorf("gpt2: config %s: width %d is not a multiple of the %d heads", c, c.Width, c.Heads)
	case c.Eps < 0:
		return fmt.Errorf("gpt2: config %s: negative layer-norm epsilon %g", c, c.Eps)
	case int64(c.Positions)*int64(c.Stride()) > 1<<31-1:
		return fmt.Errorf("gpt2: config %s: a cache of %d positions has more floats than an int32 counts", c, c.Positions)
	}
	return nil
}

// hfConfig is what ReadConfig reads of Hugging Face's GPT2Config, with the
// options that change the computation, so that a checkpoint this package
// would compute differently is refused rather than run wrong.
type hfConfig struct {
	ModelType   string   `json:"model_type"`
	NLayer      *int     `json:"n_layer"`
	NEmbd       *int     `json:"n_embd"`
	NHead       *int     `json:"n_head"`
	VocabSize   *int     `json:"vocab_size"`
	NPositions  *int     `json:"n_positions"`
	NInner      *int     `json:"n_inner"`
	Eps         *float64 `json:"layer_norm_epsilon"`
	Activation  *string  `json:"activation_function"`
	ScaleAttn   *bool    `json:"scale_attn_weights"`
	ScaleByIdx  *bool    `json:"scale_attn_by_inverse_layer_idx"`
	ReorderAttn *bool    `json:"reorder_and_upcast_attn"`
	TieWeights  *bool    `json:"tie_word_embeddings"`
}

// ConfigFile is the name of the config Load reads beside the weights.
const ConfigFile = "config.json"

// ReadConfig reads a Hugging Face GPT-2 config.json. Options this package
// does not compute (another activation, another inner width, unscaled or
// layer-scaled attention, untied embeddings) are refused, naming the key.
func ReadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("gpt2: read config: %w", err)
	}
	var h hfConfig
	if err := json.Unmarshal(b, &h); err != nil {
		return Config{}, fmt.Errorf("gpt2: config %s: %w", path, err)
	}
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("gpt2: config %s: "+format, append([]any{path}, args...)...)
	}
	if h.ModelType != "" && h.ModelType != "gpt2" {
		return bad("model_type %q is not gpt2", h.ModelType)
	}
	var c Config
	for _, f := range []struct {
		key string
		v   *int
		dst *int
	}{{"n_layer", h.NLayer, &c.Layers}, {"n_embd", h.NEmbd, &c.Width}, {"n_head", h.NHead, &c.Heads},
		{"vocab_size", h.VocabSize, &c.Vocab}, {"n_positions", h.NPositions, &c.Positions}} {
		if f.v == nil {
			return bad("no %s", f.key)
		}
		*f.dst = *f.v
	}
	switch {
	case h.NInner != nil && *h.NInner != 4*c.Width:
		return bad("n_inner %d: only GPT-2's 4·n_embd = %d is supported", *h.NInner, 4*c.Width)
	case h.Activation != nil && *h.Activation != "gelu_new" && *h.Activation != "gelu_pytorch_tanh":
		return bad("activation_function %q: only GPT-2's gelu_new (the tanh form) is supported", *h.Activation)
	case h.ScaleAttn != nil && !*h.ScaleAttn:
		return bad("scale_attn_weights false is not supported")
	case h.ScaleByIdx != nil && *h.ScaleByIdx:
		return bad("scale_attn_by_inverse_layer_idx true is not supported")
	case h.TieWeights != nil && !*h.TieWeights:
		return bad("tie_word_embeddings false is not supported: the LM head is the token embedding")
	}
	// reorder_and_upcast_attn changes only how float16 attention is
	// computed; in float32 it is the same function.
	if h.Eps != nil {
		c.Eps = *h.Eps
	}
	if err := c.Check(); err != nil {
		return Config{}, fmt.Errorf("%w (from %s)", err, path)
	}
	return c, nil
}

// configBeside reads config.json in dir; ok is false when there is none.
func configBeside(dir string) (c Config, ok bool, err error) {
	path := filepath.Join(dir, ConfigFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return Config{}, false, nil
	}
	c, err = ReadConfig(path)
	return c, err == nil, err
}

// WriteConfig writes c as a Hugging Face GPT-2 config.json to path, whole
// or not at all: what transformers' GPT2Config.from_pretrained reads.
func WriteConfig(path string, c Config) error {
	if err := c.Check(); err != nil {
		return err
	}
	h := map[string]any{
		"model_type": "gpt2", "architectures": []string{"GPT2LMHeadModel"},
		"n_layer": c.Layers, "n_embd": c.Width, "n_head": c.Heads, "vocab_size": c.Vocab,
		"n_positions": c.Positions, "n_ctx": c.Positions, "layer_norm_epsilon": c.eps(),
		"activation_function": "gelu_new", "bos_token_id": EndOfText, "eos_token_id": EndOfText,
		"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": true,
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return err
	}
	return writeWhole(path, append(b, '\n'))
}

// writeWhole writes data to path whole or not at all.
func writeWhole(path string, data []byte) error {
	if err := atomicfile.WriteFile(path, func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
		return fmt.Errorf("gpt2: write %s: %w", path, err)
	}
	return nil
}

// EndOfText is GPT-2's end-of-text token, which ends a generated sequence.
const EndOfText = 50256
