package conform

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// checkDriverService makes the calls the kubelet's handler makes when it
// registers a CSI or DRA plugin, and records driver-service. It returns
// what the kubelet would tell the plugin when the registration fails, nil
// when it succeeds.
func (r *runner) checkDriverService(ctx context.Context, info *registerapi.PluginInfo, endpoint string) error {
	start := time.Now()
	conn, err := rpcutil.DialPlugin(endpoint)
	if err != nil {
		r.record(CheckDriverService, Fail, start, "cannot dial %s: %v", bounds.Quote(endpoint), err)
		return fmt.Errorf("RegisterPlugin error -- plugin registration failed with err: %w", err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	switch info.GetType() {
	case registerapi.CSIPlugin:
		ni, err := csi.NewNodeClient(conn).NodeGetInfo(cctx, &csi.NodeGetInfoRequest{})
		if err == nil && ni.GetNodeId() == "" {
			err = fmt.Errorf("NodeGetInfo returned an empty node ID")
		}
		if err != nil {
			r.record(CheckDriverService, Fail, start, "NodeGetInfo at %s: %v%s", bounds.Quote(endpoint), err, unimplementedNote(err, "csi.v1.Node"))
			return fmt.Errorf("RegisterPlugin error -- plugin registration failed with err: kubernetes.io/csi: %s.NodeGetInfo failed: %w", info.GetName(), err)
		}
		r.record(CheckDriverService, Pass, start, "NodeGetInfo: node ID %s, max volumes %d, topology %v",
			bounds.Quote(ni.GetNodeId()), ni.GetMaxVolumesPerNode(), ni.GetAccessibleTopology().GetSegments())
		return nil
	case registerapi.DRAPlugin:
		svc, _ := kubeletrules.ChooseDRAService(info.GetSupportedVersions())
		var err error
		// An empty request prepares nothing: only whether the service is
		// served shows.
		if svc == "v1beta1.DRAPlugin" {
			// v1beta1's messages are v1's on the wire; its package pulls
			// in the API machinery.
			err = conn.Invoke(cctx, "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
				&drav1.NodePrepareResourcesRequest{}, &drav1.NodePrepareResourcesResponse{})
		} else {
			_, err = drav1.NewDRAPluginClient(conn).NodePrepareResources(cctx, &drav1.NodePrepareResourcesRequest{})
		}
		switch code := status.Code(err); {
		case err == nil:
			r.record(CheckDriverService, Pass, start, "%s answers NodePrepareResources (no claims) at %s", svc, bounds.Quote(endpoint))
			return nil
		case code == codes.Unimplemented || code == codes.Unavailable || code == codes.DeadlineExceeded:
			r.record(CheckDriverService, Fail, start, "%s at %s: NodePrepareResources: %v%s", svc, bounds.Quote(endpoint), err, unimplementedNote(err, svc))
			return fmt.Errorf("RegisterPlugin error -- plugin registration failed with err: DRA driver %s at endpoint %s: %w", info.GetName(), endpoint, err)
		default:
			r.record(CheckDriverService, Warn, start, "%s at %s: NodePrepareResources with no claims failed: %v (an empty request should succeed)", svc, bounds.Quote(endpoint), err)
			return nil
		}
	}
	return nil
}

func unimplementedNote(err error, svc string) string {
	if status.Code(err) == codes.Unimplemented {
		return fmt.Sprintf(" (the endpoint serves no %s)", svc)
	}
	return ""
}
