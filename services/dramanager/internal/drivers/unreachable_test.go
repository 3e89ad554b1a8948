package drivers_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
)

// hangingPlugin is a driver whose prepare never answers: it says that a
// call came in and waits for the call's end.
type hangingPlugin struct {
	*dratest.Plugin
	entered chan struct{}
}

func (p hangingPlugin) PrepareResourceClaims(ctx context.Context, _ []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	close(p.entered)
	<-ctx.Done()
	return nil, ctx.Err()
}

// checkUnreachable checks that err names driver and its socket first,
// is unavailable, and reaches a client as a status whose ErrorInfo blames
// the driver.
func checkUnreachable(t *testing.T, err error, driver, socket, call string) {
	t.Helper()
	prefix := "DRA driver " + driver + " (socket \"" + socket + "\"): " + call + ": "
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.HasPrefix(err.Error(), prefix) {
		t.Fatalf("error %v, want ErrUnavailable starting %q", err, prefix)
	}
	st := errdefs.ToGRPC(err)
	info, ok := errdefs.InfoOf(st)
	if status.Code(st) != codes.Unavailable || !ok || info.GetReason() != errdefs.ReasonDRADriverUnreachable ||
		info.GetMetadata()[errdefs.MetaDriver] != driver || info.GetMetadata()[errdefs.MetaSocket] != socket || info.GetMetadata()[errdefs.MetaCall] != call {
		t.Fatalf("status %v with ErrorInfo %v, want UNAVAILABLE, reason %s naming %s at %s", st, info, errdefs.ReasonDRADriverUnreachable, driver, socket)
	}
}

// A driver that is down, or that dies while it prepares, is unavailable
// with the driver and its socket named, and the reason says the driver
// could not be reached; one that is not registered says so.
func TestUnreachableDriver(t *testing.T) {
	ctx := context.Background()
	refs := []claims.ClaimRef{{Namespace: "default", Name: "c", UID: "u-1"}}
	t.Run("down", func(t *testing.T) {
		api := dratest.StartAPI(t, testutil.TempDir(t))
		r, _ := newRegistry(t, api, 0)
		d := dratest.StartDriverWith(t, api, gpu, "", dratest.NewPlugin(gpu))
		register(t, r, d)
		waitConnected(t, r, d, true)
		d.Helper.Stop()
		_, err := r.Prepare(ctx, gpu, refs)
		checkUnreachable(t, err, gpu, d.Endpoint, "NodePrepareResources")
		_, err = r.Unprepare(ctx, gpu, refs)
		checkUnreachable(t, err, gpu, d.Endpoint, "NodeUnprepareResources")
	})
	t.Run("dies mid-prepare", func(t *testing.T) {
		api := dratest.StartAPI(t, testutil.TempDir(t))
		r, _ := newRegistry(t, api, 0)
		claim, err := dratest.AllocatedClaim(ctx, api.Client, "default", "c", gpu, "dev-0")
		if err != nil {
			t.Fatal(err)
		}
		p := hangingPlugin{Plugin: dratest.NewPlugin(gpu), entered: make(chan struct{})}
		d := dratest.StartDriverWith(t, api, gpu, "", p)
		register(t, r, d)
		waitConnected(t, r, d, true)
		done := make(chan error, 1)
		go func() {
			_, err := r.Prepare(ctx, gpu, []claims.ClaimRef{{Namespace: "default", Name: "c", UID: string(claim.UID)}})
			done <- err
		}()
		<-p.entered
		d.Helper.Stop()
		checkUnreachable(t, <-done, gpu, d.Endpoint, "NodePrepareResources")
	})
	t.Run("not registered", func(t *testing.T) {
		api := dratest.StartAPI(t, testutil.TempDir(t))
		r, _ := newRegistry(t, api, 0)
		info, ok := errdefs.InfoOf(errdefs.ToGRPC(func() error { _, err := r.Prepare(ctx, "missing.example.com", refs); return err }()))
		if !ok || info.GetReason() != errdefs.ReasonDRADriverNotRegistered || info.GetMetadata()[errdefs.MetaDriver] != "missing.example.com" {
			t.Fatalf("ErrorInfo %v, want %s naming the driver", info, errdefs.ReasonDRADriverNotRegistered)
		}
	})
}
