package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodeplug/nodeplug/internal/jaegertrace"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

var testNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestMain(m *testing.M) {
	time.Local = time.UTC
	now = func() time.Time { return testNow }
	for _, v := range os.Environ() {
		if strings.HasPrefix(v, "NODEPLUG_CTL_") {
			name, _, _ := strings.Cut(v, "=")
			os.Unsetenv(name)
		}
	}
	goleak.VerifyTestMain(m)
}

func ts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(testNow.Add(d)) }

func TestParseResourceRequests(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		must    []string
		want    []*dmv1.ResourceRequest
		wantErr string
	}{
		{name: "one", args: []string{"example.com/gpu=2"},
			want: []*dmv1.ResourceRequest{{ResourceName: "example.com/gpu", Count: 2}}},
		{name: "several, in order", args: []string{"b.com/x=1", "a.com/y=3"},
			want: []*dmv1.ResourceRequest{{ResourceName: "b.com/x", Count: 1}, {ResourceName: "a.com/y", Count: 3}}},
		{name: "must-include without resource, one resource", args: []string{"a.com/x=2"}, must: []string{"dev-1", "dev-3"},
			want: []*dmv1.ResourceRequest{{ResourceName: "a.com/x", Count: 2, MustIncludeDeviceIds: []string{"dev-1", "dev-3"}}}},
		{name: "must-include with resource", args: []string{"a.com/x=1", "b.com/y=1"}, must: []string{"b.com/y=d2"},
			want: []*dmv1.ResourceRequest{{ResourceName: "a.com/x", Count: 1}, {ResourceName: "b.com/y", Count: 1, MustIncludeDeviceIds: []string{"d2"}}}},
		{name: "nothing requested", wantErr: "no resources requested"},
		{name: "no count", args: []string{"a.com/x"}, wantErr: "not RESOURCE=COUNT"},
		{name: "empty name", args: []string{"=1"}, wantErr: "not RESOURCE=COUNT"},
		{name: "empty count", args: []string{"a.com/x="}, wantErr: "not RESOURCE=COUNT"},
		{name: "zero", args: []string{"a.com/x=0"}, wantErr: "positive integer"},
		{name: "negative", args: []string{"a.com/x=-1"}, wantErr: "positive integer"},
		{name: "not a number", args: []string{"a.com/x=two"}, wantErr: "positive integer"},
		{name: "twice", args: []string{"a.com/x=1", "a.com/x=2"}, wantErr: "requested twice"},
		{name: "ambiguous must-include", args: []string{"a.com/x=1", "b.com/y=1"}, must: []string{"d1"}, wantErr: "write RESOURCE=ID"},
		{name: "must-include of another resource", args: []string{"a.com/x=1"}, must: []string{"b.com/y=d1"}, wantErr: "not requested"},
		{name: "empty must-include ID", args: []string{"a.com/x=1"}, must: []string{"a.com/x="}, wantErr: "empty device ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseResourceRequests(tt.args, tt.must)
			if tt.wantErr != "" {
				var ue usageError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, &ue) {
					t.Fatalf("err = %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tt.want, func(a, b *dmv1.ResourceRequest) bool { return proto.Equal(a, b) }) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pod  string
		want []string
	}{
		{[]string{"--pod", "p", "a=1"}, "p", []string{"a=1"}},
		{[]string{"a=1", "--pod", "p", "b=2"}, "p", []string{"a=1", "b=2"}},
		{[]string{"a=1", "--", "--pod=x"}, "", []string{"a=1", "--pod=x"}},
		{nil, "", nil},
	} {
		c := &cli{stderr: &bytes.Buffer{}}
		fs := c.flags("x", "")
		pod := fs.String("pod", "", "")
		got, err := parseInterspersed(fs, tc.args)
		if err != nil || *pod != tc.pod || !slices.Equal(got, tc.want) {
			t.Errorf("parse %q: pos %q pod %q err %v; want %q %q", tc.args, got, *pod, err, tc.want, tc.pod)
		}
	}
}

func TestRenderTables(t *testing.T) {
	tests := []struct {
		name   string
		render func(*bytes.Buffer) error
		want   string
	}{
		{
			name: "plugins",
			render: func(b *bytes.Buffer) error {
				return renderPlugins(b, testNow, &reconcilerv1.ListPluginsResponse{Plugins: []*reconcilerv1.Plugin{
					{SocketPath: "/r/plugins_registry/z.sock", State: reconcilerv1.PluginState_PLUGIN_STATE_FAILED, LastError: "GetInfo: deadline exceeded",
						Failures: 3, NextRetryTime: ts(4 * time.Second), LastTransitionTime: ts(-90 * time.Second)},
					{SocketPath: "/r/plugins_registry/a.sock", State: reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED, Name: "example.com/sample",
						Type: "DevicePlugin", SupportedVersions: []string{"v1beta1"}, LastTraceId: "0af7651916cd43dd8448eb211c80319c",
						LastTransitionTime: ts(-5 * time.Second)},
				}}, nil)
			},
			want: `NAME                TYPE          VIA               STATE       SOCKET                      VERSIONS  AGE  TRACE ID                          ERROR
example.com/sample  DevicePlugin  plugins_registry  registered  /r/plugins_registry/a.sock  v1beta1   5s   0af7651916cd43dd8448eb211c80319c  -
-                   -             plugins_registry  failed      /r/plugins_registry/z.sock  -         1m   -                                 GetInfo: deadline exceeded (failures 3, retry in 4s)
`,
		},
		{
			// Device plugins that registered on kubelet.sock are listed
			// from the devicemanager's endpoints, among the others.
			name: "plugins with kubelet.sock plugins",
			render: func(b *bytes.Buffer) error {
				return renderPlugins(b, testNow, &reconcilerv1.ListPluginsResponse{Plugins: []*reconcilerv1.Plugin{
					{SocketPath: "/r/plugins_registry/a.sock", State: reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED, Name: "example.com/sample",
						Type: "DevicePlugin", SupportedVersions: []string{"v1beta1"}, LastTransitionTime: ts(-5 * time.Second)},
				}}, []kubeletSockPlugin{
					{"example.com/old", &dmv1.Endpoint{Endpoint: "/r/device-plugins/old.sock", State: dmv1.EndpointState_ENDPOINT_STATE_STOPPED,
						Versions: []string{"v1beta1"}, RegisteredTime: ts(-time.Hour), StoppedTime: ts(-2 * time.Minute)}},
					{"example.com/legacy", &dmv1.Endpoint{Endpoint: "/r/device-plugins/legacy.sock", State: dmv1.EndpointState_ENDPOINT_STATE_LIVE,
						Versions: []string{"v1beta1"}, RegisteredTime: ts(-30 * time.Second)}},
				})
			},
			want: `NAME                TYPE          VIA               STATE       SOCKET                         VERSIONS  AGE  TRACE ID  ERROR
example.com/legacy  DevicePlugin  kubelet.sock      registered  /r/device-plugins/legacy.sock  v1beta1   30s  -         -
example.com/old     DevicePlugin  kubelet.sock      stopped     /r/device-plugins/old.sock     v1beta1   2m   -         -
example.com/sample  DevicePlugin  plugins_registry  registered  /r/plugins_registry/a.sock     v1beta1   5s   -         -
`,
		},
		{
			// With tracing off a service reports the all-zero trace ID: shown
			// as "-", as allocations show a missing one.
			name: "plugins with tracing off",
			render: func(b *bytes.Buffer) error {
				return renderPlugins(b, testNow, &reconcilerv1.ListPluginsResponse{Plugins: []*reconcilerv1.Plugin{
					{SocketPath: "/r/plugins_registry/a.sock", State: reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED, Name: "example.com/sample",
						Type: "DevicePlugin", SupportedVersions: []string{"v1beta1"}, LastTraceId: "00000000000000000000000000000000",
						LastTransitionTime: ts(-5 * time.Second)},
				}}, nil)
			},
			want: `NAME                TYPE          VIA               STATE       SOCKET                      VERSIONS  AGE  TRACE ID  ERROR
example.com/sample  DevicePlugin  plugins_registry  registered  /r/plugins_registry/a.sock  v1beta1   5s   -         -
`,
		},
		{
			name: "no plugins",
			render: func(b *bytes.Buffer) error {
				return renderPlugins(b, testNow, &reconcilerv1.ListPluginsResponse{}, nil)
			},
			want: "no plugins: none in <root-dir>/plugins_registry, none registered on kubelet.sock\n",
		},
		{
			name: "resources",
			render: func(b *bytes.Buffer) error {
				return renderResources(b, testNow, &dmv1.ListResourcesResponse{Resources: []*dmv1.Resource{
					{Name: "example.com/sample", Capacity: 4, Allocatable: 3, Free: 1, UnhealthyDeviceIds: []string{"dev-3"},
						AllocatedDeviceIds: []string{"dev-0", "dev-1"}, Endpoints: []*dmv1.Endpoint{{
							Endpoint: "/r/device-plugins/sample.sock", State: dmv1.EndpointState_ENDPOINT_STATE_LIVE,
							RegistrationPath: dmv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY}}},
					{Name: "example.com/legacy", Capacity: 2, GraceDeadline: ts(5 * time.Minute), Endpoints: []*dmv1.Endpoint{{
						Endpoint: "/r/device-plugins/legacy.sock", State: dmv1.EndpointState_ENDPOINT_STATE_STOPPED,
						RegistrationPath: dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK}}},
				}})
			},
			want: `RESOURCE            CAPACITY  ALLOCATABLE  FREE  UNHEALTHY  ALLOCATED    ENDPOINTS
example.com/legacy  2         0            0     -          -            legacy.sock (stopped via kubelet.sock, removed in 5m0s)
example.com/sample  4         3            1     dev-3      dev-0,dev-1  sample.sock (live via plugins_registry)
`,
		},
		{
			name: "allocations",
			render: func(b *bytes.Buffer) error {
				return renderAllocations(b, testNow, &dmv1.ListAllocationsResponse{Allocations: []*dmv1.Allocation{
					{PodUid: "pod-2", PodNamespace: "default", PodName: "web-0", ContainerName: "main", ResourceName: "example.com/sample",
						DeviceIds: []string{"dev-2"}, AllocatedTime: ts(-3 * time.Hour)},
					{PodUid: "pod-1", ContainerName: "main", ResourceName: "example.com/sample", DeviceIds: []string{"dev-0", "dev-1"},
						TraceId: "4bf92f3577b34da6a3ce929d0e0e4736", AllocatedTime: ts(-72 * time.Hour)},
				}})
			},
			want: `POD    NAMESPACE/NAME  CONTAINER  RESOURCE            DEVICES      AGE  TRACE ID
pod-1  -               main       example.com/sample  dev-0,dev-1  3d   4bf92f3577b34da6a3ce929d0e0e4736
pod-2  default/web-0   main       example.com/sample  dev-2        3h   -
`,
		},
		{
			name: "sockets",
			render: func(b *bytes.Buffer) error {
				return renderSockets(b, testNow, &watcherv1.ListSocketsResponse{Revision: 3, Sockets: []*watcherv1.Socket{
					{Path: "/r/plugins_registry/a.sock", Generation: "fe00:12:b1", ObservedTime: ts(-20 * time.Second)},
				}})
			},
			want: `SOCKET                      GENERATION  AGE
/r/plugins_registry/a.sock  fe00:12:b1  20s
`,
		},
		{
			name: "drivers",
			render: func(b *bytes.Buffer) error {
				return renderDrivers(b, testNow, &reconcilerv1.ListDriversResponse{
					CsiDrivers: []*reconcilerv1.CSIDriver{{Name: "csi.example.com", NodeId: "node-1", HighestVersion: "1.0.0",
						MaxVolumesPerNode: 16, AccessibleTopology: map[string]string{"zone": "a", "rack": "r1"},
						Endpoint: "/r/plugins/csi.sock", RegisteredTime: ts(-time.Minute)}},
					DraDrivers: []*reconcilerv1.DRADriver{{Name: "dra.example.com", SupportedVersions: []string{"v1.DRAPlugin"},
						Endpoint: "/r/plugins/dra.sock", RegisteredTime: ts(-2 * time.Minute)}},
				})
			},
			want: `CSI DRIVER       NODE ID  VERSION  MAX VOLUMES  TOPOLOGY        ENDPOINT             AGE
csi.example.com  node-1   1.0.0    16           rack=r1,zone=a  /r/plugins/csi.sock  1m

DRA DRIVER       VERSIONS      ENDPOINT             AGE
dra.example.com  v1.DRAPlugin  /r/plugins/dra.sock  2m
`,
		},
		{
			name: "allocation",
			render: func(b *bytes.Buffer) error {
				return renderAllocation(b, &dmv1.AllocateResponse{PodUid: "pod-1", PodNamespace: "default", PodName: "web-0", ContainerName: "main", Allocations: []*dmv1.ResourceAllocation{{
					ResourceName: "example.com/sample", DeviceIds: []string{"dev-0", "dev-1"},
					Devices: []*dmv1.DeviceStatus{{Id: "dev-0", Health: dmv1.DeviceHealth_DEVICE_HEALTH_HEALTHY}, {Id: "dev-1", Health: dmv1.DeviceHealth_DEVICE_HEALTH_UNHEALTHY}},
					ContainerResponse: &dmv1.ContainerAllocateResponse{
						Envs:        map[string]string{"SAMPLE_DEVICES": "dev-0,dev-1", "A": "1"},
						Mounts:      []*dmv1.Mount{{HostPath: "/h", ContainerPath: "/c", ReadOnly: true}},
						Devices:     []*dmv1.DeviceSpec{{HostPath: "/dev/s0", ContainerPath: "/dev/s0", Permissions: "rw"}},
						CdiDevices:  []*dmv1.CDIDevice{{Name: "example.com/sample=dev-0"}},
						Annotations: map[string]string{"k": "v"},
					},
				}}})
			},
			want: `pod pod-1 (default/web-0) container main
  example.com/sample: dev-0,dev-1 (dev-1 unhealthy)
    env         A=1
    env         SAMPLE_DEVICES=dev-0,dev-1
    mount       /h -> /c (read-only)
    device      /dev/s0 -> /dev/s0 rw
    cdi         example.com/sample=dev-0
    annotation  k=v
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tt.render(&b); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Fatalf("got:\n%s\nwant:\n%s", b.String(), tt.want)
			}
		})
	}
}

// jaegerFixture is a registration trace as Jaeger's query API returns it:
// the watcher's root span, the reconciler's operation with its children
// (listed out of order), and the devicemanager's RegisterPlugin.
const jaegerFixture = `{"data":[{"traceID":"0af7651916cd43dd8448eb211c80319c","spans":[
 {"traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"b2","operationName":"GetInfo","references":[{"refType":"CHILD_OF","traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"b1"}],"startTime":1700000000001000,"duration":2000,"processID":"p2","tags":[]},
 {"traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"a1","operationName":"watcher.socket_created","references":[],"startTime":1700000000000000,"duration":50,"processID":"p1"},
 {"traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"b1","operationName":"reconciler.register","references":[{"refType":"CHILD_OF","traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"a1"}],"startTime":1700000000000500,"duration":9500,"processID":"p2"},
 {"traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"c1","operationName":"nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin","references":[{"refType":"CHILD_OF","traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"b3"}],"startTime":1700000000004000,"duration":4000,"processID":"p3","tags":[{"key":"otel.status_code","type":"string","value":"ERROR"}]},
 {"traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"b3","operationName":"handler.RegisterPlugin","references":[{"refType":"CHILD_OF","traceID":"0af7651916cd43dd8448eb211c80319c","spanID":"b1"}],"startTime":1700000000003500,"duration":5000,"processID":"p2"}
],"processes":{"p1":{"serviceName":"nodeplug-watcher"},"p2":{"serviceName":"nodeplug-reconciler"},"p3":{"serviceName":"nodeplug-devicemanager"}}}],"total":0,"limit":0,"offset":0,"errors":null}`

const waterfallWant = `trace 0af7651916cd43dd8448eb211c80319c: 5 spans, 3 services, 10.00ms

SERVICE                 SPAN                                                                         START    DURATION  TIMELINE
nodeplug-watcher        watcher.socket_created                                                       +0µs     50µs      |█                   |
nodeplug-reconciler       reconciler.register                                                        +500µs   9.50ms    | ███████████████████|
nodeplug-reconciler         GetInfo                                                                  +1.00ms  2.00ms    |  ████              |
nodeplug-reconciler         handler.RegisterPlugin                                                   +3.50ms  5.00ms    |       ██████████   |
nodeplug-devicemanager        nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin (error)  +4.00ms  4.00ms    |        ████████    |
`

func TestWaterfall(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/traces/0af7651916cd43dd8448eb211c80319c":
			fmt.Fprint(w, jaegerFixture)
		case "/api/traces/00000000000000000000000000000001":
			http.Error(w, `{"data":null,"errors":[{"code":404,"msg":"trace not found"}]}`, http.StatusNotFound)
		case "/api/traces/00000000000000000000000000000002":
			fmt.Fprint(w, "<html>not jaeger</html>")
		default:
			http.Error(w, "boom", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	t.Setenv("NODEPLUG_CTL_JAEGER_URL", srv.URL)

	code, out, errOut := runCLI(t, "trace", "--width", "20", "0AF7651916CD43DD8448EB211C80319C")
	if code != exitOK || out != waterfallWant {
		t.Fatalf("exit %d, stderr %q, output:\n%s\nwant:\n%s", code, errOut, out, waterfallWant)
	}
	for _, tc := range []struct {
		id, want string
		code     int
	}{
		{"00000000000000000000000000000001", "not found in Jaeger at " + srv.URL, exitError},
		{"00000000000000000000000000000002", "is --jaeger-url the query service?", exitError},
		{"00000000000000000000000000000003", "500 Internal Server Error: boom", exitError},
		{"not-hex", "is not a trace ID", exitUsage},
	} {
		code, _, errOut := runCLI(t, "trace", tc.id)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("trace %s: exit %d, stderr %q; want %d and %q", tc.id, code, errOut, tc.code, tc.want)
		}
	}
	// Jaeger not running.
	code, _, errOut = runCLI(t, "--jaeger-url", "http://127.0.0.1:1", "trace", "0af7651916cd43dd8448eb211c80319c")
	if code != exitError || !strings.Contains(errOut, "cannot reach Jaeger at http://127.0.0.1:1") || !strings.Contains(errOut, "--jaeger-url") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		off, dur, total int64
		want            string
	}{
		{0, 100, 100, "|██████████|"},
		{0, 0, 100, "|█         |"},
		{99, 1, 100, "|         █|"},
		{50, 50, 100, "|     █████|"},
		{100, 0, 100, "|         █|"},
	} {
		if got := bar(tc.off, tc.dur, tc.total, 10); got != tc.want {
			t.Errorf("bar(%d,%d,%d) = %q, want %q", tc.off, tc.dur, tc.total, got, tc.want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut syncBuffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// fakeServer implements the watcher's and the reconciler's APIs in process,
// over a real gRPC server on a Unix socket.
type fakeServer struct {
	watcherv1.UnimplementedWatcherServiceServer
	reconcilerv1.UnimplementedReconcilerServiceServer
	sockets     []*watcherv1.Socket
	plugins     []*reconcilerv1.Plugin
	live        chan *watcherv1.SocketEvent
	livePlugins chan *reconcilerv1.PluginChange
}

func (f *fakeServer) ListSockets(context.Context, *watcherv1.ListSocketsRequest) (*watcherv1.ListSocketsResponse, error) {
	return &watcherv1.ListSocketsResponse{InstanceId: "w-1", Revision: 1, Sockets: f.sockets}, nil
}

func (f *fakeServer) WatchSocketEvents(_ *watcherv1.WatchSocketEventsRequest, s watcherv1.WatcherService_WatchSocketEventsServer) error {
	for _, sk := range f.sockets {
		ev := &watcherv1.SocketEvent{Type: watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED, Path: sk.GetPath(),
			Generation: sk.GetGeneration(), Revision: 1, ObservedTime: sk.GetObservedTime(), Snapshot: true}
		if err := s.Send(&watcherv1.WatchSocketEventsResponse{InstanceId: "w-1", Item: &watcherv1.WatchSocketEventsResponse_Event{Event: ev}}); err != nil {
			return err
		}
	}
	if err := s.Send(&watcherv1.WatchSocketEventsResponse{InstanceId: "w-1", Item: &watcherv1.WatchSocketEventsResponse_Synced{
		Synced: &watcherv1.Synced{Revision: 1, SocketCount: uint32(len(f.sockets))}}}); err != nil {
		return err
	}
	for {
		select {
		case <-s.Context().Done():
			return s.Context().Err()
		case ev := <-f.live:
			if err := s.Send(&watcherv1.WatchSocketEventsResponse{InstanceId: "w-1", Item: &watcherv1.WatchSocketEventsResponse_Event{Event: ev}}); err != nil {
				return err
			}
		}
	}
}

func (f *fakeServer) ListPlugins(context.Context, *reconcilerv1.ListPluginsRequest) (*reconcilerv1.ListPluginsResponse, error) {
	return &reconcilerv1.ListPluginsResponse{InstanceId: "r-1", Plugins: f.plugins}, nil
}

func (f *fakeServer) WatchPlugins(_ *reconcilerv1.WatchPluginsRequest, s reconcilerv1.ReconcilerService_WatchPluginsServer) error {
	for i, p := range f.plugins {
		if err := s.Send(&reconcilerv1.WatchPluginsResponse{InstanceId: "r-1", Item: &reconcilerv1.WatchPluginsResponse_Change{
			Change: &reconcilerv1.PluginChange{Type: reconcilerv1.PluginChangeType_PLUGIN_CHANGE_TYPE_UPDATED, Plugin: p, Revision: uint64(i + 1)}}}); err != nil {
			return err
		}
	}
	if err := s.Send(&reconcilerv1.WatchPluginsResponse{InstanceId: "r-1", Item: &reconcilerv1.WatchPluginsResponse_Synced{
		Synced: &reconcilerv1.Synced{Revision: uint64(len(f.plugins))}}}); err != nil {
		return err
	}
	for {
		select {
		case <-s.Context().Done():
			return s.Context().Err()
		case ch := <-f.livePlugins:
			if err := s.Send(&reconcilerv1.WatchPluginsResponse{InstanceId: "r-1", Item: &reconcilerv1.WatchPluginsResponse_Change{Change: ch}}); err != nil {
				return err
			}
		}
	}
}

func startFake(t *testing.T, f *fakeServer) string {
	t.Helper()
	return serveFake(t, func(srv *grpc.Server) {
		watcherv1.RegisterWatcherServiceServer(srv, f)
		reconcilerv1.RegisterReconcilerServiceServer(srv, f)
	})
}

// serveFake serves what register registers on a Unix socket of a test
// directory, until the test ends, and returns the socket's path.
func serveFake(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	path := filepath.Join(testutil.TempDir(t), "api.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return path
}

// waitOutput waits until out contains want.
func waitOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("output containing %q", want), func() error {
		if !strings.Contains(out.String(), want) {
			return fmt.Errorf("output so far:\n%s", out.String())
		}
		return nil
	})
}

func TestAgainstGRPCServer(t *testing.T) {
	f := &fakeServer{
		sockets: []*watcherv1.Socket{{Path: "/r/plugins_registry/a.sock", Generation: "g1", ObservedTime: ts(-time.Second)}},
		plugins: []*reconcilerv1.Plugin{{SocketPath: "/r/plugins_registry/a.sock", State: reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED,
			Name: "example.com/sample", Type: "DevicePlugin", SupportedVersions: []string{"v1beta1"}, LastTraceId: "abc123",
			LastTransitionTime: ts(-time.Second)}},
		live:        make(chan *watcherv1.SocketEvent),
		livePlugins: make(chan *reconcilerv1.PluginChange),
	}
	addr := startFake(t, f)

	t.Run("watch sockets", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"watch", "sockets", "--watcher-addr", addr}, &out, &errOut) }()
		waitOutput(t, &out, "-- synced")
		f.live <- &watcherv1.SocketEvent{Type: watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED, Path: "/r/plugins_registry/a.sock",
			Generation: "g1", Revision: 2, ObservedTime: ts(0),
			TraceContext: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
		waitOutput(t, &out, "DELETED")
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
		want := "11:59:59.000 CREATED /r/plugins_registry/a.sock generation=g1 revision=1 (snapshot)\n" +
			"-- synced: 1 socket(s) at revision 1 (watcher w-1); live events follow\n" +
			"12:00:00.000 DELETED /r/plugins_registry/a.sock generation=g1 revision=2 trace=4bf92f3577b34da6a3ce929d0e0e4736\n"
		if out.String() != want {
			t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
		}
	})

	// The snapshot's items are stamped with the plugin's last transition
	// and marked, as watch sockets marks its own; a live change is stamped
	// when it arrives.
	t.Run("watch plugins", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"watch", "plugins", "--reconciler-addr", addr}, &out, &errOut) }()
		waitOutput(t, &out, "-- synced")
		f.livePlugins <- &reconcilerv1.PluginChange{Type: reconcilerv1.PluginChangeType_PLUGIN_CHANGE_TYPE_REMOVED, Revision: 2,
			Plugin: &reconcilerv1.Plugin{SocketPath: "/r/plugins_registry/a.sock", State: reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED,
				LastTransitionTime: ts(-time.Hour)}}
		waitOutput(t, &out, "REMOVED")
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
		want := "11:59:59.000 UPDATED /r/plugins_registry/a.sock state=registered name=example.com/sample type=DevicePlugin revision=1 trace=abc123 (snapshot)\n" +
			"-- synced at revision 1 (reconciler r-1); live changes follow\n" +
			"12:00:00.000 REMOVED /r/plugins_registry/a.sock state=registered revision=2\n"
		if out.String() != want {
			t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
		}
	})

	t.Run("watch plugins as JSON", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"--reconciler-addr", addr, "watch", "-o", "json", "plugins"}, &out, &errOut)
		}()
		waitOutput(t, &out, `"synced"`)
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], `"socketPath":"/r/plugins_registry/a.sock"`) ||
			!strings.Contains(lines[0], `"PLUGIN_STATE_REGISTERED"`) {
			t.Fatalf("output:\n%s", out.String())
		}
	})

	t.Run("plugins table", func(t *testing.T) {
		// No devicemanager answers: the reconciler's plugins are listed,
		// and stderr says what is missing.
		missing := filepath.Join(testutil.TempDir(t), "no-dm.sock")
		code, out, errOut := runCLI(t, "plugins", "--reconciler-addr", addr, "--devicemanager-addr", missing)
		want := "NAME                TYPE          VIA               STATE       SOCKET                      VERSIONS  AGE  TRACE ID  ERROR\n" +
			"example.com/sample  DevicePlugin  plugins_registry  registered  /r/plugins_registry/a.sock  v1beta1   1s   abc123    -\n"
		if code != exitOK || out != want {
			t.Fatalf("exit %d, stderr %q, output:\n%s\nwant:\n%s", code, errOut, out, want)
		}
		if !strings.Contains(errOut, "registered on kubelet.sock are not listed") || !strings.Contains(errOut, "cannot reach the devicemanager at "+missing) {
			t.Fatalf("stderr %q", errOut)
		}
	})

	t.Run("sockets as JSON, address from the environment", func(t *testing.T) {
		t.Setenv("NODEPLUG_CTL_WATCHER_ADDR", addr)
		code, out, errOut := runCLI(t, "sockets", "-o", "json")
		if code != exitOK || !strings.Contains(out, `"instanceId": "w-1"`) && !strings.Contains(out, `"instanceId":  "w-1"`) {
			t.Fatalf("exit %d, stderr %q, output:\n%s", code, errOut, out)
		}
		// A flag wins over the environment.
		code, _, errOut = runCLI(t, "--watcher-addr", filepath.Join(filepath.Dir(addr), "missing.sock"), "sockets")
		if code != exitError || !strings.Contains(errOut, "cannot reach the watcher at") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("unimplemented", func(t *testing.T) {
		// The fake serves no devicemanager API: pointing the devicemanager
		// address at it is a wrong address, and the error says so.
		code, _, errOut := runCLI(t, "--devicemanager-addr", addr, "resources")
		if code != exitError || !strings.Contains(errOut, "--devicemanager-addr") || !strings.Contains(errOut, "does not serve") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})
}

func TestErrorsSayWhatToTry(t *testing.T) {
	missing := filepath.Join(testutil.TempDir(t), "nothing.sock")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--devicemanager-addr", missing, "resources"}, []string{"cannot reach the devicemanager at " + missing, "is it running?", "make run", "--devicemanager-addr"}},
		{[]string{"--reconciler-addr", missing, "plugins"}, []string{"cannot reach the reconciler at " + missing, "--reconciler-addr"}},
		{[]string{"--devicemanager-addr", missing, "allocate", "--pod", "p", "--container", "c", "a.com/x=1"}, []string{"cannot reach the devicemanager", "--devicemanager-addr"}},
		{[]string{"--devicemanager-addr", missing, "release", "--pod", "p"}, []string{"cannot reach the devicemanager"}},
		{[]string{"--watcher-addr", missing, "watch", "sockets"}, []string{"cannot reach the watcher at " + missing, "--watcher-addr"}},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != exitError {
			t.Errorf("%q: exit %d, want %d", tc.args, code, exitError)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%q: stderr %q lacks %q", tc.args, errOut, w)
			}
		}
	}
}

// A mistyped command says what it may have meant and how to list the
// commands, in two lines, not the whole usage.
func TestUnknownCommandSuggests(t *testing.T) {
	for _, tc := range []struct{ typed, want string }{
		{"plugin", `did you mean "plugins"?`},
		{"alocate", `did you mean "allocate"?`},
		{"relase", `did you mean "release"?`},
		{"alloc", `did you mean "allocations"?`},
		{"frobnicate", ""},
	} {
		code, out, errOut := runCLI(t, tc.typed)
		if code != exitUsage || out != "" {
			t.Errorf("%s: exit %d, stdout %q", tc.typed, code, out)
		}
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], fmt.Sprintf("unknown command %q", tc.typed)) || !strings.Contains(lines[1], "nodeplugctl help") {
			t.Errorf("%s: stderr %q, want the unknown command and a hint in two lines", tc.typed, errOut)
		}
		if tc.want == "" && strings.Contains(errOut, "did you mean") || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: stderr %q, want %q", tc.typed, errOut, tc.want)
		}
	}
}

// A relative --root-dir or NODEPLUG_ROOT_DIR is below the working
// directory: the sockets are looked for there, never taken for a TCP
// address, and an unreachable service names the root it tried and how to
// set it.
func TestRelativeRootDir(t *testing.T) {
	dir := testutil.TempDir(t)
	t.Chdir(dir)
	for _, args := range [][]string{{"--root-dir", "run/root", "resources"}, {"resources", "--root-dir", "./run/root"}} {
		code, _, errOut := runCLI(t, args...)
		want := filepath.Join(dir, "run", "root", "nodeplug", "devicemanager.sock")
		if code != exitError || !strings.Contains(errOut, "cannot reach the devicemanager at "+want) ||
			!strings.Contains(errOut, "under the root dir "+filepath.Join(dir, "run", "root")) || !strings.Contains(errOut, "NODEPLUG_ROOT_DIR") {
			t.Errorf("%q: exit %d, stderr %q; want the devicemanager unreached at %s, the root and NODEPLUG_ROOT_DIR named", args, code, errOut, want)
		}
		if strings.Contains(errOut, "TCP") {
			t.Errorf("%q: a relative root taken for a TCP address: %q", args, errOut)
		}
	}
	t.Setenv("NODEPLUG_ROOT_DIR", "envroot")
	code, _, errOut := runCLI(t, "plugins")
	if want := filepath.Join(dir, "envroot", "nodeplug", "reconciler.sock"); code != exitError || !strings.Contains(errOut, "cannot reach the reconciler at "+want) {
		t.Errorf("NODEPLUG_ROOT_DIR=envroot: exit %d, stderr %q; want the reconciler unreached at %s", code, errOut, want)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: nodeplugctl"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"plugins", "extra"}, "unexpected arguments"},
		{[]string{"plugins", "-o", "yaml"}, `output format "yaml"`},
		{[]string{"watch"}, "say what to watch"},
		{[]string{"watch", "pods"}, `cannot watch "pods"`},
		{[]string{"watch", "plugins", "--no-allocations"}, "--no-allocations applies to watch resources only"},
		{[]string{"allocate", "--pod", "p", "--container", "c"}, "no resources requested"},
		{[]string{"allocate", "a.com/x=1"}, "--pod and --container are required"},
		{[]string{"allocate", "--pod", "p", "--container", "c", "--namespace", "ns", "a.com/x=1"}, "--namespace and --name go together"},
		{[]string{"release"}, "--pod is required"},
		{[]string{"trace"}, "give one trace ID"},
		{[]string{"trace", "xyz"}, "is not a trace ID"},
		{[]string{"--jaeger-url", "not a url", "trace", "abc"}, "is not an http(s) URL"},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
	t.Setenv("NODEPLUG_CTL_TIMEOUT", "soon")
	if code, _, errOut := runCLI(t, "version"); code != exitUsage || !strings.Contains(errOut, "NODEPLUG_CTL_TIMEOUT") {
		t.Errorf("bad NODEPLUG_CTL_TIMEOUT: exit %d, stderr %q", code, errOut)
	}
}

func TestVersionAndHelp(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if code, out, _ := runCLI(t, args...); code != exitOK || !strings.HasPrefix(out, "nodeplugctl ") {
			t.Fatalf("%q: exit %d, output %q", args, code, out)
		}
	}
	if code, out, _ := runCLI(t, "help"); code != exitOK || !strings.Contains(out, "allocate") || !strings.Contains(out, "NODEPLUG_CTL_WATCHER_ADDR") {
		t.Fatalf("help: exit %d, output %q", code, out)
	}
}

func TestWaterfallEdgeCases(t *testing.T) {
	ref := func(id string) []jaegertrace.Reference {
		return []jaegertrace.Reference{{RefType: "CHILD_OF", SpanID: id}}
	}
	for _, tc := range []struct {
		name string
		tr   jaegertrace.Trace
		want []string
	}{
		{"one span, unknown process", jaegertrace.Trace{TraceID: "t1", Spans: []jaegertrace.Span{{SpanID: "a", OperationName: "only", StartTime: 5, Duration: 0, ProcessID: "p9"}}},
			[]string{"trace t1: 1 span, 1 service, 1µs", "?        only  +0µs   0µs       |█"}},
		{"reference cycle", jaegertrace.Trace{TraceID: "t2", Spans: []jaegertrace.Span{
			{SpanID: "a", OperationName: "first", StartTime: 0, Duration: 10, References: ref("b")},
			{SpanID: "b", OperationName: "second", StartTime: 5, Duration: 5, References: ref("a")},
		}}, []string{"2 spans", "first", "  second"}},
		{"parent outside the trace", jaegertrace.Trace{TraceID: "t3", Spans: []jaegertrace.Span{
			{SpanID: "a", OperationName: "orphan", StartTime: 0, Duration: 10, References: ref("zz")},
		}}, []string{"?        orphan"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := renderWaterfall(&b, &tc.tr, 10); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Fatalf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
	if err := renderWaterfall(&bytes.Buffer{}, &jaegertrace.Trace{TraceID: "t"}, 10); err == nil {
		t.Fatal("a trace without spans rendered")
	}
}

// TestFindsSocketsFromTheRootDir: with no address flag, nodeplugctl dials
// <root>/nodeplug/<service>.sock under --root-dir or NODEPLUG_ROOT_DIR.
func TestFindsSocketsFromTheRootDir(t *testing.T) {
	f := &fakeServer{
		sockets: []*watcherv1.Socket{{Path: "/r/plugins_registry/a.sock", Generation: "g1", ObservedTime: ts(-time.Second)}},
		live:    make(chan *watcherv1.SocketEvent),
	}
	addr := startFake(t, f)
	root := testutil.TempDir(t)
	if err := os.MkdirAll(filepath.Join(root, layout.APIDirName), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(addr, layout.APISocket(root, "watcher")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODEPLUG_ROOT_DIR", root)
	if code, out, errOut := runCLI(t, "sockets"); code != exitOK || !strings.Contains(out, "/r/plugins_registry/a.sock") {
		t.Fatalf("from NODEPLUG_ROOT_DIR: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
	t.Setenv("NODEPLUG_ROOT_DIR", "/nonexistent")
	if code, out, errOut := runCLI(t, "--root-dir", root, "sockets"); code != exitOK || !strings.Contains(out, "/r/plugins_registry/a.sock") {
		t.Fatalf("from --root-dir: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
	code, _, errOut := runCLI(t, "sockets")
	if code == exitOK || !strings.Contains(errOut, "/nonexistent/nodeplug/watcher.sock") {
		t.Fatalf("a missing root dir: exit %d, stderr %q; want an error naming the socket", code, errOut)
	}
}

// fakeDeviceManager serves the devicemanager's API in process: WatchResources
// hands on each request it gets, then sends its resources (one of its own
// when it has none) and the synced marker; ListResources and
// ListAllocations answer with its resources and allocations.
type fakeDeviceManager struct {
	dmv1.UnimplementedDeviceManagerServiceServer
	requests    chan *dmv1.WatchResourcesRequest
	resources   []*dmv1.Resource
	allocations []*dmv1.Allocation
}

func (f *fakeDeviceManager) WatchResources(req *dmv1.WatchResourcesRequest, s dmv1.DeviceManagerService_WatchResourcesServer) error {
	f.requests <- req
	res := f.resources
	if len(res) == 0 {
		res = []*dmv1.Resource{{Name: "example.com/sample", Capacity: 2, Allocatable: 2, Free: 2}}
	}
	for _, r := range res {
		if err := s.Send(&dmv1.WatchResourcesResponse{InstanceId: "dm-1", Item: &dmv1.WatchResourcesResponse_Change{Change: &dmv1.ResourceChange{
			Type: dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_UPDATED, Revision: 1, Resource: r}}}); err != nil {
			return err
		}
	}
	if err := s.Send(&dmv1.WatchResourcesResponse{InstanceId: "dm-1", Item: &dmv1.WatchResourcesResponse_Synced{Synced: &dmv1.Synced{Revision: 1}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return s.Context().Err()
}

func (f *fakeDeviceManager) ListResources(context.Context, *dmv1.ListResourcesRequest) (*dmv1.ListResourcesResponse, error) {
	return &dmv1.ListResourcesResponse{InstanceId: "dm-1", Resources: f.resources}, nil
}

func (f *fakeDeviceManager) ListAllocations(context.Context, *dmv1.ListAllocationsRequest) (*dmv1.ListAllocationsResponse, error) {
	return &dmv1.ListAllocationsResponse{InstanceId: "dm-1", Allocations: f.allocations}, nil
}

// watch resources asks the devicemanager for allocation changes unless
// --no-allocations says otherwise.
func TestWatchResourcesNoAllocations(t *testing.T) {
	f := &fakeDeviceManager{requests: make(chan *dmv1.WatchResourcesRequest, 1)}
	path := serveFake(t, func(srv *grpc.Server) { dmv1.RegisterDeviceManagerServiceServer(srv, f) })

	for _, tc := range []struct {
		args []string
		omit bool
	}{
		{[]string{"watch", "resources"}, false},
		{[]string{"watch", "resources", "--no-allocations"}, true},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, append([]string{"--devicemanager-addr", path}, tc.args...), &out, &errOut) }()
		waitOutput(t, &out, "-- synced at revision 1 (devicemanager dm-1)")
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("%q: exit %d, stderr %q", tc.args, code, errOut.String())
		}
		if req := <-f.requests; req.GetOmitAllocationChanges() != tc.omit {
			t.Errorf("%q: omit_allocation_changes = %v, want %v", tc.args, req.GetOmitAllocationChanges(), tc.omit)
		}
		if !strings.Contains(out.String(), "example.com/sample capacity=2 allocatable=2 free=2") {
			t.Errorf("%q: output:\n%s", tc.args, out.String())
		}
	}
}

// The snapshot of watch resources is marked and stamped with its
// endpoints' last registration, not with the time it arrived.
func TestWatchResourcesSnapshotStamps(t *testing.T) {
	f := &fakeDeviceManager{requests: make(chan *dmv1.WatchResourcesRequest, 1), resources: []*dmv1.Resource{
		{Name: "example.com/a", Capacity: 1, Allocatable: 1, Free: 1, Endpoints: []*dmv1.Endpoint{
			{State: dmv1.EndpointState_ENDPOINT_STATE_LIVE, RegisteredTime: ts(-time.Hour)},
			{State: dmv1.EndpointState_ENDPOINT_STATE_STOPPED, RegisteredTime: ts(-3 * time.Hour), StoppedTime: ts(-2 * time.Hour)},
		}},
		{Name: "example.com/b"},
	}}
	path := serveFake(t, func(srv *grpc.Server) { dmv1.RegisterDeviceManagerServiceServer(srv, f) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"--devicemanager-addr", path, "watch", "resources"}, &out, &errOut) }()
	waitOutput(t, &out, "-- synced")
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	<-f.requests
	want := "11:00:00.000 UPDATED example.com/a capacity=1 allocatable=1 free=1 unhealthy=- endpoints=1/2 live revision=1 (snapshot)\n" +
		"-            UPDATED example.com/b capacity=0 allocatable=0 free=0 unhealthy=- endpoints=0/0 live revision=1 (snapshot)\n" +
		"-- synced at revision 1 (devicemanager dm-1); live changes follow\n"
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// plugins lists the device plugins registered on kubelet.sock too (the
// devicemanager's endpoints of that path), once each: a plugins_registry
// endpoint is the reconciler's entry already.
func TestPluginsListsKubeletSockPlugins(t *testing.T) {
	recon := startFake(t, &fakeServer{plugins: []*reconcilerv1.Plugin{{SocketPath: "/r/plugins_registry/a.sock",
		State: reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED, Name: "example.com/sample", Type: "DevicePlugin",
		SupportedVersions: []string{"v1beta1"}, LastTransitionTime: ts(-time.Second)}}})
	dm := &fakeDeviceManager{resources: []*dmv1.Resource{
		{Name: "example.com/sample", Endpoints: []*dmv1.Endpoint{{Endpoint: "/r/device-plugins/a.sock", SocketPath: "/r/plugins_registry/a.sock",
			State: dmv1.EndpointState_ENDPOINT_STATE_LIVE, RegistrationPath: dmv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY}}},
		{Name: "example.com/legacy", Endpoints: []*dmv1.Endpoint{{Endpoint: "/r/device-plugins/legacy.sock", SocketPath: "/r/device-plugins/legacy.sock",
			State: dmv1.EndpointState_ENDPOINT_STATE_LIVE, RegistrationPath: dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK,
			Versions: []string{"v1beta1"}, RegisteredTime: ts(-10 * time.Second)}}},
	}}
	dmPath := serveFake(t, func(srv *grpc.Server) { dmv1.RegisterDeviceManagerServiceServer(srv, dm) })
	flags := []string{"--reconciler-addr", recon, "--devicemanager-addr", dmPath}

	code, out, errOut := runCLI(t, append(flags, "plugins")...)
	want := "NAME                TYPE          VIA               STATE       SOCKET                         VERSIONS  AGE  TRACE ID  ERROR\n" +
		"example.com/legacy  DevicePlugin  kubelet.sock      registered  /r/device-plugins/legacy.sock  v1beta1   10s  -         -\n" +
		"example.com/sample  DevicePlugin  plugins_registry  registered  /r/plugins_registry/a.sock     v1beta1   1s   -         -\n"
	if code != exitOK || out != want || errOut != "" {
		t.Fatalf("exit %d, stderr %q, output:\n%s\nwant:\n%s", code, errOut, out, want)
	}

	code, out, errOut = runCLI(t, append(flags, "plugins", "-o", "json")...)
	if code != exitOK {
		t.Fatalf("plugins -o json: exit %d, stderr %q", code, errOut)
	}
	var doc struct {
		InstanceID string `json:"instanceId"`
		Plugins    []struct {
			SocketPath string `json:"socketPath"`
		} `json:"plugins"`
		KubeletSock []struct {
			ResourceName string `json:"resourceName"`
			Endpoint     struct {
				Endpoint         string `json:"endpoint"`
				RegistrationPath string `json:"registrationPath"`
			} `json:"endpoint"`
		} `json:"kubeletSockPlugins"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("plugins -o json: %v\n%s", err, out)
	}
	if doc.InstanceID != "r-1" || len(doc.Plugins) != 1 || doc.Plugins[0].SocketPath != "/r/plugins_registry/a.sock" ||
		len(doc.KubeletSock) != 1 || doc.KubeletSock[0].ResourceName != "example.com/legacy" ||
		doc.KubeletSock[0].Endpoint.Endpoint != "/r/device-plugins/legacy.sock" ||
		doc.KubeletSock[0].Endpoint.RegistrationPath != "REGISTRATION_PATH_KUBELET_SOCK" {
		t.Fatalf("plugins -o json:\n%s", out)
	}
}

// -o before the command works as after it; a command that prints no table
// refuses it, and a bad format is the command's usage error.
func TestGlobalOutputFlag(t *testing.T) {
	dm := &fakeDeviceManager{allocations: []*dmv1.Allocation{{PodUid: "pod-1", ContainerName: "main",
		ResourceName: "example.com/sample", DeviceIds: []string{"dev-0"}, AllocatedTime: ts(-time.Minute)}}}
	path := serveFake(t, func(srv *grpc.Server) { dmv1.RegisterDeviceManagerServiceServer(srv, dm) })
	for _, args := range [][]string{
		{"-o", "json", "--devicemanager-addr", path, "allocations"},
		{"--devicemanager-addr", path, "--output", "json", "allocations"},
		{"--devicemanager-addr", path, "allocations", "-o", "json"},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != exitOK || !strings.Contains(out, `"podUid"`) {
			t.Fatalf("%q: exit %d, stderr %q, output:\n%s", args, code, errOut, out)
		}
	}
	// The command's own -o wins over the one before it.
	if code, out, errOut := runCLI(t, "-o", "json", "--devicemanager-addr", path, "allocations", "-o", "table"); code != exitOK || !strings.HasPrefix(out, "POD ") {
		t.Fatalf("-o json allocations -o table: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "yaml", "--devicemanager-addr", path, "allocations"}, `output format "yaml"`},
		{[]string{"-o", "table", "watch", "plugins"}, `output format "table": want text or json`},
		{[]string{"-o", "json", "release", "--pod", "p"}, "release has no output format"},
	} {
		if code, _, errOut := runCLI(t, tc.args...); code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}

// healthcheck exits 0 for a service whose gRPC health is SERVING and for a
// Jaeger whose query API answers, 1 otherwise.
func TestHealthcheck(t *testing.T) {
	hs := health.NewServer()
	path := serveFake(t, func(srv *grpc.Server) { healthpb.RegisterHealthServer(srv, hs) })
	jaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/services" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"data":[],"total":0}`)
	}))
	defer jaeger.Close()
	notJaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "<html></html>") }))
	defer notJaeger.Close()
	missing := filepath.Join(testutil.TempDir(t), "none.sock")

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--devicemanager-addr", path, "healthcheck", "devicemanager"}, exitOK, ""},
		{[]string{"--watcher-addr", missing, "healthcheck", "watcher"}, exitError, "cannot reach the watcher"},
		{[]string{"--jaeger-url", jaeger.URL, "healthcheck", "jaeger"}, exitOK, ""},
		{[]string{"--jaeger-url", notJaeger.URL, "healthcheck", "jaeger"}, exitError, "is --jaeger-url the query service?"},
		{[]string{"--jaeger-url", "http://127.0.0.1:1", "healthcheck", "jaeger"}, exitError, "cannot reach Jaeger"},
		{[]string{"healthcheck"}, exitUsage, "say what to check"},
		{[]string{"healthcheck", "console"}, exitUsage, `cannot check "console"`},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if code, _, errOut := runCLI(t, "--devicemanager-addr", path, "healthcheck", "devicemanager"); code != exitError || !strings.Contains(errOut, "NOT_SERVING") {
		t.Errorf("a NOT_SERVING devicemanager: exit %d, stderr %q", code, errOut)
	}
}
