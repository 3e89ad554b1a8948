package endpoint

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	t.Cleanup(cancel)
	return ctx
}

func startPlugin(t *testing.T, opts sampleplugin.Options) *sampleplugin.Plugin {
	t.Helper()
	opts.SocketPath = filepath.Join(testutil.TempDir(t), "p.sock")
	return plugintest.Start(t, opts)
}

// dialer dials path unconfined, as Connect's dial (the manager's is
// confined: unixsock.Confiner.Dialer).
func dialer(path string) func(context.Context, string) (net.Conn, error) {
	return (*unixsock.Confiner)(nil).Dialer(path, nil)
}

func connect(t *testing.T, p *sampleplugin.Plugin) *Conn {
	t.Helper()
	c, err := Connect(ctxT(t), p.Resource(), p.SocketPath(), dialer(p.SocketPath()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(nil) })
	return c
}

// TestRunDeliversUpdatesInOrder: the first device list and each later
// change reach update, in order, with health and topology; Close ends Run.
func TestRunDeliversUpdatesInOrder(t *testing.T) {
	p := startPlugin(t, sampleplugin.Options{Resource: "example.com/e", Devices: 2, PreStartRequired: true})
	c := connect(t, p)
	if c.Options() != (Options{PreStartRequired: true}) {
		t.Fatalf("options = %+v", c.Options())
	}
	updates := make(chan []Device, 16)
	ended := make(chan error, 1)
	go func() { ended <- c.Run(func(d []Device) { updates <- d }) }()
	healthy := func(ds []Device) []bool {
		var out []bool
		for _, d := range ds {
			out = append(out, d.Healthy)
		}
		return out
	}
	if got := <-updates; len(got) != 2 || got[0].ID != "dev-0" || !slices.Equal(healthy(got), []bool{true, true}) {
		t.Fatalf("first update = %+v", got)
	}
	if err := p.SetHealth("dev-1", false); err != nil {
		t.Fatal(err)
	}
	if got := <-updates; !slices.Equal(healthy(got), []bool{true, false}) {
		t.Fatalf("second update = %+v", got)
	}
	c.Close(errors.New("test over"))
	if err := <-ended; err == nil {
		t.Fatal("Run returned nil after Close")
	}
}

func TestRunReportsStreamEnd(t *testing.T) {
	p := startPlugin(t, sampleplugin.Options{Resource: "example.com/e", Devices: 1})
	c := connect(t, p)
	first := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		var once bool
		ended <- c.Run(func([]Device) {
			if !once {
				once = true
				close(first)
			}
		})
	}()
	<-first
	p.FailStreams(status.Error(codes.Internal, "broken"))
	err := <-ended
	if !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "broken") || !strings.Contains(err.Error(), p.SocketPath()) {
		t.Fatalf("Run = %v, want ErrInternal naming the plugin with its message", err)
	}
}

func TestCalls(t *testing.T) {
	p := startPlugin(t, sampleplugin.Options{Resource: "example.com/e", Devices: 4, Preferred: true, PreStartRequired: true})
	c := connect(t, p)
	pref, err := c.GetPreferredAllocation(ctxT(t), []string{"dev-0", "dev-1", "dev-2"}, []string{"dev-0"}, 2)
	if err != nil || !slices.Equal(pref, []string{"dev-0", "dev-2"}) {
		t.Fatalf("GetPreferredAllocation = %v, %v", pref, err)
	}
	resp, err := c.Allocate(ctxT(t), []string{"dev-0", "dev-2"})
	if err != nil {
		t.Fatal(err)
	}
	// The plugin's record of ListAndWatch, opened by Connect, may come
	// after Allocate's: the stream is open once the client has sent it.
	allocated := slices.ContainsFunc(p.Calls(), func(c sampleplugin.Call) bool {
		return c.Method == sampleplugin.MethodAllocate && slices.Equal(c.DeviceIDs, []string{"dev-0", "dev-2"})
	})
	if !allocated || resp.GetEnvs()["NODEPLUG_DEVICES"] != "dev-0,dev-2" || len(resp.GetMounts()) != 2 {
		t.Fatalf("Allocate answered %v; the plugin's calls: %+v", resp, p.Calls())
	}
	if err := c.PreStartContainer(ctxT(t), []string{"dev-0"}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		method string
		err    error
		kind   error
		call   func() error
	}{
		{sampleplugin.MethodAllocate, status.Error(codes.Internal, "says no"), errdefs.ErrInternal,
			func() error { _, err := c.Allocate(ctxT(t), []string{"dev-1"}); return err }},
		{sampleplugin.MethodPreStartContainer, status.Error(codes.Unavailable, "says no"), errdefs.ErrUnavailable,
			func() error { return c.PreStartContainer(ctxT(t), []string{"dev-1"}) }},
		{sampleplugin.MethodGetPreferredAllocation, status.Error(codes.InvalidArgument, "says no"), errdefs.ErrInternal,
			func() error { _, err := c.GetPreferredAllocation(ctxT(t), []string{"dev-1"}, nil, 1); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.method, func(t *testing.T) {
			p.SetFailure(tc.method, tc.err)
			defer p.SetFailure(tc.method, nil)
			err := tc.call()
			want := "device plugin " + c.String() + " " + tc.method + " rpc failed with err: says no"
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.kind, want)
			}
		})
	}
}

func TestConnectFailures(t *testing.T) {
	p := startPlugin(t, sampleplugin.Options{Resource: "example.com/e", Devices: 1})
	p.SetFailure(sampleplugin.MethodGetDevicePluginOptions, status.Error(codes.Internal, "not ready"))
	_, err := Connect(ctxT(t), p.Resource(), p.SocketPath(), dialer(p.SocketPath()))
	if !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "failed to get device plugin options for example.com/e at "+p.SocketPath()+": not ready") {
		t.Fatalf("options failure: %v", err)
	}
	p.SetFailure(sampleplugin.MethodGetDevicePluginOptions, nil)
	p.Stop()
	_, err = Connect(ctxT(t), p.Resource(), p.SocketPath(), dialer(p.SocketPath()))
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("plugin gone: %v, want ErrUnavailable", err)
	}
}
