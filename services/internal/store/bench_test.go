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

// BenchmarkCommit measures making one allocation durable (encode, append,
// fdatasync) beside states of two sizes: the cost does not depend on the
// state's size.
func BenchmarkCommit(b *testing.B) {
	for _, size := range []struct{ devices, allocations int }{{8, 4}, {10000, 1000}} {
		b.Run(fmt.Sprintf("devices=%d,allocations=%d", size.devices, size.allocations), func(b *testing.B) {
			dir := testutil.TempDir(b)
			d := benchData(size.devices, size.allocations)
			st, err := stateOf(d)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := writeSnapshot(Path(dir), 1, st); err != nil {
				b.Fatal(err)
			}
			j := New(dir, Options{})
			if _, err := j.Load(); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = j.Flush() }()
			a := d.Allocations[0]
			b.ResetTimer()
			for i := range b.N {
				a.PodUID = fmt.Sprintf("bench-%d", i)
				if err := Commit(j, Batch{Allocations: []Allocation{a}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSnapshot measures one atomic snapshot write (encode, checksum,
// temp file, fsync, rename, directory fsync), which compaction does in the
// background.
func BenchmarkSnapshot(b *testing.B) {
	for _, size := range []struct{ devices, allocations int }{{8, 4}, {10000, 1000}} {
		b.Run(fmt.Sprintf("devices=%d,allocations=%d", size.devices, size.allocations), func(b *testing.B) {
			dir := testutil.TempDir(b)
			st, err := stateOf(benchData(size.devices, size.allocations))
			if err != nil {
				b.Fatal(err)
			}
			path := filepath.Join(dir, FileName)
			b.ResetTimer()
			for range b.N {
				if _, err := writeSnapshot(path, 1, st); err != nil {
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
