// Package dratest runs the real parts the DRA tests need: the node-local
// resource API (package kubeaccess, as the dramanager serves it) and DRA
// drivers built on the upstream kubeletplugin helper, each pointed at that
// API with the driver kubeconfig, as a driver on a nodeplug node is.
// Only tests import it.
package dratest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/apiserver/apiservertest"
)

// Node is the node the API serves in these tests.
const Node = "node-1"

// API is a running node-local resource API.
type API struct {
	Root string
	// Client has the dramanager's own (internal) role.
	Client kubernetes.Interface
	// DriverClient uses <root>/nodeplug/kubeconfig, the drivers' one.
	DriverClient kubernetes.Interface
}

// StartAPI serves the node-local resource API under root until the test
// ends.
func StartAPI(t testing.TB, root string) *API {
	t.Helper()
	a := apiservertest.Start(t, root, Node)
	cfg, err := clientcmd.BuildConfigFromFlags("", layout.KubeconfigFile(root))
	if err != nil {
		t.Fatal(err)
	}
	dc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &API{Root: root, Client: a.Client, DriverClient: dc}
}

// Namespace creates namespace name, as a manifest would before the
// objects in it (the API creates objects only in namespaces that exist).
func (a *API) Namespace(t testing.TB, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := a.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// Driver is one running instance of a DRA driver built on kubeletplugin.
type Driver struct {
	Name   string
	Helper *kubeletplugin.Helper
	// RegSocket is its registration socket in plugins_registry.
	RegSocket string
	// Endpoint and Services are what its GetInfo answered.
	Endpoint string
	Services []string
}

type plugin struct{}

func (plugin) PrepareResourceClaims(context.Context, []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return map[types.UID]kubeletplugin.PrepareResult{}, nil
}

func (plugin) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return map[types.UID]error{}, nil
}

func (plugin) HandleError(context.Context, error, string) {}

func (plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// StartDriver starts an instance of the driver name under root
// (plugins_registry/ and plugins/<name>/), with the rolling-update uid when
// it is not empty (several instances at once), and asks its GetInfo what
// it serves, as the reconciler does. It is stopped when the test ends.
func StartDriver(t testing.TB, api *API, name, uid string) *Driver {
	t.Helper()
	return StartDriverWith(t, api, name, uid, plugin{})
}

// StartDriverWith is StartDriver with the driver's logic p (see Plugin)
// and more helper options.
func StartDriverWith(t testing.TB, api *API, name, uid string, p kubeletplugin.DRAPlugin, more ...kubeletplugin.Option) *Driver {
	t.Helper()
	regDir := layout.PluginsRegistryDir(api.Root)
	dataDir := filepath.Join(layout.PluginsDir(api.Root), name)
	for _, d := range []string{regDir, dataDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(name), kubeletplugin.NodeName(Node), kubeletplugin.KubeClient(api.DriverClient),
		kubeletplugin.RegistrarDirectoryPath(regDir), kubeletplugin.PluginDataDirectoryPath(dataDir),
	}
	reg := filepath.Join(regDir, name+"-reg.sock")
	if uid != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(uid)))
		reg = filepath.Join(regDir, kubeletplugin.RollingUpdateRegistrarSocketFile(regDir, name, types.UID(uid)))
	}
	h, err := kubeletplugin.Start(context.Background(), p, append(opts, more...)...)
	if err != nil {
		t.Fatalf("start DRA driver %s: %v", name, err)
	}
	t.Cleanup(h.Stop)
	d := &Driver{Name: name, Helper: h, RegSocket: reg}
	d.Endpoint, d.Services = getInfo(t, reg)
	return d
}

func getInfo(t testing.TB, path string) (string, []string) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///reg", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	var info *registerapi.PluginInfo
	testutil.Eventually(t, "GetInfo of "+path, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, err = registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
		return err
	})
	return info.GetEndpoint(), info.GetSupportedVersions()
}

// Generation is the registration socket's generation, as the watcher
// reports it.
func (d *Driver) Generation(t testing.TB) string { return testutil.Generation(t, d.RegSocket) }

// Publish publishes one pool named after the node with n devices, each
// with an attribute and a capacity.
func (d *Driver) Publish(t testing.TB, n int) {
	t.Helper()
	devs := make([]resourceapi.Device, n)
	for i := range devs {
		devs[i] = resourceapi.Device{
			Name: fmt.Sprintf("dev-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"model": {StringValue: ptr.To("m1")}, "index": {IntValue: ptr.To(int64(i))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: apiresource.MustParse("16Gi")}},
		}
	}
	err := d.Helper.PublishResources(context.Background(), resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{Node: {Slices: []resourceslice.Slice{{Devices: devs}}}},
	})
	if err != nil {
		t.Fatalf("publish the resources of %s: %v", d.Name, err)
	}
}

// Slices lists driver's ResourceSlices on the node.
func Slices(ctx context.Context, c kubernetes.Interface, driver string) ([]resourceapi.ResourceSlice, error) {
	l, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + Node + "," + resourceapi.ResourceSliceSelectorDriver + "=" + driver,
	})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// WaitSlices waits until driver has n slices on the node with devices
// devices in all.
func WaitSlices(t testing.TB, c kubernetes.Interface, driver string, n, devices int) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d slices of %s with %d devices", n, driver, devices), func() error {
		items, err := Slices(context.Background(), c, driver)
		if err != nil {
			return err
		}
		got := 0
		for _, s := range items {
			got += len(s.Spec.Devices)
		}
		if len(items) != n || got != devices {
			return fmt.Errorf("%d slices with %d devices", len(items), got)
		}
		return nil
	})
}
