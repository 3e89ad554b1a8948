package upstream

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// kubeletCheckpointName is the kubelet's kubeletDeviceManagerCheckpoint.
const kubeletCheckpointName = "kubelet_internal_checkpoint"

// readKubeletCheckpoint reads device-plugins/kubelet_internal_checkpoint
// as the kubelet's device manager does: its checkpoint manager, its
// checkpoint type, its checksum (GetCheckpoint verifies it).
func readKubeletCheckpoint(dir string) ([]checkpoint.PodDevicesEntry, map[string][]string, error) {
	mgr, err := checkpointmanager.NewCheckpointManager(dir)
	if err != nil {
		return nil, nil, err
	}
	cp := checkpoint.New(nil, nil)
	if err := mgr.GetCheckpoint(kubeletCheckpointName, cp); err != nil {
		return nil, nil, err
	}
	if err := cp.VerifyChecksum(); err != nil {
		return nil, nil, err
	}
	entries, regs := cp.GetData()
	return entries, regs, nil
}

// entryByPod returns the entries by pod UID, their answers decoded.
func entryByPod(t *testing.T, entries []checkpoint.PodDevicesEntry) (map[string]checkpoint.PodDevicesEntry, map[string]*pluginapi.ContainerAllocateResponse) {
	t.Helper()
	out, answers := map[string]checkpoint.PodDevicesEntry{}, map[string]*pluginapi.ContainerAllocateResponse{}
	for _, e := range entries {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(e.AllocResp, resp); err != nil {
			t.Fatalf("entry %s: AllocResp: %v", e.PodUID, err)
		}
		out[e.PodUID], answers[e.PodUID] = e, resp
	}
	return out, answers
}

// TestKubeletReadsTheMirror: after real allocations through a running
// devicemanager, the kubelet's own checkpoint code reads
// kubelet_internal_checkpoint back, checksum verified: each container's
// devices by NUMA node (-1 for none), the plugin's answer, and the healthy
// devices of the resource. A Release reaches the file too: the last state
// always lands.
func TestKubeletReadsTheMirror(t *testing.T) {
	d := startDM(t)
	const res = "example.com/mirrored"
	sick := topoDevice("m-4", 1)
	sick.Health = pluginapi.Unhealthy
	d.topoStub("mirrored", res, []*pluginapi.Device{topoDevice("m-1", 0), topoDevice("m-2", 0, 1), topoDevice("m-3"), sick})
	// In this order: the expectations below depend on it.
	for _, a := range []struct {
		pod string
		n   int64
	}{{"pod-1", 2}, {"pod-2", 1}} {
		if _, err := allocate(t, d, a.pod, res, a.n); err != nil {
			t.Fatalf("Allocate %s: %v", a.pod, err)
		}
	}
	var entries map[string]checkpoint.PodDevicesEntry
	var answers map[string]*pluginapi.ContainerAllocateResponse
	testutil.Eventually(t, "both allocations in the kubelet-format checkpoint", func() error {
		list, regs, err := readKubeletCheckpoint(d.dpDir)
		if err != nil {
			return err
		}
		if len(list) != 2 {
			return fmt.Errorf("%d entries: %+v", len(list), list)
		}
		if want := map[string][]string{res: {"m-1", "m-2", "m-3"}}; !reflect.DeepEqual(sortedValues(regs), want) {
			return fmt.Errorf("RegisteredDevices %v, want %v", regs, want)
		}
		entries, answers = entryByPod(t, list)
		return nil
	})
	// The lowest IDs are chosen: m-1 and m-2 for pod-1, m-3 for pod-2.
	want := map[string]checkpoint.DevicesPerNUMA{
		"pod-1": {0: {"m-1", "m-2"}, 1: {"m-2"}},
		"pod-2": {-1: {"m-3"}},
	}
	for pod, ids := range want {
		e := entries[pod]
		if e.ContainerName != "c" || e.ResourceName != res || !reflect.DeepEqual(sortedValues(e.DeviceIDs), map[int64][]string(ids)) {
			t.Errorf("%s: %+v, want devices %v", pod, e, ids)
		}
		if got, want := answers[pod].GetEnvs()["STUB_DEVICES"], fmt.Sprint(slices.Sorted(maps.Keys(e.DeviceIDs.Devices()))); got != want {
			t.Errorf("%s: the plugin's answer names %s, want %s", pod, got, want)
		}
	}

	if _, err := d.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod-1"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the release in the kubelet-format checkpoint", func() error {
		list, _, err := readKubeletCheckpoint(d.dpDir)
		if err != nil {
			return err
		}
		if len(list) != 1 || list[0].PodUID != "pod-2" {
			return fmt.Errorf("entries %+v", list)
		}
		return nil
	})
}

// sortedValues returns m with every list sorted.
func sortedValues[K comparable](m map[K][]string) map[K][]string {
	out := make(map[K][]string, len(m))
	for k, v := range m {
		out[k] = slices.Sorted(slices.Values(v))
	}
	return out
}

// TestImportsKubeletCheckpoint: a devicemanager started for the first
// time beside a checkpoint the kubelet's own code wrote (migration from a
// kubelet) starts with its allocations: they are listed, their devices are
// not given to anyone else, the same request gets the kubelet's recorded
// answer without calling the plugin, and the kubelet's code reads them back
// from the mirror that replaces the file.
func TestImportsKubeletCheckpoint(t *testing.T) {
	root := testutil.TempDir(t)
	dpDir := filepath.Join(root, "device-plugins")
	if err := os.MkdirAll(dpDir, 0o750); err != nil {
		t.Fatal(err)
	}
	const res = "example.com/migrated"
	answer, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"FROM": "kubelet"}})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := checkpointmanager.NewCheckpointManager(dpDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.CreateCheckpoint(kubeletCheckpointName, checkpoint.New([]checkpoint.PodDevicesEntry{{
		PodUID: "pod-k", ContainerName: "c", ResourceName: res,
		DeviceIDs: checkpoint.DevicesPerNUMA{0: {"k-1"}, -1: {"k-2"}}, AllocResp: answer,
	}}, map[string][]string{res: {"k-1", "k-2", "k-3"}})); err != nil {
		t.Fatal(err)
	}

	d := &dm{t: t, root: root, dpDir: dpDir, procs: stack.NewProcesses(binDir, root)}
	d.start()
	t.Cleanup(func() {
		if d.conn != nil {
			_ = d.conn.Close()
		}
		if t.Failed() {
			if p := d.procs.Process("devicemanager"); p != nil {
				t.Logf("devicemanager log:\n%s", p.Logs())
			}
		}
		d.procs.Kill("devicemanager")
	})

	resp, err := d.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if a := resp.GetAllocations(); len(a) != 1 || a[0].GetPodUid() != "pod-k" || a[0].GetResourceName() != res ||
		!slices.Equal(a[0].GetDeviceIds(), []string{"k-1", "k-2"}) || a[0].GetContainerResponse().GetEnvs()["FROM"] != "kubelet" {
		t.Fatalf("allocations after the import: %v", a)
	}

	d.topoStub("migrated", res, []*pluginapi.Device{topoDevice("k-1", 0), topoDevice("k-2"), topoDevice("k-3")})
	if a, err := allocate(t, d, "pod-new", res, 1); err != nil || !slices.Equal(a.GetDeviceIds(), []string{"k-3"}) {
		t.Fatalf("Allocate beside the imported allocation: %v, %v; want k-3", a, err)
	}
	if a, err := allocate(t, d, "pod-k", res, 2); err != nil || !slices.Equal(a.GetDeviceIds(), []string{"k-1", "k-2"}) ||
		a.GetContainerResponse().GetEnvs()["FROM"] != "kubelet" {
		t.Fatalf("the imported container's Allocate again: %v, %v; want the kubelet's answer", a, err)
	}

	testutil.Eventually(t, "the imported allocation in the mirror", func() error {
		list, regs, err := readKubeletCheckpoint(dpDir)
		if err != nil {
			return err
		}
		if len(list) != 2 || len(regs[res]) != 3 {
			return fmt.Errorf("entries %+v, registered %v", list, regs)
		}
		entries, _ := entryByPod(t, list)
		if k := entries["pod-k"]; !reflect.DeepEqual(sortedValues(k.DeviceIDs), map[int64][]string{0: {"k-1"}, -1: {"k-2"}}) || !slices.Equal(k.AllocResp, answer) {
			return fmt.Errorf("pod-k: %+v", k)
		}
		return nil
	})
}
