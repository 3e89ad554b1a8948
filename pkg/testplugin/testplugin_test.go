package testplugin

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, info Info) (*Plugin, registerapi.RegistrationClient) {
	t.Helper()
	p, err := Start(filepath.Join(testutil.TempDir(t), "sub", "p.sock"), info)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	conn, err := rpcutil.DialPlugin(p.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return p, registerapi.NewRegistrationClient(conn)
}

func TestGetInfoAndNotify(t *testing.T) {
	info := Info{Type: registerapi.DRAPlugin, Name: "dra.example.com", Endpoint: "/x.sock", Versions: []string{"v1.DRAPlugin"}}
	p, c := start(t, info)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := c.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetType() != info.Type || got.GetName() != info.Name || got.GetEndpoint() != info.Endpoint || len(got.GetSupportedVersions()) != 1 {
		t.Fatalf("GetInfo = %v", got)
	}
	waited := make(chan Status, 1)
	go func() {
		s, _ := p.WaitStatus(ctx, Rejected)
		waited <- s
	}()
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "bad"}); err != nil {
		t.Fatal(err)
	}
	if s := <-waited; s.Registered || s.Error != "bad" {
		t.Fatalf("WaitStatus(Rejected) = %+v", s)
	}
	if s, err := p.WaitStatus(ctx, Registered); err != nil || !s.Registered {
		t.Fatalf("WaitStatus(Registered) = %+v, %v", s, err)
	}
	if n := len(p.Statuses()); n != 2 || p.GetInfoCalls() != 1 {
		t.Fatalf("statuses %d, GetInfo calls %d", n, p.GetInfoCalls())
	}
	// WaitStatusAfter skips what was already received.
	go func() {
		s, _ := p.WaitStatusAfter(ctx, 2, Registered)
		waited <- s
	}()
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true, Error: "third"}); err != nil {
		t.Fatal(err)
	}
	if s := <-waited; s.Error != "third" {
		t.Fatalf("WaitStatusAfter = %+v, want the third status", s)
	}
}

func TestKnobs(t *testing.T) {
	p, c := start(t, Info{Type: registerapi.DevicePlugin, Name: "example.com/dev", Versions: []string{"v1beta1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p.SetGetInfoError(status.Error(codes.Unavailable, "not ready"))
	if _, err := c.GetInfo(ctx, &registerapi.InfoRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetInfo with error knob = %v", err)
	}
	p.SetGetInfoError(nil)

	p.SetGetInfoDelay(time.Hour)
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := c.GetInfo(short, &registerapi.InfoRequest{})
	cancelShort()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("GetInfo with delay knob = %v", err)
	}
	p.SetGetInfoDelay(0)

	p.SetNotifyError(errors.New("busy"))
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err == nil {
		t.Fatal("Notify with error knob succeeded")
	}
	if len(p.Statuses()) != 1 {
		t.Fatal("failed notification not recorded")
	}
	p.SetInfo(Info{Type: "Other", Name: "x"})
	if got, err := c.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil || got.GetType() != "Other" {
		t.Fatalf("GetInfo after SetInfo = %v, %v", got, err)
	}
}
