package server

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

func TestRestartRestoresAndRedials(t *testing.T) {
	e := newEnv(t, time.Minute)
	reg := e.plugin("reg", sampleplugin.Options{Resource: "example.com/reg", Devices: 4, Preferred: true, PreStartRequired: true, CDI: true}, false)
	legacy := e.plugin("legacy", sampleplugin.Options{Resource: "example.com/legacy", Devices: 2}, true)
	gone := e.plugin("gone", sampleplugin.Options{Resource: "example.com/gone", Devices: 2}, false)
	e.mustRegister(reg)
	e.mustRegister(gone)
	if err := legacy.Register(ctxT(t), e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	e.waitCounts("example.com/reg", 4, 4)
	e.waitCounts("example.com/legacy", 2, 2)
	e.waitCounts("example.com/gone", 2, 2)
	reqs := []*dmv1.AllocateRequest{
		allocReq("pod1", "c", "example.com/reg", 2),
		allocReq("pod1", "c2", "example.com/legacy", 1),
		allocReq("pod2", "c", "example.com/gone", 1),
	}
	var answers []*dmv1.AllocateResponse
	for _, r := range reqs {
		a, err := e.client.Allocate(ctxT(t), r)
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, a)
	}
	before, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	oldID := e.m.InstanceID()
	regGen := e.resource("example.com/reg").GetEndpoints()[0].GetGeneration()

	e.shutdown()
	gone.Stop()
	// A socket of a plugin the devicemanager never knew: swept at start.
	testutil.StaleSocket(t, filepath.Join(e.dpDir, "stale.sock"))
	e.start()

	if e.m.InstanceID() == oldID {
		t.Fatal("instance id unchanged across a restart")
	}
	// Still-serving plugins are live again without registering anew.
	r := e.resource("example.com/reg")
	if r.GetAllocatable() != 4 || r.GetEndpoints()[0].GetState() == dmv1.EndpointState_ENDPOINT_STATE_STOPPED || r.GetEndpoints()[0].GetGeneration() != regGen {
		t.Fatalf("reg after restart: %v", r)
	}
	e.waitResource("example.com/legacy", "live", func(r *dmv1.Resource) bool {
		return r.GetAllocatable() == 2 && r.GetEndpoints()[0].GetState() == dmv1.EndpointState_ENDPOINT_STATE_LIVE
	})
	if _, err := os.Stat(legacy.SocketPath()); err != nil {
		t.Fatalf("the live legacy plugin's socket was swept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.dpDir, "stale.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale socket not swept: %v", err)
	}
	// The dead plugin's resource is kept, stopped, with its allocation.
	g := e.resource("example.com/gone")
	if g.GetCapacity() != 2 || g.GetAllocatable() != 0 || g.GetEndpoints()[0].GetState() != dmv1.EndpointState_ENDPOINT_STATE_STOPPED ||
		len(g.GetAllocatedDeviceIds()) != 1 || g.GetGraceDeadline() == nil {
		t.Fatalf("gone after restart: %v", g)
	}

	after, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	before.InstanceId, after.InstanceId = "", ""
	if !proto.Equal(before, after) {
		t.Fatalf("allocations changed across the restart:\n%v\n%v", before, after)
	}
	allocs, prestarts := reg.CallCount(sampleplugin.MethodAllocate), reg.CallCount(sampleplugin.MethodPreStartContainer)
	for i, r := range reqs[:2] {
		a, err := e.client.Allocate(ctxT(t), r)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(a, answers[i]) {
			t.Fatalf("restored answer differs:\n%v\n%v", a, answers[i])
		}
	}
	if reg.CallCount(sampleplugin.MethodAllocate) != allocs || reg.CallCount(sampleplugin.MethodPreStartContainer) != prestarts {
		t.Fatal("a restored allocation called the plugin again")
	}
	// The reconciler's re-registration with the same generation is a no-op.
	streams := reg.CallCount(sampleplugin.MethodListAndWatch)
	e.mustRegister(reg)
	if reg.CallCount(sampleplugin.MethodListAndWatch) != streams {
		t.Fatal("same-generation registration after a restart reconnected")
	}
}

func TestCorruptCheckpointMovedAside(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/c", Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/c", 2, 2)
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", "example.com/c", 1)); err != nil {
		t.Fatal(err)
	}
	e.shutdown()
	path := store.Path(e.dpDir)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := b[:len(b)-10] // truncated
	if err := os.WriteFile(path, corrupt, 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	matches, _ := filepath.Glob(path + ".corrupt-*")
	if len(matches) != 1 {
		t.Fatalf("corrupt checkpoint not moved aside: %v", matches)
	}
	// One loud line, naming the file and where it went.
	if n := strings.Count(e.logs.String(), "CHECKPOINT UNUSABLE"); n != 1 ||
		!e.logs.has("CHECKPOINT UNUSABLE: moved aside; starting with no allocations and no endpoints", "path", path, "moved_to", matches[0]) {
		t.Fatalf("%d loud lines, want one naming %s and %s:\n%s", n, path, matches[0], e.logs.String())
	}
	if got, _ := os.ReadFile(matches[0]); string(got) != string(corrupt) {
		t.Fatal("the moved-aside file differs from the corrupt one")
	}
	l, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil || len(l.GetAllocations()) != 0 {
		t.Fatalf("service after a corrupt checkpoint: %v, %v", l, err)
	}
	// It works and writes a fresh checkpoint.
	e.mustRegister(p)
	e.waitCounts("example.com/c", 2, 2)
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", "example.com/c", 1)); err != nil {
		t.Fatal(err)
	}
	d, err := store.ReadState(e.dpDir)
	if err != nil || len(d.Allocations) != 1 {
		t.Fatalf("fresh checkpoint: %v, %v", d, err)
	}
	if matches, _ := filepath.Glob(path + ".corrupt-*"); len(matches) != 1 || !strings.Contains(matches[0], "corrupt") {
		t.Fatalf("aside files: %v", matches)
	}
}

// TestCheckpointSymlinkNotFollowed: a symlink planted at the checkpoint
// path, to a file outside that holds a valid checkpoint of other
// allocations, is neither read nor written through. The service starts
// with none of the target's state, moves the link aside as it does a
// corrupt file and says so loudly; its next write puts a regular file in
// place, and the target keeps its bytes.
func TestCheckpointSymlinkNotFollowed(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/l", Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/l", 2, 2)
	if _, err := e.client.Allocate(ctxT(t), allocReq("planted-pod", "c", "example.com/l", 1)); err != nil {
		t.Fatal(err)
	}
	e.shutdown()
	// The victim: a valid checkpoint, outside the root, that would
	// restore an allocation if it were followed.
	path := store.Path(e.dpDir)
	victim := filepath.Join(testutil.TempDir(t), "victim")
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}

	e.start()
	if strings.Count(e.logs.String(), "CHECKPOINT UNUSABLE") != 1 ||
		!e.logs.has("CHECKPOINT UNUSABLE: moved aside; starting with no allocations and no endpoints", "path", path) ||
		!strings.Contains(e.logs.String(), "symbolic link") {
		t.Fatalf("no loud log line about the link:\n%s", e.logs.String())
	}
	matches, _ := filepath.Glob(path + ".corrupt-*")
	if len(matches) != 1 {
		t.Fatalf("link not moved aside: %v", matches)
	}
	if target, err := os.Readlink(matches[0]); err != nil || target != victim {
		t.Fatalf("moved aside %s: %q, %v; want the link itself", matches[0], target, err)
	}
	if l, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{}); err != nil || len(l.GetAllocations()) != 0 {
		t.Fatalf("the link's target was read: %v, %v", l, err)
	}
	e.mustRegister(p)
	e.waitCounts("example.com/l", 2, 2)
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", "example.com/l", 1)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("checkpoint after a write: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != string(content) {
		t.Fatalf("the link's target was written (%d bytes, %v)", len(b), err)
	}
}

// TestOlderCheckpointMigrated: a checkpoint of the older format (the whole
// state in one version 1 file, as earlier releases wrote it) restores every
// allocation, with its pod's namespace and name, and every endpoint, with
// no loud log; it is rewritten as a snapshot with a journal beside it.
func TestOlderCheckpointMigrated(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/old", Devices: 4}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/old", 4, 4)
	if _, err := e.client.Allocate(ctxT(t), namedReq("pod1", "default", "web-0", "c", "example.com/old", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod2", "c", "example.com/old", 1)); err != nil {
		t.Fatal(err)
	}
	before, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.shutdown()

	// The same state, as a version 1 checkpoint and nothing else.
	d, err := store.ReadState(e.dpDir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	v1 := fmt.Sprintf(`{"version":1,"checksum":"sha256:%s","data":%s}`, hex.EncodeToString(sum[:]), data)
	old, _ := filepath.Glob(store.Path(e.dpDir) + "*")
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(store.Path(e.dpDir), []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}

	e.start()
	if strings.Contains(e.logs.String(), "CHECKPOINT UNUSABLE") {
		t.Fatalf("a version 1 checkpoint was refused:\n%s", e.logs.String())
	}
	e.waitCounts("example.com/old", 4, 4)
	after, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	before.InstanceId, after.InstanceId = "", ""
	if !proto.Equal(before, after) {
		t.Fatalf("allocations changed across the migration:\n%v\n%v", before, after)
	}
	if b, err := os.ReadFile(store.Path(e.dpDir)); err != nil || !strings.HasPrefix(string(b), `{"version":2,`) {
		t.Fatalf("not rewritten as a snapshot: %.40s, %v", b, err)
	}
	if _, err := e.client.Allocate(ctxT(t), namedReq("pod1", "other", "web-0", "c2", "example.com/old", 1)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("the migrated pod identity was not enforced: %v", err)
	}
}
