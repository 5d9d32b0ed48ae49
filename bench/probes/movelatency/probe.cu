// Probe: what moving a step's input and output costs a step awaited before
// the next (latency) and its host, with no stablegraph code: the mlp
// workload's graph (L layers of a cuBLAS SGEMM and a bias+tanh kernel,
// captured), its input x and output y at new addresses every step, moved
// six ways, each step timed beside the unmoved graph's (floor):
//
//   node     the moved kernel nodes set on the exec (cuGraphExecKernelNodeSetParams), launch
//   whole    the moved nodes set on a host template, one cuGraphExecUpdate, launch
//   dev-inl  the moved nodes device-updatable; a patcher kernel node in front of the first
//            GEMM, whose own parameters carry the new addresses (one exec update of it), launch
//   dev-tbl  the same patcher reading the new addresses from mapped host memory: launch only
//   dev-idle dev-tbl's graph with nothing moving: what the patcher and device-updatable
//            nodes cost with no move at all
//   node-fn  as node, each node named by its CUfunction alone (no CUkernel, no context), as
//            stablegraph's prepared node sets name it
//   expl-node node-fn on the captured kernels added one by one to a graph of their own (each
//            after the one before, named by its CUfunction), as stablegraph builds its graphs
//   expl-idle that graph launched unchanged
//
// host: from the first driver call of the step to the launch's return; launch: the launch
// call alone; lat: from the first call to the return of a stream synchronization (a step
// awaited before the next); GPU: 100 launches back to back between two events (the ways
// that update from the host launch their exec unchanged there; dev-tbl, whose table the
// host must not rewrite while a launch may still read it, has none). host-flr and lat×flr
// are medians of the per-step differences and ratios against the floor's step beside it.
// H2D=1 writes the input before each step as the bench's caller does, GATE=1 holds the
// stream behind a word of mapped memory while the host moves and launches (the bench's
// gated timing): README.md has what they changed (nothing). NBUF=N cycles the moving ways
// through N pairs of x and y (default 2; the floor keeps the first).
//
// The moved nodes and their pointer words are found as stablegraph finds them: two captures
// at different x and y, parameters compared word by word (cuFuncGetParamInfo). cuBLAS gets a
// workspace of its own, so that the captures hold no allocation node.
// Build: nvcc -O3 -arch=sm_90 -rdc=true probe.cu -lcublas -lcuda -lcudadevrt -o movelatency
// Run:   movelatency [layers width batch steps]   (mlp: 8 256 8; mlp-large: 8 1024 64)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t b_ = (x); if (b_ != CUBLAS_STATUS_SUCCESS) { printf("FAIL %s:%d %s: %d\n", __FILE__, __LINE__, #x, (int)b_); exit(1); } } while (0)

__global__ void bias_tanh(float* h, const float* z, const float* b, int rows, int w) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * w) h[i] = tanhf(z[i] + b[i % w]);
}

// A pointer word to write on the device: node, byte offset in its parameters.
struct Slot { cudaGraphDeviceNode_t node; unsigned off; unsigned which; };  // which: 0 x, 1 y
#define MAXSLOTS 8
struct Inline { Slot s[MAXSLOTS]; unsigned n; unsigned long long v[2]; };

__global__ void patch_inline(Inline a) {
  unsigned i = threadIdx.x;
  if (i < a.n) cudaGraphKernelNodeSetParam(a.s[i].node, a.s[i].off, &a.v[a.s[i].which], 8);
}
__global__ void patch_table(Inline a, const volatile unsigned long long* tbl) {
  unsigned i = threadIdx.x;
  if (i < a.n) { unsigned long long v = tbl[a.s[i].which]; cudaGraphKernelNodeSetParam(a.s[i].node, a.s[i].off, &v, 8); }
}

static double now_us() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

struct Net {
  int L, W, B;
  cublasHandle_t h;
  cudaStream_t s;
  std::vector<float*> w, b, z, a;  // a[l]: activation of layer l (a[0], a[L] bound per capture)
};

static cudaGraph_t capture(Net& n, float* x, float* y) {
  n.a[0] = x; n.a[n.L] = y;
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(n.s, cudaStreamCaptureModeThreadLocal));
  const float one = 1, zero = 0;
  for (int l = 1; l <= n.L; l++) {
    // row-major z[B×W] = a[B×W]·w[W×W], as column-major zᵀ = wᵀ·aᵀ
    CB(cublasSgemm(n.h, CUBLAS_OP_N, CUBLAS_OP_N, n.W, n.B, n.W, &one, n.w[l], n.W, n.a[l - 1], n.W, &zero, n.z[l], n.W));
    bias_tanh<<<(n.B * n.W + 255) / 256, 256, 0, n.s>>>(n.a[l], n.z[l], n.b[l], n.B, n.W);
  }
  CK(cudaStreamEndCapture(n.s, &g));
  return g;
}

static std::vector<CUgraphNode> kernelNodes(cudaGraph_t g) {
  size_t cnt = 0;
  CU(cuGraphGetNodes((CUgraph)g, nullptr, &cnt));
  std::vector<CUgraphNode> all(cnt), k;
  CU(cuGraphGetNodes((CUgraph)g, all.data(), &cnt));
  for (auto nd : all) { CUgraphNodeType t; CU(cuGraphNodeGetType(nd, &t)); if (t == CU_GRAPH_NODE_TYPE_KERNEL) k.push_back(nd); }
  return k;
}

static CUfunction funcOf(const CUDA_KERNEL_NODE_PARAMS& p) {
  if (p.func) return p.func;
  CUfunction f; CU(cuKernelGetFunction(&f, p.kern)); return f;
}

// The parameter bytes of a kernel node, packed as the kernel sees them.
static std::vector<unsigned char> packed(CUgraphNode nd) {
  CUDA_KERNEL_NODE_PARAMS p; CU(cuGraphKernelNodeGetParams(nd, &p));
  CUfunction f = funcOf(p);
  std::vector<unsigned char> out;
  for (unsigned i = 0;; i++) {
    size_t off, sz;
    if (cuFuncGetParamInfo(f, i, &off, &sz) != CUDA_SUCCESS) break;
    if (out.size() < off + sz) out.resize(off + sz);
    memcpy(out.data() + off, p.kernelParams[i], sz);
  }
  return out;
}

struct Moved { int idx; std::vector<unsigned> offs; std::vector<unsigned> which; };

int main(int argc, char** argv) {
  Net n;
  n.L = argc > 1 ? atoi(argv[1]) : 8; n.W = argc > 2 ? atoi(argv[2]) : 1024; n.B = argc > 3 ? atoi(argv[3]) : 64;
  int steps = argc > 4 ? atoi(argv[4]) : 300;
  CU(cuInit(0));
  int drv; CK(cudaDriverGetVersion(&drv)); cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
  printf("device %s driver %d; mlp layers=%d width=%d batch=%d, %d steps per way\n", pr.name, drv, n.L, n.W, n.B, steps);
  CK(cudaStreamCreateWithFlags(&n.s, cudaStreamNonBlocking));
  CB(cublasCreate(&n.h)); CB(cublasSetStream(n.h, n.s));
  // A workspace of its own, so that a capture holds no allocation node (a graph with one can be
  // instantiated only once at a time) and its kernels point into the same workspace every time.
  void* ws; size_t wsz = 32 << 20; CK(cudaMalloc(&ws, wsz)); CB(cublasSetWorkspace(n.h, ws, wsz));
  size_t act = (size_t)n.B * n.W * 4;
  n.w.resize(n.L + 1); n.b.resize(n.L + 1); n.z.resize(n.L + 1); n.a.resize(n.L + 1);
  std::vector<float> hw((size_t)n.W * n.W), hx((size_t)n.B * n.W);
  for (size_t i = 0; i < hw.size(); i++) hw[i] = ((i * 2654435761u) % 1000) / 1000.0f / n.W;
  for (size_t i = 0; i < hx.size(); i++) hx[i] = ((i * 40503u) % 1000) / 1000.0f;
  for (int l = 1; l <= n.L; l++) {
    CK(cudaMalloc(&n.w[l], hw.size() * 4)); CK(cudaMemcpy(n.w[l], hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&n.b[l], n.W * 4)); CK(cudaMemset(n.b[l], 0, n.W * 4));
    CK(cudaMalloc(&n.z[l], act));
    if (l < n.L) CK(cudaMalloc(&n.a[l], act));
  }
  // NBUF pairs of x and y (default 2): the moving ways cycle through them, the floor keeps the
  // first. Many pairs are fresh addresses to the GPU's caches as well as to the graph.
  const int nbuf = getenv("NBUF") ? std::max(2, atoi(getenv("NBUF"))) : 2;
  std::vector<float*> x(nbuf), y(nbuf);
  for (int i = 0; i < nbuf; i++) {
    CK(cudaMalloc(&x[i], act)); CK(cudaMalloc(&y[i], act));
    CK(cudaMemcpy(x[i], hx.data(), act, cudaMemcpyHostToDevice));
  }
  capture(n, x[0], y[0]);  // warm cuBLAS up (its heuristics, workspace) outside the timed graphs
  {
    cudaGraph_t g0 = capture(n, x[0], y[0]); CK(cudaGraphDestroy(g0));
  }
  std::vector<cudaGraph_t> g(nbuf);
  std::vector<std::vector<CUgraphNode>> k(nbuf);
  for (int i = 0; i < nbuf; i++) { g[i] = capture(n, x[i], y[i]); k[i] = kernelNodes(g[i]); }
  if (k[0].size() != k[1].size()) { printf("FAIL: captures differ in kernel nodes\n"); return 1; }
  std::vector<Moved> moved;
  for (size_t i = 0; i < k[0].size(); i++) {
    auto p0 = packed(k[0][i]), p1 = packed(k[1][i]);
    if (p0.size() != p1.size()) { printf("FAIL: node %zu parameter sizes differ\n", i); return 1; }
    Moved m{(int)i, {}, {}};
    for (size_t o = 0; o + 8 <= p0.size(); o += 8) {
      unsigned long long v0, v1; memcpy(&v0, &p0[o], 8); memcpy(&v1, &p1[o], 8);
      if (v0 == v1) continue;
      unsigned wh = (v0 == (unsigned long long)x[0] && v1 == (unsigned long long)x[1]) ? 0 : (v0 == (unsigned long long)y[0] && v1 == (unsigned long long)y[1]) ? 1 : 9;
      if (wh == 9) { printf("note: node %zu word %zu differs between the captures but is neither x nor y (kept)\n", i, o); continue; }
      m.offs.push_back((unsigned)o); m.which.push_back(wh);
    }
    if (!m.offs.empty()) moved.push_back(m);
  }
  printf("kernel nodes %zu; moved:", k[0].size());
  for (auto& m : moved) printf(" node %d (%zu B of parameters, %zu words)", m.idx, packed(k[0][m.idx]).size(), m.offs.size());
  printf("\n");

  // floor, node and whole: plain execs of capture 0. whole sets a template (a clone) per step.
  cudaGraphExec_t fl, nd, wh, nf; CK(cudaGraphInstantiate(&fl, g[0], 0)); CK(cudaGraphInstantiate(&nd, g[0], 0)); CK(cudaGraphInstantiate(&wh, g[0], 0)); CK(cudaGraphInstantiate(&nf, g[0], 0));
  cudaGraph_t tmpl; CK(cudaGraphClone(&tmpl, g[0]));
  std::vector<CUgraphNode> kt = kernelNodes(tmpl);
  // expl: the captured kernels added one by one to a graph of their own, each after the one
  // before and named by its CUfunction, as stablegraph builds its graphs.
  cudaGraph_t ge; CU(cuGraphCreate((CUgraph*)&ge, 0));
  std::vector<CUgraphNode> ke;
  for (auto nd0 : k[0]) {
    CUDA_KERNEL_NODE_PARAMS p; CU(cuGraphKernelNodeGetParams(nd0, &p));
    p.func = funcOf(p); p.kern = nullptr; p.ctx = nullptr;
    CUgraphNode e; CU(cuGraphAddKernelNode(&e, (CUgraph)ge, ke.empty() ? nullptr : &ke.back(), ke.empty() ? 0 : 1, &p));
    ke.push_back(e);
  }
  cudaGraphExec_t xe, xi; CK(cudaGraphInstantiate(&xe, ge, 0)); CK(cudaGraphInstantiate(&xi, ge, 0));
  // dev: a third capture, the moved nodes device-updatable, the patcher before the first node.
  cudaGraph_t gd[2];
  cudaGraphExec_t dx[2];  // 0: inline, 1: table
  Inline inl[2] = {};
  unsigned long long* tbl; CK(cudaHostAlloc(&tbl, 16, cudaHostAllocMapped));
  unsigned long long* dtbl; CK(cudaHostGetDevicePointer(&dtbl, tbl, 0));
  cudaGraphNode_t pnode[2];
  for (int v = 0; v < 2; v++) {
    gd[v] = capture(n, x[0], y[0]);
    std::vector<CUgraphNode> kd = kernelNodes(gd[v]);
    for (auto& m : moved) {
      CUlaunchAttributeValue av = {}; av.deviceUpdatableKernelNode.deviceUpdatable = 1;
      CU(cuGraphKernelNodeSetAttribute(kd[m.idx], CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, &av));
      CUlaunchAttributeValue out = {};
      CU(cuGraphKernelNodeGetAttribute(kd[m.idx], CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, &out));
      for (size_t j = 0; j < m.offs.size(); j++) {
        if (inl[v].n == MAXSLOTS) { printf("FAIL: more than %d pointer words move\n", MAXSLOTS); return 1; }
        inl[v].s[inl[v].n++] = Slot{(cudaGraphDeviceNode_t)out.deviceUpdatableKernelNode.devNode, m.offs[j], m.which[j]};
      }
    }
    inl[v].v[0] = (unsigned long long)x[0]; inl[v].v[1] = (unsigned long long)y[0];
    size_t nr = 0; CK(cudaGraphGetRootNodes(gd[v], nullptr, &nr));
    std::vector<cudaGraphNode_t> roots(nr); CK(cudaGraphGetRootNodes(gd[v], roots.data(), &nr));
    cudaKernelNodeParams kp = {}; kp.gridDim = dim3(1); kp.blockDim = dim3(32);
    void* args0[] = {&inl[v]}; void* args1[] = {&inl[v], &dtbl};
    kp.func = v == 0 ? (void*)patch_inline : (void*)patch_table; kp.kernelParams = v == 0 ? args0 : args1;
    CK(cudaGraphAddKernelNode(&pnode[v], gd[v], nullptr, 0, &kp));
    for (auto r : roots) CK(cudaGraphAddDependencies(gd[v], &pnode[v], &r, nullptr, 1));
    CK(cudaGraphInstantiate(&dx[v], gd[v], 0));
    CK(cudaGraphUpload(dx[v], n.s));
  }
  CK(cudaStreamSynchronize(n.s));

  // One step of a way, moved to buffers t (0 or 1); returns host and latency in us.
  // What the bench's harness adds around a step, to see whether it changes the step's price:
  // H2D=1 writes the step's input from pageable host memory first (untimed, as the bench's caller
  // does); GATE=1 holds the stream behind a word of mapped memory while the host moves and
  // launches, and opens it after (the bench's gated timing).
  const bool h2d = getenv("H2D") && atoi(getenv("H2D")), gate = getenv("GATE") && atoi(getenv("GATE"));
  unsigned long long* gw; CK(cudaHostAlloc(&gw, 8, cudaHostAllocMapped)); *gw = 0;
  CUdeviceptr dgw; CU(cuMemHostGetDevicePointer(&dgw, gw, 0));
  unsigned long long ticket = 0;
  printf("harness: H2D=%d GATE=%d NBUF=%d\n", h2d, gate, nbuf);
  auto step = [&](int way, int t, double* host, double* lat, double* launch) {
    if (h2d) CK(cudaMemcpy(x[t], hx.data(), act, cudaMemcpyHostToDevice));
    if (gate) CU(cuStreamWaitValue64((CUstream)n.s, dgw, ++ticket, CU_STREAM_WAIT_VALUE_GEQ));
    double t0 = now_us();
    cudaGraphExec_t ex = fl;
    switch (way) {
    case 0: break;
    case 1:
      ex = nd;
      for (auto& m : moved) { CUDA_KERNEL_NODE_PARAMS p; CU(cuGraphKernelNodeGetParams(k[t][m.idx], &p)); CU(cuGraphExecKernelNodeSetParams((CUgraphExec)nd, k[0][m.idx], &p)); }
      break;
    case 2: {
      ex = wh;
      for (auto& m : moved) { CUDA_KERNEL_NODE_PARAMS p; CU(cuGraphKernelNodeGetParams(k[t][m.idx], &p)); CU(cuGraphKernelNodeSetParams(kt[m.idx], &p)); }
      cudaGraphExecUpdateResultInfo info; CK(cudaGraphExecUpdate(wh, tmpl, &info));
      break;
    }
    case 3: {
      ex = dx[0];
      inl[0].v[0] = (unsigned long long)x[t]; inl[0].v[1] = (unsigned long long)y[t];
      void* a[] = {&inl[0]};
      cudaKernelNodeParams kp = {}; kp.func = (void*)patch_inline; kp.gridDim = dim3(1); kp.blockDim = dim3(32); kp.kernelParams = a;
      CK(cudaGraphExecKernelNodeSetParams(dx[0], pnode[0], &kp));
      break;
    }
    case 4: ex = dx[1]; tbl[0] = (unsigned long long)x[t]; tbl[1] = (unsigned long long)y[t]; break;
    case 5: ex = dx[1]; tbl[0] = (unsigned long long)x[0]; tbl[1] = (unsigned long long)y[0]; break;
    case 6:  // as node, each node named by its CUfunction (no CUkernel, no context), as stablegraph's node sets do
      ex = nf;
      for (auto& m : moved) {
        CUDA_KERNEL_NODE_PARAMS p; CU(cuGraphKernelNodeGetParams(k[t][m.idx], &p));
        p.func = funcOf(p); p.kern = nullptr; p.ctx = nullptr;
        CU(cuGraphExecKernelNodeSetParams((CUgraphExec)nf, k[0][m.idx], &p));
      }
      break;
    case 7:  // node-fn on the graph built node by node
      ex = xe;
      for (auto& m : moved) {
        CUDA_KERNEL_NODE_PARAMS p; CU(cuGraphKernelNodeGetParams(k[t][m.idx], &p));
        p.func = funcOf(p); p.kern = nullptr; p.ctx = nullptr;
        CU(cuGraphExecKernelNodeSetParams((CUgraphExec)xe, ke[m.idx], &p));
      }
      break;
    case 8: ex = xi; break;  // the graph built node by node, unchanged
    }
    double tl = now_us();
    CK(cudaGraphLaunch(ex, n.s));
    double t1 = now_us();
    *launch = t1 - tl;
    if (gate) *(volatile unsigned long long*)gw = ticket;
    CK(cudaStreamSynchronize(n.s));
    double t2 = now_us();
    *host = t1 - t0; *lat = t2 - t0;
  };
  const char* names[] = {"floor", "node", "whole", "dev-inl", "dev-tbl", "dev-idle", "node-fn", "expl-node", "expl-idle"};
  const int nways = 9;
  // Check: every way, moved to buffers 1, writes the floor's y (x[0] and x[1] hold the same values).
  {
    std::vector<float> want(act / 4), got(act / 4);
    double h, l, la;
    step(0, 0, &h, &l, &la); CK(cudaMemcpy(want.data(), y[0], act, cudaMemcpyDeviceToHost));
    for (int way = 1; way < nways; way++) {
      int t = (way == 5 || way == 8) ? 0 : 1;  // the ways that never move write the floor's y
      CK(cudaMemset(y[t], 0, act));
      step(way, t, &h, &l, &la);
      CK(cudaMemcpy(got.data(), y[t], act, cudaMemcpyDeviceToHost));
      if (memcmp(want.data(), got.data(), act) != 0) { printf("FAIL: %s wrote another y than the floor\n", names[way]); return 1; }
      step(way, 0, &h, &l, &la);  // and back
    }
    printf("check: every way moved to the other x and y wrote the floor's y, bit for bit\n");
  }
  for (int r = 0; r < 50; r++) for (int way = 0; way < nways; way++) { double h, l, la; step(way, r % nbuf, &h, &l, &la); }
  // Each round runs every way once beside a floor step (before it on odd rounds, after on even).
  std::vector<double> host[nways], lat[nways], dh[nways], rl[nways], lau[nways];
  for (int r = 0; r < steps; r++) {
    for (int way = 1; way < nways; way++) {
      double hf, lf, hw, lw, af, aw;
      if (r & 1) { step(0, 0, &hf, &lf, &af); step(way, r % nbuf, &hw, &lw, &aw); }
      else { step(way, r % nbuf, &hw, &lw, &aw); step(0, 0, &hf, &lf, &af); }
      lau[0].push_back(af); lau[way].push_back(aw);
      host[0].push_back(hf); lat[0].push_back(lf);
      host[way].push_back(hw); lat[way].push_back(lw);
      dh[way].push_back(hw - hf); rl[way].push_back(lw / lf);
    }
  }
  // GPU time per step, back to back, by events around 100 launches (none for dev-tbl).
  double gpu[nways];
  for (int way = 0; way < nways; way++) {
    gpu[way] = -1;
    if (way == 4) continue;
    cudaGraphExec_t ex = way == 0 ? fl : way == 1 ? nd : way == 2 ? wh : way == 3 ? dx[0] : way == 6 ? nf : way == 7 ? xe : way == 8 ? xi : dx[1];
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<double> v;
    for (int rep = 0; rep < 5; rep++) {
      double h, l, la; step(way, 0, &h, &l, &la);
      CK(cudaEventRecord(e0, n.s));
      for (int i = 0; i < 100; i++) CK(cudaGraphLaunch(ex, n.s));
      CK(cudaEventRecord(e1, n.s)); CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); v.push_back(ms * 1000 / 100);
    }
    gpu[way] = med(v);
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  }
  printf("%-9s %9s %9s %9s %10s %10s %10s\n", "way", "host p50", "launch", "lat p50", "host-flr", "lat×flr", "GPU×flr");
  for (int way = 0; way < nways; way++) {
    if (way == 0) printf("%-9s %9.2f %9.2f %9.2f %10s %10s %10.3f\n", names[way], med(host[way]), med(lau[way]), med(lat[way]), "-", "-", 1.0);
    else if (gpu[way] < 0) printf("%-9s %9.2f %9.2f %9.2f %10.2f %10.3f %10s\n", names[way], med(host[way]), med(lau[way]), med(lat[way]), med(dh[way]), med(rl[way]), "-");
    else printf("%-9s %9.2f %9.2f %9.2f %10.2f %10.3f %10.3f\n", names[way], med(host[way]), med(lau[way]), med(lat[way]), med(dh[way]), med(rl[way]), gpu[way] / gpu[0]);
  }
  printf("floor GPU %.2f us per step back to back\n", gpu[0]);
  return 0;
}
