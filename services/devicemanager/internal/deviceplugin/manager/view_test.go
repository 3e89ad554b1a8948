package manager

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
)

// TestViewAndChoiceFollowHealth: the device lists an allocation reads
// without walking the devices (the view's healthy and unhealthy IDs, its
// free count, the allocator's candidates) follow every change of health:
// a device turning unhealthy, turning healthy again, and the endpoint
// going away, which makes every device unhealthy.
func TestViewAndChoiceFollowHealth(t *testing.T) {
	const res = "example.com/health"
	m, p, _ := registered(t, res, 4)
	view := func() ResourceInfo {
		t.Helper()
		rs := m.ListResources()
		if len(rs) != 1 {
			t.Fatalf("resources %+v", rs)
		}
		return rs[0]
	}
	waitView := func(what string, healthy, unhealthy []string, free int64) {
		t.Helper()
		testutil.Eventually(t, what, func() error {
			v := view()
			if !slices.Equal(v.Healthy, healthy) || !slices.Equal(v.Unhealthy, unhealthy) || v.Free != free || v.Allocatable != int64(len(healthy)) {
				return fmt.Errorf("healthy %v unhealthy %v free %d allocatable %d", v.Healthy, v.Unhealthy, v.Free, v.Allocatable)
			}
			return nil
		})
	}
	var ids []string
	for _, d := range p.Devices() {
		ids = append(ids, d.GetID())
	}
	if len(ids) != 4 {
		t.Fatalf("plugin devices %v", ids)
	}
	slices.Sort(ids)
	allocate := func(pod string, n int64) ([]string, error) {
		got, err := m.Allocate(ctxT(t), &allocator.Request{PodUID: pod, Container: "c", Resources: []allocator.ResourceRequest{{Name: res, Count: n}}})
		if err != nil {
			return nil, err
		}
		return got[0].DeviceIDs, nil
	}

	got, err := allocate("pod-1", 1)
	if err != nil || !slices.Equal(got, ids[:1]) {
		t.Fatalf("first allocation %v, %v; want the lowest ID %s", got, err, ids[0])
	}
	waitView("one allocated", ids, nil, 3)

	// The second device turns unhealthy: it is neither free nor chosen.
	if err := p.SetHealth(ids[1], false); err != nil {
		t.Fatal(err)
	}
	waitView(ids[1]+" unhealthy", []string{ids[0], ids[2], ids[3]}, ids[1:2], 2)
	if got, err := allocate("pod-2", 1); err != nil || !slices.Equal(got, ids[2:3]) {
		t.Fatalf("allocation beside an unhealthy device: %v, %v; want %s", got, err, ids[2])
	}
	waitView("two allocated", []string{ids[0], ids[2], ids[3]}, ids[1:2], 1)
	if _, err := allocate("pod-3", 2); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("two devices with one free: %v, want FailedPrecondition", err)
	}

	// An allocated device turning unhealthy no longer counts as taken
	// from the free ones, and a healthy one again is free again.
	if err := p.SetHealth(ids[0], false); err != nil {
		t.Fatal(err)
	}
	if err := p.SetHealth(ids[1], true); err != nil {
		t.Fatal(err)
	}
	waitView("health swapped", ids[1:], ids[:1], 2)
	if got, err := allocate("pod-3", 2); err != nil || !slices.Equal(got, []string{ids[1], ids[3]}) {
		t.Fatalf("allocation after the swap: %v, %v; want %s and %s", got, err, ids[1], ids[3])
	}
	waitView("all healthy ones taken", ids[1:], ids[:1], 0)

	// The plugin goes: every device is unhealthy for the grace period.
	p.Stop()
	waitView("endpoint gone", nil, ids, 0)
	if _, err := allocate("pod-4", 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("allocation with no live endpoint: %v, want FailedPrecondition", err)
	}
}
