package app

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/lockfile"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// TestRunHealthLockAndDeferredReady runs a service: its health stays
// NOT_SERVING until the service says it is ready, a second instance on the
// same root dir is refused, and cancelling the context stops it cleanly.
func TestRunHealthLockAndDeferredReady(t *testing.T) {
	root, err := os.MkdirTemp("", "npapp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cfg := Config{Binary: "test", RootDir: root, APISocket: layout.APISocket(root, "test"), LogLevel: "info", LogFormat: "text"}
	addrc := make(chan string, 1)
	readyc := make(chan func(), 1)
	svc := Service{Binary: "test", Setup: func(_ context.Context, rt *Runtime) error {
		readyc <- rt.DeferReady()
		addrc <- rt.Addr.String()
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.DiscardHandler)
	go func() { done <- Run(ctx, svc, cfg, log) }()
	addr := <-addrc
	ready := <-readyc

	conn, err := rpcutil.DialPeer(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func() (st healthpb.HealthCheckResponse_ServingStatus) {
		testutil.Eventually(t, "a health answer", func() error {
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return err
			}
			st = resp.GetStatus()
			return nil
		})
		return st
	}
	if fi, err := os.Stat(cfg.APISocket); err != nil || fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("API socket: %v, %v; want a 0660 socket", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Dir(cfg.APISocket)); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("API socket directory: %v, %v; want 0750", fi.Mode(), err)
	}
	if st := check(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before ready = %v, want NOT_SERVING", st)
	}
	ready()
	if st := check(); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health after ready = %v, want SERVING", st)
	}

	if err := Run(context.Background(), svc, cfg, log); !errors.Is(err, lockfile.ErrLocked) {
		t.Fatalf("second instance: %v, want ErrLocked", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
		if _, err := os.Lstat(cfg.APISocket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the API socket is left after the stop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop")
	}
}

// TestMetricsBindFailureLeavesNothing: when the metrics address is taken,
// the service fails before its Setup creates anything, so no socket (the
// API's, or one Setup would serve) is left behind.
func TestMetricsBindFailureLeavesNothing(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	root := testutil.TempDir(t)
	extra := filepath.Join(root, "device-plugins", "kubelet.sock")
	cfg := Config{Binary: "test", RootDir: root, APISocket: layout.APISocket(root, "test"), MetricsListen: taken.Addr().String(), LogLevel: "info", LogFormat: "text"}
	setupRan := false
	svc := Service{Binary: "test", Setup: func(_ context.Context, rt *Runtime) error {
		setupRan = true
		return rt.ServeUnix(extra, func(*grpc.Server) {})
	}}
	err = Run(context.Background(), svc, cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "metrics") {
		t.Fatalf("Run with a taken metrics address: %v, want a metrics listen error", err)
	}
	if setupRan {
		t.Error("Setup ran although the metrics address could not be bound")
	}
	for _, p := range []string{cfg.APISocket, extra} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left behind: %v", p, err)
		}
	}
}

// TestSetupFailureRemovesServedSockets: a Setup that served a socket and
// then failed leaves no socket behind.
func TestSetupFailureRemovesServedSockets(t *testing.T) {
	root := testutil.TempDir(t)
	extra := filepath.Join(root, "device-plugins", "kubelet.sock")
	cfg := Config{Binary: "test", RootDir: root, APISocket: layout.APISocket(root, "test"), LogLevel: "info", LogFormat: "text"}
	svc := Service{Binary: "test", Setup: func(_ context.Context, rt *Runtime) error {
		if err := rt.ServeUnix(extra, func(*grpc.Server) {}); err != nil {
			return err
		}
		return errors.New("setup failed after serving")
	}}
	if err := Run(context.Background(), svc, cfg, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("Run succeeded")
	}
	for _, p := range []string{cfg.APISocket, extra} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left behind: %v", p, err)
		}
	}
}

func TestGCPercent(t *testing.T) {
	env := func(gogc string) func(string) string {
		return func(k string) string {
			if k == "GOGC" {
				return gogc
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name    string
		gogc    string
		percent int
		want    int
		wantSet bool
	}{
		{name: "service default applies", percent: 200, want: 200, wantSet: true},
		{name: "GOGC wins", percent: 200, gogc: "50"},
		{name: "GOGC=off wins", percent: 200, gogc: "off"},
		{name: "no service default", gogc: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, set := gcPercent(Service{GCPercent: tc.percent}, env(tc.gogc))
			if got != tc.want || set != tc.wantSet {
				t.Fatalf("gcPercent = %d, %v; want %d, %v", got, set, tc.want, tc.wantSet)
			}
		})
	}
}
