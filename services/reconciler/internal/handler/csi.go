package handler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/confine"
)

// CSITimeout bounds a registration's call to a CSI driver.
const CSITimeout = 10 * time.Second

// ListenGap bounds how long a CSI endpoint that refuses connections is
// retried: a socket exists from bind(), and refuses until listen().
const ListenGap = time.Second

// gapParams retry a refused connection within milliseconds, inside
// ListenGap, instead of after gRPC's default second.
var gapParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 2 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 50 * time.Millisecond},
	MinConnectTimeout: time.Second,
}

// CSI handles CSIPlugin registrations: the kubelet's version rule on
// Validate; on Register it asks the driver, as the kubelet does, only
// csi.v1 Node.NodeGetInfo on its endpoint, and records the answer. An
// endpoint that does not exist fails the registration at once, as the
// kubelet's call fails (the reconciler retries it with its backoff); only a
// device plugin's endpoint is waited for.
//
// Unlike the kubelet, which dials any path a CSI plugin names, the endpoint
// is confined: every dial of it (the first and each reconnect) checks it
// again, symlinks followed, inside the allowed directories and connects the
// very socket it checked (unixsock.Confiner.Dialer; an endpoint that was
// accepted before it existed is judged again once it does).
type CSI struct {
	drivers  *Drivers
	confiner *unixsock.Confiner
	now      func() time.Time
	// Timeout is CSITimeout unless a test changes it before use.
	Timeout time.Duration
}

var _ cache.Handler = (*CSI)(nil)

// NewCSI returns a CSI handler recording into drivers and dialling only
// endpoints that resolve inside the directories of confiner (nil: any).
func NewCSI(drivers *Drivers, confiner *unixsock.Confiner) *CSI {
	return &CSI{drivers: drivers, confiner: confiner, now: time.Now, Timeout: CSITimeout}
}

func csiLog(format string, args ...any) string {
	return "kubernetes.io/csi: " + fmt.Sprintf(format, args...)
}

// Validate picks the highest supported version (only 1.x is accepted) and
// refuses a driver when one with the same name, on another endpoint, is
// already registered with an equal or higher version, as the kubelet does.
func (h *CSI) Validate(_ context.Context, name, endpoint string, versions []string) error {
	v, err := kubeletrules.HighestCSIVersion("ValidatePlugin", name, versions)
	if err != nil {
		return err
	}
	for _, d := range h.drivers.Named(TypeCSIPlugin, name) {
		if d.Endpoint == endpoint {
			continue
		}
		if old, err := utilversion.ParseGeneric(d.CSI.HighestVersion); err == nil && !old.LessThan(v) {
			return errors.New(csiLog("ValidatePlugin failed for CSI driver %q: another driver with the same name is already registered with a higher supported version: %q", name, d.CSI.HighestVersion))
		}
	}
	return nil
}

// Register asks the driver for its node information (NodeGetInfo) and
// records it.
func (h *CSI) Register(ctx context.Context, p cache.Plugin) error {
	v, err := kubeletrules.HighestCSIVersion("RegisterPlugin", p.Name, p.Versions)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(p.Endpoint); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("CSI driver %q: endpoint %s does not exist: %w", p.Name, bounds.Quote(p.Endpoint), errdefs.ErrUnavailable)
	}
	cctx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	path, err := confine.Resolve(cctx, h.confiner, p.Endpoint)
	if err != nil {
		return fmt.Errorf("CSI driver %q: %w", p.Name, err)
	}
	// Every dial, the first and each reconnect, checks the endpoint again
	// and connects the socket it checked.
	conn, err := rpcutil.DialPlugin(p.Endpoint, grpc.WithConnectParams(gapParams), grpc.WithContextDialer(h.confiner.Dialer(p.Endpoint, nil)))
	if err != nil {
		return fmt.Errorf("CSI driver %q: connect to %s: %w", p.Name, path, err)
	}
	defer conn.Close()
	// Through the bind→listen gap; past it the call below fails with the
	// connection's error.
	waitReady(cctx, conn, ListenGap)
	ni, err := csi.NewNodeClient(conn).NodeGetInfo(cctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return fmt.Errorf("CSI driver %q at %s: NodeGetInfo: %w", p.Name, path, errdefs.FromGRPC(err))
	}
	if ni.GetNodeId() == "" {
		return fmt.Errorf("CSI driver %q at %s: NodeGetInfo returned an empty node id: %w", p.Name, path, errdefs.ErrInvalidArgument)
	}
	h.drivers.put(Driver{
		Type:       TypeCSIPlugin,
		Name:       p.Name,
		Endpoint:   p.Endpoint,
		SocketPath: p.SocketPath,
		Generation: p.Generation,
		Versions:   slices.Clone(p.Versions),
		Registered: h.now(),
		CSI: &CSINode{
			HighestVersion:     v.String(),
			NodeID:             ni.GetNodeId(),
			AccessibleTopology: maps.Clone(ni.GetAccessibleTopology().GetSegments()),
			MaxVolumesPerNode:  ni.GetMaxVolumesPerNode(),
		},
	})
	return nil
}

// waitReady waits until conn is connected, for at most d or until ctx
// ends.
func waitReady(ctx context.Context, conn *grpc.ClientConn, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

// Deregister drops the record.
func (h *CSI) Deregister(_ context.Context, p cache.Plugin) error {
	h.drivers.remove(TypeCSIPlugin, p.SocketPath, p.Generation)
	return nil
}
