package resourceapi

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

func openTestServer(t *testing.T, path string, lim Limits) (*Server, *Store) {
	t.Helper()
	st, err := OpenStore(path, lim)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(Config{Store: st, NodeName: "n"})
	if err != nil {
		t.Fatal(err)
	}
	return srv, st
}

func testSlice(name string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
		Driver: "d.example.com", NodeName: ptr.To("n"), Pool: resourcev1.ResourcePool{Name: "n", ResourceSliceCount: 1},
	}}
}

func put(t *testing.T, st *Store, obj runtime.Object) runtime.Object {
	t.Helper()
	out, err := st.mutate(kindSlice, objectKey(obj), func(runtime.Object) (runtime.Object, error) { return obj, nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStoreHistoryAndReopen: resourceVersions grow by one per write and
// keep growing after a reopen; the history keeps the last writes; a reopen
// serves watches from its own resourceVersion on only.
func TestStoreHistoryAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.db")
	_, st := openTestServer(t, path, Limits{HistoryEvents: 2})
	base := st.ResourceVersion() // the Node
	for i := range 4 {
		put(t, st, testSlice("s"+strconv.Itoa(i)))
	}
	if got := st.ResourceVersion(); got != base+4 {
		t.Fatalf("resourceVersion %d after 4 writes from %d", got, base)
	}
	if _, _, err := st.subscribe(kindSlice, watchStart{from: base + 1}, "t", nil); err == nil {
		t.Fatal("a watch from before the history kept was served")
	}
	w, _, err := st.subscribe(kindSlice, watchStart{from: base + 2}, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	if past, _, _, _ := st.pending(w); len(past) != 2 {
		t.Fatalf("watch from the history's start: %d events; want 2", len(past))
	}
	st.unsubscribe(w)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	_, st2 := openTestServer(t, path, Limits{HistoryEvents: 2})
	defer st2.Close()
	if got := st2.ResourceVersion(); got != base+4 {
		t.Fatalf("resourceVersion %d after a reopen, want %d", got, base+4)
	}
	if objs, _ := st2.list(kindSlice, func(runtime.Object) bool { return true }); len(objs) != 4 {
		t.Fatalf("%d slices after a reopen, want 4", len(objs))
	}
	if _, _, err := st2.subscribe(kindSlice, watchStart{from: base + 3}, "t", nil); err == nil {
		t.Fatal("a watch from before the reopen was served from a history the reopen does not have")
	}
	if out := put(t, st2, testSlice("s9")); out.(*resourcev1.ResourceSlice).ResourceVersion != strconv.FormatUint(base+5, 10) {
		t.Fatalf("first write after a reopen at %s, want %d", out.(*resourcev1.ResourceSlice).ResourceVersion, base+5)
	}
}

// TestGarbageNeverFailsTheServer sends malformed bodies, paths and options
// to every route: each gets a 4xx Status and the server keeps serving.
func TestGarbageNeverFailsTheServer(t *testing.T) {
	srv, st := openTestServer(t, filepath.Join(t.TempDir(), "api.db"), Limits{})
	defer st.Close()
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "t", Organization: []string{RoleInternal}}}
	state := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}, VerifiedChains: [][]*x509.Certificate{{cert}}}
	bodies := [][]byte{nil, []byte("{"), []byte("null"), []byte("[]"), []byte(`{"kind":"ResourceSlice"}`),
		[]byte(`{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"x"},"spec":{"devices":"no"}}`),
		bytes.Repeat([]byte("x"), 4<<20), {0xff, 0xfe, 0x00}}
	paths := []string{"/apis/resource.k8s.io/v1/resourceslices", "/apis/resource.k8s.io/v1/resourceslices/x",
		"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x/status",
		"/apis/resource.k8s.io/v1/deviceclasses/x", "/api/v1/nodes/n", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=%%%",
		"/apis/resource.k8s.io/v1/resourceslices?resourceVersion=abc", "/apis/resource.k8s.io/v1/resourceslices?watch=true&resourceVersion=-1",
		"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x/y/z", "/apis/resource.k8s.io/v1/namespaces//resourceclaims"}
	types := []string{"application/json", "application/vnd.kubernetes.protobuf", "application/merge-patch+json",
		"application/strategic-merge-patch+json", "application/json-patch+json", "text/plain"}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodGet} {
		for _, p := range paths {
			for _, body := range bodies {
				for _, ct := range types {
					req := httptest.NewRequest(method, p, bytes.NewReader(body))
					req.TLS = state
					req.Header.Set("Content-Type", ct)
					rec := httptest.NewRecorder()
					srv.ServeHTTP(rec, req)
					if rec.Code >= 500 {
						t.Fatalf("%s %s (%s, %d bytes): %d %s", method, p, ct, len(body), rec.Code, rec.Body)
					}
				}
			}
		}
	}
	if _, err := st.mutate(kindSlice, "ok", func(runtime.Object) (runtime.Object, error) { return testSlice("ok"), nil }); err != nil {
		t.Fatal(err)
	}
}
