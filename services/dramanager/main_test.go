package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// runtimeAt is the part of app.Runtime openJournal reads: the root dir and
// a log.
func runtimeAt(root string) *app.Runtime {
	return &app.Runtime{Config: app.Config{RootDir: root}, Log: slog.New(slog.DiscardHandler)}
}

// dirFiles reads every file of dir, by name.
func dirFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// An upgrade from a devicemanager that kept the DRA claims in its own
// checkpoint: the dramanager's first start imports them (a prepared claim
// and an intent), leaving the devicemanager's files as they were; its
// next start loads its own journal and imports nothing again, even after
// the claims it imported were removed from it.
func TestFirstStartImportsTheDeviceManagersClaims(t *testing.T) {
	root := testutil.TempDir(t)
	dmDir := layout.DevicePluginsDir(root)
	if err := os.MkdirAll(dmDir, 0o750); err != nil {
		t.Fatal(err)
	}
	old := []store.Claim{
		{UID: "uid-a", Namespace: "default", Name: "a", Drivers: []string{"gpu.example.com"}, State: store.ClaimPrepared,
			Devices: []store.ClaimDevice{{Requests: []string{"gpu"}, Driver: "gpu.example.com", Pool: "node", Device: "gpu-0", CDIDeviceIDs: []string{"gpu.example.com/gpu=gpu-0"}}},
			Pods:    []store.ClaimPod{{UID: "pod-1", Namespace: "default", Name: "p1"}}},
		{UID: store.IntentKey("pod-2", "default", "b"), Namespace: "default", Name: "b", State: store.ClaimIntent,
			Pods: []store.ClaimPod{{UID: "pod-2", Namespace: "default", Name: "p2"}}},
	}
	dm := store.New(dmDir, store.Options{})
	if _, err := dm.Load(); err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(dm, store.Batch{
		Allocations: []store.Allocation{{PodUID: "pod-3", ContainerName: "main", ResourceName: "example.com/dev", DeviceIDs: []string{"d0"}}},
		Claims:      old,
	}); err != nil {
		t.Fatal(err)
	}
	if err := dm.Flush(); err != nil {
		t.Fatal(err)
	}
	before := dirFiles(t, dmDir)

	j, err := openJournal(runtimeAt(root), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	saved, loaded := j.Saved()
	uids := func(cs []store.Claim) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.UID)
		}
		slices.Sort(out)
		return out
	}
	if !loaded || !slices.Equal(uids(saved), uids(old)) {
		t.Fatalf("first start: saved %v (loaded %v), want the devicemanager's claims %v", uids(saved), loaded, uids(old))
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	after := dirFiles(t, dmDir)
	if len(after) != len(before) {
		t.Fatalf("the devicemanager's files changed: %d before, %d after", len(before), len(after))
	}
	for name, b := range before {
		if !bytes.Equal(after[name], b) {
			t.Fatalf("the devicemanager's %s changed", name)
		}
	}
	d, err := store.ReadState(layout.DRAManagerDir(root))
	if err != nil || d == nil || !slices.Equal(uids(d.Claims), uids(old)) || len(d.Allocations) != 0 {
		t.Fatalf("the dramanager's journal holds %+v (%v), want the two claims and no allocation", d, err)
	}

	// The claims settle and leave the dramanager's journal; a restart
	// does not bring them back from the devicemanager's.
	j2 := store.New(layout.DRAManagerDir(root), store.Options{})
	if _, err := j2.Load(); err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(j2, store.Batch{RemovedClaims: uids(old)}); err != nil {
		t.Fatal(err)
	}
	if err := j2.Flush(); err != nil {
		t.Fatal(err)
	}
	j3, err := openJournal(runtimeAt(root), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if saved, _ := j3.Saved(); len(saved) != 0 {
		t.Fatalf("restart: saved %v, want nothing (imported once only)", uids(saved))
	}
	if err := j3.Flush(); err != nil {
		t.Fatal(err)
	}
}

// Without an older devicemanager's checkpoint the first start starts
// empty.
func TestFirstStartWithoutDeviceManagerCheckpoint(t *testing.T) {
	root := testutil.TempDir(t)
	j, err := openJournal(runtimeAt(root), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if saved, loaded := j.Saved(); !loaded || len(saved) != 0 {
		t.Fatalf("saved %v (loaded %v), want nothing", saved, loaded)
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
}
