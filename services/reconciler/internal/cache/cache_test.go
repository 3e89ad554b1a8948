package cache

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func TestDSWReplace(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		before, snapshot        []Socket
		added, changed, removed int
		want                    []string // path=generation
	}{
		{"empty to some", nil, []Socket{{Path: "/a", Generation: "1"}}, 1, 0, 0, []string{"/a=1"}},
		{"same generations", []Socket{{Path: "/a", Generation: "1"}}, []Socket{{Path: "/a", Generation: "1"}}, 0, 0, 0, []string{"/a=1"}},
		{"new generation", []Socket{{Path: "/a", Generation: "1"}}, []Socket{{Path: "/a", Generation: "2"}}, 0, 1, 0, []string{"/a=2"}},
		{"gone", []Socket{{Path: "/a", Generation: "1"}, {Path: "/b", Generation: "1"}}, []Socket{{Path: "/b", Generation: "1"}}, 0, 0, 1, []string{"/b=1"}},
		{"empty path ignored", nil, []Socket{{Path: ""}}, 0, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDesiredStateOfWorld()
			for _, s := range tc.before {
				if _, err := d.AddOrUpdate(s); err != nil {
					t.Fatal(err)
				}
			}
			a, c, r := d.Replace(tc.snapshot)
			if a != tc.added || c != tc.changed || r != tc.removed {
				t.Fatalf("Replace = %d/%d/%d, want %d/%d/%d", a, c, r, tc.added, tc.changed, tc.removed)
			}
			var got []string
			for _, s := range d.List() {
				got = append(got, s.Path+"="+s.Generation)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("DSW = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDSWKeepsEntryForSameGeneration(t *testing.T) {
	d := NewDesiredStateOfWorld()
	if changed, _ := d.AddOrUpdate(Socket{Path: "/a", Generation: "1", TraceContext: map[string]string{"traceparent": "x"}}); !changed {
		t.Fatal("first add not a change")
	}
	if changed, _ := d.AddOrUpdate(Socket{Path: "/a", Generation: "1"}); changed {
		t.Fatal("same generation counted as a change")
	}
	if s, _ := d.Get("/a"); s.TraceContext["traceparent"] != "x" {
		t.Fatal("entry replaced by the same generation")
	}
	if _, err := d.AddOrUpdate(Socket{}); !errors.Is(err, ErrEmptySocketPath) || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("empty path error = %v", err)
	}
	if d.Remove("/a", "2") {
		t.Fatal("removed a newer generation")
	}
	if !d.Remove("/a", "1") || d.Exists("/a") || d.Len() != 0 {
		t.Fatal("remove failed")
	}
}

type nopHandler struct{}

func (nopHandler) Validate(context.Context, string, string, []string) error { return nil }
func (nopHandler) Register(context.Context, Plugin) error                   { return nil }
func (nopHandler) Deregister(context.Context, Plugin) error                 { return nil }

func TestASW(t *testing.T) {
	a := NewActualStateOfWorld()
	if err := a.Add(Plugin{SocketPath: "/a", Generation: "1"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Add without handler = %v", err)
	}
	if err := a.Add(Plugin{SocketPath: "/a", Generation: "1", Handler: nopHandler{}}); err != nil {
		t.Fatal(err)
	}
	if !a.ExistsWithGeneration("/a", "1") || a.ExistsWithGeneration("/a", "2") || a.Len() != 1 {
		t.Fatal("ExistsWithGeneration")
	}
	a.Remove("/a")
	if _, ok := a.Get("/a"); ok || len(a.List()) != 0 {
		t.Fatal("Remove")
	}
}
