package conform_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/conform"
	"github.com/nodeplug/nodeplug/internal/conform/faultplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// pluginEnv makes the test binary run faultplugin.Main instead of the tests:
// the lifecycle checks need a plugin process, and this one needs no build.
const pluginEnv = "NODEPLUG_CONFORM_TESTPLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(pluginEnv) == "1" {
		os.Exit(faultplugin.Main(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// short is the observation window of runs that expect nothing to happen:
// a plugin that keeps the rule passes whatever the window. Runs that
// expect a breach wait for it with testutil.Deadline as the upper bound.
const short = 300 * time.Millisecond

// pluginCommand is the command that runs the test plugin as a process.
func pluginCommand(t *testing.T, mode string, faults ...faultplugin.Fault) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var fs []string
	for _, f := range faults {
		fs = append(fs, string(f))
	}
	return []string{exe, "--mode", mode, "--faults", strings.Join(fs, ",")}
}

// run runs conform and fails the test on a run error.
func run(t *testing.T, cfg conform.Config) *conform.Report {
	t.Helper()
	if len(cfg.Command) > 0 {
		cfg.Env = append(cfg.Env, pluginEnv+"=1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*testutil.Deadline)
	defer cancel()
	rep, err := conform.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// startSocket serves the test plugin in-process in a plugins_registry
// directory and returns its socket.
func startSocket(t *testing.T, opts faultplugin.Options) string {
	t.Helper()
	return startPlugin(t, opts).Socket()
}

// startPlugin serves the test plugin in-process in a plugins_registry
// directory.
func startPlugin(t *testing.T, opts faultplugin.Options) *faultplugin.Plugin {
	t.Helper()
	dir := filepath.Join(testutil.TempDir(t), "plugins_registry")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	opts.Socket = filepath.Join(dir, "conform-test.sock")
	p, err := faultplugin.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

func wantStatuses(t *testing.T, rep *conform.Report, want map[string]conform.Status) {
	t.Helper()
	for _, res := range rep.Results {
		w, ok := want[res.Name]
		if !ok {
			w = conform.Pass
		}
		if res.Status != w {
			t.Errorf("%s: %s (%s), want %s", res.Name, res.Status, res.Detail, w)
		}
	}
	if len(rep.Results) != len(conform.Catalogue) {
		t.Errorf("%d results, want one per check (%d)", len(rep.Results), len(conform.Catalogue))
	}
	if t.Failed() {
		t.Logf("plugin output:\n%s", rep.PluginOutput)
	}
}

func skipped(names ...string) map[string]conform.Status {
	m := map[string]conform.Status{}
	for _, n := range names {
		m[n] = conform.Skip
	}
	return m
}

var lifecycleChecks = []string{conform.CheckKubeletRestart, conform.CheckSocketRemoval, conform.CheckSIGTERM}

// quickWait bounds the wait for a socket the started test plugin never
// re-creates.
const quickWait = time.Second

// The plugin without faults keeps every rule, through each registration
// path: every check that applies passes.
func TestCompliantPluginPasses(t *testing.T) {
	t.Run("socket", func(t *testing.T) {
		sock := startSocket(t, faultplugin.Options{})
		rep := run(t, conform.Config{Socket: sock, Observe: short})
		wantStatuses(t, rep, skipped(append(lifecycleChecks, conform.CheckRegisterRequest, conform.CheckDriverService)...))
		if rep.Path != conform.PathRegistry || rep.Plugin != faultplugin.Resource {
			t.Errorf("path %q plugin %q", rep.Path, rep.Plugin)
		}
	})
	t.Run("device plugin socket", func(t *testing.T) {
		sock := startSocket(t, faultplugin.Options{DevicePluginOnly: true})
		rep := run(t, conform.Config{Socket: sock, Observe: short})
		wantStatuses(t, rep, skipped(append(lifecycleChecks, conform.CheckRegisterRequest, conform.CheckGetInfo, conform.CheckDriverService, conform.CheckNotify)...))
		if rep.Path != conform.PathDeviceSocket {
			t.Errorf("path %q", rep.Path)
		}
	})
	t.Run("plugins_registry", func(t *testing.T) {
		rep := run(t, conform.Config{Command: pluginCommand(t, "registry"), Observe: short, RecreateWait: quickWait})
		wantStatuses(t, rep, skipped(conform.CheckRegisterRequest, conform.CheckDriverService))
	})
	t.Run("kubelet.sock", func(t *testing.T) {
		rep := run(t, conform.Config{Command: pluginCommand(t, "kubelet"), Observe: short, RecreateWait: quickWait})
		wantStatuses(t, rep, skipped(conform.CheckGetInfo, conform.CheckDriverService, conform.CheckNotify))
		if rep.Path != conform.PathKubeletSock {
			t.Errorf("path %q", rep.Path)
		}
	})
}

// Every check fails (or warns, where the kubelet tolerates the breach)
// when the plugin breaks its rule.
func TestEveryCheckFailsWhenItsRuleIsBroken(t *testing.T) {
	type tc struct {
		fault faultplugin.Fault
		check string
		want  conform.Status
		mode  string // "socket" (in-process), "registry" or "kubelet" (a process)
		typ   string // the plugin type a socket's GetInfo answers (default DevicePlugin)
		// waits: the check watches for the breach: the window is only an
		// upper bound.
		waits bool
		// quick: the check waits out a timeout before it can fail; a
		// short one keeps the test fast.
		quick bool
		// observe, when set, is the window: the breach shows only after
		// a window of the plugin keeping the rule.
		observe time.Duration
	}
	tests := []tc{
		{fault: faultplugin.FaultInfoType, check: conform.CheckGetInfo, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultInfoName, check: conform.CheckGetInfo, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultInfoVersions, check: conform.CheckGetInfo, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultInfoEndpoint, check: conform.CheckGetInfo, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultNotifyError, check: conform.CheckNotify, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultRegisterVersion, check: conform.CheckRegisterRequest, want: conform.Fail, mode: "kubelet"},
		{fault: faultplugin.FaultRegisterResource, check: conform.CheckRegisterRequest, want: conform.Fail, mode: "kubelet"},
		{fault: faultplugin.FaultRegisterEndpoint, check: conform.CheckRegisterRequest, want: conform.Fail, mode: "kubelet"},
		{fault: faultplugin.FaultOptionsError, check: conform.CheckOptions, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultNoFirstResponse, check: conform.CheckFirstResponse, want: conform.Fail, mode: "socket", quick: true},
		{fault: faultplugin.FaultDuplicateIDs, check: conform.CheckDeviceIDs, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultUnprintableID, check: conform.CheckDeviceIDs, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultBadHealth, check: conform.CheckHealth, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultBadTopology, check: conform.CheckTopology, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultFlap, check: conform.CheckHealthFlap, want: conform.Fail, mode: "socket", waits: true},
		{fault: faultplugin.FaultAllocateOneResponse, check: conform.CheckAllocate, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultAllocateUnknown, check: conform.CheckAllocateUnknown, want: conform.Warn, mode: "socket"},
		{fault: faultplugin.FaultPreferredForeign, check: conform.CheckPreferred, want: conform.Warn, mode: "socket"},
		{fault: faultplugin.FaultPreStartError, check: conform.CheckPreStart, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultAllocateNotConcurrent, check: conform.CheckConcurrentAllocate, want: conform.Fail, mode: "socket"},
		{fault: faultplugin.FaultSingleStream, check: conform.CheckReconnect, want: conform.Fail, mode: "socket", quick: true},
		{fault: faultplugin.FaultStopOnStreamEnd, check: conform.CheckReconnect, want: conform.Fail, mode: "socket", waits: true, quick: true},
		{fault: faultplugin.FaultStopOnStreamEnd, check: conform.CheckReconnect, want: conform.Fail, mode: "kubelet", waits: true, quick: true},
		// It dies a second after the first reconnect's stream ends: the
		// first window passes in full, the second sees it die.
		{fault: faultplugin.FaultStopAfterSecondStreamEnd, check: conform.CheckReconnect, want: conform.Fail, mode: "socket", quick: true, observe: 4 * time.Second},
		{fault: faultplugin.FaultStopAfterSecondStreamEnd, check: conform.CheckReconnect, want: conform.Fail, mode: "kubelet", quick: true, observe: 4 * time.Second},
		{fault: faultplugin.FaultNoDriverService, check: conform.CheckDriverService, want: conform.Fail, mode: "socket", typ: registerapi.CSIPlugin},
		{fault: faultplugin.FaultNoDriverService, check: conform.CheckDriverService, want: conform.Fail, mode: "socket", typ: registerapi.DRAPlugin},
		{fault: faultplugin.FaultNoReregister, check: conform.CheckKubeletRestart, want: conform.Fail, mode: "kubelet", quick: true},
		{fault: faultplugin.FaultExitOnSocketRemoval, check: conform.CheckSocketRemoval, want: conform.Fail, mode: "registry", waits: true},
		{fault: faultplugin.FaultExitOnSocketRemoval, check: conform.CheckSocketRemoval, want: conform.Fail, mode: "kubelet", waits: true},
		{fault: faultplugin.FaultKeepSocket, check: conform.CheckSIGTERM, want: conform.Warn, mode: "registry"},
		{fault: faultplugin.FaultIgnoreSIGTERM, check: conform.CheckSIGTERM, want: conform.Fail, mode: "kubelet", quick: true},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		covered[tt.check] = true
		typ := tt.typ
		if typ == "" {
			typ = registerapi.DevicePlugin
		}
		t.Run(tt.mode+"/"+typ+"/"+string(tt.fault), func(t *testing.T) {
			cfg := conform.Config{Selection: conform.Selection{Only: []string{tt.check}}, Observe: short}
			if tt.waits {
				cfg.Observe = testutil.Deadline
			}
			if tt.observe > 0 {
				cfg.Observe = tt.observe
			}
			if tt.quick {
				// Long enough for a compliant plugin on a busy machine;
				// this one never answers.
				cfg.Timeout, cfg.RegisterWait = 5*time.Second, 5*time.Second
			}
			if tt.mode == "socket" {
				opts := faultplugin.Options{Faults: []faultplugin.Fault{tt.fault}, Type: tt.typ}
				switch tt.typ {
				case registerapi.CSIPlugin:
					opts.Versions = []string{"1.0.0"}
				case registerapi.DRAPlugin:
					opts.Versions = []string{"v1.DRAPlugin"}
				}
				cfg.Socket = startSocket(t, opts)
			} else {
				cfg.Command = pluginCommand(t, tt.mode, tt.fault)
			}
			rep := run(t, cfg)
			if len(rep.Results) != 1 {
				t.Fatalf("--only %s gave %d results", tt.check, len(rep.Results))
			}
			if res := rep.Results[0]; res.Name != tt.check || res.Status != tt.want {
				t.Fatalf("%s: %s (%s), want %s\nplugin output:\n%s", res.Name, res.Status, res.Detail, tt.want, rep.PluginOutput)
			}
		})
	}
	for _, c := range conform.Catalogue {
		if !covered[c.Name] {
			t.Errorf("no fault breaks the rule of check %s", c.Name)
		}
	}
	for _, f := range faultplugin.Faults {
		found := false
		for _, tt := range tests {
			found = found || tt.fault == f
		}
		if !found {
			t.Errorf("fault %s is not tested", f)
		}
	}
}

// A registration socket of another type is checked with that type's rules
// and the calls the kubelet's handler for it makes (driver-service); the
// device plugin checks do not apply. Whenever a check fails the
// registration, the plugin is told NotifyRegistrationStatus(false) with
// the reason, as the kubelet tells it; otherwise registered=true.
func TestRegistrationSocketOfOtherTypes(t *testing.T) {
	tests := []struct {
		name     string
		typ      string
		versions []string
		faults   []faultplugin.Fault
		getinfo  conform.Status
		service  conform.Status
		reason   string // in the NotifyRegistrationStatus(false); "" for true
	}{
		{"csi", registerapi.CSIPlugin, []string{"1.0.0"}, nil, conform.Pass, conform.Pass, ""},
		{"csi version", registerapi.CSIPlugin, []string{"2.0.0"}, nil, conform.Fail, conform.Skip, "ValidatePlugin"},
		{"csi endpoint", registerapi.CSIPlugin, []string{"1.0.0"}, []faultplugin.Fault{faultplugin.FaultInfoEndpoint}, conform.Fail, conform.Skip, "not an absolute path"},
		{"csi no service", registerapi.CSIPlugin, []string{"1.0.0"}, []faultplugin.Fault{faultplugin.FaultNoDriverService}, conform.Pass, conform.Fail, "NodeGetInfo failed"},
		{"dra", registerapi.DRAPlugin, []string{"v1.DRAPlugin"}, nil, conform.Pass, conform.Pass, ""},
		{"dra version", registerapi.DRAPlugin, []string{"v1alpha4.DRAPlugin"}, nil, conform.Fail, conform.Skip, "invalid supported gRPC versions"},
		{"dra endpoint", registerapi.DRAPlugin, []string{"v1.DRAPlugin"}, []faultplugin.Fault{faultplugin.FaultInfoEndpoint}, conform.Fail, conform.Skip, "not an absolute path"},
		{"dra no service", registerapi.DRAPlugin, []string{"v1.DRAPlugin"}, []faultplugin.Fault{faultplugin.FaultNoDriverService}, conform.Pass, conform.Fail, "Unimplemented"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startPlugin(t, faultplugin.Options{Type: tt.typ, Versions: tt.versions, Faults: tt.faults})
			rep := run(t, conform.Config{Socket: p.Socket(), Observe: short})
			for check, want := range map[string]conform.Status{conform.CheckGetInfo: tt.getinfo, conform.CheckDriverService: tt.service, conform.CheckNotify: conform.Pass} {
				if res, _ := rep.Result(check); res.Status != want {
					t.Errorf("%s: %s (%s), want %s", check, res.Status, res.Detail, want)
				}
			}
			if res, _ := rep.Result(conform.CheckAllocate); res.Status != conform.Skip || !strings.Contains(res.Detail, tt.typ) {
				t.Errorf("allocate: %s (%s), want skip naming the type", res.Status, res.Detail)
			}
			st := p.Notified()
			if len(st) != 1 {
				t.Fatalf("the plugin was notified %d times, want once", len(st))
			}
			if st[0].GetPluginRegistered() != (tt.reason == "") || !strings.Contains(st[0].GetError(), tt.reason) {
				t.Fatalf("NotifyRegistrationStatus(registered=%t, %q), want registered=%t with %q",
					st[0].GetPluginRegistered(), st[0].GetError(), tt.reason == "", tt.reason)
			}
		})
	}
}

func TestSelection(t *testing.T) {
	sock := startSocket(t, faultplugin.Options{})
	rep := run(t, conform.Config{Socket: sock, Selection: conform.Selection{Skip: []string{conform.CheckHealthFlap, conform.CheckReconnect}}})
	for _, res := range rep.Results {
		if res.Name == conform.CheckHealthFlap || res.Name == conform.CheckReconnect {
			t.Errorf("skipped check %s reported", res.Name)
		}
	}
	if len(rep.Results) != len(conform.Catalogue)-2 {
		t.Errorf("%d results", len(rep.Results))
	}
	_, err := conform.Run(context.Background(), conform.Config{Socket: sock, Selection: conform.Selection{Only: []string{"no-such-check"}}})
	if err == nil || !strings.Contains(err.Error(), "no-such-check") {
		t.Errorf("unknown check: %v", err)
	}
}

func TestSubstitute(t *testing.T) {
	got := conform.Substitute([]string{"--root={root}", "{kubelet-sock}", "--dir", "{plugins-registry}/x", "{device-plugins}"}, "/r")
	want := []string{"--root=/r", "/r/device-plugins/kubelet.sock", "--dir", "/r/plugins_registry/x", "/r/device-plugins"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A given root dir is used as it is, and refused when a kubelet serves it.
func TestGivenRootDir(t *testing.T) {
	root := testutil.TempDir(t)
	rep := run(t, conform.Config{Command: pluginCommand(t, "kubelet"), Root: root, Observe: short,
		Selection: conform.Selection{Only: []string{conform.CheckRegisterRequest}}})
	if res := rep.Results[0]; res.Status != conform.Pass || !strings.Contains(res.Detail, "conform-test.sock") {
		t.Fatalf("%s: %s", res.Status, res.Detail)
	}
	if _, err := os.Stat(filepath.Join(root, "device-plugins")); err != nil {
		t.Errorf("the given root dir was removed: %v", err)
	}

	lis, err := net.Listen("unix", filepath.Join(root, "device-plugins", "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	_, err = conform.Run(context.Background(), conform.Config{Command: pluginCommand(t, "kubelet"), Root: root, Env: []string{pluginEnv + "=1"}})
	if err == nil || !strings.Contains(err.Error(), "answers") {
		t.Fatalf("a live kubelet.sock: %v", err)
	}
}

// A plugin that exits before it registers fails the registration checks,
// and the report keeps what it printed.
func TestPluginThatNeverRegisters(t *testing.T) {
	cmd := append(pluginCommand(t, "registry"), "--no-such-flag")
	rep := run(t, conform.Config{Command: cmd, Observe: short})
	res, _ := rep.Result(conform.CheckGetInfo)
	if res.Status != conform.Fail || !strings.Contains(res.Detail, "exited before it registered") {
		t.Fatalf("getinfo: %s (%s)", res.Status, res.Detail)
	}
	if res, _ := rep.Result(conform.CheckAllocate); res.Status != conform.Skip {
		t.Errorf("allocate: %s (%s)", res.Status, res.Detail)
	}
	if !strings.Contains(rep.PluginOutput, "no-such-flag") {
		t.Errorf("plugin output %q", rep.PluginOutput)
	}
}

// A plugin whose first ListAndWatch update is empty, its devices following
// (Intel's GPU plugin), is judged by the first update with devices: every
// device check passes, none is skipped.
func TestEmptyFirstUpdate(t *testing.T) {
	sock := startSocket(t, faultplugin.Options{EmptyFirst: true})
	rep := run(t, conform.Config{Socket: sock, Observe: testutil.Deadline,
		Selection: conform.Selection{Skip: []string{conform.CheckHealthFlap, conform.CheckReconnect}}})
	for _, res := range rep.Results {
		want := conform.Pass
		if res.Name == conform.CheckRegisterRequest || res.Name == conform.CheckDriverService || res.Lifecycle {
			want = conform.Skip
		}
		if res.Status != want {
			t.Errorf("%s: %s (%s), want %s", res.Name, res.Status, res.Detail, want)
		}
	}
	if res, _ := rep.Result(conform.CheckFirstResponse); !strings.Contains(res.Detail, "the first with devices") {
		t.Errorf("listandwatch-first does not say which update was checked: %s", res.Detail)
	}
	// The streams of a reconnect and of a kubelet restart are judged the
	// same way. The window only bounds the wait for the devices.
	cmd := append(pluginCommand(t, "kubelet"), "--empty-first")
	rep = run(t, conform.Config{Command: cmd, Observe: 2 * time.Second,
		Selection: conform.Selection{Only: []string{conform.CheckReconnect, conform.CheckKubeletRestart}}})
	for _, res := range rep.Results {
		if res.Status != conform.Pass || !strings.Contains(res.Detail, "4 devices") || strings.Contains(res.Detail, "0 devices") {
			t.Errorf("%s: %s (%s), want a pass on the 4 devices", res.Name, res.Status, res.Detail)
		}
	}
}

// Every resource of a plugin that serves two is checked and named, through
// either registration path: a rule broken by the second resource only
// fails its check, naming that resource.
func TestEveryResourceIsChecked(t *testing.T) {
	second := faultplugin.Resource + "2"
	for _, mode := range []string{"kubelet", "registry"} {
		t.Run(mode, func(t *testing.T) {
			cmd := append(pluginCommand(t, mode, faultplugin.FaultDuplicateIDs), "--resources", "2", "--fault-resource", "2")
			// The plugin registers its resources one after the other:
			// conform is told to wait for both.
			rep := run(t, conform.Config{Command: cmd, Observe: short, Resources: 2,
				Selection: conform.Selection{Only: []string{conform.CheckOptions, conform.CheckDeviceIDs, conform.CheckAllocate, conform.CheckSIGTERM}}})
			if got := slices.Sorted(slices.Values(rep.Resources)); strings.Join(got, ",") != faultplugin.Resource+","+second {
				t.Fatalf("resources checked: %q", rep.Resources)
			}
			want := map[string]conform.Status{conform.CheckOptions: conform.Pass, conform.CheckDeviceIDs: conform.Fail, conform.CheckAllocate: conform.Pass, conform.CheckSIGTERM: conform.Pass}
			for _, res := range rep.Results {
				if res.Status != want[res.Name] {
					t.Errorf("%s: %s (%s), want %s", res.Name, res.Status, res.Detail, want[res.Name])
				}
				if res.Name != conform.CheckSIGTERM && (!strings.Contains(res.Detail, faultplugin.Resource+": ") || !strings.Contains(res.Detail, second+": ")) {
					t.Errorf("%s does not name both resources: %s", res.Name, res.Detail)
				}
			}
			if res, _ := rep.Result(conform.CheckSIGTERM); !strings.Contains(res.Detail, "conform-test-2.sock") {
				t.Errorf("sigterm does not look at the second resource's socket: %s", res.Detail)
			}
		})
	}
}

// A plugin that re-creates its socket after --observe has passed is told
// from one that does not: the wait for a re-creation is --recreate-wait.
func TestSocketRecreatedAfterObserve(t *testing.T) {
	cmd := append(pluginCommand(t, "registry"), "--recreate-after", "1s")
	rep := run(t, conform.Config{Command: cmd, Observe: short, RecreateWait: testutil.Deadline,
		Selection: conform.Selection{Only: []string{conform.CheckSocketRemoval}}})
	if res := rep.Results[0]; res.Status != conform.Pass || !strings.Contains(res.Detail, "re-created") || strings.Contains(res.Detail, "did not re-create") {
		t.Fatalf("socket-removal: %s (%s), want the re-creation seen", res.Status, res.Detail)
	}
}
