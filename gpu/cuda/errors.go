package cuda

import (
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// sentinel maps a CUresult to the gpu sentinel that says what the caller may
// do about it.
func sentinel(r cu.Result) error {
	switch r {
	case cu.ErrorOutOfMemory:
		return gpu.ErrOutOfMemory
	case cu.ErrorInvalidValue, cu.ErrorInvalidDevice, cu.ErrorInvalidImage, cu.ErrorInvalidPTX,
		cu.ErrorInvalidSource, cu.ErrorLaunchOutOfResources, cu.ErrorInvalidClusterSize,
		cu.ErrorAlreadyMapped, cu.ErrorNotMapped, cu.ErrorMisalignedAddress:
		return gpu.ErrInvalidValue
	case cu.ErrorInvalidHandle, cu.ErrorInvalidContext, cu.ErrorContextIsDestroyed:
		return gpu.ErrInvalidHandle
	case cu.ErrorNotReady:
		return gpu.ErrNotReady
	case cu.ErrorIllegalState, cu.ErrorStreamCaptureUnmatched, cu.ErrorCapturedEvent,
		cu.ErrorNotPermitted, cu.ErrorPeerAccessAlreadyEnabled, cu.ErrorPeerAccessNotEnabled:
		return gpu.ErrIllegalState
	case cu.ErrorNotSupported, cu.ErrorPeerAccessUnsupported, cu.ErrorUnsupportedLimit,
		cu.ErrorNoBinaryForGPU, cu.ErrorUnsupportedPTXVersion, cu.ErrorCallRequiresNewerDriver,
		cu.ErrorJITCompilerNotFound, cu.ErrorJITCompilationDisabled, cu.ErrorCDPNotSupported:
		return gpu.ErrNotSupported
	case cu.ErrorIllegalAddress, cu.ErrorInvalidAddressSpace:
		return gpu.ErrIllegalAddress
	case cu.ErrorStreamCaptureUnsupported, cu.ErrorStreamCaptureInvalidated, cu.ErrorStreamCaptureMerge,
		cu.ErrorStreamCaptureUnjoined, cu.ErrorStreamCaptureIsolation, cu.ErrorStreamCaptureImplicit,
		cu.ErrorStreamCaptureWrongThread:
		return gpu.ErrCaptureInvalidated
	case cu.ErrorGraphExecUpdateFailure:
		return gpu.ErrGraphUpdate
	case cu.ErrorNotFound, cu.ErrorSharedObjectSymbolNotFound, cu.ErrorFileNotFound:
		return gpu.ErrNotFound
	case cu.ErrorTimeout:
		return gpu.ErrTimeout
	case cu.ErrorNoDevice, cu.ErrorNotInitialized, cu.ErrorStubLibrary, cu.ErrorDeviceUnavailable,
		cu.ErrorSystemDriverMismatch, cu.ErrorCompatNotSupportedOnDevice, cu.ErrorSystemNotReady,
		cu.ErrorDeviceNotLicensed:
		return gpu.ErrUnavailable
	case cu.ErrorLaunchFailed, cu.ErrorIllegalInstruction, cu.ErrorHardwareStackError, cu.ErrorInvalidPC,
		cu.ErrorAssert, cu.ErrorLaunchTimeout, cu.ErrorECCUncorrectable, cu.ErrorNVLinkUncorrectable,
		cu.ErrorDeinitialized, cu.ErrorContained, cu.ErrorExternalDevice, cu.ErrorUnknown:
		// The context is unusable after these.
		return gpu.ErrDeviceLost
	case cu.ErrorNotLoaded:
		return gpu.ErrNotSupported
	}
	return gpu.ErrIllegalState
}

// driverError builds the error for a failed call op. d may be nil (no
// library loaded).
func driverError(d *cu.Driver, op string, r cu.Result) error {
	if r == cu.ErrorNotLoaded {
		path := "the loaded libcuda"
		if d != nil {
			path = d.Path
		}
		return &gpu.Error{Op: op, Err: gpu.ErrNotSupported, Detail: "symbol not exported by " + path}
	}
	e := &gpu.Error{Op: op, Code: int(r), CodeName: r.Name(), Err: sentinel(r)}
	if d != nil {
		e.Detail = d.GetErrorString(r)
	}
	if r == cu.ErrorGraphExecUpdateFailure {
		return &gpu.UpdateError{Op: op, Result: gpu.UpdateFailed, Code: e.Code, CodeName: e.CodeName, Detail: e.Detail}
	}
	return e
}

// check returns nil for CUDA_SUCCESS and the error of op otherwise.
func (b *Backend) check(op string, r cu.Result) error {
	if r == cu.Success {
		return nil
	}
	return driverError(b.d, op, r)
}

// updateResult maps CUgraphExecUpdateResult to gpu.UpdateResult.
func updateResult(r cu.GraphExecUpdateResult) gpu.UpdateResult {
	switch r {
	case cu.GraphExecUpdateSuccess:
		return gpu.UpdateSuccess
	case cu.GraphExecUpdateErrorTopologyChanged:
		return gpu.UpdateTopologyChanged
	case cu.GraphExecUpdateErrorNodeTypeChanged:
		return gpu.UpdateNodeTypeChanged
	case cu.GraphExecUpdateErrorFunctionChanged, cu.GraphExecUpdateErrorUnsupportedFunctionChange:
		return gpu.UpdateFunctionChanged
	case cu.GraphExecUpdateErrorParametersChanged:
		return gpu.UpdateParametersChanged
	case cu.GraphExecUpdateErrorNotSupported:
		return gpu.UpdateNotSupported
	case cu.GraphExecUpdateErrorAttributesChanged:
		return gpu.UpdateAttributesChanged
	}
	return gpu.UpdateFailed
}

// blasError builds the error for a failed cuBLAS call.
func blasError(op string, s cu.BLASStatus) error {
	var sent error
	switch s {
	case cu.BLASAllocFailed:
		sent = gpu.ErrOutOfMemory
	case cu.BLASInvalidValue:
		sent = gpu.ErrInvalidValue
	case cu.BLASArchMismatch, cu.BLASNotSupported, cu.BLASNotLoaded, cu.BLASLicenseError:
		sent = gpu.ErrNotSupported
	case cu.BLASNotInitialized:
		sent = gpu.ErrIllegalState
	case cu.BLASExecutionFailed, cu.BLASMappingError, cu.BLASInternalError:
		// cuBLAS reports launch failures and captures it could not make
		// this way; the device may still be usable.
		sent = gpu.ErrIllegalState
	default:
		sent = gpu.ErrIllegalState
	}
	return &gpu.Error{Op: op, Code: int(s), CodeName: s.Name(), Err: sent}
}

// errf is gpu.Errorf; a short name for the many argument checks.
func errf(op string, sentinel error, format string, args ...any) error {
	return gpu.Errorf(op, sentinel, format, args...)
}
