package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// accessCallerEnv, when set, makes the test binary a caller process for
// TestLocalUsers (see TestAccessCaller) instead of a test run.
const accessCallerEnv = "NODEPLUG_E2E_ACCESS_CALLER"

// The five things a local attacker could do before the API had roles.
var attacks = []string{"list-allocations", "allocate", "release-roots-pod", "deregister-roots-plugin", "register-roots-plugin-again"}

// attackMethods are the devicemanager methods the attacks call.
var attackMethods = map[string]string{
	"list-allocations":            "ListAllocations",
	"allocate":                    "Allocate",
	"release-roots-pod":           "Release",
	"deregister-roots-plugin":     "DeregisterPlugin",
	"register-roots-plugin-again": "RegisterPlugin",
}

const dmService = "/nodeplug.devicemanager.v1.DeviceManagerService/"

// attempt is what one caller process got for one attack.
type attempt struct {
	code codes.Code
	msg  string
}

// TestLocalUsers runs the stack as root, with an API group and an
// operator group, and tries the five attacks from other users' processes
// (copies of this test binary run with another uid and other groups):
//   - nobody, in neither group, can do none of them: the socket's
//     directory is closed to it, so it cannot even connect;
//   - nobody as a member of the API group is a reader: it may list, and
//     the other four are refused with PERMISSION_DENIED naming the method
//     and its uid, logged with uid and pid and counted in
//     nodeplug_api_denied_total{method};
//   - a member of the operator group (by primary or supplementary group)
//     may list, allocate and release, but not deregister or register;
//   - root may do all five.
//
// Root's state is intact after every refused attempt.
func TestLocalUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("running the stack as root and callers as other users needs root")
	}
	const (
		apiGID = 4344
		opGID  = 4343
		nobody = 65534
	)
	var groups []string
	for _, svc := range []string{"APISERVER", "WATCHER", "RECONCILER", "DEVICEMANAGER"} {
		groups = append(groups, fmt.Sprintf("NODEPLUG_%s_API_GROUP=%d", svc, apiGID), fmt.Sprintf("NODEPLUG_%s_OPERATOR_GROUP=%d", svc, opGID))
	}
	e := newEnv(t, groups...)
	if err := os.Chmod(e.root, 0o755); err != nil { // let others reach nodeplug/ (0750, group apiGID)
		t.Fatal(err)
	}
	sock := layout.APISocket(e.root, "devicemanager")
	for _, p := range []string{sock, filepath.Dir(sock)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Gid != apiGID {
			t.Fatalf("%s: group %v, want --api-group %d", p, fi.Sys(), apiGID)
		}
	}
	p := e.plugin("roots", "example.com/roots", 4, false)
	e.waitAllocatable("example.com/roots", 4)
	gen := testutil.Generation(t, p.SocketPath())

	// rootPod (re)allocates root's pod and returns its devices.
	rootPod := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := e.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: "root-pod", ContainerName: "main",
			Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/roots", Count: 2}}})
		if err != nil || len(resp.GetAllocations()) != 1 {
			t.Fatalf("root's Allocate: %v", err)
		}
		return strings.Join(resp.GetAllocations()[0].GetDeviceIds(), ",")
	}
	// intact checks that root's pod alone holds devices, the ones it got,
	// and that the plugin is registered once, under its one name.
	intact := func(who, devices string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		list, err := e.dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if a := list.GetAllocations(); len(a) != 1 || a[0].GetPodUid() != "root-pod" || strings.Join(a[0].GetDeviceIds(), ",") != devices {
			t.Errorf("after %s's attempts the allocations are %v, want root-pod's alone with %s", who, a, devices)
		}
		if r := e.resource("example.com/roots"); r == nil || r.GetAllocatable() != 4 {
			t.Errorf("after %s's attempts example.com/roots is %v, want registered with 4 allocatable devices", who, r)
		}
		if r := e.resource("example.com/roots-too"); r != nil {
			t.Errorf("after %s's attempts the plugin's socket is registered under a second name: %v", who, r)
		}
	}

	// The callers are copies of this test binary, run as other users.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "access-caller")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	call := func(cred *syscall.Credential) map[string]attempt {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^TestAccessCaller$", "-test.v")
		cmd.Env = append(os.Environ(), accessCallerEnv+"=1",
			"NODEPLUG_ROOT_DIR="+e.root, "E2E_ENDPOINT="+p.SocketPath(), "E2E_GENERATION="+gen)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("caller as uid %d gid %d groups %v: %v\n%s", cred.Uid, cred.Gid, cred.Groups, err, out)
		}
		got := map[string]attempt{}
		for _, line := range strings.Split(string(out), "\n") {
			var name, msg string
			var c uint32
			if n, _ := fmt.Sscanf(strings.TrimSpace(line), "ATTACK %s %d %q", &name, &c, &msg); n == 3 {
				got[name] = attempt{codes.Code(c), msg}
			}
		}
		if len(got) != len(attacks) {
			t.Fatalf("caller printed %d results:\n%s", len(got), out)
		}
		return got
	}
	expect := func(who string, got map[string]attempt, want map[string]codes.Code) {
		t.Helper()
		for a, w := range want {
			if got[a].code != w {
				t.Errorf("%s: %s answered %s (%s), want %s", who, a, got[a].code, got[a].msg, w)
			}
			if w != codes.PermissionDenied {
				continue
			}
			// The refusal names the method and the caller's uid.
			if msg := got[a].msg; !strings.Contains(msg, dmService+attackMethods[a]) || !strings.Contains(msg, "uid "+strconv.Itoa(nobody)) {
				t.Errorf("%s: the refusal of %s, %q, does not name the method and uid %d", who, a, msg, nobody)
			}
		}
	}
	denied := codes.PermissionDenied

	// nobody, in neither group: the API socket's directory (0750, group
	// apiGID) is closed to it, so every attack fails at the dial.
	devices := rootPod()
	expect("nobody", call(&syscall.Credential{Uid: nobody, Gid: nobody}), map[string]codes.Code{
		"list-allocations": codes.Unavailable, "allocate": codes.Unavailable, "release-roots-pod": codes.Unavailable,
		"deregister-roots-plugin": codes.Unavailable, "register-roots-plugin-again": codes.Unavailable,
	})
	intact("nobody", devices)

	// nobody in the API group: a reader. It connects, and every attack
	// but listing is refused by the API itself.
	expect("reader", call(&syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{apiGID}}), map[string]codes.Code{
		"list-allocations": codes.OK, "allocate": denied, "release-roots-pod": denied,
		"deregister-roots-plugin": denied, "register-roots-plugin-again": denied,
	})
	intact("a reader", devices)
	// The refusals are logged with the caller's uid and pid.
	dm := e.st.Process("devicemanager")
	logged := map[string]bool{}
	for _, rec := range dm.LogLines("API call refused") {
		uid, _ := rec["uid"].(float64)
		pid, _ := rec["pid"].(float64)
		if m, _ := rec["method"].(string); uid == nobody && pid > 0 {
			logged[m] = true
		}
	}
	for _, m := range []string{"Allocate", "Release", "DeregisterPlugin", "RegisterPlugin"} {
		if !logged[dmService+m] {
			t.Errorf("the refusal of %s is not logged with uid %d and a pid:\n%s", m, nobody, dm.Logs())
		}
	}

	// Members of the operator group, by primary and by supplementary group
	// (both also in the API group, to reach the socket): operators.
	for _, op := range []struct {
		name string
		cred *syscall.Credential
	}{
		{"operator (primary group)", &syscall.Credential{Uid: nobody, Gid: opGID, Groups: []uint32{apiGID}}},
		{"operator (supplementary group)", &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{apiGID, opGID}}},
	} {
		expect(op.name, call(op.cred), map[string]codes.Code{
			"list-allocations": codes.OK, "allocate": codes.OK, "release-roots-pod": codes.OK,
			"deregister-roots-plugin": denied, "register-roots-plugin-again": denied,
		})
		// The operator released root's pod: that is its role. The plugin
		// is registered once, under its one name.
		e.waitAllocatable("example.com/roots", 4)
		if r := e.resource("example.com/roots-too"); r != nil {
			t.Errorf("%s registered the plugin's socket under a second name: %v", op.name, r)
		}
		devices = rootPod()
	}
	intact("the operators", devices)

	// Every refusal was counted, by method: the reader's four (and its
	// clean-up Release), and both operators' deregister and register.
	counts := deniedCounts(t, dm)
	for m, want := range map[string]float64{"ListAllocations": 0, "Allocate": 1, "Release": 2, "DeregisterPlugin": 3, "RegisterPlugin": 3} {
		if got := counts[dmService+m]; got != want {
			t.Errorf("nodeplug_api_denied_total{method=%q} = %v, want %v", dmService+m, got, want)
		}
	}

	// Root may do all five. Its RegisterPlugin follows its own
	// DeregisterPlugin, so the endpoint is free to register under the
	// second name (the devicemanager would answer ALREADY_EXISTS while it
	// is live under the first).
	asRoot := call(&syscall.Credential{Uid: 0, Gid: 0})
	expect("root", asRoot, map[string]codes.Code{
		"list-allocations": codes.OK, "allocate": codes.OK, "release-roots-pod": codes.OK, "deregister-roots-plugin": codes.OK,
	})
	// The reconciler may have registered the plugin again in between: then
	// the devicemanager's own rule answers, past the access check.
	if c := asRoot["register-roots-plugin-again"]; c.code != codes.OK && c.code != codes.AlreadyExists {
		t.Errorf("root: register-roots-plugin-again answered %s (%s), want OK or ALREADY_EXISTS", c.code, c.msg)
	}
	if n := deniedCounts(t, dm); n[dmService+"RegisterPlugin"] != 3 || n[dmService+"DeregisterPlugin"] != 3 {
		t.Errorf("root's calls were counted as refused: %v", n)
	}
}

// deniedCounts scrapes a service's nodeplug_api_denied_total by method.
func deniedCounts(t *testing.T, p *stack.Process) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, err := p.Addr(ctx, "metrics listening")
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), `nodeplug_api_denied_total{method="`)
		if !ok {
			continue
		}
		method, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		out[method] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAccessCaller is the body of TestLocalUsers' caller processes: it
// tries each attack on the devicemanager's API socket and prints its code
// and message.
func TestAccessCaller(t *testing.T) {
	if os.Getenv(accessCallerEnv) == "" {
		t.Skip("run by TestLocalUsers as another user")
	}
	sock := layout.APISocket(os.Getenv("NODEPLUG_ROOT_DIR"), "devicemanager")
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
		fmt.Printf("ATTACK %s %d %q\n", a, status.Code(err), status.Convert(err).Message())
		if err != nil {
			t.Logf("%s: %v", a, err)
		}
	}
	// The attacker's own pod, if it got one, is let go.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _ = dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: "attacker-pod"})
}
