package localapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// nextEvent returns the next event of w, failing after the deadline.
func nextEvent(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("the watch ended")
		}
		return ev
	case <-time.After(testutil.Deadline):
		t.Fatal("no watch event")
	}
	return watch.Event{}
}

func TestCredentialsFiles(t *testing.T) {
	root := testutil.TempDir(t)
	startAPI(t, root, "")
	for _, id := range Identities {
		fi, err := os.Stat(KubeconfigPath(root, id))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", KubeconfigPath(root, id), fi.Mode().Perm())
		}
		fi, err = os.Stat(filepath.Join(layout.PKIDir(root), id.Name+".key"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s key: %v %v, want mode 0600", id.Name, fi, err)
		}
	}
}

func TestDriverCreatesListsAndWatchesWithFieldSelector(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	drv := clientFor(t, root, Driver).ResourceV1().ResourceSlices()

	mine, err := drv.Create(ctx, slice("", "gpu.example.com", testNode, "gpu-0"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mine.Name == "" || mine.UID == "" || mine.ResourceVersion == "" || mine.Generation != 1 {
		t.Fatalf("created slice lacks the server's fields: %+v", mine.ObjectMeta)
	}
	if _, err := a.Client.ResourceV1().ResourceSlices().Create(ctx, slice("other", "nic.example.com", testNode, "nic-0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sel := fields.Set{resourcev1.ResourceSliceSelectorDriver: "gpu.example.com", resourcev1.ResourceSliceSelectorNodeName: testNode}.String()
	list, err := drv.List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != mine.Name {
		t.Fatalf("list with %s: %d items, want only %s", sel, len(list.Items), mine.Name)
	}
	w, err := drv.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	other, _ := a.Client.ResourceV1().ResourceSlices().Get(ctx, "other", metav1.GetOptions{})
	other.Labels = map[string]string{"touched": "yes"}
	if _, err := a.Client.ResourceV1().ResourceSlices().Update(ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mine.Spec.Devices = append(mine.Spec.Devices, resourcev1.Device{Name: "gpu-1"})
	if _, err := drv.Update(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, w)
	got, ok := ev.Object.(*resourcev1.ResourceSlice)
	if ev.Type != watch.Modified || !ok || got.Name != mine.Name || len(got.Spec.Devices) != 2 || got.Generation != 2 {
		t.Fatalf("event %s %#v, want MODIFIED of %s with 2 devices at generation 2 (the other driver's change filtered out)", ev.Type, ev.Object, mine.Name)
	}
	if _, err := drv.List(ctx, metav1.ListOptions{FieldSelector: "spec.color=blue"}); !apierrors.IsBadRequest(err) {
		t.Fatalf("unknown field in a selector: %v, want 400", err)
	}
}

func TestWatchListSendsInitialEventsThenBookmark(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	slices := a.Client.ResourceV1().ResourceSlices()
	for i := range 3 {
		if _, err := slices.Create(ctx, slice(fmt.Sprintf("s-%d", i), "gpu.example.com", testNode, "gpu-0"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w, err := slices.Watch(ctx, metav1.ListOptions{
		SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 3 {
		if ev := nextEvent(t, w); ev.Type != watch.Added || ev.Object.(*resourcev1.ResourceSlice).Name != fmt.Sprintf("s-%d", i) {
			t.Fatalf("initial event %d: %s %v", i, ev.Type, ev.Object)
		}
	}
	ev := nextEvent(t, w)
	bm, _ := ev.Object.(*resourcev1.ResourceSlice)
	if ev.Type != watch.Bookmark || bm == nil || bm.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Fatalf("after the initial events: %s %#v, want a BOOKMARK annotated %s", ev.Type, ev.Object, metav1.InitialEventsAnnotationKey)
	}
	if bm.ResourceVersion != strconv.FormatUint(a.Local.ResourceVersion(), 10) {
		t.Fatalf("bookmark at %s, the store is at %d", bm.ResourceVersion, a.Local.ResourceVersion())
	}
	if _, err := slices.Watch(ctx, metav1.ListOptions{SendInitialEvents: ptr.To(true)}); !apierrors.IsBadRequest(err) {
		t.Fatalf("sendInitialEvents without resourceVersionMatch: %v, want 400", err)
	}
}

func TestPeriodicBookmarks(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "", func(o *Options) { o.BookmarkInterval = 20 * time.Millisecond })
	rv := strconv.FormatUint(a.Local.ResourceVersion(), 10)
	w, err := a.Client.ResourceV1().ResourceSlices().Watch(context.Background(), metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if ev := nextEvent(t, w); ev.Type != watch.Bookmark || ev.Object.(*resourcev1.ResourceSlice).ResourceVersion != rv {
		t.Fatalf("got %s %v, want a BOOKMARK at %s", ev.Type, ev.Object, rv)
	}
}

func TestStaleUpdateIsConflict(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	drv := clientFor(t, root, Driver).ResourceV1().ResourceSlices()
	s, err := drv.Create(ctx, slice("s", "gpu.example.com", testNode, "gpu-0"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := s.DeepCopy()
	first.Spec.Pool.Generation = 2
	if _, err := drv.Update(ctx, first, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale := s.DeepCopy()
	stale.Spec.Pool.Generation = 3
	if _, err := drv.Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("update with a stale resourceVersion: %v, want 409 Conflict", err)
	}
	err = drv.Delete(ctx, "s", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(types.UID("not-the-uid"))}})
	if !apierrors.IsConflict(err) {
		t.Fatalf("delete with a wrong UID precondition: %v, want 409", err)
	}
	err = drv.Delete(ctx, "s", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion}})
	if !apierrors.IsConflict(err) {
		t.Fatalf("delete with a stale resourceVersion precondition: %v, want 409", err)
	}
	cur, _ := a.Client.ResourceV1().ResourceSlices().Get(ctx, "s", metav1.GetOptions{})
	if err := drv.Delete(ctx, "s", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID, ResourceVersion: &cur.ResourceVersion}}); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Get(ctx, "s", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want 404", err)
	}
}

func TestRolesAreEnforced(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	drv := clientFor(t, root, Driver)
	_, err := drv.ResourceV1().ResourceSlices().Create(ctx, slice("theirs", "gpu.example.com", "node-b"), metav1.CreateOptions{})
	var st apierrors.APIStatus
	if !apierrors.IsForbidden(err) || !errors.As(err, &st) || st.Status().Details == nil || st.Status().Details.Kind != "resourceslices" {
		t.Fatalf("driver creating another node's slice: %v, want 403 with a Status naming resourceslices", err)
	}
	if _, err := a.Client.ResourceV1().ResourceSlices().Create(ctx, slice("theirs", "gpu.example.com", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := drv.ResourceV1().ResourceSlices().Delete(ctx, "theirs", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("driver deleting another node's slice: %v, want 403", err)
	}
	if err := drv.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("driver deleting every slice: %v, want 403", err)
	}
	if _, err := drv.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{}); err != nil {
		t.Fatalf("driver getting its node: %v", err)
	}
	reader := clientFor(t, root, Reader)
	if _, err := reader.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("reader listing: %v", err)
	}
	if _, err := reader.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("reader creating a class: %v, want 403", err)
	}
	if _, err := clientFor(t, root, Operator).ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("operator creating a class: %v", err)
	}
	if _, err := anonymous(t, a).ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("anonymous list: %v, want 401", err)
	}
}

// TestOpenRefusesBadFlags: a listen address off loopback and an invalid
// node name are refused, naming the flag.
func TestOpenRefusesBadFlags(t *testing.T) {
	root := testutil.TempDir(t)
	if _, err := Open(Options{RootDir: root, Listen: "0.0.0.0:0", NodeName: testNode}); err == nil || !strings.Contains(err.Error(), "--resource-api-listen") {
		t.Fatalf("a non-loopback --resource-api-listen: %v", err)
	}
	if _, err := Open(Options{RootDir: root, NodeName: "Not_A_Node"}); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Fatalf("an invalid --node-name: %v", err)
	}
}
