package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
)

// LibraryReporter is an optional interface of a gpu.Backend: the shared
// libraries it looked for. Libraries maps a library's name ("libcuda",
// "cublas", "nccl", "nvrtc", ...) to the path that was loaded, or to why
// none was ("not found; tried ..."). "stablegraph info" prints it when the
// backend implements it and prints nothing about libraries otherwise.
type LibraryReporter interface {
	Libraries() map[string]string
}

// infoOutput is the JSON form of "stablegraph info".
type infoOutput struct {
	Backend   string            `json:"backend"`
	Reason    string            `json:"reason"`
	Drivers   []string          `json:"drivers"`
	Devices   []deviceInfo      `json:"devices"`
	Libraries map[string]string `json:"libraries,omitempty"`
}

type deviceInfo struct {
	Ordinal           int    `json:"ordinal"`
	Name              string `json:"name"`
	TotalMemoryBytes  uint64 `json:"total_memory_bytes"`
	FreeMemoryBytes   uint64 `json:"free_memory_bytes,omitempty"`
	ComputeCapability string `json:"compute_capability"`
	DriverVersion     int    `json:"driver_version"`
	VMM               bool   `json:"vmm"`
	GranularityBytes  uint64 `json:"granularity_bytes"`
	StreamMemOps      bool   `json:"stream_mem_ops"`
	// Capabilities are the optional gpu capabilities the backend offers
	// on the device (gpu.Capabilities).
	Capabilities []string `json:"capabilities"`
	Error        string   `json:"error,omitempty"`
}

func infoCommand() *command {
	return &command{
		name:    "info",
		summary: "show the backend chosen and why, the registered drivers, devices and libraries",
		detail: `The backend is opened as --backend says ("auto" tries the hardware backends,
cuda, before the simulator, sim) and the
reason for the choice is printed, with each device's properties: memory,
compute capability, driver version, virtual memory support and granularity,
64-bit stream memory operations, and the optional capabilities the backend
offers on it.`,
		flags: func(fs *flag.FlagSet) func(*env) error {
			asJSON := fs.Bool("json", false, "print JSON instead of text")
			return func(e *env) error { return info(e, *asJSON) }
		},
	}
}

func info(e *env, asJSON bool) (err error) {
	b, reason, err := e.open()
	if err != nil {
		return err
	}
	defer closeBackend(b, &err)

	out := infoOutput{Backend: b.Name(), Reason: reason, Drivers: gpu.Drivers(), Devices: []deviceInfo{}}
	for dev := range b.DeviceCount() {
		d := deviceInfo{Ordinal: dev}
		p, err := b.DeviceProps(dev)
		if err != nil {
			d.Error = err.Error()
			out.Devices = append(out.Devices, d)
			continue
		}
		d.Name, d.TotalMemoryBytes = p.Name, p.TotalMemory
		d.ComputeCapability = fmt.Sprintf("%d.%d", p.ComputeMajor, p.ComputeMinor)
		d.DriverVersion, d.VMM, d.GranularityBytes, d.StreamMemOps = p.DriverVersion, p.VMM, p.Granularity, p.StreamMemOps
		d.Capabilities = gpu.Capabilities(b, dev)
		if free, _, err := b.MemGetInfo(dev); err == nil {
			d.FreeMemoryBytes = free
		} else {
			e.log.Debug("MemGetInfo failed", "device", dev, "err", err)
		}
		out.Devices = append(out.Devices, d)
	}
	if lr, ok := b.(LibraryReporter); ok {
		out.Libraries = lr.Libraries()
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return writeInfo(e.stdout, out)
}

func writeInfo(w io.Writer, out infoOutput) error {
	var b strings.Builder
	fmt.Fprintf(&b, "backend:  %s\nreason:   %s\ndrivers:  %s\ndevices:  %d\n",
		out.Backend, out.Reason, strings.Join(out.Drivers, ", "), len(out.Devices))
	for _, d := range out.Devices {
		if d.Error != "" {
			fmt.Fprintf(&b, "\ndevice %d: error: %s\n", d.Ordinal, d.Error)
			continue
		}
		mem := report.FormatBytes(d.TotalMemoryBytes)
		if d.FreeMemoryBytes != 0 {
			mem += fmt.Sprintf(" (%s free)", report.FormatBytes(d.FreeMemoryBytes))
		}
		vmm := "no"
		if d.VMM {
			vmm = "yes, granularity " + report.FormatBytes(d.GranularityBytes)
		}
		fmt.Fprintf(&b, "\ndevice %d: %s\n", d.Ordinal, d.Name)
		tw := report.NewTabWriter(&b)
		fmt.Fprintf(tw, "  memory\t%s\n", mem)
		fmt.Fprintf(tw, "  compute capability\t%s\n", d.ComputeCapability)
		fmt.Fprintf(tw, "  driver version\t%s\n", driverVersion(d.DriverVersion))
		fmt.Fprintf(tw, "  virtual memory (VMM)\t%s\n", vmm)
		fmt.Fprintf(tw, "  stream memory ops\t%s\n", yesNo(d.StreamMemOps))
		fmt.Fprintf(tw, "  capabilities\t%s\n", strings.Join(d.Capabilities, ", "))
		tw.Flush()
	}
	if len(out.Libraries) > 0 {
		b.WriteString("\nlibraries:\n")
		tw := report.NewTabWriter(&b)
		for _, name := range slices.Sorted(maps.Keys(out.Libraries)) {
			fmt.Fprintf(tw, "  %s\t%s\n", name, out.Libraries[name])
		}
		tw.Flush()
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// driverVersion shows a CUDA-style version number (13000) with its
// major.minor reading.
func driverVersion(v int) string {
	if v >= 1000 {
		return fmt.Sprintf("%d (%d.%d)", v, v/1000, v%1000/10)
	}
	return fmt.Sprint(v)
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}
