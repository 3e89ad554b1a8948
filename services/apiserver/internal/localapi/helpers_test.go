package localapi

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

const testNode = "node-a"

// api is a node-local resource API served for a test.
type api struct {
	*Access
	t      *testing.T
	root   string
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// startAPI serves the node-local API of root on listen ("" for any free
// loopback port), as the devicemanager does, until the test ends.
func startAPI(t *testing.T, root, listen string, tune ...func(*Options)) *api {
	t.Helper()
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	reg := prometheus.NewRegistry()
	opts := Options{RootDir: root, Listen: listen, NodeName: testNode, Registerer: reg}
	for _, f := range tune {
		f(&opts)
	}
	a, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &api{Access: a, t: t, root: root, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- a.Serve(ctx) }()
	t.Cleanup(s.stop)
	return s
}

// stop ends the server and closes its store (again: a no-op).
func (s *api) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	if err := <-s.done; err != nil {
		s.t.Errorf("serving the resource API: %v", err)
	}
}

// clientFor is a clientset built from the kubeconfig written for id, as a
// driver or an operator would use it.
func clientFor(t *testing.T, root string, id Identity) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", KubeconfigPath(root, id))
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// anonymous is a clientset that trusts the server but shows no certificate.
func anonymous(t *testing.T, a *api) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: a.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: a.Config.CAData}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// slice is a valid ResourceSlice of driver on node.
func slice(name, driver, node string, devices ...string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}
	if name == "" {
		s.GenerateName = node + "-" + driver + "-"
	}
	for _, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{
			Name:       d,
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"index": {StringValue: ptr.To(d)}},
		})
	}
	return s
}

// createNamespace makes namespace name, as a manifest would before the
// objects in it.
func createNamespace(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}
