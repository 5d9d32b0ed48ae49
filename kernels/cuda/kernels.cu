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
