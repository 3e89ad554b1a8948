package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

func benchData(devices, allocations int) *Data {
	d := &Data{}
	r := Resource{Name: "example.com/bench", Endpoints: []Endpoint{{
		Endpoint: "/var/lib/kubelet/plugins_registry/bench.sock", SocketPath: "/var/lib/kubelet/plugins_registry/bench.sock",
		Generation: "fe00:1:b1", RegistrationPath: "plugins_registry", Versions: []string{"v1beta1"}, Registered: time.Now(), Primary: true,
	}}}
	for i := range devices {
		r.Devices = append(r.Devices, Device{ID: fmt.Sprintf("dev-%d", i), Healthy: true})
	}
	d.Resources = append(d.Resources, r)
	for i := range allocations {
		d.Allocations = append(d.Allocations, Allocation{PodUID: fmt.Sprintf("pod-%d", i), ContainerName: "main",
			ResourceName: r.Name, DeviceIDs: []string{fmt.Sprintf("dev-%d", i)}, Response: make([]byte, 200),
			TraceID: "0123456789abcdef0123456789abcdef", Allocated: time.Now()})
	}
	return d
}

// BenchmarkSave measures one atomic checkpoint write (marshal, checksum,
// temp file, fsync, rename, directory fsync).
func BenchmarkSave(b *testing.B) {
	for _, size := range []struct{ devices, allocations int }{{8, 4}, {10000, 1000}} {
		b.Run(fmt.Sprintf("devices=%d,allocations=%d", size.devices, size.allocations), func(b *testing.B) {
			dir := testutil.TempDir(b)
			d := benchData(size.devices, size.allocations)
			path := filepath.Join(dir, FileName)
			b.ResetTimer()
			for range b.N {
				if err := save(path, d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMarshal measures encoding alone (no I/O).
func BenchmarkMarshal(b *testing.B) {
	d := benchData(10000, 1000)
	b.ReportAllocs()
	for range b.N {
		if _, err := marshal(d); err != nil {
			b.Fatal(err)
		}
	}
}
