package replay

import "fmt"

// Bound is what bounds a step's time, by which auto ranks the candidates it
// measured (see pickProbed). The root package's AutoBound is this type.
//
// A step awaited before the next one starts (a decode loop that samples
// each token) takes its host time and then its GPU time: its latency,
// about host + GPU. Steps run back to back (a training loop) overlap one
// step's host time with the previous step's GPU time: each takes the
// larger of the two. Either way GPU time alone never ranks a candidate: one
// whose host time exceeds its GPU time is bound by its host time.
type Bound string

const (
	// BoundLatency ranks by host + GPU time: steps awaited one at a
	// time. The default: it never ranks a candidate much worse than
	// BoundThroughput would, while the converse does not hold (a
	// candidate with less GPU time but more host time wins every
	// throughput tie and loses latency).
	BoundLatency Bound = "latency"
	// BoundThroughput ranks by the larger of host and GPU time: steps run
	// back to back.
	BoundThroughput Bound = "throughput"
)

// ParseBound returns the bound named s; "" is the default, BoundLatency.
func ParseBound(s string) (Bound, error) {
	switch b := Bound(s); b {
	case "":
		return BoundLatency, nil
	case BoundLatency, BoundThroughput:
		return b, nil
	}
	return "", fmt.Errorf("unknown auto bound %q (latency or throughput)", s)
}

// other is the bound that breaks ties of b.
func (b Bound) other() Bound {
	if b == BoundThroughput {
		return BoundLatency
	}
	return BoundThroughput
}

// cost is a step's time under b, from its GPU and host times.
func (b Bound) cost(gpuUS, hostUS float64) float64 {
	if b == BoundThroughput {
		return max(gpuUS, hostUS)
	}
	return gpuUS + hostUS
}

// says describes b for a Choice's reason.
func (b Bound) says() string {
	if b == BoundThroughput {
		return "throughput: the larger of host and GPU time, steps run back to back (Options.Auto.Bound)"
	}
	return "latency: host + GPU time, each step awaited before the next (Options.Auto.Bound; the default)"
}
