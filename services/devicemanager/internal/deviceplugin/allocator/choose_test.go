package allocator

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// The kubelet's devicesToAllocate: must-include first, then the answered
// IDs that are available in the plugin's order up to the count, then the
// lowest free IDs; what was wrong with the answer is reported, never fatal.
func TestMergePreferred(t *testing.T) {
	avail := []string{"a", "b", "c", "d", "e"}
	tests := []struct {
		name     string
		answer   []string
		must     []string
		count    int
		want     []string
		problems bool
	}{
		{"as answered", []string{"e", "c"}, nil, 2, []string{"c", "e"}, false},
		{"answer with must-include", []string{"b", "e"}, []string{"b"}, 2, []string{"b", "e"}, false},
		{"empty", []string{}, nil, 2, []string{"a", "b"}, true},
		{"nil", nil, []string{"c"}, 2, []string{"a", "c"}, true},
		{"short", []string{"e"}, nil, 3, []string{"a", "b", "e"}, true},
		{"foreign", []string{"zz", "d", "yy"}, nil, 2, []string{"a", "d"}, true},
		{"only foreign", []string{"x", "y"}, nil, 2, []string{"a", "b"}, true},
		{"too long: plugin's order wins", []string{"e", "d", "c"}, nil, 2, []string{"d", "e"}, true},
		{"repeated", []string{"d", "d"}, nil, 2, []string{"a", "d"}, true},
		{"must-include ignored by the plugin", []string{"d", "e"}, []string{"a"}, 2, []string{"a", "d"}, true},
		{"all", []string{"c"}, nil, 5, avail, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := MergePreferred(tc.answer, avail, tc.must, tc.count)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("devices = %v, want %v", got, tc.want)
			}
			if (len(problems) > 0) != tc.problems {
				t.Fatalf("problems = %q, want some: %v", problems, tc.problems)
			}
		})
	}
}

// Lowest and Offer choose from the snapshot alone: taken and unhealthy
// devices are never chosen, must-include ones must be healthy and free, and
// too few free devices give the kubelet's error with the free count.
func TestLowestAndOffer(t *testing.T) {
	taken := map[string]bool{"b": true}
	snap := Snapshot{Resource: "example.com/r", Healthy: []string{"a", "b", "c", "d"}, Taken: func(id string) bool { return taken[id] }}
	ids, err := Lowest(snap, ResourceRequest{Name: "example.com/r", Count: 2, MustInclude: []string{"d"}})
	if err != nil || !slices.Equal(ids, []string{"a", "d"}) {
		t.Fatalf("Lowest = %v, %v; want [a d]", ids, err)
	}
	free, err := Offer(snap, ResourceRequest{Name: "example.com/r", Count: 3})
	if err != nil || !slices.Equal(free, []string{"a", "c", "d"}) {
		t.Fatalf("Offer = %v, %v; want [a c d]", free, err)
	}
	for _, rr := range []ResourceRequest{
		{Name: "example.com/r", Count: 4},
		{Name: "example.com/r", Count: 1, MustInclude: []string{"b"}},
		{Name: "example.com/r", Count: 1, MustInclude: []string{"zz"}},
	} {
		if _, err := Lowest(snap, rr); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Lowest(%+v) = %v, want a failed precondition", rr, err)
		}
		if _, err := Offer(snap, rr); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Offer(%+v) = %v, want a failed precondition", rr, err)
		}
	}
	if _, err := Lowest(snap, ResourceRequest{Name: "example.com/r", Count: 4}); err == nil || !strings.Contains(err.Error(), "Requested: 4, Available: 3") {
		t.Fatalf("Lowest over the free count: %v", err)
	}
}
