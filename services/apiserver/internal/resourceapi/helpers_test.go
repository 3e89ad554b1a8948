package resourceapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/certs"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

const testNode = "n"

// testAPI is a Server over real HTTPS on loopback, with a CA that issues
// client certificates per identity.
type testAPI struct {
	t   *testing.T
	srv *Server
	st  *Store
	url string
	ca  *certs.CA
	reg *prometheus.Registry
}

// startAPI serves a Server with lim (and cfg's changes) until the test
// ends.
func startAPI(t *testing.T, lim Limits, tune ...func(*Config)) *testAPI {
	t.Helper()
	st, err := OpenStore(filepath.Join(t.TempDir(), "api.db"), lim)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := Config{Store: st, NodeName: testNode, Registerer: reg}
	for _, f := range tune {
		f(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := certs.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(certs.Spec{Name: "server", Server: true})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, tlsCfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		_ = st.Close()
	})
	return &testAPI{t: t, srv: srv, st: st, url: "https://" + lis.Addr().String(), ca: ca, reg: reg}
}

// config is a client configuration for name with roles.
func (a *testAPI) config(name string, roles ...string) *rest.Config {
	a.t.Helper()
	certPEM, keyPEM, err := a.ca.Issue(certs.Spec{Name: name, Orgs: roles})
	if err != nil {
		a.t.Fatal(err)
	}
	return &rest.Config{Host: a.url, QPS: -1, Timeout: 30 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{CAData: a.ca.PEM, CertData: certPEM, KeyData: keyPEM}}
}

// client is a clientset for name with roles.
func (a *testAPI) client(name string, roles ...string) kubernetes.Interface {
	a.t.Helper()
	return a.clientFor(a.config(name, roles...))
}

// watchClient is client without config's request timeout, which ends a
// watch (the whole response) that outlives it, as one may on a busy
// machine.
func (a *testAPI) watchClient(name string, roles ...string) kubernetes.Interface {
	a.t.Helper()
	cfg := a.config(name, roles...)
	cfg.Timeout = 0
	return a.clientFor(cfg)
}

func (a *testAPI) clientFor(cfg *rest.Config) kubernetes.Interface {
	a.t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

// metric is the value of a metric with labels ("k=v"), 0 when absent.
func (a *testAPI) metric(name string, labels ...string) float64 {
	a.t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		a.t.Fatal(err)
	}
	want := map[string]string{}
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		want[k] = v
	}
	v, _ := testutil.MetricValue(testutil.FindMetric(mfs, name, want))
	return v
}

// silentWatch opens a watch of ResourceSlices over HTTP/1.1 with cfg's
// certificate and never reads past its status line. It returns the
// status line and the connection (closed when the test ends).
func (a *testAPI) silentWatch(cfg *rest.Config, query string) (string, net.Conn) {
	a.t.Helper()
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		a.t.Fatal(err)
	}
	host := strings.TrimPrefix(a.url, "https://")
	c, err := tls.Dial("tcp", host, tlsCfg)
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { _ = c.Close() })
	fmt.Fprintf(c, "GET /apis/resource.k8s.io/v1/resourceslices?watch=true%s HTTP/1.1\r\nHost: %s\r\n\r\n", query, host)
	status, err := bufio.NewReaderSize(c, 16).ReadString('\n')
	if err != nil {
		a.t.Fatal(err)
	}
	return strings.TrimSpace(status), c
}

// slice is a valid ResourceSlice of this node.
func slice(name string, devices ...string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
		Driver: "d.example.com", NodeName: ptr.To(testNode), Pool: resourcev1.ResourcePool{Name: testNode, ResourceSliceCount: 1},
	}}
	for _, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d})
	}
	return s
}

// next is the next event of w, failing the test after the deadline.
func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("the watch ended")
		}
		return ev
	case <-time.After(testutil.Deadline):
		t.Fatal("no watch event before the deadline")
	}
	return watch.Event{}
}
