// stablegraph's built-in kernel set in CUDA C. Package kernels (kernels.go)
// is the specification: names, parameter kinds and Go references. Each kernel
// here has exactly the signature of its spec (int for i32, float for f32,
// unsigned long long for u64, pointers for ptr) and the launch geometry of
// kernels.Elementwise or kernels.GemmConfig.
//
// The results are meant to equal the Go references bit for bit where the
// arithmetic allows it: products and sums use the round-to-nearest intrinsics
// (__fmul_rn, __fadd_rn) so that nvcc does not fuse them into FMAs the Go
// compiler does not emit, sums run in the same order as the references, and
// tanh is computed in double and rounded once, as the references do.
//
// Regenerate the PTX with gen.sh (needs nvcc) after any change; a test in
// package kernels fails while kernels/ptx/SOURCE_SHA256 is stale.

// Global index of this thread in a one-dimensional launch, computed in 64
// bits so large grids do not overflow.
__device__ __forceinline__ unsigned long long sg_index() {
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ float sg_tanhf(float x) {
    return (float)tanh((double)x);
}

extern "C" __global__ void sg_fill(float* y, float value, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) y[i] = value;
}

extern "C" __global__ void sg_fill_u64(unsigned long long* y, unsigned long long value, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) y[i] = value;
}

extern "C" __global__ void sg_copy(float* y, const float* x, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) y[i] = x[i];
}

extern "C" __global__ void sg_axpb(float* y, const float* x, float a, float b, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) y[i] = __fadd_rn(__fmul_rn(a, x[i]), b);
}

extern "C" __global__ void sg_axpy(float* y, const float* x, float a, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}

extern "C" __global__ void sg_add(float* z, const float* x, const float* y, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) z[i] = __fadd_rn(x[i], y[i]);
}

extern "C" __global__ void sg_sub_scale(float* z, const float* x, const float* y, float s, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) z[i] = __fmul_rn(s, __fsub_rn(x[i], y[i]));
}

extern "C" __global__ void sg_bias_add(float* y, const float* x, const float* bias, int rows, int cols) {
    unsigned long long i = sg_index();
    if (rows <= 0 || cols <= 0) return;
    if (i < (unsigned long long)rows * (unsigned long long)cols) {
        y[i] = __fadd_rn(x[i], bias[i % (unsigned long long)cols]);
    }
}

extern "C" __global__ void sg_bias_tanh(float* y, const float* x, const float* bias, int rows, int cols) {
    unsigned long long i = sg_index();
    if (rows <= 0 || cols <= 0) return;
    if (i < (unsigned long long)rows * (unsigned long long)cols) {
        y[i] = sg_tanhf(__fadd_rn(x[i], bias[i % (unsigned long long)cols]));
    }
}

extern "C" __global__ void sg_tanh(float* y, const float* x, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) y[i] = sg_tanhf(x[i]);
}

// Go's max(x, 0) for float32: NaN stays NaN and -0 becomes +0.
extern "C" __global__ void sg_relu(float* y, const float* x, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) {
        float v = x[i];
        y[i] = (v != v) ? v : (v > 0.0f ? v : 0.0f);
    }
}

extern "C" __global__ void sg_tanh_backward(float* dx, const float* dy, const float* y, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) {
        float yv = y[i];
        dx[i] = __fmul_rn(dy[i], __fsub_rn(1.0f, __fmul_rn(yv, yv)));
    }
}

extern "C" __global__ void sg_relu_backward(float* dx, const float* dy, const float* x, int n) {
    unsigned long long i = sg_index();
    if (i < (unsigned long long)max(n, 0)) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

// One thread per column; rows are summed in order, as the reference does.
extern "C" __global__ void sg_bias_grad(float* db, const float* dy, int rows, int cols) {
    unsigned long long c = sg_index();
    if (cols <= 0 || c >= (unsigned long long)cols) return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++) {
        s = __fadd_rn(s, dy[(unsigned long long)r * cols + c]);
    }
    db[c] = s;
}

#define SG_TILE 16

// C[m×n] = alpha·op(A)·op(B) + beta·C, row-major, one thread per element of
// C in 16×16 blocks (x covers columns, y rows). Tiles of op(A) and op(B) go
// through shared memory; each thread accumulates its dot product in order
// l = 0..k-1 without FMA, as the reference does. When beta is 0, C is not
// read (it may hold NaN or be uninitialised).
extern "C" __global__ void sg_gemm(float* c, const float* a, const float* b, int m, int n, int k,
                                   int transA, int transB, float alpha, float beta) {
    __shared__ float as[SG_TILE][SG_TILE];
    __shared__ float bs[SG_TILE][SG_TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * SG_TILE + ty;
    int col = blockIdx.x * SG_TILE + tx;
    float s = 0.0f;
    for (int t = 0; t < k; t += SG_TILE) {
        // as[ty][tx] = op(A)[row][t+tx]; bs[ty][tx] = op(B)[t+ty][col].
        int la = t + tx, lb = t + ty;
        float av = 0.0f, bv = 0.0f;
        if (row < m && la < k) {
            av = transA ? a[(unsigned long long)la * m + row] : a[(unsigned long long)row * k + la];
        }
        if (col < n && lb < k) {
            bv = transB ? b[(unsigned long long)col * k + lb] : b[(unsigned long long)lb * n + col];
        }
        as[ty][tx] = av;
        bs[ty][tx] = bv;
        __syncthreads();
        int lim = min(SG_TILE, k - t);
        for (int l = 0; l < lim; l++) {
            s = __fadd_rn(s, __fmul_rn(as[ty][l], bs[l][tx]));
        }
        __syncthreads();
    }
    if (row < m && col < n) {
        unsigned long long idx = (unsigned long long)row * n + col;
        if (beta != 0.0f) {
            c[idx] = __fadd_rn(__fmul_rn(alpha, s), __fmul_rn(beta, c[idx]));
        } else {
            c[idx] = __fmul_rn(alpha, s);
        }
    }
}

// ---------------------------------------------------------------------------
// Transformer decode (kernels/gpt2.go has the specification: argument order,
// the position-major KV-cache layout, inactive rows, what bad input does). float32 data; token
// ids and positions are int32 arrays read from device memory, so that a step
// graph does not change with them. Sums that are reductions (layer norm,
// attention) run in a fixed order per launch shape, so a kernel gives the
// same bits every run; the Go references compute them in double and the
// conformance tests compare within a tolerance.

#define SG_MAX_SEQS 8
#define SG_INACTIVE_ROW (-1)
#define SG_ATTN_UNROLL 4
#define SG_FULL_MASK 0xffffffffu

// GELU's tanh form in double, rounded once (the constant is the reference's
// geluC). __dmul_rn/__dadd_rn keep nvcc from contracting into FMAs.
__device__ __forceinline__ float sg_gelu(float xf) {
    double v = (double)xf;
    double v3 = __dmul_rn(__dmul_rn(v, v), v);
    double u = __dmul_rn(0.7978845608028654, __dadd_rn(v, __dmul_rn(0.044715, v3)));
    return (float)__dmul_rn(__dmul_rn(0.5, v), __dadd_rn(1.0, tanh(u)));
}

// Cache i of a launch's eight cache arguments.
__device__ __forceinline__ float* sg_pick(int i, float* c0, float* c1, float* c2, float* c3,
                                          float* c4, float* c5, float* c6, float* c7) {
    switch (i) {
    case 0: return c0;
    case 1: return c1;
    case 2: return c2;
    case 3: return c3;
    case 4: return c4;
    case 5: return c5;
    case 6: return c6;
    default: return c7;
    }
}

// Block-wide sum and max of v over a one-dimensional block of whole warps:
// a butterfly within each warp, then every thread adds the warp results in
// warp order, so all threads return the same value. red holds 32 floats.
__device__ __forceinline__ float sg_block_sum(float v, float* red) {
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(SG_FULL_MASK, v, off));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads(); // red may still be read by a previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < nwarps; w++) s = __fadd_rn(s, red[w]);
    return s;
}

__device__ __forceinline__ float sg_block_max(float v, float* red) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(SG_FULL_MASK, v, off));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < nwarps; w++) m = fmaxf(m, red[w]);
    return m;
}

extern "C" __global__ void sg_embed(float* y, const float* wte, const float* wpe, const int* tokens,
                                    const int* positions, int rows, int d, int vocab, int npos) {
    unsigned long long i = sg_index();
    if (rows <= 0 || d <= 0 || i >= (unsigned long long)rows * (unsigned long long)d) return;
    unsigned long long r = i / d, c = i % d;
    int tok = tokens[r], pos = positions[r];
    if (pos == SG_INACTIVE_ROW) { // a row holding no sequence: zeros, its token unread
        y[i] = 0.0f;
        return;
    }
    if (tok < 0 || tok >= vocab || pos < 0 || pos >= npos) {
        y[i] = __int_as_float(0x7fc00000); // NaN: a bad id cannot be reported otherwise
        return;
    }
    y[i] = __fadd_rn(wte[(unsigned long long)tok * d + c], wpe[(unsigned long long)pos * d + c]);
}

// One block per row: the mean, then the biased variance around it, then the
// normalised row. y may be x: each thread writes only elements it read.
extern "C" __global__ void sg_layernorm(float* y, const float* x, const float* gamma, const float* beta,
                                        int rows, int cols, float eps) {
    __shared__ float red[32];
    int r = blockIdx.x;
    if (r >= rows || cols <= 0) return;
    const float* xr = x + (unsigned long long)r * cols;
    float* yr = y + (unsigned long long)r * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s = __fadd_rn(s, xr[c]);
    float mean = __fdiv_rn(sg_block_sum(s, red), (float)cols);
    float v = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float dv = __fsub_rn(xr[c], mean);
        v = __fadd_rn(v, __fmul_rn(dv, dv));
    }
    float var = __fdiv_rn(sg_block_sum(v, red), (float)cols);
    float rstd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float n = __fmul_rn(__fsub_rn(xr[c], mean), rstd);
        yr[c] = __fadd_rn(__fmul_rn(n, gamma[c]), beta[c]);
    }
}

extern "C" __global__ void sg_bias_gelu(float* y, const float* x, const float* bias, int rows, int cols) {
    unsigned long long i = sg_index();
    if (rows <= 0 || cols <= 0) return;
    if (i < (unsigned long long)rows * (unsigned long long)cols) {
        y[i] = sg_gelu(__fadd_rn(x[i], bias[i % (unsigned long long)cols]));
    }
}

extern "C" __global__ void sg_bias_residual(float* x, const float* a, const float* bias, int rows, int cols) {
    unsigned long long i = sg_index();
    if (rows <= 0 || cols <= 0) return;
    if (i < (unsigned long long)rows * (unsigned long long)cols) {
        x[i] = __fadd_rn(x[i], __fadd_rn(a[i], bias[i % (unsigned long long)cols]));
    }
}

// One thread per (row, column): q gets its bias; k and v, with theirs, go
// to position positions[i] of layer `layer` of cache i (keys at
// ci + (pos·layers + layer)·2·d, values d floats further: kernels/gpt2.go,
// KV caches). An inactive row writes no cache.
extern "C" __global__ void sg_kv_append(float* q, const float* qkv, const float* bias, const int* positions,
                                        float* c0, float* c1, float* c2, float* c3,
                                        float* c4, float* c5, float* c6, float* c7,
                                        int nseq, int d, int layers, int layer, int npos) {
    unsigned long long t = sg_index();
    if (nseq <= 0 || nseq > SG_MAX_SEQS || d <= 0 || layer < 0 || layer >= layers) return;
    if (t >= (unsigned long long)nseq * (unsigned long long)d) return;
    int i = (int)(t / d), c = (int)(t % d);
    const float* row = qkv + (unsigned long long)i * 3 * d;
    q[(unsigned long long)i * d + c] = __fadd_rn(row[c], bias[c]);
    int pos = positions[i];
    if (pos < 0 || pos >= npos) return; // inactive, or the attention writes NaN for this row
    float* cache = sg_pick(i, c0, c1, c2, c3, c4, c5, c6, c7) +
                   ((unsigned long long)pos * layers + layer) * 2ULL * (unsigned long long)d;
    cache[c] = __fadd_rn(row[d + c], bias[d + c]);
    cache[(unsigned long long)d + c] = __fadd_rn(row[2 * d + c], bias[2 * d + c]);
}

// One block per (head, sequence): blockIdx.x is the head, blockIdx.y the
// sequence. Dynamic shared memory, in floats: the query (headDim), the
// scores (npos), the partial sums of the weighted sum (max(blockDim.x,
// headDim)), 32 of reduction scratch (kernels.DecodeAttentionConfig).
// Scores: a warp per position (four at a time), lanes over the head's
// columns. Softmax over
// the first positions[i]+1 scores. Weighted sum: the positions split into
// blockDim.x/headDim interleaved parts per column, added in part order.
extern "C" __global__ void sg_decode_attention(float* out, const float* q, const int* positions,
                                               float* c0, float* c1, float* c2, float* c3,
                                               float* c4, float* c5, float* c6, float* c7,
                                               int nseq, int heads, int headDim, int layers, int layer, int npos,
                                               float scale) {
    extern __shared__ float sm[];
    int h = blockIdx.x, i = blockIdx.y;
    if (i >= nseq || i >= SG_MAX_SEQS || h >= heads || headDim <= 0 || npos <= 0) return;
    if (layer < 0 || layer >= layers) return;
    int tid = threadIdx.x, nthreads = blockDim.x;
    float* qs = sm;
    float* sc = qs + headDim;
    float* part = sc + npos;
    float* red = part + max(nthreads, headDim);
    unsigned long long d = (unsigned long long)heads * headDim;
    float* o = out + (unsigned long long)i * d + (unsigned long long)h * headDim;
    int pos = positions[i];
    if (pos == SG_INACTIVE_ROW) { // a row holding no sequence: zeros, no cache read
        for (int j = tid; j < headDim; j += nthreads) o[j] = 0.0f;
        return;
    }
    if (pos < 0 || pos >= npos) {
        for (int j = tid; j < headDim; j += nthreads) o[j] = __int_as_float(0x7fc00000);
        return;
    }
    int len = pos + 1;
    const float* cache = sg_pick(i, c0, c1, c2, c3, c4, c5, c6, c7);
    const float* K = cache + (unsigned long long)layer * 2ULL * d + (unsigned long long)h * headDim;
    const float* V = K + d;
    unsigned long long st = (unsigned long long)layers * 2ULL * d; // floats between positions
    for (int j = tid; j < headDim; j += nthreads) qs[j] = q[(unsigned long long)i * d + (unsigned long long)h * headDim + j];
    __syncthreads();

    // Each warp takes SG_ATTN_UNROLL positions at a time, so that their
    // loads are in flight together; per position the sum is the same as one
    // at a time (lane-strided, then the butterfly), so the unroll does not
    // change the bits.
    int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
    for (int t0 = warp * SG_ATTN_UNROLL; t0 < len; t0 += nwarps * SG_ATTN_UNROLL) {
        float s[SG_ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < SG_ATTN_UNROLL; u++) s[u] = 0.0f;
        for (int j = lane; j < headDim; j += 32) {
            float qv = qs[j];
#pragma unroll
            for (int u = 0; u < SG_ATTN_UNROLL; u++) {
                if (t0 + u < len) s[u] = __fadd_rn(s[u], __fmul_rn(qv, K[(unsigned long long)(t0 + u) * st + j]));
            }
        }
#pragma unroll
        for (int u = 0; u < SG_ATTN_UNROLL; u++) {
            float v = s[u];
            for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(SG_FULL_MASK, v, off));
            if (lane == 0 && t0 + u < len) sc[t0 + u] = __fmul_rn(v, scale);
        }
    }
    __syncthreads();

    float m = __int_as_float(0xff800000); // -inf
    for (int t = tid; t < len; t += nthreads) m = fmaxf(m, sc[t]);
    m = sg_block_max(m, red);
    float sum = 0.0f;
    for (int t = tid; t < len; t += nthreads) {
        float e = expf(__fsub_rn(sc[t], m));
        sc[t] = e;
        sum = __fadd_rn(sum, e);
    }
    sum = sg_block_sum(sum, red); // its barriers also publish sc

    int parts = nthreads >= headDim ? nthreads / headDim : 1;
    for (int jj = tid; jj < headDim * parts; jj += nthreads) {
        int j = jj % headDim, p = jj / headDim;
        float acc = 0.0f;
        for (int t = p; t < len; t += parts) acc = __fadd_rn(acc, __fmul_rn(sc[t], V[(unsigned long long)t * st + j]));
        part[jj] = acc;
    }
    __syncthreads();
    for (int j = tid; j < headDim; j += nthreads) {
        float a = 0.0f;
        for (int p = 0; p < parts; p++) a = __fadd_rn(a, part[p * headDim + j]);
        o[j] = __fdiv_rn(a, sum);
    }
}

// One block per row: each thread scans a strided part of the row keeping
// its first maximum and the runner-up, then the block reduces the pairs
// through shared memory, the lower index winning a tie (torch.argmax's
// rule). NaNs are skipped.
extern "C" __global__ void sg_argmax(int* next, float* top, const float* logits, int rows, int vocab) {
    __shared__ float v1[1024], v2[1024];
    __shared__ int ix[1024];
    int r = blockIdx.x, tid = threadIdx.x, n = blockDim.x;
    if (r >= rows || vocab <= 0 || n > 1024) return;
    const float* x = logits + (unsigned long long)r * vocab;
    float b1 = __int_as_float(0xff800000), b2 = b1; // -inf
    int bi = 0x7fffffff;
    for (int j = tid; j < vocab; j += n) {
        float v = x[j];
        if (v != v) continue;
        if (v > b1) {
            b2 = b1;
            b1 = v;
            bi = j;
        } else if (v > b2) {
            b2 = v;
        }
    }
    v1[tid] = b1;
    v2[tid] = b2;
    ix[tid] = bi;
    __syncthreads();
    for (int off = n / 2; off > 0; off >>= 1) {
        if (tid < off) {
            float a1 = v1[tid], a2 = v2[tid], c1 = v1[tid + off], c2 = v2[tid + off];
            int ai = ix[tid], ci = ix[tid + off];
            if (c1 > a1 || (c1 == a1 && ci < ai)) {
                v1[tid] = c1;
                ix[tid] = ci;
                v2[tid] = fmaxf(a1, c2);
            } else {
                v2[tid] = fmaxf(a2, c1);
            }
        }
        __syncthreads();
    }
    if (tid == 0) {
        next[r] = ix[0] == 0x7fffffff ? 0 : ix[0];
        top[2 * r] = v1[0];
        top[2 * r + 1] = v2[0];
    }
}

// ---------------------------------------------------------------- sampling
//
// sg_sample (kernels/sample.go): per row, a Gumbel-max draw over the whole
// row and/or the row's top-kmax candidates with the row's max and Z. The
// noise is Philox4x32-10 turned into a uniform and two logarithms computed
// with round-to-nearest +, ×, ÷ alone, in the order of the Go reference
// (gumbelLog), so the draw equals the reference's bit for bit.

#define SG_SAMPLE_MAXK 256
#define SG_NONE 0x7fffffff

// 1/(2i+1) for i < 12, the doubles nearest (kernels.gumbelSeries; a test
// in package kernels checks these literals).
__constant__ double sg_glog_c[12] = {
    1.0, 0.33333333333333331, 0.20000000000000001, 0.14285714285714285,
    0.1111111111111111, 0.090909090909090912, 0.076923076923076927, 0.066666666666666666,
    0.058823529411764705, 0.052631578947368418, 0.047619047619047616, 0.043478260869565216,
};

__device__ __forceinline__ void sg_philox(unsigned* c, unsigned k0, unsigned k1) {
    for (int i = 0; i < 10; i++) {
        if (i > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        unsigned hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        unsigned n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}

// log x of a positive normal x: x = 2^k·m, m in [√½, √2), s = (m−1)/(m+1),
// log m = 2s·Σ s^{2i}/(2i+1), k·ln 2 in two parts.
__device__ double sg_glog(double x) {
    unsigned long long b = (unsigned long long)__double_as_longlong(x);
    long long k = (long long)((b >> 52) & 0x7ffull) - 1023;
    double m = __longlong_as_double((long long)((b & 0xfffffffffffffull) | (1023ull << 52)));
    if (m > 1.4142135623730951) {
        m = __dmul_rn(m, 0.5);
        k++;
    }
    double s = __ddiv_rn(__dadd_rn(m, -1.0), __dadd_rn(m, 1.0));
    double s2 = __dmul_rn(s, s);
    double p = sg_glog_c[11];
    for (int i = 10; i >= 0; i--) p = __dadd_rn(__dmul_rn(p, s2), sg_glog_c[i]);
    double kf = (double)k;
    return __dadd_rn(__dmul_rn(kf, 6.93147180369123816490e-01),
                     __dadd_rn(__dmul_rn(__dmul_rn(2.0, s), p), __dmul_rn(kf, 1.90821492927058770002e-10)));
}

__device__ double sg_gumbel(unsigned long long seed, unsigned seq, unsigned index, unsigned id) {
    unsigned c[4] = {id >> 1, index, seq, 0u};
    sg_philox(c, (unsigned)seed, (unsigned)(seed >> 32));
    unsigned lo = (id & 1u) ? c[2] : c[0];
    unsigned hi = (id & 1u) ? c[3] : c[1];
    unsigned long long bits = ((unsigned long long)hi << 32) | lo;
    double u = __dmul_rn(__dadd_rn((double)(bits >> 12), 0.5), 2.220446049250313080847263336181640625e-16);
    return -sg_glog(-sg_glog(u));
}

// Larger value first, then the lower id; NaN below every number.
__device__ __forceinline__ unsigned long long sg_sample_key(float v, int id) {
    unsigned b = __float_as_uint(v);
    if (v != v) {
        b = 0;
    } else if (b & 0x80000000u) {
        b = ~b;
    } else {
        b |= 0x80000000u;
    }
    return ((unsigned long long)b << 32) | (unsigned long long)(~(unsigned)id);
}

extern "C" __global__ void sg_sample(int* draw, unsigned* cand, double* stats, const float* logits,
                                     const unsigned* params, int rows, int vocab, int kmax) {
    __shared__ double sd[1024];
    __shared__ int si[1024];
    __shared__ unsigned hist[256];
    __shared__ unsigned long long ck[SG_SAMPLE_MAXK];
    __shared__ unsigned long long s_prefix, s_mask;
    __shared__ unsigned s_need;
    __shared__ int s_done, s_count;
    __shared__ double s_m;
    int r = blockIdx.x, tid = threadIdx.x, n = blockDim.x;
    if (r >= rows || vocab <= 0 || kmax < 1 || kmax > SG_SAMPLE_MAXK || n > 1024 || n < 32) return;
    const float* x = logits + (unsigned long long)r * vocab;
    // Word by word: the params need only 4-byte alignment.
    const unsigned* pr = params + (unsigned long long)r * 8;
    unsigned long long seed = ((unsigned long long)pr[1] << 32) | pr[0];
    unsigned seq = pr[2], index = pr[3];
    double temp = __hiloint2double((int)pr[5], (int)pr[4]);
    unsigned flags = pr[6];
    unsigned* out = cand + (unsigned long long)r * kmax * 2;

    if (!(flags & 1u)) {
        if (tid == 0) draw[r] = -1;
    } else {
        double bs = 0;
        int bi = SG_NONE;
        for (int j = tid; j < vocab; j += n) {
            float v = x[j];
            double s = temp > 0 ? __dadd_rn(__ddiv_rn((double)v, temp), sg_gumbel(seed, seq, index, (unsigned)j)) : (double)v;
            if (s != s) continue;
            if (bi == SG_NONE || s > bs) {
                bs = s;
                bi = j;
            }
        }
        sd[tid] = bs;
        si[tid] = bi;
        __syncthreads();
        for (int off = n / 2; off > 0; off >>= 1) {
            if (tid < off) {
                double a = sd[tid], c = sd[tid + off];
                int ai = si[tid], ci = si[tid + off];
                if (ci != SG_NONE && (ai == SG_NONE || c > a || (c == a && ci < ai))) {
                    sd[tid] = c;
                    si[tid] = ci;
                }
            }
            __syncthreads();
        }
        if (tid == 0) draw[r] = si[0] == SG_NONE ? 0 : si[0];
        __syncthreads();
    }

    if (!(flags & 2u)) {
        for (int i = tid; i < kmax; i += n) {
            out[2 * i] = 0xffffffffu;
            out[2 * i + 1] = 0xff800000u;
        }
        if (tid == 0) {
            stats[2 * r] = __longlong_as_double((long long)0xfff0000000000000ull);
            stats[2 * r + 1] = 0;
        }
        return;
    }
    // Radix select of the K largest keys (keys are unique: the id is in
    // them), 8 bits at a time from the top, until the bin holding the K-th
    // holds exactly what is still needed.
    int K = min(kmax, vocab);
    if (tid == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_need = (unsigned)K;
        s_done = 0;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += n) hist[i] = 0;
        __syncthreads();
        unsigned long long prefix = s_prefix, mask = s_mask;
        for (int j = tid; j < vocab; j += n) {
            unsigned long long key = sg_sample_key(x[j], j);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid < 32) {
            // Lane l holds bins 255−8l down to 248−8l: a scan over the lanes
            // counts the keys in the bins above each lane's.
            unsigned need = s_need, c[8], sum = 0;
            for (int i = 0; i < 8; i++) {
                c[i] = hist[255 - 8 * tid - i];
                sum += c[i];
            }
            unsigned incl = sum;
            for (int off = 1; off < 32; off <<= 1) {
                unsigned v = __shfl_up_sync(0xffffffffu, incl, off);
                if (tid >= off) incl += v;
            }
            unsigned acc = incl - sum;
            if (acc < need && need <= incl) {
                for (int i = 0; i < 8; i++) {
                    if (acc + c[i] >= need) {
                        s_prefix = prefix | ((unsigned long long)(255 - 8 * tid - i) << shift);
                        s_mask = mask | (255ull << shift);
                        s_need = need - acc;
                        s_done = c[i] == need - acc;
                        break;
                    }
                    acc += c[i];
                }
            }
        }
        __syncthreads();
        if (s_done) break;
    }
    if (tid == 0) s_count = 0;
    __syncthreads();
    {
        unsigned long long prefix = s_prefix, mask = s_mask;
        for (int j = tid; j < vocab; j += n) {
            unsigned long long key = sg_sample_key(x[j], j);
            if ((key & mask) >= prefix) {
                int slot = atomicAdd(&s_count, 1);
                if (slot < SG_SAMPLE_MAXK) ck[slot] = key;
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < K; i += n) {
        unsigned long long k = ck[i];
        int rank = 0;
        for (int q = 0; q < K; q++) rank += ck[q] > k;
        unsigned id = ~(unsigned)k;
        float v = x[id];
        out[2 * rank] = id;
        out[2 * rank + 1] = __float_as_uint(v);
        if (rank == 0) s_m = v == v ? (double)v : __longlong_as_double((long long)0xfff0000000000000ull);
    }
    for (int i = K + tid; i < kmax; i += n) {
        out[2 * i] = 0xffffffffu;
        out[2 * i + 1] = 0xff800000u;
    }
    __syncthreads();
    double m = s_m, t = temp > 0 ? temp : 1.0, z = 0;
    if (m != __longlong_as_double((long long)0xfff0000000000000ull)) {
        for (int j = tid; j < vocab; j += n) {
            float v = x[j];
            if (v == v) z += exp(((double)v - m) / t);
        }
    }
    sd[tid] = z;
    __syncthreads();
    for (int off = n / 2; off > 0; off >>= 1) {
        if (tid < off) sd[tid] += sd[tid + off];
        __syncthreads();
    }
    if (tid == 0) {
        stats[2 * r] = m;
        stats[2 * r + 1] = sd[0];
    }
}
