package replay

// SetProbeTimesHook makes every probe's measured medians on device dev
// what f returns (nil: as measured), for tests of ranks that measure
// differently; it returns a function that restores the hook.
func SetProbeTimesHook(f func(dev int, strategy Name, gpuUS, hostUS float64) (float64, float64)) (restore func()) {
	old := probeTimesHook
	probeTimesHook = f
	return func() { probeTimesHook = old }
}
