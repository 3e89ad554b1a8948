package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// accessCallerEnv, when set, makes the test binary a caller process for
// TestLocalUsers (see TestAccessCaller) instead of a test run.
const accessCallerEnv = "NODEPLUG_E2E_ACCESS_CALLER"

// The five things a local attacker could do before the API had roles.
var attacks = []string{"list-allocations", "allocate", "release-roots-pod", "deregister-roots-plugin", "register-roots-plugin-again"}

// TestLocalUsers runs the stack as root and tries the five attacks from
// other users' processes: nobody can do none of them (it cannot even open
// the socket); a member of the operator group may list, allocate and
// release but not deregister or register plugins. Root's state is intact
// afterwards.
func TestLocalUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("running the stack as root and callers as other users needs root")
	}
	const opGID = 4343
	var groups []string
	for _, svc := range []string{"WATCHER", "RECONCILER", "DEVICEMANAGER"} {
		groups = append(groups, fmt.Sprintf("NODEPLUG_%s_API_GROUP=%d", svc, opGID), fmt.Sprintf("NODEPLUG_%s_OPERATOR_GROUP=%d", svc, opGID))
	}
	e := newEnv(t, groups...)
	if err := os.Chmod(e.root, 0o755); err != nil { // let others reach nodeplug/ (0750, group opGID)
		t.Fatal(err)
	}
	p := e.plugin("roots", "example.com/roots", 4, false)
	e.waitAllocatable("example.com/roots", 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rootAlloc, err := e.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: "root-pod", ContainerName: "main",
		Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/roots", Count: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	gen := testutil.Generation(t, p.SocketPath())

	// The callers are copies of this test binary, run as other users.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "access-caller")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	call := func(cred *syscall.Credential) map[string]codes.Code {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^TestAccessCaller$", "-test.v")
		cmd.Env = append(os.Environ(), accessCallerEnv+"=1",
			"NODEPLUG_ROOT_DIR="+e.root, "E2E_ENDPOINT="+p.SocketPath(), "E2E_GENERATION="+gen)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("caller as uid %d gid %d: %v\n%s", cred.Uid, cred.Gid, err, out)
		}
		got := map[string]codes.Code{}
		for _, line := range strings.Split(string(out), "\n") {
			var name string
			var c uint32
			if n, _ := fmt.Sscanf(strings.TrimSpace(line), "ATTACK %s %d", &name, &c); n == 2 {
				got[name] = codes.Code(c)
			}
		}
		if len(got) != len(attacks) {
			t.Fatalf("caller printed %d results:\n%s", len(got), out)
		}
		return got
	}

	nobody := call(&syscall.Credential{Uid: 65534, Gid: 65534})
	for _, a := range attacks {
		// The socket's directory is closed to nobody: the dial itself fails.
		if nobody[a] == codes.OK {
			t.Errorf("nobody could %s", a)
		}
	}
	// Root's pod still holds its devices, and nobody's Allocate took none.
	list, err := e.dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetAllocations()); n != 1 || list.GetAllocations()[0].GetPodUid() != "root-pod" ||
		strings.Join(list.GetAllocations()[0].GetDeviceIds(), ",") != strings.Join(rootAlloc.GetAllocations()[0].GetDeviceIds(), ",") {
		t.Fatalf("after nobody's attempts the allocations are %v, want root-pod's alone with %v", list.GetAllocations(), rootAlloc.GetAllocations()[0].GetDeviceIds())
	}

	operator := call(&syscall.Credential{Uid: 65534, Gid: opGID})
	for a, want := range map[string]codes.Code{
		"list-allocations": codes.OK, "allocate": codes.OK, "release-roots-pod": codes.OK,
		"deregister-roots-plugin": codes.PermissionDenied, "register-roots-plugin-again": codes.PermissionDenied,
	} {
		if operator[a] != want {
			t.Errorf("operator-group member: %s answered %s, want %s", a, operator[a], want)
		}
	}

	// The operator released root's pod: that is its role. Everything
	// reserved to root (internal) is intact: the plugin is registered once,
	// under its one name.
	e.waitAllocatable("example.com/roots", 4)
	if r := e.resource("example.com/roots-too"); r != nil {
		t.Errorf("the plugin's socket was registered under a second name: %v", r)
	}
	// Root can still do all of it.
	again, err := e.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: "root-pod-2", ContainerName: "main",
		Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/roots", Count: 2}}})
	if err != nil || len(again.GetAllocations()) != 1 {
		t.Fatalf("root's Allocate after the attacks: %v", err)
	}
	if _, err := e.dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: "root-pod-2"}); err != nil {
		t.Fatalf("root's Release: %v", err)
	}
	if _, err := e.dm.DeregisterPlugin(ctx, &dmv1.DeregisterPluginRequest{ResourceName: "example.com/roots", Endpoint: p.SocketPath(), Generation: gen}); err != nil {
		t.Fatalf("root's DeregisterPlugin: %v", err)
	}
}

// TestAccessCaller is the body of TestLocalUsers' caller processes: it
// tries each attack on the devicemanager's API socket and prints its code.
func TestAccessCaller(t *testing.T) {
	if os.Getenv(accessCallerEnv) == "" {
		t.Skip("run by TestLocalUsers as another user")
	}
	sock := app.APISocket(os.Getenv("NODEPLUG_ROOT_DIR"), "devicemanager")
	conn, err := rpcutil.DialPeer(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	dm := dmv1.NewDeviceManagerServiceClient(conn)
	ep, gen := os.Getenv("E2E_ENDPOINT"), os.Getenv("E2E_GENERATION")
	for _, a := range attacks {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var err error
		switch a {
		case "list-allocations":
			_, err = dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{})
		case "allocate":
			_, err = dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: "attacker-pod", ContainerName: "main",
				Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/roots", Count: 1}}})
		case "release-roots-pod":
			_, err = dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: "root-pod"})
		case "deregister-roots-plugin":
			_, err = dm.DeregisterPlugin(ctx, &dmv1.DeregisterPluginRequest{ResourceName: "example.com/roots", Endpoint: ep, Generation: gen})
		case "register-roots-plugin-again":
			_, err = dm.RegisterPlugin(ctx, &dmv1.RegisterPluginRequest{ResourceName: "example.com/roots-too", Endpoint: ep,
				Versions: []string{pluginapi.Version}, SocketPath: ep, Generation: gen})
		}
		cancel()
		fmt.Printf("ATTACK %s %d\n", a, status.Code(err))
		if err != nil {
			t.Logf("%s: %v", a, err)
		}
	}
	// The attacker's own pod, if it got one, is let go.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _ = dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: "attacker-pod"})
}
