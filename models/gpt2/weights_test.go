package gpt2

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/safetensors"
)

// writeCheckpoint writes w's tensors to dir/model.safetensors as a
// checkpoint would hold them: names with prefix, dtype conv'd by enc,
// plus extra tensors; and config.json when cfg is set.
func writeCheckpoint(t *testing.T, dir string, w *Weights, prefix, dtype string, edit func([]safetensors.Tensor) []safetensors.Tensor, cfg bool) {
	t.Helper()
	var ts []safetensors.Tensor
	for _, x := range w.Tensors {
		data := x.Data
		switch dtype {
		case "BF16":
			data = toBF16(gpu.BytesToF32(data))
		case "F16":
			data = toF16(gpu.BytesToF32(data))
		}
		ts = append(ts, safetensors.Tensor{Name: prefix + x.Name, DType: dtype, Shape: x.Shape, Data: data})
	}
	if edit != nil {
		ts = edit(ts)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, WeightsFile), ts, nil); err != nil {
		t.Fatal(err)
	}
	if cfg {
		if err := WriteConfig(filepath.Join(dir, ConfigFile), w.Config); err != nil {
			t.Fatal(err)
		}
	}
}

// toBF16 truncates (exact for values with 8 significant bits).
func toBF16(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(x)>>16))
	}
	return b
}

// toF16 encodes normal values exactly representable in half precision.
func toF16(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		bits := math.Float32bits(x)
		sign := uint16(bits>>16) & 0x8000
		exp := int(bits>>23&0xff) - 127 + 15
		frac := uint16(bits>>13) & 0x3ff
		h := sign
		if x != 0 {
			h |= uint16(exp)<<10 | frac
		}
		binary.LittleEndian.PutUint16(b[2*i:], h)
	}
	return b
}

// rounded returns w with every value rounded to 8 significant bits and
// the tiny ones zeroed, so that F16 and BF16 hold them exactly.
func rounded(t *testing.T, w *Weights) *Weights {
	out := &Weights{Config: w.Config}
	for _, x := range w.Tensors {
		v := gpu.BytesToF32(x.Data)
		for i := range v {
			v[i] = math.Float32frombits(math.Float32bits(v[i]) &^ 0xffff)
			if math.Abs(float64(v[i])) < 1.0/(1<<14) {
				v[i] = 0 // below half precision's normal range
			}
		}
		out.Tensors = append(out.Tensors, Tensor{Name: x.Name, Shape: x.Shape, Data: gpu.F32ToBytes(v)})
	}
	return out
}

func sameWeights(t *testing.T, what string, got, want *Weights) {
	t.Helper()
	if got.Config != want.Config && !(got.Config.Eps == 0 || want.Config.Eps == 0) {
		t.Errorf("%s: config %+v, want %+v", what, got.Config, want.Config)
	}
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("%s: %d tensors, want %d", what, len(got.Tensors), len(want.Tensors))
	}
	for i := range want.Tensors {
		g, w := got.Tensors[i], want.Tensors[i]
		if g.Name != w.Name || !slices.Equal(g.Shape, w.Shape) || string(g.Data) != string(w.Data) {
			t.Fatalf("%s: tensor %d: %s %v differs from %s %v", what, i, g.Name, g.Shape, w.Name, w.Shape)
		}
	}
}

// TestLoadCheckpoints: with and without the transformer. prefix and
// config.json, F32, F16 and BF16 (widened exactly), extra tensors
// ignored, Save's output read back.
func TestLoadCheckpoints(t *testing.T) {
	w := rounded(t, microWeights(t))
	// micro's width is not one of GPT-2's: without config.json its head
	// count cannot be inferred; Small's can, at 768.
	for _, c := range []struct {
		prefix, dtype string
		cfg           bool
	}{{"", "F32", true}, {"transformer.", "F32", true}, {"transformer.", "F16", true}, {"", "BF16", true}} {
		dir := t.TempDir()
		writeCheckpoint(t, dir, w, c.prefix, c.dtype, func(ts []safetensors.Tensor) []safetensors.Tensor {
			return append(ts, safetensors.Tensor{Name: c.prefix + "h.0.attn.bias", DType: "F32", Shape: []int64{1}, Data: make([]byte, 4)},
				safetensors.Tensor{Name: "lm_head.weight", DType: c.dtype, Shape: ts[0].Shape, Data: ts[0].Data})
		}, c.cfg)
		got, err := Load(dir)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		sameWeights(t, c.prefix+c.dtype, got, w)
		if !strings.Contains(got.Source, "config") {
			t.Errorf("source %q does not say the config came from config.json", got.Source)
		}
	}
	dir := t.TempDir()
	if err := w.Save(dir, map[string]string{"seed": "7"}); err != nil {
		t.Fatal(err)
	}
	got, err := Load(filepath.Join(dir, WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	sameWeights(t, "saved", got, w)
}

// TestInferConfig: without config.json GPT-2's shapes are read from the
// tensors (heads from the width), other widths refused naming config.json.
func TestInferConfig(t *testing.T) {
	small := Config{Layers: 1, Width: 768, Heads: 12, Vocab: 11, Positions: 8}
	w, err := Generate(small, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeCheckpoint(t, dir, w, "transformer.", "F32", nil, false)
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Config != small || !strings.Contains(got.Source, "inferred") {
		t.Errorf("inferred %+v (%s), want %+v", got.Config, got.Source, small)
	}
	dir = t.TempDir()
	writeCheckpoint(t, dir, microWeights(t), "", "F32", nil, false)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("width 32 without config.json: %v", err)
	}
}

// TestLoadRejects: every bad checkpoint fails naming the tensor or key.
func TestLoadRejects(t *testing.T) {
	w := microWeights(t)
	drop := func(name string) func([]safetensors.Tensor) []safetensors.Tensor {
		return func(ts []safetensors.Tensor) []safetensors.Tensor {
			return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Name == name })
		}
	}
	change := func(name string, f func(*safetensors.Tensor)) func([]safetensors.Tensor) []safetensors.Tensor {
		return func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == name {
					f(&ts[i])
				}
			}
			return ts
		}
	}
	for _, c := range []struct {
		name string
		edit func([]safetensors.Tensor) []safetensors.Tensor
		want string
	}{
		{"missing", drop("h.1.mlp.c_fc.bias"), `no tensor "h.1.mlp.c_fc.bias"`},
		{"shape", change("h.0.attn.c_proj.weight", func(x *safetensors.Tensor) {
			x.Shape = []int64{16, 64}
		}), `tensor "h.0.attn.c_proj.weight" has shape [16 64], the config needs [32 32]`},
		{"dtype", change("wpe.weight", func(x *safetensors.Tensor) {
			x.DType, x.Shape = "I32", []int64{40, 32}
		}), `tensor "wpe.weight" is I32`},
	} {
		dir := t.TempDir()
		writeCheckpoint(t, dir, w, "", "F32", c.edit, true)
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %s", c.name, err, c.want)
		}
	}
	dir := t.TempDir()
	writeCheckpoint(t, dir, w, "", "F32", nil, false)
	for _, c := range []struct{ json, want string }{
		{`{"model_type": "llama"}`, "model_type"},
		{`{"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 97}`, "no n_positions"},
		{`{"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 97, "n_positions": 40, "activation_function": "relu"}`, "activation_function"},
		{`{"n_layer": 2, "n_embd": 32, "n_head": 5, "vocab_size": 97, "n_positions": 40}`, "not a multiple"},
		{`{"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 97, "n_positions": 40, "n_inner": 64}`, "n_inner"},
		{`{not json`, "config.json"},
	} {
		os.WriteFile(filepath.Join(dir, ConfigFile), []byte(c.json), 0o644)
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %s: %v, want an error saying %q", c.json, err, c.want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "nothing")); err == nil || !strings.Contains(err.Error(), "nothing") {
		t.Errorf("no file: %v", err)
	}
}
