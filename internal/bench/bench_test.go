package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/certs"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/app"
)

// built holds the binaries the tests of this package run, built once.
var built struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// binaries builds the services and nodeplug-bench once for the package's
// tests and returns their directory.
func binaries(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "npbin"); built.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		built.err = stack.Build(ctx, built.dir, "nodeplug-apiserver", "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-dramanager", "nodeplug-bench")
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}

// TestShortRun runs `nodeplug-bench -short` against freshly built binaries:
// it must complete, write JSON holding every figure, and end its churn run in
// exactly the expected state. It checks the bench, not the speed.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the services")
	}
	bin := binaries(t)
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out := filepath.Join(dir, "results.json")
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "nodeplug-bench"), "-short", "-json", out)
	output, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nodeplug-bench -short: %v\n%s", err, output)
	}
	t.Logf("%s", output)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	cfg := Short()
	if len(r.Registration) != len(cfg.RegistrationNs) {
		t.Errorf("registration rounds %d, want %d", len(r.Registration), len(cfg.RegistrationNs))
	}
	for _, rr := range r.Registration {
		if rr.Notify.Count != rr.N || rr.Allocatable.Count != rr.N || rr.Deregistration.Count != rr.N || rr.AllRegisteredMs <= 0 {
			t.Errorf("registration N=%d incomplete: %+v", rr.N, rr)
		}
	}
	if want := 2 * len(cfg.RegistrationNs); len(r.Floor) != want {
		t.Errorf("floor comparisons %d, want %d", len(r.Floor), want)
	}
	for _, f := range r.Floor {
		if len(f.Rounds) != cfg.FloorRounds || f.RatioTotal <= 0 || f.ContractRatioTotal <= 0 || f.OverheadRatioTotal <= 0 || f.AloneRatioTotal <= 0 {
			t.Errorf("floor %s N=%d incomplete: %+v", f.Kind, f.N, f)
			continue
		}
		for _, rd := range f.Rounds {
			if rd.Nodeplug.Notify.Count != f.N || rd.Floor.Notify.Count != f.N || rd.FloorAlone.Notify.Count != f.N || rd.Contract.Notify.Count != f.N {
				t.Errorf("floor %s N=%d round incomplete: %+v", f.Kind, f.N, rd)
			}
			// The floor alone is one process: all its CPU is the
			// registrar's.
			if fa := rd.FloorAlone; fa.CPUmsPerPlugin <= 0 || fa.CPUmsPerPluginByProcess["floor"] != fa.CPUmsPerPlugin {
				t.Errorf("floor %s N=%d: the floor alone's CPU per plugin %v, by process %v", f.Kind, f.N, fa.CPUmsPerPlugin, fa.CPUmsPerPluginByProcess)
			}
			// Each registrar's reconciler dials every plugin; the
			// processes' shares add up to the total, but for rounding.
			for who, fig := range map[string]RoundFigures{"nodeplug": rd.Nodeplug, "contract floor": rd.Contract} {
				var sum float64
				for _, v := range fig.CPUmsPerPluginByProcess {
					sum += v
				}
				if fig.CPUmsPerPluginByProcess["reconciler"] <= 0 || math.Abs(sum-fig.CPUmsPerPlugin) > 0.01*float64(len(fig.CPUmsPerPluginByProcess)+1) {
					t.Errorf("floor %s N=%d: %s's CPU by process %v does not make its CPU per plugin %v", f.Kind, f.N, who, fig.CPUmsPerPluginByProcess, fig.CPUmsPerPlugin)
				}
			}
		}
	}
	if r.Footprint.DeviceManagerAfterMiB <= 0 {
		t.Errorf("no devicemanager RSS after the plugins left: %+v", r.Footprint)
	}
	if b := r.Footprint.Bare; b.Conns != cfg.RSSPlugins || b.RSSKiBAfter <= 0 || b.GoroutinesAfter <= b.GoroutinesBefore ||
		b.RSSKiBClosed <= 0 || b.GoroutinesClosed >= b.GoroutinesAfter || b.ClosedOverBefore <= 0 {
		t.Errorf("bare client figure incomplete: %+v", b)
	}
	if st := r.Stale; st.Stale != cfg.StaleSockets || st.Quiet.Count != cfg.StaleSamples || st.BesideStale.Count != cfg.StaleSamples {
		t.Errorf("registration beside stale sockets incomplete: %+v", st)
	}
	if r.Churn.Cycles == 0 || r.Churn.Register.Count != r.Churn.Cycles || r.Churn.Deregister.Count != r.Churn.Cycles {
		t.Errorf("churn incomplete: %+v", r.Churn)
	}
	if !r.Churn.FinalExact {
		t.Errorf("churn did not end in the expected state: %s (leftover %v)", r.Churn.FinalProblem, r.Churn.Leftover)
	}
	if want := len(cfg.AllocDevices) * len(cfg.AllocCallers); len(r.Allocation) != want {
		t.Errorf("allocation runs %d, want %d", len(r.Allocation), want)
	}
	for _, a := range r.Allocation {
		if a.Pairs == 0 || a.Allocate.Count != a.Pairs {
			t.Errorf("allocation run incomplete: %+v", a)
		}
	}
	if d := r.Durability; d.FsyncFloor.Count == 0 || d.FsyncOverwriteFloor.Count != d.FsyncFloor.Count || d.FsyncPacedFloor.Count == 0 || d.Allocate8.Pairs == 0 || d.Allocate8Many.Callers != 8 || d.Allocate8Many.Pairs == 0 || d.Plugins != cfg.AllocPlugins || d.Many.Pairs == 0 ||
		d.Loop.Pairs == 0 || d.Loop.Journals == 0 || d.Loop.SnapshotBytes == 0 || d.Loop.MaxJournalBytes == 0 {
		t.Errorf("durability incomplete: %+v", d)
	}
	if r.Machine.HarnessGCPercent != DefaultHarnessGCPercent {
		t.Errorf("harness GC percent %d, want %d", r.Machine.HarnessGCPercent, DefaultHarnessGCPercent)
	}
	if r.Propagation.Latency.Count != cfg.Flips || r.Propagation.Devices != cfg.FlipDevices {
		t.Errorf("propagation incomplete: %+v", r.Propagation)
	}
	for _, s := range stack.Services {
		if r.Footprint.RSSMiB[s] <= 0 {
			t.Errorf("no RSS for %s: %+v", s, r.Footprint)
		}
		if _, ok := r.Footprint.IdleCPUPercent[s]; !ok {
			t.Errorf("no idle CPU for %s", s)
		}
	}
	if r.Footprint.DeviceManagerLoadedMiB <= 0 || r.Footprint.DeviceManagerPlugins != cfg.RSSPlugins {
		t.Errorf("devicemanager footprint incomplete: %+v", r.Footprint)
	}
}

// TestAPITCP runs the bench with -api-tcp and its cheapest phase that makes
// both roles' calls (allocation: Watch and List as a reader, Allocate and
// Release as an operator): once with the certificates the bench makes, once
// with certificates given on the command line (all six flags). Each run
// must complete with its figures present and say it reached the API over
// TCP with mutual TLS.
func TestAPITCP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the services")
	}
	bin := binaries(t)

	// Certificates of one's own: a CA for the servers, another for the
	// clients, as a node might have.
	own := testutil.TempDir(t)
	serverCA, err := certs.NewCA("servers")
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := certs.NewCA("clients")
	if err != nil {
		t.Fatal(err)
	}
	serverCAFile, clientCAFile := filepath.Join(own, "servers-ca.crt"), filepath.Join(own, "clients-ca.crt")
	for f, data := range map[string][]byte{serverCAFile: serverCA.PEM, clientCAFile: clientCA.PEM} {
		if err := certs.WriteFile(f, data); err != nil {
			t.Fatal(err)
		}
	}
	srvCert, srvKey, err := serverCA.IssueFiles(own, certs.Spec{Name: "server", Server: true, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey, err := clientCA.IssueFiles(own, certs.Spec{Name: "me", Orgs: []string{"nodeplug:operator"}})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"generated certificates", nil},
		{"given certificates", []string{"-tls-cert-file", cliCert, "-tls-key-file", cliKey, "-tls-ca-file", serverCAFile,
			"-tls-server-cert-file", srvCert, "-tls-server-key-file", srvKey, "-tls-client-ca-file", clientCAFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			out := filepath.Join(dir, "results.json")
			args := append([]string{"-short", "-api-tcp", "-phases", "allocation", "-json", out, "-root-dir", filepath.Join(dir, "root")}, tc.flags...)
			output, err := exec.CommandContext(ctx, filepath.Join(bin, "nodeplug-bench"), args...).CombinedOutput()
			if err != nil {
				t.Fatalf("nodeplug-bench %v: %v\n%s", args, err, output)
			}
			if !bytes.Contains(output, []byte("API over tcp+mtls")) {
				t.Errorf("the bench did not say it used TCP with mutual TLS:\n%s", output)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var r Results
			if err := json.Unmarshal(data, &r); err != nil {
				t.Fatal(err)
			}
			if r.Machine.API != "tcp+mtls" {
				t.Errorf("results say the API was %q, want tcp+mtls", r.Machine.API)
			}
			cfg := Short()
			if want := len(cfg.AllocDevices) * len(cfg.AllocCallers); len(r.Allocation) != want {
				t.Errorf("allocation runs %d, want %d", len(r.Allocation), want)
			}
			for _, a := range r.Allocation {
				if a.Pairs == 0 || a.Allocate.Count != a.Pairs || a.Release.Count != a.Pairs {
					t.Errorf("allocation run incomplete: %+v", a)
				}
			}
			_, err = os.Stat(filepath.Join(dir, "root", "bench-tls", "ca.crt"))
			if generated := tc.flags == nil; generated != (err == nil) {
				t.Errorf("certificates under the root dir: %v, want them only when generated", err)
			}
		})
	}
}

// TestAPITCPCheck: the certificate flags go all six or none, and
// -insecure-tcp takes none.
func TestAPITCPCheck(t *testing.T) {
	all := APITCP{Client: app.TLS{CertFile: "c", KeyFile: "k", CAFile: "ca"}, ServerCertFile: "sc", ServerKeyFile: "sk", ClientCAFile: "cca"}
	for _, tc := range []struct {
		name string
		t    APITCP
		ok   bool
	}{
		{"none", APITCP{}, true},
		{"all six", all, true},
		{"client side only", APITCP{Client: all.Client}, false},
		{"server side only", APITCP{ServerCertFile: "sc", ServerKeyFile: "sk", ClientCAFile: "cca"}, false},
		{"insecure", APITCP{Client: app.TLS{Insecure: true}}, true},
		{"insecure with files", APITCP{Client: app.TLS{Insecure: true, CAFile: "ca"}}, false},
	} {
		if err := tc.t.Check(); (err == nil) != tc.ok {
			t.Errorf("%s: Check() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	if err := (&APITCP{Client: all.Client}).Check(); err == nil || !strings.Contains(err.Error(), "-tls-server-cert-file") {
		t.Errorf("a missing server side is not named: %v", err)
	}
}
