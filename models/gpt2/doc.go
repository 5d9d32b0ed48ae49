// Package gpt2 runs GPT-2 on stablegraph: a checkpoint loader, the step
// builder (prefill and decode), sampling, and Batcher, which generates many
// sequences at once with continuous batching. The tokenizer is package
// models/gpt2/tokenizer; `stablegraph generate` puts them together
// (docs/GENERATE.md).
//
// # Checkpoints
//
// Load reads model.safetensors as Hugging Face distributes it (names with
// or without "transformer.", F32, or F16/BF16 widened exactly) with the
// shape from config.json beside it, else from the tensors with GPT-2's head
// count for the width (the only thing the tensors cannot tell). Options of
// GPT2Config that would change the function (another activation, untied
// embeddings, layer-scaled attention) are refused. Every error names the
// tensor or the key.
//
// # Steps
//
// Step.Build declares one forward step over Rows token rows into a program:
// embedding, the blocks, the final norm, the tied LM head, and optionally a
// device argmax. Every row is a token at a position of a KV cache. The same
// builder gives
//
//   - the decode step (RowCaches): row r its own cache param kv<r>, each
//     row a sequence; and
//   - the prefill step (SharedCache): every row the same cache param kv,
//     the rows a prompt's tokens at consecutive positions. The KV append of
//     a layer writes every row's keys and values before the attention of
//     that layer reads any (two launches), so row t attends to positions
//     0..t: causal attention with the decode kernels, checked against a
//     float64 forward (TestPrefillAndDecodeMatchReference).
//
// A row at position kernels.InactiveRow holds no sequence: it does no
// attention work and writes no cache, so a step of B rows serves any
// number of sequences up to B. The workload gpt2-decode builds its step
// here too: there is one builder.
//
// # KV caches
//
// Caches are position-major (kernels/gpt2.go): position t of layer l at
// cache + (t·layers + l)·2·d floats. The address of a position does not
// depend on the cache's capacity, so a cache sized to its sequence's need
// and one of the whole context run the same graph; each layer's launch gets
// the whole cache and the layer as a scalar.
//
// A step declares each cache param at its bound, Step.MaxPositions
// positions: every byte a row may touch, so that every strategy, those
// that copy params (stable, pool) or map them (remap) included, runs the
// step with eager's results. A Batcher still sizes each sequence's cache
// to its need (prompt + budget): it allocates the caches from one region
// whose last MaxPositions-cache of bytes no cache is given (a tail), so
// that the declared range of every cache lies inside the region, over the
// caches after it and the tail. The kernels never reach past a
// sequence's need (its positions stay below it); the declared ranges of
// the rows overlap, which every strategy handles as eager does (the root
// package's overlapping bindings). Inactive rows are bound to the region's
// start. Strategies that work in the caller's memory pay nothing for the
// overlap; stable and pool copy the declared ranges every step, which auto
// measures and rules out.
//
// # Batcher
//
// A Batcher compiles the prefill step (Options.PrefillRows rows) and one
// decode step of Options.Rows rows, binds both to one copy of the weights
// on the device (Executable.BindState), and runs a warm-up step of each
// with every row inactive, so that both graphs are recorded at start-up.
// Generate then loops:
//
//  1. admit: while a row is free and a prompt waits, allocate its cache
//     from a bfc allocator over one region (sized to Request.Positions;
//     when the region is full the retirement queue is drained once, then
//     the prompt waits for a sequence to end), prefill it in chunks
//     (rows past the prompt inactive) and pick its first token;
//  2. decode: one step over the rows, each active row bound to its
//     sequence's cache, the others inactive and bound to the region's
//     start; tokens and positions are written into the step's inputs on
//     the stream;
//  3. read back: greedy rows read the device argmax (12 bytes a row),
//     rows sampling at a temperature alone the device's draw (4 bytes),
//     top-k and top-p rows the device's candidates (8 bytes each) and
//     stats, rows sampling on the host (Options.HostSampling) their
//     logits row; Client.Readback synchronizes the stream and drains the
//     retirement queue;
//  4. finish: a sequence that generated its budget or a stop token, or
//     whose callback said stop, leaves its row; its cache is handed to the
//     client's retirement queue at the point Client.Submitted returned
//     after the step that last used it, and freed into the bfc region once
//     the device has passed that point.
//
// A sequence's cache stays bound to its row for its whole life, so in the
// steady state no binding moves and no graph is re-recorded; a joining
// sequence moves one row's cache binding (patch updates that row's KV
// append and attention nodes, device one pointer). The default strategy is
// auto, which measures patch, device, stable and pool over the first steps
// and keeps the fastest. The stream is the client's, from the stream cache
// (package streamcache).
//
// # Sampling
//
// A sampled token is a Gumbel-max draw: among the tokens kept (all, the
// top K, then the nucleus of TopP), the one of largest logit/T + G_j,
// where G_j is Gumbel noise computed from (seed, the sequence's index in
// the request list, the token's index in the sequence, j) by a
// counter-based generator (kernels.GumbelNoise: Philox4x32-10 and a
// logarithm written with + − × ÷ alone, so that the CUDA kernel and Go
// compute the same bits). That is an exact draw from softmax(logits/T)
// over the kept set, and the noise of a token depends on nothing else, so
// a sequence's tokens are the same alone or in any batch, under any
// strategy (TestAloneOrBatched, TestSampledStrategies), and wherever the
// draw is computed:
//
//   - temperature alone: on the device over the whole row (kernels.Sample's
//     draw), 4 bytes read back a row;
//   - top-k, top-p: the device gives the row's Options.Candidates largest
//     logits, its max and Σ exp((l − max)/T) (kernels.Sample's candidates
//     and stats); the host cuts them to the kept set and takes the
//     Gumbel-max over it with the same noise. When they do not hold the
//     whole kept set (a top-k above Options.Candidates, known before the
//     step, or a nucleus reaching past them) the row's logits are read back
//     and the host draws from them: a fallback, counted in Stats;
//   - Options.HostSampling: every sampled row's logits are read back and
//     drawn on the host (drawLogits), the way a sampler reading logits
//     works; the same tokens (TestDeviceSamplingMatchesHost).
//
// Device sampling is the default because the host way copies B×Vocab
// floats back every step (3.2 MB at B = 16 for GPT-2) and scans them on
// the critical path of the next step, where the kernel adds one launch to
// the graph. Greedy rows use the device argmax unless Options.HostArgmax.
//
// # Masked rows or buckets
//
// One fixed-row decode graph with inactive rows serves every batch
// composition: one recording at start-up, one temp arena, and a joining
// sequence moves only its own row. Its cost is the GEMM work of the
// inactive rows (attention is skipped). Options.Buckets instead compiles a
// decode step per row count and runs the smallest that holds the live
// sequences, packed into its first rows, as frameworks that capture a graph
// per batch size do: less GEMM work when few sequences run, but a graph and
// a temp arena per bucket, recorded at start-up, and sequences change rows
// (their bindings move) as others leave. docs/GENERATE.md has both measured.
//
// # Tensor parallelism
//
// A Step with a Shard of R ranks and the group's communicator (Step.Comm;
// the Shard defaults to the communicator's rank and size) is one rank's
// part of a Megatron-style tensor-parallel step (shard.go): heads/R heads
// and 4d/R MLP columns, column-parallel c_attn and c_fc, row-parallel
// projections, each followed by an all-reduce (sum) inside the program,
// so inside the recorded graph, and its bias added once after it. The
// embeddings, layer norms and LM head are replicated, so every rank
// computes the same logits. Each rank's KV caches hold its heads only
// (Shard.CacheBytes), caller-owned and bound per step like the whole
// model's. Weights.Shard and LoadShard cut a rank's weights from the whole
// model's checkpoint (Specs with the Shard gives their shapes). The logits
// equal the whole model's within float32 reassociation
// (TestTensorParallelMatchesWholeModel: 1e-4). A Batcher runs the whole
// model on one device; the workload gpt2-decode runs the tensor-parallel
// step on its communicator's ranks.
//
// # Concurrency
//
// Weights, Config and Step values are plain data. A StepProgram's Program
// follows the root package's rules. A Batcher is used by one goroutine at
// a time.
package gpt2
