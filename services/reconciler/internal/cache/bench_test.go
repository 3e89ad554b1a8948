package cache

import (
	"fmt"
	"testing"
)

// BenchmarkDSWUpdates measures one socket's life in the desired state: a
// live CREATED (AddOrUpdate), the reconciler's look-up, and DELETED
// (Remove), with 1,000 other sockets present.
func BenchmarkDSWUpdates(b *testing.B) {
	d := NewDesiredStateOfWorld()
	for i := range 1000 {
		if _, err := d.AddOrUpdate(Socket{Path: fmt.Sprintf("/var/lib/kubelet/plugins_registry/p-%d.sock", i), Generation: "g"}); err != nil {
			b.Fatal(err)
		}
	}
	paths := make([]string, 1024)
	for i := range paths {
		paths[i] = fmt.Sprintf("/var/lib/kubelet/plugins_registry/bench-%d.sock", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p := paths[i%len(paths)]
		if _, err := d.AddOrUpdate(Socket{Path: p, Generation: "g1"}); err != nil {
			b.Fatal(err)
		}
		if _, ok := d.Get(p); !ok {
			b.Fatal("socket not found")
		}
		if !d.Remove(p, "g1") {
			b.Fatal("socket not removed")
		}
	}
}

// BenchmarkASWUpdates measures a registration's and a deregistration's
// bookkeeping in the actual state, with 1,000 other plugins registered.
func BenchmarkASWUpdates(b *testing.B) {
	a := NewActualStateOfWorld()
	for i := range 1000 {
		if err := a.Add(Plugin{SocketPath: fmt.Sprintf("/var/lib/kubelet/plugins_registry/p-%d.sock", i), Generation: "g", Name: "p", Type: "DRAPlugin", Handler: nopHandler{}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p := fmt.Sprintf("/var/lib/kubelet/plugins_registry/bench-%d.sock", i%1024)
		if err := a.Add(Plugin{SocketPath: p, Generation: "g1", Name: "bench.example.com", Type: "DRAPlugin", Handler: nopHandler{}}); err != nil {
			b.Fatal(err)
		}
		if !a.ExistsWithGeneration(p, "g1") {
			b.Fatal("plugin not found")
		}
		a.Remove(p)
	}
}

// BenchmarkDSWReplace measures a watcher snapshot of 1,000 sockets replacing
// a desired state that already holds them (a watcher restart).
func BenchmarkDSWReplace(b *testing.B) {
	d := NewDesiredStateOfWorld()
	snap := make([]Socket, 1000)
	for i := range snap {
		snap[i] = Socket{Path: fmt.Sprintf("/var/lib/kubelet/plugins_registry/p-%d.sock", i), Generation: "g"}
	}
	d.Replace(snap)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if added, changed, removed := d.Replace(snap); added+changed+removed != 0 {
			b.Fatalf("unchanged snapshot changed the DSW: +%d ~%d -%d", added, changed, removed)
		}
	}
}
