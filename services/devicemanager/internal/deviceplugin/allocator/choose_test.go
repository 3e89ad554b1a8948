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
	offer, err := Offer(snap, ResourceRequest{Name: "example.com/r", Count: 3})
	if err != nil || !slices.Equal(offer.Available, []string{"a", "c", "d"}) || offer.MustInclude != nil || offer.Chosen != nil {
		t.Fatalf("Offer = %+v, %v; want [a c d] available", offer, err)
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

// The devices a container may share (an init container's) are chosen
// first, before free ones, as the kubelet takes its devicesToReuse first;
// a must-include device may be one of them; the kubelet's error counts the
// devices still needed after them. When they complete the request, Offer
// chooses them with no plugin call to make; else it offers them with the
// free ones, as must-include.
func TestReusableFirst(t *testing.T) {
	taken := map[string]bool{"b": true, "c": true, "e": true}
	snap := Snapshot{Resource: "example.com/r", Healthy: []string{"a", "b", "c", "d", "e", "f"},
		Taken: func(id string) bool { return taken[id] }, Reusable: []string{"c", "e"}}
	for _, tc := range []struct {
		rr   ResourceRequest
		want []string
	}{
		{ResourceRequest{Name: "example.com/r", Count: 1}, []string{"c"}},
		{ResourceRequest{Name: "example.com/r", Count: 2}, []string{"c", "e"}},
		{ResourceRequest{Name: "example.com/r", Count: 3}, []string{"a", "c", "e"}},
		{ResourceRequest{Name: "example.com/r", Count: 2, MustInclude: []string{"e"}}, []string{"c", "e"}},
		{ResourceRequest{Name: "example.com/r", Count: 2, MustInclude: []string{"f"}}, []string{"c", "f"}},
	} {
		ids, err := Lowest(snap, tc.rr)
		if err != nil || !slices.Equal(ids, tc.want) {
			t.Errorf("Lowest(%+v) = %v, %v; want %v", tc.rr, ids, err, tc.want)
		}
	}
	offer, err := Offer(snap, ResourceRequest{Name: "example.com/r", Count: 2})
	if err != nil || !slices.Equal(offer.Chosen, []string{"c", "e"}) || offer.Available != nil {
		t.Fatalf("Offer of 2 = %+v, %v; want [c e] chosen", offer, err)
	}
	offer, err = Offer(snap, ResourceRequest{Name: "example.com/r", Count: 3})
	if err != nil || offer.Chosen != nil || !slices.Equal(offer.Available, []string{"a", "c", "d", "e", "f"}) ||
		!slices.Equal(offer.MustInclude, []string{"c", "e"}) {
		t.Fatalf("Offer of 3 = %+v, %v; want [a c d e f] available, [c e] must", offer, err)
	}
	// b is taken and not reusable: never chosen, not even as must-include.
	if _, err := Lowest(snap, ResourceRequest{Name: "example.com/r", Count: 1, MustInclude: []string{"b"}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Lowest with a taken must-include: %v", err)
	}
	// 6 asked, 2 reused: 4 needed, 3 free.
	for name, choose := range map[string]func() error{
		"Lowest": func() error { _, err := Lowest(snap, ResourceRequest{Name: "example.com/r", Count: 6}); return err },
		"Offer":  func() error { _, err := Offer(snap, ResourceRequest{Name: "example.com/r", Count: 6}); return err },
	} {
		if err := choose(); err == nil || !strings.Contains(err.Error(), "Requested: 4, Available: 3") {
			t.Errorf("%s over the free count: %v", name, err)
		}
	}
}

// A container's kind is one of three; anything else is refused.
func TestValidateKind(t *testing.T) {
	req := Request{PodUID: "p", Container: "c", Resources: []ResourceRequest{{Name: "example.com/r", Count: 1}}}
	for _, k := range []ContainerKind{KindApp, KindInit, KindSidecar} {
		req.Kind = k
		if err := ValidateRequest(&req); err != nil {
			t.Errorf("kind %q: %v", k, err)
		}
	}
	req.Kind = "7"
	if err := ValidateRequest(&req); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "container kind") {
		t.Fatalf("kind 7: %v", err)
	}
}
