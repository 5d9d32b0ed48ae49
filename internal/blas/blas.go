// Package blas is stablegraph's GEMM command: the traced library call that
// a Program's Gemm compiles to. It calls the backend's GEMM library (the
// optional gpu.GEMM capability: cuBLAS and cuBLASLt on CUDA, a model of them
// on sim) and, where the backend has none or refuses a shape, falls back to
// the built-in kernels (kernels.Gemm, then kernels.BiasAdd for a bias).
//
// A GEMM is a trace.Library: the tracer that runs it gives it the
// executable's workspace (so that a captured call allocates nothing and
// every trace holds the same workspace address), and calls Prepare outside
// any capture for every alignment class of its pointers, where the library
// chooses and keeps its algorithm.
package blas

import (
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/kernels"
)

// Gemm is one matrix product on row-major float32 matrices:
//
//	C[M×N] = Alpha·op(A)·op(B) + Beta·C + bias
//
// as gpu.GEMM defines it. The command's pointers are C, A and B, and the
// bias (N float32 added to every row of C) when Bias is set.
type Gemm struct {
	M, N, K        int
	TransA, TransB bool
	Alpha, Beta    float32
	Bias           bool
}

// Pointers is the number of pointers the command takes.
func (g Gemm) Pointers() int {
	if g.Bias {
		return 4
	}
	return 3
}

// Command returns the traced library command computing g.
func Command(g Gemm) trace.Library { return command{g} }

type command struct{ g Gemm }

func (c command) params(env *trace.Env) (gpu.GemmParams, error) {
	g := c.g
	if len(env.Ptrs) != g.Pointers() {
		return gpu.GemmParams{}, gpu.Errorf("blas.Gemm", gpu.ErrInvalidValue, "%d pointers, the GEMM takes %d (C, A, B%s)",
			len(env.Ptrs), g.Pointers(), map[bool]string{true: ", bias"}[g.Bias])
	}
	p := gpu.GemmParams{C: env.Ptrs[0], A: env.Ptrs[1], B: env.Ptrs[2], M: g.M, N: g.N, K: g.K,
		TransA: g.TransA, TransB: g.TransB, Alpha: g.Alpha, Beta: g.Beta,
		Workspace: env.Workspace, WorkspaceSize: env.WorkspaceSize}
	if g.Bias {
		p.Bias = env.Ptrs[3]
	}
	return p, nil
}

// Workspace implements trace.Library: what the backend's library asks for,
// nothing without one.
func (c command) Workspace(b gpu.Backend, dev int) (uint64, error) {
	lib, err := gpu.GemmOf(b)
	if err != nil {
		return 0, nil
	}
	return lib.GemmWorkspaceSize(dev)
}

// Prepare implements trace.Library: the library chooses its algorithm for
// this shape and alignment class.
func (c command) Prepare(env *trace.Env) error {
	lib, err := gpu.GemmOf(env.Backend)
	if err != nil {
		return nil // the fallback kernels need no preparation
	}
	p, err := c.params(env)
	if err != nil {
		return err
	}
	if err := lib.GemmPrepare(env.Device, p); err != nil && !errors.Is(err, gpu.ErrNotSupported) {
		return err
	}
	return nil
}

// Run implements trace.Library.
func (c command) Run(env *trace.Env) error {
	p, err := c.params(env)
	if err != nil {
		return err
	}
	if lib, lerr := gpu.GemmOf(env.Backend); lerr == nil {
		err := lib.Gemm(env.Stream, p)
		if !errors.Is(err, gpu.ErrNotSupported) {
			return err
		}
	}
	return fallback(env, p)
}

// fallback computes p with the built-in kernels: kernels.Gemm, then the
// bias added in place by kernels.BiasAdd.
func fallback(env *trace.Env, p gpu.GemmParams) error {
	f, err := env.Kernel(kernels.Gemm)
	if err != nil {
		return fmt.Errorf("gemm fallback: %w", err)
	}
	err = env.Backend.LaunchKernel(f, kernels.GemmConfig(p.M, p.N), []gpu.Arg{
		gpu.Ptr(p.C), gpu.Ptr(p.A), gpu.Ptr(p.B),
		gpu.I32(int32(p.M)), gpu.I32(int32(p.N)), gpu.I32(int32(p.K)),
		gpu.I32(boolI32(p.TransA)), gpu.I32(boolI32(p.TransB)),
		gpu.F32(p.Alpha), gpu.F32(p.Beta),
	}, env.Stream)
	if err != nil || p.Bias == 0 {
		return err
	}
	f, err = env.Kernel(kernels.BiasAdd)
	if err != nil {
		return fmt.Errorf("gemm fallback: %w", err)
	}
	return env.Backend.LaunchKernel(f, kernels.Elementwise(p.M*p.N), []gpu.Arg{
		gpu.Ptr(p.C), gpu.Ptr(p.C), gpu.Ptr(p.Bias), gpu.I32(int32(p.M)), gpu.I32(int32(p.N)),
	}, env.Stream)
}

func boolI32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
