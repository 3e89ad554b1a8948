package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// BenchmarkAllocateRelease measures one Allocate (device choice, plugin call
// and checkpoint write included) plus its Release, over gRPC, with plugins
// of 64 and 10,000 devices.
func BenchmarkAllocateRelease(b *testing.B) {
	for _, devices := range []int{64, 10000} {
		b.Run(fmt.Sprintf("devices=%d", devices), func(b *testing.B) { benchAllocateRelease(b, devices) })
	}
}

func benchAllocateRelease(b *testing.B, devices int) {
	e := newBenchEnv(b)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/bench", Devices: devices}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/bench", int64(devices), int64(devices))
	b.ResetTimer()
	for i := range b.N {
		pod := fmt.Sprintf("pod-%d", i)
		if _, err := e.client.Allocate(b.Context(), allocReq(pod, "c", "example.com/bench", 2)); err != nil {
			b.Fatal(err)
		}
		if _, err := e.client.Release(b.Context(), &dmv1.ReleaseRequest{PodUid: pod}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRegister measures a RegisterPlugin of a new generation (dial,
// GetDevicePluginOptions, ListAndWatch opened) until its first update.
func BenchmarkRegister(b *testing.B) {
	e := newBenchEnv(b)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/bench", Devices: 4}, false)
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.client.RegisterPlugin(b.Context(), &dmv1.RegisterPluginRequest{
			ResourceName: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: fmt.Sprint(i),
		}); err != nil {
			b.Fatal(err)
		}
		e.waitResource("example.com/bench", "live", func(r *dmv1.Resource) bool {
			return r.GetEndpoints()[0].GetState() == dmv1.EndpointState_ENDPOINT_STATE_LIVE
		})
	}
}

func newBenchEnv(b *testing.B) *env {
	return newEnv(b, time.Minute)
}

// BenchmarkStartContainer measures one StartContainer over gRPC (the
// container's spec written again, every CDI name resolved in the spec
// directories, no PreStartContainer) with 1 and 1,000 containers
// allocated, so as many specs in the directory a start reads.
func BenchmarkStartContainer(b *testing.B) {
	for _, containers := range []int{1, 1000} {
		b.Run(fmt.Sprintf("containers=%d", containers), func(b *testing.B) { benchStartContainer(b, containers) })
	}
}

func benchStartContainer(b *testing.B, containers int) {
	e := newBenchEnv(b)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/bench", Devices: containers}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/bench", int64(containers), int64(containers))
	for i := range containers {
		if _, err := e.client.Allocate(b.Context(), allocReq(fmt.Sprintf("pod-%d", i), "c", "example.com/bench", 1)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.client.StartContainer(b.Context(), startReq(fmt.Sprintf("pod-%d", i%containers), "c")); err != nil {
			b.Fatal(err)
		}
	}
}
