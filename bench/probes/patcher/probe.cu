// Patcher variants on a chain of K opted-in axpb nodes: GPU time per step back to back.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <chrono>
#include "kernels.inc"
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void axpb(float* y, const float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + b;
}
__global__ void empty_root(sg_patch_ctl* ctl) {}

// V2: minimal. One update per slot (total == count), every thread loads the header
// and its entry with 16-byte cache-volatile loads; one block; bump seq.
__global__ void patcher_min(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                            const unsigned char* tables, unsigned long long stride, unsigned int ntables,
                            unsigned int capacity, sg_patch_mirror* mirror) {
  const unsigned long long s = __ldcv((const unsigned long long*)&ctl->seq);
  const unsigned char* t = tables + (s % ntables) * stride;
  const ulonglong2 h = __ldcv((const ulonglong2*)t);
  const unsigned int i = threadIdx.x;
  ulonglong2 u = make_ulonglong2(0, 0);
  if (i < capacity) u = __ldcv((const ulonglong2*)(t + 16 + 16 * i));
  const unsigned int count = (unsigned int)h.y;
  if (h.x == s) {
    for (unsigned int j = i; j < count; j += blockDim.x) {
      if (j != i) u = __ldcv((const ulonglong2*)(t + 16 + 16 * j));
      const unsigned int slot = (unsigned int)u.x;
      if (slot < nslots) {
        const sg_patch_slot sl = slots[slot];
        const unsigned long long v = u.y + sl.add;
        cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)sl.node, sl.offset, &v, sizeof v);
      }
    }
  }
  __syncthreads();
  if (i == 0) {
    ctl->seq = s + 1;
    if (mirror) ((volatile sg_patch_mirror*)mirror)->seq = s + 1;
  }
}
// V3: the table read first (header), then entries, as two dependent loads (like old), but
// with vector cv loads and no fences/atomics.
__global__ void patcher_seq2(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                            const unsigned char* tables, unsigned long long stride, unsigned int ntables,
                            unsigned int capacity, sg_patch_mirror* mirror) {
  __shared__ ulonglong2 hs;
  const unsigned long long s = __ldcv((const unsigned long long*)&ctl->seq);
  const unsigned char* t = tables + (s % ntables) * stride;
  if (threadIdx.x == 0) hs = __ldcv((const ulonglong2*)t);
  __syncthreads();
  const ulonglong2 h = hs;
  const unsigned int i = threadIdx.x;
  const unsigned int count = (unsigned int)h.y;
  if (h.x == s) for (unsigned int j = i; j < count; j += blockDim.x) {
    const ulonglong2 u = __ldcv((const ulonglong2*)(t + 16 + 16 * j));
    const unsigned int slot = (unsigned int)u.x;
    if (slot < nslots) {
      const sg_patch_slot sl = slots[slot];
      const unsigned long long v = u.y + sl.add;
      cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)sl.node, sl.offset, &v, sizeof v);
    }
  }
  __syncthreads();
  if (i == 0) {
    ctl->seq = s + 1;
    if (mirror) ((volatile sg_patch_mirror*)mirror)->seq = s + 1;
  }
}
// V4: no seq read: the table is fixed (index 0) - the lower bound of a table read.
__global__ void patcher_fixed(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                            const unsigned char* tables, unsigned long long stride, unsigned int ntables,
                            unsigned int capacity, sg_patch_mirror* mirror) {
  const unsigned char* t = tables;
  const ulonglong2 h = __ldcv((const ulonglong2*)t);
  const unsigned int i = threadIdx.x;
  ulonglong2 u = make_ulonglong2(0, 0);
  if (i < capacity) u = __ldcv((const ulonglong2*)(t + 16 + 16 * i));
  const unsigned int count = (unsigned int)h.y;
  for (unsigned int j = i; j < count; j += blockDim.x) {
    if (j != i) u = __ldcv((const ulonglong2*)(t + 16 + 16 * j));
    const unsigned int slot = (unsigned int)u.x;
    if (slot < nslots) {
      const sg_patch_slot sl = slots[slot];
      const unsigned long long v = u.y + sl.add;
      cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)sl.node, sl.offset, &v, sizeof v);
    }
  }
}
// V5: no SetParam (reads like min, applies nothing): the cost of the device runtime call.
__global__ void patcher_noset(sg_patch_ctl* ctl, const sg_patch_slot* slots, unsigned int nslots,
                            const unsigned char* tables, unsigned long long stride, unsigned int ntables,
                            unsigned int capacity, sg_patch_mirror* mirror) {
  const unsigned long long s = __ldcv((const unsigned long long*)&ctl->seq);
  const unsigned char* t = tables + (s % ntables) * stride;
  const ulonglong2 h = __ldcv((const ulonglong2*)t);
  const unsigned int i = threadIdx.x;
  ulonglong2 u = make_ulonglong2(0, 0);
  if (i < capacity) u = __ldcv((const ulonglong2*)(t + 16 + 16 * i));
  const unsigned int count = (unsigned int)h.y;
  if (h.x == s) for (unsigned int j = i; j < count; j += blockDim.x) {
    if (j != i) u = __ldcv((const ulonglong2*)(t + 16 + 16 * j));
    const unsigned int slot = (unsigned int)u.x;
    if (slot < nslots) { const sg_patch_slot sl = slots[slot]; if (sl.add == 12345) ctl->reserved = 1; }
  }
  __syncthreads();
  if (i == 0) ctl->seq = s + 1;
}

// V6: inline: the host writes the new values into the patcher's own kernel
// parameters (one exec update of the patcher node per step); no table, no
// memory round trip before the device-side updates. Slot j takes vals[j].
struct InlineP { unsigned int count; unsigned int pad; unsigned long long vals[2000]; };
__global__ void patcher_inline(const sg_patch_slot* slots, const __grid_constant__ InlineP p) {
  for (unsigned int j = threadIdx.x; j < p.count; j += blockDim.x) {
    const sg_patch_slot sl = slots[j];
    const unsigned long long v = p.vals[j] + sl.add;
    cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)sl.node, sl.offset, &v, sizeof v);
  }
}

typedef void (*pfn)(sg_patch_ctl*, const sg_patch_slot*, unsigned int, const unsigned char*, unsigned long long, unsigned int, unsigned int, sg_patch_mirror*);

int main(int argc, char** argv) {
  const int n = 1024, NT = 16;
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  struct V { const char* name; pfn f; int blocks, threads; bool oneSlotPerUpdate; };
  for (int K : {16, 1000}) {
    std::vector<float*> A(K + 1), B(K + 1);
    for (int i = 0; i <= K; i++) { CK(cudaMalloc(&A[i], n * 4)); CK(cudaMalloc(&B[i], n * 4)); CK(cudaMemset(A[i], 0, n*4)); CK(cudaMemset(B[i], 0, n*4)); }
    int W = 2 * K; // writes: every node's y and x
    int thr = W <= 1024 ? ((W + 31) / 32) * 32 : 1024;
    std::vector<V> vs = {
      {"plain (no opt-in, no root)", nullptr, 0, 0, true},
      {"opted-in, no root", nullptr, 0, 0, true},
      {"empty root kernel", (pfn)nullptr, 1, 32, true},
      {"old sg_patcher (16 blk x128 / 1x128)", patcher_old, (W + 127) / 128, 128, false},
      {"new sg_patcher (1 blk)", patcher_new, W > 2048 ? (W + 1023) / 1024 : 1, thr, false},
      {"min: seq, header+entry cv", patcher_min, 1, thr, true},
      {"seq2: seq, header, entry", patcher_seq2, 1, thr, true},
      {"fixed table: header+entry", patcher_fixed, 1, thr, true},
      {"noset: min without SetParam", patcher_noset, 1, thr, true},
    };
    {
      // inline variant
      cudaGraph_t g; CK(cudaGraphCreate(&g, 0));
      sg_patch_slot* slots; CK(cudaMalloc(&slots, W * sizeof(sg_patch_slot)));
      static InlineP P; memset(&P, 0, sizeof P);
      cudaKernelNodeParams pk = {}; const sg_patch_slot* cs = slots; void* pargs[] = {&cs, &P};
      pk.func = (void*)patcher_inline; pk.kernelParams = pargs; pk.gridDim = dim3(1); pk.blockDim = dim3(thr);
      cudaGraphNode_t rootn; CK(cudaGraphAddKernelNode(&rootn, g, nullptr, 0, &pk));
      std::vector<sg_patch_slot> hs(W); cudaGraphNode_t prev = rootn;
      for (int i = 0; i < K; i++) {
        float* y = A[i + 1]; const float* x = A[i]; float a = 1, b = 1; int nn = n; void* args[] = {&y, &x, &a, &b, &nn};
        cudaKernelNodeParams kp = {}; kp.func = (void*)axpb; kp.gridDim = dim3((n + 255) / 256); kp.blockDim = dim3(256); kp.kernelParams = args;
        cudaGraphNode_t nd; CK(cudaGraphAddKernelNode(&nd, g, &prev, 1, &kp));
        cudaLaunchAttributeValue av; memset(&av, 0, sizeof av); av.deviceUpdatableKernelNode.deviceUpdatable = 1;
        CK(cudaGraphKernelNodeSetAttribute(nd, cudaLaunchAttributeDeviceUpdatableKernelNode, &av));
        cudaLaunchAttributeValue w; memset(&w, 0, sizeof w); CK(cudaGraphKernelNodeGetAttribute(nd, cudaLaunchAttributeDeviceUpdatableKernelNode, &w));
        hs[2 * i] = {(unsigned long long)w.deviceUpdatableKernelNode.devNode, 0, 0, 0};
        hs[2 * i + 1] = {(unsigned long long)w.deviceUpdatableKernelNode.devNode, 0, 8, 0};
        prev = nd;
      }
      CK(cudaMemcpy(slots, hs.data(), W * sizeof(sg_patch_slot), cudaMemcpyHostToDevice));
      cudaGraphExec_t x; CK(cudaGraphInstantiate(&x, g, 0)); CK(cudaGraphUpload(x, st)); CK(cudaStreamSynchronize(st));
      cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
      for (int moving = 0; moving < 2; moving++) {
        auto step = [&](int k) {
          if (moving) {
            auto& S = (k & 1) ? B : A;
            P.count = W;
            for (int i = 0; i < K; i++) { P.vals[2 * i] = (unsigned long long)S[i + 1]; P.vals[2 * i + 1] = (unsigned long long)S[i]; }
          } else P.count = 0;
          CK(cudaGraphExecKernelNodeSetParams(x, rootn, &pk));
          CK(cudaGraphLaunch(x, st));
        };
        for (int k = 0; k < 50; k++) step(k);
        CK(cudaStreamSynchronize(st));
        const int steps = 2000;
        CK(cudaEventRecord(e0, st));
        double hostUpd = 0;
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < steps; k++) {
          auto u0 = std::chrono::steady_clock::now();
          if (moving) { auto& S = (k & 1) ? B : A; P.count = W; for (int i = 0; i < K; i++) { P.vals[2 * i] = (unsigned long long)S[i + 1]; P.vals[2 * i + 1] = (unsigned long long)S[i]; } } else P.count = 0;
          CK(cudaGraphExecKernelNodeSetParams(x, rootn, &pk));
          hostUpd += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - u0).count();
          CK(cudaGraphLaunch(x, st));
        }
        CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
        double host = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / steps;
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        float r = 0; auto& S = (moving && ((steps - 1) & 1)) ? B : A;
        CK(cudaMemcpy(&r, S[K], 4, cudaMemcpyDeviceToHost));
        printf("K=%-4d %-40s %-7s GPU %8.2f us/step  host %6.2f  update %5.2f  out=%g\n", K, "inline: host updates the patcher's params", moving ? "moving" : "idle", ms * 1000 / steps, host, hostUpd / steps, r);
      }
      CK(cudaGraphExecDestroy(x)); CK(cudaGraphDestroy(g)); CK(cudaFree(slots));
    }
    for (size_t vi = 0; vi < vs.size(); vi++) {
      V v = vs[vi];
      if (v.blocks < 0) { printf("K=%d %-40s skipped (needs one block)\n", K, v.name); continue; }
      bool optin = vi >= 1, root = vi >= 2;
      cudaGraph_t g; CK(cudaGraphCreate(&g, 0));
      sg_patch_ctl* ctl; CK(cudaMalloc(&ctl, 32)); CK(cudaMemset(ctl, 0, 32));
      sg_patch_slot* slots; CK(cudaMalloc(&slots, W * sizeof(sg_patch_slot)));
      unsigned long long stride = 16 + 16ull * W;
      unsigned char* htab; CK(cudaHostAlloc(&htab, stride * NT, cudaHostAllocMapped)); memset(htab, 0xff, stride * NT);
      unsigned char* dtab; CK(cudaHostGetDevicePointer(&dtab, htab, 0));
      sg_patch_mirror* hm; CK(cudaHostAlloc(&hm, 64, cudaHostAllocMapped)); memset(hm, 0, 64);
      sg_patch_mirror* dm; CK(cudaHostGetDevicePointer(&dm, hm, 0));
      cudaGraphNode_t rootn = nullptr;
      if (root) {
        cudaKernelNodeParams kp = {};
        unsigned int ns = W, nt = NT, cap = W; const sg_patch_slot* cs = slots; const unsigned char* ct = dtab; sg_patch_mirror* mm = dm;
        void* args[] = {&ctl, &cs, &ns, &ct, &stride, &nt, &cap, &mm};
        void* a1[] = {&ctl};
        if (v.f) { kp.func = (void*)v.f; kp.kernelParams = args; kp.gridDim = dim3(v.blocks); kp.blockDim = dim3(v.threads); }
        else { kp.func = (void*)empty_root; kp.kernelParams = a1; kp.gridDim = dim3(1); kp.blockDim = dim3(32); }
        CK(cudaGraphAddKernelNode(&rootn, g, nullptr, 0, &kp));
      }
      std::vector<sg_patch_slot> hs(W);
      cudaGraphNode_t prev = rootn;
      for (int i = 0; i < K; i++) {
        float* y = A[i + 1]; const float* x = A[i]; float a = 1, b = 1; int nn = n; void* args[] = {&y, &x, &a, &b, &nn};
        cudaKernelNodeParams kp = {}; kp.func = (void*)axpb; kp.gridDim = dim3((n + 255) / 256); kp.blockDim = dim3(256); kp.kernelParams = args;
        cudaGraphNode_t nd; CK(cudaGraphAddKernelNode(&nd, g, prev ? &prev : nullptr, prev ? 1 : 0, &kp));
        if (optin) {
          cudaLaunchAttributeValue av; memset(&av, 0, sizeof av); av.deviceUpdatableKernelNode.deviceUpdatable = 1;
          CK(cudaGraphKernelNodeSetAttribute(nd, cudaLaunchAttributeDeviceUpdatableKernelNode, &av));
          cudaLaunchAttributeValue w; memset(&w, 0, sizeof w); CK(cudaGraphKernelNodeGetAttribute(nd, cudaLaunchAttributeDeviceUpdatableKernelNode, &w));
          hs[2 * i] = {(unsigned long long)w.deviceUpdatableKernelNode.devNode, 0, 0, 0};
          hs[2 * i + 1] = {(unsigned long long)w.deviceUpdatableKernelNode.devNode, 0, 8, 0};
        }
        prev = nd;
      }
      CK(cudaMemcpy(slots, hs.data(), W * sizeof(sg_patch_slot), cudaMemcpyHostToDevice));
      cudaGraphExec_t x; CK(cudaGraphInstantiate(&x, g, 0));
      if (optin) CK(cudaGraphUpload(x, st));
      CK(cudaStreamSynchronize(st));
      cudaEvent_t ev[2], e0, e1; for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
      for (int moving = 0; moving < (root && v.f ? 2 : 1); moving++) {
        CK(cudaStreamSynchronize(st));
        // reset seq
        CK(cudaMemset(ctl, 0, 32)); memset(htab, 0xff, stride * NT); CK(cudaDeviceSynchronize());
        auto write = [&](unsigned long long k) {
          unsigned char* t = htab + (k % NT) * stride;
          unsigned int cnt = 0, tot = 0;
          if (moving) {
            auto& S = (k & 1) ? B : A;
            if (v.oneSlotPerUpdate) {
              for (int i = 0; i < K; i++) {
                unsigned long long* e = (unsigned long long*)(t + 16 + 16 * (2 * i));
                e[0] = (unsigned long long)(2 * i); e[1] = (unsigned long long)S[i + 1];
                e = (unsigned long long*)(t + 16 + 16 * (2 * i + 1));
                e[0] = (unsigned long long)(2 * i + 1); e[1] = (unsigned long long)S[i];
              }
              cnt = tot = W;
            } else {
              for (int j = 0; j < W; j++) { // one update per write, start = j
                unsigned int* e = (unsigned int*)(t + 16 + 16 * j);
                e[0] = j; e[1] = j; *(unsigned long long*)(e + 2) = (unsigned long long)((j & 1) ? S[j / 2] : S[j / 2 + 1]);
              }
              cnt = tot = W;
            }
          }
          if (v.oneSlotPerUpdate) { ((unsigned long long*)t)[1] = cnt; }
          else { ((unsigned int*)t)[2] = cnt; ((unsigned int*)t)[3] = tot; }
          __sync_synchronize();
          ((volatile unsigned long long*)t)[0] = k;
        };
        const int steps = 2000, every = 8;
        for (int w = 0; w < 50; w++) { if (root && v.f) write(w); CK(cudaGraphLaunch(x, st)); }
        CK(cudaStreamSynchronize(st));
        CK(cudaMemset(ctl, 0, 32)); CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0, st));
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < steps; k++) {
          if (k % every == 0 && k >= NT) CK(cudaEventSynchronize(ev[(k / every) % 2]));
          if (root && v.f) write(k);
          CK(cudaGraphLaunch(x, st));
          if (k % every == every - 1) CK(cudaEventRecord(ev[(k / every) % 2], st));
        }
        CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
        double host = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / steps;
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        // check: last output
        float r = 0; auto& S = (moving && ((steps - 1) & 1)) ? B : A;
        CK(cudaMemcpy(&r, S[K], 4, cudaMemcpyDeviceToHost));
        printf("K=%-4d %-40s %-7s GPU %8.2f us/step  host %6.2f  out=%g\n", K, v.name, moving ? "moving" : "idle", ms * 1000 / steps, host, r);
      }
      CK(cudaGraphExecDestroy(x)); CK(cudaGraphDestroy(g));
      CK(cudaFree(ctl)); CK(cudaFree(slots)); CK(cudaFreeHost(htab)); CK(cudaFreeHost(hm));
      for (auto& e : ev) cudaEventDestroy(e); cudaEventDestroy(e0); cudaEventDestroy(e1);
    }
  }
  return 0;
}
