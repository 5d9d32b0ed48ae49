package gpt2

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/safetensors"
)

// Tensor is one weight: its name as in GPT-2's checkpoints without the
// "transformer." prefix ("wte.weight", "h.0.attn.c_attn.weight"), its
// shape, and its values as little-endian float32 bytes, row-major.
// Matrices are stored [in, out], as GPT-2's Conv1D keeps them, so that x·W
// needs no transpose.
type Tensor struct {
	Name  string
	Shape []int64
	Data  []byte
}

// Spec is a weight the model needs: its name and shape, and how Generate
// draws it (center + uniform in [-spread, spread]).
type Spec struct {
	Name           string
	Shape          []int64
	Center, Spread float64
}

// Split says how a tensor-parallel shard takes its part of the weight.
func (s Spec) Split() Split {
	sp, _ := splitOf(s.Name)
	return sp
}

// Elements is the product of the shape.
func (s Spec) Elements() int64 {
	n := int64(1)
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// Shard is the part of the model one rank of a tensor-parallel group
// computes: its heads and MLP columns (Megatron's split: c_attn and c_fc
// by output columns, the projections c_proj by input rows, an all-reduce
// after each projection; shard.go). The zero Shard, and {Rank: 0, Ranks:
// 1}, is the whole model.
type Shard struct {
	Rank, Ranks int
}

// ErrTensorParallel is returned for a Shard that does not split the model
// (a rank out of range; heads or MLP columns that do not divide by the
// ranks) and for a tensor-parallel step without a matching communicator.
var ErrTensorParallel = errors.New("gpt2: bad tensor-parallel shard")

// Specs lists the weights of c in checkpoint order, with the shapes shard
// holds (the whole model's for the zero Shard; Split says how a shard's
// are cut from the whole). Generated values have GPT-2's initial scales:
// standard deviation 0.02 (0.02/√(2L) for the projections into the
// residual stream), uniform rather than normal.
func Specs(c Config, shard Shard) ([]Spec, error) {
	if err := shard.Check(c); err != nil {
		return nil, err
	}
	d, L := int64(c.Width), c.Layers
	u := math.Sqrt(3) // uniform spread of standard deviation 1
	std := 0.02 * u
	resid := 0.02 / math.Sqrt(2*float64(L)) * u
	ln := func(name string) []Spec {
		return []Spec{{name + ".weight", []int64{d}, 1, 0.1}, {name + ".bias", []int64{d}, 0, 0.02}}
	}
	ss := []Spec{
		{"wte.weight", []int64{int64(c.Vocab), d}, 0, std},
		{"wpe.weight", []int64{int64(c.Positions), d}, 0, 0.01 * u},
	}
	for l := range L {
		pre := fmt.Sprintf("h.%d.", l)
		ss = append(ss, ln(pre+"ln_1")...)
		ss = append(ss,
			Spec{pre + "attn.c_attn.weight", []int64{d, 3 * d}, 0, std},
			Spec{pre + "attn.c_attn.bias", []int64{3 * d}, 0, 0.02},
			Spec{pre + "attn.c_proj.weight", []int64{d, d}, 0, resid},
			Spec{pre + "attn.c_proj.bias", []int64{d}, 0, 0.02})
		ss = append(ss, ln(pre+"ln_2")...)
		ss = append(ss,
			Spec{pre + "mlp.c_fc.weight", []int64{d, 4 * d}, 0, std},
			Spec{pre + "mlp.c_fc.bias", []int64{4 * d}, 0, 0.02},
			Spec{pre + "mlp.c_proj.weight", []int64{4 * d, d}, 0, resid},
			Spec{pre + "mlp.c_proj.bias", []int64{d}, 0, 0.02})
	}
	ss = append(ss, ln("ln_f")...)
	if !shard.Whole() {
		for i := range ss {
			ss[i] = shardSpec(ss[i], shard)
		}
	}
	return ss, nil
}

// Weights are a model's shape and its weights in Specs order.
type Weights struct {
	Config Config
	// Part is the shard the tensors hold (Specs' shapes for it); the zero
	// Shard for the whole model.
	Part    Shard
	Tensors []Tensor
	// Source says where they came from, for logs and reports.
	Source string
}

// Bytes is the weights' total size.
func (w *Weights) Bytes() int64 {
	var n int64
	for _, t := range w.Tensors {
		n += int64(len(t.Data))
	}
	return n
}

// WeightsFile is the checkpoint file Load looks for in a directory.
const WeightsFile = "model.safetensors"

// prefix is the name prefix of GPT2LMHeadModel's checkpoints; GPT2Model's
// have none.
const prefix = "transformer."

// Load reads a GPT-2 checkpoint as Hugging Face distributes it: path is
// model.safetensors, or a directory holding it. The shape comes from
// config.json beside the file when there is one, else from the tensors'
// shapes with GPT-2's head count for their width (Small, Medium, Large,
// XL). Names may carry the "transformer." prefix; lm_head.weight (the
// tied embedding) and the attention masks are ignored. F32 tensors are
// taken as they are, F16 and BF16 converted to float32 exactly; other
// dtypes are refused. Every error about a tensor names it.
func Load(path string) (*Weights, error) { return LoadShard(path, Shard{}) }

// LoadShard reads a whole model's checkpoint as Load does and keeps the
// part shard holds (Weights.Shard), slicing each tensor as it is read, so
// that a rank never holds more than its part and one whole tensor.
func LoadShard(path string, shard Shard) (*Weights, error) {
	file := path
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		file = filepath.Join(path, WeightsFile)
	}
	f, err := safetensors.Open(file)
	if err != nil {
		return nil, fmt.Errorf("gpt2: weights: %w", err)
	}
	defer f.Close()
	names := map[string]string{} // canonical name → name in the file
	for _, in := range f.Tensors() {
		names[strings.TrimPrefix(in.Name, prefix)] = in.Name
	}
	c, ok, err := configBeside(filepath.Dir(file))
	if err != nil {
		return nil, err
	}
	from := "config " + filepath.Join(filepath.Dir(file), ConfigFile)
	if !ok {
		if c, err = inferConfig(f, names); err != nil {
			return nil, fmt.Errorf("gpt2: weights %s: %w", file, err)
		}
		from = "shape inferred from the tensors"
	}
	specs, err := Specs(c, Shard{})
	if err != nil {
		return nil, err
	}
	if err := shard.Check(c); err != nil {
		return nil, fmt.Errorf("gpt2: weights %s: %w", file, err)
	}
	w := &Weights{Config: c, Part: shard, Source: fmt.Sprintf("%s (%s; %s)", file, c, from)}
	if !shard.Whole() {
		w.Source += ", " + shard.String()
	}
	for _, sp := range specs {
		t, err := readTensor(f, names, sp)
		if err == nil && !shard.Whole() {
			t, err = sliceTensor(t, sp, shardSpec(sp, shard), shard)
		}
		if err != nil {
			return nil, fmt.Errorf("gpt2: weights %s: %w", file, err)
		}
		w.Tensors = append(w.Tensors, t)
	}
	return w, nil
}

// inferConfig reads the shape from the tensors: the layers from the
// highest h.N, width and vocabulary from wte, positions from wpe, heads
// from the width.
func inferConfig(f *safetensors.File, names map[string]string) (Config, error) {
	var c Config
	wte, ok := f.Info(names["wte.weight"])
	if !ok || len(wte.Shape) != 2 {
		return c, fmt.Errorf("no 2-d tensor %q (or %q) to read the shape from", "wte.weight", prefix+"wte.weight")
	}
	wpe, ok := f.Info(names["wpe.weight"])
	if !ok || len(wpe.Shape) != 2 {
		return c, fmt.Errorf("no 2-d tensor %q (or %q) to read the shape from", "wpe.weight", prefix+"wpe.weight")
	}
	c.Vocab, c.Width, c.Positions = int(wte.Shape[0]), int(wte.Shape[1]), int(wpe.Shape[0])
	for name := range names {
		if rest, ok := strings.CutPrefix(name, "h."); ok {
			if i := strings.IndexByte(rest, '.'); i > 0 {
				if n, err := strconv.Atoi(rest[:i]); err == nil && n+1 > c.Layers && n < MaxLayers {
					c.Layers = n + 1
				}
			}
		}
	}
	if c.Heads = headsByWidth[c.Width]; c.Heads == 0 {
		return c, fmt.Errorf("width %d is not one of GPT-2's (768, 1024, 1280, 1600): the head count cannot be read from the tensors; put the checkpoint's %s beside it", c.Width, ConfigFile)
	}
	return c, c.Check()
}

// readTensor reads the tensor of sp, checking its shape and converting
// its dtype to float32.
func readTensor(f *safetensors.File, names map[string]string, sp Spec) (Tensor, error) {
	name, ok := names[sp.Name]
	if !ok {
		return Tensor{}, fmt.Errorf("no tensor %q (nor %q): the checkpoint is missing it", sp.Name, prefix+sp.Name)
	}
	in, _ := f.Info(name)
	if !slices.Equal(in.Shape, sp.Shape) {
		return Tensor{}, fmt.Errorf("tensor %q has shape %s, the config needs %s", name,
			safetensors.ShapeString(in.Shape), safetensors.ShapeString(sp.Shape))
	}
	var conv func([]byte) []byte
	switch in.DType {
	case "F32":
	case "F16":
		conv = f16ToF32
	case "BF16":
		conv = bf16ToF32
	default:
		return Tensor{}, fmt.Errorf("tensor %q is %s: only F32, F16 and BF16 weights are read (computed in float32)", name, in.DType)
	}
	t, err := f.ReadTensor(name)
	if err != nil {
		return Tensor{}, err
	}
	data := t.Data
	if conv != nil {
		data = conv(data)
	}
	return Tensor{Name: sp.Name, Shape: slices.Clone(sp.Shape), Data: data}, nil
}

// bf16ToF32 widens bfloat16 values: their bits are float32's top half.
func bf16ToF32(b []byte) []byte {
	out := make([]byte, 2*len(b))
	for i := 0; i+1 < len(b); i += 2 {
		out[2*i+2], out[2*i+3] = b[i], b[i+1]
	}
	return out
}

// f16ToF32 widens IEEE half-precision values exactly (subnormals, infinities
// and NaNs included).
func f16ToF32(b []byte) []byte {
	v := make([]float32, len(b)/2)
	for i := range v {
		h := uint32(b[2*i]) | uint32(b[2*i+1])<<8
		sign, exp, frac := h>>15, (h>>10)&0x1f, h&0x3ff
		var f float64
		switch exp {
		case 0:
			f = math.Ldexp(float64(frac), -24)
		case 0x1f:
			f = math.Inf(1)
			if frac != 0 {
				f = math.NaN()
			}
		default:
			f = math.Ldexp(float64(frac|0x400), int(exp)-25)
		}
		if sign != 0 {
			f = -f
		}
		v[i] = float32(f)
	}
	return gpu.F32ToBytes(v)
}

// genChunk is the number of elements drawn from one generator: chunks are
// generated in parallel and each has its own stream, so the values do not
// depend on how many goroutines made them.
const genChunk = 1 << 16

// Generate draws random weights of shape c from seed: the same seed gives
// the same bits on every machine.
func Generate(c Config, seed uint64) (*Weights, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	specs, err := Specs(c, Shard{})
	if err != nil {
		return nil, err
	}
	ts := make([]Tensor, len(specs))
	type job struct{ t, chunk int }
	var jobs []job
	for i, sp := range specs {
		ts[i] = Tensor{Name: sp.Name, Shape: slices.Clone(sp.Shape), Data: make([]byte, 4*sp.Elements())}
		for ch := int64(0); ch*genChunk < sp.Elements(); ch++ {
			jobs = append(jobs, job{i, int(ch)})
		}
	}
	work := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range work {
				sp, data := specs[j.t], ts[j.t].Data
				h := fnv.New64a()
				h.Write([]byte(sp.Name))
				r := rand.New(rand.NewPCG(seed, h.Sum64()^uint64(j.chunk)<<40))
				lo := j.chunk * genChunk
				hi := min(lo+genChunk, int(sp.Elements()))
				v := make([]float32, hi-lo)
				for i := range v {
					v[i] = float32(sp.Center + (2*r.Float64()-1)*sp.Spread)
				}
				copy(data[4*lo:], gpu.F32ToBytes(v))
			}
		})
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	return &Weights{Config: c, Tensors: ts, Source: fmt.Sprintf("generated from seed %d (%s)", seed, c)}, nil
}

// Save writes w as a checkpoint Load and transformers read: dir/model.safetensors
// (F32, names without prefix, metadata as given) and dir/config.json, each
// whole or not at all.
func (w *Weights) Save(dir string, metadata map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("gpt2: save: %w", err)
	}
	ts := make([]safetensors.Tensor, len(w.Tensors))
	for i, t := range w.Tensors {
		ts[i] = safetensors.Tensor{Name: t.Name, DType: "F32", Shape: t.Shape, Data: t.Data}
	}
	meta := map[string]string{"format": "pt"}
	for k, v := range metadata {
		meta[k] = v
	}
	if err := safetensors.WriteFile(filepath.Join(dir, WeightsFile), ts, meta); err != nil {
		return fmt.Errorf("gpt2: save: %w", err)
	}
	return WriteConfig(filepath.Join(dir, ConfigFile), w.Config)
}
