package chaos

import (
	"strings"
	"testing"
)

// TestCheckReportsViolations shows that the checker fails when it should:
// a lost allocation, a double allocation, a changed answer, a resurrected
// release, a duplicate registration and a dip are each reported.
func TestCheckReportsViolations(t *testing.T) {
	k1 := AllocKey{"pod-1", "c", "chaos.example.com/r0"}
	k2 := AllocKey{"pod-2", "c", "chaos.example.com/r0"}
	live := []LivePlugin{{Resource: "chaos.example.com/r0", Socket: "/r/plugins_registry/p0.sock", Devices: 4, Registry: true}}
	good := func() State {
		return State{
			Acked:        map[AllocKey][]string{k1: {"dev-0"}, k2: {"dev-1"}},
			Released:     map[string]bool{"pod-9": true},
			Allocations:  []Listed{{k1, []string{"dev-0"}}, {k2, []string{"dev-1"}}},
			CheckSpecs:   true,
			Specs:        map[string]bool{"pod-1_c": true, "pod-2_c": true},
			CheckPlugins: true,
			Plugins:      []ListedPlugin{{Socket: "/r/plugins_registry/p0.sock", Registered: true}},
			Resources:    []ListedResource{{Name: "chaos.example.com/r0", Allocatable: 4, Sockets: []string{"/r/plugins_registry/p0.sock"}}},
			Live:         live,
		}
	}
	tests := []struct {
		name   string
		mutate func(*State)
		inv    string
		detail string
	}{
		{"lost allocation", func(s *State) { s.Allocations = s.Allocations[:1] }, "a", "pod-2/c/chaos.example.com/r0 (dev-1) is not listed"},
		{"double allocation", func(s *State) { s.Allocations[1].Devices = []string{"dev-0"}; s.Acked[k2] = []string{"dev-0"} }, "b", "device chaos.example.com/r0/dev-0 held by"},
		{"other devices", func(s *State) { s.Allocations[1].Devices = []string{"dev-2"} }, "a", "lists devices dev-2, acknowledged dev-1"},
		{"released pod listed", func(s *State) {
			s.Allocations = append(s.Allocations, Listed{AllocKey{"pod-9", "c", "chaos.example.com/r0"}, []string{"dev-3"}})
		}, "a", "after its pod's release"},
		{"socket twice", func(s *State) { s.Plugins = append(s.Plugins, s.Plugins[0]) }, "c", "listed 2 times"},
		{"plugin missing", func(s *State) { s.Plugins = nil }, "c", "not listed"},
		{"capacity short", func(s *State) { s.Resources[0].Allocatable = 3 }, "c", "allocatable 3, want 4"},
		{"spec missing", func(s *State) { delete(s.Specs, "pod-2_c") }, "k", "allocated container pod-2_c has no CDI spec"},
		{"spec left", func(s *State) { s.Specs["pod-9_c"] = true }, "k", "CDI spec of pod-9_c left with no allocation listed"},
	}
	if v := Check("baseline", good()); len(v) != 0 {
		t.Fatalf("a correct state reported violations: %v", v)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good()
			tt.mutate(&s)
			vs := Check("test", s)
			for _, v := range vs {
				if v.Invariant == tt.inv && strings.Contains(v.Detail, tt.detail) {
					return
				}
			}
			t.Fatalf("want a (%s) violation containing %q, got %v", tt.inv, tt.detail, vs)
		})
	}
}

func TestDipTracker(t *testing.T) {
	d := NewDipTracker(map[string]int64{"r": 4})
	steps := []struct {
		alloc   int64
		removed bool
		dip     bool
	}{
		{0, false, false}, // not yet seen in full: registration in progress
		{4, false, false},
		{4, false, false},
		{3, false, true},
		{4, false, false},
		{4, true, true},
	}
	for i, s := range steps {
		if got := d.Observe("r", s.alloc, s.removed) != ""; got != s.dip {
			t.Fatalf("step %d (%d, removed=%v): dip=%v, want %v", i, s.alloc, s.removed, got, s.dip)
		}
	}
	if d.Observe("other", 0, true) != "" {
		t.Fatal("a resource not watched reported a dip")
	}
}
