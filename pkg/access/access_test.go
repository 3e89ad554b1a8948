package access_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/access"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

func TestRequired(t *testing.T) {
	for method, want := range map[string]access.Role{
		"/grpc.health.v1.Health/Check":                                         access.RoleNone,
		"/grpc.health.v1.Health/Watch":                                         access.RoleNone,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":            access.RoleReader,
		"/nodeplug.devicemanager.v1.DeviceManagerService/ListResources":        access.RoleReader,
		"/nodeplug.devicemanager.v1.DeviceManagerService/WatchResources":       access.RoleReader,
		"/nodeplug.devicemanager.v1.DeviceManagerService/ListAllocations":      access.RoleReader,
		"/nodeplug.watcher.v1.WatcherService/WatchSocketEvents":                access.RoleReader,
		"/nodeplug.reconciler.v1.ReconcilerService/ListPlugins":                access.RoleReader,
		"/nodeplug.devicemanager.v1.DeviceManagerService/Allocate":             access.RoleOperator,
		"/nodeplug.devicemanager.v1.DeviceManagerService/Release":              access.RoleOperator,
		"/nodeplug.devicemanager.v1.DeviceManagerService/StartContainer":       access.RoleOperator,
		"/nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin":       access.RoleInternal,
		"/nodeplug.devicemanager.v1.DeviceManagerService/DeregisterPlugin":     access.RoleInternal,
		"/nodeplug.devicemanager.v1.DeviceManagerService/SomethingNewTomorrow": access.RoleInternal,
		"/nodeplug.devicemanager.v1.DRAService/ListDRADrivers":                 access.RoleReader,
		"/nodeplug.devicemanager.v1.DRAService/ListResourceSlices":             access.RoleReader,
		"/nodeplug.devicemanager.v1.DRAService/WatchResourceSlices":            access.RoleReader,
		"/nodeplug.devicemanager.v1.DRAService/RegisterDRADriver":              access.RoleInternal,
		"/nodeplug.devicemanager.v1.DRAService/DeregisterDRADriver":            access.RoleInternal,
		"/nodeplug.devicemanager.v1.DRAService/PrepareResources":               access.RoleOperator,
		"/nodeplug.devicemanager.v1.DRAService/ListClaims":                     access.RoleReader,
		"/nodeplug.devicemanager.v1.DRAService/ListPodClaims":                  access.RoleReader,
		"/nodeplug.devicemanager.v1.DRAService/ReleasePodClaims":               access.RoleOperator,
	} {
		if got := access.Required(method); got != want {
			t.Errorf("Required(%s) = %s, want %s", method, got, want)
		}
	}
}

func TestRoleFromOrganizations(t *testing.T) {
	for _, tc := range []struct {
		orgs []string
		want access.Role
	}{
		{nil, access.RoleNone},
		{[]string{"system:nodes"}, access.RoleNone},
		{[]string{"nodeplug:reader"}, access.RoleReader},
		{[]string{"nodeplug:reader", "nodeplug:operator"}, access.RoleOperator},
		{[]string{"nodeplug:internal", "nodeplug:reader"}, access.RoleInternal},
		{[]string{"nodeplug:admin"}, access.RoleNone},
	} {
		if got := access.RoleFromOrganizations(tc.orgs); got != tc.want {
			t.Errorf("RoleFromOrganizations(%q) = %s, want %s", tc.orgs, got, tc.want)
		}
	}
}

func TestUnixPolicy(t *testing.T) {
	p := access.UnixPolicy{OwnUID: 1000, OperatorGIDs: []uint32{50}}
	for _, tc := range []struct {
		cred access.UnixCred
		want access.Role
	}{
		{access.UnixCred{UID: 0, GID: 0}, access.RoleInternal},
		{access.UnixCred{UID: 1000, GID: 1000}, access.RoleInternal},
		{access.UnixCred{UID: 65534, GID: 65534}, access.RoleReader},
		{access.UnixCred{UID: 1001, GID: 50}, access.RoleOperator},
		{access.UnixCred{UID: 1001, GID: 1001, Groups: []uint32{7, 50}}, access.RoleOperator},
		{access.UnixCred{UID: 1001, GID: 1001, Groups: []uint32{7}}, access.RoleReader},
	} {
		if got := p.Role(tc.cred); got != tc.want {
			t.Errorf("Role(%+v) = %s, want %s", tc.cred, got, tc.want)
		}
	}
}

// server serves the devicemanager's service (unimplemented: a call that
// passes the guard answers Unimplemented) and health behind the policy.
type server struct {
	reg *prometheus.Registry
	mu  sync.Mutex
	log *bytes.Buffer
}

// logged returns what the guard logged so far.
func (s *server) logged() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

func serve(t *testing.T, lis net.Listener, creds *access.Credentials, open bool) *server {
	t.Helper()
	s := &server{reg: prometheus.NewRegistry(), log: &bytes.Buffer{}}
	g := access.NewGuard(slog.New(slog.NewTextHandler(&lockedWriter{mu: &s.mu, buf: s.log}, nil)), s.reg)
	if open {
		g.AllowUnidentified()
	}
	gs := grpc.NewServer(grpc.Creds(creds), grpc.ChainUnaryInterceptor(g.Unary), grpc.ChainStreamInterceptor(g.Stream))
	dmv1.RegisterDeviceManagerServiceServer(gs, dmv1.UnimplementedDeviceManagerServiceServer{})
	h := health.NewServer()
	healthpb.RegisterHealthServer(gs, h)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return s
}

// calls makes one call of each role's kind and returns its code.
func calls(t *testing.T, conn *grpc.ClientConn) map[string]codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dm := dmv1.NewDeviceManagerServiceClient(conn)
	out := map[string]codes.Code{}
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	out["health"] = status.Code(err)
	_, err = dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{})
	out["list"] = status.Code(err)
	_, err = dm.Allocate(ctx, &dmv1.AllocateRequest{})
	out["allocate"] = status.Code(err)
	_, err = dm.Release(ctx, &dmv1.ReleaseRequest{})
	out["release"] = status.Code(err)
	_, err = dm.DeregisterPlugin(ctx, &dmv1.DeregisterPluginRequest{})
	out["deregister"] = status.Code(err)
	_, err = dm.RegisterPlugin(ctx, &dmv1.RegisterPluginRequest{})
	out["register"] = status.Code(err)
	return out
}

// want builds the expected codes for a role: calls above it are denied,
// the rest reach the (unimplemented) service.
func want(role access.Role) map[string]codes.Code {
	need := map[string]access.Role{"health": access.RoleNone, "list": access.RoleReader, "allocate": access.RoleOperator,
		"release": access.RoleOperator, "deregister": access.RoleInternal, "register": access.RoleInternal}
	out := map[string]codes.Code{}
	for k, r := range need {
		switch {
		case r > role:
			out[k] = codes.PermissionDenied
		case k == "health":
			out[k] = codes.OK
		default:
			out[k] = codes.Unimplemented
		}
	}
	return out
}

func sameCodes(t *testing.T, who string, got, want map[string]codes.Code) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %s answered %s, want %s", who, k, got[k], w)
		}
	}
}

func dialUnix(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestUnixOwnerIsInternal: the service's own uid may call everything.
func TestUnixOwnerIsInternal(t *testing.T) {
	path := filepath.Join(testutil.TempDir(t), "api.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, lis, &access.Credentials{Unix: access.UnixPolicy{OwnUID: uint32(os.Getuid())}}, false)
	sameCodes(t, "owner", calls(t, dialUnix(t, path)), want(access.RoleInternal))
}

// TestUnixOtherUsers runs callers as other users (the test binary re-run
// with another uid): nobody is a reader, a member of the operator group
// an operator. It needs root to switch users.
func TestUnixOtherUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("switching to another uid needs root")
	}
	dir := testutil.TempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "api.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	// The test binary's own directory is private to root: run a copy.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "caller")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	const operatorGID = 4242
	srv := serve(t, lis, &access.Credentials{Unix: access.UnixPolicy{OwnUID: 0, OperatorGIDs: []uint32{operatorGID}}}, false)
	for _, tc := range []struct {
		name   string
		cred   *syscall.Credential
		expect access.Role
	}{
		{"nobody", &syscall.Credential{Uid: 65534, Gid: 65534}, access.RoleReader},
		{"operator by primary group", &syscall.Credential{Uid: 65534, Gid: operatorGID}, access.RoleOperator},
		{"operator by supplementary group", &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{operatorGID}}, access.RoleOperator},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, "-test.run=^TestCallerProcess$")
			cmd.Env = append(os.Environ(), "ACCESS_TEST_SOCKET="+path)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: tc.cred}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("caller process: %v\n%s", err, out)
			}
			got := map[string]codes.Code{}
			for _, line := range strings.Split(string(out), "\n") {
				var k string
				var c uint32
				if n, _ := fmt.Sscanf(line, "CALL %s %d", &k, &c); n == 2 {
					got[k] = codes.Code(c)
				}
			}
			if len(got) == 0 {
				t.Fatalf("caller process printed no results:\n%s", out)
			}
			sameCodes(t, tc.name, got, want(tc.expect))
		})
	}
	if log := srv.logged(); !strings.Contains(log, "uid=65534") || !strings.Contains(log, "pid=") {
		t.Errorf("refusals not logged with uid and pid:\n%s", log)
	}
	if n := srv.denied("/nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin"); n != 6 {
		t.Errorf("nodeplug_api_denied_total for RegisterPlugin = %v, want 6 (two calls from each of three callers)", n)
	}
}

// denied returns nodeplug_api_denied_total{method}.
func (s *server) denied(method string) float64 {
	mfs, _ := s.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "nodeplug_api_denied_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && l.GetValue() == method {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestCallerProcess is the body of the caller processes above; it does
// nothing unless started by them.
func TestCallerProcess(t *testing.T) {
	path := os.Getenv("ACCESS_TEST_SOCKET")
	if path == "" {
		t.Skip("started only by TestUnixOtherUsers")
	}
	for k, c := range calls(t, dialUnix(t, path)) {
		fmt.Printf("CALL %s %d\n", k, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := dmv1.NewDeviceManagerServiceClient(dialUnix(t, path)).RegisterPlugin(ctx, &dmv1.RegisterPluginRequest{})
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "RegisterPlugin") || !strings.Contains(msg, fmt.Sprintf("uid %d", os.Getuid())) {
		t.Errorf("refusal %q does not name the method and the uid", msg)
	}
}

// lockedWriter serialises writes to a buffer shared with the test.
type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }
